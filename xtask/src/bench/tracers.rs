//! The tracers under comparison: how each one is started against a PID, how its attach is
//! recognised, and what it cost once stopped (wait4 rusage, plus stallscope's own counts).
use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{
    overhead::Config,
    proc::{self, Proc, tail},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Tracer {
    /// No tracer: the baseline.
    None,
    Stallscope,
    /// stallscope with the kernel-launch probes always on (`--launch-duty 100`): what the
    /// launch windows save.
    StallscopeEveryLaunch,
    /// stallscope without the Python frames (`--no-python`): what reading them costs.
    StallscopeNoPython,
    /// stallscope with its wake-up program (`--wakers`): what knowing who woke each sampled
    /// wait costs.
    StallscopeWakers,
    /// stallscope seeing switches through per-thread perf events (`--switch-hook
    /// per-thread`) rather than the `sched_switch` tracepoint.
    StallscopePerThread,
    /// stallscope on the `sched_switch` tracepoint throughout (`--switch-hook tracepoint`),
    /// where the default (`auto`) chooses and moves between hooks.
    StallscopeTracepoint,
    /// `stallscope agent --pid`, its recorder cutting segments of a third of the window: every
    /// run then includes segments reported while the tracing goes on.
    Agent,
    Bpftrace,
    Runqlat,
    Offcputime,
    /// `perf stat -e context-switches -p PID`: a counting context-switch event on each of the
    /// target's threads and no program, the least that any per-thread switch hook costs on
    /// threads that inherit it from one parent (see storm.rs for threads already running).
    PerfSwitchCount,
}

impl Tracer {
    pub fn is_stallscope(self) -> bool {
        matches!(
            self,
            Self::Stallscope
                | Self::StallscopeEveryLaunch
                | Self::StallscopeNoPython
                | Self::StallscopeWakers
                | Self::StallscopePerThread
                | Self::StallscopeTracepoint
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none (baseline)",
            Self::Stallscope => "stallscope",
            Self::StallscopeEveryLaunch => "stallscope --launch-duty 100",
            Self::StallscopeNoPython => "stallscope --no-python",
            Self::StallscopeWakers => "stallscope --wakers",
            Self::StallscopePerThread => "stallscope --switch-hook per-thread",
            Self::StallscopeTracepoint => "stallscope --switch-hook tracepoint",
            Self::Agent => "stallscope agent",
            Self::Bpftrace => "bpftrace",
            Self::Runqlat => "runqlat",
            Self::Offcputime => "offcputime",
            Self::PerfSwitchCount => "perf stat -e context-switches -p",
        }
    }
}

/// The peer's sched_switch counter, unfiltered as in the field notes; BEGIN fires once all
/// probes are attached, so its line marks the attach.
const BPFTRACE_SCRIPT: &str = r#"tracepoint:sched:sched_switch { @[args->prev_pid] = count(); } BEGIN { printf("bench: attached\n"); }"#;

/// What the tracer process itself cost, from wait4.
pub struct Cost {
    pub cpu_s: f64,
    pub maxrss_kib: u64,
    /// From spawning the tracer to its attach signal.
    pub attach_s: f64,
    pub scope: Option<ScopeStats>,
    /// Anything odd about the tracer's exit or output.
    pub note: Option<String>,
}

/// Counts from stallscope's JSON report.
pub struct ScopeStats {
    pub attempted: u64,
    pub lost: u64,
    /// Events that went missing without the kernel side counting them as dropped.
    pub unaccounted: u64,
    pub events_per_s: f64,
    /// The recording's length, as the report gives it.
    pub duration_s: f64,
    /// Stack samples that carried Python frames.
    pub python_samples: u64,
    /// DWARF unwinds and the recorder's time in them.
    pub dwarf_walks: u64,
    pub dwarf_ns: u64,
}

/// A tracer that has attached and is running.
pub struct Attached {
    tracer: Tracer,
    proc: Proc,
    attach_s: f64,
}

impl Attached {
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }
}

/// Starts the tracer against `pid` and waits until it is attached. None for the baseline.
/// `secs`: how long the workload runs.
pub fn attach(
    cfg: &Config,
    t: Tracer,
    pid: u32,
    dir: &Path,
    secs: u64,
) -> Result<Option<Attached>, String> {
    let bin = cfg.tracer_bin(t).map_err(str::to_string)?;
    let pid_s = pid.to_string();
    let mut cmd = Command::new(bin);
    // How each tool shows that it is attached: a line it prints, or (for the libbpf tools,
    // whose stdout is block-buffered into a pipe) BPF link fds appearing in /proc.
    let marker = match t {
        Tracer::None => return Ok(None),
        Tracer::Stallscope
        | Tracer::StallscopeEveryLaunch
        | Tracer::StallscopeNoPython
        | Tracer::StallscopeWakers
        | Tracer::StallscopePerThread
        | Tracer::StallscopeTracepoint => {
            match t {
                Tracer::StallscopeEveryLaunch => cmd.args(["record", "--launch-duty", "100"]),
                Tracer::StallscopeNoPython => cmd.args(["record", "--no-python"]),
                Tracer::StallscopeWakers => cmd.args(["record", "--wakers"]),
                Tracer::StallscopePerThread => cmd.args(["record", "--switch-hook", "per-thread"]),
                Tracer::StallscopeTracepoint => cmd.args(["record", "--switch-hook", "tracepoint"]),
                _ => cmd.arg("record"),
            };
            cmd.args(["--pid", &pid_s, "--json", "-d"])
                .arg(format!("{}s", secs + 5))
                .arg("-o")
                .arg(dir.join("bench.rec"))
                .arg("--flamegraph-dir")
                .arg(dir.join("flamegraphs"));
            Some("stallscope: tracing")
        }
        Tracer::Agent => {
            cmd.args([
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--pid",
                &pid_s,
                "--segment",
            ])
            .arg(format!("{}ms", (secs * 1000 / 3).max(1000)));
            None
        }
        Tracer::Bpftrace => {
            cmd.args(["-B", "line", "-e", BPFTRACE_SCRIPT]);
            Some("bench: attached")
        }
        Tracer::Runqlat | Tracer::Offcputime => {
            cmd.args(["-p", &pid_s]);
            None
        }
        Tracer::PerfSwitchCount => {
            cmd.args([
                "stat",
                "-e",
                "context-switches",
                "-o",
                "/dev/null",
                "-p",
                &pid_s,
            ]);
            None
        }
    };
    cmd.stdin(Stdio::null());
    let started = Instant::now();
    let mut proc = Proc::spawn(&mut cmd).map_err(|e| format!("{e:#}"))?;
    let limit = Duration::from_secs(30);
    let attached = match marker {
        Some(m) => proc.wait_line(limit, |l| l.contains(m)).is_some(),
        // The agent's recorder is its child of the moment.
        None if t == Tracer::Agent => wait_for_links(&mut proc, limit, children_links),
        None => wait_for_links(&mut proc, limit, proc::bpf_attachments),
    };
    if !attached {
        let (exit, out, err) = proc.stop(Duration::ZERO, Duration::from_secs(5));
        return Err(format!(
            "{} did not attach within {} s ({}): {}",
            t.name(),
            limit.as_secs(),
            exit.map_or("still running".into(), |e| e.describe()),
            tail(&format!("{out}{err}"))
        ));
    }
    Ok(Some(Attached {
        tracer: t,
        proc,
        attach_s: started.elapsed().as_secs_f64(),
    }))
}

