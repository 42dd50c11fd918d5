//! Collectives and point-to-point calls: checked, then queued on the caller's stream (see
//! `group`). No data moves between the ranks' buffers: only the timing is simulated.
use std::ffi::{c_int, c_void};

use crate::comm::lookup;
use crate::cost::Kind;
use crate::group::{Queued, enqueue};
use crate::guarded;
use crate::types::{
    NCCL_INVALID_ARGUMENT, NcclResult, cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t,
    ncclResult_t, type_size, valid_op,
};

/// Checks a call's arguments and queues it. `count` is the call's own count (per rank for
/// all-gather's send and reduce-scatter's receive side); `peer` a root or peer rank.
#[allow(
    clippy::too_many_arguments,
    reason = "the union of the NCCL signatures"
)]
fn call(
    kind: Kind,
    buffers: &[*const c_void],
    count: usize,
    datatype: ncclDataType_t,
    op: Option<ncclRedOp_t>,
    peer: Option<c_int>,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> NcclResult<()> {
    let comm = lookup(comm as usize)?;
    let size = type_size(datatype).ok_or(NCCL_INVALID_ARGUMENT)?;
    if op.is_some_and(|o| !valid_op(o)) {
        return Err(NCCL_INVALID_ARGUMENT);
    }
    let peer = match peer {
        Some(p) => Some(
            usize::try_from(p)
                .ok()
                .filter(|p| *p < comm.nranks)
                .ok_or(NCCL_INVALID_ARGUMENT)?,
        ),
        None => None,
    };
    if count > 0 && buffers.iter().any(|b| b.is_null()) {
        return Err(NCCL_INVALID_ARGUMENT);
    }
    let kind = match (kind, peer) {
        (Kind::Send { .. }, Some(peer)) => Kind::Send { peer },
        (Kind::Recv { .. }, Some(peer)) => Kind::Recv { peer },
        (k, _) => k,
    };
    enqueue(Queued {
        comm,
        stream: stream as usize,
        kind,
        bytes: (count as u64).saturating_mul(size as u64),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let bufs = [sendbuff, recvbuff.cast_const()];
    guarded(|| {
        call(
            Kind::AllReduce,
            &bufs,
            count,
            datatype,
            Some(op),
            None,
            comm,
            stream,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let bufs = [sendbuff, recvbuff.cast_const()];
    guarded(|| {
        call(
            Kind::AllGather,
            &bufs,
            sendcount,
            datatype,
            None,
            None,
            comm,
            stream,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let bufs = [sendbuff, recvbuff.cast_const()];
    guarded(|| {
        call(
            Kind::ReduceScatter,
            &bufs,
            recvcount,
            datatype,
            Some(op),
            None,
            comm,
            stream,
        )
    })
}

/// Only the root's send buffer is read, so only the receive buffer must be non-NULL elsewhere.
#[unsafe(no_mangle)]
pub extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let _ = sendbuff;
    let bufs = [recvbuff.cast_const()];
    guarded(|| {
        call(
            Kind::Broadcast,
            &bufs,
            count,
            datatype,
            None,
            Some(root),
            comm,
            stream,
        )
    })
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments, reason = "the signature in nccl.h")]
pub extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let _ = recvbuff;
    let bufs = [sendbuff];
    guarded(|| {
        call(
            Kind::Reduce,
            &bufs,
            count,
            datatype,
            Some(op),
            Some(root),
            comm,
            stream,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let kind = Kind::Send { peer: 0 };
    guarded(|| {
        call(
            kind,
            &[sendbuff],
            count,
            datatype,
            None,
            Some(peer),
            comm,
            stream,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let kind = Kind::Recv { peer: 0 };
    let bufs = [recvbuff.cast_const()];
    guarded(|| call(kind, &bufs, count, datatype, None, Some(peer), comm, stream))
}
