//! The analysis model: what a recording says, folded per thread, process, stack and tick.
//!
//! Built by [`crate::analysis::fold::Analyzer`]; read by the reports. Maps are `BTreeMap` and lists are
//! sorted so that every report is deterministic.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::recording::record::{EndReason, GpuInfo, GpuState, Meta, ThreadCounters};

/// Everything the reports need from one recording.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Analysis {
    /// The first `Meta` record, if any.
    pub meta: Option<Meta>,
    /// Recording start, CLOCK_MONOTONIC ns: `meta.start_ns`, or the first timestamp seen.
    pub start_ns: u64,
    /// `End.ts_ns - start_ns`, or up to the last timestamp seen when there is no `End`.
    pub duration_ns: u64,
    /// Whether an `End` record was seen.
    pub ended: bool,
    pub end_reason: Option<EndReason>,
    /// By TID.
    pub threads: BTreeMap<u32, ThreadSummary>,
    /// By PID: every process named by a `Process` record or by a thread.
    pub processes: BTreeMap<u32, ProcessSummary>,
    /// Interned stacks by id, root frame first.
    pub stacks: BTreeMap<u32, Vec<String>>,
    /// On-CPU sample counts, sorted by (tid, stack).
    pub cpu_samples: Vec<CpuStackSamples>,
    /// Off-CPU time per stack, sorted by (tid, stack, io).
    pub off_cpu: Vec<OffCpuStackTime>,
    /// `PageCacheFile` records, sorted by bytes (largest first), then tid, dev, ino.
    pub page_cache_files: Vec<PageCacheFileEntry>,
    /// Event accounting per kind, summed over `Loss` records.
    pub events: BTreeMap<String, EventCounts>,
    /// Sum of `events[*].lost`.
    pub lost_events: u64,
    /// Sum of `events[*].attempted`.
    pub attempted_events: u64,
    /// Signals the recorder could not trace, in record order.
    pub unavailable: Vec<UnavailableSignal>,
    /// Per-tick thread-state deltas, in time order.
    pub timeline: Vec<TickSlice>,
    /// GPUs by NVML index, with their utilization samples.
    pub gpus: BTreeMap<u32, GpuTimeline>,
    /// CPUs on the recording host; 0 when the recording does not say.
    pub cpus: u32,
    /// How fast one host CPU copies memory, GB/s (bytes per ns), when the recording says.
    pub host_copy_gbps: Option<f64>,
    /// The host's CPU time as the recording read it, in time order; empty in recordings made
    /// before it was read.
    pub host_cpu: Vec<HostCpuReading>,
    /// Processes that mapped the CUDA driver library, with its path.
    pub cuda_processes: BTreeMap<u32, String>,
    /// What the CUDA and NCCL probes saw.
    pub cuda: crate::cuda::CudaView,
    /// How the stack samples were unwound; `None` in recordings made before it was recorded.
    pub unwinding: Option<crate::recording::record::UnwindStats>,
    /// How the Python frames were read; `None` when the recording says nothing of them.
    pub python: Option<crate::recording::record::PythonStats>,
    /// When the threads that call CUDA were off their CPU, where their samples say.
    pub callers_off_cpu: crate::analysis::off_cpu_spans::OffCpuSpans,
}

/// The whole host's CPU time at one moment, since boot, all CPUs together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCpuReading {
    pub ts_ns: u64,
    pub busy_ns: u64,
    pub total_ns: u64,
}

impl Analysis {
    /// The CPUs the whole host kept busy on average over `[start, end]`, from the readings
    /// closest inside it; `None` without two readings there.
    pub fn host_busy_cpus(&self, start: u64, end: u64) -> Option<f64> {
        // Looked up once a step by the advice: a search, not a scan.
        let lo = self.host_cpu.partition_point(|r| r.ts_ns < start);
        let hi = self.host_cpu.partition_point(|r| r.ts_ns <= end);
        let inside = self.host_cpu.get(lo..hi)?;
        let (first, last) = (inside.first()?, inside.last()?);
        let wall = last.ts_ns.checked_sub(first.ts_ns).filter(|w| *w > 0)?;
        Some(last.busy_ns.saturating_sub(first.busy_ns) as f64 / wall as f64)
    }
}

/// One GPU over the recording.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuTimeline {
    pub info: GpuInfo,
    /// Utilization samples sorted by time, duplicates removed.
    pub samples: Vec<GpuSample>,
    pub states: Vec<GpuState>,
    /// Mean SM utilization per PID, over the samples NVML gave for it.
    pub process_sm_pct: BTreeMap<u32, f64>,
}

