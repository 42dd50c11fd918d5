//! A data-parallel run: the stallgen process forks one process per rank (so tracing its tree
//! covers them all), each a whole training job on its own GPU, and relays what they report
//! (with `--world`, these are some of a job's ranks, the others run by stallgen processes on
//! other simulated hosts):
//! one `rank <r> pid=<pid> workers=<pids>` line per rank and then `ready pid=<own pid>
//! workers=<all>` once every rank has trained a step, the ranks' truth lines, and rank 0's
//! totals at the end.
use std::{
    fs::File,
    io::{self, Read as _, Write as _},
    os::fd::{AsRawFd as _, RawFd},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cli::{Cli, Plan, THROTTLE_ENV, Throttle},
    ddp::Seat,
    job::{self, Children, DONE, Job, Out, READY},
    rank::Control,
    scenario::NCCL_WAIT,
    sys,
    truth::{PARENT_PREFIX, RankTag, Truth},
};

/// How long a rank may take to exit once it reported its totals.
const EXIT_WAIT: Duration = Duration::from_secs(10);
/// Longest the ranks may take to get ready (CUDA and NCCL set-up, a cold data set).
const READY_WAIT: Duration = Duration::from_secs(120);

/// What the parent has heard from one rank.
struct Heard {
    pid: libc::pid_t,
    pipe: File,
    pending: Vec<u8>,
    workers: Option<String>,
    truth: Vec<String>,
    totals: Option<String>,
    closed: bool,
}

impl Heard {
    /// Reads what is there; false at end of file.
    fn read(&mut self) -> io::Result<bool> {
        let mut buf = [0u8; 4096];
        let n = match self.pipe.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Err(e) => return Err(e),
        };
        self.pending.extend_from_slice(&buf[..n]);
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line).trim_end().to_owned();
            if let Some(json) = line.strip_prefix(PARENT_PREFIX) {
                self.truth.push(json.to_owned());
            } else if let Some(rest) = line.strip_prefix(READY) {
                let workers = rest.trim().strip_prefix("workers=").unwrap_or_default();
                self.workers = Some(workers.to_owned());
            } else if let Some(rest) = line.strip_prefix(DONE) {
                self.totals = Some(rest.trim().to_owned());
            }
        }
        Ok(n > 0)
    }
}

