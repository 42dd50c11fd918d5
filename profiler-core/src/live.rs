//! `stallscope top`'s model: the last minute of one-second segment reports, and what the
//! screen shows of them, summed over the last few seconds. Pure, so that every number the
//! live view prints is unit-tested without a terminal or a recording.
use std::collections::{BTreeMap, VecDeque};

use crate::report::json::{ReportDoc, gpu::JsonGpu};

/// The segments kept: the sparkline's minute.
pub const HISTORY: usize = 60;
/// The seconds the busy/idle split, the top cause, the threads and the frames are summed over.
pub const RECENT: usize = 5;

/// The reports of the last [`HISTORY`] segments, oldest first.
#[derive(Default)]
pub struct Live {
    segments: VecDeque<ReportDoc>,
    /// Segments seen in all, the dropped ones included.
    seen: u64,
}

/// One GPU over the recent seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuNow {
    pub index: u32,
    pub name: String,
    pub observed_ns: u64,
    pub busy_ns: u64,
    pub waiting_ns: u64,
    pub idle_ns: u64,
    /// Idle and waiting time by cause, largest first.
    pub causes: Vec<(String, u64)>,
    /// Busy share of each of the last [`HISTORY`] seconds (oldest first), `None` where the GPU
    /// was not sampled.
    pub busy_history: Vec<Option<f64>>,
}

impl GpuNow {
    pub fn share(&self, ns: u64) -> f64 {
        if self.observed_ns == 0 {
            0.0
        } else {
            ns as f64 / self.observed_ns as f64
        }
    }

    pub fn top_cause(&self) -> Option<&(String, u64)> {
        self.causes.first()
    }
}

/// One thread over the recent seconds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadNow {
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    pub on_cpu_ns: u64,
    pub runqueue_ns: u64,
    pub io_wait_ns: u64,
    pub blocked_ns: u64,
}

impl ThreadNow {
    /// Time it was doing or waiting for something other than a sleep.
    pub fn active_ns(&self) -> u64 {
        self.on_cpu_ns + self.runqueue_ns + self.io_wait_ns
    }
}

/// The code behind one cause over the recent seconds: each stack's innermost Python function
/// and its innermost native frame, weighted as the evidence weighs the stack.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FramesNow {
    pub python: Vec<(String, u64)>,
    pub native: Vec<(String, u64)>,
    /// What the weights count (`samples`, or `ns` off-CPU).
    pub unit: String,
}

/// The job's step and what fixing the top cause would give, from the latest segment that has
/// them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepNow {
    pub step_ms_p50: f64,
    /// The what-if estimate for the cause asked about, if one was made.
    pub if_fixed: Option<(String, f64, f64)>,
}

/// A Python frame as the recorder names it: `function (file.py:line)`.
pub fn is_python_frame(frame: &str) -> bool {
    frame.ends_with(".py)") || (frame.ends_with(')') && frame.contains(".py:"))
}

impl Live {
    pub fn push(&mut self, report: ReportDoc) {
        if self.segments.len() == HISTORY {
            self.segments.pop_front();
        }
        self.segments.push_back(report);
        self.seen += 1;
    }

    /// Segments seen since the start (the seconds recorded).
    pub fn seen(&self) -> u64 {
        self.seen
    }

    pub fn latest(&self) -> Option<&ReportDoc> {
        self.segments.back()
    }

    fn recent(&self) -> impl Iterator<Item = &ReportDoc> {
        self.segments
            .iter()
            .skip(self.segments.len().saturating_sub(RECENT))
    }

    /// The GPUs seen in the kept segments, by index.
    pub fn gpus(&self) -> Vec<u32> {
        let mut all: Vec<u32> = self
            .segments
            .iter()
            .flat_map(|r| r.gpus.iter().map(|g| g.index))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    fn gpu_in(report: &ReportDoc, index: u32) -> Option<&JsonGpu<'static>> {
        report.gpus.iter().find(|g| g.index == index)
    }

    pub fn gpu(&self, index: u32) -> Option<GpuNow> {
        let mut now = GpuNow {
            index,
            ..GpuNow::default()
        };
        let mut causes: BTreeMap<String, u64> = BTreeMap::new();
        let mut seen = false;
        for g in self.recent().filter_map(|r| Self::gpu_in(r, index)) {
            seen = true;
            now.name = g.name.to_string();
            now.observed_ns += g.observed_ns;
            now.busy_ns += g.busy_ns;
            now.waiting_ns += g.waiting_ns;
            now.idle_ns += g.idle_ns;
            for (cause, ns) in &g.idle_by_cause {
                *causes.entry(cause.to_string()).or_default() += ns;
            }
        }
        if !seen {
            return None;
        }
        now.causes = by_weight(causes);
        now.busy_history = self
            .segments
            .iter()
            .map(|r| {
                Self::gpu_in(r, index)
                    .filter(|g| g.observed_ns > 0)
                    .map(|g| g.busy_ns as f64 / g.observed_ns as f64)
            })
            .collect();
        Some(now)
    }

