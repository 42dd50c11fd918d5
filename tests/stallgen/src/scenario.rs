//! Scenario presets, the knobs they set, and the schedule of phases over a run.
use clap::ValueEnum;

/// A bottleneck to inject. Each is a preset of [`Knobs`]; `phases` chains several.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// GPU-bound: the data loader keeps well ahead of long kernels.
    Healthy,
    /// The workers' CPU transform is slower than the GPU step.
    DataloaderCpu,
    /// The workers read each sample from a cold page cache.
    Disk,
    /// A CPU hog in another process takes the job's CPUs.
    CpuContention,
    /// The main thread does its own CPU work (logging, metrics) between steps.
    HostCompute,
    /// Each step copies a large batch from pageable (not page-locked) memory: the driver
    /// stages it through a bounce buffer with a CPU memcpy before the DMA.
    PageableCopy,
    /// Batches come from page-locked memory, but the PCIe link trained down (gen1 x4 unless
    /// STALLSCOPE_SIMGPU_PCIE says otherwise): the copies crawl.
    PcieDegraded,
    /// Data-parallel ranks (`--ranks`, default 2) all-reduce their gradients every step; the
    /// slow rank (`--slow-rank`, default the last) is disk-bound as in `disk`, and the others
    /// wait for it in the all-reduce.
    NcclStraggler,
    /// As `nccl-straggler`, but the slow rank's host is healthy: its GPU is throttled
    /// (`--throttle`, default 3× longer kernels). Only the simulated GPU can be throttled:
    /// stallgen sets STALLSCOPE_SIMGPU_THROTTLE=<slow rank's GPU>:<factor> for itself when
    /// unset, for whichever process creates the state file.
    GpuStraggler,
    /// Thousands of tiny kernels per step: the GPU finishes each before the feeder has
    /// launched the next.
    LaunchBound,
    /// The cause changes mid-run (see `--phases`).
    Phases,
}

