//! Benchmarks. `overhead` measures what attaching stallscope costs a workload, next to peer
//! tracers on the same workloads, and prints a markdown table with the targets on stdout.
mod agent_soak;
mod analyze;
mod gate;
mod overhead;
mod peers;
mod proc;
mod quiet;
mod report;
mod soak;
mod storm;
mod switch_cost;
mod tracers;
mod unwind;
mod whatif;
mod whatif_torch;

use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::release_bin;
pub use overhead::Workload;
pub use tracers::Tracer;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Which benchmark.
    #[arg(value_enum)]
    pub which: Which,
    /// Seconds each workload run lasts [default: 5, or 3 with --quick].
    #[arg(long)]
    pub secs: Option<u64>,
    /// Repetitions of every workload × tracer pair, in rotating order [default: 5, or 1
    /// with --quick].
    #[arg(long)]
    pub reps: Option<u32>,
    /// Smoke run: one repetition of 3-second runs.
    #[arg(long)]
    pub quick: bool,
    /// Workloads to run (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "w1,w1u,w2,w3,w4,w5"
    )]
    pub workloads: Vec<Workload>,
    /// Tracers to compare (comma-separated); the untraced baseline always runs.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "stallscope,stallscope-every-launch,stallscope-no-python,stallscope-wakers,agent,bpftrace,runqlat,offcputime,perf-switch-count"
    )]
    pub tracers: Vec<Tracer>,
    /// CPU that pingpong is pinned to [default: the last CPU], leaving the others to the
    /// tracers' user-space side.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// How often to run again a run that another tracer or other load contended with.
    #[arg(long, default_value_t = 2)]
    pub retries: u32,
    /// Wall-clock budget in minutes: retries and waits for a quiet machine stop when they
    /// would push the benchmark past it [default: 13, or 3 with --quick].
    #[arg(long)]
    pub budget_min: Option<u64>,
    /// Use the release binaries as they are instead of building them first.
    #[arg(long)]
    pub no_build: bool,
    /// How long `soak` traces (and `agent-soak` runs).
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Pairs of runs of each kind `gate` compares.
    #[arg(long, default_value_t = 20)]
    pub pairs: usize,
    /// Runs of each scenario `whatif` records and measures [default: 5].
    #[arg(long)]
    pub runs: Option<u32>,
    /// `whatif`'s scenarios to run (comma-separated): a part of a scenario's name
    /// (`torch-mix`, `disk`), or an arm (`stallgen`, `torch`) [default: all].
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Which {
    /// Workload slowdown, CPU, memory and drops of stallscope against bpftrace, runqlat and
    /// offcputime.
    Overhead,
    /// Time and peak memory of `stallscope report` on one hour of an 8-worker job.
    Analyze,
    /// stallscope tracing stallgen's phases and a thread churn for `--minutes`: RSS,
    /// descriptors, kernel map entries and dropped events at the start and at the end.
    Soak,
    /// `stallscope agent` for `--minutes` while stallgen jobs start and stop under it,
    /// scraped every 5 s: its peak RSS (≤ 128 MiB) and growth, every job picked up.
    AgentSoak,
    /// `stallscope diff` over `--pairs` pairs of runs: false alarms between healthy runs, and
    /// regressions of ~5 points of `dataloader_cpu`, `disk` and `pinned_memory_copy` found.
    Gate,
    /// Stack readability on stallgen, frame pointers alone against DWARF CFI: samples with an
    /// `[unknown]` frame, median depth, time per DWARF unwind, steps per second.
    Unwind,
    /// stallscope's what-if predictions against the speedup measured by running the fix:
    /// each stallgen scenario and each variant of the real PyTorch DataLoader job recorded
    /// (`--secs`, default 7), then run untraced with and without its cause, `--runs` times
    /// (default 5); top cause, steps found, confusion matrix. `--only` picks scenarios.
    Whatif,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.which {
        Which::Overhead => overhead(args),
        Which::Analyze => {
            if !args.no_build {
                crate::build().context("building stallscope (skip with --no-build)")?;
            }
            analyze::analyze(args.reps.unwrap_or(3))
        }
        Which::Soak => {
            if !args.no_build {
                crate::build().context("building stallscope (skip with --no-build)")?;
            }
            soak::soak(args.minutes)
        }
        Which::AgentSoak => {
            if !args.no_build {
                crate::build().context("building stallscope (skip with --no-build)")?;
            }
            agent_soak::agent_soak(args.minutes)
        }
        Which::Gate => {
            if !args.no_build {
                crate::build().context("building stallscope (skip with --no-build)")?;
            }
            gate::gate(args.pairs)
        }
        Which::Unwind => {
            if !args.no_build {
                crate::build().context("building stallscope (skip with --no-build)")?;
            }
            unwind::unwind(args.secs.unwrap_or(6).max(1) as u32)
        }
        Which::Whatif => {
            if !args.no_build {
                crate::build().context("building stallscope (skip with --no-build)")?;
            }
            whatif::whatif(
                args.runs.unwrap_or(5).max(1),
                args.secs.unwrap_or(7).max(2),
                &args.only,
            )
        }
    }
}

