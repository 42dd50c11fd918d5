//! One training process: its DataLoader workers, its GPU, its training loop. It runs in the
//! stallgen process itself, or as one rank of a data-parallel run (see `parent`).
use std::{fs::File, io::Write as _, sync::Arc};

use anyhow::{Context as _, Result};

use crate::{
    cuda::{Driver, Gpu},
    dataset::Dataset,
    ddp::{Ddp, Seat},
    feed::Feed,
    loader::{Loader, PREFETCH, Shared},
    scenario::Schedule,
    slow_disk::SlowDisk,
    sys, train,
    truth::Truth,
    work::{self, WorkerEnv},
};

/// Child processes, killed and reaped however the run ends.
pub struct Children(pub Vec<libc::pid_t>);

impl Drop for Children {
    fn drop(&mut self) {
        for &pid in &self.0 {
            sys::kill_and_reap(pid);
        }
    }
}

/// Where a job says that it is ready and how it did.
pub enum Out {
    /// The stallgen process's own stdout: `ready pid=…` and the totals line.
    Stdout,
    /// A rank's pipe to its parent: `ready workers=…` and `done <totals>`.
    Parent(File),
}

/// First word of a rank's lines to its parent.
pub const READY: &str = "ready";
pub const DONE: &str = "done";

impl Out {
    /// The descriptor a rank's workers must not inherit.
    fn fd(&self) -> Option<std::os::fd::RawFd> {
        match self {
            Self::Stdout => None,
            Self::Parent(pipe) => Some(std::os::fd::AsRawFd::as_raw_fd(pipe)),
        }
    }

    fn ready(&mut self, workers: &[libc::pid_t]) -> Result<()> {
        let pids: Vec<String> = workers.iter().map(ToString::to_string).collect();
        let pids = pids.join(",");
        match self {
            Self::Stdout => {
                let mut out = std::io::stdout().lock();
                writeln!(out, "ready pid={} workers={pids}", std::process::id())?;
                out.flush()?;
            }
            Self::Parent(pipe) => pipe.write_all(format!("{READY} workers={pids}\n").as_bytes())?,
        }
        Ok(())
    }

    /// `behind step=<n> waited_ms=<ms>`, on stdout only: the first step whose batch was not
    /// ready. A loader slower than the GPU has then spent the lead its workers built while
    /// the feeder started, and the job runs as it will from now on.
    fn behind(&mut self, step: u64, waited_ns: u64) -> Result<()> {
        if let Self::Stdout = self {
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "behind step={step} waited_ms={:.1}",
                waited_ns as f64 / 1e6
            )?;
            out.flush()?;
        }
        Ok(())
    }

    fn done(&mut self, totals: &str) -> Result<()> {
        match self {
            Self::Stdout => {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{totals}")?;
                out.flush()?;
            }
            Self::Parent(pipe) => pipe.write_all(format!("{DONE} {totals}\n").as_bytes())?,
        }
        Ok(())
    }
}

/// What one training process runs.
pub struct Job<'a> {
    pub schedule: Schedule,
    pub workers: usize,
    pub batch_bytes: usize,
    pub pin_memory: bool,
    pub dataset: Option<Dataset>,
    /// `--loader-lag`, as a fraction.
    pub loader_lag: Option<f64>,
    /// Whether the totals report kernel launches.
    pub launches: bool,
    pub seat: Option<Seat<'a>>,
}

/// Runs `job` to the end of its schedule.
pub fn run(job: Job<'_>, truth: &mut Truth, out: &mut Out) -> Result<()> {
    let schedule = job.schedule;
    let shared = Shared::new(job.workers * PREFETCH, job.batch_bytes)
        .context("mapping the shared-memory batch slots")?;
    // Everything that forks happens here, while the process is single-threaded: before the
    // driver starts its threads and before the pin-memory thread.
    let env = WorkerEnv {
        shared: Arc::clone(&shared),
        schedule: schedule.clone(),
        workers: job.workers,
        dataset: job.dataset,
        loader_lag: job.loader_lag,
    };
    // A rank's pipes to its parent stay with the rank: the parent must see their end of file
    // when the rank dies, whatever its workers do.
    let to_parent: Vec<_> = out.fd().into_iter().chain(truth.fd()).collect();
    let loader = Loader::spawn(Arc::clone(&shared), job.workers, &|id, ready, free| {
        sys::close_fds(&to_parent);
        work::run_worker(&env, id, ready, free)
    })?;
    let worker_pids = loader.pids();
    let mut children = Children(worker_pids.clone());
    if schedule.max_hog_threads() > 0 {
        // Contention comes from outside the job: a hog inside the traced tree would be
        // counted as one of the job's workers.
        let mut fds = loader.parent_fds();
        fds.extend(&to_parent);
        let pid = sys::spawn_detached("cpu_hog", sys::lifeline()?, || {
            sys::close_fds(&fds);
            work::run_hog(&shared, &schedule)
        })
        .context("starting the cpu_hog process")?;
        children.0.push(pid);
    }

    let ordinal = job.seat.map_or(0, |s| s.gpu);
    let gpu = Gpu::init(Driver::load()?, shared.batch_bytes, ordinal)?;
    let ddp = job
        .seat
        .map(|s| Ddp::join(&gpu, &s))
        .transpose()
        .context("joining the NCCL communicator")?;
    let mut feed = if job.pin_memory {
        Feed::pinned(loader, shared.batch_bytes, |n| gpu.host_alloc(n))?
    } else {
        Feed::Direct(loader)
    };
    // The first batch flows before `ready`, so an attached profiler sees a running job.
    let first = &schedule.phases[0].knobs;
    let mut warmup = train::Summary::default();
    let batch = shared.batch_bytes;
    train::step(&gpu, &mut feed, first, batch, ddp.as_ref(), &mut warmup)?;
    out.ready(&worker_pids)?;

    let summary = train::train(
        &gpu,
        &mut feed,
        &shared,
        &schedule,
        truth,
        ddp.as_ref(),
        &mut |step, waited_ns| out.behind(step, waited_ns),
    )?;
    out.done(&summary.totals(job.launches))?;
    let who = ddp
        .as_ref()
        .map_or(String::new(), |d| format!("rank {}: ", d.ring.rank));
    // One write, so that ranks finishing together do not interleave their lines.
    let line = format!("stallgen: {who}{}\n", summary.breakdown());
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(d) = ddp {
        d.leave(&gpu)?;
    }
    drop(children);
    Ok(())
}

/// The data set, prepared before anything forks, when a phase reads from disk; with it, the
/// throttle on its disk (`iops` reads per second, 0 for none) that lasts as long as it is held.
pub fn dataset(
    dir: Option<&std::path::Path>,
    needed: bool,
    iops: u32,
) -> Result<(Option<Dataset>, Option<SlowDisk>)> {
    if !needed {
        return Ok((None, None));
    }
    let dir = dir.map_or_else(crate::dataset::default_dir, ToOwned::to_owned);
    let ds = Dataset::prepare(&dir)
        .with_context(|| format!("preparing the data set in {}", dir.display()))?;
    let slow = (iops > 0)
        .then(|| SlowDisk::apply(&dir, iops))
        .transpose()
        .with_context(|| format!("limiting the reads of {} to {iops}/s", dir.display()))?;
    Ok((Some(ds), slow))
}
