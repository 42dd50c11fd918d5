//! `bench whatif`: are stallscope's what-if predictions right? For each of stallgen's
//! single-GPU scenarios on the simulated GPU, record the job by PID and read, from the JSON
//! report, the top cause, its share, the steps found and the predicted speedup if the
//! injected cause were fixed (`gpus[].what_if[]`); then run the job untraced with that cause
//! removed through stallgen's own knobs, interleaved with the original job untraced for the
//! same seconds, and take the real speedup from stallgen's own exit lines. Prints a table
//! (predicted against measured, the steps found against stallgen's `--steps-log`), a
//! confusion matrix of the top cause against the injected one, and PASS/MISS per target.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::{
    proc::{Proc, tail},
    quiet,
};
use crate::release_bin;

/// Which job a scenario runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// stallgen's scenario of the same name.
    Stallgen,
    /// stallgen's scenario of the same name as a data-parallel job of this many ranks, one
    /// GPU each, recorded by the parent's PID.
    StallgenRanks(u32),
    /// The real PyTorch DataLoader job, `tests/pyjob/train.py --scenario NAME`.
    Torch(&'static str),
}

impl Job {
    fn is_stallgen(self) -> bool {
        matches!(self, Job::Stallgen | Job::StallgenRanks(_))
    }
}

/// One change that removes a cause, as flags added to the original job's and environment.
pub struct Fix {
    /// The cause it removes; `None`: the injected one (the job's truth file names it).
    pub cause: Option<&'static str>,
    pub flags: &'static [&'static str],
    /// Environment for the fixed job (the simulated GPU reads it when it makes its state).
    pub env: &'static [(&'static str, &'static str)],
}

/// A scenario and what fixing its causes means.
pub struct Scenario {
    pub name: &'static str,
    pub job: Job,
    /// Each fix is measured on its own against the original; none: nothing to fix.
    pub fixes: &'static [Fix],
    /// Whether the DataLoader is the bottleneck: the run waits until the workers' head start
    /// (every prefetch slot filled while the feeder started) is spent before recording
    /// (train.py spends it before it says it is ready).
    pub loader_bound: bool,
}

const fn fix(flags: &'static [&'static str]) -> Fix {
    Fix {
        cause: None,
        flags,
        env: &[],
    }
}

/// What "fixed" means, per stallgen scenario. Every fix keeps the model (kernel time per
/// step) and everything else about the job as it was; only the injected cost goes.
const STALLGEN: [Scenario; 9] = [
    // The workers' transform costs no CPU (a cheaper transform, or the work moved to the GPU).
    Scenario {
        name: "dataloader-cpu",
        job: Job::Stallgen,
        fixes: &[fix(&["--transform-ms", "0"])],
        loader_bound: true,
    },
    // The samples are warm: no cold reads (a page-cached or local-NVMe copy of the data).
    Scenario {
        name: "disk",
        job: Job::Stallgen,
        fixes: &[fix(&["--disk-ms", "0"])],
        loader_bound: true,
    },
    // The CPU hog outside the job is gone; the workers keep their 120 ms × workers of CPU
    // per batch, so the loader is what limits next.
    Scenario {
        name: "cpu-contention",
        job: Job::Stallgen,
        fixes: &[fix(&["--hog-threads", "0"])],
        loader_bound: true,
    },
    // The feeder's own work between steps (logging, metrics) costs nothing.
    Scenario {
        name: "host-compute",
        job: Job::Stallgen,
        fixes: &[fix(&["--host-ms", "0"])],
        loader_bound: false,
    },
    // pin_memory=True: batches go through page-locked buffers on a pin-memory thread, so the
    // driver DMAs them without staging them with a CPU memcpy in the call.
    Scenario {
        name: "pageable-copy",
        job: Job::Stallgen,
        fixes: &[fix(&["--pin-memory"])],
        loader_bound: false,
    },
    // The link trains to its full gen5 x16 (the simulated GPU's maximum) instead of gen1 x4.
    Scenario {
        name: "pcie-degraded",
        job: Job::Stallgen,
        fixes: &[Fix {
            cause: None,
            flags: &[],
            env: &[("STALLSCOPE_SIMGPU_PCIE", "5,16")],
        }],
        loader_bound: false,
    },
    // As a CUDA graph (or torch.compile's reduce-overhead) would: the step's 4,000 kernels of
    // 2 µs become one launch of the same 8 ms of GPU time.
    Scenario {
        name: "launch-bound",
        job: Job::Stallgen,
        fixes: &[fix(&["--kernels", "1", "--kernel-ms", "8"])],
        loader_bound: false,
    },
    // Four ranks, one of whose GPUs runs every kernel 3× longer (a thermal slowdown, its SM
    // clock a third of the others'): the others wait for it in their all-reduces. Fixed, it
    // runs at full clock. Read on the throttled rank's GPU; the job's top cause is the
    // straggler's own.
    Scenario {
        name: "gpu-straggler",
        job: Job::StallgenRanks(4),
        fixes: &[fix(&["--throttle", "1"])],
        loader_bound: false,
    },
    // Nothing to fix: its what-ifs should promise nothing.
    Scenario {
        name: "healthy",
        job: Job::Stallgen,
        fixes: &[],
        loader_bound: false,
    },
];

/// Every scenario, the stallgen arm first.
fn scenarios() -> impl Iterator<Item = &'static Scenario> {
    STALLGEN.iter().chain(super::whatif_torch::TORCH.iter())
}

/// Whether `--only` selects the scenario: any term that is part of its name, or names its
/// arm (`stallgen`, `torch`); no terms select all.
fn selected(sc: &Scenario, only: &[String]) -> bool {
    only.is_empty()
        || only.iter().any(|t| {
            sc.name.contains(t.as_str())
                || (t == "stallgen" && sc.job.is_stallgen())
                || (t == "torch" && matches!(sc.job, Job::Torch(_)))
        })
}

