//! Running the stallscope binary under test and reading its JSON report.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;

use super::{
    Scratch,
    spawned::{Finished, Spawned},
};

/// Attach, a 3 s recording and the report fit easily; a hang does not.
pub const RECORD_TIMEOUT: Duration = Duration::from_secs(60);
pub const REPORT_TIMEOUT: Duration = Duration::from_secs(30);
/// How far stallscope's share of a window may stray from the kernel's: 0.05 is 5 percentage
/// points.
pub const TOLERANCE: f64 = 0.05;

/// The binary under test, built beforehand (`cargo xtask test` sets the variable).
pub fn bin() -> PathBuf {
    let Some(path) = std::env::var_os("STALLSCOPE_BIN") else {
        panic!("set STALLSCOPE_BIN or run `cargo xtask test`");
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "STALLSCOPE_BIN={} is not a file; build it or run `cargo xtask test`",
        path.display()
    );
    path
}

pub fn command() -> Command {
    Command::new(bin())
}

/// `record --json -o FILE --pid P... -d DURATION EXTRA...`, started and left running.
pub fn start_record(pids: &[u32], duration: &str, file: &Path, extra: &[&str]) -> Spawned {
    let mut cmd = command();
    cmd.args(["record", "--json", "-d", duration, "-o"])
        .arg(file);
    for pid in pids {
        cmd.args(["--pid", &pid.to_string()]);
    }
    Spawned::start(cmd.args(extra))
}

/// Waits for the "tracing N thread(s)" line printed once the programs are attached.
pub fn wait_tracing(proc: &Spawned) -> String {
    proc.wait_stderr(RECORD_TIMEOUT, |l| l.starts_with("stallscope: tracing "))
        .unwrap_or_else(|| {
            panic!(
                "stallscope never started tracing; stderr:\n{}",
                proc.stderr_so_far()
            )
        })
}

/// A finished, successful recording and its parsed report.
pub struct Recording {
    pub dir: Scratch,
    pub file: PathBuf,
    pub finished: Finished,
    pub report: Value,
}

/// Records `pids` for `duration` and checks the run succeeded.
pub fn record(pids: &[u32], duration: &str) -> Recording {
    record_with(pids, duration, &[])
}

/// As [`record`], with more `record` options.
pub fn record_with(pids: &[u32], duration: &str, extra: &[&str]) -> Recording {
    let dir = Scratch::new("rec");
    let file = dir.join("x.rec");
    let finished = start_record(pids, duration, &file, extra).finish(RECORD_TIMEOUT);
    assert_success(&finished, "stallscope record");
    let report = parse_report(&finished.stdout);
    Recording {
        dir,
        file,
        finished,
        report,
    }
}

/// `report FILE [--json]`.
pub fn report(file: &Path, json: bool) -> Finished {
    let mut cmd = command();
    cmd.arg("report").arg(file);
    if json {
        cmd.arg("--json");
    }
    Spawned::start(&mut cmd).finish(REPORT_TIMEOUT)
}

/// A folded-stacks file (`frames;... weight` per line) as frames and weights.
pub fn folded(path: &std::path::Path) -> Vec<(Vec<String>, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| {
            let (stack, weight) = l.rsplit_once(' ')?;
            Some((
                stack.split(';').map(str::to_string).collect(),
                weight.parse().ok()?,
            ))
        })
        .collect()
}

/// The JSON report in stdout. A launched command shares stdout, so lines before the report's
/// opening brace are the command's.
pub fn parse_report(stdout: &str) -> Value {
    let start = if stdout.starts_with('{') {
        0
    } else {
        stdout.find("\n{").map_or(0, |i| i + 1)
    };
    serde_json::from_str(&stdout[start..])
        .unwrap_or_else(|e| panic!("stdout is not a JSON report ({e}):\n{stdout}"))
}

/// A panic is never an acceptable way to fail.
pub fn assert_no_panic(f: &Finished, what: &str) {
    assert!(
        f.code() != Some(101) && !f.stderr.contains("panicked at"),
        "{what} panicked:\n{}",
        f.describe()
    );
    assert!(
        f.code().is_some(),
        "{what} died of a signal:\n{}",
        f.describe()
    );
}

pub fn assert_success(f: &Finished, what: &str) {
    assert_no_panic(f, what);
    assert_eq!(f.code(), Some(0), "{what} failed:\n{}", f.describe());
}

