//! Training steps, found without code changes: the feeder's rhythm shows the step.
//!
//! A training loop blocks once a step on the GPU: `loss.item()`, the optimizer's sync, a
//! `.cpu()`. Those calls are the step's markers. Every blocking CUDA call of a feeder (a sync,
//! or a synchronous device-to-host copy) is a candidate, grouped by thread, function and call
//! site; a group is a *steady step* when it has at least [`MIN_CALLS`] calls, its intervals
//! keep a pace (the p90 of each interval against the median of its [`NEIGHBOURS`] on either
//! side is at most [`MAX_SPREAD`]: a job whose phases run at different paces still steps
//! steadily within each), and its calls span at least [`MIN_COVERAGE`] of the time analysed.
//! The steady group with the most calls wins (ties: the most time inside its calls, the sync
//! that waits rather than the copy that follows it).
//!
//! A DataLoader whose workers cannot keep up hands its batches over in bursts (two workers:
//! 16 ms, 180 ms, 16 ms, ...): beside workers, a group whose intervals keep a pace over a
//! few steps at a time is steady too (see [`keeps_pace_in_bursts`]).
//!
//! A loop that never blocks on the GPU (every sync left to the caching allocator, or to a
//! later epoch) still copies each batch to it: without a steady blocking call, the feeder's
//! host-to-device copies mark the steps the same way.
//!
//! A step is the time from one marker's end to the next's; each is split into what the
//! feeder did in it (see [`StepSplit`]). Without a steady group there is no step to report,
//! and the report says so (an inference server with sparse requests).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::feeder_waits::{FeederWaits, WaitShares};
use super::roles::Roles;
use super::window::TimelineIndex;
use crate::analysis::model::TickSlice;
use crate::analysis::off_cpu_spans::OffCpuSpans;
use crate::analysis::percentiles::Percentiles;
use crate::cuda::{CopyDir, CudaOp, WaitIndex};
use crate::recording::record::CudaCall;

/// Calls a group needs to be a step's marker.
pub const MIN_CALLS: usize = 5;
/// The most a steady step's p90 may be, in multiples of the median of its neighbours.
pub const MAX_SPREAD: f64 = 3.0;
/// Intervals on either side of one that set the pace it is held to.
pub const NEIGHBOURS: usize = 4;
/// The least share of the analysed time a steady step's markers must span.
pub const MIN_COVERAGE: f64 = 0.5;

/// The steps of one GPU's feeder. Field names are part of the JSON report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Steps {
    /// Steps seen: the marker calls, each of which ends one step; 0 without a steady step.
    pub count: u64,
    /// Step time (one marker's end to the next's), ms; absent without a steady step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_ms: Option<StepTimes>,
    /// Where a step's time went, mean ms per step; absent without a steady step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split_ms: Option<StepSplit>,
    /// Which call marks the steps (`cuStreamSynchronize at train.py:88`), or why there is no
    /// steady step.
    pub found_by: String,
    /// Steps per second between the first marker and the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_sec: Option<f64>,
}

impl Steps {
    /// The steps in one line, as the text and Markdown reports give them: `412, 212 ms p50
    /// (p90 230, p99 260), found by cuStreamSynchronize at train.py:88; per step: input wait
    /// 120 ms, copy 3 ms, host 40 ms, gpu 45 ms, collective 0 ms`, or why there are none.
    pub fn describe(&self) -> String {
        let (Some(t), Some(s)) = (self.step_ms, self.split_ms) else {
            return self.found_by.clone();
        };
        format!(
            "{}, {} ms p50 (p90 {}, p99 {}), found by {}; per step: input wait {} ms, copy {} \
             ms, host {} ms, gpu {} ms, collective {} ms",
            self.count,
            short_ms(t.p50),
            short_ms(t.p90),
            short_ms(t.p99),
            self.found_by,
            short_ms(s.input_wait),
            short_ms(s.copy),
            short_ms(s.host),
            short_ms(s.gpu),
            short_ms(s.collective)
        )
    }
}

/// Milliseconds to read: whole from 10 up, else to a tenth.
fn short_ms(ms: f64) -> String {
    if ms >= 10.0 {
        format!("{ms:.0}")
    } else {
        format!("{ms:.1}")
    }
}

/// Step-time percentiles, ms (nearest rank, [`crate::analysis::percentiles`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepTimes {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// Where the feeder's step time went, as the mean over the steps in ms (each part summed over
/// every step, then divided by their number: tick-grained off-CPU time is smeared over the
/// steps a tick spans, which a sum keeps and a per-step median would not). The parts add up
/// to the mean step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepSplit {
    /// Off-CPU (blocked or in IO) outside CUDA calls: waiting for a batch.
    pub input_wait: f64,
    /// Inside copy calls, and in syncs waiting for a copy.
    pub copy: f64,
    /// The rest: the feeder's own work, kernel launches, and waiting for a CPU.
    pub host: f64,
    /// In syncs waiting for kernels.
    pub gpu: f64,
    /// In syncs waiting for a collective.
    pub collective: f64,
}

