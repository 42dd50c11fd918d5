//! `diff`: did the new runs make the GPU wait more, and on what?
//!
//! Per GPU, each cause's share of GPU time (and the idle share, and the busy share) on each
//! side, with its noise (see [`super::noise`]). A share is a regression when it rose by at
//! least the threshold (3 points of GPU time unless told otherwise) *and* by more than
//! `Z_95` standard errors of the difference: one-sided 95% confidence that it rose at all.
//! A fall by as much is an improvement, reported and never failed.
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::evidence::{CauseChange, changes};
use super::input::{GpuRun, InputError, Run};
use super::noise::{Z_95, combine, ratio_se};
use crate::attribution::Cause;

/// Percentage points of GPU time a share must rise by to fail, unless told otherwise.
pub const DEFAULT_THRESHOLD_PP: f64 = 3.0;
/// The share of all idle time, whatever its cause.
pub const IDLE: &str = "idle";
pub const BUSY: &str = "busy";

/// Thresholds in percentage points: per metric (a cause's name or `idle`), else `any`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Thresholds {
    pub any: f64,
    pub by_metric: BTreeMap<String, f64>,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            any: DEFAULT_THRESHOLD_PP,
            by_metric: BTreeMap::new(),
        }
    }
}

impl Thresholds {
    /// From `NAME=PP` specs, NAME a cause, `idle` or `any`.
    pub fn parse(specs: &[String]) -> Result<Self, String> {
        let mut t = Thresholds::default();
        for spec in specs {
            let (name, pp) = spec
                .split_once('=')
                .ok_or_else(|| format!("--threshold {spec:?}: want NAME=PP, e.g. disk=2"))?;
            let pp: f64 = pp
                .trim()
                .trim_end_matches("pp")
                .parse()
                .ok()
                .filter(|p: &f64| p.is_finite() && *p >= 0.0)
                .ok_or_else(|| format!("--threshold {spec:?}: {pp:?} is not a number of points"))?;
            match name.trim() {
                "any" => t.any = pp,
                n if n == IDLE || Cause::from_name(n).is_some() => {
                    t.by_metric.insert(n.to_owned(), pp);
                }
                n => {
                    let causes: Vec<&str> = Cause::ALL.iter().map(|c| c.name()).collect();
                    return Err(format!(
                        "--threshold {spec:?}: {n:?} is not a cause; one of: any, idle, {}",
                        causes.join(", ")
                    ));
                }
            }
        }
        Ok(t)
    }

    pub fn of(&self, metric: &str) -> f64 {
        self.by_metric.get(metric).copied().unwrap_or(self.any)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Regression,
    Improvement,
    /// Within the threshold or the noise.
    Unchanged,
    /// The busy share fell: shown, not failed (the idle share's row gates it).
    Worse,
    /// The busy share rose.
    Better,
}

/// One share on one GPU, base against new. Shares and deltas are fractions of GPU time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub gpu: u32,
    /// The NCCL rank on that GPU when every run names the ranks: runs are then matched by
    /// rank, whichever GPU it ran on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub metric: String,
    pub base: f64,
    pub new: f64,
    pub delta: f64,
    /// `Z_95` standard errors of the delta: a rise within it may be chance.
    pub noise: f64,
    /// In fractions of GPU time.
    pub threshold: f64,
    pub change: Change,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiffReport {
    pub base: Vec<String>,
    pub new: Vec<String>,
    pub rows: Vec<Row>,
    pub regressions: usize,
    /// What changed behind each regressed cause.
    pub changes: Vec<CauseChange>,
    /// Each GPU's step time and the gains its causes' fixes would give, base against new:
    /// shown beside the shares, never failing the diff.
    pub steps: Vec<StepRow>,
    pub method: &'static str,
}

/// One GPU's median step (ms, the mean over a side's runs that found steady steps) and what
/// fixing each cause would give, base against new.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepRow {
    pub gpu: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub base_ms: Option<f64>,
    pub new_ms: Option<f64>,
    pub gains: Vec<Gain>,
}