/// The verdict's moderate band: a top cause under this share of GPU time is `none`.
const NONE_BELOW: f64 = 0.10;
/// A prediction within this of the measured speedup is right.
const PREDICTION_TOLERANCE: f64 = 0.15;
/// Steps found within this of the job's own count are right.
const STEPS_TOLERANCE: f64 = 0.10;
/// A healthy job's what-if promising more than this speedup is a false promise.
const HEALTHY_MAX_SPEEDUP: f64 = 1.05;
/// Seconds between the job's `ready` and the recording's start.
const WARM_UP: Duration = Duration::from_secs(1);
/// How long the workers' head start may take to spend.
const BEHIND_WITHIN: Duration = Duration::from_secs(20);
/// How long to wait for a quiet machine before each scenario (the machine may be shared).
const SETTLE: Duration = Duration::from_secs(15);

/// What stallscope predicted for one run of a scenario.
struct Prediction {
    /// Injected cause, from the job's truth file (`none` for a healthy job).
    injected: String,
    top: String,
    top_share: f64,
    /// `gpus[0].what_if[]`, by cause.
    what_ifs: Vec<(String, WhatIf)>,
    /// The causes of the report's `advice[]`, in its order.
    advice: Vec<String>,
    /// Each cause's lost time over the GPU's observed time (a cause under the what-if's 2%
    /// gets no estimate: the report expects nothing from fixing it).
    lost: BTreeMap<String, f64>,
    steps_found: Option<u64>,
    /// The job's own steps whose sync ended while the probes watched; `None` for a job of
    /// ranks, which keeps no one steps log.
    steps_own: Option<u64>,
    step_ms_p50: Option<f64>,
}

impl Prediction {
    fn what_if(&self, cause: &str) -> Option<&WhatIf> {
        self.what_ifs
            .iter()
            .find(|(c, _)| c == cause)
            .map(|(_, w)| w)
    }

    /// The largest speedup any what-if promised, and for which cause.
    fn largest(&self) -> Option<(&str, f64)> {
        self.what_ifs
            .iter()
            .map(|(c, w)| (c.as_str(), w.speedup))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

struct WhatIf {
    speedup: f64,
    low: Option<f64>,
    high: Option<f64>,
    now_ms: Option<f64>,
    fixed_ms: Option<f64>,
    next: Option<String>,
}

impl WhatIf {
    fn read(v: &Value) -> Option<Self> {
        Some(Self {
            speedup: v["speedup"].as_f64()?,
            low: v["speedup_low"].as_f64(),
            high: v["speedup_high"].as_f64(),
            now_ms: v["step_ms_now"].as_f64(),
            fixed_ms: v["step_ms_if_fixed"].as_f64(),
            next: v["limited_next_by"].as_str().map(str::to_owned),
        })
    }
}

/// One fix of one run, measured: the original and the fixed job, untraced, side by side.
struct Measured {
    /// The cause the fix removes.
    cause: String,
    jobs: [Untraced; 2],
}

impl Measured {
    /// Fixed steps/s over original steps/s.
    fn speedup(&self) -> f64 {
        self.jobs[1].steps_per_sec / self.jobs[0].steps_per_sec
    }
}

/// One run of one scenario: the prediction, and each of the scenario's fixes measured.
struct Outcome {
    predicted: Prediction,
    fixes: Vec<Measured>,
}

/// One untraced run of the job.
struct Untraced {
    steps_per_sec: f64,
    /// The slowest and fastest whole second's steps (train.py's `second=` lines).
    per_second: Option<(u64, u64)>,
    /// Where the feeder's time went: stallgen's `feeder: wait_batch=… copy=…` line, or the
    /// means of train.py's steps log.
    feeder: String,
    /// What else used the machine meanwhile, if anything did.
    contended: Option<String>,
}

impl Untraced {
    fn describe(&self) -> String {
        format!(
            "{:.2} steps/s{} ({}){}",
            self.steps_per_sec,
            self.per_second
                .map_or(String::new(), |(lo, hi)| format!(", {lo}–{hi} a second")),
            self.feeder,
            self.contended
                .as_ref()
                .map_or(String::new(), |c| format!(", contended: {c}"))
        )
    }
}

struct Bench {
    dir: PathBuf,
    libs: PathBuf,
    secs: u64,
    /// The PyTorch virtualenv's interpreter, when a torch scenario runs.
    torch: Option<PathBuf>,
    /// Jobs started so far: each gets a simulated machine of its own.
    jobs: usize,
}

pub fn whatif(runs: u32, secs: u64, only: &[String]) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the whatif benchmark records with eBPF: run it as root");
    }
    let chosen: Vec<&'static Scenario> = scenarios().filter(|s| selected(s, only)).collect();
    if chosen.is_empty() {
        bail!(
            "--only {} selects no scenario; there are: stallgen, torch, {}",
            only.join(","),
            scenarios().map(|s| s.name).collect::<Vec<_>>().join(", ")
        );
    }
    let mut bins = vec!["stallscope"];
    if chosen.iter().any(|s| s.job.is_stallgen()) {
        bins.push("stallgen");
    }
    for bin in bins {
        if !release_bin(bin).is_file() {
            bail!(
                "{} is missing: run `cargo xtask build`",
                release_bin(bin).display()
            );
        }
    }
    let torch = if chosen.iter().any(|s| matches!(s.job, Job::Torch(_))) {
        // The tests' interpreter, where they were pointed at another.
        Some(match std::env::var_os("STALLSCOPE_TORCH_PYTHON") {
            Some(p) => PathBuf::from(p),
            None => crate::setup::ensure_torch()?,
        })
    } else {
        None
    };
    let dir = std::env::temp_dir().join(format!("stallscope-whatif-{}", std::process::id()));
    let libs = dir.join("lib");
    simgpu_state::install_dir(&crate::root().join("target/release"), &libs)
        .context("installing the simulated GPU's libraries")?;
    let bench = Bench {
        dir,
        libs,
        secs,
        torch,
        jobs: 0,
    };
    let dir = bench.dir.clone();
    let _ = std::fs::remove_dir_all(kept_dir());
    let result = bench.all(runs, &chosen);
    eprintln!(
        "whatif: each recorded run's report, truth and steps log are in {}",
        kept_dir().display()
    );
    let _ = std::fs::remove_dir_all(&dir);
    result
}