/// Runs `ranks` rank processes to the end.
pub fn run(cli: &Cli, plan: &Plan, cpus: usize, ranks: usize) -> Result<()> {
    if cli.steps_log.is_some() {
        bail!("--steps-log is for runs without ranks");
    }
    let mut truth = Truth::create(cli.truth.as_deref())
        .with_context(|| format!("creating the truth file {:?}", cli.truth))?;
    // Rank `plan.first_rank + r` of the job runs on this host's GPU r.
    let schedules = (0..ranks)
        .map(|r| cli.rank_schedule(cpus, plan, plan.first_rank + r))
        .collect::<Result<Vec<_>>>()?;
    let uses_disk = schedules.iter().any(|s| s.uses_disk());
    let (dataset, _slow_disk) = job::dataset(cli.data_dir.as_deref(), uses_disk, cli.disk_iops)?;
    let ctl = match &cli.rendezvous {
        Some(path) => Control::open(path, plan.first_rank == 0)?,
        None => Control::new().context("mapping the ranks' control block")?,
    };
    // The throttle in force (ours, or the environment's), so that a throttled rank reports
    // the busy time NVML sees.
    let throttle = std::env::var(THROTTLE_ENV).ok();
    let mut children = Children(Vec::new());
    let mut heard: Vec<Heard> = Vec::with_capacity(ranks);
    for (gpu, schedule) in schedules.into_iter().enumerate() {
        let rank = plan.first_rank + gpu;
        let (pipe, to_parent) = sys::pipe()?;
        // The rank must not hold the other ranks' pipes, or the parent would never see their
        // end of file.
        let mut parent_fds: Vec<RawFd> = heard.iter().map(|h| h.pipe.as_raw_fd()).collect();
        parent_fds.push(pipe.as_raw_fd());
        let job = Job {
            schedule,
            workers: cli.workers(cpus),
            batch_bytes: plan.batch_bytes,
            pin_memory: plan.pin_memory,
            dataset: dataset.clone(),
            loader_lag: cli.loader_lag.map(|pct| pct / 100.0),
            launches: plan.launches,
            seat: Some(Seat {
                ctl: &ctl,
                rank,
                ranks: plan.world,
                gpu,
                buckets: plan.buckets,
                busy_scale: Throttle::factor_of(throttle.as_deref(), gpu),
            }),
        };
        let waits = plan.slow_rank.is_some_and(|slow| slow != rank);
        let name = format!("stallgen-rank{rank}");
        let pid = sys::fork_child(&name, move || {
            sys::close_fds(&parent_fds);
            let tag = RankTag {
                rank,
                pid: std::process::id(),
                cause: waits.then_some(NCCL_WAIT),
            };
            let report = to_parent.try_clone()?;
            let mut truth = Truth::to_parent(report, tag);
            job::run(job, &mut truth, &mut Out::Parent(to_parent))
                .map_err(|e| io::Error::other(format!("{e:#}")))
        })
        .with_context(|| format!("starting rank {rank}"))?;
        children.0.push(pid);
        heard.push(Heard {
            pid,
            pipe,
            pending: Vec::new(),
            workers: None,
            truth: Vec::new(),
            totals: None,
            closed: false,
        });
    }

    let started = Instant::now();
    let deadline = |ready: bool| {
        let run = Duration::from_secs_f64(cli.secs) + READY_WAIT;
        started + if ready { run + READY_WAIT } else { READY_WAIT }
    };
    let mut announced = false;
    while heard.iter().any(|h| h.totals.is_none()) {
        if Instant::now() > deadline(announced) {
            bail!("the ranks did not finish in time");
        }
        listen(&mut heard)?;
        if let Some(h) = heard.iter().find(|h| h.closed && h.totals.is_none()) {
            bail!(
                "rank pid {} exited before finishing (see its error above)",
                h.pid
            );
        }
        if !announced && heard.iter().all(|h| h.workers.is_some()) {
            announce(&heard, plan.first_rank)?;
            announced = true;
        }
    }
    for h in &heard {
        for line in &h.truth {
            truth.forward(line)?;
        }
    }
    let mut out = io::stdout().lock();
    writeln!(out, "{}", heard[0].totals.as_deref().unwrap_or_default())?;
    out.flush()?;
    // Let each rank end on its own (leaving NCCL, unregistering from the GPU), then reap it.
    let mut failed = None;
    for h in &heard {
        match sys::wait_exit(h.pid, EXIT_WAIT) {
            Some(code) => {
                children.0.retain(|&p| p != h.pid);
                if code != 0 {
                    failed = Some((h.pid, code));
                }
            }
            None => eprintln!("stallgen: rank pid {} did not exit; killing it", h.pid),
        }
    }
    match failed {
        Some((pid, code)) => bail!("rank pid {pid} exited with status {code}"),
        None => Ok(()),
    }
}

/// Waits up to a second for the ranks to say something, and reads it.
fn listen(heard: &mut [Heard]) -> Result<()> {
    let mut fds: Vec<libc::pollfd> = heard
        .iter()
        .map(|h| libc::pollfd {
            fd: if h.closed { -1 } else { h.pipe.as_raw_fd() },
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `fds` is a valid array of pollfd of the length passed.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(());
        }
        return Err(e).context("waiting for the ranks");
    }
    for (h, p) in heard.iter_mut().zip(&fds) {
        if p.revents != 0 && !h.read().context("reading a rank's pipe")? {
            h.closed = true;
        }
    }
    Ok(())
}

/// The ranks' lines, then the run's `ready` line.
fn announce(heard: &[Heard], first_rank: usize) -> Result<()> {
    let mut out = io::stdout().lock();
    let mut all = Vec::new();
    for (rank, h) in (first_rank..).zip(heard) {
        let workers = h.workers.as_deref().unwrap_or_default();
        writeln!(out, "rank {rank} pid={} workers={workers}", h.pid)?;
        all.extend(workers.split(',').filter(|w| !w.is_empty()));
    }
    writeln!(
        out,
        "ready pid={} workers={}",
        std::process::id(),
        all.join(",")
    )?;
    out.flush()?;
    Ok(())
}
