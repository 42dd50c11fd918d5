//! The rules that pick one cause for a window of GPU idle time.
//!
//! With `u` the GPU's busy fraction and the feeder's and workers' state fractions from the
//! window:
//! - `host_compute = feeder_on_cpu − u`: a CUDA sync spins while the GPU works (on-CPU, or
//!   queued after a `sched_yield`), so the feeder's on-CPU time, then its run-queue time,
//!   first covers the busy part; only the rest is its own work or real contention.
//! - `cpu_contention = feeder_runqueue_beyond_busy + feeder_blocked × 2 × workers_runqueue_share`
//! - `disk = feeder_io_wait + feeder_blocked × 3 × workers_io_wait_share`
//! - `dataloader_cpu = feeder_blocked × workers_on_cpu_share`
//!
//! The factor 2: workers that waited for a CPU, or for IO, at least half as long as they ran
//! would have had their batches ready without the wait, so the wait is the cause, not their
//! computing. A queue for CPUs is contention whoever takes them (another job, or more workers
//! than the host has CPUs). `dataloader_cpu` is left for workers that mostly compute. IO gets
//! a factor 3: a cold read also costs on-CPU time (the kernel copying pages, page-cache
//! work), so IO wait alone understates what reading from disk took.
//!
//! where a worker share is that state's part of the workers' *active* time (on-CPU, queued
//! or in IO): what the workers were doing while the feeder waited for them.
//!
//! When the CUDA probes watched the feeder's process, its time inside CUDA calls is known
//! instead of guessed: that time is taken out of its on-CPU and then its run-queue time
//! (a waiting thread spins, and yields), and is scored by what it waited for:
//! - `nccl_wait` = sync time with a collective outstanding,
//! - `pinned_memory_copy` = copy time (staging pageable memory inside the copy call, plus
//!   sync time with a copy outstanding, at most what the link needs to move its bytes),
//! - `pcie` = the same copy time, instead, when the link limits it (see [`HostWindow`]),
//!
//! - `launch_overhead` = the `host_compute` score instead, when the feeder's process launches
//!   kernels at a launch-bound rate ([`LAUNCH_BOUND_PER_SEC`]),
//!
//! where the busy part of the window is first covered by syncs that waited for kernels, and
//! the rest of it by the copy and collective waits in proportion (a sync on a copy also
//! waits for the kernels queued behind it). The highest score wins; when none covers at least
//! a third of the idle fraction, the window is `unknown`, with the reason.
use super::{
    causes::{Cause, CauseSet, Scores},
    shares::Shares,
    window::HostWindow,
};

#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    pub cause: Cause,
    pub reason: Option<String>,
    pub scores: Scores,
}

/// Kernel launches from the feeder's process per second of the feeder's own CPU time, past
/// which that on-CPU work is launch overhead: at the driver's 3–5 µs a launch, 20k launches
/// take a tenth of that CPU just to enqueue, and the Python that issues them several times
/// that. The rate the
/// probes see is a lower bound (each probed launch is slower), which keeps this
/// conservative.
pub const LAUNCH_BOUND_PER_SEC: f64 = 20_000.0;

/// Workers busy less than this share of their time count as idle.
const WORKERS_ACTIVE_MIN: f64 = 0.05;
/// A winning score must cover this much of the window's idle fraction.
const MIN_COVER: f64 = 1.0 / 3.0;

/// The feeder's probed CUDA time as fractions of its accounted time.
#[derive(Clone, Copy, Debug, Default)]
struct CudaShares {
    total: f64,
    copy: f64,
    collective: f64,
}

/// Copy bandwidth assumed when NVML gives no link state: a PCIe gen3 x16 link's.
pub(super) const DEFAULT_LINK_GBPS: f64 = 15.75;

