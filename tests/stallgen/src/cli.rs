//! The command line: a scenario preset plus knobs that override it.
use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Parser;

use crate::{
    ddp::{DEFAULT_BUCKETS, MAX_BUCKETS},
    scenario::{DEFAULT_PHASES, Overrides, Scenario, Schedule},
};

/// Most ranks in one stallgen process: one simulated GPU each.
pub const MAX_RANKS: usize = 8;
/// Most ranks in a job spread over several (the simulated NCCL's limit).
pub const MAX_WORLD: usize = 64;
/// How many times longer the throttled GPU of `gpu-straggler` runs each kernel by default.
pub const DEFAULT_THROTTLE: f64 = 3.0;
/// The simulated GPU's throttle setting: `<gpu>:<factor>` items, comma-separated, read by the
/// process that creates the state file.
pub use simgpu_state::THROTTLE_ENV;

/// A synthetic PyTorch-style training job with injectable bottlenecks, on a real or
/// simulated GPU (libcuda.so.1, and libnccl.so.2 with ranks, are found through
/// LD_LIBRARY_PATH).
///
/// stdout carries `ready pid=<pid> workers=<pids>` once the first batch has flowed (with
/// ranks, preceded by one `rank <r> pid=<pid> workers=<pids>` line per rank), `behind
/// step=<n> waited_ms=<ms>` the first time the feeder waits 1 ms or more for a batch (without
/// ranks), and `steps=<n> secs=<s> steps_per_sec=<r>` at exit (`launch-bound` adds `launches=<n>
/// launches_per_sec=<r>`).
#[derive(Debug, Parser)]
#[command(name = "stallgen")]
pub struct Cli {
    /// The bottleneck to inject.
    #[arg(long, value_enum, default_value = "healthy")]
    pub scenario: Scenario,
    /// Seconds to train after `ready` (split evenly between phases).
    #[arg(long, default_value_t = 10.0)]
    pub secs: f64,
    /// The phases of `--scenario phases`, comma-separated
    /// [default: healthy,dataloader-cpu,host-compute,disk].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub phases: Vec<Scenario>,
    /// DataLoader worker processes [default: half the CPUs, at least 1].
    #[arg(long)]
    pub workers: Option<usize>,
    /// CPU time per batch in each worker's transform.
    #[arg(long)]
    pub transform_ms: Option<f64>,
    /// Duration of each kernel.
    #[arg(long)]
    pub kernel_ms: Option<f64>,
    /// Kernels per step.
    #[arg(long)]
    pub kernels: Option<u32>,
    /// Batch size in MiB (the host-to-device copy per step) [default: 2; pageable-copy 64,
    /// pcie-degraded 32, launch-bound 1].
    #[arg(long)]
    pub batch_mb: Option<f64>,
    /// CPU time the main thread spends between steps (logging, metrics).
    #[arg(long)]
    pub host_ms: Option<f64>,
    /// Spinning threads in the separate `cpu_hog` process.
    #[arg(long)]
    pub hog_threads: Option<u32>,
    /// Wall time per batch each worker spends reading cold sample files (0: none).
    #[arg(long, visible_alias = "disk")]
    pub disk_ms: Option<f64>,
    /// Make the DataLoader this many percent slower than the feeder's own step, as measured
    /// while the job runs (its copy, launches, sync and host work): each batch's time goes
    /// to the phase's cause (cold reads in a disk phase, else the transform) in place of
    /// --disk-ms or --transform-ms, so the GPU idles about PCT/(100+PCT) of the time on a
    /// host of any speed.
    #[arg(long, value_name = "PCT")]
    pub loader_lag: Option<f64>,
    /// How much faster this host's CPU is than the presets assume: every CPU time per batch
    /// and per step (transform, host work) is divided by it. Tests set it through the
    /// environment to check that their expectations follow the job, not the machine.
    #[arg(long, env = "STALLGEN_CPU_SPEED", default_value_t = 1.0)]
    pub cpu_speed: f64,
    /// How much faster the disk is than the presets assume: each batch's cold reads take
    /// 1/speed of their time.
    #[arg(long, env = "STALLGEN_DISK_SPEED", default_value_t = 1.0)]
    pub disk_speed: f64,
    /// Copy batches into page-locked memory on a pin-memory thread first (always on in
    /// pcie-degraded).
    #[arg(long)]
    pub pin_memory: bool,
    /// Data-parallel rank processes, children of this one, each on its own GPU (the r-th on
    /// device r), all-reducing their gradients with NCCL every step as DDP does [default: 2
    /// in nccl-straggler and gpu-straggler, else a single process without NCCL].
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Ranks in the whole job when its ranks are spread over several stallgen processes (one
    /// per host, as torchrun runs one agent per node): this one runs `--ranks` of them, from
    /// `--first-rank` on, on its own GPUs 0.. [default: --ranks].
    #[arg(long)]
    pub world: Option<usize>,
    /// The job-wide rank of this process's first rank, with `--world`.
    #[arg(long, default_value_t = 0)]
    pub first_rank: usize,
    /// The file the stallgen processes of one job share (the NCCL id, when to stop): needed
    /// with `--world`, new for each job.
    #[arg(long)]
    pub rendezvous: Option<PathBuf>,
    /// The rank that takes the scenario's slow behaviour while the others stay healthy (and
    /// wait for it in the all-reduce) [default: the last in nccl-straggler and
    /// gpu-straggler, else none: every rank runs the scenario].
    #[arg(long)]
    pub slow_rank: Option<usize>,
    /// Gradient buckets per step, with ranks: each is all-reduced on the NCCL stream as soon
    /// as its backward kernels are queued, as DDP's buckets are [default: 4].
    #[arg(long)]
    pub buckets: Option<usize>,
    /// How many times longer the slow rank's GPU takes over each kernel in gpu-straggler
    /// (simulated GPU only) [default: 3].
    #[arg(long)]
    pub throttle: Option<f64>,
    /// Write the ground truth (one JSON line per phase, CLOCK_MONOTONIC ns) here.
    #[arg(long)]
    pub truth: Option<PathBuf>,
    /// Write one JSON line per training step here, as it ends: its end (CLOCK_MONOTONIC ns)
    /// and where the feeder's time in it went, ns (without ranks only).
    #[arg(long)]
    pub steps_log: Option<PathBuf>,
    /// Where the disk scenario keeps its sample files [default: <tmp>/stallgen-data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Reads per second the disk scenario's disk serves the job (block-IO throttling in a
    /// cgroup of the job's own; needs root), as a busy disk or a network filesystem would:
    /// a VM's disk cached by its host is as fast as memory. 0: the disk's own speed.
    #[arg(long, default_value_t = 200)]
    pub disk_iops: u32,
    /// Print which libcuda.so.1 was loaded and the device's name, run one kernel, and exit.
    #[arg(long)]
    pub check_gpu: bool,
}

/// What holds for the whole run (every phase and rank), from the presets and the flags.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    pub batch_bytes: usize,
    pub pin_memory: bool,
    /// The link to train the simulated GPUs to when the environment does not say.
    pub pcie_link: Option<&'static str>,
    /// Rank processes; `None` runs the job in this process, without NCCL.
    pub ranks: Option<usize>,
    /// The job's ranks, over every stallgen process of it.
    pub world: usize,
    /// The job-wide rank of this process's first rank.
    pub first_rank: usize,
    /// The job-wide rank that is slow.
    pub slow_rank: Option<usize>,
    /// Gradient buckets per step (with ranks).
    pub buckets: usize,
    /// The GPU to throttle on the simulated machine, when the environment does not say.
    pub throttle: Option<Throttle>,
    /// Whether the totals line reports kernel launches.
    pub launches: bool,
}