impl Bench {
    fn all(mut self, runs: u32, chosen: &[&'static Scenario]) -> anyhow::Result<()> {
        eprintln!(
            "whatif: {runs} run(s) of {} scenarios ({}): each recorded {} s by PID, then the \
             job and each fix untraced for {} s each, interleaved; load average {}",
            chosen.len(),
            chosen.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
            self.secs,
            self.secs,
            loadavg()
        );
        let mut outcomes: BTreeMap<&'static str, Vec<Outcome>> = BTreeMap::new();
        for run in 0..runs {
            for sc in chosen {
                if !quiet::settle(SETTLE) {
                    eprintln!(
                        "whatif: the machine did not quiet down within {SETTLE:?} (load \
                         average {}): running anyway",
                        loadavg()
                    );
                }
                let o = self
                    .one(sc, run)
                    .with_context(|| format!("{} run {}", sc.name, run + 1))?;
                let p = &o.predicted;
                eprintln!(
                    "whatif: {} run {}: top {} ({:.0}%), steps {}/{}, advice [{}], load {}",
                    sc.name,
                    run + 1,
                    p.top,
                    p.top_share * 100.0,
                    p.steps_found.map_or("-".into(), |n| n.to_string()),
                    p.steps_own.map_or("-".into(), |n| n.to_string()),
                    p.advice.join(", "),
                    loadavg()
                );
                for m in &o.fixes {
                    eprintln!(
                        "whatif:   fixing {}: predicted {}, measured {:.2}x",
                        m.cause,
                        p.what_if(&m.cause)
                            .map_or("none".into(), |w| format!("{:.2}x", w.speedup)),
                        m.speedup()
                    );
                    eprintln!("whatif:     original {}", m.jobs[0].describe());
                    eprintln!("whatif:     fixed    {}", m.jobs[1].describe());
                }
                outcomes.entry(sc.name).or_default().push(o);
            }
        }
        print_table(chosen, &outcomes);
        print_confusion(chosen, &outcomes);
        print_targets(&outcomes);
        Ok(())
    }

    fn one(&mut self, sc: &Scenario, run: u32) -> anyhow::Result<Outcome> {
        let predicted = self.record(sc, run)?;
        let mut fixes = Vec::new();
        for (k, fix) in sc.fixes.iter().enumerate() {
            // Alternate which goes first, so that a drift in the machine's load falls on both.
            let (original, fixed) = if (run as usize + k).is_multiple_of(2) {
                let o = self.untraced(sc, &[], &[])?;
                (o, self.untraced(sc, fix.flags, fix.env)?)
            } else {
                let f = self.untraced(sc, fix.flags, fix.env)?;
                (self.untraced(sc, &[], &[])?, f)
            };
            fixes.push(Measured {
                cause: fix
                    .cause
                    .map_or_else(|| predicted.injected.clone(), str::to_owned),
                jobs: [original, fixed],
            });
        }
        Ok(Outcome { predicted, fixes })
    }

    /// A fresh simulated machine for the next job: its state file.
    fn next_state(&mut self) -> PathBuf {
        self.jobs += 1;
        PathBuf::from(format!(
            "/dev/shm/stallscope-whatif-{}-{}",
            std::process::id(),
            self.jobs
        ))
    }

    /// The scenario's job for `secs` of timed steps, on the simulated machine `state`.
    fn job(&self, state: &Path, sc: &Scenario, secs: u64) -> anyhow::Result<Command> {
        let mut cmd = match sc.job {
            Job::Stallgen => {
                let mut c = Command::new(release_bin("stallgen"));
                c.args(["--scenario", sc.name]);
                c
            }
            Job::StallgenRanks(n) => {
                let mut c = Command::new(release_bin("stallgen"));
                c.args(["--scenario", sc.name, "--ranks", &n.to_string()]);
                c
            }
            Job::Torch(name) => {
                let mut c = Command::new(
                    self.torch
                        .as_ref()
                        .context("the torch job needs its virtualenv")?,
                );
                c.arg(crate::root().join("tests/pyjob/train.py"))
                    .args(["--scenario", name]);
                c
            }
        };
        cmd.args(["--secs", &secs.to_string()])
            .env("LD_LIBRARY_PATH", &self.libs)
            .env("STALLSCOPE_SIMGPU_STATE", state);
        Ok(cmd)
    }

    /// The job untraced for `secs`: its own steps/s from its exit line.
    fn untraced(
        &mut self,
        sc: &Scenario,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Untraced> {
        let state = self.next_state();
        let steps_log = self.dir.join("untraced-steps.jsonl");
        let mut cmd = self.job(&state, sc, self.secs)?;
        cmd.args(extra).envs(env.iter().copied());
        let torch = matches!(sc.job, Job::Torch(_));
        if torch {
            cmd.arg("--steps-log").arg(&steps_log);
        }
        // cpu-contention's own hog lives outside the job's tree: its CPU reads as foreign.
        let hogged = sc.name == "cpu-contention" && extra.is_empty();
        let watch = (!hogged).then(|| quiet::Watch::start(None));
        let job = Proc::spawn(&mut cmd)?;
        // The torch job imports torch and starts its workers before its timed steps.
        let totals = job.wait_line(Duration::from_secs(self.secs + 120), |l| {
            l.starts_with("steps=")
        });
        let (exit, out, err) = job.stop(Duration::from_secs(20), Duration::from_secs(2));
        // The job's workers and hog are its children, reaped by it: their CPU is in its own.
        let contended = watch.and_then(|w| w.finish(exit.map_or(0.0, |e| e.cpu_s)));
        let _ = std::fs::remove_file(&state);
        let line = totals.with_context(|| {
            format!(
                "{} {extra:?} printed no totals ({}): {}",
                sc.name,
                exit.map_or("still running".into(), |e| e.describe()),
                tail(&err)
            )
        })?;
        let feeder = if torch {
            let steps = jsonl(&steps_log);
            let _ = std::fs::remove_file(&steps_log);
            step_means(&steps)
        } else {
            err.lines()
                .find_map(|l| l.split_once("feeder: "))
                .map_or(String::new(), |(_, f)| f.to_owned())
        };
        Ok(Untraced {
            steps_per_sec: steps_per_sec(&line).with_context(|| format!("the totals: {line}"))?,
            per_second: per_second(&out),
            feeder,
            contended,
        })
    }

    /// The original job recorded by PID: what the report predicts.
    fn record(&mut self, sc: &Scenario, run: u32) -> anyhow::Result<Prediction> {
        let state = self.next_state();
        let truth = self.dir.join("truth.jsonl");
        let steps_log = self.dir.join("steps.jsonl");
        let rec = self.dir.join("run.rec");
        // Long enough to outlast the warm-up, the attach and the recording; the job must end
        // by itself for its steps log and truth to be written out.
        let job_secs = self.secs + 8;
        let mut cmd = self.job(&state, sc, job_secs)?;
        cmd.arg("--truth").arg(&truth);
        // A job of ranks has no one steps log: its steps are not compared.
        if !matches!(sc.job, Job::StallgenRanks(_)) {
            cmd.arg("--steps-log").arg(&steps_log);
        }
        let _ = std::fs::remove_file(&steps_log);
        let job = Proc::spawn(&mut cmd)?;
        let Some(ready) = job.wait_line(Duration::from_secs(120), |l| l.starts_with("ready pid="))
        else {
            let (_, _, err) = job.stop(Duration::ZERO, Duration::from_secs(2));
            bail!("{} never became ready: {}", sc.name, tail(&err));
        };
        let pid = ready["ready pid=".len()..]
            .split_whitespace()
            .next()
            .context("the job's ready line has no pid")?
            .to_owned();
        // train.py spends the workers' head start before it says it is ready; stallgen says
        // when its feeder first waited.
        if sc.loader_bound
            && sc.job == Job::Stallgen
            && job
                .wait_line(BEHIND_WITHIN, |l| l.starts_with("behind "))
                .is_none()
        {
            eprintln!(
                "whatif: {}: the feeder never waited for a batch within {BEHIND_WITHIN:?}",
                sc.name
            );
        }
        std::thread::sleep(WARM_UP);
        let mut record = Command::new(release_bin("stallscope"));
        record
            .args(["record", "--format", "json", "--no-flamegraphs", "-d"])
            .arg(format!("{}s", self.secs))
            .arg("-o")
            .arg(&rec)
            .args(["--pid", &pid, "--nvml-lib"])
            .arg(self.libs.join("libnvidia-ml.so.1"))
            .env("STALLSCOPE_SIMGPU_STATE", &state);
        let recorder = Proc::spawn(&mut record)?;
        let (rexit, out, err) = recorder.stop(
            Duration::from_secs(self.secs + 120),
            Duration::from_secs(10),
        );
        let (jexit, _, jerr) = job.stop(Duration::from_secs(job_secs + 30), Duration::from_secs(2));
        let _ = std::fs::remove_file(&state);
        let _ = std::fs::remove_file(&rec);
        if !rexit.is_some_and(|e| e.success()) {
            bail!(
                "stallscope record of {} ended {}: {}",
                sc.name,
                rexit.map_or("never".into(), |e| e.describe()),
                tail(&err)
            );
        }
        if !jexit.is_some_and(|e| e.success()) {
            bail!("{} did not end by itself: {}", sc.name, tail(&jerr));
        }
        let start = if out.starts_with('{') {
            0
        } else {
            out.find("\n{").map_or(0, |i| i + 1)
        };
        let report: Value = serde_json::from_str(&out[start..])
            .with_context(|| format!("stallscope printed no JSON report: {}", tail(&out)))?;
        // Kept for finding out why a prediction missed: the report beside the job's own account.
        let kept = kept_dir().join(format!("{}.run{}", sc.name, run + 1));
        std::fs::create_dir_all(&kept)?;
        std::fs::write(kept.join("report.json"), &out[start..])?;
        let _ = std::fs::copy(&truth, kept.join("truth.jsonl"));
        let _ = std::fs::copy(&steps_log, kept.join("steps.jsonl"));
        predicted(
            &report,
            &jsonl(&kept.join("truth.jsonl")),
            &jsonl(&kept.join("steps.jsonl")),
        )
    }
}

/// Where each recorded run's JSON report, truth and steps log are kept.
fn kept_dir() -> PathBuf {
    crate::root().join("target/bench-whatif")
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `steps_per_sec=<r>` of the job's exit line (stallgen's and train.py's).
fn steps_per_sec(line: &str) -> Option<f64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("steps_per_sec="))
        .and_then(|v| v.parse().ok())
        .filter(|r: &f64| *r > 0.0)
}

/// The fewest and most steps of a whole second, from train.py's `second=N steps=K` lines.
fn per_second(stdout: &str) -> Option<(u64, u64)> {
    let counts: Vec<u64> = stdout
        .lines()
        .filter(|l| l.starts_with("second="))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("steps="))?
                .parse()
                .ok()
        })
        .collect();
    Some((*counts.iter().min()?, *counts.iter().max()?))
}

