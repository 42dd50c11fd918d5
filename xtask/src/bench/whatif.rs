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

/// A scenario and what fixing its cause means, as stallgen flags and environment.
struct Scenario {
    name: &'static str,
    /// stallgen flags added to the original job's to remove its cause; `None`: nothing to fix.
    fix: Option<&'static [&'static str]>,
    /// Environment for the fixed job (the simulated GPU reads it when it makes its state).
    fix_env: &'static [(&'static str, &'static str)],
    /// Whether the DataLoader is the bottleneck: the run waits until the workers' head start
    /// (every prefetch slot filled while the feeder started) is spent before recording.
    loader_bound: bool,
}

/// What "fixed" means, per scenario. Every fix keeps the model (kernel time per step) and
/// everything else about the job as it was; only the injected cost goes.
const SCENARIOS: [Scenario; 8] = [
    // The workers' transform costs no CPU (a cheaper transform, or the work moved to the GPU).
    Scenario {
        name: "dataloader-cpu",
        fix: Some(&["--transform-ms", "0"]),
        fix_env: &[],
        loader_bound: true,
    },
    // The samples are warm: no cold reads (a page-cached or local-NVMe copy of the data).
    Scenario {
        name: "disk",
        fix: Some(&["--disk-ms", "0"]),
        fix_env: &[],
        loader_bound: true,
    },
    // The CPU hog outside the job is gone; the workers keep their 120 ms × workers of CPU
    // per batch, so the loader is what limits next.
    Scenario {
        name: "cpu-contention",
        fix: Some(&["--hog-threads", "0"]),
        fix_env: &[],
        loader_bound: true,
    },
    // The feeder's own work between steps (logging, metrics) costs nothing.
    Scenario {
        name: "host-compute",
        fix: Some(&["--host-ms", "0"]),
        fix_env: &[],
        loader_bound: false,
    },
    // pin_memory=True: batches go through page-locked buffers on a pin-memory thread, so the
    // driver DMAs them without staging them with a CPU memcpy in the call.
    Scenario {
        name: "pageable-copy",
        fix: Some(&["--pin-memory"]),
        fix_env: &[],
        loader_bound: false,
    },
    // The link trains to its full gen5 x16 (the simulated GPU's maximum) instead of gen1 x4.
    Scenario {
        name: "pcie-degraded",
        fix: Some(&[]),
        fix_env: &[("STALLSCOPE_SIMGPU_PCIE", "5,16")],
        loader_bound: false,
    },
    // As a CUDA graph (or torch.compile's reduce-overhead) would: the step's 4,000 kernels of
    // 2 µs become one launch of the same 8 ms of GPU time.
    Scenario {
        name: "launch-bound",
        fix: Some(&["--kernels", "1", "--kernel-ms", "8"]),
        fix_env: &[],
        loader_bound: false,
    },
    // Nothing to fix: its what-ifs should promise nothing.
    Scenario {
        name: "healthy",
        fix: None,
        fix_env: &[],
        loader_bound: false,
    },
];

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
    /// Injected cause, from stallgen's truth file.
    injected: String,
    top: String,
    top_share: f64,
    /// `gpus[0].what_if[]` for the injected cause, if the report has one.
    what_if: Option<WhatIf>,
    /// The largest speedup any what-if promised, and for which cause.
    largest: Option<(String, f64)>,
    steps_found: Option<u64>,
    /// stallgen's steps whose sync ended while the probes watched.
    steps_own: u64,
    step_ms_p50: Option<f64>,
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

/// One run of one scenario: the prediction and the measured speedup.
struct Outcome {
    predicted: Prediction,
    /// Fixed steps/s over original steps/s, untraced; `None` for healthy.
    measured: Option<f64>,
    /// The original and the fixed job, untraced.
    jobs: Option<[Untraced; 2]>,
}

/// One untraced run of the job.
struct Untraced {
    steps_per_sec: f64,
    /// stallgen's `feeder: wait_batch=… copy=… launch=… sync=… host=…` line.
    feeder: String,
    /// What else used the machine meanwhile, if anything did.
    contended: Option<String>,
}