    /// The `n` threads most active over the recent seconds, most first.
    pub fn threads(&self, n: usize) -> Vec<ThreadNow> {
        let mut all: BTreeMap<u32, ThreadNow> = BTreeMap::new();
        for t in self.recent().flat_map(|r| r.threads.iter()) {
            let e = all.entry(t.tid).or_insert_with(|| ThreadNow {
                tid: t.tid,
                pid: t.pid,
                ..ThreadNow::default()
            });
            e.comm = t.comm.to_string();
            e.on_cpu_ns += t.on_cpu_ns;
            e.runqueue_ns += t.runqueue_ns;
            e.io_wait_ns += t.io_wait_ns;
            e.blocked_ns += t.blocked_ns;
        }
        let mut all: Vec<ThreadNow> = all.into_values().collect();
        all.sort_by(|a, b| b.active_ns().cmp(&a.active_ns()).then(a.tid.cmp(&b.tid)));
        all.truncate(n);
        all
    }

    /// The Python functions and native frames behind `cause` on GPU `index`.
    pub fn frames(&self, index: u32, cause: &str) -> FramesNow {
        let mut python: BTreeMap<String, u64> = BTreeMap::new();
        let mut native: BTreeMap<String, u64> = BTreeMap::new();
        let mut unit = String::new();
        let evidence = self
            .recent()
            .filter_map(|r| Self::gpu_in(r, index))
            .flat_map(|g| g.causes.iter())
            .filter(|c| c.cause.name() == cause);
        for c in evidence {
            for s in &c.evidence.stacks {
                unit = s.unit.to_string();
                if let Some(f) = s.frames.iter().rev().find(|f| is_python_frame(f)) {
                    *python.entry(f.clone()).or_default() += s.weight;
                }
                if let Some(f) = s.frames.iter().rev().find(|f| !is_python_frame(f)) {
                    *native.entry(f.clone()).or_default() += s.weight;
                }
            }
        }
        FramesNow {
            python: by_weight(python),
            native: by_weight(native),
            unit,
        }
    }

    /// The latest step time on GPU `index`, and the what-if estimate for `cause`.
    pub fn steps(&self, index: u32, cause: Option<&str>) -> Option<StepNow> {
        self.segments.iter().rev().find_map(|r| {
            let g = Self::gpu_in(r, index)?;
            let p50 = g.steps.as_ref()?.step_ms.as_ref()?.p50;
            let if_fixed = cause.and_then(|cause| {
                g.what_if
                    .iter()
                    .find(|w| w.cause.name() == cause)
                    .map(|w| (w.cause.name().to_string(), w.step_ms_if_fixed, w.speedup))
            });
            Some(StepNow {
                step_ms_p50: p50,
                if_fixed,
            })
        })
    }

    /// What a pipe gets each second: per GPU, the split and the top cause of the recent
    /// seconds, with the cause's top Python function (else native frame).
    pub fn line(&self) -> String {
        let mut parts = vec![format!("t={}s", self.seen)];
        for index in self.gpus() {
            let Some(g) = self.gpu(index) else { continue };
            let mut part = format!(
                "gpu{index} busy {:.0}% waiting {:.0}% idle {:.0}%",
                g.share(g.busy_ns.saturating_sub(g.waiting_ns)) * 100.0,
                g.share(g.waiting_ns) * 100.0,
                g.share(g.idle_ns) * 100.0
            );
            if let Some((cause, ns)) = g.top_cause() {
                part += &format!(" top {cause} {:.0}%", g.share(*ns) * 100.0);
                let frames = self.frames(index, cause);
                if let Some((f, _)) = frames.python.first().or(frames.native.first()) {
                    part += &format!(" in {f}");
                }
            }
            parts.push(part);
        }
        if parts.len() == 1 {
            parts.push("no GPU sampled yet".into());
        }
        parts.join(" | ")
    }
}