impl StepSplit {
    pub fn total(&self) -> f64 {
        self.input_wait + self.copy + self.host + self.gpu + self.collective
    }

    /// The largest part's name: `input_wait`, `copy`, `host`, `gpu` or `collective`.
    pub fn dominant(&self) -> &'static str {
        [
            ("input_wait", self.input_wait),
            ("copy", self.copy),
            ("host", self.host),
            ("gpu", self.gpu),
            ("collective", self.collective),
        ]
        .into_iter()
        .fold(("input_wait", f64::MIN), |best, p| {
            if p.1 > best.1 { p } else { best }
        })
        .0
    }
}

/// One step's parts in ns (they add up to its length), with the bytes its copies moved.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepParts {
    pub split: StepSplit,
    pub copy_bytes: f64,
    /// Inside copy calls: for a pageable copy, the CPU's copy into the driver's staging.
    pub staged_ns: f64,
    /// What the DataLoader's workers did around the step, ns per step: on a CPU, waiting
    /// for one, on IO (summed over the workers, over the step and its [`NEIGHBOURS`] on
    /// either side: a batch is made while earlier steps run, and ticks are coarser than a
    /// short step). Zero without workers.
    pub workers: [f64; 3],
    /// The feeder around the step, ns per step, as for the workers: on a CPU, and waiting
    /// for one (preempted, or woken and not yet run).
    pub feeder: [f64; 2],
    /// What the feeder's off-CPU time in the step was for, as its samples say.
    pub waits: WaitShares,
}

impl StepParts {
    /// The share of the feeder's off-CPU time the step lost on a lock of the job: lock
    /// frames count only where the workers were idle (see the rules).
    pub fn lock_share(&self) -> f64 {
        let workers_idle = self.workers.iter().sum::<f64>() <= 0.0;
        self.waits.lock_woken + if workers_idle { self.waits.lock } else { 0.0 }
    }
}

/// The steps found, with each marker's end (CLOCK_MONOTONIC ns) for the timeline.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Found {
    pub steps: Steps,
    /// Each step's parts, in order (the what-if estimates resample them).
    pub parts: Vec<StepParts>,
    /// The markers' ends, in order: step `i` runs from `ends[i]` to `ends[i + 1]`.
    pub ends_ns: Vec<u64>,
}

/// A call that blocks the host until the GPU is done with something: a sync, or a
/// synchronous copy to the host (`.item()`, `.cpu()`).
pub(super) fn blocks(call: &CudaCall) -> bool {
    matches!(
        call.op,
        CudaOp::Sync { .. }
            | CudaOp::Copy {
                dir: CopyDir::DeviceToHost,
                asynchronous: false,
                ..
            }
    ) && call.status == 0
}

/// A copy of a batch to the GPU, the marker of a loop that never blocks on it.
fn copies_to_gpu(call: &CudaCall) -> bool {
    matches!(
        call.op,
        CudaOp::Copy {
            dir: CopyDir::HostToDevice,
            ..
        }
    ) && call.status == 0
}

/// Whether `intervals` keep a pace: the p90 of each one against the median of its
/// [`NEIGHBOURS`] on either side (itself included) is at most [`MAX_SPREAD`]. Against the
/// whole recording's median instead, a job that runs 50 ms steps for a while and 300 ms steps
/// after would have no steady step; random requests have none either way.
fn keeps_pace(intervals: &[u64]) -> bool {
    let mut ratios = Percentiles::new();
    let mut near = Vec::with_capacity(2 * NEIGHBOURS + 1);
    for (i, &iv) in intervals.iter().enumerate() {
        let lo = i.saturating_sub(NEIGHBOURS);
        let hi = (i + NEIGHBOURS + 1).min(intervals.len());
        near.clear();
        near.extend_from_slice(&intervals[lo..hi]);
        near.sort_unstable();
        let median = near[near.len() / 2];
        if median == 0 {
            return false;
        }
        // Thousandths, for the integer percentiles.
        ratios.record(iv.saturating_mul(1000) / median);
    }
    ratios
        .percentile(90)
        .is_some_and(|p90| p90 as f64 <= MAX_SPREAD * 1000.0)
}

/// The most DataLoader workers whose batches are looked at together (see
/// [`keeps_pace_in_bursts`]).
pub const MAX_BURST: usize = 8;

/// The most a burst's sums may vary, against `k` independent intervals' (see
/// [`keeps_pace_in_bursts`]): random requests sit at 1, batches handed over in pairs at 0.3.
pub const BURST_VARIANCE: f64 = 0.5;