impl GpuTimeline {
    /// Mean GPM SM activity over the recording, where the GPU has GPM (Hopper and newer).
    pub fn mean_sm_active(&self) -> Option<f64> {
        let v: Vec<u32> = self.states.iter().filter_map(|s| s.sm_active_pct).collect();
        (!v.is_empty()).then(|| v.iter().map(|&p| f64::from(p)).sum::<f64>() / v.len() as f64)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuSample {
    /// End of the sample period, CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    pub period_ns: u64,
    pub util_pct: u32,
}

impl GpuSample {
    pub fn start_ns(&self) -> u64 {
        self.ts_ns.saturating_sub(self.period_ns)
    }

    /// Time in the period during which no kernel ran.
    pub fn idle_ns(&self) -> u64 {
        let idle_pct = 100u64.saturating_sub(u64::from(self.util_pct.min(100)));
        // In u128: a damaged period times 100 overflows u64; the result is at most the period.
        (u128::from(self.period_ns) * u128::from(idle_pct) / 100) as u64
    }
}

/// One thread over the whole recording.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadSummary {
    pub tid: u32,
    pub pid: u32,
    /// The latest `Thread` record's name; empty if none was seen.
    pub comm: String,
    /// The `ThreadExit` counters if the thread exited, else its last `Tick` entry.
    pub counters: ThreadCounters,
    pub exited: bool,
    pub block_io: BlockIoSummary,
    /// What it blocked in, the most time first (see [`BlockedOn`]); empty in recordings made
    /// before it was read.
    pub blocked_on: Vec<BlockedOn>,
}

/// One thing a thread blocked in: a system call and what it waited on, with the time of
/// the sampled off-CPU intervals spent there (each thread's off-CPU time is sampled, one
/// interval every few milliseconds: a share of its waits, not their sum).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockedOn {
    /// `futex`, `poll`, `socket`, `pipe`, `sleep`, `wait`, `file`, or the call's name.
    pub kind: &'static str,
    /// The system call: `futex`, `recvfrom`, `epoll_wait`, ...
    pub call: String,
    /// What it waited on: `socket TCP 127.0.0.1:5000 <- 127.0.0.1:40412`, a pipe and who
    /// holds its other end, a path, a futex's address; empty when the call says nothing more.
    pub detail: String,
    pub ns: u64,
    /// Who ended these waits, the most time first; empty when the recording does not say.
    pub wakers: Vec<Waker>,
}

/// Who ended a thread's waits, with the sampled off-CPU time they ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Waker {
    /// `thread` (a traced thread), `process` (a task outside the job), `interrupt` (the
    /// network, a disk, another device) or `timer`.
    pub kind: &'static str,
    /// `TID 812 (python)`, `PID 40 (curl)`, `network receive`, `timer`.
    pub who: String,
    /// The task current where the wake-up ran (0: an idle CPU); for an interrupt, the task
    /// it interrupted.
    pub tid: u32,
    pub pid: u32,
    pub ns: u64,
}

impl Waker {
    /// A waker as the kernel saw it (see `Record::WokenBy`), `traced` telling the job's own
    /// threads from tasks outside it.
    pub fn classify(
        (tid, pid, comm, context): (u32, u32, &str, &str),
        traced: impl Fn(u32) -> bool,
        ns: u64,
    ) -> Self {
        let (kind, who) = match context {
            "timer" => ("timer", "timer".to_owned()),
            "task" if tid != 0 && traced(tid) => ("thread", format!("TID {tid} ({comm})")),
            "task" if tid != 0 => ("process", format!("PID {pid} ({comm})")),
            // The idle task wakes nobody of its own: an interrupt on an idle CPU.
            "task" => ("interrupt", "interrupt".to_owned()),
            other => ("interrupt", other.to_owned()),
        };
        Waker {
            kind,
            who,
            tid,
            pid,
            ns,
        }
    }
}

impl BlockedOn {
    /// What kind of wait a call on `detail` is: one word the report and the rules read.
    pub fn kind_of(call: &str, detail: &str) -> &'static str {
        match call {
            "futex" | "futex_waitv" => "futex",
            "epoll_wait" | "epoll_pwait" | "epoll_pwait2" | "poll" | "ppoll" | "select"
            | "pselect6" => "poll",
            "nanosleep" | "clock_nanosleep" => "sleep",
            "wait4" | "waitid" => "wait",
            _ if detail.starts_with("socket") => "socket",
            _ if detail.starts_with("pipe") => "pipe",
            _ if detail.starts_with('/') => "file",
            "read" | "readv" | "pread64" => "read",
            _ => "other",
        }
    }
}

