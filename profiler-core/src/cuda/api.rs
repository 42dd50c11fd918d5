//! The probed CUDA driver, CUDA runtime and NCCL functions, and how to read their raw
//! arguments. The index in [`APIS`] is the uprobe's attach cookie, so the table is the one
//! contract between the probes and the decoder: append only.
//!
//! Arguments are x86-64 System V (six integer registers, then the stack) or AAPCS64 (x0-x7),
//! seven of them either way: NCCL collectives take their stream seventh. `ncclCommInitRank`
//! takes its 128-byte `ncclUniqueId` by value. On x86-64 it goes on the stack and so takes
//! no register: `rank` is in the third register, and the stack slot holds the id's first 8
//! bytes, a cross-rank name for the communicator. AAPCS64 passes it by reference in the third
//! register (the probe reads its first 8 bytes into the seventh slot: [`Api::id_by_reference`])
//! and `rank` in the fourth.
pub use crate::recording::cuda_ops::{Collective, CopyDir, CudaOp, Library, SyncScope};

/// How the probes treat a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Entry and return: the call's duration is the point.
    Timed,
    /// Entry and return, and the result comes back through the first argument.
    TimedOutPtr,
    /// Entry only, counted: kernel launches.
    Counted,
}

pub struct Api {
    pub name: &'static str,
    pub library: Library,
    pub probe: Probe,
    /// Absent from some versions (`_ptsz` variants, newer entry points): no warning when
    /// missing.
    pub optional: bool,
    decode: fn(&[u64; 7], u64) -> CudaOp,
}

impl Api {
    /// `args` as the probe read them; `out` is `*args[0]` at return for `TimedOutPtr`.
    pub fn decode(&self, args: &[u64; 7], out: u64) -> CudaOp {
        (self.decode)(args, out)
    }

    /// Whether the probe reads an argument passed by reference (AAPCS64's `ncclUniqueId`)
    /// into the seventh slot: see the module's comment.
    pub fn id_by_reference(&self) -> bool {
        cfg!(target_arch = "aarch64") && self.name == "ncclCommInitRank"
    }

    /// An event record or a cross-stream wait: a dependency between streams, probed while
    /// its rate stays low.
    pub fn is_event_dependency(&self) -> bool {
        matches!(
            self.decode(&[0; 7], 0),
            CudaOp::EventRecord { .. } | CudaOp::StreamWaitEvent { .. }
        )
    }
}

/// Bytes per element of `ncclDataType_t`.
pub fn nccl_type_size(t: u64) -> u64 {
    match t {
        0 | 1 | 10 | 11 => 1,
        6 | 9 => 2,
        2 | 3 | 7 => 4,
        4 | 5 | 8 => 8,
        _ => 1,
    }
}

fn cudart_dir(kind: u64) -> CopyDir {
    match kind {
        0 => CopyDir::HostToHost,
        1 => CopyDir::HostToDevice,
        2 => CopyDir::DeviceToHost,
        3 => CopyDir::DeviceToDevice,
        _ => CopyDir::Unknown,
    }
}