/// The mean of each part of a step in train.py's steps log, ms.
fn step_means(steps: &[Value]) -> String {
    if steps.is_empty() {
        return "no steps log".into();
    }
    let n = steps.len() as f64;
    ["wait_batch", "copy", "launch", "host", "sync"]
        .iter()
        .map(|part| {
            let ns: f64 = steps
                .iter()
                .filter_map(|s| s[format!("{part}_ns")].as_f64())
                .sum();
            format!("{part}={:.1}ms", ns / n / 1e6)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// When the job's step was seen by the probes: its sync's end (train.py logs it; stallgen's
/// step ends with its host work after the sync).
fn step_marker(s: &Value) -> u64 {
    s["sync_end_ns"].as_u64().unwrap_or_else(|| {
        s["end_ns"]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(s["host_ns"].as_u64().unwrap_or(0))
    })
}

/// What the report says of the recorded job, with the job's own steps in its window.
fn predicted(report: &Value, truth: &[Value], steps_log: &[Value]) -> anyhow::Result<Prediction> {
    let t = truth.first().context("the job wrote no truth")?;
    // A job of ranks: the rank that is slow of its own cause (the others wait in NCCL for
    // it), read on its GPU; the job's top cause is the report's straggler's own.
    let slow_rank = truth
        .iter()
        .find(|t| t["rank"].is_u64() && t["cause"].as_str().is_some_and(|c| c != "nccl_wait"));
    let ranked = truth.iter().any(|t| t["rank"].is_u64());
    // train.py writes null for its healthy scenario, stallgen `none`.
    let injected = slow_rank.unwrap_or(t)["cause"]
        .as_str()
        .unwrap_or("none")
        .to_owned();
    let g = match slow_rank.and_then(|t| t["pid"].as_u64()) {
        Some(pid) => report["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|g| {
                g["target_pids"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p.as_u64() == Some(pid)))
            })
            .with_context(|| format!("no GPU of the report lists the slow rank, PID {pid}"))?,
        None => &report["gpus"][0],
    };
    if g.is_null() {
        bail!("the report has no GPU");
    }
    let observed = g["observed_ns"].as_u64().unwrap_or(0).max(1) as f64;
    let lost: BTreeMap<String, f64> = g["lost_by_cause"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(c, ns)| Some((c.clone(), ns.as_f64()? / observed)))
        .collect();
    let (cause, top_share) = lost
        .iter()
        .filter(|(c, _)| *c != "unknown")
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(("none".into(), 0.0), |(c, s)| (c.clone(), *s));
    let straggler = &report["ranks"]["straggler"];
    let (top, top_share) = if ranked {
        // The other ranks' wait for the straggler is what the job lost.
        let waited = report["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| o["index"] != g["index"])
            .filter_map(|o| {
                Some(
                    o["lost_by_cause"]["nccl_wait"].as_f64()?
                        / o["observed_ns"].as_f64().filter(|n| *n > 0.0)?,
                )
            })
            .collect();
        let own = straggler["own_cause"].as_str().unwrap_or("none");
        (own.to_owned(), median(waited).unwrap_or(0.0))
    } else if top_share < NONE_BELOW {
        ("none".into(), top_share)
    } else {
        (cause, top_share)
    };
    // A report without what-ifs (an older stallscope) is no prediction, not a failure.
    let what_ifs = g["what_if"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| Some((w["cause"].as_str()?.to_owned(), WhatIf::read(w)?)))
        .collect();
    let advice = report["advice"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["cause"].as_str().map(str::to_owned))
        .collect();
    // The probes see the feeder's steps from when they attached to the driver library until
    // the recording's end (the report's start_ns + duration_ns).
    let start = report["start_ns"].as_u64().unwrap_or(0);
    let end = start + report["duration_ns"].as_u64().unwrap_or(0);
    let attached = report["cuda"]["libraries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["attached_ns"].as_u64())
        .min()
        .unwrap_or(start)
        .max(start);
    let steps_own = (!ranked).then(|| {
        steps_log
            .iter()
            .filter(|s| (attached..=end).contains(&step_marker(s)))
            .count() as u64
    });
    Ok(Prediction {
        injected,
        top,
        top_share,
        what_ifs,
        advice,
        lost,
        steps_found: g["steps"]["count"].as_u64(),
        steps_own,
        step_ms_p50: g["steps"]["step_ms"]["p50"].as_f64(),
    })
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn fmt_x(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.2}x"))
}

/// A prediction's error against the measured speedup of the same cause's fix, as a fraction.
fn error(p: &Prediction, m: &Measured) -> Option<f64> {
    Some(predicted_speedup(p, &m.cause)? / m.speedup() - 1.0)
}

/// What the report predicts from fixing `cause`: its what-if; or no gain at all (1.0x) where
/// the cause lost too little of the GPU's time to get one, which is what the report says by
/// leaving it out; `None` where it found no steps to predict over.
fn predicted_speedup(p: &Prediction, cause: &str) -> Option<f64> {
    if let Some(w) = p.what_if(cause) {
        return Some(w.speedup);
    }
    let lost = p.lost.get(cause).copied().unwrap_or(0.0);
    (p.steps_found.is_some_and(|n| n > 0) && lost < profiler_core::attribution::what_if::MIN_SHARE)
        .then_some(1.0)
}

/// The steps found against the job's own: within 10%, or the one step whose sync was in
/// progress when the probes attached (it goes unseen).
fn steps_right(p: &Prediction) -> bool {
    let Some(own) = p.steps_own.filter(|n| *n > 0) else {
        return false;
    };
    p.steps_found
        .is_some_and(|n| (n as f64 - own as f64).abs() <= (STEPS_TOLERANCE * own as f64).max(1.0))
}

/// A healthy run promises nothing: no advice and no what-if above [`HEALTHY_MAX_SPEEDUP`].
fn healthy_right(p: &Prediction) -> bool {
    p.advice.is_empty() && p.largest().is_none_or(|(_, s)| s <= HEALTHY_MAX_SPEEDUP)
}

/// Each fix's measurements over the runs: `k` is the fix's place in its scenario.
fn fix_runs(os: &[Outcome], k: usize) -> Vec<(&Prediction, &Measured)> {
    os.iter()
        .filter_map(|o| Some((&o.predicted, o.fixes.get(k)?)))
        .collect()
}

/// The median step time of the untraced original (`which` 0) or fixed (1) jobs, ms.
fn untraced_ms(runs: &[(&Prediction, &Measured)], which: usize) -> Option<f64> {
    median(
        runs.iter()
            .map(|(_, m)| 1e3 / m.jobs[which].steps_per_sec)
            .collect(),
    )
}

fn print_table(chosen: &[&'static Scenario], outcomes: &BTreeMap<&'static str, Vec<Outcome>>) {
    println!(
        "| scenario | injected | top cause (runs) | share | step p50 | predicted (interval) | \
         limits next | measured | error | within ±15% | steps found / own |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for sc in chosen {
        let Some(os) = outcomes.get(sc.name) else {
            continue;
        };
        let n = os.len();
        let injected = &os[0].predicted.injected;
        let mut tops: BTreeMap<&str, usize> = BTreeMap::new();
        for o in os {
            *tops.entry(o.predicted.top.as_str()).or_default() += 1;
        }
        let tops: Vec<String> = tops.iter().map(|(c, k)| format!("{c} {k}/{n}")).collect();
        let share = median(os.iter().map(|o| o.predicted.top_share * 100.0).collect());
        let p50 = median(os.iter().filter_map(|o| o.predicted.step_ms_p50).collect());
        let (found, own) = os.iter().fold((0, 0), |(f, w), o| {
            (
                f + o.predicted.steps_found.unwrap_or(0),
                w + o.predicted.steps_own.unwrap_or(0),
            )
        });
        let steps_ok = os.iter().filter(|o| steps_right(&o.predicted)).count();
        let common = |name: String, rest: [String; 5]| {
            let [predicted, next, measured, error, within] = rest;
            let cells = [
                name,
                injected.clone(),
                tops.join(", "),
                share.map_or("-".into(), |s| format!("{s:.0}%")),
                p50.map_or("-".into(), |p| format!("{p:.0} ms")),
                predicted,
                next,
                measured,
                error,
                within,
                if os.iter().any(|o| o.predicted.steps_own.is_some()) {
                    format!("{found} / {own} ({steps_ok}/{n} within ±10%)")
                } else {
                    format!("{found} / - (a job of ranks)")
                },
            ];
            println!("| {} |", cells.join(" | "));
        };
        if sc.fixes.is_empty() {
            let largest = os
                .iter()
                .filter_map(|o| o.predicted.largest())
                .max_by(|a, b| a.1.total_cmp(&b.1));
            let advised = os.iter().filter(|o| !o.predicted.advice.is_empty()).count();
            common(
                sc.name.to_owned(),
                [
                    match largest {
                        Some((c, s)) => format!("largest: {c} {s:.2}x"),
                        None => "no what-if".into(),
                    },
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    format!("advice in {advised}/{n}"),
                ],
            );
            continue;
        }
        for k in 0..sc.fixes.len() {
            let runs = fix_runs(os, k);
            let Some(cause) = runs.first().map(|(_, m)| m.cause.clone()) else {
                continue;
            };
            let ws: Vec<&WhatIf> = runs.iter().filter_map(|(p, _)| p.what_if(&cause)).collect();
            let predicted = if ws.is_empty() {
                let lost = median(
                    runs.iter()
                        .map(|(p, _)| p.lost.get(&cause).copied().unwrap_or(0.0) * 100.0)
                        .collect(),
                );
                format!(
                    "no gain: 1.00x ({cause} lost {:.1}%, no what-if)",
                    lost.unwrap_or(0.0)
                )
            } else {
                format!(
                    "{} ({}–{}){}",
                    fmt_x(median(ws.iter().map(|w| w.speedup).collect())),
                    fmt_x(median(ws.iter().filter_map(|w| w.low).collect())),
                    fmt_x(median(ws.iter().filter_map(|w| w.high).collect())),
                    match (
                        median(ws.iter().filter_map(|w| w.now_ms).collect()),
                        median(ws.iter().filter_map(|w| w.fixed_ms).collect())
                    ) {
                        (Some(a), Some(b)) => format!(" {a:.0}→{b:.0} ms"),
                        _ => String::new(),
                    }
                )
            };
            let mut next: Vec<&str> = ws.iter().filter_map(|w| w.next.as_deref()).collect();
            next.sort_unstable();
            next.dedup();
            let measured = median(runs.iter().map(|(_, m)| m.speedup()).collect());
            let contended = runs
                .iter()
                .filter(|(_, m)| m.jobs.iter().any(|u| u.contended.is_some()))
                .count();
            let errors: Vec<f64> = runs.iter().filter_map(|(p, m)| error(p, m)).collect();
            let within = errors
                .iter()
                .filter(|e| e.abs() <= PREDICTION_TOLERANCE)
                .count();
            let steps = match (untraced_ms(&runs, 0), untraced_ms(&runs, 1)) {
                (Some(a), Some(b)) => format!(" {a:.0}→{b:.0} ms"),
                _ => String::new(),
            };
            let contended = if contended == 0 {
                String::new()
            } else {
                format!(" ({contended} contended)")
            };
            common(
                if sc.fixes.len() > 1 {
                    format!("{}: fixing {cause}", sc.name)
                } else {
                    sc.name.to_owned()
                },
                [
                    predicted,
                    if next.is_empty() {
                        "-".into()
                    } else {
                        next.join(", ")
                    },
                    format!("{}{steps}{contended}", fmt_x(measured)),
                    median(errors).map_or("-".into(), |e| format!("{:+.0}%", e * 100.0)),
                    format!("{within}/{}", runs.len()),
                ],
            );
        }
    }
    println!(
        "\nshare: the top cause's idle and waiting time over the GPU time NVML sampled (under \
         10%: `none`); predicted: the report's what-if for the fixed cause (median over the \
         runs), with its step time now and if fixed; measured: the fixed job's steps/s over \
         the original's, both untraced, from the job's exit lines, with the step times they \
         give (contended: other load on the machine during one of them); error: predicted \
         over measured, median; steps: the report's count against the job's own steps whose \
         sync ended while the probes watched; a healthy job's row counts the runs that got \
         advice"
    );
}

fn print_confusion(chosen: &[&'static Scenario], outcomes: &BTreeMap<&'static str, Vec<Outcome>>) {
    let all = || {
        chosen
            .iter()
            .filter_map(|sc| outcomes.get(sc.name))
            .flatten()
    };
    let found: BTreeSet<&str> = all().map(|o| o.predicted.top.as_str()).collect();
    let mut rows: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    for o in all() {
        *rows
            .entry(o.predicted.injected.as_str())
            .or_default()
            .entry(o.predicted.top.as_str())
            .or_default() += 1;
    }
    let found: Vec<&str> = found.into_iter().collect();
    println!("\nTop cause found (columns) against injected cause (rows), runs:\n");
    println!("| injected \\ found | {} |", found.join(" | "));
    println!("|---|{}", "---|".repeat(found.len()));
    for (injected, row) in &rows {
        let cells: Vec<String> = found
            .iter()
            .map(|c| row.get(c).map_or(".".into(), ToString::to_string))
            .collect();
        println!("| {injected} | {} |", cells.join(" | "));
    }
}

fn print_targets(outcomes: &BTreeMap<&'static str, Vec<Outcome>>) {
    let all: Vec<&Outcome> = outcomes.values().flatten().collect();
    let fixed: Vec<(&Prediction, &Measured)> = all
        .iter()
        .flat_map(|o| o.fixes.iter().map(move |m| (&o.predicted, m)))
        .collect();
    let errors: Vec<f64> = fixed.iter().filter_map(|(p, m)| error(p, m)).collect();
    let within = errors
        .iter()
        .filter(|e| e.abs() <= PREDICTION_TOLERANCE)
        .count();
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    println!();
    println!(
        "{}: every prediction within ±15% of the measured speedup: {within} of {} fixes run \
         ({} with no prediction)",
        verdict(within == fixed.len() && !fixed.is_empty()),
        fixed.len(),
        fixed.len() - errors.len()
    );
    let right = all
        .iter()
        .filter(|o| o.predicted.top == o.predicted.injected)
        .count();
    println!(
        "{}: the top cause right in every run: {right} of {}",
        verdict(right == all.len()),
        all.len()
    );
    let healthy: Vec<&Prediction> = all
        .iter()
        .map(|o| &o.predicted)
        .filter(|p| p.injected == "none")
        .collect();
    let promised: Vec<String> = healthy
        .iter()
        .filter(|p| !healthy_right(p))
        .map(|p| {
            format!(
                "advice [{}], largest what-if {}",
                p.advice.join(", "),
                p.largest()
                    .map_or("none".into(), |(c, s)| format!("{c} {s:.2}x"))
            )
        })
        .collect();
    let largest = healthy
        .iter()
        .filter_map(|p| p.largest())
        .max_by(|a, b| a.1.total_cmp(&b.1));
    println!(
        "{}: healthy runs get no advice and no what-if above {:.0}%: {} ({} runs; the largest \
         what-if seen: {})",
        verdict(promised.is_empty() && !healthy.is_empty()),
        (HEALTHY_MAX_SPEEDUP - 1.0) * 100.0,
        if promised.is_empty() {
            "none".into()
        } else {
            promised.join("; ")
        },
        healthy.len(),
        largest.map_or("no what-if at all".into(), |(c, s)| format!("{c} {s:.2}x"))
    );
    let counted: Vec<_> = all
        .iter()
        .filter(|o| o.predicted.steps_own.is_some())
        .collect();
    let steps_ok = counted.iter().filter(|o| steps_right(&o.predicted)).count();
    println!(
        "{}: steps within ±10% of the job's own count (or the one step in progress at the \
         attach): {steps_ok} of {} runs (jobs of ranks keep no one steps log)",
        verdict(steps_ok == counted.len()),
        counted.len()
    );
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_exit_line() {
        assert_eq!(
            steps_per_sec("steps=140 secs=3.000 steps_per_sec=46.661 launches=560000"),
            Some(46.661)
        );
        assert_eq!(steps_per_sec("ready pid=7"), None);
    }

    #[test]
    fn reads_the_seconds_of_train_py() {
        let out = "ready pid=7\nsecond=1 steps=12\nsecond=2 steps=9\nsecond=3 steps=14\n\
                   steps=35 secs=3.010 steps_per_sec=11.628\n";
        assert_eq!(per_second(out), Some((9, 14)));
        assert_eq!(per_second("steps=3 secs=0.5 steps_per_sec=6\n"), None);
    }

    #[test]
    fn averages_the_parts_of_the_steps_log() {
        let steps = [10e6, 30e6].map(|w| {
            serde_json::json!({"wait_batch_ns": w, "copy_ns": 1e6, "launch_ns": 0,
                               "host_ns": 0, "sync_ns": 15e6})
        });
        assert_eq!(
            step_means(&steps),
            "wait_batch=20.0ms copy=1.0ms launch=0.0ms host=0.0ms sync=15.0ms"
        );
        assert_eq!(step_means(&[]), "no steps log");
    }

    #[test]
    fn only_selects_by_name_or_arm() {
        let names = |only: &[&str]| -> Vec<&str> {
            let only: Vec<String> = only.iter().map(|s| (*s).to_owned()).collect();
            scenarios()
                .filter(|s| selected(s, &only))
                .map(|s| s.name)
                .collect()
        };
        let torch = names(&["torch"]);
        assert!(torch.len() >= 6 && torch.iter().all(|n| n.starts_with("torch-")));
        assert!(
            names(&["stallgen"])
                .iter()
                .all(|n| !n.starts_with("torch-"))
        );
        assert_eq!(
            names(&["torch-mix", "launch"]),
            ["launch-bound", "torch-mix"]
        );
        assert_eq!(names(&[]).len(), scenarios().count());
        assert!(names(&["nothing-like-it"]).is_empty());
    }

    #[test]
    fn every_scenario_but_healthy_has_a_fix_and_names_are_unique() {
        let mut seen = BTreeSet::new();
        for s in scenarios() {
            assert!(seen.insert(s.name), "{} twice", s.name);
            assert_eq!(
                s.fixes.is_empty(),
                s.name.ends_with("healthy"),
                "{}",
                s.name
            );
            // Two fixes of one run must each name the cause they remove.
            if s.fixes.len() > 1 {
                assert!(s.fixes.iter().all(|f| f.cause.is_some()), "{}", s.name);
            }
        }
    }

    #[test]
    fn a_report_without_what_ifs_is_no_prediction() {
        let report = serde_json::json!({
            "start_ns": 1000, "duration_ns": 5000,
            "cuda": {"libraries": [{"attached_ns": 2000}]},
            "gpus": [{"observed_ns": 5000, "lost_by_cause": {"unknown": 4000, "disk": 2000},
                      "steps": {"count": 2, "step_ms": {"p50": 400.0}}}]
        });
        let truth = [serde_json::json!({"cause": "disk"})];
        let steps =
            [1500, 2500, 5000, 7000].map(|e| serde_json::json!({"end_ns": e, "host_ns": 0}));
        let p = predicted(&report, &truth, &steps).unwrap();
        assert_eq!((p.top.as_str(), p.top_share), ("disk", 0.4));
        assert_eq!(p.lost.get("unknown"), Some(&0.8));
        assert!(p.what_ifs.is_empty() && p.largest().is_none());
        assert_eq!((p.steps_found, p.steps_own), (Some(2), Some(2)));
        assert!(steps_right(&p));
    }

    #[test]
    fn a_job_of_ranks_is_read_on_the_slow_ranks_gpu_with_the_stragglers_cause_on_top() {
        let report = serde_json::json!({
            "start_ns": 0, "duration_ns": 4000,
            "ranks": {"straggler": {"pid": 12, "own_cause": "gpu_throttled"}},
            "gpus": [
                {"index": 0, "target_pids": [11], "observed_ns": 4000,
                 "lost_by_cause": {"nccl_wait": 2400}, "steps": {"count": 9},
                 "what_if": [{"cause": "nccl_wait", "speedup": 2.5}]},
                {"index": 1, "target_pids": [12], "observed_ns": 4000,
                 "lost_by_cause": {}, "steps": {"count": 9},
                 "what_if": [{"cause": "gpu_throttled", "speedup": 2.6}]}
            ]
        });
        let truth = [
            serde_json::json!({"rank": 0, "pid": 11, "cause": "nccl_wait"}),
            serde_json::json!({"rank": 1, "pid": 12, "cause": "gpu_throttled"}),
        ];
        let p = predicted(&report, &truth, &[]).unwrap();
        assert_eq!(p.injected, "gpu_throttled");
        assert_eq!((p.top.as_str(), p.top_share), ("gpu_throttled", 0.6));
        assert_eq!(p.what_if("gpu_throttled").map(|w| w.speedup), Some(2.6));
        assert!(p.what_if("nccl_wait").is_none(), "the slow rank's GPU");
        assert_eq!(p.steps_own, None);
        assert!(!steps_right(&p));
    }

    #[test]
    fn a_step_is_seen_at_its_sync_end() {
        // stallgen's step ends with its host work after the sync; train.py's at the sync.
        let stallgen = serde_json::json!({"end_ns": 5000, "host_ns": 2000});
        let torch = serde_json::json!({"end_ns": 5000, "sync_end_ns": 5000, "host_ns": 2000});
        assert_eq!((step_marker(&stallgen), step_marker(&torch)), (3000, 5000));
        let report = serde_json::json!({
            "start_ns": 0, "duration_ns": 4000,
            "gpus": [{"observed_ns": 4000, "lost_by_cause": {}}]
        });
        let p = predicted(&report, &[serde_json::json!({"cause": null})], &[torch]).unwrap();
        assert_eq!((p.injected.as_str(), p.top.as_str()), ("none", "none"));
        assert_eq!(p.steps_own, Some(0));
    }

    fn untraced(steps_per_sec: f64) -> Untraced {
        Untraced {
            steps_per_sec,
            per_second: None,
            feeder: String::new(),
            contended: None,
        }
    }

    #[test]
    fn each_fix_is_judged_by_its_own_causes_what_if() {
        let report = serde_json::json!({
            "gpus": [{"observed_ns": 100, "lost_by_cause": {"host_compute": 5},
              "what_if": [
                {"cause": "host_compute", "step_ms_now": 300.0, "step_ms_if_fixed": 100.0,
                 "speedup": 3.0, "speedup_low": 2.8, "speedup_high": 3.2, "limited_next_by": "gpu"},
                {"cause": "disk", "speedup": 1.01}]}],
            "advice": [{"cause": "host_compute"}]
        });
        let truth = [serde_json::json!({"cause": "host_compute"})];
        let p = predicted(&report, &truth, &[]).unwrap();
        assert_eq!(p.top, "none");
        let w = p.what_if("host_compute").unwrap();
        assert_eq!(
            (w.speedup, w.low, w.next.as_deref()),
            (3.0, Some(2.8), Some("gpu"))
        );
        assert_eq!(p.largest(), Some(("host_compute", 3.0)));
        assert_eq!(p.advice, ["host_compute"]);
        let host = Measured {
            cause: "host_compute".into(),
            jobs: [untraced(10.0), untraced(25.0)],
        };
        assert!((error(&p, &host).unwrap() - 0.2).abs() < 1e-9);
        let disk = Measured {
            cause: "disk".into(),
            jobs: [untraced(10.0), untraced(20.0)],
        };
        assert!((error(&p, &disk).unwrap() - (1.01 / 2.0 - 1.0)).abs() < 1e-9);
        let cpu = Measured {
            cause: "dataloader_cpu".into(),
            jobs: [untraced(10.0), untraced(20.0)],
        };
        assert_eq!(error(&p, &cpu), None);
    }

    #[test]
    fn a_healthy_run_with_advice_or_a_promise_is_wrong() {
        let report = |what_if: Value, advice: Value| {
            let r = serde_json::json!({
                "gpus": [{"observed_ns": 100, "lost_by_cause": {}, "what_if": what_if}],
                "advice": advice
            });
            predicted(&r, &[serde_json::json!({"cause": "none"})], &[]).unwrap()
        };
        let quiet = serde_json::json!([{"cause": "disk", "speedup": 1.02}]);
        assert!(healthy_right(&report(quiet.clone(), serde_json::json!([]))));
        assert!(!healthy_right(&report(
            quiet,
            serde_json::json!([{"cause": "disk"}])
        )));
        assert!(!healthy_right(&report(
            serde_json::json!([{"cause": "disk", "speedup": 1.2}]),
            serde_json::json!([])
        )));
    }
}
