//! `stallscope agent`: a per-host agent that serves OpenMetrics on `/metrics`.
//!
//! It records its targets in back-to-back segments: each is `stallscope record` run as a
//! child process for `--segment`, whose JSON report adds each GPU's busy, idle and waiting
//! seconds by cause to the counters. A child per segment keeps the agent's own memory
//! bounded and a recorder's crash from taking the agent down; targets are found again for
//! every segment, so jobs that start, stop or restart are picked up. The gaps between
//! segments (attach and report) are counted, not guessed at: shares of GPU time, which the
//! alert rules use, are ratios over the recorded time. GPU gauges are read from NVML at
//! each scrape.
mod flamegraphs;
mod gauges;
mod http;

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use profiler_core::exposition::{Exposition, gpu_seconds};

use crate::{capture::gpu, cli::AgentArgs, privileges};

/// Tells the segments to stop, and which recorder is running now (0: none), so that a
/// stopping agent can end it and reap it: its CPU time then counts in the agent's own.
#[derive(Default)]
struct Stop {
    asked: std::sync::atomic::AtomicBool,
    recorder: std::sync::atomic::AtomicU32,
    /// Waiting for recorders that gave their report and are removing their probes.
    reapers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Stop {
    fn asked(&self) -> bool {
        self.asked.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sleeps `d`, or less when stopping.
    fn sleep(&self, d: Duration) {
        let until = Instant::now() + d;
        while !self.asked() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// What the segments have added up so far.
#[derive(Default)]
struct Totals {
    counters: Exposition,
    targets: usize,
    /// The folded stacks of the segments within `--flamegraphs`, oldest first.
    stacks: std::collections::VecDeque<(Instant, PathBuf)>,
}

pub fn run(args: &AgentArgs) -> anyhow::Result<i32> {
    privileges::check()?;
    let totals = Arc::new(Mutex::new(Totals::default()));
    {
        let mut t = totals.lock().expect("fresh lock");
        // Named from the start, so a scrape before the first segment shows the families.
        for (name, help) in COUNTERS {
            t.counters.add(name, help, &[], 0.0);
        }
    }
    let scratch = std::env::temp_dir().join(format!("stallscope-agent-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let stop = Arc::new(Stop::default());
    let recorder = {
        let totals = totals.clone();
        let args = args.clone();
        let scratch = scratch.clone();
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("segments".into())
            .spawn(move || segments(&args, &totals, &scratch, &stop))?
    };
    let lib = gpu::nvml_path(args.nvml_lib.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let graphs = totals.clone();
    let window = args.flamegraphs;
    let flamegraph = move |cause: &str| {
        let dirs: Vec<PathBuf> = {
            let t = graphs.lock().unwrap_or_else(|p| p.into_inner());
            t.stacks.iter().map(|(_, d)| d.clone()).collect()
        };
        flamegraphs::render(&dirs, cause, window)
    };
    let served = runtime.block_on(http::serve(args.listen, flamegraph, move || {
        let mut e = Exposition::default();
        let (counters, targets) = {
            let t = totals.lock().unwrap_or_else(|p| p.into_inner());
            (t.counters.clone(), t.targets)
        };
        e.extend(counters);
        e.set(
            "stallscope_agent_targets",
            profiler_core::exposition::Kind::Gauge,
            "Processes the current segment records",
            &[],
            targets as f64,
        );
        NVML.with(|n| n.borrow_mut().read(&lib, &mut e));
        gauges::host_cpu(&mut e);
        gauges::own(&mut e);
        e.render()
    }));
    stop.asked.store(true, std::sync::atomic::Ordering::Release);
    let pid = stop.recorder.load(std::sync::atomic::Ordering::Acquire);
    if pid != 0 {
        // SAFETY: kill has no memory effects; the PID is our child, not yet reaped.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    }
    let _ = recorder.join();
    let reapers = std::mem::take(&mut *stop.reapers.lock().unwrap_or_else(|p| p.into_inner()));
    for r in reapers {
        let _ = r.join();
    }
    let _ = std::fs::remove_dir_all(&scratch);
    served.map(|()| 0)
}

thread_local! {
    static NVML: std::cell::RefCell<gauges::NvmlGauges> = Default::default();
}

const GPU_SECONDS: &str = "stallscope_gpu_seconds";
const GPU_SECONDS_HELP: &str = "GPU time by state (busy, idle, waiting: busy to NVML but only \
                                waiting in collectives) and cause, over the recorded time";
const COUNTERS: [(&str, &str); 5] = [
    (
        "stallscope_agent_segments",
        "Recording segments finished and added",
    ),
    (
        "stallscope_agent_segment_failures",
        "Recording segments that failed (the recorder's message is logged)",
    ),
    (
        "stallscope_agent_recorded_seconds",
        "Wall time covered by the segments added",
    ),
    (
        "stallscope_agent_uncovered_seconds",
        "Wall time between segments (attach, report), not recorded",
    ),
    (
        "stallscope_lost_events",
        "Events the kernel could not deliver to a recorder",
    ),
];

/// The processes to record this segment.
fn targets(args: &AgentArgs) -> Vec<u32> {
    let mut pids: Vec<u32> = args
        .pids
        .iter()
        .copied()
        .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
        .collect();
    if args.all_gpu_processes
        && let Ok(found) = gpu::all_gpu_processes(args.nvml_lib.clone())
    {
        let (traceable, _) = privileges::split_traceable(privileges::caller_uid(), &found);
        pids.extend(traceable);
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

impl Totals {
    /// Adds `v` to one of [`COUNTERS`].
    fn count(&mut self, name: &str, v: f64) {
        let help = COUNTERS
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |c| c.1);
        self.counters.add(name, help, &[], v);
    }

    /// A segment's report: each GPU's seconds by state and cause, and its lost events.
    /// Returns the seconds it recorded.
    fn add_report(&mut self, report: &serde_json::Value) -> f64 {
        for g in gpu_seconds(report) {
            let gpu = g.index.to_string();
            // A fleet's queries name a job's ranks across hosts by this label.
            let rank = g.rank.map(|r| r.to_string()).unwrap_or_default();
            let busy = ("busy", String::new(), g.busy_s);
            for (state, cause, s) in std::iter::once(&busy).chain(&g.lost) {
                let mut l = vec![
                    ("gpu", gpu.as_str()),
                    ("UUID", g.uuid.as_str()),
                    ("state", state),
                    ("cause", cause.as_str()),
                ];
                if !rank.is_empty() {
                    l.push(("rank", rank.as_str()));
                }
                self.counters.add(GPU_SECONDS, GPU_SECONDS_HELP, &l, *s);
            }
        }
        self.count(
            "stallscope_lost_events",
            report["lost_events"].as_f64().unwrap_or(0.0),
        );
        self.count("stallscope_agent_segments", 1.0);
        report["duration_ns"].as_f64().unwrap_or(0.0) / 1e9
    }

    /// Keeps a segment's folded stacks for `window`, dropping those older.
    fn keep_stacks(&mut self, dir: PathBuf, window: Duration) {
        self.stacks.push_back((Instant::now(), dir));
        while self
            .stacks
            .front()
            .is_some_and(|(at, _)| at.elapsed() > window)
        {
            if let Some((_, old)) = self.stacks.pop_front() {
                let _ = std::fs::remove_dir_all(old);
            }
        }
    }
}

fn segments(args: &AgentArgs, totals: &Mutex<Totals>, scratch: &std::path::Path, stop: &Stop) {
    let lock = || totals.lock().unwrap_or_else(|p| p.into_inner());
    let mut last_end: Option<Instant> = None;
    let mut count = 0u64;
    while !stop.asked() {
        let pids = targets(args);
        lock().targets = pids.len();
        if pids.is_empty() {
            last_end = None;
            stop.sleep(Duration::from_secs(1));
            continue;
        }
        let started = Instant::now();
        // Wall time since the last segment ended, less what this one records, is uncovered.
        let since = last_end.unwrap_or(started);
        count += 1;
        let dir = scratch.join(format!("segment-{count}"));
        stop.reapers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|r| !r.is_finished());
        let result = segment(args, &pids, &dir, stop);
        let mut t = lock();
        let recorded = match result {
            Ok(report) => {
                let recorded = t.add_report(&report);
                t.count("stallscope_agent_recorded_seconds", recorded);
                if args.flamegraphs.is_zero() {
                    let _ = std::fs::remove_dir_all(&dir);
                } else {
                    t.keep_stacks(dir, args.flamegraphs);
                }
                recorded
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                eprintln!("stallscope agent: segment of PID(s) {pids:?} failed: {e:#}");
                t.count("stallscope_agent_segment_failures", 1.0);
                0.0
            }
        };
        let wall = since.elapsed().as_secs_f64();
        t.count(
            "stallscope_agent_uncovered_seconds",
            (wall - recorded).max(0.0),
        );
        drop(t);
        if recorded == 0.0 {
            stop.sleep(Duration::from_secs(1));
        }
        last_end = Some(Instant::now());
    }
}

/// One `stallscope record` of `pids` for a segment into `dir` (its folded stacks stay there
/// when flame graphs are kept), and its JSON report.
fn segment(
    args: &AgentArgs,
    pids: &[u32],
    dir: &std::path::Path,
    stop: &Stop,
) -> anyhow::Result<serde_json::Value> {
    std::fs::create_dir_all(dir)?;
    let file: PathBuf = dir.join("segment.rec");
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("record")
        .arg("-d")
        .arg(format!("{}ms", args.segment.as_millis()))
        .arg("-o")
        .arg(&file)
        .args(["--format", "json"]);
    if args.flamegraphs.is_zero() {
        cmd.arg("--no-flamegraphs");
    } else {
        cmd.arg("--flamegraph-dir").arg(dir);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // An agent that is killed must not leave its recorder tracing on: the kernel ends it
    // with the thread that started it (this one lives as long as the agent).
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent's.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    if let Some(lib) = &args.nvml_lib {
        cmd.arg("--nvml-lib").arg(lib);
    }
    for p in pids {
        cmd.args(["--pid", &p.to_string()]);
    }
    let mut child = cmd.spawn()?;
    stop.recorder
        .store(child.id(), std::sync::atomic::Ordering::Release);
    if stop.asked() {
        // SAFETY: as in `run`: our child, not yet reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    }
    let stderr = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut e, &mut text);
            text
        })
    });
    // The recorder ends its stdout with the report, seconds before it exits (the kernel
    // removes its probes one grace period at a time): the next segment starts meanwhile.
    let mut stdout = Vec::new();
    if let Some(mut o) = child.stdout.take() {
        std::io::Read::read_to_end(&mut o, &mut stdout)?;
    }
    stop.recorder.store(0, std::sync::atomic::Ordering::Release);
    let _ = std::fs::remove_file(&file);
    if let Ok(report) = serde_json::from_slice::<serde_json::Value>(&stdout) {
        let reaper = std::thread::spawn(move || {
            let _ = child.wait();
            drop(stderr.map(std::thread::JoinHandle::join));
        });
        stop.reapers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(reaper);
        return Ok(report);
    }
    let status = child.wait()?;
    let stderr = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
    anyhow::bail!(
        "the recorder exited with {status} without a report: {}",
        stderr.trim()
    )
}
