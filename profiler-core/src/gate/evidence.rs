//! What changed behind a regressed cause: the stacks whose share of the cause grew, and the
//! threads, CUDA calls and files whose numbers moved most, from each side's evidence.
//!
//! Threads are matched by name and role (their IDs differ between runs), calls by API and
//! caller, stacks by their frames. Times are per second of the GPU's observed time, so runs
//! of different lengths compare.
use std::collections::BTreeMap;

use serde::Serialize;

use super::input::Run;
use crate::attribution::{Cause, Evidence, Metric, ThreadEvidence};

/// How many of each kind are kept.
const TOP: usize = 5;

/// One thing on both sides: its number in the base and in the new runs (means over runs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Moved {
    pub what: String,
    pub base: f64,
    pub new: f64,
    pub unit: &'static str,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CauseChange {
    pub gpu: u32,
    pub cause: String,
    /// Share of the cause's top stacks' weight; the ones that grew most first.
    pub stacks: Vec<Moved>,
    pub threads: Vec<Moved>,
    pub calls: Vec<Moved>,
    pub files: Vec<Moved>,
}

fn thread_metric(cause: &str, t: &ThreadEvidence) -> u64 {
    match Cause::from_name(cause).map(|c| c.spec().metric) {
        Some(Metric::OnCpu) => t.on_cpu_ns,
        Some(Metric::InCuda) => t.on_cpu_ns.saturating_add(t.runqueue_ns),
        Some(Metric::IoWait) => t.io_wait_ns,
        Some(Metric::Runqueue) => t.runqueue_ns,
        Some(Metric::Blocked) | None => t.blocked_ns,
    }
}

/// Sums `value` per key over the items of `list`, then over runs (as means).
fn per_key(
    runs: &[Run],
    gpu: usize,
    cause: &str,
    items: impl Fn(&Evidence) -> Vec<(String, f64)>,
    per_second: bool,
) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for r in runs {
        let Some(g) = r.gpus.get(gpu) else { continue };
        let Some(ev) = g.evidence.get(cause) else {
            continue;
        };
        let scale = if per_second {
            1e9 / g.observed_ns.max(1) as f64
        } else {
            1.0
        };
        for (k, v) in items(ev) {
            *out.entry(k).or_default() += v * scale / runs.len() as f64;
        }
    }
    out
}

/// The keys of either side, the most moved (by how much they grew, then fell) first.
fn moved(
    base: BTreeMap<String, f64>,
    new: BTreeMap<String, f64>,
    unit: &'static str,
) -> Vec<Moved> {
    let mut keys: Vec<&String> = base.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out: Vec<Moved> = keys
        .into_iter()
        .map(|k| Moved {
            what: k.clone(),
            base: base.get(k).copied().unwrap_or(0.0),
            new: new.get(k).copied().unwrap_or(0.0),
            unit,
        })
        .filter(|m| m.base != m.new)
        .collect();
    out.sort_by(|a, b| {
        (b.new - b.base)
            .partial_cmp(&(a.new - a.base))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.what.cmp(&b.what))
    });
    out.truncate(TOP);
    out
}

fn stacks(ev: &Evidence) -> Vec<(String, f64)> {
    let total: f64 = ev.stacks.iter().map(|s| s.weight as f64).sum();
    ev.stacks
        .iter()
        .map(|s| (s.frames.join(";"), s.weight as f64 / total.max(1.0)))
        .collect()
}

/// The evidence behind each of `regressed` (GPU position, cause name), base against new.
pub fn changes(base: &[Run], new: &[Run], regressed: &[(usize, String)]) -> Vec<CauseChange> {
    regressed
        .iter()
        .map(|(gpu, cause)| {
            let threads = |ev: &Evidence| -> Vec<(String, f64)> {
                ev.threads
                    .iter()
                    .map(|t| {
                        let name = format!("{} {}", t.role, t.comm);
                        (name, thread_metric(cause, t) as f64 / 1e9)
                    })
                    .collect()
            };
            let calls = |ev: &Evidence| -> Vec<(String, f64)> {
                ev.cuda
                    .iter()
                    .flat_map(|c| c.calls.iter())
                    .map(|c| {
                        let name = if c.caller.is_empty() {
                            c.api.clone()
                        } else {
                            format!("{} from {}", c.api, c.caller)
                        };
                        (name, c.total_ns as f64 / 1e9)
                    })
                    .collect()
            };
            let files = |runs: &[Run]| -> BTreeMap<String, f64> {
                let mut out: BTreeMap<String, f64> = BTreeMap::new();
                for r in runs {
                    for (name, bytes) in &r.files {
                        *out.entry(name.clone()).or_default() +=
                            *bytes as f64 / (r.duration_ns.max(1) as f64 / 1e9) / runs.len() as f64;
                    }
                }
                out
            };
            let disk = cause == Cause::Disk.name();
            CauseChange {
                gpu: base[0].gpus.get(*gpu).map_or(0, |g| g.index),
                cause: cause.clone(),
                stacks: moved(
                    per_key(base, *gpu, cause, stacks, false),
                    per_key(new, *gpu, cause, stacks, false),
                    "share",
                ),
                threads: moved(
                    per_key(base, *gpu, cause, threads, true),
                    per_key(new, *gpu, cause, threads, true),
                    "s/s",
                ),
                calls: moved(
                    per_key(base, *gpu, cause, calls, true),
                    per_key(new, *gpu, cause, calls, true),
                    "s/s",
                ),
                files: if disk {
                    moved(files(base), files(new), "B/s")
                } else {
                    Vec::new()
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::input::GpuRun;
    use super::*;

    fn run(worker_on_cpu_s: f64, stack_weights: &[(&str, u64)]) -> Run {
        let ev = Evidence {
            threads: vec![ThreadEvidence {
                role: "worker".into(),
                comm: "pt_data_worker".into(),
                tid: 7,
                on_cpu_ns: (worker_on_cpu_s * 1e9) as u64,
                ..ThreadEvidence::default()
            }],
            stacks: stack_weights
                .iter()
                .map(|(f, w)| crate::attribution::StackEvidence {
                    weight: *w,
                    unit: "samples".into(),
                    frames: f.split(';').map(str::to_owned).collect(),
                })
                .collect(),
            ..Evidence::default()
        };
        Run {
            gpus: vec![GpuRun {
                observed_ns: 10_000_000_000,
                evidence: BTreeMap::from([("dataloader_cpu".to_owned(), ev)]),
                ..GpuRun::default()
            }],
            ..Run::default()
        }
    }

    #[test]
    fn the_stack_and_thread_that_grew_come_first() {
        let base = run(5.0, &[("main;decode", 50), ("main;resize", 50)]);
        let new = run(8.0, &[("main;decode", 80), ("main;resize", 20)]);
        let c = &changes(&[base], &[new], &[(0, "dataloader_cpu".into())])[0];
        assert_eq!(c.stacks[0].what, "main;decode");
        assert!((c.stacks[0].base - 0.5).abs() < 1e-9 && (c.stacks[0].new - 0.8).abs() < 1e-9);
        assert_eq!(c.stacks.last().unwrap().what, "main;resize");
        assert_eq!(c.threads[0].what, "worker pt_data_worker");
        // Per second of GPU time: 5 s and 8 s over 10 s observed.
        assert!((c.threads[0].base - 0.5).abs() < 1e-9 && (c.threads[0].new - 0.8).abs() < 1e-9);
        assert!(c.calls.is_empty() && c.files.is_empty());
    }
}
