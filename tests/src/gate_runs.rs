//! Pairs of benchmark runs for the regression gate: stallgen's healthy job on the simulated
//! GPU, recorded by PID past its warm-up, against itself or against a version with a known
//! regression injected. Shared by `cargo xtask bench gate` (20 pairs of each kind) and the
//! root-only test that runs a few.
use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A regression to inject: the cause it adds, and the stallgen arguments that add about 5
/// percentage points of it to the healthy job's GPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Injected {
    /// The healthy job as it is: every finding is a false alarm.
    Nothing,
    /// A heavier transform: one worker takes ~105 ms of CPU per batch for a ~100 ms step.
    DataloaderCpu,
    /// ~104 ms of cold reads per batch.
    Disk,
    /// A pageable batch 9 MiB larger: ~5 ms more of staging per 100 ms step, and its DMA.
    PinnedMemoryCopy,
}

impl Injected {
    pub const ALL: [Injected; 4] = [
        Injected::Nothing,
        Injected::DataloaderCpu,
        Injected::Disk,
        Injected::PinnedMemoryCopy,
    ];

    /// The cause `diff` must name; `None` for the healthy job.
    pub fn cause(self) -> Option<&'static str> {
        match self {
            Injected::Nothing => None,
            Injected::DataloaderCpu => Some("dataloader_cpu"),
            Injected::Disk => Some("disk"),
            Injected::PinnedMemoryCopy => Some("pinned_memory_copy"),
        }
    }

    /// Whether the regression makes the DataLoader slower than the GPU.
    pub fn slows_the_loader(self) -> bool {
        matches!(self, Injected::DataloaderCpu | Injected::Disk)
    }

    /// stallgen's arguments. A slowed loader lags the feeder's own step by
    /// [`LOADER_LAG_PCT`], measured while the job runs, so the added idle time is the same on
    /// a host of any speed; the bigger batch is sized by the simulated host-memcpy rate the
    /// test suite may set.
    pub fn stallgen_args(self) -> Vec<String> {
        let knob = |var: &str, default: f64| {
            std::env::var(var)
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v > 0.0)
                .unwrap_or(default)
        };
        let scenario = match self {
            Injected::Nothing | Injected::PinnedMemoryCopy => "healthy",
            Injected::DataloaderCpu => "dataloader-cpu",
            Injected::Disk => "disk",
        };
        let mut args: Vec<String> = ["--scenario", scenario, "--workers", "1"]
            .map(String::from)
            .to_vec();
        if self.slows_the_loader() {
            args.extend(["--loader-lag".into(), LOADER_LAG_PCT.to_string()]);
        }
        if self == Injected::PinnedMemoryCopy {
            args.extend([
                "--batch-mb".into(),
                format!(
                    "{}",
                    2.0 + 9.0 * knob("STALLSCOPE_SIMGPU_HOST_GBPS", 2.0) / 2.0
                ),
            ]);
        }
        args
    }
}

/// How much slower than the feeder's step a slowed loader is: about 5 points of GPU idle.
pub const LOADER_LAG_PCT: f64 = 5.0;

/// What stallgen says on stdout that a run waits for.
enum Said {
    Ready(String),
    Behind,
}

/// How long a slowed loader may take to spend its lead: two prefetched batches at a few
/// milliseconds a step, with room for a slow host.
const BEHIND_WITHIN: Duration = Duration::from_secs(60);

/// Runs and records on one simulated GPU.
pub struct Runner {
    release: PathBuf,
    dir: PathBuf,
    libs: PathBuf,
    runs: usize,
}

/// The outcome of one diff: its exit status and JSON.
pub struct Verdict {
    pub code: i32,
    pub json: serde_json::Value,
}