fn overhead(args: BenchArgs) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the overhead benchmark loads eBPF programs and installs peers: run it as root");
    }
    if !args.no_build {
        crate::build().context("building stallscope and stallwork (skip with --no-build)")?;
    }
    let stallwork = release_bin("stallwork");
    let stallgen = release_bin("stallgen");
    let stallscope = release_bin("stallscope");
    let gpu_job = [Workload::W3, Workload::W4, Workload::W5];
    if args.workloads.iter().any(|w| gpu_job.contains(w)) && !crate::real_gpu() {
        // W3 trains on the simulated GPU: stallgen finds its libcuda.so.1 through the loader
        // path and stallscope its libnvidia-ml.so.1 through STALLSCOPE_NVML_LIB; both share
        // one device state file. Children inherit these.
        let lib = crate::root().join("target/simgpu");
        simgpu_state::install_dir(&crate::root().join("target/release"), &lib)?;
        let state =
            std::env::temp_dir().join(format!("stallscope-bench-gpu-{}", std::process::id()));
        // SAFETY: no other thread runs yet, so nothing reads the environment concurrently.
        unsafe {
            std::env::set_var("LD_LIBRARY_PATH", &lib);
            std::env::set_var("STALLSCOPE_SIMGPU_STATE", &state);
            std::env::set_var("STALLSCOPE_NVML_LIB", lib.join("libnvidia-ml.so.1"));
        }
    }
    for bin in [&stallwork, &stallgen, &stallscope] {
        if !bin.is_file() {
            bail!(
                "{} is missing; build it with `cargo build --release -p profiler -p \
                 stallscope-tests --bins`",
                bin.display()
            );
        }
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut tracers = vec![Tracer::None];
    tracers.extend(args.tracers.iter().filter(|t| **t != Tracer::None));
    tracers.dedup();
    let budget_min = args.budget_min.unwrap_or(if args.quick { 3 } else { 13 });
    let cfg = overhead::Config {
        secs: args.secs.unwrap_or(if args.quick { 3 } else { 5 }).max(1),
        reps: args.reps.unwrap_or(if args.quick { 1 } else { 5 }).max(1),
        workloads: args.workloads.clone(),
        tracers,
        cpu: args.cpu.unwrap_or(cpus - 1),
        stallwork,
        stallgen,
        stallscope,
        torch_python: if args.workloads.contains(&Workload::W5) {
            Some(crate::setup::ensure_torch()?)
        } else {
            None
        },
        peers: peers::ensure(),
        dir: std::env::temp_dir().join("stallscope-bench"),
        retries: args.retries,
        settle: Duration::from_secs(if args.quick { 2 } else { 10 }),
        budget: Duration::from_secs(budget_min * 60),
    };
    let runs = cfg.reps as usize
        * cfg
            .workloads
            .iter()
            .map(|w| cfg.tracers.iter().filter(|t| w.runs_with(**t)).count())
            .sum::<usize>();
    eprintln!(
        "bench: {runs} runs of {} s on {cpus} CPUs (pingpong on CPU {}); {} to {} min",
        cfg.secs,
        cfg.cpu,
        (cfg.run_estimate() * runs as u32).as_secs().div_ceil(60),
        budget_min
    );
    let records = overhead::run_all(&cfg)?;
    report::print(&cfg, &records);
    let pingpong = cfg
        .workloads
        .iter()
        .any(|w| matches!(w, Workload::W1 | Workload::W1u));
    if cfg.workloads.contains(&Workload::W1) {
        // A smoke run takes two windows, too few for the target's verdict.
        let windows = if args.quick {
            2
        } else {
            cfg.reps.max(storm::MIN_WINDOWS)
        };
        storm::print(&storm::measure(&cfg, windows));
    }
    if pingpong && cfg.tracers.contains(&Tracer::Stallscope) {
        switch_cost::print(&switch_cost::measure(&cfg));
    }
    Ok(())
}
