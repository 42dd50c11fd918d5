//! `check`: absolute budgets for a run, for a team with no baseline yet.
//!
//! A budget file is TOML, one limit per line:
//! ```toml
//! idle = "15%"            # all idle time, at most this share of GPU time
//! dataloader_cpu = "5%"   # one cause's idle time, at most
//! busy = "80%"            # the busy share, at least
//! lost_events = 0         # events the kernel could not deliver, at most
//! step_ms_p50 = "120ms"   # the training step's median time, at most (p90, p99 too)
//! ```
use serde::Serialize;

use super::diff::{BUSY, IDLE};
use super::input::{InputError, Run};
use crate::attribution::Cause;

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// A share of GPU time, at most.
    AtMost(f64),
    /// A share of GPU time, at least.
    AtLeast(f64),
    /// A count, at most.
    CountAtMost(u64),
    /// A step time, ms, at most.
    MsAtMost(f64),
}

/// The step-time budgets, by key, and the percentile each reads.
const STEP_BUDGETS: [(&str, u32); 3] = [
    ("step_ms_p50", 50),
    ("step_ms_p90", 90),
    ("step_ms_p99", 99),
];

/// `"120ms"`, `"0.12s"` or a bare number of milliseconds.
fn millis(file: &str, key: &str, v: &toml::Value) -> Result<f64, InputError> {
    let bad = || {
        InputError::new(
            file,
            format!("`{key}` must be a step time like \"120ms\" or \"0.5s\", not {v}"),
        )
    };
    let ms = match v {
        toml::Value::Integer(n) => *n as f64,
        toml::Value::Float(f) => *f,
        toml::Value::String(s) => {
            let s = s.trim();
            let (num, scale) = match (s.strip_suffix("ms"), s.strip_suffix('s')) {
                (Some(n), _) => (n, 1.0),
                (None, Some(n)) => (n, 1e3),
                (None, None) => (s, 1.0),
            };
            num.trim().parse::<f64>().map_err(|_| bad())? * scale
        }
        _ => return Err(bad()),
    };
    if !(ms.is_finite() && ms > 0.0) {
        return Err(bad());
    }
    Ok(ms)
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Limit {
    pub name: String,
    pub bound: Bound,
}

/// The limits of a budget file, in its order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Budget {
    pub file: String,
    pub limits: Vec<Limit>,
}

fn percent(file: &str, key: &str, v: &toml::Value) -> Result<f64, InputError> {
    let bad = || {
        InputError::new(
            file,
            format!("`{key}` must be a share of GPU time like \"5%\", not {v}"),
        )
    };
    let text = v.as_str().ok_or_else(bad)?;
    let pct: f64 = text
        .trim()
        .strip_suffix('%')
        .ok_or_else(bad)?
        .trim()
        .parse()
        .map_err(|_| bad())?;
    if !(0.0..=100.0).contains(&pct) {
        return Err(bad());
    }
    Ok(pct / 100.0)
}

