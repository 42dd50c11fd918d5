//! What the regression gate reads of a run: per GPU, its observed and busy time, idle time by
//! cause, and the same per second. Read from the JSON report (`report --format json`), so a
//! recording and a kept JSON baseline go through the same path and give the same verdict.
use std::collections::BTreeMap;

use crate::attribution::Evidence;
pub use crate::report::json::ReadError as InputError;
use crate::report::json::{JsonReport, read_report};
use crate::report::model::Report;

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
    pub evidence: BTreeMap<String, Evidence>,
    /// Its feeder's step time, when the report found steady steps.
    pub step_ms: Option<crate::attribution::StepTimes>,
    /// The speedup each cause's fix would give (the report's what-if).
    pub gains: BTreeMap<String, f64>,
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

impl Run {
    /// A recording's run, from its report.
    pub fn from_report(report: &Report<'_>, file: &str) -> Run {
        Run::from_doc(&JsonReport::new(report), file)
    }

    /// A JSON report's run (`report --format json`), read typed.
    pub fn from_json(bytes: &[u8], file: &str) -> Result<Run, InputError> {
        Ok(Run::from_doc(&read_report(bytes, file)?, file))
    }

    /// The parts of a report the gate compares.
    pub fn from_doc(doc: &JsonReport<'_>, file: &str) -> Run {
        let by_cause =
            |m: &BTreeMap<std::borrow::Cow<'static, str>, u64>| -> BTreeMap<String, u64> {
                m.iter().map(|(c, ns)| (c.to_string(), *ns)).collect()
            };
        let mut gpus: Vec<GpuRun> = doc
            .gpus
            .iter()
            .map(|g| GpuRun {
                index: g.index,
                rank: doc
                    .ranks
                    .ranks
                    .iter()
                    .find(|r| r.gpu == Some(g.index))
                    .and_then(|r| r.rank),
                name: g.name.to_string(),
                observed_ns: g.observed_ns,
                busy_ns: g.busy_ns,
                // Idle plus the time NVML counted busy while the GPU only waited in
                // collectives, where the report has it (older reports have idle only).
                idle_by_cause: if g.lost_by_cause.is_empty() {
                    by_cause(&g.idle_by_cause)
                } else {
                    by_cause(&g.lost_by_cause)
                },
                seconds: g
                    .seconds
                    .iter()
                    .map(|s| Second {
                        observed_ns: s.observed_ns,
                        idle_by_cause: s
                            .idle_by_cause
                            .iter()
                            .map(|(c, ns)| (c.name().to_owned(), *ns))
                            .collect(),
                    })
                    .collect(),
                evidence: g
                    .causes
                    .iter()
                    .map(|c| (c.cause.name().to_owned(), c.evidence.clone()))
                    .collect(),
                step_ms: g.steps.as_ref().and_then(|s| s.step_ms),
                gains: g
                    .what_if
                    .iter()
                    .map(|w| (w.cause.name().to_owned(), w.speedup))
                    .collect(),
            })
            .collect();
        gpus.sort_by_key(|g| g.index);
        let mut files: BTreeMap<String, u64> = BTreeMap::new();
        for f in doc.page_cache_files.iter() {
            *files.entry(f.name.clone()).or_default() += f.bytes;
        }
        Run {
            file: file.to_owned(),
            gpus,
            lost_events: doc.lost_events,
            duration_ns: doc.duration_ns,
            files,
        }
    }
}
