//! `stallscope agent`: a per-host agent that serves OpenMetrics on `/metrics`.
//!
//! It records its targets with one `stallscope record --segment` child at a time: the probes
//! stay attached while the recording is cut into back-to-back segments, and each segment's
//! JSON report adds each GPU's busy, idle and waiting seconds by cause to the counters. A
//! child keeps the agent's own memory bounded and a recorder's crash from taking the agent
//! down. Targets are found again after every segment: a recorder ends when its targets have
//! all exited, or when a process it does not trace appears (a new job), and the next one
//! traces what is there then. The time not recorded while there were targets (the first
//! attach, a change of recorder) is counted, not guessed at: shares of GPU time, which the
//! alert rules use, are ratios over the recorded time. GPU gauges are read from NVML at each
//! scrape.
mod basic_auth;
mod flamegraphs;
mod gauges;
mod http;
mod web_config;

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use profiler_core::exposition::{self, Exposition};
use profiler_core::report::json::{ReportDoc, SegmentDoc};

use crate::{plan::AgentPlan, privileges};

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

pub fn run(args: &AgentPlan) -> anyhow::Result<i32> {
    let web = args
        .web_config
        .as_deref()
        .map(web_config::load)
        .transpose()?
        .unwrap_or_default();
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
    let lib = crate::nvml_reader::library(args.nvml_lib.clone());
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
    let health = stop.clone();
    let served = runtime.block_on(http::serve(args.listen, web, flamegraph, move || {
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
        gauges::own(
            &mut e,
            health.recorder.load(std::sync::atomic::Ordering::Acquire),
        );
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
        "Time with targets but no recording (an attach, a change of recorder)",
    ),
    (exposition::LOST_EVENTS, exposition::LOST_EVENTS_HELP),
];

/// The processes to record this segment: those alive of the targets chosen now. Without
/// NVML, the PIDs given.
fn targets(args: &AgentPlan) -> Vec<u32> {
    let chosen = args
        .targets
        .choose(args.nvml_lib.clone())
        .map_or_else(|_| args.targets.pids.clone(), |c| c.pids);
    chosen
        .into_iter()
        .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
        .collect()
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
    fn add_report(&mut self, report: &ReportDoc) -> f64 {
        let secs = exposition::add_report(&mut self.counters, report);
        self.count("stallscope_agent_segments", 1.0);
        secs
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

/// What the segments have covered: where the last one recorded ended (CLOCK_MONOTONIC), or
/// `None` while there was nothing to record.
#[derive(Default)]
struct Coverage {
    last_end_ns: Option<u64>,
}

impl Coverage {
    /// A segment recorded `[start_ns, end_ns)`: returns the time before it left unrecorded
    /// since the last one (or since targets were found).
    fn recorded(&mut self, start_ns: u64, end_ns: u64) -> u64 {
        let gap = self
            .last_end_ns
            .map_or(0, |last| start_ns.saturating_sub(last));
        self.last_end_ns = Some(end_ns.max(start_ns));
        gap
    }
}

fn segments(args: &AgentPlan, totals: &Mutex<Totals>, scratch: &std::path::Path, stop: &Stop) {
    let lock = || totals.lock().unwrap_or_else(|p| p.into_inner());
    let mut coverage = Coverage::default();
    let mut runs = 0u64;
    while !stop.asked() {
        let pids = targets(args);
        lock().targets = pids.len();
        if pids.is_empty() {
            coverage.last_end_ns = None;
            stop.sleep(Duration::from_secs(1));
            continue;
        }
        // Targets are here: from now on, time not recorded is uncovered.
        coverage
            .last_end_ns
            .get_or_insert_with(crate::capture::clock::monotonic_ns);
        stop.reapers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|r| !r.is_finished());
        runs += 1;
        let dir = scratch.join(format!("recorder-{runs}"));
        let result = recorder(args, &pids, &dir, stop, &mut |report, graphs| {
            let mut t = lock();
            let recorded = t.add_report(report);
            t.count("stallscope_agent_recorded_seconds", recorded);
            let start = report.start_ns;
            let end = start.saturating_add(report.duration_ns);
            let gap = coverage.recorded(start, end);
            t.count("stallscope_agent_uncovered_seconds", gap as f64 / 1e9);
            if let Some(graphs) = graphs {
                t.keep_stacks(graphs, args.flamegraphs);
            }
        });
        if let Err(e) = result {
            eprintln!("stallscope agent: recording PID(s) {pids:?} failed: {e:#}");
            lock().count("stallscope_agent_segment_failures", 1.0);
            stop.sleep(Duration::from_secs(1));
        }
        if args.flamegraphs.is_zero() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// The last this much of a recorder's stderr is kept, for the error when it fails.
const STDERR_KEPT: usize = 16 * 1024;

/// One `stallscope record --segment` of `pids`, in `dir`, for as long as its targets live and
/// no new target appears (a new job is another recorder's): each segment's JSON report is
/// handed to `segment` as it comes, with the directory its folded stacks were moved to when
/// flame graphs are kept. Fails when the recorder gave no report at all.
fn recorder(
    args: &AgentPlan,
    pids: &[u32],
    dir: &std::path::Path,
    stop: &Stop,
    segment: &mut dyn FnMut(&ReportDoc, Option<PathBuf>),
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(args.recorder(pids.to_vec(), dir).command_line())
        .stdin(Stdio::null())
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
    let mut child = cmd.spawn()?;
    let pid = child.id();
    stop.recorder
        .store(pid, std::sync::atomic::Ordering::Release);
    let end = |child: &std::process::Child| {
        // SAFETY: kill has no memory effects; the PID is our child, not yet reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    };
    if stop.asked() {
        end(&child);
    }
    let stderr = child.stderr.take().map(|e| {
        std::thread::spawn(move || {
            let mut kept = std::collections::VecDeque::new();
            for line in std::io::BufRead::lines(std::io::BufReader::new(e)).map_while(Result::ok) {
                kept.extend(line.bytes().chain(std::iter::once(b'\n')));
                let over = kept.len().saturating_sub(STDERR_KEPT);
                kept.drain(..over);
            }
            String::from_utf8_lossy(kept.make_contiguous()).into_owned()
        })
    });
    let mut reports = 0u64;
    let mut ending = false;
    if let Some(out) = child.stdout.take() {
        let docs = serde_json::Deserializer::from_reader(std::io::BufReader::new(out))
            .into_iter::<SegmentDoc<ReportDoc>>();
        for doc in docs {
            let doc = match doc {
                Ok(doc) => doc,
                Err(e) => {
                    eprintln!(
                        "stallscope agent: the recorder (PID {pid}) wrote a report that does not read: {e}"
                    );
                    break;
                }
            };
            reports += 1;
            let _ = std::fs::remove_file(&doc.recording);
            let graphs = (!args.flamegraphs.is_zero())
                .then(|| move_graphs(dir, doc.segment).ok())
                .flatten();
            segment(&doc.report, graphs);
            // A new job (a process the recorder does not trace) gets a recorder that traces
            // it: this one ends its segment now.
            if !ending && !stop.asked() && !covers(&doc.report, &targets(args)) {
                ending = true;
                end(&child);
            }
        }
    }
    stop.recorder.store(0, std::sync::atomic::Ordering::Release);
    // The recorder ends its stdout with its last report, seconds before it exits (the
    // kernel removes its probes one grace period at a time): the next starts meanwhile.
    let reaper = std::thread::spawn(move || {
        let status = child.wait();
        let text = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
        (status, text)
    });
    if reports > 0 {
        let waiting = std::thread::spawn(move || drop(reaper.join()));
        stop.reapers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(waiting);
        return Ok(());
    }
    let (status, text) = reaper
        .join()
        .map_err(|_| anyhow::anyhow!("waiting for the recorder panicked"))?;
    anyhow::bail!(
        "the recorder (PID {pid}) exited with {} without a report: {}",
        status.map_or_else(|e| e.to_string(), |s| s.to_string()),
        text.trim()
    )
}

/// Whether a segment's report traced every process of `targets`.
fn covers(report: &ReportDoc, targets: &[u32]) -> bool {
    targets
        .iter()
        .all(|t| report.processes.iter().any(|p| p.pid == *t))
}

/// Moves segment `n`'s folded stacks into a directory of their own (its SVGs are not served:
/// the agent draws its graphs over several segments).
fn move_graphs(dir: &std::path::Path, n: u32) -> std::io::Result<PathBuf> {
    let graphs = dir.join(format!("graphs-{n}"));
    std::fs::create_dir_all(&graphs)?;
    let prefix = format!("segment.{n}.");
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&prefix) {
            continue;
        }
        if name.ends_with(".folded") {
            std::fs::rename(entry.path(), graphs.join(&name))?;
        } else {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(graphs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_counts_the_gaps_between_segments() {
        let mut c = Coverage {
            last_end_ns: Some(100),
        };
        assert_eq!(c.recorded(150, 400), 50, "the first attach");
        assert_eq!(c.recorded(400, 700), 0, "back to back");
        assert_eq!(c.recorded(900, 950), 200, "a new recorder");
    }

    #[test]
    fn a_report_covers_the_processes_it_traced() {
        let r: ReportDoc = serde_json::from_value(
            serde_json::json!({"version": 1, "processes": [{"pid": 7}, {"pid": 9}]}),
        )
        .unwrap();
        assert!(covers(&r, &[7, 9]));
        assert!(covers(&r, &[9]));
        assert!(!covers(&r, &[7, 11]));
    }
}
