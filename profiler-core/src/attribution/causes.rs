//! The cause registry: everything stallscope knows about each cause, in one table.
//!
//! Adding a cause is one [`Cause`] variant, one [`CauseSpec`] in [`CAUSES`] (its position
//! is the variant's, which a test checks), its score in [`super::rules`] and tests. The
//! README's cause table is checked against `score_doc` and `evidence_doc`, so it cannot
//! drift from the code.
use serde::{Deserialize, Serialize};

use super::shares::Shares;

/// The causes stallscope names. The names are the strings of the JSON report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    DataloaderCpu,
    Disk,
    CpuContention,
    HostCompute,
    PinnedMemoryCopy,
    Pcie,
    NcclWait,
    LaunchOverhead,
    GilContention,
    LockWait,
    /// The feeder waits for input from outside the job: idle, but not a stall, and never the
    /// verdict.
    NoWork,
    /// A straggler rank whose GPU ran with its clocks held down: named for a rank, never for
    /// a window (a throttled GPU is busy; the ranks waiting for it lose the time).
    GpuThrottled,
    /// Nothing traced explains the idle time; see the stall's `reason`.
    Unknown,
}

/// A signal of the recording a cause's score reads. Without one the cause is not scored but
/// reported unchecked, with why (see `super::signals`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// Per-thread scheduler states (sched tracepoints): always recorded.
    Scheduler,
    /// The CUDA and NCCL uprobes: time inside CUDA calls, by what they waited for.
    CudaProbes,
    /// NVML's PCIe link generation, width and throughput.
    PcieLink,
    /// Kernel launch counts from the launch probes.
    LaunchCounts,
    /// NVML's clocks and clock-event (throttle) reasons.
    GpuClocks,
}

impl Signal {
    /// As the reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Scheduler => "scheduler",
            Signal::CudaProbes => "cuda_probes",
            Signal::PcieLink => "pcie_link",
            Signal::LaunchCounts => "launch_counts",
            Signal::GpuClocks => "gpu_clocks",
        }
    }
}

/// Whose threads speak for a cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speakers {
    /// The DataLoader workers (every traced process off the GPU).
    Workers,
    /// The other threads of the GPU's processes: who holds the GIL or a lock the feeder
    /// waits for.
    Others,
    /// The GPU's feeder threads.
    Feeder,
    /// Every traced thread.
    All,
}

/// The thread state a cause is about: threads are ranked by it in the evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    OnCpu,
    /// On-CPU plus queued: a thread waiting in CUDA spins and yields.
    InCuda,
    IoWait,
    Runqueue,
    Blocked,
}

/// Which stacks show a cause: on-CPU samples, or off-CPU time in IO (in ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stacks {
    OnCpu,
    IoWait,
}

/// What the CUDA evidence of a cause holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaEvidenceKind {
    /// The probes do not speak to it.
    None,
    /// Copy calls and syncs on copies, bytes, achieved GB/s and the PCIe link.
    Copies,
    /// Syncs on collectives and the collectives enqueued.
    Collectives,
    /// Kernel launches per second and per entry point.
    Launches,
}

/// One cause, whole.
pub struct CauseSpec {
    pub cause: Cause,
    pub name: &'static str,
    pub description: &'static str,
    /// What a user usually does about it, in the field guides' words.
    pub fix: &'static str,
    /// How the score is computed, as the README's table says it.
    pub score_doc: &'static str,
    /// What evidence the report shows, as the README's table says it.
    pub evidence_doc: &'static str,
    /// The signals its score reads. (Block IO is `disk`'s evidence, not its score, which IO
    /// wait carries: without the block tracepoints `disk` is still scored.)
    pub needs: &'static [Signal],
    pub speakers: Speakers,
    pub metric: Metric,
    pub stacks: Stacks,
    pub cuda: CudaEvidenceKind,
    /// Whether the time is lost: `no_work` is idle for want of work, which no host fix gives.
    pub is_stall: bool,
    /// The share of the window this cause explains; `None` for `unknown`, which is what is
    /// left when no score wins.
    pub score: Option<fn(&Shares) -> f64>,
}

