//! The report cut down to what an assistant reads first (`stallscope mcp`): the verdict, the
//! advice, and per GPU its busy/waiting/idle split, its causes with the thread and the code
//! behind each, its step and what-if estimates. Everything else stays in the report, named
//! in `sections` and given whole by [`section`] on request.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::{live::is_python_frame, report::json::ReportDoc};

/// Causes listed per GPU, the most time first; the rest are in the `gpus` section.
const CAUSES: usize = 5;
/// A cause under this share of a GPU's observed time is left out of the summary.
const MIN_SHARE: f64 = 0.01;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Compact {
    pub duration_s: f64,
    /// The answer in a sentence; absent when no cause reaches the moderate band.
    pub verdict: Option<String>,
    pub verdict_cause: Option<String>,
    /// What to change, the largest expected gain first.
    pub advice: Vec<CompactAdvice>,
    pub gpus: Vec<CompactGpu>,
    /// Causes the recording had no signal to judge, with why: not ruled out.
    pub unchecked_causes: Vec<String>,
    /// Events the kernel could not hand over; non-zero weakens every number.
    pub lost_events: u64,
    /// The report's other parts, each given whole when asked for by name.
    pub sections: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompactAdvice {
    pub cause: String,
    pub gpu: u32,
    pub change: String,
    /// How much faster a step would be once changed (1.6 = 1.6× faster).
    pub expected_speedup: f64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, u64>,
    pub evidence: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompactGpu {
    pub index: u32,
    pub name: String,
    pub busy_pct: f64,
    pub waiting_pct: f64,
    pub idle_pct: f64,
    pub causes: Vec<CompactCause>,
    /// The step time and where it went, or why no step was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<String>,
    /// What fixing each cause would do to the step, the largest gain first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub what_if: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompactCause {
    pub cause: String,
    /// Its idle plus waiting time over the GPU's observed time.
    pub pct: f64,
    /// The thread that spent the most time in the state the cause is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// The innermost Python function of its most frequent stack, else its innermost
    /// user-space frame.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 * 1000.0 / whole as f64).round() / 10.0
    }
}

impl Compact {
    pub fn of(doc: &ReportDoc) -> Self {
        let verdict = doc.verdict.as_deref();
        Self {
            duration_s: (doc.duration_ns as f64 / 1e6).round() / 1e3,
            verdict: verdict.map(|v| v.text.clone()),
            verdict_cause: verdict.and_then(|v| v.cause).map(|c| c.name().to_string()),
            advice: doc
                .advice
                .iter()
                .map(|a| CompactAdvice {
                    cause: a.cause.name().to_string(),
                    gpu: a.gpu,
                    change: a.change.clone(),
                    expected_speedup: a.expected_speedup,
                    settings: a.settings.clone(),
                    evidence: a.evidence.clone(),
                })
                .collect(),
            gpus: doc.gpus.iter().map(compact_gpu).collect(),
            unchecked_causes: doc
                .unchecked_causes
                .iter()
                .map(|u| format!("{}: {}", u.cause.name(), u.reason))
                .collect(),
            lost_events: doc.lost_events,
            sections: sections(doc),
        }
    }
}

fn compact_gpu(g: &crate::report::json::gpu::JsonGpu<'_>) -> CompactGpu {
    let observed = g.observed_ns;
    let mut causes: Vec<CompactCause> = g
        .causes
        .iter()
        .filter(|c| observed > 0 && c.idle_ns as f64 >= MIN_SHARE * observed as f64)
        .map(|c| CompactCause {
            cause: c.cause.name().to_string(),
            pct: pct(c.idle_ns, observed),
            thread: c
                .evidence
                .threads
                .first()
                .map(|t| format!("{} (TID {}, PID {})", t.comm, t.tid, t.pid)),
            code: c.evidence.stacks.first().and_then(|s| code(&s.frames)),
        })
        .collect();
    causes.sort_by(|a, b| b.pct.total_cmp(&a.pct));
    causes.truncate(CAUSES);
    let mut what_if: Vec<_> = g.what_if.iter().collect();
    what_if.sort_by(|a, b| b.speedup.total_cmp(&a.speedup));
    CompactGpu {
        index: g.index,
        name: g.name.to_string(),
        busy_pct: pct(g.busy_ns.saturating_sub(g.waiting_ns), observed),
        waiting_pct: pct(g.waiting_ns, observed),
        idle_pct: pct(g.idle_ns, observed),
        causes,
        steps: g.steps.as_deref().map(|s| s.describe()),
        what_if: what_if.iter().map(|w| w.describe()).collect(),
    }
}

/// The frame to name a stack by, its frames root first.
fn code(frames: &[String]) -> Option<String> {
    let kernel = |f: &&String| f.ends_with("_[k]");
    frames
        .iter()
        .rev()
        .find(|f| is_python_frame(f))
        .or_else(|| frames.iter().rev().find(|f| !kernel(f)))
        .cloned()
}

/// The report as a JSON object, by its field names.
fn fields(doc: &ReportDoc) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(doc) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}

