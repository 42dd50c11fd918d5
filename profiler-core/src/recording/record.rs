//! The records of a recording file: the seam between capture (root, live) and analysis.
//!
//! All timestamps are CLOCK_MONOTONIC nanoseconds (the eBPF `bpf_ktime_get_ns` clock);
//! `Meta::start_unix_ns` anchors them to wall time. New record variants are only ever
//! appended at the end of `Record`, so older files keep decoding; a reader skips variants it
//! does not know and counts them.
use serde::{Deserialize, Serialize};

/// Cumulative per-thread accounting since the thread was first tracked.
/// `on_cpu_ns + runqueue_ns + io_wait_ns + blocked_ns` is the thread's observed lifetime
/// up to the record's timestamp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCounters {
    pub tid: u32,
    pub pid: u32,
    pub on_cpu_ns: u64,
    pub runqueue_ns: u64,
    pub io_wait_ns: u64,
    pub blocked_ns: u64,
    pub page_cache_misses: u64,
    pub page_cache_miss_bytes: u64,
}

impl ThreadCounters {
    /// Saturates instead of overflowing: counters come from files, which may be damaged.
    pub fn lifetime_ns(&self) -> u64 {
        self.on_cpu_ns
            .saturating_add(self.runqueue_ns)
            .saturating_add(self.io_wait_ns)
            .saturating_add(self.blocked_ns)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// The root PIDs named on the command line (or the launched command's PID).
    pub target_pids: Vec<u32>,
    /// The launched command, empty when attached by PID.
    pub command: Vec<String>,
    pub start_ns: u64,
    pub start_unix_ns: u64,
    pub hostname: String,
    pub kernel: String,
    pub sample_hz: u64,
    pub tick_ns: u64,
    pub stallscope_version: String,
}

/// Why a recording ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EndReason {
    Duration,
    Signal,
    TargetExited,
}

impl EndReason {
    /// The name the reports give it.
    pub fn name(self) -> &'static str {
        match self {
            EndReason::Duration => "duration",
            EndReason::Signal => "signal",
            EndReason::TargetExited => "target_exited",
        }
    }
}