impl Scenario {
    /// The name on the command line and in the ground-truth file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::DataloaderCpu => "dataloader-cpu",
            Self::Disk => "disk",
            Self::CpuContention => "cpu-contention",
            Self::HostCompute => "host-compute",
            Self::PageableCopy => "pageable-copy",
            Self::PcieDegraded => "pcie-degraded",
            Self::NcclStraggler => "nccl-straggler",
            Self::GpuStraggler => "gpu-straggler",
            Self::LaunchBound => "launch-bound",
            Self::Phases => "phases",
        }
    }

    /// The cause label stallscope is expected to report for this scenario (for the
    /// stragglers, on the slow rank; the others wait in the all-reduce: [`NCCL_WAIT`]).
    pub fn cause(self) -> &'static str {
        match self {
            Self::Healthy => "none",
            Self::DataloaderCpu => "dataloader_cpu",
            Self::Disk | Self::NcclStraggler => "disk",
            Self::CpuContention => "cpu_contention",
            Self::HostCompute => "host_compute",
            Self::PageableCopy => "pinned_memory_copy",
            Self::PcieDegraded => "pcie",
            Self::GpuStraggler => "gpu_throttled",
            Self::LaunchBound => "launch_overhead",
            Self::Phases => "mixed",
        }
    }

    /// Batch size in MiB when `--batch-mb` is not given: the copy scenarios need big batches
    /// for the copy to dominate; the others a small one, whose pageable copy (about 1 ms of
    /// staging at the simulated host's 2 GB/s, 2 ms at half that) stays out of the way.
    pub fn batch_mb(self) -> f64 {
        match self {
            Self::PageableCopy => 64.0,
            Self::PcieDegraded => 32.0,
            Self::LaunchBound => 1.0,
            _ => 2.0,
        }
    }

    /// Whether batches go through page-locked buffers (as with `--pin-memory`).
    pub fn pin_memory(self) -> bool {
        self == Self::PcieDegraded
    }

    /// The PCIe link (`gen,width`) the scenario trains the simulated GPU to, when the
    /// environment does not say.
    pub fn pcie_link(self) -> Option<&'static str> {
        (self == Self::PcieDegraded).then_some("1,4")
    }

    /// Ranks when `--ranks` is not given; `None` is a single process without NCCL.
    pub fn default_ranks(self) -> Option<usize> {
        self.has_straggler().then_some(2)
    }

    /// Whether one rank is slow by default (the last) and the others wait for it.
    pub fn has_straggler(self) -> bool {
        matches!(self, Self::NcclStraggler | Self::GpuStraggler)
    }

    /// The preset. `cpus` is the number of CPUs the job may use (it sizes the hog), `workers`
    /// the number of DataLoader workers (per-batch costs scale with it, so the batch rate, and
    /// thus the GPU's idle share, is the same for any worker count).
    ///
    /// Every scenario trains the same model, 4 kernels × 25 ms per step, so steps/s compares
    /// directly and `healthy` is the fastest. The causes are sized so that each dominates the
    /// GPU's idle time on 2 CPUs, where the feeder's sync spins (yielding now and then, as the
    /// driver's default schedule does) beside two workers, and on a 16-core host, where each
    /// worker has a CPU of its own; and so that each still idles the GPU at least ~40% on a
    /// host twice as fast (`--cpu-speed 2 --disk-speed 2`, and twice the simulated memcpy
    /// rate) and keeps healthy under 5% on one twice as slow.
    pub fn knobs(self, cpus: usize, workers: usize) -> Knobs {
        let w = workers.max(1) as f64;
        let base = Knobs {
            transform_ms: 1.0,
            kernel_ms: 25.0,
            kernels: 4,
            host_ms: 0.0,
            hog_threads: 0,
            disk_ms: 0.0,
        };
        match self {
            // ~2 ms of worker CPU per batch (transform and collate) against 100 ms of GPU. The
            // pageable copy of the 2 MiB batch (a CPU memcpy, then DMA) is the only idle time.
            Self::Healthy | Self::Phases => base,
            // 400 ms of CPU per batch per worker: a batch every ~400 ms for a 100 ms step
            // (every 200 ms on a host twice as fast). With half the CPUs as workers, the
            // workers and the feeder's spinning sync still fit the host, so the workers are
            // CPU-bound without queueing for CPUs.
            Self::DataloaderCpu => Knobs {
                transform_ms: 400.0 * w,
                ..base
            },
            // 400 ms of cold reads per batch per worker: a batch every ~400 ms.
            Self::Disk => Knobs {
                disk_ms: 400.0 * w,
                ..base
            },
            // Without the hog the workers nearly keep up (a batch every ~120 ms for a 100 ms
            // step); three hog threads per CPU leave each job thread a quarter of a CPU or less,
            // so a batch takes ~480 ms or more and the feeder waits for the CPU too.
            Self::CpuContention => Knobs {
                transform_ms: 120.0 * w,
                hog_threads: 3 * cpus as u32,
                ..base
            },
            // 200 ms of main-thread CPU after each 100 ms step.
            Self::HostCompute => Knobs {
                host_ms: 200.0,
                ..base
            },
            // 10 ms of kernels per step against a 64 MiB pageable batch: the driver's staging
            // memcpy (34 ms at the simulated host's 2 GB/s) and the DMA behind it.
            Self::PageableCopy => Knobs {
                kernel_ms: 2.5,
                ..base
            },
            // 20 ms of kernels per step against 32 MiB over gen1 x4 (0.8 GB/s): ~42 ms.
            Self::PcieDegraded => Knobs {
                kernel_ms: 5.0,
                ..base
            },
            // The slow rank's behaviour: `disk`'s.
            Self::NcclStraggler => Self::Disk.knobs(cpus, workers),
            // The slow rank's host is healthy; its GPU runs the same kernels `--throttle`
            // times longer (300 ms a step by default), and the others wait for it.
            Self::GpuStraggler => base,
            // 2 µs kernels, launched back to back: a launch costs the feeder more than that, so
            // the GPU idles between kernels. Few batches, so the loader stays out of the way.
            Self::LaunchBound => Knobs {
                transform_ms: 0.2,
                kernel_ms: 0.002,
                kernels: 4000,
                ..base
            },
        }
    }
}

/// The default order of `--scenario phases`.
pub const DEFAULT_PHASES: [Scenario; 4] = [
    Scenario::Healthy,
    Scenario::DataloaderCpu,
    Scenario::HostCompute,
    Scenario::Disk,
];

/// What one phase does per batch and per step. Times are milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Knobs {
    /// CPU time (not wall time) each worker burns per batch, so contention stretches it.
    pub transform_ms: f64,
    /// Duration of each kernel on the GPU.
    pub kernel_ms: f64,
    /// Kernels launched per step.
    pub kernels: u32,
    /// CPU time the main thread burns after each step (logging, metrics).
    pub host_ms: f64,
    /// Spinning threads in the `cpu_hog` process.
    pub hog_threads: u32,
    /// Wall time each worker spends reading cold samples per batch (0: no reads).
    pub disk_ms: f64,
}

/// What the healthy ranks of a run with a slow rank wait for.
pub const NCCL_WAIT: &str = "nccl_wait";

/// Command-line values that replace a preset's, in every phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Overrides {
    pub transform_ms: Option<f64>,
    pub kernel_ms: Option<f64>,
    pub kernels: Option<u32>,
    pub host_ms: Option<f64>,
    pub hog_threads: Option<u32>,
    pub disk_ms: Option<f64>,
    /// How much faster than the presets' host the CPU is: CPU work per batch and per step
    /// takes 1/speed of its time (a faster CPU does the same work in less). Default 1.
    pub cpu_speed: Option<f64>,
    /// How much faster the disk is: each batch's cold reads take 1/speed of their time.
    pub disk_speed: Option<f64>,
}

