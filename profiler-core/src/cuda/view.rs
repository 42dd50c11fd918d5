//! The per-process picture the CUDA/NCCL probes give: each call of a traced thread, and each
//! interval the thread spent waiting inside the CUDA API, classified by what it waited for
//! (built by [`super::build`]).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Library;
use crate::recording::record::CudaCall;

/// What a thread waited for inside the CUDA API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    /// Staging a copy out of pageable memory (or a synchronous copy from it).
    PageableCopy,
    /// A copy from or to page-locked memory, on the copy engine.
    PinnedCopy,
    /// A sync whose outstanding work includes an NCCL collective.
    Collective,
    /// A sync waiting for kernels only.
    Kernel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HostWait {
    pub tid: u32,
    pub pid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub kind: WaitKind,
    /// Bytes copied, for copy waits.
    pub bytes: u64,
    /// A sync (waiting for queued work), as opposed to a copy call's own time.
    pub sync: bool,
    /// For a sync: the bytes of pinned copies it waited for, which move at the link's pace.
    pub pinned_bytes: u64,
    /// For a sync: how long its pageable copies took to stage, a bound on their DMA after
    /// the call (the DMA moves what was staged, no faster than the host copied it).
    pub staged_ns: u64,
    /// Index into [`CudaView::calls`].
    pub call: usize,
}

/// A probed library file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbedLibrary {
    pub pid: u32,
    pub path: String,
    pub library: Library,
    pub attached: usize,
    pub missing: Vec<(String, String)>,
    /// When the probes went on, CLOCK_MONOTONIC ns.
    pub attached_ns: u64,
}

/// A process's NCCL communicator membership, from `ncclCommInitRank`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: u32,
    pub nranks: u32,
    /// The unique id's first 8 bytes: the same in every rank of the communicator.
    pub comm_id: u64,
}

/// One collective (or send/receive) a rank queued, and when the host learnt it was done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CollectiveSpan {
    pub pid: u32,
    pub tid: u32,
    pub op: super::Collective,
    pub bytes: u64,
    /// The communicator handle in this process.
    pub comm: u64,
    /// The communicator's cross-rank name (the unique id's first 8 bytes), when the probes
    /// saw its `ncclCommInitRank`.
    pub comm_id: Option<u64>,
    /// 0 for the first collective this process queued on `comm` since the probes came.
    pub seq: u64,
    /// When the host queued it: the rank's arrival, on the host's clock.
    pub enqueue_ns: u64,
    /// The end of the first sync that waited for it (on its stream, through events, or the
    /// whole context); `None` when no sync the probes saw did.
    pub done_ns: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchStats {
    /// Launches counted while the launch count was on, once each (the busier of the
    /// runtime's and the driver's layer: see `launches_once`).
    pub counted: u64,
    /// Estimated launches per second over the recording.
    pub per_sec: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CudaView {
    pub libraries: Vec<ProbedLibrary>,
    /// Sorted by entry time.
    pub calls: Vec<CudaCall>,
    /// Sorted by start.
    pub waits: Vec<HostWait>,
    /// By PID, from `ncclCommInitRank`.
    pub ranks: BTreeMap<u32, RankInfo>,
    /// Every collective queued, in enqueue order.
    pub collectives: Vec<CollectiveSpan>,
    /// Processes whose event records and cross-stream waits the probes saw.
    pub event_deps: std::collections::BTreeSet<u32>,
    /// By PID, from the launcher's environment variables (`comm_id` 0).
    pub env_ranks: BTreeMap<u32, RankInfo>,
    /// By PID.
    pub launches: BTreeMap<u32, LaunchStats>,
    /// By PID: launches counted per entry point.
    pub launches_by_api: BTreeMap<u32, BTreeMap<String, u64>>,
    /// Time launches were counted (the probes' credited on-periods): launch rates are
    /// counts over this.
    pub launch_probed_ns: u64,
    /// Copies classed pinned vs pageable, by PID: (pinned bytes, pageable bytes).
    pub copy_bytes: BTreeMap<u32, (u64, u64)>,
}

impl CudaView {
    pub fn is_empty(&self) -> bool {
        self.libraries.is_empty() && self.calls.is_empty()
    }

    /// Processes whose CUDA calls the probes saw (so their waits are known, not guessed).
    pub fn probed_pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.libraries
            .iter()
            .map(|l| l.pid)
            .chain(self.calls.iter().map(|c| c.pid))
    }

    /// Since when thread `tid` of `pid` is known not to be inside a CUDA call the probes
    /// missed: the start of its first call seen. A call already in progress when the probes
    /// attached is never seen (its return probe was never armed), and a sync spins on-CPU, so
    /// until then the thread's on-CPU time may be a wait (attaching to a job hung in a
    /// collective). `None` for a process never probed; `u64::MAX` for a probed thread that
    /// made no call.
    pub fn watched_since(&self, pid: u32, tid: u32) -> Option<u64> {
        let probed = self
            .libraries
            .iter()
            .any(|l| l.pid == pid && l.attached > 0)
            || self.calls.iter().any(|c| c.pid == pid);
        probed.then(|| {
            self.calls
                .iter()
                .filter(|c| c.tid == tid)
                .map(|c| c.start_ns)
                .min()
                .unwrap_or(u64::MAX)
        })
    }
}
