//! stallgen: a synthetic training job, built the way a PyTorch training loop is built, whose
//! GPU idles for a known, injected reason.
mod cli;
mod cuda;
mod dataset;
mod feed;
mod loader;
mod ptx;
mod scenario;
mod sys;
mod train;
mod truth;
mod work;

use std::{io::Write as _, process::ExitCode, sync::Arc, time::Instant};

use anyhow::{Context as _, Result};
use clap::Parser as _;

use crate::{
    cli::Cli,
    cuda::{Driver, Gpu},
    dataset::Dataset,
    feed::Feed,
    loader::{Loader, PREFETCH, Shared},
    work::WorkerEnv,
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

/// Child processes, killed and reaped however the run ends.
struct Children(Vec<libc::pid_t>);

impl Drop for Children {
    fn drop(&mut self) {
        for &pid in &self.0 {
            sys::kill_and_reap(pid);
        }
    }
}

fn run(cli: &Cli) -> Result<()> {
    let cpus = sys::allowed_cpus();
    let schedule = cli.schedule(cpus)?;
    let workers = cli.workers(cpus);
    let mut truth = truth::Truth::create(cli.truth.as_deref())
        .with_context(|| format!("creating the truth file {:?}", cli.truth))?;
    let dataset = if schedule.uses_disk() {
        let dir = cli.data_dir.clone().unwrap_or_else(dataset::default_dir);
        let ds = Dataset::prepare(&dir)
            .with_context(|| format!("preparing the data set in {}", dir.display()))?;
        Some(ds)
    } else {
        None
    };
    let shared = Shared::new(workers * PREFETCH, cli.batch_bytes())
        .context("mapping the shared-memory batch slots")?;
    // Everything that forks happens here, while the process is single-threaded: before the
    // driver starts its threads and before the pin-memory thread.
    let env = WorkerEnv {
        shared: Arc::clone(&shared),
        schedule: schedule.clone(),
        workers,
        dataset,
    };
    let loader = Loader::spawn(Arc::clone(&shared), workers, &|id, ready, free| {
        work::run_worker(&env, id, ready, free)
    })?;
    let worker_pids = loader.pids();
    let mut children = Children(worker_pids.clone());
    if schedule.max_hog_threads() > 0 {
        // Contention comes from outside the job: a hog inside the traced tree would be
        // counted as one of the job's workers.
        let fds = loader.parent_fds();
        let pid = sys::spawn_detached("cpu_hog", sys::lifeline()?, || {
            sys::close_fds(&fds);
            work::run_hog(&shared, &schedule)
        })
        .context("starting the cpu_hog process")?;
        children.0.push(pid);
    }

    let gpu = Gpu::init(Driver::load()?, shared.batch_bytes)?;
    let mut feed = if cli.pin_memory {
        Feed::pinned(loader, shared.batch_bytes, |n| gpu.host_alloc(n))?
    } else {
        Feed::Direct(loader)
    };
    // The first batch flows before `ready`, so an attached profiler sees a running job.
    let first = &schedule.phases[0].knobs;
    let mut warmup = train::Summary::default();
    train::step(&gpu, &mut feed, first, shared.batch_bytes, &mut warmup)?;
    let pids: Vec<String> = worker_pids.iter().map(ToString::to_string).collect();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "ready pid={} workers={}",
        std::process::id(),
        pids.join(",")
    )?;
    out.flush()?;

    let summary = train::train(&gpu, &mut feed, &shared, &schedule, &mut truth)?;
    writeln!(
        out,
        "steps={} secs={:.3} steps_per_sec={:.3}",
        summary.steps,
        summary.secs,
        summary.steps_per_sec()
    )?;
    out.flush()?;
    eprintln!("stallgen: {}", summary.breakdown());
    drop(children);
    Ok(())
}

/// `--check-gpu`: which driver library was loaded, which device, and whether the PTX kernel
/// runs for as long as asked.
fn check_gpu() -> Result<()> {
    let drv = Driver::load()?;
    let path = drv.path.clone();
    let real =
        std::fs::canonicalize(&path).map_or_else(|_| path.clone(), |p| p.display().to_string());
    println!("libcuda={path} real={real}");
    let gpu = Gpu::init(drv, 4096)?;
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