/// One GPU of the simulated machine that runs each kernel `factor` times longer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throttle {
    pub gpu: usize,
    pub factor: f64,
}

impl Throttle {
    /// The value of [`THROTTLE_ENV`] that asks for it.
    pub fn setting(&self) -> String {
        format!("{}:{}", self.gpu, self.factor)
    }

    /// How many times longer GPU `gpu` runs kernels under `setting` (a value of
    /// [`THROTTLE_ENV`]): 1 where it says nothing of that GPU, or is one the simulated GPU
    /// ignores (it ignores the whole setting if any item is bad; the last item for a GPU wins).
    pub fn factor_of(setting: Option<&str>, gpu: usize) -> f64 {
        let items = setting.map_or(Ok(Vec::new()), simgpu_state::parse_throttle);
        items
            .unwrap_or_default()
            .into_iter()
            .filter(|(g, _)| *g as usize == gpu)
            .map(|(_, f)| f)
            .next_back()
            .unwrap_or(1.0)
    }
}

impl Cli {
    /// The worker count per job process: as given, or half the CPUs (at least one), as a
    /// DataLoader is often sized, shared among the ranks.
    pub fn workers(&self, cpus: usize) -> usize {
        let ranks = self.rank_count().unwrap_or(1).max(1);
        self.workers.unwrap_or((cpus / 2 / ranks).max(1))
    }

