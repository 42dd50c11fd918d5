//! Library, unique id and communicator entry points.
use std::ffi::{c_char, c_int};

use crate::comm::{self, lookup};
use crate::group;
use crate::types::{
    NCCL_REMOTE_ERROR, NCCL_SUCCESS, VERSION_CODE, error_string, ncclComm_t, ncclResult_t,
    ncclUniqueId,
};
use crate::{guarded, write_out};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    // SAFETY: `version` is NULL or an out-pointer, per the API contract.
    guarded(|| unsafe { write_out(version, VERSION_CODE) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut ncclUniqueId) -> ncclResult_t {
    // SAFETY: `id` is NULL or an out-pointer, per the API contract.
    guarded(|| unsafe { write_out(id, comm::new_unique_id()) })
}

/// Joins rank `rank` of `nranks` to the communicator of `id` on the current CUDA context's GPU;
/// returns once every rank has joined. `id` travels by value, as in nccl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    guarded(|| {
        if comm.is_null() {
            return Err(crate::types::NCCL_INVALID_ARGUMENT);
        }
        let h = comm::init_rank(nranks, &id, rank)?;
        // SAFETY: `comm` is a non-null out-pointer, per the API contract.
        unsafe { write_out(comm, h as ncclComm_t) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    guarded(|| comm::destroy(comm as usize))
}

/// As ncclCommDestroy: nothing of ours outlives the stream work already queued.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    guarded(|| comm::destroy(comm as usize))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    guarded(|| {
        let c = lookup(comm as usize)?;
        // SAFETY: `count` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(count, c.nranks as c_int) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    guarded(|| {
        let c = lookup(comm as usize)?;
        // SAFETY: `rank` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(rank, c.rank as c_int) }
    })
}

/// ncclRemoteError once a peer died during an operation (PyTorch's watchdog polls this).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    error: *mut ncclResult_t,
) -> ncclResult_t {
    guarded(|| {
        let c = lookup(comm as usize)?;
        let state = if c.failed.load(std::sync::atomic::Ordering::Acquire) {
            NCCL_REMOTE_ERROR
        } else {
            NCCL_SUCCESS
        };
        // SAFETY: `error` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(error, state) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    error_string(result).as_ptr()
}

/// The library keeps no per-call error text beyond what it prints on stderr.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(_comm: ncclComm_t) -> *const c_char {
    c"".as_ptr()
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    guarded(|| {
        group::start();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    guarded(group::end)
}