impl Budget {
    pub fn parse(text: &str, file: &str) -> Result<Budget, InputError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| InputError::new(file, e.message().to_owned()))?;
        let mut limits = Vec::new();
        for (key, v) in &table {
            let bound = match key.as_str() {
                "lost_events" => Bound::CountAtMost(
                    v.as_integer()
                        .and_then(|n| u64::try_from(n).ok())
                        .ok_or_else(|| {
                            InputError::new(file, "`lost_events` must be a count, like 0")
                        })?,
                ),
                BUSY => Bound::AtLeast(percent(file, key, v)?),
                k if STEP_BUDGETS.iter().any(|(name, _)| *name == k) => {
                    Bound::MsAtMost(millis(file, key, v)?)
                }
                k if k == IDLE || Cause::from_name(k).is_some() => {
                    Bound::AtMost(percent(file, key, v)?)
                }
                k => {
                    let causes: Vec<&str> = Cause::ALL.iter().map(|c| c.name()).collect();
                    return Err(InputError::new(
                        file,
                        format!(
                            "unknown budget `{k}`; one of: idle, busy, lost_events, \
                             step_ms_p50, step_ms_p90, step_ms_p99, {}",
                            causes.join(", ")
                        ),
                    ));
                }
            };
            limits.push(Limit {
                name: key.clone(),
                bound,
            });
        }
        if limits.is_empty() {
            return Err(InputError::new(file, "sets no budget"));
        }
        Ok(Budget {
            file: file.to_owned(),
            limits,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckRow {
    /// `None` for the run-wide `lost_events`.
    pub gpu: Option<u32>,
    pub name: String,
    pub value: f64,
    pub bound: Bound,
    pub pass: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckReport {
    pub run: String,
    pub budget: String,
    pub rows: Vec<CheckRow>,
    pub failures: usize,
}

impl CheckReport {
    /// 0: within budget; 1: over it.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.failures > 0)
    }
}

pub fn check(run: &Run, budget: &Budget) -> Result<CheckReport, InputError> {
    let needs_gpu = budget
        .limits
        .iter()
        .any(|l| !matches!(l.bound, Bound::CountAtMost(_)));
    if needs_gpu && run.gpus.is_empty() {
        return Err(InputError::new(
            &run.file,
            "has no GPU utilization samples: its GPU budgets cannot be checked",
        ));
    }
    let steps = budget
        .limits
        .iter()
        .any(|l| matches!(l.bound, Bound::MsAtMost(_)));
    if steps && run.gpus.iter().all(|g| g.step_ms.is_none()) {
        return Err(InputError::new(
            &run.file,
            "has no steady training steps on any GPU: its step budgets cannot be checked",
        ));
    }
    let mut rows = Vec::new();
    for limit in &budget.limits {
        match limit.bound {
            Bound::MsAtMost(max) => {
                let q = STEP_BUDGETS
                    .iter()
                    .find(|(name, _)| *name == limit.name)
                    .map_or(50, |(_, q)| *q);
                for g in &run.gpus {
                    let Some(t) = g.step_ms else {
                        continue;
                    };
                    let value = match q {
                        50 => t.p50,
                        90 => t.p90,
                        _ => t.p99,
                    };
                    rows.push(CheckRow {
                        gpu: Some(g.index),
                        name: limit.name.clone(),
                        value,
                        bound: limit.bound,
                        pass: value <= max + 1e-9,
                    });
                }
            }
            Bound::CountAtMost(max) => rows.push(CheckRow {
                gpu: None,
                name: limit.name.clone(),
                value: run.lost_events as f64,
                bound: limit.bound,
                pass: run.lost_events <= max,
            }),
            Bound::AtMost(_) | Bound::AtLeast(_) => {
                for g in &run.gpus {
                    let ns: u64 = match limit.name.as_str() {
                        IDLE => g.idle_by_cause.values().sum(),
                        BUSY => g.busy_ns,
                        cause => g.idle_by_cause.get(cause).copied().unwrap_or(0),
                    };
                    let value = ns as f64 / g.observed_ns.max(1) as f64;
                    let pass = match limit.bound {
                        Bound::AtMost(max) => value <= max + 1e-12,
                        Bound::AtLeast(min) => value + 1e-12 >= min,
                        Bound::CountAtMost(_) | Bound::MsAtMost(_) => {
                            unreachable!("handled above")
                        }
                    };
                    rows.push(CheckRow {
                        gpu: Some(g.index),
                        name: limit.name.clone(),
                        value,
                        bound: limit.bound,
                        pass,
                    });
                }
            }
        }
    }
    let failures = rows.iter().filter(|r| !r.pass).count();
    Ok(CheckReport {
        run: run.file.clone(),
        budget: budget.file.clone(),
        rows,
        failures,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::input::GpuRun;
    use super::*;

    fn run() -> Run {
        Run {
            file: "run.rec".into(),
            gpus: vec![GpuRun {
                index: 0,
                observed_ns: 1000,
                busy_ns: 700,
                idle_by_cause: BTreeMap::from([("disk".into(), 200), ("unknown".into(), 100)]),
                ..GpuRun::default()
            }],
            lost_events: 3,
            ..Run::default()
        }
    }

    #[test]
    fn budgets_pass_and_fail_by_share_and_count() {
        let b = Budget::parse(
            "idle = \"30%\"\ndisk = \"15%\"\nbusy = \"70%\"\nlost_events = 0\n",
            "b.toml",
        )
        .unwrap();
        let r = check(&run(), &b).unwrap();
        let verdicts: Vec<(&str, bool)> =
            r.rows.iter().map(|r| (r.name.as_str(), r.pass)).collect();
        assert_eq!(
            verdicts,
            [
                ("busy", true),
                ("disk", false),
                ("idle", true),
                ("lost_events", false)
            ]
        );
        assert_eq!(r.exit_code(), 1);
        let ok = Budget::parse("disk = \"20%\"", "b.toml").unwrap();
        assert_eq!(check(&run(), &ok).unwrap().exit_code(), 0);
    }

    #[test]
    fn a_step_budget_reads_the_steps_percentile_and_needs_steps() {
        let mut r = run();
        let b = Budget::parse("step_ms_p50 = \"120ms\"\nstep_ms_p99 = \"0.2s\"", "b.toml").unwrap();
        let e = check(&r, &b).unwrap_err();
        assert!(e.reason.contains("no steady training steps"), "{e}");
        r.gpus[0].step_ms = Some(crate::attribution::StepTimes {
            p50: 100.0,
            p90: 150.0,
            p99: 250.0,
        });
        let c = check(&r, &b).unwrap();
        let verdicts: Vec<(&str, f64, bool)> = c
            .rows
            .iter()
            .map(|r| (r.name.as_str(), r.value, r.pass))
            .collect();
        assert_eq!(
            verdicts,
            [("step_ms_p50", 100.0, true), ("step_ms_p99", 250.0, false)]
        );
        assert_eq!(c.exit_code(), 1);
        assert_eq!(
            Budget::parse("step_ms_p90 = 90", "b.toml").unwrap().limits[0].bound,
            Bound::MsAtMost(90.0)
        );
    }

    #[test]
    fn a_bad_budget_names_its_file_and_key() {
        for (text, want) in [
            ("disk = 5", "\"5%\""),
            ("disks = \"5%\"", "unknown budget `disks`"),
            ("lost_events = \"0\"", "count"),
            ("idle = \"150%\"", "share"),
            ("", "sets no budget"),
            ("idle = ", ""),
            ("step_ms_p50 = \"fast\"", "step time"),
            ("step_ms_p50 = \"-3ms\"", "step time"),
        ] {
            let e = Budget::parse(text, "budget.toml").unwrap_err();
            assert_eq!(e.file, "budget.toml");
            assert!(e.reason.contains(want), "{text}: {e}");
        }
    }
}