/// One kind of event the kernel side counts: `received + dropped == attempted` when nothing
/// went missing between kernel and file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLoss {
    pub kind: String,
    pub attempted: u64,
    pub dropped: u64,
    pub received: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// Boxed: it is the largest record and comes once, and every record is as large as the
    /// largest variant, so inline it would double the bytes each of millions of samples moves.
    /// Serialized the same as unboxed.
    Meta(Box<Meta>),
    /// A thread's name and process, when first seen and again when it changes (exec, prctl).
    Thread {
        ts_ns: u64,
        tid: u32,
        pid: u32,
        comm: String,
    },
    /// A process's command line, when first seen or after exec.
    Process {
        ts_ns: u64,
        pid: u32,
        ppid: u32,
        cmdline: String,
    },
    /// Periodic snapshot of every live tracked thread's cumulative counters.
    Tick {
        ts_ns: u64,
        threads: Vec<ThreadCounters>,
    },
    /// A thread's final counters.
    ThreadExit {
        ts_ns: u64,
        counters: ThreadCounters,
    },
    /// An interned, symbolized stack, root first. Samples refer to it by `id`.
    Stack {
        id: u32,
        frames: Vec<String>,
    },
    CpuSample {
        ts_ns: u64,
        tid: u32,
        pid: u32,
        stack: u32,
    },
    /// A sampled off-CPU period starting at `ts_ns`. Captures are rate-limited per thread,
    /// so analysis scales each thread's samples up to that thread's measured off-CPU total.
    OffCpuSample {
        ts_ns: u64,
        tid: u32,
        pid: u32,
        duration_ns: u64,
        io: bool,
        stack: u32,
    },
    BlockIo {
        ts_ns: u64,
        tid: u32,
        pid: u32,
        dev: u32,
        write: bool,
        sector: u64,
        bytes: u64,
        queue_ns: u64,
        service_ns: u64,
    },
    /// Page-cache misses of one thread on one file, written at the end of a recording.
    PageCacheFile {
        tid: u32,
        pid: u32,
        dev: u32,
        ino: u64,
        path: Option<String>,
        pages: u64,
        bytes: u64,
    },
    /// A signal that could not be traced on this host, and why.
    Unavailable {
        signal: String,
        reason: String,
    },
    Loss(EventLoss),
    End {
        ts_ns: u64,
        reason: EndReason,
    },
    /// A GPU watched during the recording.
    Gpu(Box<GpuInfo>),
    /// One NVML utilization sample: the percent of `(ts_ns - period_ns, ts_ns]` during which
    /// at least one kernel ran (a duty cycle, not SM occupancy). `ts_ns` is already rebased
    /// from NVML's clock onto CLOCK_MONOTONIC.
    GpuUtil {
        gpu: u32,
        ts_ns: u64,
        period_ns: u64,
        util_pct: u32,
    },
    /// Slower-changing device state, sampled about once per tick.
    GpuState(Box<GpuState>),
    /// NVML's per-process SM utilization over the period ending at `ts_ns`.
    GpuProcessUtil {
        gpu: u32,
        ts_ns: u64,
        pid: u32,
        sm_pct: u32,
        mem_pct: u32,
    },
    /// The host the recording was made on: the CPUs the traced tree could use.
    Host {
        cpus: u32,
    },
    /// A traced process mapped the CUDA driver library (found in its /proc/PID/maps): it
    /// talks to a GPU.
    CudaLibrary {
        ts_ns: u64,
        pid: u32,
        path: String,
    },
    /// A CUDA or NCCL library file the recorder put uprobes on, once per file (device and
    /// inode), first seen mapped by `pid` at `path` (in that process's mount namespace).
    CudaProbes {
        ts_ns: u64,
        pid: u32,
        path: String,
        library: super::cuda_ops::Library,
        attached: Vec<String>,
        /// Functions the file lacks (or that failed to attach), with the reason.
        missing: Vec<(String, String)>,
    },
    CudaCall(Box<CudaCall>),
    /// Kernel launches counted while the launch probes were on: they are switched on for
    /// short on-periods, `probed_ns` of the interval ending at `ts_ns`, and rates scale by it.
    Launches {
        ts_ns: u64,
        probed_ns: u64,
        counts: Vec<LaunchCount>,
    },
    /// The launcher's rank variables in a process's environment (RANK, WORLD_SIZE, ...):
    /// which rank it is when its NCCL communicator was made before the probes came.
    ProcessEnv {
        pid: u32,
        vars: Vec<(String, String)>,
    },
    /// How the stack samples were unwound, written once at the end. Added after the first
    /// version-1 recordings: readers before it skip it as a record of an unknown kind.
    Unwinding(Box<UnwindStats>),
    /// How the Python frames of CPython processes were read, written at the end.
    PythonStacks(Box<PythonStats>),
    /// The Python line a probed CUDA/NCCL call was made from: the innermost Python frames
    /// of the thread, innermost first, for the `CudaCall` of `tid` that started at
    /// `start_ns` (written just before it).
    CudaCallSite {
        tid: u32,
        start_ns: u64,
        python: Vec<String>,
    },
    /// The whole host's CPU time at `ts_ns`, all CPUs together, since boot (`/proc/stat`):
    /// busy (user, nice, system, irq, softirq, steal) and in all. What the traced tree does
    /// not use of the host is what its DataLoader could. Readers before it skip it.
    HostCpu {
        ts_ns: u64,
        busy_ns: u64,
        total_ns: u64,
    },
    /// What a tracked thread blocked in, for the `OffCpuSample` of `tid` at `ts_ns` that
    /// follows it: the system call's name (`futex`, `recvfrom`, `epoll_wait`, ...) and what
    /// its file descriptor was (`socket TCP 127.0.0.1:5000 -> 127.0.0.1:40412`, `pipe from
    /// PID 812 (python)`, a path), or its address or clock. Added after the first version-1
    /// recordings: readers before it skip it as a record of an unknown kind.
    BlockedIn {
        ts_ns: u64,
        tid: u32,
        call: String,
        detail: String,
    },
    /// How fast one of the host's CPUs copies memory: `bytes` from one buffer to another in
    /// `ns`, the best of a few tries at the start. What a pin-memory thread's copy of a batch
    /// into page-locked memory costs. Readers before it skip it.
    HostCopy {
        bytes: u64,
        ns: u64,
    },
    /// Who woke `tid` from the off-CPU period whose `OffCpuSample` (at `ts_ns`) follows: the
    /// task current where the wake-up ran (`waker_tid` 0: the idle task, on an idle CPU) and
    /// what the kernel was doing there, from its stack: `task` (the waker's own call: a
    /// futex wake, a write to a pipe or socket), `timer`, `network receive`, `block IO
    /// completion` or `interrupt` (the task current was only interrupted). Readers before it
    /// skip it.
    WokenBy {
        ts_ns: u64,
        tid: u32,
        waker_tid: u32,
        waker_pid: u32,
        waker_comm: String,
        context: String,
    },
}