/// A cause's predicted speedup if fixed, the mean over a side's runs that predicted one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Gain {
    pub cause: String,
    pub base: Option<f64>,
    pub new: Option<f64>,
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// GPU `i`'s step row.
fn step_row(base: &[Run], new: &[Run], i: usize, rank: Option<u32>) -> StepRow {
    let p50 = |runs: &[Run]| mean(runs.iter().filter_map(|r| r.gpus[i].step_ms.map(|t| t.p50)));
    let causes: BTreeSet<&str> = base
        .iter()
        .chain(new)
        .flat_map(|r| r.gpus[i].gains.keys().map(String::as_str))
        .collect();
    let gain =
        |runs: &[Run], c: &str| mean(runs.iter().filter_map(|r| r.gpus[i].gains.get(c).copied()));
    StepRow {
        gpu: base[0].gpus[i].index,
        rank,
        base_ms: p50(base),
        new_ms: p50(new),
        gains: causes
            .into_iter()
            .map(|c| Gain {
                cause: c.to_owned(),
                base: gain(base, c),
                new: gain(new, c),
            })
            .collect(),
    }
}

impl DiffReport {
    /// 0: no regression; 1: a regression.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.regressions > 0)
    }

    pub fn regressed(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.change == Change::Regression)
    }
}

pub const METHOD: &str = "a share (of GPU time) regresses when it rose by at least its threshold \
     and by more than 1.645 standard errors of the difference (one-sided 95%); each side's error \
     is the larger of the spread between its runs and a circular block bootstrap (2000 \
     resamples, blocks of ⌈n^⅓⌉ seconds) over each run's seconds";

/// The per-second numerators of `metric` on a GPU, with the seconds' observed time.
fn series(g: &GpuRun, metric: &str) -> (Vec<f64>, Vec<f64>) {
    let den: Vec<f64> = g.seconds.iter().map(|s| s.observed_ns as f64).collect();
    let num = g
        .seconds
        .iter()
        .map(|s| {
            let idle: u64 = s.idle_by_cause.values().sum();
            (match metric {
                IDLE => idle,
                BUSY => s.observed_ns.saturating_sub(idle),
                cause => s.idle_by_cause.get(cause).copied().unwrap_or(0),
            }) as f64
        })
        .collect();
    (num, den)
}

fn share(g: &GpuRun, metric: &str) -> f64 {
    if g.observed_ns == 0 {
        return 0.0;
    }
    let ns = match metric {
        IDLE => g.idle_by_cause.values().sum(),
        BUSY => g.busy_ns,
        cause => g.idle_by_cause.get(cause).copied().unwrap_or(0),
    };
    ns as f64 / g.observed_ns as f64
}

/// A side's share of `metric` on GPU `i`, and its standard error.
fn side(runs: &[Run], i: usize, metric: &str) -> (f64, f64) {
    let each: Vec<(f64, f64)> = runs
        .iter()
        .map(|r| {
            let g = &r.gpus[i];
            let (num, den) = series(g, metric);
            (share(g, metric), ratio_se(&num, &den))
        })
        .collect();
    combine(&each)
}

/// What GPUs are matched by across runs: the ranks when every GPU of every run names one,
/// else the NVML indices.
fn keys(r: &Run, by_rank: bool) -> Vec<u32> {
    r.gpus
        .iter()
        .map(|g| {
            if by_rank {
                g.rank.unwrap_or(u32::MAX)
            } else {
                g.index
            }
        })
        .collect()
}

/// Every run of both sides must have the same GPUs (or ranks) as the first base run.
fn check_gpus(base: &[Run], new: &[Run], by_rank: bool) -> Result<(), InputError> {
    let first = base
        .first()
        .or(new.first())
        .ok_or_else(|| InputError::new("-", "nothing to compare"))?;
    if first.gpus.is_empty() {
        return Err(InputError::new(
            &first.file,
            "has no GPU utilization samples: nothing to compare",
        ));
    }
    let what = if by_rank { "ranks" } else { "GPUs" };
    for r in base.iter().chain(new) {
        if keys(r, by_rank) != keys(first, by_rank) {
            return Err(InputError::new(
                &r.file,
                format!(
                    "has {what} {:?}, {} has {:?}: runs of different {what} cannot be compared",
                    keys(r, by_rank),
                    first.file,
                    keys(first, by_rank)
                ),
            ));
        }
    }
    Ok(())
}

