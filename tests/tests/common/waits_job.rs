//! `tests/pyjob/waits.py`'s jobs (a feeder that waits on the GIL, a lock or a socket) on the
//! simulated GPU, recorded once ready, with the truth line each writes on exit.
use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;

use super::{
    Scratch,
    simgpu::Sim,
    spawned::Spawned,
    stallscope::{RECORD_TIMEOUT, assert_success, command, parse_report},
};

pub struct Run {
    pub report: Value,
    pub truth: Value,
}

fn python() -> String {
    std::env::var("STALLSCOPE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Runs `scenario` (with `extra` arguments) long enough to record it for 5 s once ready,
/// records it (`--wakers` when asked), and waits for its truth.
pub fn record(scenario: &str, extra: &[&str], wakers: bool) -> Run {
    let sim = Sim::new(&format!("waits-{scenario}"));
    let dir = Scratch::new(&format!("waits-{scenario}"));
    let truth_path = dir.join("truth.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("pyjob/waits.py");
    let job = Spawned::start(
        Command::new(python())
            .arg(script)
            .args([scenario, "--secs", "15", "--truth"])
            .arg(&truth_path)
            .args(extra)
            .env("LD_LIBRARY_PATH", &sim.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state),
    );
    let ready = job
        .wait_stdout(Duration::from_secs(60), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| panic!("{scenario} never became ready: {}", job.stderr_so_far()));
    let pid = ready["ready pid=".len()..].trim().to_string();
    let f = Spawned::start(
        command()
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
            .args(["record", "--json", "--no-flamegraphs", "-d", "5s"])
            .args(wakers.then_some("--wakers"))
            .arg("-o")
            .arg(dir.join("x.rec"))
            .args(["--pid", &pid, "--nvml-lib"])
            .arg(sim.libs.join("libnvidia-ml.so.1")),
    )
    .finish(RECORD_TIMEOUT + Duration::from_secs(5));
    assert_success(&f, &format!("record of {scenario}"));
    let done = job.finish(Duration::from_secs(90));
    assert!(done.status.success(), "{scenario}: {}", done.describe());
    let text = std::fs::read_to_string(&truth_path)
        .unwrap_or_else(|e| panic!("{scenario}: no truth ({e}): {}", done.describe()));
    Run {
        report: parse_report(&f.stdout),
        truth: serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{scenario}: truth {text:?}: {e}")),
    }
}

pub fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}