/// Whether `intervals` keep a pace over `k` steps at a time, for some `k` from 2 to `bursts`
/// (the DataLoader's workers): a loader of N workers that cannot keep up hands its batches over
/// as they finish, often N close together and then a long wait (16, 180, 16, 180 ms), a
/// steady loop that no single interval shows. Summed, independent intervals steady too (the
/// law of large numbers), so the sums must also vary well under what `k` independent
/// intervals would ([`BURST_VARIANCE`]): a burst's long wait makes up for its short ones.
fn keeps_pace_in_bursts(intervals: &[u64], bursts: usize) -> bool {
    let variance = |v: &[f64]| {
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len().max(1) as f64
    };
    let singles: Vec<f64> = intervals.iter().map(|&i| i as f64).collect();
    let single = variance(&singles);
    (2..=bursts).any(|k| {
        if intervals.len() < MIN_CALLS + k || single <= 0.0 {
            return false;
        }
        let sums: Vec<u64> = intervals.windows(k).map(|w| w.iter().sum()).collect();
        let spread: Vec<f64> = sums.iter().map(|&s| s as f64).collect();
        variance(&spread) <= BURST_VARIANCE * k as f64 * single && keeps_pace(&sums)
    })
}

/// Which calls may mark a step, and what they are called in a "no steady step" line.
type Candidates = (fn(&CudaCall) -> bool, &'static str);
const BLOCKING: Candidates = (blocks, "blocking CUDA call");
const COPIES: Candidates = (copies_to_gpu, "copy to the GPU");

/// One candidate: a thread's calls of one function from one call site.
struct Group<'c> {
    tid: u32,
    api: &'c str,
    caller: &'c str,
    ends: Vec<u64>,
    in_calls_ns: u64,
}

/// Why no steady step was found, for `found_by`.
fn no_steady(why: &str) -> String {
    format!("{NO_STEADY}{why}")
}

const NO_STEADY: &str = "no steady step: ";

/// The steady marker among `calls` of the threads `feeder` accepts, inside `span`
/// (`[from, to]`, CLOCK_MONOTONIC ns), or why there is none.
fn marker<'c>(
    calls: &'c [CudaCall],
    feeder: impl Fn(u32) -> bool,
    candidate: Candidates,
    span: (u64, u64),
    bursts: usize,
) -> Result<Group<'c>, String> {
    let (candidate, what) = candidate;
    let (from, to) = span;
    let mut groups: BTreeMap<(u32, &str, &str), Group<'c>> = BTreeMap::new();
    for c in calls {
        if !feeder(c.tid) || !candidate(c) || c.end_ns < from || c.end_ns > to {
            continue;
        }
        let g = groups
            .entry((c.tid, c.api.as_str(), c.caller.as_str()))
            .or_insert_with(|| Group {
                tid: c.tid,
                api: &c.api,
                caller: &c.caller,
                ends: Vec::new(),
                in_calls_ns: 0,
            });
        g.ends.push(c.end_ns);
        g.in_calls_ns = g
            .in_calls_ns
            .saturating_add(c.end_ns.saturating_sub(c.start_ns));
    }
    if groups.is_empty() {
        return Err(no_steady(&format!("the feeder made no {what}")));
    }
    let span_ns = to.saturating_sub(from).max(1) as f64;
    let mut best: Option<Group<'c>> = None;
    let mut most = 0;
    for (_, mut g) in groups {
        g.ends.sort_unstable();
        most = most.max(g.ends.len());
        if g.ends.len() < MIN_CALLS {
            continue;
        }
        let intervals: Vec<u64> = g.ends.windows(2).map(|w| w[1] - w[0]).collect();
        let steady = keeps_pace(&intervals) || keeps_pace_in_bursts(&intervals, bursts);
        let covered = (g.ends[g.ends.len() - 1] - g.ends[0]) as f64 / span_ns;
        if !steady || covered < MIN_COVERAGE {
            continue;
        }
        let better = best
            .as_ref()
            .is_none_or(|b| (g.ends.len(), g.in_calls_ns) > (b.ends.len(), b.in_calls_ns));
        if better {
            best = Some(g);
        }
    }
    best.ok_or_else(|| {
        if most < MIN_CALLS {
            no_steady(&format!(
                "no {what} of the feeder came {MIN_CALLS} times from one place (at most \
                 {most})"
            ))
        } else {
            no_steady(&format!(
                "no {what} of the feeder recurs steadily (p90 of its intervals within \
                 {MAX_SPREAD}× their neighbours' median) over {:.0}% of the time",
                MIN_COVERAGE * 100.0
            ))
        }
    })
}

/// Nanoseconds as milliseconds, to the microsecond.
fn ms(ns: f64) -> f64 {
    (ns / 1e3).round() / 1e3
}

/// What the step is looked up in: the feeder's state time and CUDA waits, and the link's
/// pace.
pub struct Lookups<'x> {
    pub timeline: &'x [TickSlice],
    pub index: &'x TimelineIndex,
    pub waits: &'x WaitIndex<'x>,
    /// What the PCIe link carries, GB/s (bytes per ns).
    pub link_gbps: f64,
    /// When the feeders were off their CPU, where their samples say.
    pub off_cpu: &'x OffCpuSpans,
}