pub const CAUSES: [CauseSpec; 13] = [
    CauseSpec {
        cause: Cause::DataloaderCpu,
        name: "dataloader_cpu",
        description: "the feeder waits for batches while DataLoader workers are on-CPU",
        fix: "more DataLoader workers (num_workers), cheaper transforms, or move decoding to the GPU",
        score_doc: "feeder blocked × workers' on-CPU share",
        evidence_doc: "workers' on-CPU time and stacks",
        needs: &[Signal::Scheduler],
        speakers: Speakers::Workers,
        metric: Metric::OnCpu,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::None,
        is_stall: true,
        score: Some(|s| s.blocked_left * s.workers_on),
    },
    CauseSpec {
        cause: Cause::Disk,
        name: "disk",
        description: "the feeder or the workers wait on block IO (page-cache misses)",
        fix: "faster storage or a local cache, larger files (shards) instead of many small ones, more prefetch",
        score_doc: "feeder IO wait + feeder blocked × 3 × workers' IO-wait share",
        evidence_doc: "IO-waiting threads, their off-CPU stacks, block IO bytes and p50/p99 latency, files that missed the page cache",
        needs: &[Signal::Scheduler],
        speakers: Speakers::All,
        metric: Metric::IoWait,
        stacks: Stacks::IoWait,
        cuda: CudaEvidenceKind::None,
        is_stall: true,
        score: Some(|s| s.feeder.io_wait + s.blocked_left * 3.0 * s.workers_io),
    },
    CauseSpec {
        cause: Cause::CpuContention,
        name: "cpu_contention",
        description: "the feeder or the workers are runnable but not running",
        fix: "find what else runs on these CPUs (other jobs, too many workers); pin or reduce threads",
        score_doc: "feeder run-queue beyond `u` + feeder blocked × 2 × workers' run-queue share",
        evidence_doc: "run-queue time per thread",
        needs: &[Signal::Scheduler],
        speakers: Speakers::All,
        metric: Metric::Runqueue,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::None,
        is_stall: true,
        score: Some(|s| s.runqueue_left + s.blocked_left * 2.0 * s.workers_rq),
    },
    CauseSpec {
        cause: Cause::HostCompute,
        name: "host_compute",
        description: "the feeder is on-CPU doing its own work while the GPU idles",
        fix: "move per-step host work (logging, metrics, .item() calls) off the training loop",
        score_doc: "feeder on-CPU − `u` (a CUDA sync spins on-CPU while the GPU works, so only the excess is the feeder's own work)",
        evidence_doc: "the feeder's stacks",
        needs: &[Signal::Scheduler],
        speakers: Speakers::Feeder,
        metric: Metric::OnCpu,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::None,
        is_stall: true,
        score: Some(|s| if s.launch_bound { 0.0 } else { s.own_work }),
    },
    CauseSpec {
        cause: Cause::PinnedMemoryCopy,
        name: "pinned_memory_copy",
        description: "the feeder stages or waits for host-device copies",
        fix: "pin host memory (DataLoader pin_memory=True) and copy with non_blocking=True so copies overlap compute; fewer, larger copies",
        score_doc: "feeder time in copy calls (staging pageable memory) and in syncs with a copy outstanding, beyond the busy part (probes)",
        evidence_doc: "the copy calls and their callers, pinned vs pageable bytes, achieved GB/s",
        needs: &[Signal::Scheduler, Signal::CudaProbes],
        speakers: Speakers::Feeder,
        metric: Metric::InCuda,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::Copies,
        is_stall: true,
        score: Some(|s| if s.link_limited { 0.0 } else { s.copy }),
    },
    CauseSpec {
        cause: Cause::Pcie,
        name: "pcie",
        description: "copies are slow because the PCIe link trained down or is saturated",
        fix: "check the link (nvidia-smi -q -d PCI): reseat the card, use an x16 slot without risers, check BIOS link settings and dmesg for PCIe errors",
        score_doc: "the same copy time, when the PCIe link limits it: below its maximum generation or width with copies under half of what the full link gives, or NVML's throughput ≥ 80% of the current link (probes + NVML)",
        evidence_doc: "current vs maximum generation and width, GB/s now vs at full link, achieved GB/s",
        needs: &[Signal::Scheduler, Signal::CudaProbes, Signal::PcieLink],
        speakers: Speakers::Feeder,
        metric: Metric::InCuda,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::Copies,
        is_stall: true,
        score: Some(|s| if s.link_limited { s.copy } else { 0.0 }),
    },
    CauseSpec {
        cause: Cause::NcclWait,
        name: "nccl_wait",
        description: "the feeder waits in a sync on an NCCL collective: another rank is late",
        fix: "fix the slow rank's own cause (see ranks); then NCCL_DEBUG=INFO and nvidia-smi topo -m for the links between GPUs",
        score_doc: "feeder time in syncs whose stream has an NCCL collective outstanding (directly or through events), beyond the working part; plus all waiting time (busy to NVML, waiting by GPM or the other ranks' GPUs)",
        evidence_doc: "the syncs and their callers, the collectives enqueued (op, bytes); the straggler rank",
        needs: &[Signal::Scheduler, Signal::CudaProbes],
        speakers: Speakers::Feeder,
        metric: Metric::InCuda,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::Collectives,
        is_stall: true,
        score: Some(|s| s.collective),
    },
    CauseSpec {
        cause: Cause::LaunchOverhead,
        name: "launch_overhead",
        description: "the feeder's own work is launching kernels (and the Python around them) faster than tiny kernels can use the GPU",
        fix: "fewer, larger kernels: CUDA graphs (torch.compile mode=\"reduce-overhead\"), fused operators, larger batches",
        score_doc: "the `host_compute` score, when the feeder's process launches ≥ 20k kernels per second of the feeder's CPU time (launch probes; a loop starved of CPU launches fewer a second, not fewer per unit of its work)",
        evidence_doc: "launches per second and per entry point, the feeder's stacks",
        needs: &[Signal::Scheduler, Signal::LaunchCounts],
        speakers: Speakers::Feeder,
        metric: Metric::OnCpu,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::Launches,
        is_stall: true,
        score: Some(|s| if s.launch_bound { s.own_work } else { 0.0 }),
    },
    CauseSpec {
        cause: Cause::GilContention,
        name: "gil_contention",
        description: "the feeder waits to take the GIL back while another thread of its process runs Python",
        fix: "move that thread's Python work into DataLoader worker processes (or another process), release the GIL in its native code, or run it less often; a free-threaded Python (3.13t) has no GIL",
        score_doc: "feeder blocked × the share of its sampled off-CPU time in CPython's `take_gil`",
        evidence_doc: "the GIL holders: the other threads of the feeder's process on-CPU meanwhile, their time and Python stacks",
        needs: &[Signal::Scheduler],
        speakers: Speakers::Others,
        metric: Metric::OnCpu,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::None,
        is_stall: true,
        score: Some(|s| s.gil),
    },
    CauseSpec {
        cause: Cause::LockWait,
        name: "lock_wait",
        description: "the feeder waits on a lock, queue or condition that another thread of the job holds or signals",
        fix: "shorten what the other thread does while it holds the lock, or hand its work over ahead of time (a queue with a batch ready) so the loop does not wait each step",
        score_doc: "feeder blocked × the share of its sampled off-CPU time woken from a futex by a traced thread that is no DataLoader worker (`--wakers`), or in lock frames (`PyThread_acquire_lock`, `pthread_mutex_lock`, a semaphore) while the workers are idle",
        evidence_doc: "the other threads of the feeder's process on-CPU meanwhile (the holder), their time and stacks",
        needs: &[Signal::Scheduler],
        speakers: Speakers::Others,
        metric: Metric::OnCpu,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::None,
        is_stall: true,
        score: Some(|s| s.lock),
    },
    CauseSpec {
        cause: Cause::NoWork,
        name: "no_work",
        description: "the feeder waits for input from outside the job (requests on a socket): the GPU has no work, which is not a stall",
        fix: "nothing on this host: the GPU waits for work. Watch request latency and throughput; batch requests if the GPU should be busier",
        score_doc: "feeder blocked × the share of its sampled off-CPU time on a TCP or UDP socket, an epoll of such sockets or a pipe no traced process holds, or woken by the network or a task outside the job; idle, never the verdict",
        evidence_doc: "what the feeder waited on (the socket's addresses) and who woke it",
        needs: &[Signal::Scheduler],
        speakers: Speakers::Feeder,
        metric: Metric::Blocked,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::None,
        is_stall: false,
        score: Some(|s| s.no_work),
    },
    CauseSpec {
        cause: Cause::GpuThrottled,
        name: "gpu_throttled",
        description: "a straggler rank's GPU held its clocks down (thermal, power or hardware slowdown), so the other ranks waited for it",
        fix: "check cooling and power (nvidia-smi -q -d TEMPERATURE,PERFORMANCE,POWER,CLOCK): clean the heatsink, fix the airflow, check the power supply; compare Current and Max Clocks",
        score_doc: "not a window's cause: the straggler, when its GPU reported a slowdown reason (hardware, thermal, power brake; or the power cap with its SM clock ≥ 10% below the other ranks') in ≥ 30% of its busy GPU state samples (NVML)",
        evidence_doc: "the reasons, the share of samples they held, the SM clock against the other ranks'",
        needs: &[Signal::GpuClocks],
        speakers: Speakers::Feeder,
        metric: Metric::InCuda,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::None,
        is_stall: true,
        score: None,
    },
    CauseSpec {
        cause: Cause::Unknown,
        name: "unknown",
        description: "nothing traced explains the idle time",
        fix: "the feeder waited on something stallscope does not trace",
        score_doc: "no score covers a third of the idle fraction; or the feeder looks busy with host work in a window more than half of which came before the CUDA probes saw its first call (a call already in progress when they attached, such as a sync spinning on-CPU in a hung collective, is never seen, and would pass for host work; a window they watched for the most part is judged by what they saw)",
        evidence_doc: "the reason in words",
        needs: &[],
        speakers: Speakers::All,
        metric: Metric::Blocked,
        stacks: Stacks::OnCpu,
        cuda: CudaEvidenceKind::None,
        is_stall: true,
        score: None,
    },
];