/// Compares the new runs against the base runs.
pub fn diff<'a>(
    base: &'a [Run],
    new: &'a [Run],
    thresholds: &Thresholds,
) -> Result<DiffReport, InputError> {
    for (runs, what) in [(base, "BASE"), (new, "NEW")] {
        if runs.is_empty() {
            return Err(InputError::new(what, "no runs on this side"));
        }
    }
    let by_rank = base
        .iter()
        .chain(new)
        .all(|r| !r.gpus.is_empty() && r.gpus.iter().all(|g| g.rank.is_some()));
    // Matched by rank, each run's GPUs go in rank order (a copy only then).
    let in_order = |runs: &'a [Run]| -> Cow<'a, [Run]> {
        if !by_rank {
            return Cow::Borrowed(runs);
        }
        let mut runs = runs.to_vec();
        for r in &mut runs {
            r.gpus.sort_by_key(|g| g.rank);
        }
        Cow::Owned(runs)
    };
    let (base, new) = (in_order(base), in_order(new));
    let (base, new) = (&base[..], &new[..]);
    check_gpus(base, new, by_rank)?;
    let mut rows = Vec::new();
    let mut regressed_causes = Vec::new();
    for (i, g) in base[0].gpus.iter().enumerate() {
        let causes: BTreeSet<&str> = base
            .iter()
            .chain(new)
            .flat_map(|r| r.gpus[i].idle_by_cause.keys().map(String::as_str))
            .collect();
        let metrics = [BUSY, IDLE].into_iter().chain(
            Cause::ALL
                .iter()
                .map(|c| c.name())
                .filter(|c| causes.contains(c)),
        );
        for metric in metrics {
            let (b, b_se) = side(base, i, metric);
            let (n, n_se) = side(new, i, metric);
            let delta = n - b;
            let noise = Z_95 * (b_se * b_se + n_se * n_se).sqrt();
            let threshold = thresholds.of(metric) / 100.0;
            // A tiny margin: the same input twice must read as unchanged however the floats fall.
            let beyond = |d: f64| d >= threshold - 1e-12 && d > noise + 1e-12;
            let change = match (metric == BUSY, beyond(delta), beyond(-delta)) {
                (false, true, _) => Change::Regression,
                (false, _, true) => Change::Improvement,
                (true, true, _) => Change::Better,
                (true, _, true) => Change::Worse,
                _ => Change::Unchanged,
            };
            if change == Change::Regression && metric != IDLE {
                regressed_causes.push((i, metric.to_owned()));
            }
            rows.push(Row {
                gpu: g.index,
                rank: g.rank.filter(|_| by_rank),
                metric: metric.to_owned(),
                base: b,
                new: n,
                delta,
                noise,
                threshold,
                change,
            });
        }
    }
    let regressions = rows
        .iter()
        .filter(|r| r.change == Change::Regression)
        .count();
    Ok(DiffReport {
        base: base.iter().map(|r| r.file.clone()).collect(),
        new: new.iter().map(|r| r.file.clone()).collect(),
        rows,
        regressions,
        changes: changes(base, new, &regressed_causes),
        steps: (0..base[0].gpus.len())
            .map(|i| {
                let rank = base[0].gpus[i].rank.filter(|_| by_rank);
                step_row(base, new, i, rank)
            })
            .filter(|s| s.base_ms.is_some() || s.new_ms.is_some() || !s.gains.is_empty())
            .collect(),
        method: METHOD,
    })
}

#[cfg(test)]
mod tests {
    use super::super::input::Second;
    use super::*;

    const SEC: u64 = 1_000_000_000;