/// Stack samples counted by how far their unwind got and which walk gave it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnwindStats {
    /// The unwind reached the thread's first frame.
    pub complete: u64,
    /// Frames were found, but the walk stopped before the first frame.
    pub truncated: u64,
    /// No user frame was found.
    pub failed: u64,
    /// Samples whose frame-pointer walk was kept (it was complete, or DWARF found no more).
    pub by_frame_pointers: u64,
    /// Samples unwound from their stack copy with DWARF CFI.
    pub by_dwarf: u64,
    /// Samples that came without the stack copy asked for (lost to a full buffer, or an
    /// unreadable stack).
    pub without_copy: u64,
    /// Stack copies walked with DWARF CFI (a walk may lose to a complete frame-pointer one),
    /// and the recorder's time in them (reading the maps of new processes included).
    pub dwarf_walks: u64,
    pub dwarf_ns: u64,
    /// Named problems, each once: an object without unwind information, one that could not
    /// be read, a process gone before its mappings were read.
    pub warnings: Vec<String>,
}

impl UnwindStats {
    pub fn samples(&self) -> u64 {
        // Saturating: the counts come from a file, which may be damaged.
        self.complete
            .saturating_add(self.truncated)
            .saturating_add(self.failed)
    }
}

/// How the Python frames of CPython processes were read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonStats {
    /// Each CPython process found, with its version ("3.11").
    pub processes: Vec<(u32, String)>,
    /// Stack samples that carried Python frames, and those frames.
    pub samples: u64,
    pub frames: u64,
    /// Frames whose code object could not be read (the process had exited, or the frame was
    /// half made); their samples keep the other frames.
    pub unreadable: u64,
    /// Samples whose Python stack was deeper than the kernel's walk reads: the outermost
    /// frames are missing.
    pub truncated: u64,
    /// Named problems, each once: an unsupported version, an interpreter that could not be
    /// read, a process gone before its frames were read.
    pub warnings: Vec<String>,
}

/// One probed CUDA/NCCL call of a traced thread, entry to return.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaCall {
    pub tid: u32,
    pub pid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The function, as named in `crate::cuda::APIS`.
    pub api: String,
    pub op: super::cuda_ops::CudaOp,
    /// `CUresult` / `cudaError_t` / `ncclResult_t`; 0 is success; [`IN_PROGRESS`] for a call
    /// that had not returned when the recording ended (it ends there).
    pub status: u64,
    /// The calling function (from the return address at entry), or empty.
    pub caller: String,
}

/// [`CudaCall::status`] of a call still in progress when the recording ended.
pub const IN_PROGRESS: u64 = u64::MAX;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchCount {
    pub tid: u32,
    pub pid: u32,
    pub launches: u64,
    /// The entry point: `cuLaunchKernel`, its `_ptsz` form, `cudaLaunchKernel`, ...
    pub api: String,
}

/// A GPU as NVML describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub pci_bus_id: String,
    pub driver_version: String,
    pub pcie_max_gen: u32,
    pub pcie_max_width: u32,
    pub memory_total_bytes: u64,
    /// PIDs of the traced tree that NVML lists as running on it; empty when none was seen
    /// and the GPU is watched as a fallback.
    pub target_pids: Vec<u32>,
}

/// Clocks, throttling, PCIe link, power and memory at `ts_ns`. Fields NVML does not
/// support on a device are `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuState {
    pub gpu: u32,
    pub ts_ns: u64,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    /// NVML's clocks-event (throttle) reason bits; 0x1 is GPU_IDLE.
    pub throttle_reasons: Option<u64>,
    pub pcie_gen: Option<u32>,
    pub pcie_width: Option<u32>,
    pub pcie_tx_kbps: Option<u32>,
    pub pcie_rx_kbps: Option<u32>,
    pub power_mw: Option<u32>,
    pub temperature_c: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    /// GPM (Hopper and newer): percent of SM cycles with work resident, and SM occupancy, over
    /// the last interval. The SM-activity truth behind DCGM's profiling fields.
    pub sm_active_pct: Option<u32>,
    pub sm_occupancy_pct: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every record is as large as its largest variant, and an hour's millions of samples are
    /// each moved several times between the file and the fold: the rare large variants are
    /// boxed so a sample moves 88 bytes, not 144.
    #[test]
    fn a_record_moves_no_more_than_88_bytes() {
        eprintln!("Record: {} bytes", std::mem::size_of::<Record>());
        assert!(std::mem::size_of::<Record>() <= 88);
    }
}