/// A clean failure: exit code 1 and one `stallscope: error:` line.
pub fn assert_clean_error(f: &Finished, what: &str) {
    assert_no_panic(f, what);
    assert_eq!(
        f.code(),
        Some(1),
        "{what} should fail with exit code 1:\n{}",
        f.describe()
    );
    assert!(
        f.stderr.contains("stallscope: error: "),
        "{what} should explain the failure on stderr:\n{}",
        f.describe()
    );
}

/// The report's entry for thread `tid`.
pub fn thread(report: &Value, tid: u32) -> &Value {
    report["threads"]
        .as_array()
        .expect("the report has a threads array")
        .iter()
        .find(|t| t["tid"] == tid)
        .unwrap_or_else(|| panic!("thread {tid} is missing from the report"))
}

pub fn u64_field(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

/// One thread's time split as stallscope reports it: each state's share of the four
/// states' sum.
#[derive(Clone, Copy, Debug)]
pub struct Split {
    pub on_cpu: f64,
    pub runqueue: f64,
    pub io_wait: f64,
    pub blocked: f64,
    pub total_ns: u64,
}

/// Reads a thread's split, checking that the four states add up to its lifetime.
pub fn split(t: &Value) -> Split {
    let [on, rq, io, bl] =
        ["on_cpu_ns", "runqueue_ns", "io_wait_ns", "blocked_ns"].map(|k| u64_field(t, k));
    let total_ns = on + rq + io + bl;
    assert_eq!(
        total_ns,
        u64_field(t, "lifetime_ns"),
        "the four states must partition the thread's lifetime: {t}"
    );
    assert!(total_ns > 0, "thread has no lifetime in the recording: {t}");
    let share = |x: u64| x as f64 / total_ns as f64;
    Split {
        on_cpu: share(on),
        runqueue: share(rq),
        io_wait: share(io),
        blocked: share(bl),
        total_ns,
    }
}

/// For a thread alive through the whole recording: its four states must cover the window,
/// no more and no less (give or take the last snapshot's lag behind the end record).
pub fn assert_covers_window(t: &Value, report: &Value) {
    let lifetime = u64_field(t, "lifetime_ns") as f64;
    let duration = u64_field(report, "duration_ns") as f64;
    assert!(
        (lifetime - duration).abs() <= duration * 0.01,
        "a thread alive throughout should have a lifetime equal to the recording's {:.3} s, \
         but its states add up to {:.3} s: {t}",
        duration / 1e9,
        lifetime / 1e9
    );
}

/// The recording's window in CLOCK_MONOTONIC ns: `start_ns` to `start_ns + duration_ns`.
pub fn window(report: &Value) -> (u64, u64) {
    let start = u64_field(report, "start_ns");
    (start, start + u64_field(report, "duration_ns"))
}

/// Fails unless stallscope's share is within [`TOLERANCE`] of the oracle's.
pub fn assert_close(what: &str, stallscope: f64, oracle: f64) {
    eprintln!(
        "{what}: stallscope {:.1}%, kernel {:.1}%",
        stallscope * 100.0,
        oracle * 100.0
    );
    assert!(
        (stallscope - oracle).abs() <= TOLERANCE,
        "{what}: stallscope says {:.1}% but the kernel's own accounting says {:.1}% \
         (tolerance {:.0} points)",
        stallscope * 100.0,
        oracle * 100.0,
        TOLERANCE * 100.0
    );
}

/// Fails unless stallscope's share is within [`TOLERANCE`] of the range `[lo, hi]` the
/// kernel's accounting allows.
pub fn assert_in_range(what: &str, stallscope: f64, (lo, hi): (f64, f64)) {
    eprintln!(
        "{what}: stallscope {:.1}%, kernel {:.1}%..{:.1}%",
        stallscope * 100.0,
        lo * 100.0,
        hi * 100.0
    );
    assert!(
        lo - TOLERANCE <= stallscope && stallscope <= hi + TOLERANCE,
        "{what}: stallscope says {:.1}% but the kernel's own accounting allows {:.1}%..{:.1}% \
         (tolerance {:.0} points either side)",
        stallscope * 100.0,
        lo * 100.0,
        hi * 100.0,
        TOLERANCE * 100.0
    );
}