fn by_weight(m: BTreeMap<String, u64>) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = m.into_iter().filter(|&(_, w)| w > 0).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// One second's report: GPU 0 busy `busy` ms (of 1000), its idle split as `causes`, and a
    /// worker thread whose stacks sit in `load_batch`.
    fn second(busy: u64, causes: &[(&str, u64)]) -> ReportDoc {
        let ms = 1_000_000u64;
        let idle: u64 = causes.iter().map(|c| c.1).sum();
        let idle_by_cause: serde_json::Map<String, serde_json::Value> = causes
            .iter()
            .map(|(c, v)| (c.to_string(), json!(v * ms)))
            .collect();
        let evidence: Vec<serde_json::Value> = causes
            .iter()
            .map(|(c, v)| {
                json!({"cause": c, "idle_ns": v * ms, "windows": 1, "evidence": {
                    "threads": [], "stacks": [
                        {"weight": 3, "unit": "samples", "frames": ["_start", "python", "main (train.py:10)", "load_batch (data.py:42)", "PyNumber_Add", "decode_jpeg"]},
                        {"weight": 1, "unit": "samples", "frames": ["_start", "main (train.py:10)", "read_file (data.py:7)", "read"]}
                    ]}})
            })
            .collect();
        let v = json!({
            "version": crate::report::json::JSON_VERSION,
            "gpus": [{
                "index": 0, "name": "Sim", "uuid": "GPU-0", "observed_ns": 1000 * ms,
                "busy_ns": busy * ms, "waiting_ns": 0, "idle_ns": idle * ms,
                "idle_by_cause": idle_by_cause, "causes": evidence
            }],
            "threads": [
                {"tid": 10, "pid": 10, "comm": "python", "on_cpu_ns": 100 * ms, "blocked_ns": 900 * ms},
                {"tid": 11, "pid": 11, "comm": "pt_worker", "on_cpu_ns": 900 * ms, "runqueue_ns": 50 * ms}
            ]
        });
        crate::report::json::read_report(v.to_string().as_bytes(), "test")
            .expect("a report the reader takes")
    }

    #[test]
    fn the_recent_seconds_are_summed_and_the_minute_kept() {
        let mut live = Live::default();
        for _ in 0..HISTORY {
            live.push(second(1000, &[]));
        }
        for _ in 0..RECENT {
            live.push(second(400, &[("dataloader_cpu", 500), ("disk", 100)]));
        }
        let g = live.gpu(0).unwrap();
        assert_eq!(g.observed_ns, RECENT as u64 * 1_000_000_000);
        assert!((g.share(g.busy_ns) - 0.4).abs() < 1e-9);
        assert!((g.share(g.idle_ns) - 0.6).abs() < 1e-9);
        assert_eq!(g.top_cause().unwrap().0, "dataloader_cpu");
        assert_eq!(g.causes.len(), 2);
        assert_eq!(g.busy_history.len(), HISTORY);
        assert_eq!(g.busy_history[0], Some(1.0));
        assert_eq!(*g.busy_history.last().unwrap(), Some(0.4));
        assert_eq!(live.seen(), (HISTORY + RECENT) as u64);
        assert_eq!(live.gpu(1), None);
    }

    #[test]
    fn a_causes_frames_are_its_stacks_innermost_python_and_native_frames() {
        let mut live = Live::default();
        live.push(second(400, &[("dataloader_cpu", 600)]));
        let f = live.frames(0, "dataloader_cpu");
        assert_eq!(
            f.python,
            [
                ("load_batch (data.py:42)".to_string(), 3),
                ("read_file (data.py:7)".to_string(), 1)
            ]
        );
        assert_eq!(
            f.native,
            [("decode_jpeg".to_string(), 3), ("read".to_string(), 1)]
        );
        assert_eq!(live.frames(0, "disk"), FramesNow::default());
    }

    #[test]
    fn threads_come_most_active_first() {
        let mut live = Live::default();
        live.push(second(400, &[("dataloader_cpu", 600)]));
        let t = live.threads(5);
        assert_eq!(t.iter().map(|t| t.tid).collect::<Vec<_>>(), [11, 10]);
        assert_eq!(live.threads(1).len(), 1);
    }

    #[test]
    fn a_pipe_gets_one_line_naming_the_cause_and_the_function() {
        let mut live = Live::default();
        assert!(live.line().contains("no GPU sampled yet"));
        live.push(second(400, &[("dataloader_cpu", 600)]));
        let line = live.line();
        assert!(!line.contains('\n'));
        assert!(
            line.contains("gpu0 busy 40% waiting 0% idle 60% top dataloader_cpu 60% in load_batch (data.py:42)"),
            "{line}"
        );
    }

    #[test]
    fn python_frames_are_told_from_native_ones() {
        assert!(is_python_frame("load_batch (data.py:42)"));
        assert!(is_python_frame("<module> (train.py)"));
        assert!(!is_python_frame("decode_jpeg"));
        assert!(!is_python_frame("std::thread::spawn (lib.rs:3)"));
    }
}