/// The names of the report's parts that hold something.
pub fn sections(doc: &ReportDoc) -> Vec<String> {
    fields(doc)
        .into_iter()
        .filter(|(_, v)| match v {
            serde_json::Value::Null => false,
            serde_json::Value::Array(a) => !a.is_empty(),
            serde_json::Value::Object(o) => !o.is_empty(),
            _ => false,
        })
        .map(|(k, _)| k)
        .collect()
}

/// One part of the report whole, by the name [`Compact::sections`] gives it; the error
/// names the parts there are.
pub fn section(doc: &ReportDoc, name: &str) -> Result<serde_json::Value, String> {
    let mut f = fields(doc);
    f.remove(name).ok_or_else(|| {
        format!(
            "the report has no section {name:?}; it has: {}",
            sections(doc).join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::{
        attribution::{Cause, CauseEvidence, Verdict, evidence::StackEvidence},
        report::json::gpu::JsonGpu,
    };

    fn doc() -> ReportDoc {
        let mut evidence = crate::attribution::evidence::Evidence::default();
        evidence.stacks.push(StackEvidence {
            weight: 90,
            unit: "samples".into(),
            frames: vec![
                "main (train.py:10)".into(),
                "load (data.py:42)".into(),
                "decode_jpeg".into(),
                "clear_page_[k]".into(),
            ],
        });
        let causes = vec![
            CauseEvidence {
                cause: Cause::Disk,
                idle_ns: 5_000_000,
                windows: 1,
                evidence: Default::default(),
            },
            CauseEvidence {
                cause: Cause::DataloaderCpu,
                idle_ns: 600_000_000,
                windows: 6,
                evidence,
            },
        ];
        ReportDoc {
            duration_ns: 1_234_567_890,
            verdict: Some(Cow::Owned(Verdict {
                cause: Some(Cause::DataloaderCpu),
                share: 0.6,
                severity: "high".into(),
                text: "the input pipeline".into(),
            })),
            gpus: vec![JsonGpu {
                index: 0,
                observed_ns: 1_000_000_000,
                busy_ns: 400_000_000,
                waiting_ns: 0,
                idle_ns: 600_000_000,
                causes: Cow::Owned(causes),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn causes_come_largest_first_with_the_python_function_and_tiny_ones_left_out() {
        let c = Compact::of(&doc());
        assert_eq!(c.verdict_cause.as_deref(), Some("dataloader_cpu"));
        assert_eq!(c.duration_s, 1.235);
        let g = &c.gpus[0];
        assert_eq!((g.busy_pct, g.idle_pct), (40.0, 60.0));
        assert_eq!(g.causes.len(), 1, "disk's 0.5% is under the floor: {g:?}");
        assert_eq!(g.causes[0].cause, "dataloader_cpu");
        assert_eq!(g.causes[0].code.as_deref(), Some("load (data.py:42)"));
    }

    #[test]
    fn without_python_the_innermost_user_frame_names_the_stack() {
        let frames = vec!["main".to_string(), "decode".into(), "memcpy_[k]".into()];
        assert_eq!(code(&frames).as_deref(), Some("decode"));
    }

    #[test]
    fn sections_name_what_holds_something_and_a_wrong_name_lists_them() {
        let d = doc();
        let names = sections(&d);
        assert!(names.contains(&"gpus".to_string()), "{names:?}");
        assert!(!names.contains(&"threads".to_string()), "empty: {names:?}");
        assert!(section(&d, "gpus").unwrap().is_array());
        let e = section(&d, "nope").unwrap_err();
        assert!(e.contains("nope") && e.contains("gpus"), "{e}");
    }
}
