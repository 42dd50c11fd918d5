//! What `stallscope agent` serves on `/metrics`: metric families in the OpenMetrics text format,
//! and the GPU seconds by state and cause read from one recording's JSON report. Pure, so the
//! format and the accounting are unit-tested without a server.
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::report::json::JsonReport;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

type Labels = Vec<(String, String)>;

#[derive(Debug, Clone)]
struct Family {
    help: String,
    kind: Kind,
    samples: BTreeMap<Labels, f64>,
}

/// Metric families by name; samples by their labels.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    families: BTreeMap<String, Family>,
}

fn labels(l: &[(&str, &str)]) -> Labels {
    l.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

impl Exposition {
    fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Family {
        let f = self
            .families
            .entry(name.to_owned())
            .or_insert_with(|| Family {
                help: help.to_owned(),
                kind,
                samples: BTreeMap::new(),
            });
        debug_assert_eq!(f.kind, kind, "{name} is one kind of metric");
        f
    }

    /// Sets a gauge (or a counter kept elsewhere) to `v`.
    pub fn set(&mut self, name: &str, kind: Kind, help: &str, l: &[(&str, &str)], v: f64) {
        self.family(name, kind, help).samples.insert(labels(l), v);
    }

    /// Adds `v` (≥ 0) to a counter. A counter named once with no increment still shows, at 0.
    pub fn add(&mut self, name: &str, help: &str, l: &[(&str, &str)], v: f64) {
        *self
            .family(name, Kind::Counter, help)
            .samples
            .entry(labels(l))
            .or_insert(0.0) += v.max(0.0);
    }

    /// Every family of `other`, replacing those of the same name here.
    pub fn extend(&mut self, other: Exposition) {
        self.families.extend(other.families);
    }

    pub fn get(&self, name: &str, l: &[(&str, &str)]) -> Option<f64> {
        self.families.get(name)?.samples.get(&labels(l)).copied()
    }

    /// The OpenMetrics text format (`application/openmetrics-text; version=1.0.0`): a counter
    /// family `x` has samples `x_total`; the exposition ends with `# EOF`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, f) in &self.families {
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
            };
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "# HELP {name} {}", escape(&f.help));
            let sample = match f.kind {
                Kind::Counter => format!("{name}_total"),
                Kind::Gauge => name.clone(),
            };
            for (l, v) in &f.samples {
                let shown = l
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect::<Vec<_>>()
                    .join(",");
                if shown.is_empty() {
                    let _ = writeln!(out, "{sample} {}", number(*v));
                } else {
                    let _ = writeln!(out, "{sample}{{{shown}}} {}", number(*v));
                }
            }
        }
        out.push_str("# EOF\n");
        out
    }
}

/// One GPU's seconds in one recording, by state and cause.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSeconds {
    pub index: u64,
    pub uuid: String,
    pub name: String,
    /// The job rank that ran on it (from NCCL or the launcher's `RANK`), when one did.
    pub rank: Option<u64>,
    pub busy_s: f64,
    /// (state, cause, seconds): idle and waiting, by cause; time no cause explained is
    /// `unattributed`; idle waiting for work from outside the job is state `no_work`.
    pub lost: Vec<(&'static str, String, f64)>,
}

/// The label of idle or waiting time no cause explained.
pub const UNATTRIBUTED: &str = "unattributed";
/// The state of idle time the feeder spent waiting for work from outside the job.
pub const NO_WORK: &str = "no_work";