impl CauseSpec {
    /// Whether the evidence names what the feeder blocked in: the causes about what it
    /// waited for, and `unknown`.
    pub fn shows_feeder_waits(&self) -> bool {
        matches!(self.speakers, Speakers::Others) || self.metric == Metric::Blocked
    }
}

impl Cause {
    pub const ALL: [Cause; CAUSES.len()] = {
        let mut all = [Cause::Unknown; CAUSES.len()];
        let mut i = 0;
        while i < CAUSES.len() {
            all[i] = CAUSES[i].cause;
            i += 1;
        }
        all
    };

    pub fn spec(self) -> &'static CauseSpec {
        &CAUSES[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.spec().name
    }

    pub fn fix(self) -> &'static str {
        self.spec().fix
    }

    pub fn from_name(name: &str) -> Option<Cause> {
        CAUSES.iter().find(|c| c.name == name).map(|c| c.cause)
    }
}

/// Every cause's score in one window, keyed by cause.
#[derive(Clone, Copy, PartialEq)]
pub struct Scores([f64; CAUSES.len()]);

/// A set of causes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CauseSet(u32);

impl CauseSet {
    pub fn insert(&mut self, c: Cause) {
        self.0 |= 1 << (c as u32);
    }

    pub fn contains(self, c: Cause) -> bool {
        self.0 & (1 << (c as u32)) != 0
    }
}

