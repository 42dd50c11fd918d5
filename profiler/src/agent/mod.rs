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
    let recorder = {
        let totals = totals.clone();
        let args = args.clone();
        let scratch = scratch.clone();
        std::thread::Builder::new()
            .name("segments".into())
            .spawn(move || segments(&args, &totals, &scratch))?
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
    let _ = std::fs::remove_dir_all(&scratch);
    drop(recorder);
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
            let busy = ("busy", String::new(), g.busy_s);
            for (state, cause, s) in std::iter::once(&busy).chain(&g.lost) {
                let l = [
                    ("gpu", gpu.as_str()),
                    ("UUID", g.uuid.as_str()),
                    ("state", state),
                    ("cause", cause.as_str()),
                ];
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

fn segments(args: &AgentArgs, totals: &Mutex<Totals>, scratch: &std::path::Path) {
    let lock = || totals.lock().unwrap_or_else(|p| p.into_inner());
    let mut last_end: Option<Instant> = None;
    let mut count = 0u64;
    loop {
        let pids = targets(args);
        lock().targets = pids.len();
        if pids.is_empty() {
            last_end = None;
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        let started = Instant::now();
        // Wall time since the last segment ended, less what this one records, is uncovered.
        let since = last_end.unwrap_or(started);
        count += 1;
        let dir = scratch.join(format!("segment-{count}"));
        let result = segment(args, &pids, &dir);
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
            std::thread::sleep(Duration::from_secs(1));
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
    if let Some(lib) = &args.nvml_lib {
        cmd.arg("--nvml-lib").arg(lib);
    }
    for p in pids {
        cmd.args(["--pid", &p.to_string()]);
    }
    let out = cmd.output()?;
    let _ = std::fs::remove_file(&file);
    anyhow::ensure!(
        out.status.success() || !out.stdout.is_empty(),
        "the recorder exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}