impl Untraced {
    fn describe(&self) -> String {
        format!(
            "{:.2} steps/s ({}){}",
            self.steps_per_sec,
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
    /// Jobs started so far: each gets a simulated machine of its own.
    jobs: usize,
}

pub fn whatif(runs: u32, secs: u64) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the whatif benchmark records with eBPF: run it as root");
    }
    for bin in ["stallscope", "stallgen"] {
        if !release_bin(bin).is_file() {
            bail!(
                "{} is missing: run `cargo xtask build`",
                release_bin(bin).display()
            );
        }
    }
    let dir = std::env::temp_dir().join(format!("stallscope-whatif-{}", std::process::id()));
    let libs = dir.join("lib");
    simgpu_state::install_dir(&crate::root().join("target/release"), &libs)
        .context("installing the simulated GPU's libraries")?;
    let bench = Bench {
        dir,
        libs,
        secs,
        jobs: 0,
    };
    let dir = bench.dir.clone();
    let result = bench.all(runs);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

impl Bench {
    fn all(mut self, runs: u32) -> anyhow::Result<()> {
        eprintln!(
            "whatif: {runs} run(s) of {} scenarios: each recorded {} s by PID, then the job \
             and its fix untraced for {} s each, interleaved; load average {}",
            SCENARIOS.len(),
            self.secs,
            self.secs,
            loadavg()
        );
        let mut outcomes: BTreeMap<&'static str, Vec<Outcome>> = BTreeMap::new();
        for run in 0..runs {
            for sc in &SCENARIOS {
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
                eprintln!(
                    "whatif: {} run {}: top {} ({:.0}%), predicted {}, measured {}, steps {}/{}, \
                     load {}",
                    sc.name,
                    run + 1,
                    o.predicted.top,
                    o.predicted.top_share * 100.0,
                    o.predicted
                        .what_if
                        .as_ref()
                        .map_or("none".into(), |w| format!("{:.2}x", w.speedup)),
                    o.measured.map_or("-".into(), |m| format!("{m:.2}x")),
                    o.predicted
                        .steps_found
                        .map_or("-".into(), |n| n.to_string()),
                    o.predicted.steps_own,
                    loadavg()
                );
                if let Some([original, fixed]) = &o.jobs {
                    eprintln!("whatif:   original {}", original.describe());
                    eprintln!("whatif:   fixed    {}", fixed.describe());
                }
                outcomes.entry(sc.name).or_default().push(o);
            }
        }
        print_table(&outcomes);
        print_confusion(&outcomes);
        print_targets(&outcomes);
        Ok(())
    }

