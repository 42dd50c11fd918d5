//! The command line: a scenario preset plus knobs that override it.
use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Parser;

use crate::scenario::{Overrides, Scenario, Schedule};

/// A synthetic PyTorch-style training job with injectable bottlenecks, on a real or
/// simulated GPU (libcuda.so.1 is found through LD_LIBRARY_PATH).
///
/// stdout carries two lines: `ready pid=<pid> workers=<pids>` once the first batch has
/// flowed, and `steps=<n> secs=<s> steps_per_sec=<r>` at exit.
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
    /// Batch size in MiB (the host-to-device copy per step).
    #[arg(long, default_value_t = 8.0)]
    pub batch_mb: f64,
    /// CPU time the main thread spends between steps (logging, metrics).
    #[arg(long)]
    pub host_ms: Option<f64>,
    /// Spinning threads in the separate `cpu_hog` process.
    #[arg(long)]
    pub hog_threads: Option<u32>,
    /// Wall time per batch each worker spends reading cold sample files (0: none).
    #[arg(long, visible_alias = "disk")]
    pub disk_ms: Option<f64>,
    /// Copy batches into page-locked memory on a pin-memory thread first.
    #[arg(long)]
    pub pin_memory: bool,
    /// Write the ground truth (one JSON line per phase, CLOCK_MONOTONIC ns) here.
    #[arg(long)]
    pub truth: Option<PathBuf>,
    /// Where the disk scenario keeps its sample files [default: <tmp>/stallgen-data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Print which libcuda.so.1 was loaded and the device's name, run one kernel, and exit.
    #[arg(long)]
    pub check_gpu: bool,
}

impl Cli {
    /// The worker count: as given, or half the CPUs (at least one), as a DataLoader is often
    /// sized.
    pub fn workers(&self, cpus: usize) -> usize {
        self.workers.unwrap_or((cpus / 2).max(1))
    }

    /// The phases with their knobs; `cpus` sizes the CPU hog.
    pub fn schedule(&self, cpus: usize) -> Result<Schedule> {
        if !(self.secs > 0.0 && self.secs.is_finite()) {
            bail!("--secs must be a positive number of seconds");
        }
        if self.workers == Some(0) {
            bail!("--workers must be at least 1 (the feeder takes batches from workers)");
        }
        if !(self.batch_mb > 0.0 && self.batch_mb <= 4096.0) {
            bail!("--batch-mb must be in (0, 4096]");
        }
        if !self.phases.is_empty() && self.scenario != Scenario::Phases {
            bail!("--phases needs --scenario phases");
        }
        if self.phases.contains(&Scenario::Phases) {
            bail!("--phases cannot contain `phases` itself");
        }
        let o = Overrides {
            transform_ms: self.transform_ms,
            kernel_ms: self.kernel_ms,
            kernels: self.kernels,
            host_ms: self.host_ms,
            hog_threads: self.hog_threads,
            disk_ms: self.disk_ms,
        };
        let times = [o.transform_ms, o.kernel_ms, o.host_ms, o.disk_ms];
        if times
            .into_iter()
            .flatten()
            .any(|t| !(t >= 0.0 && t.is_finite()))
        {
            bail!("times in milliseconds must be finite and not negative");
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

    pub fn batch_bytes(&self) -> usize {
        (self.batch_mb * 1024.0 * 1024.0) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &str) -> Cli {
        Cli::try_parse_from(std::iter::once("stallgen").chain(args.split_whitespace())).unwrap()
    }

    #[test]
    fn defaults_are_a_healthy_run() {
        let c = parse("");
        assert_eq!(c.scenario, Scenario::Healthy);
        assert_eq!((c.workers(4), c.batch_bytes()), (2, 8 << 20));
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
        assert_eq!(s.max_hog_threads(), 6);
    }

    #[test]
    fn bad_combinations_are_refused() {
        for args in [
            "--workers 0",
            "--secs 0",
            "--batch-mb=-1",
            "--phases disk",
            "--scenario phases --phases phases",
            "--kernel-ms nan",
        ] {
            assert!(parse(args).schedule(2).is_err(), "{args}");
        }
        assert!(Cli::try_parse_from(["stallgen", "--scenario", "nope"]).is_err());
    }
}