    /// `--ranks`, else the scenario's default.
    pub fn rank_count(&self) -> Option<usize> {
        self.ranks.or(self.scenario.default_ranks())
    }

    /// Every scenario the run goes through.
    fn scenarios(&self) -> Vec<Scenario> {
        match self.scenario {
            Scenario::Phases if self.phases.is_empty() => DEFAULT_PHASES.to_vec(),
            Scenario::Phases => self.phases.clone(),
            s => vec![s],
        }
    }

    /// The run-wide settings, checked.
    pub fn plan(&self) -> Result<Plan> {
        let scenarios = self.scenarios();
        let batch_mb = self
            .batch_mb
            .unwrap_or_else(|| scenarios.iter().map(|s| s.batch_mb()).fold(0.0, f64::max));
        if !(batch_mb > 0.0 && batch_mb <= 4096.0) {
            bail!("--batch-mb must be in (0, 4096]");
        }
        let ranks = self.rank_count();
        if let Some(n) = ranks
            && !(1..=MAX_RANKS).contains(&n)
        {
            bail!("--ranks must be in 1..={MAX_RANKS} (one simulated GPU per rank)");
        }
        let world = match (self.world, ranks) {
            (Some(_), None) => bail!("--world needs --ranks"),
            (Some(w), Some(n)) if self.first_rank + n > w => bail!(
                "--first-rank {} and --ranks {n} go past the {w} ranks of --world",
                self.first_rank
            ),
            (Some(w), Some(_)) if w > MAX_WORLD => bail!("--world must be at most {MAX_WORLD}"),
            (Some(w), Some(_)) => w,
            (None, n) => n.unwrap_or(0),
        };
        if self.first_rank > 0 && self.world.is_none() {
            bail!("--first-rank needs --world");
        }
        match (&self.rendezvous, self.world) {
            (None, Some(w)) if ranks != Some(w) => {
                bail!(
                    "--world spreads the job over several processes: give them a --rendezvous file"
                )
            }
            (Some(_), None) => bail!("--rendezvous needs --world"),
            _ => {}
        }
        let slow_rank = match (self.slow_rank, ranks) {
            (Some(_), None) => bail!("--slow-rank needs --ranks"),
            (Some(r), Some(_)) if r >= world => {
                bail!("--slow-rank {r} is not one of the {world} ranks")
            }
            (Some(r), Some(_)) => Some(r),
            (None, Some(_)) if self.scenario.has_straggler() => Some(world - 1),
            (None, _) => None,
        };
        // The slow rank's GPU, if it runs here: this process's ranks use its GPUs 0...
        let slow_gpu = slow_rank
            .and_then(|r| r.checked_sub(self.first_rank))
            .filter(|&g| ranks.is_some_and(|n| g < n));
        let buckets = match (self.buckets, ranks) {
            (Some(_), None) => bail!("--buckets needs --ranks"),
            (Some(b), Some(_)) if !(1..=MAX_BUCKETS).contains(&b) => {
                bail!("--buckets must be in 1..={MAX_BUCKETS}")
            }
            (b, _) => b.unwrap_or(DEFAULT_BUCKETS),
        };
        let throttled = self.scenario == Scenario::GpuStraggler;
        let throttle = match (self.throttle, throttled) {
            (Some(_), false) => bail!("--throttle needs --scenario gpu-straggler"),
            (Some(f), true) if !(f >= 1.0 && f.is_finite()) => {
                bail!("--throttle must be a finite factor of at least 1")
            }
            (f, true) => slow_gpu.map(|gpu| Throttle {
                gpu,
                factor: f.unwrap_or(DEFAULT_THROTTLE),
            }),
            (None, false) => None,
        };
        Ok(Plan {
            batch_bytes: (batch_mb * 1024.0 * 1024.0) as usize,
            pin_memory: self.pin_memory || scenarios.iter().any(|s| s.pin_memory()),
            pcie_link: scenarios.iter().find_map(|s| s.pcie_link()),
            ranks,
            world,
            first_rank: self.first_rank,
            slow_rank,
            buckets,
            throttle,
            launches: scenarios.contains(&Scenario::LaunchBound),
        })
    }

    /// The schedule of rank `rank`: healthy while another rank is the slow one, else the
    /// scenario's.
    pub fn rank_schedule(&self, cpus: usize, plan: &Plan, rank: usize) -> Result<Schedule> {
        let mut s = self.schedule(cpus)?;
        if plan.slow_rank.is_some_and(|slow| slow != rank) {
            let healthy = Scenario::Healthy.knobs(cpus, self.workers(cpus));
            for p in &mut s.phases {
                p.knobs = healthy.with(&self.overrides());
            }
        }
        Ok(s)
    }