    /// A one-GPU run of `secs` seconds, each idle `idle(s)` of a second for `cause`.
    fn run(file: &str, secs: usize, cause: &str, idle: impl Fn(usize) -> f64) -> Run {
        let seconds: Vec<Second> = (0..secs)
            .map(|s| Second {
                observed_ns: SEC,
                idle_by_cause: BTreeMap::from([(cause.to_owned(), (idle(s) * SEC as f64) as u64)]),
            })
            .collect();
        let idle_ns: u64 = seconds.iter().map(|s| s.idle_by_cause[cause]).sum();
        Run {
            file: file.into(),
            gpus: vec![GpuRun {
                index: 0,
                rank: None,
                name: "sim".into(),
                observed_ns: secs as u64 * SEC,
                busy_ns: secs as u64 * SEC - idle_ns,
                idle_by_cause: BTreeMap::from([(cause.to_owned(), idle_ns)]),
                seconds,
                evidence: BTreeMap::new(),
                ..GpuRun::default()
            }],
            ..Run::default()
        }
    }

    /// The step time and the predicted gains come side by side, from the runs that have them.
    #[test]
    fn step_times_and_predicted_gains_are_shown_base_against_new() {
        let with = |file: &str, p50: Option<f64>, gains: &[(&str, f64)]| {
            let mut r = run(file, 10, "disk", |_| 0.2);
            r.gpus[0].step_ms = p50.map(|p50| crate::attribution::StepTimes {
                p50,
                p90: p50,
                p99: p50,
            });
            r.gpus[0].gains = gains.iter().map(|(c, x)| ((*c).to_owned(), *x)).collect();
            r
        };
        let base = [
            with("b1", Some(100.0), &[("disk", 1.5)]),
            with("b2", Some(110.0), &[("disk", 1.7)]),
            with("b3", None, &[]),
        ];
        let new = [with("n1", Some(150.0), &[("host_compute", 2.0)])];
        let d = diff(&base, &new, &Thresholds::default()).unwrap();
        assert_eq!(d.steps.len(), 1);
        let s = &d.steps[0];
        assert_eq!((s.base_ms, s.new_ms), (Some(105.0), Some(150.0)));
        let gains: Vec<(&str, Option<f64>, Option<f64>)> = s
            .gains
            .iter()
            .map(|g| (g.cause.as_str(), g.base, g.new))
            .collect();
        assert_eq!(
            gains,
            [("disk", Some(1.6), None), ("host_compute", None, Some(2.0))]
        );
        assert_eq!(d.exit_code(), 0, "steps never gate");
        let none = diff(&base[2..], &base[2..], &Thresholds::default()).unwrap();
        assert!(none.steps.is_empty());
    }