impl Knobs {
    /// The preset with the overrides applied, then scaled to the host's speeds. Times given
    /// on the command line are times on the presets' host, so they scale too.
    pub fn with(self, o: &Overrides) -> Self {
        let cpu = o.cpu_speed.unwrap_or(1.0);
        let disk = o.disk_speed.unwrap_or(1.0);
        Self {
            transform_ms: o.transform_ms.unwrap_or(self.transform_ms) / cpu,
            kernel_ms: o.kernel_ms.unwrap_or(self.kernel_ms),
            kernels: o.kernels.unwrap_or(self.kernels),
            host_ms: o.host_ms.unwrap_or(self.host_ms) / cpu,
            hog_threads: o.hog_threads.unwrap_or(self.hog_threads),
            disk_ms: o.disk_ms.unwrap_or(self.disk_ms) / disk,
        }
    }

    /// Duration of one kernel, in nanoseconds: the spin kernel's parameter.
    pub fn kernel_ns(&self) -> u64 {
        (self.kernel_ms * 1e6) as u64
    }
}

/// One phase of a run: its scenario and resolved knobs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Phase {
    pub scenario: Scenario,
    pub knobs: Knobs,
}

/// The phases of a run, each an equal share of `total_ns`, starting at a `t0` that is only
/// known once the job is ready.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub phases: Vec<Phase>,
    pub total_ns: u64,
}

impl Schedule {
    /// Resolves a scenario (and, for `phases`, its sequence) into phases with knobs.
    pub fn new(
        scenario: Scenario,
        sequence: &[Scenario],
        secs: f64,
        cpus: usize,
        workers: usize,
        o: &Overrides,
    ) -> Self {
        let list: Vec<Scenario> = match scenario {
            Scenario::Phases if sequence.is_empty() => DEFAULT_PHASES.to_vec(),
            Scenario::Phases => sequence.to_vec(),
            s => vec![s],
        };
        let phases = list
            .into_iter()
            .map(|s| Phase {
                scenario: s,
                knobs: s.knobs(cpus, workers).with(o),
            })
            .collect();
        Self {
            phases,
            total_ns: (secs * 1e9) as u64,
        }
    }

    /// The phase in force `elapsed_ns` after t0; the last one stays in force past the end.
    pub fn index_at(&self, elapsed_ns: u64) -> usize {
        let n = self.phases.len() as u64;
        if self.total_ns == 0 {
            return 0;
        }
        let i = u128::from(elapsed_ns) * u128::from(n) / u128::from(self.total_ns);
        (i as usize).min(self.phases.len() - 1)
    }

    /// The nominal [start, end) of phase `i` relative to t0, in nanoseconds.
    pub fn bounds_ns(&self, i: usize) -> (u64, u64) {
        let n = self.phases.len() as u128;
        let t = u128::from(self.total_ns);
        let at = |k: usize| (t * k as u128 / n) as u64;
        (at(i), at(i + 1))
    }

    /// Whether any phase reads from disk, so the data set must exist before the workers fork.
    pub fn uses_disk(&self) -> bool {
        self.phases.iter().any(|p| p.knobs.disk_ms > 0.0)
    }