/// Block IO issued by one thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockIoSummary {
    pub count: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Latency is queue plus service time. Exact up to 4096 requests per thread, then within
    /// 0.4% (see [`crate::analysis::percentiles`]).
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub max_ns: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessSummary {
    pub pid: u32,
    /// From the latest `Process` record; `None` if there was none.
    pub ppid: Option<u32>,
    /// From the latest `Process` record; empty if there was none.
    pub cmdline: String,
    /// The main thread's name (TID == PID), else the lowest TID's.
    pub comm: String,
    /// TIDs, ascending.
    pub threads: Vec<u32>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuStackSamples {
    pub tid: u32,
    pub pid: u32,
    pub stack: u32,
    pub samples: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuStackTime {
    pub tid: u32,
    pub pid: u32,
    pub stack: u32,
    /// Waiting on IO (as opposed to blocked on a lock, sleep, or event).
    pub io: bool,
    /// Sum of the captured samples' durations.
    pub sampled_ns: u64,
    /// `sampled_ns` scaled so that the thread's entries add up to its measured off-CPU time
    /// (`io_wait_ns + blocked_ns`); never scaled down.
    pub scaled_ns: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageCacheFileEntry {
    pub tid: u32,
    pub pid: u32,
    /// Kernel-internal dev_t: major in the top 12 bits, minor in the low 20.
    pub dev: u32,
    pub ino: u64,
    pub path: Option<String>,
    pub pages: u64,
    pub bytes: u64,
}

/// Page-cache misses on one file summed over threads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileMisses {
    pub dev: u32,
    pub ino: u64,
    pub path: Option<String>,
    pub pages: u64,
    pub bytes: u64,
}

impl FileMisses {
    /// The path, or `dev MAJ:MIN ino N` when the recorder could not resolve one.
    pub fn display_name(&self) -> String {
        match &self.path {
            Some(path) => path.clone(),
            None => format!(
                "dev {}:{} ino {}",
                self.dev >> 20,
                self.dev & 0xf_ffff,
                self.ino
            ),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventCounts {
    pub attempted: u64,
    pub dropped: u64,
    pub received: u64,
    /// `dropped` plus whatever else went missing (`attempted - dropped - received`, if positive).
    pub lost: u64,
    /// For a `*_thinned` counter: the records the kernel chose not to send while the reader
    /// was behind (as many as `attempted`); 0 for the others.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub thinned: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnavailableSignal {
    pub signal: String,
    pub reason: String,
}

/// What each thread did between two consecutive ticks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TickSlice {
    /// CLOCK_MONOTONIC ns: the previous tick (or the recording start).
    pub start_ns: u64,
    /// CLOCK_MONOTONIC ns: this tick.
    pub end_ns: u64,
    /// Threads with any time in the slice, by TID. A thread that exited since the previous
    /// tick appears in the next slice with its final delta.
    pub threads: Vec<ThreadDelta>,
}

/// Time one thread spent in each state during a [`TickSlice`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadDelta {
    pub tid: u32,
    pub on_cpu_ns: u64,
    pub runqueue_ns: u64,
    pub io_wait_ns: u64,
    pub blocked_ns: u64,
}

impl Analysis {
    /// The recording's target PIDs (empty without a `Meta`).
    pub fn target_pids(&self) -> &[u32] {
        self.meta.as_ref().map_or(&[], |m| &m.target_pids)
    }

    /// Page-cache misses summed per file, largest first (ties by dev, ino), at most `n`.
    pub fn top_page_cache_files(&self, n: usize) -> Vec<FileMisses> {
        let mut by_file: BTreeMap<(u32, u64), FileMisses> = BTreeMap::new();
        for f in &self.page_cache_files {
            let entry = by_file.entry((f.dev, f.ino)).or_insert_with(|| FileMisses {
                dev: f.dev,
                ino: f.ino,
                ..FileMisses::default()
            });
            entry.pages += f.pages;
            entry.bytes += f.bytes;
            if entry.path.is_none() {
                entry.path.clone_from(&f.path);
            }
        }
        let mut files: Vec<FileMisses> = by_file.into_values().collect();
        files.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then(a.dev.cmp(&b.dev))
                .then(a.ino.cmp(&b.ino))
        });
        files.truncate(n);
        files
    }
}