/// Each GPU's seconds in a JSON report (`report --format json`): busy; idle by cause;
/// waiting (busy to NVML, but only waiting in collectives) by cause, which is the lost time
/// less the idle.
pub fn gpu_seconds(report: &JsonReport<'_>) -> Vec<GpuSeconds> {
    let s = |ns: u64| ns as f64 / 1e9;
    let by_cause = |m: &BTreeMap<Cow<'static, str>, u64>| -> BTreeMap<String, f64> {
        m.iter().map(|(k, ns)| (k.to_string(), s(*ns))).collect()
    };
    let mut out = Vec::new();
    for g in report.gpus.iter() {
        let idle = by_cause(&g.idle_by_cause);
        let lost = by_cause(&g.lost_by_cause);
        let mut rows = Vec::new();
        let mut split = |state: &'static str, total: f64, causes: BTreeMap<String, f64>| {
            let explained: f64 = causes.values().sum();
            for (cause, s) in causes {
                if s <= 0.0 {
                    continue;
                }
                // Idle for want of work is its own state: no alert on lost time counts it.
                let stall =
                    crate::attribution::Cause::from_name(&cause).is_none_or(|c| c.spec().is_stall);
                if stall {
                    rows.push((state, cause, s));
                } else {
                    rows.push((NO_WORK, String::new(), s));
                }
            }
            if total - explained > 1e-9 {
                rows.push((state, UNATTRIBUTED.to_owned(), total - explained));
            }
        };
        let waiting: BTreeMap<String, f64> = lost
            .iter()
            .map(|(c, s)| {
                (
                    c.clone(),
                    (s - idle.get(c).copied().unwrap_or(0.0)).max(0.0),
                )
            })
            .collect();
        split("idle", s(g.idle_ns), idle);
        split("waiting", s(g.waiting_ns), waiting);
        out.push(GpuSeconds {
            index: u64::from(g.index),
            uuid: g.uuid.to_string(),
            name: g.name.to_string(),
            rank: report
                .ranks
                .ranks
                .iter()
                .find(|r| r.gpu == Some(g.index))
                .and_then(|r| r.rank)
                .map(u64::from),
            busy_s: s(g.busy_ns),
            lost: rows,
        });
    }
    out
}

/// The agent's counter of GPU time (see [`add_report`]).
pub const GPU_SECONDS: &str = "stallscope_gpu_seconds";
const GPU_SECONDS_HELP: &str = "GPU time by state (busy, idle, waiting: busy to NVML but only \
                                waiting in collectives) and cause, over the recorded time";
/// The agent's counter of events the kernel could not deliver.
pub const LOST_EVENTS: &str = "stallscope_lost_events";
pub const LOST_EVENTS_HELP: &str = "Events the kernel could not deliver to a recorder";

