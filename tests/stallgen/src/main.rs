//! stallgen: a synthetic training job, built the way a PyTorch training loop is built, whose
//! GPU idles for a known, injected reason.
mod cli;
mod cuda;
mod dataset;
mod ddp;
mod feed;
mod job;
mod loader;
mod nccl;
mod parent;
mod ptx;
mod rank;
mod scenario;
mod slow_disk;
mod sys;
mod train;
mod truth;
mod work;

use std::{process::ExitCode, time::Instant};

use anyhow::{Context as _, Result};
use clap::Parser as _;

use crate::{
    cli::{Cli, Plan},
    cuda::{Driver, Gpu},
    job::{Job, Out},
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = if cli.check_gpu {
        check_gpu()
    } else {
        run(&cli)
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stallgen: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<()> {
    let plan = cli.plan()?;
    configure_simulator(&plan);
    let cpus = sys::allowed_cpus();
    if let Some(ranks) = plan.ranks {
        return parent::run(cli, &plan, cpus, ranks);
    }
    let schedule = cli.schedule(cpus)?;
    let mut truth = truth::Truth::create(cli.truth.as_deref())
        .with_context(|| format!("creating the truth file {:?}", cli.truth))?;
    let (dataset, _slow_disk) =
        job::dataset(cli.data_dir.as_deref(), schedule.uses_disk(), cli.disk_iops)?;
    let job = Job {
        schedule,
        workers: cli.workers(cpus),
        batch_bytes: plan.batch_bytes,
        pin_memory: plan.pin_memory,
        dataset,
        loader_lag: cli.loader_lag.map(|pct| pct / 100.0),
        launches: plan.launches,
        seat: None,
    };
    truth.log_steps(
        train::StepsLog::create(cli.steps_log.as_deref())
            .with_context(|| format!("creating the steps log {:?}", cli.steps_log))?,
    );
    job::run(job, &mut truth, &mut Out::Stdout)
}

/// What the simulated GPU must look like for this run, for whichever of our processes creates
/// its state file: a GPU per rank, the scenario's PCIe link, the straggler's throttled GPU.
/// The environment wins where it says otherwise; a real driver ignores all three.
fn configure_simulator(plan: &Plan) {
    let set = |key: &str, value: String| {
        if std::env::var_os(key).is_none() {
            // SAFETY: called first thing in main, before any thread exists, so nothing reads
            // the environment concurrently.
            unsafe { std::env::set_var(key, value) };
        }
    };
    if let Some(ranks) = plan.ranks {
        set("STALLSCOPE_SIMGPU_DEVICES", ranks.to_string());
    }
    if let Some(link) = plan.pcie_link {
        set("STALLSCOPE_SIMGPU_PCIE", link.to_owned());
    }
    if let Some(t) = plan.throttle {
        set(cli::THROTTLE_ENV, t.setting());
    }
}

/// `--check-gpu`: which driver library was loaded, which device, and whether the PTX kernel
/// runs for as long as asked.
fn check_gpu() -> Result<()> {
    let drv = Driver::load()?;
    let path = drv.path.clone();
    let real =
        std::fs::canonicalize(&path).map_or_else(|_| path.clone(), |p| p.display().to_string());
    println!("libcuda={path} real={real}");
    let gpu = Gpu::init(drv, 4096, 0)?;
    println!("device={}", gpu.device_name()?);
    let ask_ms = 20.0;
    let t = Instant::now();
    gpu.launch_spin((ask_ms * 1e6) as u64)?;
    gpu.sync_item()?;
    println!(
        "spin_kernel asked_ms={ask_ms:.1} measured_ms={:.1}",
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
