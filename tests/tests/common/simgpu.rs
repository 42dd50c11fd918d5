//! The simulated GPU for the end-to-end tests, and the checks a labelled job's report must
//! pass against the job's own ground truth (stallgen's truth lines, or a Python job's in the
//! same form).
use std::path::PathBuf;

use serde_json::Value;

use super::{Scratch, stallscope::bin};

/// Where the release binaries and the simulator's libraries are: next to stallscope.
pub fn release_dir() -> PathBuf {
    bin()
        .parent()
        .expect("the stallscope binary has a directory")
        .to_path_buf()
}

pub struct Sim {
    _dir: Scratch,
    pub libs: PathBuf,
    pub state: PathBuf,
}

impl Sim {
    pub fn new(name: &str) -> Self {
        let dir = Scratch::new(&format!("sim-{name}"));
        let libs = dir.join("lib");
        simgpu_state::install_dir(&release_dir(), &libs).unwrap_or_else(|e| {
            panic!("the simulated GPU is not built ({e}): run `cargo xtask build` or `cargo xtask test`")
        });
        let state = PathBuf::from(format!(
            "/dev/shm/stallscope-test-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&state);
        Self {
            _dir: dir,
            libs,
            state,
        }
    }
}

impl Sim {
    /// The share of `[start_ns, end_ns)` (CLOCK_MONOTONIC) in which GPU 0 ran no kernel, by
    /// the simulated device's own accounting: what NVML should report for that window. Read
    /// within the device's 60 s of history.
    pub fn device_idle(&self, start_ns: u64, end_ns: u64) -> Result<f64, String> {
        let state =
            simgpu_state::SharedState::open(&self.state, simgpu_state::InitConfig::default())
                .map_err(|e| format!("simulated GPU state {}: {e}", self.state.display()))?;
        let gpu = state
            .device(0)
            .ok_or_else(|| format!("{} has no GPU 0", self.state.display()))?;
        let now = super::monotonic_ns();
        if end_ns <= start_ns || now.saturating_sub(start_ns) > 55_000_000_000 {
            return Err(format!(
                "the window {start_ns}..{end_ns} is empty or older than the device's history (now {now})"
            ));
        }
        let busy = gpu
            .snapshot_history(now - start_ns)
            .busy_between(start_ns, end_ns);
        Ok(1.0 - busy as f64 / (end_ns - start_ns) as f64)
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.state);
    }
}

pub fn gpu(report: &Value) -> &Value {
    let gpus = report["gpus"]
        .as_array()
        .expect("the report has a gpus list");
    assert_eq!(gpus.len(), 1, "one simulated GPU: {gpus:?}");
    &gpus[0]
}

/// The GPU's idle share by stallgen's own account: its kernel time against the length of its
/// phases (the truth file), so the expectation follows the job on whatever host it ran.
pub fn truth_idle(truth: &[Value]) -> Result<f64, String> {
    let field = |t: &Value, k: &str| {
        t[k].as_u64()
            .ok_or_else(|| format!("stallgen's truth has no {k}: {t}"))
    };
    let (mut busy, mut wall) = (0, 0);
    for t in truth {
        busy += field(t, "gpu_busy_ns")?;
        wall += field(t, "end_ns")? - field(t, "start_ns")?;
    }
    if wall == 0 {
        return Err(format!("stallgen wrote no truth: {truth:?}"));
    }
    Ok(1.0 - busy as f64 / wall as f64)
}

/// The most idle time that may be `unknown`: the stretch at the start until the probes see the
/// feeder's first call, which comes within one step (a call already in progress when they
/// attached goes unseen), plus the utilization period that straddles it. From the truth: twice
/// the run's mean step, for steps longer than the mean.
pub fn in_doubt_allowance_ns(truth: &[Value]) -> u64 {
    let wall: u64 = truth
        .iter()
        .map(|t| t["end_ns"].as_u64().unwrap_or(0) - t["start_ns"].as_u64().unwrap_or(0))
        .sum();
    let steps: u64 = truth.iter().map(|t| t["steps"].as_u64().unwrap_or(0)).sum();
    2 * wall / steps.max(1) + simgpu_state::PERIOD_NS
}

/// `cause`'s share of the idle time the report could explain: `unknown` is left out, and must
/// itself stay within `allowance_ns`.
pub fn explained_share(g: &Value, cause: &str, allowance_ns: u64) -> Result<f64, String> {
    let unknown = g["idle_by_cause"]["unknown"].as_u64().unwrap_or(0);
    if unknown > allowance_ns {
        return Err(format!(
            "{unknown} ns of idle time is unknown, more than the {allowance_ns} ns before the \
             probes can see the feeder's first call: {}",
            g["idle_by_cause"]
        ));
    }
    let idle = g["idle_ns"]
        .as_u64()
        .unwrap()
        .saturating_sub(unknown)
        .max(1) as f64;
    Ok(g["idle_by_cause"][cause].as_u64().unwrap_or(0) as f64 / idle)
}

/// What a scenario's truth must show for its cause to be tested at all: a scenario sized for
/// other hosts can fail to inject its cause here, and that is a failure, not a pass.
pub const MIN_INJECTED_IDLE: f64 = 0.2;
/// NVML's idle share against stallgen's kernel time: the recording is 6 s of a 10 s run and
/// the probes cost the feeder a little, so they agree within this.
pub const IDLE_AGREEMENT: f64 = 0.12;

/// stallgen's dataloader-cpu job on the simulated GPU for `secs`, ready; its PID.
pub fn dataloader_job(sim: &Sim, secs: u32) -> (super::spawned::Spawned, u32) {
    let job = super::spawned::Spawned::start(
        std::process::Command::new(release_dir().join("stallgen"))
            .env("LD_LIBRARY_PATH", &sim.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
            .args(["--scenario", "dataloader-cpu", "--secs", &secs.to_string()]),
    );
    let ready = job
        .wait_stdout(std::time::Duration::from_secs(60), |l| {
            l.starts_with("ready pid=")
        })
        .unwrap_or_else(|| panic!("stallgen never became ready: {}", job.stderr_so_far()));
    let pid = ready["ready pid=".len()..]
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("bad ready line: {ready}"));
    (job, pid)
}