impl Verdict {
    /// The causes (not the idle share) `diff` called regressions.
    pub fn regressed(&self) -> Vec<String> {
        self.json["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["change"] == "regression" && r["metric"] != "idle")
            .filter_map(|r| r["metric"].as_str().map(str::to_owned))
            .collect()
    }

    /// The delta of `metric` on the first GPU, in percentage points.
    pub fn delta_pp(&self, metric: &str) -> Option<f64> {
        self.json["rows"]
            .as_array()?
            .iter()
            .find(|r| r["metric"] == metric)
            .and_then(|r| r["delta"].as_f64())
            .map(|d| d * 100.0)
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

impl Runner {
    /// `release` holds stallscope, stallgen and the simulator's libraries; runs go to `dir`.
    pub fn new(release: &Path, dir: &Path) -> Result<Self, String> {
        let libs = dir.join("lib");
        simgpu_state::install_dir(release, &libs).map_err(|e| format!("the simulated GPU: {e}"))?;
        Ok(Runner {
            release: release.to_path_buf(),
            dir: dir.to_path_buf(),
            libs,
            runs: 0,
        })
    }

    /// Records `record_secs` of the job with `injected`, a second after it is ready.
    pub fn record(&mut self, injected: Injected, record_secs: u32) -> Result<PathBuf, String> {
        self.runs += 1;
        let out = self.dir.join(format!("run{}.rec", self.runs));
        let state = self.dir.join(format!("gpu-state-{}", self.runs));
        let mut job = Command::new(self.release.join("stallgen"))
            .args(injected.stallgen_args())
            .args(["--secs", &(record_secs + 30).to_string()])
            .env("LD_LIBRARY_PATH", &self.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &state)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting stallgen: {e}"))?;
        let stdout = job.stdout.take().ok_or("stallgen's stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let said = if let Some(pid) = line.strip_prefix("ready pid=") {
                    Said::Ready(pid.split_whitespace().next().unwrap_or("").to_owned())
                } else if line.starts_with("behind ") {
                    Said::Behind
                } else {
                    continue;
                };
                let _ = tx.send(said);
            }
        });
        let Ok(Said::Ready(pid)) = rx.recv_timeout(Duration::from_secs(60)) else {
            kill(&mut job);
            return Err(format!(
                "stallgen {:?} never became ready",
                injected.stallgen_args()
            ));
        };
        // While the feeder starts up, a slow loader's worker fills every prefetch slot: a
        // lead that takes seconds to spend when the worker is only a little slower than the
        // GPU, and that hides the regression until then. The job says when it is spent.
        if injected.slows_the_loader()
            && !matches!(rx.recv_timeout(BEHIND_WITHIN), Ok(Said::Behind))
        {
            kill(&mut job);
            return Err(format!(
                "stallgen {:?}: the feeder never waited for a batch within {BEHIND_WITHIN:?}",
                injected.stallgen_args()
            ));
        }
        std::thread::sleep(Duration::from_secs(1));
        let started = Instant::now();
        let rec = Command::new(self.release.join("stallscope"))
            .args([
                "record",
                "--no-flamegraphs",
                "-d",
                &format!("{record_secs}s"),
                "-o",
            ])
            .arg(&out)
            .args(["--pid", &pid, "--nvml-lib"])
            .arg(self.libs.join("libnvidia-ml.so.1"))
            .env("STALLSCOPE_SIMGPU_STATE", &state)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        kill(&mut job);
        let _ = std::fs::remove_file(&state);
        let rec = rec.map_err(|e| format!("running stallscope: {e}"))?;
        if !rec.status.success() {
            return Err(format!(
                "stallscope record failed after {:?}: {}",
                started.elapsed(),
                String::from_utf8_lossy(&rec.stderr)
            ));
        }
        Ok(out)
    }

    /// `stallscope diff BASE NEW --format json`.
    pub fn diff(&self, base: &Path, new: &Path) -> Result<Verdict, String> {
        let out = Command::new(self.release.join("stallscope"))
            .arg("diff")
            .args([base, new])
            .args(["--format", "json", "--no-flamegraphs"])
            .output()
            .map_err(|e| format!("running stallscope diff: {e}"))?;
        let code = out.status.code().unwrap_or(-1);
        if code == 2 {
            return Err(format!(
                "diff failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let json = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("diff printed no JSON ({e})"))?;
        Ok(Verdict { code, json })
    }
}
