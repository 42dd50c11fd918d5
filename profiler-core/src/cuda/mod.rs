//! What the CUDA and NCCL uprobes say: the probed functions, and the per-process view the
//! attribution draws on (pinned ranges, syncs classified by what they waited for, copies,
//! collectives, ranks, launch rates).
mod api;

pub use api::{
    APIS, Api, Collective, CopyDir, CudaOp, Library, Probe, SyncScope, index_of, nccl_type_size,
};
mod view;

pub use view::{
    CudaView, HostWait, LaunchStats, ProbedLibrary, RankInfo, WaitIndex, WaitKind, WaitTotals,
    build, rank_from_env,
};
mod summary;

pub use summary::{ApiTotal, CudaSummary, ProcessCuda, summarize};