    fn one(&mut self, sc: &Scenario, run: u32) -> anyhow::Result<Outcome> {
        let predicted = self.record(sc)?;
        let Some(fix) = sc.fix else {
            return Ok(Outcome {
                predicted,
                measured: None,
                jobs: None,
            });
        };
        // Alternate which goes first, so that a drift in the machine's load falls on both.
        let (original, fixed) = if run.is_multiple_of(2) {
            let o = self.untraced(sc, &[], &[])?;
            (o, self.untraced(sc, fix, sc.fix_env)?)
        } else {
            let f = self.untraced(sc, fix, sc.fix_env)?;
            (self.untraced(sc, &[], &[])?, f)
        };
        Ok(Outcome {
            predicted,
            measured: Some(fixed.steps_per_sec / original.steps_per_sec),
            jobs: Some([original, fixed]),
        })
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

    fn stallgen(&self, state: &Path, sc: &Scenario, secs: u64) -> Command {
        let mut cmd = Command::new(release_bin("stallgen"));
        cmd.args(["--scenario", sc.name, "--secs", &secs.to_string()])
            .env("LD_LIBRARY_PATH", &self.libs)
            .env("STALLSCOPE_SIMGPU_STATE", state);
        cmd
    }

    /// The job untraced for `secs`: stallgen's own steps/s from its exit line.
    fn untraced(
        &mut self,
        sc: &Scenario,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Untraced> {
        let state = self.next_state();
        let mut cmd = self.stallgen(&state, sc, self.secs);
        cmd.args(extra).envs(env.iter().copied());
        // cpu-contention's own hog lives outside the job's tree: its CPU reads as foreign.
        let hogged = sc.name == "cpu-contention" && extra.is_empty();
        let watch = (!hogged).then(|| quiet::Watch::start(None));
        let job = Proc::spawn(&mut cmd)?;
        let totals = job.wait_line(Duration::from_secs(self.secs + 90), |l| {
            l.starts_with("steps=")
        });
        let (exit, _, err) = job.stop(Duration::from_secs(10), Duration::from_secs(2));
        // The job's workers and hog are its children, reaped by it: their CPU is in its own.
        let contended = watch.and_then(|w| w.finish(exit.map_or(0.0, |e| e.cpu_s)));
        let _ = std::fs::remove_file(&state);
        let line = totals.with_context(|| {
            format!(
                "stallgen {} {extra:?} printed no totals ({}): {}",
                sc.name,
                exit.map_or("still running".into(), |e| e.describe()),
                tail(&err)
            )
        })?;
        Ok(Untraced {
            steps_per_sec: steps_per_sec(&line)
                .with_context(|| format!("stallgen's totals: {line}"))?,
            feeder: err
                .lines()
                .find_map(|l| l.split_once("feeder: "))
                .map_or(String::new(), |(_, f)| f.to_owned()),
            contended,
        })
    }

    /// The original job recorded by PID: what the report predicts.
    fn record(&mut self, sc: &Scenario) -> anyhow::Result<Prediction> {
        let state = self.next_state();
        let truth = self.dir.join("truth.jsonl");
        let steps_log = self.dir.join("steps.jsonl");
        let rec = self.dir.join("run.rec");
        // Long enough to outlast the warm-up, the attach and the recording; the job must end
        // by itself for its steps log and truth to be written out.
        let job_secs = self.secs + 8;
        let mut cmd = self.stallgen(&state, sc, job_secs);
        cmd.arg("--truth")
            .arg(&truth)
            .arg("--steps-log")
            .arg(&steps_log);
        let job = Proc::spawn(&mut cmd)?;
        let Some(ready) = job.wait_line(Duration::from_secs(60), |l| l.starts_with("ready pid="))
        else {
            let (_, _, err) = job.stop(Duration::ZERO, Duration::from_secs(2));
            bail!("stallgen {} never became ready: {}", sc.name, tail(&err));
        };
        let pid = ready["ready pid=".len()..]
            .split_whitespace()
            .next()
            .context("stallgen's ready line has no pid")?
            .to_owned();
        if sc.loader_bound
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
            bail!(
                "stallgen {} did not end by itself: {}",
                sc.name,
                tail(&jerr)
            );
        }
        let start = if out.starts_with('{') {
            0
        } else {
            out.find("\n{").map_or(0, |i| i + 1)
        };
        let report: Value = serde_json::from_str(&out[start..])
            .with_context(|| format!("stallscope printed no JSON report: {}", tail(&out)))?;
        let truth = jsonl(&truth);
        let steps = jsonl(&steps_log);
        let _ = std::fs::remove_file(self.dir.join("truth.jsonl"));
        let _ = std::fs::remove_file(self.dir.join("steps.jsonl"));
        predicted(&report, &truth, &steps)
    }
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `steps_per_sec=<r>` of stallgen's exit line.
fn steps_per_sec(line: &str) -> Option<f64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("steps_per_sec="))
        .and_then(|v| v.parse().ok())
        .filter(|r: &f64| *r > 0.0)
}

/// What the report says of the recorded job, with stallgen's own steps in its window.
fn predicted(report: &Value, truth: &[Value], steps_log: &[Value]) -> anyhow::Result<Prediction> {
    let injected = truth
        .first()
        .and_then(|t| t["cause"].as_str())
        .context("stallgen wrote no truth")?
        .to_owned();
    let g = &report["gpus"][0];
    if g.is_null() {
        bail!("the report has no GPU");
    }
    let observed = g["observed_ns"].as_u64().unwrap_or(0).max(1) as f64;
    let (cause, lost) = g["lost_by_cause"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(c, _)| *c != "unknown")
        .filter_map(|(c, ns)| Some((c.clone(), ns.as_u64()?)))
        .max_by_key(|(_, ns)| *ns)
        .unwrap_or(("none".into(), 0));
    let top_share = lost as f64 / observed;
    let top = if top_share < NONE_BELOW {
        "none".into()
    } else {
        cause
    };
    // Until the report carries what-ifs, a missing list is no prediction, not a failure.
    let what_ifs = g["what_if"].as_array().cloned().unwrap_or_default();
    let what_if = what_ifs
        .iter()
        .find(|w| w["cause"] == injected.as_str())
        .and_then(WhatIf::read);
    let largest = what_ifs
        .iter()
        .filter_map(|w| Some((w["cause"].as_str()?.to_owned(), w["speedup"].as_f64()?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    // The probes see the feeder's steps from when they attached to the driver library until
    // the recording's end (the report's start_ns + duration_ns); a step's marker is its
    // sync's end, the step's end less its host work after the sync.
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
    let steps_own = steps_log
        .iter()
        .filter(|s| {
            let marker = s["end_ns"].as_u64().unwrap_or(0) - s["host_ns"].as_u64().unwrap_or(0);
            (attached..=end).contains(&marker)
        })
        .count() as u64;
    Ok(Prediction {
        injected,
        top,
        top_share,
        what_if,
        largest,
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

/// A prediction's error against the measured speedup, as a fraction.
fn error(o: &Outcome) -> Option<f64> {
    Some(o.predicted.what_if.as_ref()?.speedup / o.measured? - 1.0)
}

/// The steps found against the job's own: within 10%, or the one step whose sync was in
/// progress when the probes attached (it goes unseen).
fn steps_right(p: &Prediction) -> bool {
    p.steps_found.is_some_and(|n| {
        (n as f64 - p.steps_own as f64).abs() <= (STEPS_TOLERANCE * p.steps_own as f64).max(1.0)
    }) && p.steps_own > 0
}

/// The median step time of the untraced original (`which` 0) or fixed (1) jobs, ms.
fn untraced_ms(os: &[Outcome], which: usize) -> Option<f64> {
    median(
        os.iter()
            .filter_map(|o| Some(1e3 / o.jobs.as_ref()?[which].steps_per_sec))
            .collect(),
    )
}

fn print_table(outcomes: &BTreeMap<&'static str, Vec<Outcome>>) {
    println!(
        "| scenario | injected | top cause (runs) | share | step p50 | predicted (interval) | \
         limits next | measured | error | within ±15% | steps found / own |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for sc in &SCENARIOS {
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
        let ws: Vec<&WhatIf> = os
            .iter()
            .filter_map(|o| o.predicted.what_if.as_ref())
            .collect();
        let predicted = if sc.fix.is_none() {
            match os
                .iter()
                .filter_map(|o| o.predicted.largest.clone())
                .max_by(|a, b| a.1.total_cmp(&b.1))
            {
                Some((c, s)) => format!("largest: {c} {s:.2}x"),
                None => "no what-if".into(),
            }
        } else if ws.is_empty() {
            "no prediction".into()
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
        let measured = median(os.iter().filter_map(|o| o.measured).collect());
        let contended = os
            .iter()
            .filter(|o| {
                o.jobs
                    .as_ref()
                    .is_some_and(|j| j.iter().any(|u| u.contended.is_some()))
            })
            .count();
        let errors: Vec<f64> = os.iter().filter_map(error).collect();
        let within = errors
            .iter()
            .filter(|e| e.abs() <= PREDICTION_TOLERANCE)
            .count();
        let (found, own) = os.iter().fold((0, 0), |(f, w), o| {
            (
                f + o.predicted.steps_found.unwrap_or(0),
                w + o.predicted.steps_own,
            )
        });
        let steps_ok = os.iter().filter(|o| steps_right(&o.predicted)).count();
        let steps = match (untraced_ms(os, 0), untraced_ms(os, 1)) {
            (Some(a), Some(b)) => format!(" {a:.0}→{b:.0} ms"),
            _ => String::new(),
        };
        let contended = if contended == 0 {
            String::new()
        } else {
            format!(" ({contended} contended)")
        };
        let cells = [
            sc.name.to_owned(),
            injected.clone(),
            tops.join(", "),
            share.map_or("-".into(), |s| format!("{s:.0}%")),
            p50.map_or("-".into(), |p| format!("{p:.0} ms")),
            predicted,
            if next.is_empty() {
                "-".into()
            } else {
                next.join(", ")
            },
            format!("{}{steps}{contended}", fmt_x(measured)),
            median(errors).map_or("-".into(), |e| format!("{:+.0}%", e * 100.0)),
            if sc.fix.is_none() {
                "-".into()
            } else {
                format!("{within}/{n}")
            },
            format!("{found} / {own} ({steps_ok}/{n} within ±10%)"),
        ];
        println!("| {} |", cells.join(" | "));
    }
    println!(
        "\nshare: the top cause's idle and waiting time over the GPU time NVML sampled (under \
         10%: `none`); predicted: the report's what-if for the injected cause (median over the \
         runs), with its step time now and if fixed; measured: the fixed job's steps/s over \
         the original's, both untraced, from stallgen's exit lines, with the step times they \
         give (contended: other load on the machine during one of them); error: predicted \
         over measured, median; steps: the report's count against stallgen's steps whose sync \
         ended while the probes watched"
    );
}

fn print_confusion(outcomes: &BTreeMap<&'static str, Vec<Outcome>>) {
    let mut found: BTreeSet<&str> = BTreeSet::new();
    for o in outcomes.values().flatten() {
        found.insert(o.predicted.top.as_str());
    }
    let found: Vec<&str> = found.into_iter().collect();
    println!("\nTop cause found (columns) against injected cause (rows), runs:\n");
    println!("| injected \\ found | {} |", found.join(" | "));
    println!("|---|{}", "---|".repeat(found.len()));
    for sc in &SCENARIOS {
        let Some(os) = outcomes.get(sc.name) else {
            continue;
        };
        let cells: Vec<String> = found
            .iter()
            .map(|c| {
                let k = os.iter().filter(|o| o.predicted.top == *c).count();
                if k == 0 { ".".into() } else { k.to_string() }
            })
            .collect();
        println!("| {} | {} |", os[0].predicted.injected, cells.join(" | "));
    }
}

fn print_targets(outcomes: &BTreeMap<&'static str, Vec<Outcome>>) {
    let all: Vec<&Outcome> = outcomes.values().flatten().collect();
    let fixed: Vec<&Outcome> = all
        .iter()
        .copied()
        .filter(|o| o.measured.is_some())
        .collect();
    let predictions: Vec<f64> = fixed.iter().filter_map(|o| error(o)).collect();
    let within = predictions
        .iter()
        .filter(|e| e.abs() <= PREDICTION_TOLERANCE)
        .count();
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    println!();
    println!(
        "{}: every prediction within ±15% of the measured speedup: {within} of {} runs \
         ({} with no prediction)",
        verdict(within == fixed.len() && !fixed.is_empty()),
        fixed.len(),
        fixed.len() - predictions.len()
    );
    let right = all
        .iter()
        .filter(|o| {
            let p = &o.predicted;
            p.top == p.injected || (p.injected == "none" && p.top == "none")
        })
        .count();
    println!(
        "{}: the top cause right in every run: {right} of {}",
        verdict(right == all.len()),
        all.len()
    );
    let healthy: Vec<&Outcome> = all
        .iter()
        .copied()
        .filter(|o| o.predicted.injected == "none")
        .collect();
    let promised: Vec<String> = healthy
        .iter()
        .filter_map(|o| o.predicted.largest.clone())
        .filter(|(_, s)| *s > HEALTHY_MAX_SPEEDUP)
        .map(|(c, s)| format!("{c} {s:.2}x"))
        .collect();
    let largest = healthy
        .iter()
        .filter_map(|o| o.predicted.largest.clone())
        .max_by(|a, b| a.1.total_cmp(&b.1));
    println!(
        "{}: healthy runs get no what-if above {:.0}%: {} ({} runs; the largest seen: {})",
        verdict(promised.is_empty() && !healthy.is_empty()),
        (HEALTHY_MAX_SPEEDUP - 1.0) * 100.0,
        if promised.is_empty() {
            "none".into()
        } else {
            promised.join(", ")
        },
        healthy.len(),
        largest.map_or("no what-if at all".into(), |(c, s)| format!("{c} {s:.2}x"))
    );
    let steps_ok = all.iter().filter(|o| steps_right(&o.predicted)).count();
    println!(
        "{}: steps within ±10% of the job's own count (or the one step in progress at the \
         attach): {steps_ok} of {} runs",
        verdict(steps_ok == all.len()),
        all.len()
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
        assert!(p.what_if.is_none() && p.largest.is_none());
        assert_eq!((p.steps_found, p.steps_own), (Some(2), 2));
        assert!(steps_right(&p));
    }

    #[test]
    fn reads_the_injected_causes_what_if() {
        let report = serde_json::json!({
            "gpus": [{"observed_ns": 100, "lost_by_cause": {"host_compute": 5},
              "what_if": [
                {"cause": "host_compute", "step_ms_now": 300.0, "step_ms_if_fixed": 100.0,
                 "speedup": 3.0, "speedup_low": 2.8, "speedup_high": 3.2, "limited_next_by": "gpu"},
                {"cause": "disk", "speedup": 1.01}]}]
        });
        let truth = [serde_json::json!({"cause": "host_compute"})];
        let p = predicted(&report, &truth, &[]).unwrap();
        assert_eq!(p.top, "none");
        let w = p.what_if.as_ref().unwrap();
        assert_eq!(
            (w.speedup, w.low, w.next.as_deref()),
            (3.0, Some(2.8), Some("gpu"))
        );
        assert_eq!(p.largest, Some(("host_compute".into(), 3.0)));
        let o = Outcome {
            predicted: p,
            measured: Some(2.5),
            jobs: None,
        };
        assert!((error(&o).unwrap() - 0.2).abs() < 1e-9);
    }
}