fn stream_sync(a: &[u64; 7], _: u64) -> CudaOp {
    CudaOp::Sync {
        scope: SyncScope::Stream,
        handle: a[0],
    }
}
fn event_sync(a: &[u64; 7], _: u64) -> CudaOp {
    CudaOp::Sync {
        scope: SyncScope::Event,
        handle: a[0],
    }
}
fn ctx_sync(_: &[u64; 7], _: u64) -> CudaOp {
    CudaOp::Sync {
        scope: SyncScope::Context,
        handle: 0,
    }
}
fn copy(dir: CopyDir, a: &[u64; 7], stream: u64, asynchronous: bool) -> CudaOp {
    CudaOp::Copy {
        dir,
        dst: a[0],
        src: a[1],
        bytes: a[2],
        stream,
        asynchronous,
    }
}
fn htod_async(a: &[u64; 7], _: u64) -> CudaOp {
    copy(CopyDir::HostToDevice, a, a[3], true)
}
fn dtoh_async(a: &[u64; 7], _: u64) -> CudaOp {
    copy(CopyDir::DeviceToHost, a, a[3], true)
}
fn any_async(a: &[u64; 7], _: u64) -> CudaOp {
    copy(CopyDir::Unknown, a, a[3], true)
}
fn htod(a: &[u64; 7], _: u64) -> CudaOp {
    copy(CopyDir::HostToDevice, a, 0, false)
}
fn dtoh(a: &[u64; 7], _: u64) -> CudaOp {
    copy(CopyDir::DeviceToHost, a, 0, false)
}
fn any_copy(a: &[u64; 7], _: u64) -> CudaOp {
    copy(CopyDir::Unknown, a, 0, false)
}
fn rt_copy_async(a: &[u64; 7], _: u64) -> CudaOp {
    copy(cudart_dir(a[3]), a, a[4], true)
}
fn rt_copy(a: &[u64; 7], _: u64) -> CudaOp {
    copy(cudart_dir(a[3]), a, 0, false)
}
fn pin_out(a: &[u64; 7], out: u64) -> CudaOp {
    CudaOp::Pin {
        addr: out,
        bytes: a[1],
    }
}
fn pin_register(a: &[u64; 7], _: u64) -> CudaOp {
    CudaOp::Pin {
        addr: a[0],
        bytes: a[1],
    }
}
fn unpin(a: &[u64; 7], _: u64) -> CudaOp {
    CudaOp::Unpin { addr: a[0] }
}
fn launch(_: &[u64; 7], _: u64) -> CudaOp {
    CudaOp::Launch
}
fn collective(
    op: Collective,
    a: &[u64; 7],
    count: usize,
    comm: usize,
    peer: Option<usize>,
) -> CudaOp {
    CudaOp::Collective {
        op,
        bytes: a[count].saturating_mul(nccl_type_size(a[count + 1])),
        comm: a[comm],
        stream: a[comm + 1],
        peer: peer.map(|p| a[p] as u32),
    }
}
fn all_reduce(a: &[u64; 7], _: u64) -> CudaOp {
    collective(Collective::AllReduce, a, 2, 5, None)
}
fn all_gather(a: &[u64; 7], _: u64) -> CudaOp {
    collective(Collective::AllGather, a, 2, 4, None)
}
fn reduce_scatter(a: &[u64; 7], _: u64) -> CudaOp {
    collective(Collective::ReduceScatter, a, 2, 5, None)
}
fn broadcast(a: &[u64; 7], _: u64) -> CudaOp {
    collective(Collective::Broadcast, a, 2, 5, Some(4))
}
fn send(a: &[u64; 7], _: u64) -> CudaOp {
    collective(Collective::Send, a, 1, 4, Some(3))
}
fn recv(a: &[u64; 7], _: u64) -> CudaOp {
    collective(Collective::Recv, a, 1, 4, Some(3))
}
fn group_end(_: &[u64; 7], _: u64) -> CudaOp {
    CudaOp::GroupEnd
}
fn event_record(a: &[u64; 7], _: u64) -> CudaOp {
    CudaOp::EventRecord {
        event: a[0],
        stream: a[1],
    }
}
fn stream_wait_event(a: &[u64; 7], _: u64) -> CudaOp {
    CudaOp::StreamWaitEvent {
        stream: a[0],
        event: a[1],
    }
}
/// The register `ncclCommInitRank`'s `rank` is in: see the module's comment.
const COMM_INIT_RANK_ARG: usize = if cfg!(target_arch = "aarch64") { 3 } else { 2 };

fn comm_init(a: &[u64; 7], out: u64) -> CudaOp {
    CudaOp::CommInit {
        comm: out,
        nranks: a[1] as u32,
        rank: a[COMM_INIT_RANK_ARG] as u32,
        id: a[6],
    }
}

const fn api(
    name: &'static str,
    library: Library,
    probe: Probe,
    optional: bool,
    decode: fn(&[u64; 7], u64) -> CudaOp,
) -> Api {
    Api {
        name,
        library,
        probe,
        optional,
        decode,
    }
}

use Library::{Driver as D, Nccl as N, Runtime as R};
use Probe::{Counted as C, Timed as T, TimedOutPtr as O};