/// The time `tid` spent off its CPU (blocked or on IO) inside `[start, end)`: where its
/// off-CPU samples say when, exactly; the rest of each tick's off-CPU time (the waits no
/// sample caught) spread over the part of the tick no sample covers (a thread is not off
/// its CPU twice at once), and counted by how much of that part is inside.
fn off_cpu_inside(tid: u32, start: u64, end: u64, l: &Lookups<'_>) -> f64 {
    let sampled = l.off_cpu.inside(tid, start, end) as f64;
    let unsampled: f64 = l
        .index
        .slices(l.timeline, start, end)
        .filter_map(|(slice, _)| {
            let d = slice.threads.iter().find(|d| d.tid == tid)?;
            let off = d.blocked_ns.saturating_add(d.io_wait_ns);
            let caught = l.off_cpu.inside(tid, slice.start_ns, slice.end_ns);
            let uncovered = slice
                .end_ns
                .saturating_sub(slice.start_ns)
                .saturating_sub(caught);
            let (lo, hi) = (start.max(slice.start_ns), end.min(slice.end_ns));
            // A damaged file's slice may end before it starts, or lie outside the window.
            let uncovered_inside = hi
                .saturating_sub(lo)
                .saturating_sub(l.off_cpu.inside(tid, lo, hi));
            (uncovered > 0).then(|| {
                off.saturating_sub(caught) as f64 * uncovered_inside as f64 / uncovered as f64
            })
        })
        .sum();
    sampled + unsampled
}

/// Around each of the steps between consecutive `ends`: the workers' states per step (on
/// a CPU, waiting for one, on IO; see [`StepParts::workers`]) and the feeder `tid`'s (on a
/// CPU, waiting for one; see [`StepParts::feeder`]).
fn states_around(
    ends: &[u64],
    tid: u32,
    roles: &Roles,
    l: &Lookups<'_>,
) -> Vec<([f64; 3], [f64; 2])> {
    let steps = ends.len().saturating_sub(1);
    let roles = Roles {
        feeders: [tid].into(),
        workers: roles.workers.clone(),
    };
    (0..steps)
        .map(|i| {
            let lo = i.saturating_sub(NEIGHBOURS);
            let hi = (i + NEIGHBOURS + 1).min(steps);
            let h = l.index.window(l.timeline, &roles, ends[lo], ends[hi]);
            let n = (hi - lo) as f64;
            let w = h.workers;
            (
                [w.on_cpu / n, w.runqueue / n, w.io_wait / n],
                [h.feeder.on_cpu / n, h.feeder.runqueue / n],
            )
        })
        .collect()
}

/// The parts of each step between consecutive `ends` of thread `tid`.
fn step_parts(ends: &[u64], tid: u32, l: &Lookups<'_>) -> Vec<StepParts> {
    let mut parts = Vec::with_capacity(ends.len().saturating_sub(1));
    for w in ends.windows(2) {
        let (start, end) = (w[0], w[1]);
        let len = (end - start) as f64;
        let cuda = l.waits.totals(start, end, |t| t == tid);
        let off_cpu = off_cpu_inside(tid, start, end, l);
        // Off-CPU time inside a CUDA call is the call's (a sync may sleep); the timeline
        // cannot say which part was, so at least as much as cannot fit beside the calls.
        let overlap = (off_cpu + cuda.total() - len).max(0.0);
        let input_wait = (off_cpu - overlap).max(0.0);
        // A sync with a copy outstanding waits for the copy only as long as the link needs
        // to move its bytes (or the host took to stage them); the rest of it waits for the
        // kernels queued after the copy.
        let sync_copy = cuda
            .sync_copy_ns
            .min(cuda.sync_pinned_bytes / l.link_gbps.max(1e-3) + cuda.sync_staged_ns);
        let copy = cuda.call_copy_ns + sync_copy;
        let gpu = cuda.kernel_ns + (cuda.sync_copy_ns - sync_copy);
        let waits = input_wait + copy + gpu + cuda.collective_ns;
        parts.push(StepParts {
            split: StepSplit {
                input_wait,
                copy,
                host: (len - waits).max(0.0),
                gpu,
                collective: cuda.collective_ns,
            },
            // Each copy once: by its call, else (a call too short to record a wait) by the
            // sync that waited for it.
            copy_bytes: if cuda.call_copy_bytes > 0.0 {
                cuda.call_copy_bytes
            } else {
                cuda.copy_bytes
            },
            staged_ns: cuda.call_copy_ns,
            workers: [0.0; 3],
            feeder: [0.0; 2],
            waits: WaitShares::default(),
        });
    }
    parts
}