    fn row<'a>(d: &'a DiffReport, metric: &str) -> &'a Row {
        d.rows.iter().find(|r| r.metric == metric).unwrap()
    }

    #[test]
    fn the_same_run_twice_is_unchanged_with_every_delta_zero() {
        let a = run("a", 20, "disk", |s| 0.1 + 0.05 * (s % 3) as f64);
        let one = std::slice::from_ref(&a);
        let d = diff(one, one, &Thresholds::default()).unwrap();
        assert_eq!(d.exit_code(), 0);
        assert!(
            d.rows
                .iter()
                .all(|r| r.delta == 0.0 && r.change == Change::Unchanged),
            "{d:?}"
        );
    }

    #[test]
    fn a_steady_rise_past_the_threshold_fails_and_names_the_cause() {
        let base = run("base", 20, "dataloader_cpu", |_| 0.10);
        let new = run("new", 20, "dataloader_cpu", |_| 0.15);
        let d = diff(&[base], &[new], &Thresholds::default()).unwrap();
        assert_eq!(d.exit_code(), 1);
        let names: Vec<&str> = d.regressed().map(|r| r.metric.as_str()).collect();
        assert_eq!(names, ["idle", "dataloader_cpu"]);
        assert_eq!(row(&d, BUSY).change, Change::Worse);
        assert!((row(&d, "dataloader_cpu").delta - 0.05).abs() < 1e-9);
    }

    #[test]
    fn a_rise_within_the_runs_own_noise_is_not_a_regression() {
        // One slow phase decides the share: which seconds were recorded matters a lot.
        let base = run("base", 12, "disk", |s| if s < 2 { 0.9 } else { 0.0 });
        let new = run("new", 12, "disk", |s| if s < 3 { 0.9 } else { 0.0 });
        let d = diff(&[base], &[new], &Thresholds::default()).unwrap();
        let disk = row(&d, "disk");
        assert!(disk.delta > 0.05 && disk.noise > disk.delta, "{disk:?}");
        assert_eq!(disk.change, Change::Unchanged);
        assert_eq!(d.exit_code(), 0);
    }

    #[test]
    fn a_fall_is_an_improvement_and_never_fails() {
        let base = run("base", 20, "disk", |_| 0.20);
        let new = run("new", 20, "disk", |_| 0.05);
        let d = diff(&[base], &[new], &Thresholds::default()).unwrap();
        assert_eq!(row(&d, "disk").change, Change::Improvement);
        assert_eq!(row(&d, BUSY).change, Change::Better);
        assert_eq!(d.exit_code(), 0);
    }

    #[test]
    fn thresholds_by_cause_and_for_any() {
        let base = run("base", 20, "disk", |_| 0.10);
        let new = run("new", 20, "disk", |_| 0.14);
        let t = Thresholds::parse(&["any=5".into(), "disk=3".into()]).unwrap();
        let d = diff(std::slice::from_ref(&base), std::slice::from_ref(&new), &t).unwrap();
        let names: Vec<&str> = d.regressed().map(|r| r.metric.as_str()).collect();
        assert_eq!(names, ["disk"]);
        let lax = Thresholds::parse(&["disk=6".into(), "idle=6".into()]).unwrap();
        assert_eq!(diff(&[base], &[new], &lax).unwrap().exit_code(), 0);
        assert!(
            Thresholds::parse(&["disks=3".into()])
                .unwrap_err()
                .contains("not a cause")
        );
        assert!(Thresholds::parse(&["disk".into()]).is_err());
        assert!(Thresholds::parse(&["disk=-1".into()]).is_err());
    }

    #[test]
    fn repeated_runs_count_their_spread() {
        let base: Vec<Run> = [0.08, 0.12, 0.10]
            .iter()
            .map(|&x| run("b", 10, "disk", move |_| x))
            .collect();
        let new: Vec<Run> = [0.10, 0.18, 0.14]
            .iter()
            .map(|&x| run("n", 10, "disk", move |_| x))
            .collect();
        let d = diff(&base, &new, &Thresholds::default()).unwrap();
        let disk = row(&d, "disk");
        assert!((disk.delta - 0.04).abs() < 1e-9);
        // Between-run errors: 0.02/√3 and 0.04/√3; noise = 1.645·√(sum of squares) ≈ 0.042.
        assert!((disk.noise - 0.0425).abs() < 0.001, "{disk:?}");
        assert_eq!(disk.change, Change::Unchanged);
    }

    #[test]
    fn different_gpus_name_the_file() {
        let a = run("a.json", 5, "disk", |_| 0.1);
        let mut b = run("b.rec", 5, "disk", |_| 0.1);
        b.gpus.push(GpuRun {
            index: 1,
            ..b.gpus[0].clone()
        });
        let e = diff(&[a], &[b], &Thresholds::default()).unwrap_err();
        assert_eq!(e.file, "b.rec");
        assert!(e.reason.contains("different GPUs"), "{e}");
    }

    #[test]
    fn named_ranks_are_matched_whichever_gpu_they_ran_on() {
        let ranked = |file: &str, ranks: [(u32, u32, f64); 2]| {
            let mut r = run(file, 10, "nccl_wait", |_| 0.0);
            let g = r.gpus[0].clone();
            r.gpus = ranks
                .iter()
                .map(|&(index, rank, idle)| {
                    let mut one = run(file, 10, "nccl_wait", move |_| idle).gpus.remove(0);
                    one.index = index;
                    one.rank = Some(rank);
                    one.name.clone_from(&g.name);
                    one
                })
                .collect();
            r
        };
        // Rank 1 waits 30% in both runs; it ran on GPU 1, then on GPU 0.
        let base = ranked("base", [(0, 0, 0.05), (1, 1, 0.30)]);
        let new = ranked("new", [(0, 1, 0.30), (1, 0, 0.05)]);
        let d = diff(&[base], &[new], &Thresholds::default()).unwrap();
        assert_eq!(d.exit_code(), 0, "{d:?}");
        assert!(
            d.rows
                .iter()
                .all(|r| r.delta.abs() < 1e-9 && r.rank.is_some()),
            "{d:?}"
        );
    }
}