pub static APIS: &[Api] = &[
    api("cuStreamSynchronize", D, T, false, stream_sync),
    api("cuStreamSynchronize_ptsz", D, T, true, stream_sync),
    api("cuEventSynchronize", D, T, false, event_sync),
    api("cuCtxSynchronize", D, T, false, ctx_sync),
    api("cuMemcpyHtoDAsync_v2", D, T, false, htod_async),
    api("cuMemcpyHtoDAsync_v2_ptsz", D, T, true, htod_async),
    api("cuMemcpyDtoHAsync_v2", D, T, false, dtoh_async),
    api("cuMemcpyDtoHAsync_v2_ptsz", D, T, true, dtoh_async),
    api("cuMemcpyAsync", D, T, false, any_async),
    api("cuMemcpyAsync_ptsz", D, T, true, any_async),
    api("cuMemcpyHtoD_v2", D, T, false, htod),
    api("cuMemcpyDtoH_v2", D, T, false, dtoh),
    api("cuMemcpy", D, T, true, any_copy),
    api("cuMemHostAlloc", D, O, false, pin_out),
    api("cuMemAllocHost_v2", D, O, false, pin_out),
    api("cuMemHostRegister_v2", D, T, false, pin_register),
    api("cuMemFreeHost", D, T, false, unpin),
    api("cuMemHostUnregister", D, T, false, unpin),
    api("cuLaunchKernel", D, C, false, launch),
    api("cuLaunchKernel_ptsz", D, C, true, launch),
    api("cuLaunchKernelEx", D, C, true, launch),
    api("cuLaunchKernelEx_ptsz", D, C, true, launch),
    api("cudaStreamSynchronize", R, T, false, stream_sync),
    api("cudaStreamSynchronize_ptsz", R, T, true, stream_sync),
    api("cudaEventSynchronize", R, T, false, event_sync),
    api("cudaDeviceSynchronize", R, T, false, ctx_sync),
    api("cudaMemcpyAsync", R, T, false, rt_copy_async),
    api("cudaMemcpyAsync_ptsz", R, T, true, rt_copy_async),
    api("cudaMemcpy", R, T, false, rt_copy),
    api("cudaHostAlloc", R, O, false, pin_out),
    api("cudaMallocHost", R, O, false, pin_out),
    api("cudaHostRegister", R, T, false, pin_register),
    api("cudaFreeHost", R, T, false, unpin),
    api("cudaHostUnregister", R, T, false, unpin),
    api("cudaLaunchKernel", R, C, false, launch),
    api("cudaLaunchKernel_ptsz", R, C, true, launch),
    api("ncclAllReduce", N, T, false, all_reduce),
    api("ncclAllGather", N, T, false, all_gather),
    api("ncclReduceScatter", N, T, false, reduce_scatter),
    api("ncclBroadcast", N, T, false, broadcast),
    api("ncclSend", N, T, false, send),
    api("ncclRecv", N, T, false, recv),
    api("ncclGroupEnd", N, T, false, group_end),
    api("ncclCommInitRank", N, O, false, comm_init),
    api("cuEventRecord", D, T, false, event_record),
    api("cuEventRecord_ptsz", D, T, true, event_record),
    api("cuEventRecordWithFlags", D, T, true, event_record),
    api("cuEventRecordWithFlags_ptsz", D, T, true, event_record),
    api("cuStreamWaitEvent", D, T, false, stream_wait_event),
    api("cuStreamWaitEvent_ptsz", D, T, true, stream_wait_event),
    api("cudaEventRecord", R, T, false, event_record),
    api("cudaEventRecord_ptsz", R, T, true, event_record),
    api("cudaEventRecordWithFlags", R, T, true, event_record),
    api("cudaEventRecordWithFlags_ptsz", R, T, true, event_record),
    api("cudaStreamWaitEvent", R, T, false, stream_wait_event),
    api("cudaStreamWaitEvent_ptsz", R, T, true, stream_wait_event),
];

/// The table index of `name`.
pub fn index_of(name: &str) -> Option<usize> {
    APIS.iter().position(|a| a.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[u64]) -> [u64; 7] {
        let mut a = [0; 7];
        a[..v.len()].copy_from_slice(v);
        a
    }

    #[test]
    fn names_are_unique() {
        for (i, a) in APIS.iter().enumerate() {
            assert_eq!(index_of(a.name), Some(i), "{}", a.name);
        }
    }

    #[test]
    fn all_reduce_reads_its_stream_from_the_stack() {
        let a = &APIS[index_of("ncclAllReduce").unwrap()];
        // 1000 floats, op sum, comm 0xc0, stream 0x5 (seventh argument).
        let op = a.decode(&args(&[1, 2, 1000, 7, 0, 0xc0, 0x5]), 0);
        assert_eq!(
            op,
            CudaOp::Collective {
                op: Collective::AllReduce,
                bytes: 4000,
                comm: 0xc0,
                stream: 0x5,
                peer: None
            }
        );
    }

    #[test]
    fn comm_init_rank_takes_rank_from_its_register_and_the_id_from_the_seventh_slot() {
        let a = &APIS[index_of("ncclCommInitRank").unwrap()];
        // (comm, nranks, rank) on x86-64; (comm, nranks, &id, rank) on AAPCS64.
        let regs = if cfg!(target_arch = "aarch64") {
            [0x100, 4, 0x7ffd_0000, 3, 0, 0, 0xabc]
        } else {
            [0x100, 4, 3, 0, 0, 0, 0xabc]
        };
        assert_eq!(a.id_by_reference(), cfg!(target_arch = "aarch64"));
        assert!(!APIS.iter().any(|o| o.name != a.name && o.id_by_reference()));
        let op = a.decode(&args(&regs), 0x7000);
        assert_eq!(
            op,
            CudaOp::CommInit {
                comm: 0x7000,
                nranks: 4,
                rank: 3,
                id: 0xabc
            }
        );
    }

    #[test]
    fn copies_name_their_host_side() {
        let htod = APIS[index_of("cuMemcpyHtoDAsync_v2").unwrap()].decode(&args(&[9, 8, 64, 3]), 0);
        assert_eq!(
            htod,
            CudaOp::Copy {
                dir: CopyDir::HostToDevice,
                dst: 9,
                src: 8,
                bytes: 64,
                stream: 3,
                asynchronous: true
            }
        );
        let rt = APIS[index_of("cudaMemcpyAsync").unwrap()].decode(&args(&[1, 2, 10, 2, 4]), 0);
        assert!(matches!(
            rt,
            CudaOp::Copy {
                dir: CopyDir::DeviceToHost,
                stream: 4,
                ..
            }
        ));
    }
}