/// A libbpf tool attaches all its programs in one go: wait for its link fds to appear and
/// then stay unchanged for a moment.
fn wait_for_links(proc: &mut Proc, limit: Duration, links: fn(u32) -> usize) -> bool {
    let deadline = Instant::now() + limit;
    let (mut last, mut stable_since) = (0, Instant::now());
    while Instant::now() < deadline {
        if proc.wait_exit(Duration::ZERO).is_some() {
            return false;
        }
        let n = links(proc.pid());
        if n != last {
            (last, stable_since) = (n, Instant::now());
        } else if n > 0 && stable_since.elapsed() >= Duration::from_millis(250) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The BPF links and perf events held by `pid`'s children.
fn children_links(pid: u32) -> usize {
    proc::children(pid)
        .into_iter()
        .map(proc::bpf_attachments)
        .sum()
}

/// Stops the tracer (letting it end by itself within `grace`) and collects its cost.
pub fn detach(a: Attached, grace: Duration) -> Cost {
    // stallscope analyses the recording and writes flamegraphs on the way out.
    let (exit, out, err) = a.proc.stop(grace, Duration::from_secs(120));
    let Some(exit) = exit else {
        return Cost {
            cpu_s: f64::NAN,
            maxrss_kib: 0,
            attach_s: a.attach_s,
            scope: None,
            note: Some("did not exit; killed".into()),
        };
    };
    let mut note = None;
    // SIGINT is how the peers are stopped, so dying of it is a normal end.
    let interrupted = libc::WIFSIGNALED(exit.status) && libc::WTERMSIG(exit.status) == libc::SIGINT;
    if !exit.success() && !interrupted {
        note = Some(format!("ended with {}: {}", exit.describe(), tail(&err)));
    }
    let scope = if a.tracer.is_stallscope() {
        let s = scope_stats(&out);
        if s.is_none() {
            note.get_or_insert_with(|| format!("no JSON report: {}", tail(&err)));
        }
        s
    } else {
        None
    };
    Cost {
        cpu_s: exit.cpu_s,
        maxrss_kib: exit.maxrss_kib,
        attach_s: a.attach_s,
        scope,
        note,
    }
}

/// Reads attempted/lost events and the per-kind dropped/received counts from the report.
pub fn scope_stats(json_text: &str) -> Option<ScopeStats> {
    let v: serde_json::Value = serde_json::Deserializer::from_str(json_text)
        .into_iter()
        .next()?
        .ok()?;
    let attempted = v.get("attempted_events")?.as_u64()?;
    let lost = v.get("lost_events")?.as_u64()?;
    let duration_s = v.get("duration_ns")?.as_u64()? as f64 / 1e9;
    let unaccounted = v
        .get("events")?
        .as_object()?
        .values()
        .map(|e| {
            let n = |k: &str| e.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
            n("attempted").saturating_sub(n("dropped").saturating_add(n("received")))
        })
        .sum();
    let count = |section: &str, k: &str| {
        v.get(section)
            .and_then(|s| s.get(k))
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    Some(ScopeStats {
        duration_s,
        python_samples: count("python", "samples"),
        dwarf_walks: count("unwinding", "dwarf_walks"),
        dwarf_ns: count("unwinding", "dwarf_ns"),
        attempted,
        lost,
        unaccounted,
        events_per_s: if duration_s > 0.0 {
            attempted as f64 / duration_s
        } else {
            0.0
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_stats_counts_unaccounted_events() {
        let json = r#"{"duration_ns": 2000000000, "attempted_events": 110, "lost_events": 7,
            "events": {"sched": {"attempted": 100, "dropped": 2, "received": 93, "lost": 7},
                       "block": {"attempted": 10, "dropped": 0, "received": 10, "lost": 0}}}

"#;
        let s = scope_stats(json).expect("parses");
        assert_eq!((s.attempted, s.lost, s.unaccounted), (110, 7, 5));
        assert_eq!(s.events_per_s, 55.0);
        assert!(scope_stats("stallscope: oops").is_none());
    }
}