    /// The most hog threads any phase wants.
    pub fn max_hog_threads(&self) -> u32 {
        self.phases
            .iter()
            .map(|p| p.knobs.hog_threads)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_inject_what_they_say() {
        let h = Scenario::Healthy.knobs(2, 2);
        // Healthy: far more GPU time per step than worker CPU per batch.
        assert!(h.kernel_ns() * u64::from(h.kernels) >= 100_000_000 && h.transform_ms <= 2.0);
        let d = Scenario::DataloaderCpu.knobs(2, 2);
        assert!(d.transform_ms / 2.0 > 1.5 * d.kernel_ms * f64::from(d.kernels));
        // Same model everywhere, so steps/s compares.
        for s in [
            Scenario::DataloaderCpu,
            Scenario::Disk,
            Scenario::CpuContention,
        ] {
            assert_eq!(
                s.knobs(2, 2).kernel_ns() * 4,
                h.kernel_ns() * u64::from(h.kernels)
            );
        }
        assert!(Scenario::Disk.knobs(2, 2).disk_ms > 0.0);
        assert_eq!(Scenario::CpuContention.knobs(2, 2).hog_threads, 6);
        assert_eq!(Scenario::CpuContention.knobs(16, 2).hog_threads, 48);
        assert!(Scenario::HostCompute.knobs(2, 2).host_ms > 0.0);
        for s in [
            Scenario::Healthy,
            Scenario::DataloaderCpu,
            Scenario::HostCompute,
        ] {
            assert_eq!(s.knobs(8, 2).hog_threads, 0, "{s:?}");
            assert_eq!(s.knobs(8, 2).disk_ms, 0.0, "{s:?}");
        }
    }

    #[test]
    fn causes_are_the_expected_labels() {
        let labels: Vec<_> = [
            Scenario::Healthy,
            Scenario::DataloaderCpu,
            Scenario::Disk,
            Scenario::CpuContention,
            Scenario::HostCompute,
            Scenario::PageableCopy,
            Scenario::PcieDegraded,
            Scenario::NcclStraggler,
            Scenario::GpuStraggler,
            Scenario::LaunchBound,
        ]
        .map(Scenario::cause)
        .into();
        assert_eq!(
            labels,
            [
                "none",
                "dataloader_cpu",
                "disk",
                "cpu_contention",
                "host_compute",
                "pinned_memory_copy",
                "pcie",
                "disk",
                "gpu_throttled",
                "launch_overhead"
            ]
        );
    }

    #[test]
    fn new_presets_leave_the_old_scenarios_alone() {
        for s in [
            Scenario::Healthy,
            Scenario::DataloaderCpu,
            Scenario::Disk,
            Scenario::CpuContention,
            Scenario::HostCompute,
            Scenario::Phases,
        ] {
            assert_eq!(s.batch_mb(), 2.0, "{s:?}");
            assert!(!s.pin_memory() && s.pcie_link().is_none() && s.default_ranks().is_none());
        }
        assert_eq!(
            Scenario::NcclStraggler.knobs(2, 1),
            Scenario::Disk.knobs(2, 1)
        );
        assert_eq!(
            Scenario::GpuStraggler.knobs(2, 1),
            Scenario::Healthy.knobs(2, 1),
            "its host is healthy"
        );
        let l = Scenario::LaunchBound.knobs(2, 1);
        assert!(l.kernels >= 1000 && l.kernel_ns() < 10_000, "{l:?}");
    }

    #[test]
    fn overrides_apply_to_every_phase() {
        let o = Overrides {
            kernel_ms: Some(3.0),
            ..Overrides::default()
        };
        let s = Schedule::new(Scenario::Phases, &[], 8.0, 2, 2, &o);
        assert_eq!(s.phases.len(), 4);
        assert!(s.phases.iter().all(|p| p.knobs.kernel_ms == 3.0));
        assert_eq!(s.phases[1].knobs.transform_ms, 800.0);
        assert!(s.uses_disk());
        assert_eq!(s.max_hog_threads(), 0);
    }

    #[test]
    fn speeds_scale_the_hosts_work_not_the_gpus() {
        let o = Overrides {
            cpu_speed: Some(2.0),
            disk_speed: Some(0.5),
            host_ms: Some(30.0),
            ..Overrides::default()
        };
        let d = Scenario::DataloaderCpu.knobs(2, 1);
        let fast = d.with(&o);
        assert_eq!(fast.transform_ms, d.transform_ms / 2.0);
        assert_eq!(fast.host_ms, 15.0, "a given time is the presets' host's");
        assert_eq!(fast.kernel_ms, d.kernel_ms);
        let disk = Scenario::Disk.knobs(2, 1);
        assert_eq!(disk.with(&o).disk_ms, disk.disk_ms * 2.0);
        assert_eq!(d.with(&Overrides::default()), d);
    }

    #[test]
    fn single_scenario_is_one_phase() {
        let s = Schedule::new(
            Scenario::CpuContention,
            &[],
            5.0,
            4,
            2,
            &Overrides::default(),
        );
        assert_eq!(s.phases.len(), 1);
        assert_eq!(s.max_hog_threads(), 12);
        assert!(!s.uses_disk());
        assert_eq!(s.index_at(0), 0);
        assert_eq!(s.index_at(u64::MAX), 0);
        assert_eq!(s.bounds_ns(0), (0, 5_000_000_000));
    }

    #[test]
    fn phase_schedule_splits_time_evenly() {
        let seq = [Scenario::Healthy, Scenario::Disk, Scenario::HostCompute];
        let s = Schedule::new(Scenario::Phases, &seq, 3.0, 2, 2, &Overrides::default());
        assert_eq!(s.index_at(0), 0);
        assert_eq!(s.index_at(999_999_999), 0);
        assert_eq!(s.index_at(1_000_000_000), 1);
        assert_eq!(s.index_at(2_500_000_000), 2);
        assert_eq!(
            s.index_at(9_000_000_000),
            2,
            "the last phase outlasts the run"
        );
        assert_eq!(s.bounds_ns(1), (1_000_000_000, 2_000_000_000));
        assert_eq!(s.bounds_ns(2).1, s.total_ns);
        assert_eq!(s.phases[1].scenario, Scenario::Disk);
    }
}
