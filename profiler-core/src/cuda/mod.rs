//! What the CUDA and NCCL uprobes say: the probed functions, and the per-process view the
//! attribution draws on (pinned ranges, syncs classified by what they waited for, copies,
//! collectives, ranks, launch rates).
mod api;

pub use api::{
    APIS, Api, Collective, CopyDir, CudaOp, Library, Probe, SyncScope, index_of, nccl_type_size,
};
mod build;
mod launcher_env;
mod view;
mod waits;

pub use build::build;
pub use launcher_env::rank_from_env;
pub use view::{
    CollectiveSpan, CudaView, HostWait, LaunchStats, ProbedLibrary, RankInfo, WaitKind,
};
pub use waits::{WaitIndex, WaitTotals};
mod summary;

pub use summary::{ApiTotal, CudaSummary, ProcessCuda, summarize};