/// The steps of the feeders `roles` names over `span` (`[from, to]`, CLOCK_MONOTONIC ns: the
/// time the host timeline covers since the probes watched the feeders).
pub fn find(calls: &[CudaCall], roles: &Roles, lookups: &Lookups<'_>, span: (u64, u64)) -> Found {
    let feeder = |t| roles.feeders.contains(&t);
    let bursts = roles.workers.len().min(MAX_BURST);
    let found = marker(calls, feeder, BLOCKING, span, bursts).or_else(|why| {
        marker(calls, feeder, COPIES, span, bursts).map_err(|copies| {
            // The copies' reason only where there were some to judge.
            if copies.ends_with(COPIES.1) {
                why
            } else {
                format!("{why}; {}", copies.trim_start_matches(NO_STEADY))
            }
        })
    });
    let g = match found {
        Ok(g) => g,
        Err(why) => {
            return Found {
                steps: Steps {
                    found_by: why,
                    ..Steps::default()
                },
                parts: Vec::new(),
                ends_ns: Vec::new(),
            };
        }
    };
    let mut p = Percentiles::new();
    for w in g.ends.windows(2) {
        p.record(w[1] - w[0]);
    }
    let pct = |q| p.percentile(q).map_or(0.0, |ns| ms(ns as f64));
    let n = (g.ends.len() - 1) as f64;
    let mut parts = step_parts(&g.ends, g.tid, lookups);
    let own = Roles {
        feeders: [g.tid].into(),
        workers: roles.workers.clone(),
    };
    let feeder_waits = FeederWaits::new(lookups.off_cpu, &own);
    for ((p, (w, f)), ends) in parts
        .iter_mut()
        .zip(states_around(&g.ends, g.tid, roles, lookups))
        .zip(g.ends.windows(2))
    {
        p.workers = w;
        p.feeder = f;
        p.waits = feeder_waits.window(ends[0], ends[1]);
    }
    let sum = parts.iter().fold(StepSplit::default(), |s, p| StepSplit {
        input_wait: s.input_wait + p.split.input_wait,
        copy: s.copy + p.split.copy,
        host: s.host + p.split.host,
        gpu: s.gpu + p.split.gpu,
        collective: s.collective + p.split.collective,
    });
    let elapsed = (g.ends[g.ends.len() - 1] - g.ends[0]) as f64;
    let found_by = if g.caller.is_empty() {
        g.api.to_owned()
    } else {
        format!("{} at {}", g.api, g.caller)
    };
    Found {
        steps: Steps {
            count: g.ends.len() as u64,
            step_ms: Some(StepTimes {
                p50: pct(50),
                p90: pct(90),
                p99: pct(99),
            }),
            split_ms: Some(StepSplit {
                input_wait: ms(sum.input_wait / n),
                copy: ms(sum.copy / n),
                host: ms(sum.host / n),
                gpu: ms(sum.gpu / n),
                collective: ms(sum.collective / n),
            }),
            found_by,
            per_sec: Some((n * 1e9 / elapsed * 1e3).round() / 1e3),
        },
        parts,
        ends_ns: g.ends,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::model::ThreadDelta;
    use crate::cuda::{HostWait, SyncScope, WaitKind};

    const MS: u64 = 1_000_000;
    const FEEDER: u32 = 10;

    fn sync(start: u64, end: u64, caller: &str) -> CudaCall {
        CudaCall {
            tid: FEEDER,
            pid: FEEDER,
            start_ns: start,
            end_ns: end,
            api: "cuStreamSynchronize".into(),
            op: CudaOp::Sync {
                scope: SyncScope::Stream,
                handle: 1,
            },
            status: 0,
            caller: caller.into(),
        }
    }

    fn roles() -> Roles {
        Roles {
            feeders: [FEEDER].into(),
            workers: [20].into(),
        }
    }

    /// Runs `f` with the lookups of `ticks`, `waits` and `off_cpu`, on a 10 GB/s link.
    fn with_lookups<R>(
        ticks: &[TickSlice],
        waits: &[HostWait],
        off_cpu: &OffCpuSpans,
        f: impl FnOnce(&Lookups<'_>) -> R,
    ) -> R {
        let index = TimelineIndex::new(ticks);
        let waits = WaitIndex::new(waits);
        f(&Lookups {
            timeline: ticks,
            index: &index,
            waits: &waits,
            link_gbps: 10.0,
            off_cpu,
        })
    }

    fn run(calls: &[CudaCall], timeline: &[TickSlice], waits: &[HostWait], span: u64) -> Found {
        with_lookups(timeline, waits, &OffCpuSpans::default(), |l| {
            find(calls, &roles(), l, (0, span))
        })
    }

    /// A step every 100 ms for 10 s: blocked 50 ms waiting for a batch, 10 ms of host work
    /// and launches, then a 40 ms sync waiting for kernels. Ticks every 100 ms, aligned with
    /// the steps.
    fn steady() -> (Vec<CudaCall>, Vec<TickSlice>, Vec<HostWait>) {
        let (mut calls, mut ticks, mut waits) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..100u64 {
            let t = i * 100 * MS;
            calls.push(sync(t + 60 * MS, t + 100 * MS, "train.py:88"));
            waits.push(HostWait {
                tid: FEEDER,
                pid: FEEDER,
                start_ns: t + 60 * MS,
                end_ns: t + 100 * MS,
                kind: WaitKind::Kernel,
                bytes: 0,
                sync: true,
                pinned_bytes: 0,
                staged_ns: 0,
                call: calls.len() - 1,
            });
            ticks.push(TickSlice {
                start_ns: t,
                end_ns: t + 100 * MS,
                threads: vec![ThreadDelta {
                    tid: FEEDER,
                    on_cpu_ns: 50 * MS,
                    runqueue_ns: 0,
                    io_wait_ns: 0,
                    blocked_ns: 50 * MS,
                }],
            });
        }
        (calls, ticks, waits)
    }

    #[test]
    fn a_sync_every_100_ms_is_the_step() {
        let (calls, ticks, waits) = steady();
        let f = run(&calls, &ticks, &waits, 10_000 * MS);
        let s = &f.steps;
        assert_eq!(s.count, 100);
        assert_eq!(f.ends_ns.len(), 100);
        let t = s.step_ms.unwrap();
        assert_eq!((t.p50, t.p90, t.p99), (100.0, 100.0, 100.0));
        assert_eq!(s.found_by, "cuStreamSynchronize at train.py:88");
        assert_eq!(s.per_sec, Some(10.0));
        let split = s.split_ms.unwrap();
        assert!((split.total() - 100.0).abs() < 1e-6, "{split:?}");
        assert_eq!(split.input_wait, 50.0);
        assert_eq!(split.gpu, 40.0);
        assert_eq!(split.host, 10.0);
        assert_eq!((split.copy, split.collective), (0.0, 0.0));
        assert_eq!(split.dominant(), "input_wait");
        assert_eq!(
            s.describe(),
            "100, 100 ms p50 (p90 100, p99 100), found by cuStreamSynchronize at train.py:88; \
             per step: input wait 50 ms, copy 0.0 ms, host 10 ms, gpu 40 ms, collective 0.0 ms"
        );
    }

    /// The steady job's steps under ticks of 150 ms, which cut the steps unevenly: the
    /// feeder is blocked over the first 50 ms of each 100 ms step. `sampled(i)`: whether
    /// the off-CPU sample of step `i`'s wait was taken.
    fn uneven_ticks(sampled: impl Fn(u64) -> bool) -> Vec<StepParts> {
        let (calls, _, waits) = steady();
        let blocked = |from: u64, to: u64| -> u64 {
            (0..100u64)
                .map(|i| (to.min(i * 100 * MS + 50 * MS)).saturating_sub(from.max(i * 100 * MS)))
                .sum()
        };
        let ticks: Vec<TickSlice> = (0..67u64)
            .map(|k| {
                let (start, end) = (k * 150 * MS, ((k + 1) * 150 * MS).min(10_000 * MS));
                let off = blocked(start, end);
                TickSlice {
                    start_ns: start,
                    end_ns: end,
                    threads: vec![ThreadDelta {
                        tid: FEEDER,
                        on_cpu_ns: end - start - off,
                        runqueue_ns: 0,
                        io_wait_ns: 0,
                        blocked_ns: off,
                    }],
                }
            })
            .collect();
        let mut spans = OffCpuSpans::default();
        spans.calls_cuda(FEEDER);
        for i in (0..100).filter(|&i| sampled(i)) {
            spans.off_cpu_sample(i * 100 * MS, (FEEDER, FEEDER), 50 * MS, Default::default());
        }
        spans.finish();
        with_lookups(&ticks, &waits, &spans, |l| {
            find(&calls, &roles(), l, (0, 10_000 * MS)).parts
        })
    }

    /// A damaged file's steps may run backwards, its ticks out of order: the fuzzer found
    /// the window cut of a tick underflowing when the window ends before it starts.
    #[test]
    fn a_window_that_ends_before_it_starts_counts_nothing_inside() {
        let ticks = [
            TickSlice {
                start_ns: 0,
                end_ns: 100,
                threads: vec![],
            },
            TickSlice {
                start_ns: 100,
                end_ns: 500,
                threads: vec![ThreadDelta {
                    tid: FEEDER,
                    blocked_ns: 300,
                    ..ThreadDelta::default()
                }],
            },
        ];
        let mut spans = OffCpuSpans::default();
        spans.calls_cuda(FEEDER);
        spans.off_cpu_sample(250, (FEEDER, FEEDER), 10, Default::default());
        spans.finish();
        with_lookups(&ticks, &[], &spans, |l| {
            assert_eq!(off_cpu_inside(FEEDER, 400, 150, l), 0.0);
            assert!(off_cpu_inside(FEEDER, 150, 400, l) > 10.0);
        });
    }

    /// The bench's real PyTorch jobs stepped every 40-80 ms under 50 ms ticks: prorating
    /// each tick's sleep over the steps it spans put 3-6 ms of one step's input wait in its
    /// neighbour's host time, which the what-if then kept.
    #[test]
    fn the_input_wait_is_placed_in_its_own_step_where_the_samples_say_when() {
        let worst = |parts: &[StepParts]| {
            parts
                .iter()
                .map(|p| (p.split.input_wait - 50.0 * MS as f64).abs())
                .fold(0.0, f64::max)
        };
        let unsampled = uneven_ticks(|_| false);
        assert!(
            worst(&unsampled) > 10.0 * MS as f64,
            "prorated ticks misplace it"
        );
        let sampled = uneven_ticks(|_| true);
        assert!(worst(&sampled) < 1.0, "{}", worst(&sampled));
    }

    #[test]
    fn the_split_adds_up_to_the_step_when_waits_overlap_off_cpu_time() {
        let (calls, mut ticks, waits) = steady();
        // The feeder slept through its syncs too: blocked 90 ms of each 100.
        for t in &mut ticks {
            t.threads[0].blocked_ns = 90 * MS;
            t.threads[0].on_cpu_ns = 10 * MS;
        }
        let f = run(&calls, &ticks, &waits, 10_000 * MS);
        let split = f.steps.split_ms.unwrap();
        // 90 ms off-CPU beside 40 ms of sync in 100: at least 30 ms of it was in the sync.
        assert_eq!(split.input_wait, 60.0);
        assert_eq!(split.gpu, 40.0);
        assert_eq!(split.host, 0.0);
        assert!((split.total() - f.steps.step_ms.unwrap().p50).abs() < 1e-6);
    }

    #[test]
    fn a_sync_behind_a_copy_waits_for_the_copy_only_as_long_as_the_link_needs() {
        let (calls, ticks, mut waits) = steady();
        // Each sync waited for a 10 MB pinned copy, then the kernels after it: at 10 GB/s
        // the copy took 1 ms of the 40.
        for w in &mut waits {
            w.kind = WaitKind::PinnedCopy;
            w.pinned_bytes = 10_000_000;
            w.bytes = 10_000_000;
        }
        let f = run(&calls, &ticks, &waits, 10_000 * MS);
        let split = f.steps.split_ms.unwrap();
        assert_eq!((split.copy, split.gpu), (1.0, 39.0), "{split:?}");
        assert!((split.total() - 100.0).abs() < 1e-6, "{split:?}");
    }

    #[test]
    fn the_busiest_steady_call_site_wins_and_ties_go_to_the_longer_wait() {
        let (mut calls, ticks, waits) = steady();
        // `.item()`'s 4-byte copy right after each sync: as many calls, less time.
        let copies: Vec<CudaCall> = calls
            .iter()
            .map(|c| CudaCall {
                start_ns: c.end_ns,
                end_ns: c.end_ns + 10_000,
                api: "cuMemcpyDtoH_v2".into(),
                op: CudaOp::Copy {
                    dir: CopyDir::DeviceToHost,
                    dst: 0,
                    src: 0,
                    bytes: 4,
                    stream: 0,
                    asynchronous: false,
                },
                ..c.clone()
            })
            .collect();
        calls.extend(copies);
        calls.sort_by_key(|c| c.start_ns);
        let f = run(&calls, &ticks, &waits, 10_000 * MS);
        assert_eq!(f.steps.found_by, "cuStreamSynchronize at train.py:88");
        // Another thread's syncs are not the feeder's.
        let other: Vec<CudaCall> = calls
            .iter()
            .map(|c| CudaCall {
                tid: 99,
                ..c.clone()
            })
            .collect();
        let f = run(&other, &ticks, &waits, 10_000 * MS);
        assert_eq!(f.steps.count, 0);
    }

    #[test]
    fn sparse_jittery_calls_are_no_steady_step() {
        // An inference server: requests at irregular times, 1 ms syncs.
        let at = [
            100, 130, 2_000, 2_010, 2_020, 5_000, 5_005, 9_000, 9_500, 9_990,
        ];
        let calls: Vec<CudaCall> = at
            .iter()
            .map(|&t| sync(t * MS, (t + 1) * MS, "serve.py:12"))
            .collect();
        let f = run(&calls, &[], &[], 10_000 * MS);
        assert_eq!(f.steps.count, 0);
        assert!(f.steps.step_ms.is_none() && f.steps.split_ms.is_none());
        assert!(f.steps.found_by.starts_with("no steady step"), "{f:?}");
        // Too few calls.
        let f = run(&calls[..3], &[], &[], 10_000 * MS);
        assert!(f.steps.found_by.contains("at most 3"), "{f:?}");
        // Steady, but over a tenth of the time only.
        let brief: Vec<CudaCall> = (0..10)
            .map(|i| sync(i * 100 * MS, i * 100 * MS + MS, "x"))
            .collect();
        let f = run(&brief, &[], &[], 10_000 * MS);
        assert_eq!(f.steps.count, 0, "{f:?}");
        // Nothing at all.
        let f = run(&[], &[], &[], 10_000 * MS);
        assert_eq!(
            f.steps.found_by,
            "no steady step: the feeder made no blocking CUDA call"
        );
    }

    #[test]
    fn a_job_whose_pace_changes_between_phases_still_steps() {
        // 50 steps of 50 ms, then 20 of 300 ms: the whole run's p90 is 6x its p50, each
        // phase is steady.
        let mut t = 0;
        let mut calls = Vec::new();
        for i in 0..70u64 {
            t += if i < 50 { 50 * MS } else { 300 * MS };
            calls.push(sync(t - MS, t, "train.py:88"));
        }
        let f = run(&calls, &[], &[], t);
        assert_eq!(f.steps.count, 70, "{f:?}");
        let p = f.steps.step_ms.unwrap();
        assert_eq!((p.p50, p.p99), (50.0, 300.0));
        // Random requests are no step, however their pace is judged.
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut t = 0;
        let random: Vec<CudaCall> = (0..200)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Exponential gaps, mean 50 ms.
                let u = (rng >> 11) as f64 / (1u64 << 53) as f64;
                t += (-(1.0 - u).ln() * 50.0 * MS as f64) as u64 + MS;
                sync(t - MS, t, "serve.py:12")
            })
            .collect();
        let f = run(&random, &[], &[], t);
        assert_eq!(f.steps.count, 0, "{:?}", f.steps);
    }

    /// Two workers that cannot keep up hand their batches over in pairs (intervals measured
    /// on the real PyTorch job whose workers read cold files and decode): steady over two
    /// steps at a time, and judged so only where the job has two workers.
    #[test]
    fn a_loader_that_hands_batches_over_in_pairs_still_steps() {
        let intervals = [
            42.3, 15.5, 124.2, 16.6, 183.7, 18.0, 42.1, 138.4, 16.8, 184.0, 15.9, 184.5, 16.5,
            219.8, 18.1, 32.4, 15.5, 101.0, 16.5, 183.9, 17.7, 176.8, 16.0, 185.0, 16.5, 43.7,
            15.5, 128.4, 15.7, 179.9, 16.2, 182.3, 17.7, 87.4, 15.7, 180.2, 19.0, 85.8, 20.5,
            175.1, 18.3, 41.3, 99.7, 139.8, 15.9, 143.8, 15.8, 85.0, 107.3, 15.7, 181.7,
        ];
        let mut t = 0;
        let mut calls = vec![sync(0, 0, "train.py:88")];
        for ms in intervals {
            t += (ms * MS as f64) as u64;
            calls.push(sync(t - MS / 10, t, "train.py:88"));
        }
        let index_of = |workers: &[u32]| {
            let roles = Roles {
                feeders: [FEEDER].into(),
                workers: workers.iter().copied().collect(),
            };
            with_lookups(&[], &[], &OffCpuSpans::default(), |l| {
                find(&calls, &roles, l, (0, t)).steps.count
            })
        };
        assert_eq!(index_of(&[20]), 0, "one worker: no burst to look through");
        assert_eq!(index_of(&[20, 21]), intervals.len() as u64 + 1);
    }

    #[test]
    fn random_requests_are_no_step_even_beside_workers() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut t = 0;
        let calls: Vec<CudaCall> = (0..300)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let u = (rng >> 11) as f64 / (1u64 << 53) as f64;
                t += (-(1.0 - u).ln() * 50.0 * MS as f64) as u64 + MS;
                sync(t - MS, t, "serve.py:12")
            })
            .collect();
        let roles = Roles {
            feeders: [FEEDER].into(),
            workers: [20, 21].into(),
        };
        let f = with_lookups(&[], &[], &OffCpuSpans::default(), |l| {
            find(&calls, &roles, l, (0, t))
        });
        assert_eq!(f.steps.count, 0, "{:?}", f.steps);
    }

    #[test]
    fn a_loop_that_never_blocks_is_stepped_by_its_copies_to_the_gpu() {
        let copy = |end: u64, asynchronous| CudaCall {
            start_ns: end - MS / 10,
            api: "cuMemcpyHtoDAsync_v2".into(),
            op: CudaOp::Copy {
                dir: CopyDir::HostToDevice,
                dst: 0,
                src: 0,
                bytes: 1 << 20,
                stream: 0,
                asynchronous,
            },
            ..sync(0, end, "train.py:50")
        };
        let mut calls: Vec<CudaCall> = (1..=100u64).map(|i| copy(i * 100 * MS, true)).collect();
        // A sync now and then, too rare to be the step.
        calls.extend((1..=3u64).map(|i| sync(i * 3_000 * MS, i * 3_000 * MS + MS, "eval.py:9")));
        calls.sort_by_key(|c| c.start_ns);
        let f = run(&calls, &[], &[], 10_000 * MS);
        assert_eq!(f.steps.count, 100, "{:?}", f.steps);
        assert_eq!(f.steps.found_by, "cuMemcpyHtoDAsync_v2 at train.py:50");
        assert_eq!(f.steps.step_ms.unwrap().p50, 100.0);
        // Sparse copies and sparse syncs: why, for both.
        let sparse: Vec<CudaCall> = calls
            .iter()
            .filter(|c| c.end_ns <= 300 * MS || c.caller == "eval.py:9")
            .cloned()
            .collect();
        let f = run(&sparse, &[], &[], 10_000 * MS);
        assert_eq!(
            f.steps.found_by,
            "no steady step: no blocking CUDA call of the feeder came 5 times from one place \
             (at most 3); no copy to the GPU of the feeder came 5 times from one place (at most 3)"
        );
    }

    #[test]
    fn no_steady_step_writes_only_the_count_and_why() {
        let f = run(&[], &[], &[], 10_000 * MS);
        let v = serde_json::to_value(&f.steps).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "count": 0,
                "found_by": "no steady step: the feeder made no blocking CUDA call"
            })
        );
        let back: Steps = serde_json::from_value(v).unwrap();
        assert_eq!(back, f.steps);
    }
}