fn cuda_shares(host: &HostWindow, busy: f64) -> Option<CudaShares> {
    let c = host.cuda?;
    let t = host.feeder.total();
    if t <= 0.0 {
        return Some(CudaShares::default());
    }
    let total = (c.total() / t).min(1.0);
    let kernel = c.kernel_ns / t;
    let collective = c.collective_ns / t;
    let sync_copy = c.sync_copy_ns / t;
    // Busy time not covered by kernel syncs was covered by the other syncs.
    let spill = (busy - kernel).max(0.0);
    let gpu_waits = sync_copy + collective;
    let keep = if gpu_waits > 0.0 {
        (1.0 - spill / gpu_waits).max(0.0)
    } else {
        0.0
    };
    // A sync's idle part is the copy's only as long as the link needs to move its bytes;
    // the rest is launch gaps and scheduling, not the copy.
    let link = host.link_gbps.unwrap_or(DEFAULT_LINK_GBPS);
    let copy_time = (c.sync_pinned_bytes / link + c.sync_staged_ns) / t;
    Some(CudaShares {
        total,
        copy: c.call_copy_ns / t + (sync_copy * keep).min(copy_time),
        collective: collective * keep,
    })
}

/// `unchecked`: the causes the recording cannot judge, never the window's.
pub fn label_window(host: &HostWindow, busy: f64, unchecked: CauseSet) -> Label {
    let idle = (1.0 - busy).clamp(0.0, 1.0);
    let f = host.feeder.fractions();
    let wt = host.workers.total();
    let w_active = host.workers.on_cpu + host.workers.runqueue + host.workers.io_wait;
    let (w_on, w_rq, w_io) = if wt > 0.0 && w_active / wt >= WORKERS_ACTIVE_MIN {
        (
            host.workers.on_cpu / w_active,
            host.workers.runqueue / w_active,
            host.workers.io_wait / w_active,
        )
    } else {
        (0.0, 0.0, 0.0)
    };
    let cuda = cuda_shares(host, busy);
    // Without probes, spinning is assumed to cover the busy part; with them it is measured.
    let (on, rq, cover) = match cuda {
        Some(c) => {
            let in_cuda_on = f.on_cpu.min(c.total);
            let in_cuda_rq = f.runqueue.min(c.total - in_cuda_on);
            (f.on_cpu - in_cuda_on, f.runqueue - in_cuda_rq, 0.0)
        }
        None => (f.on_cpu, f.runqueue, busy),
    };
    let spin_left = (cover - on).max(0.0);
    let c = cuda.unwrap_or_default();
    let waits = host.waits;
    // A DataLoader's queue is a lock and a condition too: lock frames with no waker to say
    // who released them are the workers' while the workers are busy.
    let workers_busy = w_on + w_rq + w_io > 0.0;
    let lock = waits.lock_woken + if workers_busy { 0.0 } else { waits.lock };
    let gil = f.blocked * waits.gil;
    let lock = f.blocked * lock;
    let no_work = f.blocked * waits.outside;
    let shares = Shares {
        feeder: f,
        workers_on: w_on,
        workers_rq: w_rq,
        workers_io: w_io,
        runqueue_left: (rq - spin_left).max(0.0),
        own_work: (on - cover).max(0.0),
        copy: c.copy,
        collective: c.collective,
        link_limited: host.link_limited,
        launch_bound: host.launch_bound,
        gil,
        lock,
        no_work,
        blocked_left: (f.blocked - gil - lock - no_work).max(0.0),
    };
    let scores = Scores::of(&shares).without(unchecked);
    let (best, score) = scores.best();
    if host.feeder.total() <= 0.0 {
        return Label {
            cause: Cause::Unknown,
            reason: Some("no accounting for the GPU's feeder thread in this window".into()),
            scores,
        };
    }
    if score < MIN_COVER * idle || score <= 0.0 {
        let reason = format!(
            "the feeder was {:.0}% on-CPU, {:.0}% blocked, {:.0}% in IO and {:.0}% queued{} while the GPU idled {:.0}%, and the workers were {}",
            f.on_cpu * 100.0,
            f.blocked * 100.0,
            f.io_wait * 100.0,
            f.runqueue * 100.0,
            match cuda {
                Some(c) => format!(" ({:.0}% inside CUDA calls)", c.total * 100.0),
                None => String::new(),
            },
            idle * 100.0,
            if w_on + w_rq + w_io == 0.0 {
                "idle"
            } else {
                "busy too little to explain it"
            }
        );
        return Label {
            cause: Cause::Unknown,
            reason: Some(reason),
            scores,
        };
    }
    Label {
        cause: best,
        reason: None,
        scores,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::window::States;

    fn st(on: f64, rq: f64, io: f64, bl: f64) -> States {
        States {
            on_cpu: on,
            runqueue: rq,
            io_wait: io,
            blocked: bl,
        }
    }

    fn host(feeder: States, workers: States) -> HostWindow {
        HostWindow {
            feeder,
            workers,
            ..HostWindow::default()
        }
    }

    #[test]
    fn feeder_waiting_on_busy_workers_is_dataloader_cpu() {
        let h = host(st(25.0, 0.0, 0.0, 75.0), st(180.0, 10.0, 0.0, 10.0));
        assert_eq!(
            label_window(&h, 0.25, CauseSet::default()).cause,
            Cause::DataloaderCpu
        );
    }

    #[test]
    fn workers_in_io_wait_is_disk() {
        let h = host(st(20.0, 0.0, 0.0, 80.0), st(20.0, 0.0, 150.0, 30.0));
        assert_eq!(
            label_window(&h, 0.2, CauseSet::default()).cause,
            Cause::Disk
        );
        let direct = host(st(10.0, 0.0, 90.0, 0.0), st(0.0, 0.0, 0.0, 200.0));
        assert_eq!(
            label_window(&direct, 0.1, CauseSet::default()).cause,
            Cause::Disk
        );
    }

    #[test]
    fn workers_waiting_on_io_a_third_of_the_time_are_disk_bound() {
        let h = host(st(5.0, 0.0, 0.0, 95.0), st(120.0, 0.0, 70.0, 10.0));
        assert_eq!(
            label_window(&h, 0.3, CauseSet::default()).cause,
            Cause::Disk
        );
    }

    #[test]
    fn runnable_but_not_running_is_contention() {
        let h = host(st(30.0, 50.0, 0.0, 20.0), st(60.0, 120.0, 0.0, 20.0));
        assert_eq!(
            label_window(&h, 0.3, CauseSet::default()).cause,
            Cause::CpuContention
        );
    }

    #[test]
    fn workers_queued_half_as_long_as_they_run_are_starved() {
        let starved = host(st(5.0, 0.0, 0.0, 95.0), st(110.0, 60.0, 0.0, 30.0));
        assert_eq!(
            label_window(&starved, 0.3, CauseSet::default()).cause,
            Cause::CpuContention
        );
        let busy = host(st(5.0, 0.0, 0.0, 95.0), st(150.0, 40.0, 0.0, 10.0));
        assert_eq!(
            label_window(&busy, 0.3, CauseSet::default()).cause,
            Cause::DataloaderCpu
        );
    }

    #[test]
    fn a_sync_that_yields_while_the_gpu_works_is_not_contention() {
        // Half busy: the feeder spun and yielded (queued) for that half, then waited for a
        // batch while the workers computed.
        let h = host(st(2.0, 50.0, 0.0, 48.0), st(190.0, 6.0, 0.0, 4.0));
        assert_eq!(
            label_window(&h, 0.5, CauseSet::default()).cause,
            Cause::DataloaderCpu
        );
    }

    #[test]
    fn sync_spin_during_busy_time_is_not_host_compute() {
        // On-CPU only as long as the GPU was busy: the feeder spun in a sync.
        let spin = host(st(30.0, 0.0, 0.0, 70.0), st(0.0, 0.0, 0.0, 200.0));
        let l = label_window(&spin, 0.3, CauseSet::default());
        assert_eq!(l.cause, Cause::Unknown);
        assert!(l.reason.unwrap().contains("workers were idle"));
        let own_work = host(st(95.0, 5.0, 0.0, 0.0), st(0.0, 0.0, 0.0, 200.0));
        assert_eq!(
            label_window(&own_work, 0.25, CauseSet::default()).cause,
            Cause::HostCompute
        );
    }

    fn probed(feeder: States, cuda: crate::cuda::WaitTotals, link_limited: bool) -> HostWindow {
        HostWindow {
            feeder,
            cuda: Some(cuda),
            link_limited,
            ..HostWindow::default()
        }
    }

    /// Copy calls, syncs on copies (whose bytes need as long as the wait on the default
    /// link), syncs on collectives and on kernels, in ns.
    fn waits(
        call_copy: f64,
        sync_copy: f64,
        collective: f64,
        kernel: f64,
    ) -> crate::cuda::WaitTotals {
        crate::cuda::WaitTotals {
            call_copy_ns: call_copy,
            sync_copy_ns: sync_copy,
            sync_pinned_bytes: sync_copy * DEFAULT_LINK_GBPS,
            sync_staged_ns: 0.0,
            collective_ns: collective,
            kernel_ns: kernel,
            copy_bytes: 0.0,
            call_copy_bytes: 0.0,
        }
    }

    #[test]
    fn a_sync_spinning_on_a_collective_is_nccl_wait_not_host_compute() {
        // On-CPU all along: without probes this reads as host work.
        let feeder = st(90.0, 10.0, 0.0, 0.0);
        assert_eq!(
            label_window(&host(feeder, States::default()), 0.1, CauseSet::default()).cause,
            Cause::HostCompute
        );
        let l = label_window(
            &probed(feeder, waits(0.0, 0.0, 85.0, 10.0), false),
            0.1,
            CauseSet::default(),
        );
        assert_eq!(l.cause, Cause::NcclWait, "{:?}", l.scores);
    }

    #[test]
    fn copy_waits_are_pinned_memory_copy_or_pcie_by_the_link() {
        let feeder = st(60.0, 0.0, 0.0, 40.0);
        let copy = probed(feeder, waits(50.0, 0.0, 0.0, 0.0), false);
        assert_eq!(
            label_window(&copy, 0.0, CauseSet::default()).cause,
            Cause::PinnedMemoryCopy
        );
        let slow_link = probed(feeder, waits(0.0, 70.0, 0.0, 0.0), true);
        assert_eq!(
            label_window(&slow_link, 0.2, CauseSet::default()).cause,
            Cause::Pcie
        );
    }

    #[test]
    fn an_unchecked_cause_is_never_a_windows() {
        let feeder = st(60.0, 0.0, 0.0, 40.0);
        let copy = probed(feeder, waits(50.0, 0.0, 0.0, 0.0), false);
        let unchecked = [Cause::PinnedMemoryCopy].into_iter().collect();
        let l = label_window(&copy, 0.0, unchecked);
        assert_ne!(l.cause, Cause::PinnedMemoryCopy);
        assert_eq!(l.scores.get(Cause::PinnedMemoryCopy), 0.0);
    }

    #[test]
    fn busy_time_inside_a_copy_sync_is_not_counted_as_copy() {
        // The sync waited 90: 70 of it for kernels queued behind a short copy.
        let feeder = st(95.0, 5.0, 0.0, 0.0);
        let l = label_window(
            &probed(feeder, waits(0.0, 90.0, 0.0, 0.0), false),
            0.7,
            CauseSet::default(),
        );
        assert!(
            (l.scores.get(Cause::PinnedMemoryCopy) - 0.2).abs() < 1e-9,
            "{:?}",
            l.scores
        );
    }

    #[test]
    fn a_sync_on_a_copy_counts_only_as_long_as_the_link_needs() {
        // 90 ns of sync idle beyond busy, but its bytes move in 10 ns on the link: the rest
        // of the window is the workers' doing.
        let feeder = st(20.0, 0.0, 0.0, 80.0);
        let mut w = waits(0.0, 90.0, 0.0, 0.0);
        w.sync_pinned_bytes = 10.0 * DEFAULT_LINK_GBPS;
        let h = HostWindow {
            feeder,
            workers: st(180.0, 10.0, 0.0, 10.0),
            cuda: Some(w),
            ..HostWindow::default()
        };
        let l = label_window(&h, 0.0, CauseSet::default());
        assert!(
            (l.scores.get(Cause::PinnedMemoryCopy) - 0.1).abs() < 1e-9,
            "{:?}",
            l.scores
        );
        assert_eq!(l.cause, Cause::DataloaderCpu);
    }

    #[test]
    fn own_work_at_a_launch_bound_rate_is_launch_overhead() {
        let mut h = probed(st(95.0, 5.0, 0.0, 0.0), waits(0.0, 0.0, 0.0, 3.0), false);
        assert_eq!(
            label_window(&h, 0.25, CauseSet::default()).cause,
            Cause::HostCompute
        );
        h.launch_bound = true;
        assert_eq!(
            label_window(&h, 0.25, CauseSet::default()).cause,
            Cause::LaunchOverhead
        );
    }

    #[test]
    fn missing_feeder_is_unknown_with_reason() {
        let h = host(States::default(), st(100.0, 0.0, 0.0, 0.0));
        let l = label_window(&h, 0.0, CauseSet::default());
        assert_eq!(l.cause, Cause::Unknown);
        assert!(l.reason.is_some());
    }
}