impl FromIterator<Cause> for CauseSet {
    fn from_iter<I: IntoIterator<Item = Cause>>(iter: I) -> Self {
        let mut s = CauseSet::default();
        for c in iter {
            s.insert(c);
        }
        s
    }
}

impl Scores {
    pub fn of(shares: &Shares) -> Self {
        let mut s = [0.0; CAUSES.len()];
        for spec in &CAUSES {
            if let Some(score) = spec.score {
                s[spec.cause as usize] = score(shares);
            }
        }
        Scores(s)
    }

    pub fn get(&self, cause: Cause) -> f64 {
        self.0[cause as usize]
    }

    /// The highest-scoring cause; the first in registry order on a tie.
    /// The same scores with `unchecked` causes' set to nothing: a cause whose signals are
    /// missing is not judged.
    pub fn without(mut self, unchecked: CauseSet) -> Self {
        for spec in &CAUSES {
            if unchecked.contains(spec.cause) {
                self.0[spec.cause as usize] = 0.0;
            }
        }
        self
    }

    pub fn best(&self) -> (Cause, f64) {
        CAUSES
            .iter()
            .filter(|c| c.score.is_some())
            .fold((Cause::Unknown, f64::MIN), |best, c| {
                let s = self.get(c.cause);
                if s > best.1 { (c.cause, s) } else { best }
            })
    }
}

impl std::fmt::Debug for Scores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(
                CAUSES
                    .iter()
                    .filter(|c| c.score.is_some())
                    .map(|c| (c.name, self.get(c.cause))),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_spec_sits_at_its_variants_position_with_a_unique_name() {
        for (i, spec) in CAUSES.iter().enumerate() {
            assert_eq!(spec.cause as usize, i, "{} is out of place", spec.name);
            assert_eq!(Cause::from_name(spec.name), Some(spec.cause));
            let json = serde_json::to_string(&spec.cause).unwrap();
            assert_eq!(
                json,
                format!("\"{}\"", spec.name),
                "serde name of {}",
                spec.name
            );
        }
    }

    #[test]
    fn only_unknown_and_rank_causes_have_no_score_and_every_scored_cause_needs_the_scheduler() {
        for spec in &CAUSES {
            assert_eq!(
                spec.score.is_none(),
                matches!(spec.cause, Cause::Unknown | Cause::GpuThrottled),
                "{}",
                spec.name
            );
            if spec.score.is_some() {
                assert!(spec.needs.contains(&Signal::Scheduler), "{}", spec.name);
            }
        }
    }

    #[test]
    fn the_readme_table_says_what_the_registry_says() {
        let readme = include_str!("../../../README.md");
        for spec in &CAUSES {
            let row = format!(
                "| `{}` | {} | {} |",
                spec.name, spec.score_doc, spec.evidence_doc
            );
            assert!(
                readme.contains(&row),
                "README.md's cause table has no row starting\n{row}"
            );
        }
    }
}