    fn overrides(&self) -> Overrides {
        Overrides {
            transform_ms: self.transform_ms,
            kernel_ms: self.kernel_ms,
            kernels: self.kernels,
            host_ms: self.host_ms,
            hog_threads: self.hog_threads,
            disk_ms: self.disk_ms,
            cpu_speed: Some(self.cpu_speed),
            disk_speed: Some(self.disk_speed),
        }
    }

    /// The phases with their knobs; `cpus` sizes the CPU hog.
    pub fn schedule(&self, cpus: usize) -> Result<Schedule> {
        if !(self.secs > 0.0 && self.secs.is_finite()) {
            bail!("--secs must be a positive number of seconds");
        }
        if self
            .loader_lag
            .is_some_and(|p| !(p >= 0.0 && p.is_finite()))
        {
            bail!("--loader-lag must be a percentage, 0 or more");
        }
        if self.workers == Some(0) {
            bail!("--workers must be at least 1 (the feeder takes batches from workers)");
        }
        if !self.phases.is_empty() && self.scenario != Scenario::Phases {
            bail!("--phases needs --scenario phases");
        }
        if self.phases.contains(&Scenario::Phases) {
            bail!("--phases cannot contain `phases` itself");
        }
        if self.phases.contains(&Scenario::GpuStraggler) {
            bail!("--phases cannot contain gpu-straggler (the GPU is throttled for the whole run)");
        }
        let o = self.overrides();
        let times = [o.transform_ms, o.kernel_ms, o.host_ms, o.disk_ms];
        if times
            .into_iter()
            .flatten()
            .any(|t| !(t >= 0.0 && t.is_finite()))
        {
            bail!("times in milliseconds must be finite and not negative");
        }
        if [self.cpu_speed, self.disk_speed]
            .iter()
            .any(|s| !(*s > 0.0 && s.is_finite()))
        {
            bail!("--cpu-speed and --disk-speed must be positive numbers");
        }
        Ok(Schedule::new(
            self.scenario,
            &self.phases,
            self.secs,
            cpus,
            self.workers(cpus),
            &o,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `args` parsed as on a host of the presets' speed, whatever STALLGEN_*_SPEED says (the
    /// suite may run with them set: `cargo xtask test --sim-speed`).
    fn parse(args: &str) -> Cli {
        let speeds = ["--cpu-speed", "1", "--disk-speed", "1"];
        let speeds = speeds.iter().filter(|_| !args.contains("-speed"));
        Cli::try_parse_from(
            std::iter::once("stallgen")
                .chain(args.split_whitespace())
                .chain(speeds.copied()),
        )
        .unwrap()
    }

    #[test]
    fn defaults_are_a_healthy_run() {
        let c = parse("");
        assert_eq!(c.scenario, Scenario::Healthy);
        let plan = c.plan().unwrap();
        assert_eq!((c.workers(4), plan.batch_bytes), (2, 2 << 20));
        assert_eq!(
            (plan.ranks, plan.slow_rank, plan.pin_memory),
            (None, None, false)
        );
        let s = c.schedule(2).unwrap();
        assert_eq!(s.phases.len(), 1);
        assert_eq!(s.total_ns, 10_000_000_000);
    }

    #[test]
    fn knobs_override_the_preset() {
        let c = parse("--scenario disk --secs 5 --disk 7 --kernels 3 --workers 4");
        let k = c.schedule(2).unwrap().phases[0].knobs;
        assert_eq!((k.disk_ms, k.kernels, k.kernel_ms), (7.0, 3, 25.0));
        assert_eq!(c.workers(2), 4);
    }

    #[test]
    fn phases_take_a_list() {
        let c = parse("--scenario phases --phases healthy,cpu-contention --secs 4");
        let s = c.schedule(3).unwrap();
        let names: Vec<_> = s.phases.iter().map(|p| p.scenario.name()).collect();
        assert_eq!(names, ["healthy", "cpu-contention"]);
        assert_eq!(s.max_hog_threads(), 9);
    }

    #[test]
    fn new_scenarios_set_up_the_run() {
        let p = parse("--scenario pageable-copy").plan().unwrap();
        assert_eq!((p.batch_bytes, p.pin_memory), (64 << 20, false));
        let p = parse("--scenario pcie-degraded").plan().unwrap();
        assert_eq!((p.pin_memory, p.pcie_link), (true, Some("1,4")));
        let p = parse("--scenario launch-bound --batch-mb 2")
            .plan()
            .unwrap();
        assert_eq!((p.batch_bytes, p.launches), (2 << 20, true));
        let c = parse("--scenario nccl-straggler");
        let p = c.plan().unwrap();
        assert_eq!((p.ranks, p.slow_rank), (Some(2), Some(1)));
        assert_eq!(c.workers(8), 2, "half the CPUs, shared by the ranks");
        let slow = c.rank_schedule(2, &p, 1).unwrap();
        assert!(slow.phases[0].knobs.disk_ms > 0.0);
        let healthy = c.rank_schedule(2, &p, 0).unwrap();
        assert_eq!(healthy.phases[0].knobs.disk_ms, 0.0);
        assert_eq!(
            healthy.phases[0].scenario,
            Scenario::NcclStraggler,
            "the label stays"
        );
        let p = parse("--scenario nccl-straggler --ranks 3 --slow-rank 0")
            .plan()
            .unwrap();
        assert_eq!((p.ranks, p.slow_rank), (Some(3), Some(0)));
        let p = parse("--scenario disk --ranks 2").plan().unwrap();
        assert_eq!(
            (p.ranks, p.slow_rank),
            (Some(2), None),
            "every rank reads the disk"
        );
    }

    #[test]
    fn ranked_runs_take_buckets_and_a_throttled_straggler() {
        let p = parse("--scenario healthy --ranks 4").plan().unwrap();
        assert_eq!(
            (p.ranks, p.slow_rank, p.buckets, p.throttle),
            (Some(4), None, DEFAULT_BUCKETS, None),
            "every rank healthy"
        );
        let p = parse("--scenario nccl-straggler --ranks 8 --buckets 2")
            .plan()
            .unwrap();
        assert_eq!((p.ranks, p.slow_rank, p.buckets), (Some(8), Some(7), 2));
        assert_eq!(p.throttle, None, "the disk straggler's GPU is fine");
        let c = parse("--scenario gpu-straggler");
        let p = c.plan().unwrap();
        assert_eq!((p.ranks, p.slow_rank), (Some(2), Some(1)));
        let t = p.throttle.unwrap();
        assert_eq!((t.gpu, t.factor), (1, DEFAULT_THROTTLE));
        assert_eq!(t.setting(), "1:3");
        let slow = c.rank_schedule(2, &p, 1).unwrap().phases[0];
        assert_eq!(
            slow.knobs,
            Scenario::Healthy.knobs(2, 1),
            "its host is healthy"
        );
        assert_eq!(slow.scenario.cause(), "gpu_throttled");
        let p = parse("--scenario gpu-straggler --ranks 4 --slow-rank 0 --throttle 5")
            .plan()
            .unwrap();
        assert_eq!(
            p.throttle,
            Some(Throttle {
                gpu: 0,
                factor: 5.0
            })
        );
    }

    #[test]
    fn the_throttle_setting_is_read_per_gpu() {
        assert_eq!(Throttle::factor_of(Some("1:3"), 1), 3.0);
        assert_eq!(Throttle::factor_of(Some("1:3"), 0), 1.0);
        assert_eq!(Throttle::factor_of(Some("0:2, 3:4.5"), 3), 4.5);
        assert_eq!(Throttle::factor_of(None, 0), 1.0);
        assert_eq!(
            Throttle::factor_of(Some("1:2,1:4"), 1),
            4.0,
            "the last wins"
        );
        for junk in ["", "x", "1:", "1:abc", "1:0.5", "1:inf", "1:3,x"] {
            assert_eq!(Throttle::factor_of(Some(junk), 1), 1.0, "{junk:?}");
        }
    }

    #[test]
    fn bad_combinations_are_refused() {
        for args in [
            "--workers 0",
            "--secs 0",
            "--phases disk",
            "--scenario phases --phases phases",
            "--kernel-ms nan",
            "--cpu-speed 0",
            "--disk-speed=-1",
            "--scenario phases --phases healthy,gpu-straggler",
        ] {
            assert!(parse(args).schedule(2).is_err(), "{args}");
        }
        for args in [
            "--batch-mb=-1",
            "--ranks 0",
            "--ranks 9",
            "--slow-rank 0",
            "--ranks 2 --slow-rank 2",
            "--buckets 2",
            "--ranks 2 --buckets 0",
            "--ranks 2 --buckets 65",
            "--scenario nccl-straggler --throttle 2",
            "--scenario gpu-straggler --throttle 0.5",
            "--scenario gpu-straggler --throttle nan",
        ] {
            assert!(parse(args).plan().is_err(), "{args}");
        }
        assert!(Cli::try_parse_from(["stallgen", "--scenario", "nope"]).is_err());
    }
}