/// Adds one recording's JSON report to the agent's counters: each GPU's seconds by state and
/// cause (labelled with the job rank that ran on it, which a fleet's queries join across
/// hosts by), and its lost events. Returns the seconds it recorded.
pub fn add_report(e: &mut Exposition, report: &JsonReport<'_>) -> f64 {
    for g in gpu_seconds(report) {
        let gpu = g.index.to_string();
        let rank = g.rank.map(|r| r.to_string()).unwrap_or_default();
        let busy = ("busy", String::new(), g.busy_s);
        for (state, cause, s) in std::iter::once(&busy).chain(&g.lost) {
            let mut l = vec![
                ("gpu", gpu.as_str()),
                ("UUID", g.uuid.as_str()),
                ("state", state),
                ("cause", cause.as_str()),
            ];
            if !rank.is_empty() {
                l.push(("rank", rank.as_str()));
            }
            e.add(GPU_SECONDS, GPU_SECONDS_HELP, &l, *s);
        }
    }
    e.add(
        LOST_EVENTS,
        LOST_EVENTS_HELP,
        &[],
        report.lost_events as f64,
    );
    report.duration_ns as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(v: serde_json::Value) -> crate::report::json::ReportDoc {
        crate::report::json::read_report(v.to_string().as_bytes(), "test.json").unwrap()
    }

    #[test]
    fn counters_take_the_total_suffix_and_the_text_ends_with_eof() {
        let mut e = Exposition::default();
        e.add(
            "stallscope_gpu_seconds",
            "GPU time",
            &[("gpu", "0"), ("state", "idle")],
            1.5,
        );
        e.add(
            "stallscope_gpu_seconds",
            "GPU time",
            &[("gpu", "0"), ("state", "idle")],
            2.0,
        );
        e.add(
            "stallscope_gpu_seconds",
            "GPU time",
            &[("gpu", "0"), ("state", "busy")],
            -1.0,
        );
        e.set(
            "DCGM_FI_DEV_GPU_TEMP",
            Kind::Gauge,
            "°C",
            &[("gpu", "0"), ("note", "a\"b")],
            70.0,
        );
        let text = e.render();
        assert!(
            text.contains("# TYPE stallscope_gpu_seconds counter\n"),
            "{text}"
        );
        assert!(text.contains("stallscope_gpu_seconds_total{gpu=\"0\",state=\"idle\"} 3.5\n"));
        assert!(text.contains("stallscope_gpu_seconds_total{gpu=\"0\",state=\"busy\"} 0\n"));
        assert!(text.contains("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",note=\"a\\\"b\"} 70\n"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn a_reports_gpu_time_splits_into_busy_idle_and_waiting_by_cause() {
        let report = doc(serde_json::json!({"version": 1, "gpus": [{
            "index": 1, "uuid": "GPU-1", "name": "H100",
            "busy_ns": 6_000_000_000u64, "idle_ns": 3_000_000_000u64,
            "waiting_ns": 2_000_000_000u64,
            "idle_by_cause": {"dataloader_cpu": 2_500_000_000u64},
            "lost_by_cause": {"dataloader_cpu": 2_500_000_000u64, "nccl_wait": 1_500_000_000u64},
        }]}));
        let g = &gpu_seconds(&report)[0];
        assert_eq!((g.index, g.busy_s), (1, 6.0));
        let row = |state: &str, cause: &str| {
            g.lost
                .iter()
                .find(|(s, c, _)| *s == state && c == cause)
                .map(|r| r.2)
        };
        assert_eq!(row("idle", "dataloader_cpu"), Some(2.5));
        assert_eq!(row("idle", UNATTRIBUTED), Some(0.5));
        assert_eq!(row("waiting", "nccl_wait"), Some(1.5));
        assert_eq!(row("waiting", UNATTRIBUTED), Some(0.5));
        assert_eq!(row("waiting", "dataloader_cpu"), None);
        let total: f64 = g.busy_s + g.lost.iter().map(|r| r.2).sum::<f64>();
        assert!((total - 11.0).abs() < 1e-9);
        assert_eq!(g.rank, None);
    }

    #[test]
    fn idle_for_want_of_work_is_its_own_state_without_a_cause() {
        let report = doc(serde_json::json!({"version": 1, "gpus": [{
            "index": 0, "busy_ns": 1_000_000_000u64, "idle_ns": 9_000_000_000u64,
            "idle_by_cause": {"no_work": 8_000_000_000u64, "gil_contention": 1_000_000_000u64},
            "lost_by_cause": {"no_work": 8_000_000_000u64, "gil_contention": 1_000_000_000u64},
        }]}));
        let g = &gpu_seconds(&report)[0];
        assert!(
            g.lost.contains(&(NO_WORK, String::new(), 8.0)),
            "{:?}",
            g.lost
        );
        assert!(g.lost.contains(&("idle", "gil_contention".into(), 1.0)));
        assert!(!g.lost.iter().any(|r| r.1 == "no_work"), "{:?}", g.lost);
    }

    #[test]
    fn a_gpu_takes_the_rank_that_ran_on_it() {
        let rank = |rank: Option<u32>, gpu: u32, pid: u32| {
            serde_json::json!({"rank": rank, "nranks": null, "pid": pid, "host": "h",
                "gpu": gpu, "nccl_wait_ns": 0, "nccl_wait_share": 0.0, "own_cause": null})
        };
        let report = doc(serde_json::json!({
            "version": 1,
            "gpus": [{"index": 0}, {"index": 1}, {"index": 2}],
            "ranks": {"ranks": [rank(Some(5), 1, 10), rank(None, 2, 11)]},
        }));
        let ranks: Vec<_> = gpu_seconds(&report).iter().map(|g| g.rank).collect();
        assert_eq!(ranks, [None, Some(5), None]);
    }
}
