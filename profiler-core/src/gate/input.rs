//! What the regression gate reads of a run: per GPU, its observed and busy time, idle time by
//! cause, and the same per second. Read from the JSON report (`report --format json`), so a
//! recording and a kept JSON baseline go through the same path and give the same verdict.
use std::collections::BTreeMap;

use serde_json::Value;

use crate::report::json::{JSON_VERSION, JsonReport};
use crate::report::model::Report;

/// A run the gate could not read: which file, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct InputError {
    pub file: String,
    pub reason: String,
}

impl InputError {
    pub fn new(file: &str, reason: impl Into<String>) -> Self {
        InputError {
            file: file.to_owned(),
            reason: reason.into(),
        }
    }
}

/// One second of one GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Second {
    pub observed_ns: u64,
    pub idle_by_cause: BTreeMap<String, u64>,
}

/// One GPU of one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuRun {
    pub index: u32,
    /// The NCCL rank that ran on it, when the report names one.
    pub rank: Option<u32>,
    pub name: String,
    pub observed_ns: u64,
    pub busy_ns: u64,
    pub idle_by_cause: BTreeMap<String, u64>,
    pub seconds: Vec<Second>,
    /// Each cause's evidence over all its windows, as the JSON report has it.
    pub evidence: BTreeMap<String, Value>,
}

/// One run: a recording or a JSON report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Run {
    /// The file it came from, as given.
    pub file: String,
    /// By NVML index.
    pub gpus: Vec<GpuRun>,
    pub lost_events: u64,
    pub duration_ns: u64,
    /// Bytes that missed the page cache, per file.
    pub files: BTreeMap<String, u64>,
}

fn u64_at(v: &Value, key: &str, file: &str, what: &str) -> Result<u64, InputError> {
    v.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| InputError::new(file, format!("{what} has no number `{key}`")))
}

fn by_cause(
    v: &Value,
    key: &str,
    file: &str,
    what: &str,
) -> Result<BTreeMap<String, u64>, InputError> {
    let map = v
        .get(key)
        .and_then(Value::as_object)
        .ok_or_else(|| InputError::new(file, format!("{what} has no map `{key}`")))?;
    map.iter()
        .map(|(cause, ns)| {
            ns.as_u64().map(|ns| (cause.clone(), ns)).ok_or_else(|| {
                InputError::new(file, format!("{what}: `{key}.{cause}` is not a number"))
            })
        })
        .collect()
}

impl Run {
    /// A recording's run, from the parts of its JSON report the gate reads (the rest of the
    /// report, every thread and process, is never built into a JSON value).
    pub fn from_report(report: &Report<'_>, file: &str) -> Result<Run, InputError> {
        let j = JsonReport::new(report);
        let part = |v: Result<Value, serde_json::Error>| v.unwrap_or(Value::Null);
        let json = serde_json::json!({
            "version": j.version,
            "gpus": part(serde_json::to_value(&j.gpus)),
            "ranks": part(serde_json::to_value(j.ranks)),
            "lost_events": j.lost_events,
            "duration_ns": j.duration_ns,
            "page_cache_files": part(serde_json::to_value(&j.page_cache_files)),
        });
        Run::from_json(&json, file)
    }

    /// Reads a JSON report of this version of stallscope.
    pub fn from_json(report: &Value, file: &str) -> Result<Run, InputError> {
        match report.get("version").and_then(Value::as_u64) {
            Some(v) if v == u64::from(JSON_VERSION) => {}
            Some(v) => {
                return Err(InputError::new(
                    file,
                    format!(
                        "a JSON report of version {v}; this stallscope reads version {JSON_VERSION}"
                    ),
                ));
            }
            None => {
                return Err(InputError::new(
                    file,
                    "not a stallscope JSON report (no \"version\")",
                ));
            }
        }
        let gpus = report
            .get("gpus")
            .and_then(Value::as_array)
            .ok_or_else(|| InputError::new(file, "the report has no \"gpus\" list"))?;
        let mut out = Vec::with_capacity(gpus.len());
        for (i, g) in gpus.iter().enumerate() {
            let what = format!("gpus[{i}]");
            let seconds = g
                .get("seconds")
                .and_then(Value::as_array)
                .ok_or_else(|| InputError::new(file, format!("{what} has no \"seconds\" list")))?
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let what = format!("{what}.seconds[{k}]");
                    Ok(Second {
                        observed_ns: u64_at(s, "observed_ns", file, &what)?,
                        idle_by_cause: by_cause(s, "idle_by_cause", file, &what)?,
                    })
                })
                .collect::<Result<Vec<_>, InputError>>()?;
            let index = u64_at(g, "index", file, &what)? as u32;
            let rank = report["ranks"]["ranks"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["gpu"].as_u64() == Some(u64::from(index)))
                .and_then(|r| r["rank"].as_u64())
                .map(|r| r as u32);
            out.push(GpuRun {
                index,
                rank,
                name: g
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                observed_ns: u64_at(g, "observed_ns", file, &what)?,
                busy_ns: u64_at(g, "busy_ns", file, &what)?,
                // Idle plus the time NVML counted busy while the GPU only waited in
                // collectives, where the report has it (older reports have idle only).
                idle_by_cause: if g.get("lost_by_cause").is_some() {
                    by_cause(g, "lost_by_cause", file, &what)?
                } else {
                    by_cause(g, "idle_by_cause", file, &what)?
                },
                seconds,
                evidence: g
                    .get("causes")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| Some((c["cause"].as_str()?.to_owned(), c["evidence"].clone())))
                    .collect(),
            });
        }
        out.sort_by_key(|g| g.index);
        Ok(Run {
            file: file.to_owned(),
            gpus: out,
            lost_events: report
                .get("lost_events")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            duration_ns: report
                .get("duration_ns")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            files: report
                .get("page_cache_files")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|f| Some((f["name"].as_str()?.to_owned(), f["bytes"].as_u64()?)))
                .fold(BTreeMap::new(), |mut m, (name, bytes)| {
                    *m.entry(name).or_default() += bytes;
                    m
                }),
        })
    }
}
