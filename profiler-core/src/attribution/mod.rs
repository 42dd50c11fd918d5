//! Why the GPU idled: every stretch of GPU idle time, labelled with the host-side cause that
//! explains it, with the evidence.
//!
//! GPU idle time comes from NVML's utilization samples, time-weighted (a 40% sample
//! contributes 60% of its period as idle). Each sample period is a window; what the threads
//! that feed the GPU, and the rest of the traced tree, did during that window (from the
//! per-tick accounting) selects one cause for it. See README "Causes" for the rules.
pub mod advice;
mod causes;
pub mod cuda_evidence;
pub mod evidence;
mod feeder_waits;
#[cfg(test)]
mod fixtures;
mod intervals;
mod link;
mod outside_evidence;
pub mod ranks;
mod roles;
mod rules;
mod shares;
pub mod signals;
pub mod steps;
pub mod throttle;
pub mod waiting;
pub mod what_if;
mod window;

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::analysis::model::Analysis;
use crate::analysis::timed_events::TimedEvents;
pub use advice::Advice;
pub use causes::{
    CAUSES, Cause, CauseSet, CauseSpec, CudaEvidenceKind, Metric, Scores, Signal, Speakers, Stacks,
};
pub use evidence::{Evidence, StackEvidence, ThreadEvidence};
pub use roles::Roles;
pub use rules::{Label, label_window};
pub use steps::{StepSplit, StepTimes, Steps};
pub use waiting::{GpuWaiting, WaitingSignal};
pub use what_if::WhatIf;
pub use window::HostWindow;

/// One stretch of mostly-idle GPU time with a single cause.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stall {
    pub gpu: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Idle time inside the stall (sample-weighted), ns.
    pub idle_ns: u64,
    /// Time NVML counted busy while the GPU only waited in collectives, ns.
    pub waiting_ns: u64,
    pub cause: Cause,
    /// For `unknown`: why no cause was chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub evidence: Evidence,
}

/// Everything behind one cause's idle time on a GPU, summed over every window it labelled:
/// a job that idles a little in every window has no stall, and still gets its why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CauseEvidence {
    pub cause: Cause,
    /// Idle plus waiting time it took.
    pub idle_ns: u64,
    /// The windows (utilization sample periods) it labelled.
    pub windows: usize,
    pub evidence: Evidence,
}

/// The dominant cause of one second of the recording.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecondLabel {
    pub start_ns: u64,
    pub idle_ns: u64,
    /// `None` when the GPU idled less than a tenth of that second.
    pub cause: Option<Cause>,
    /// Time in that second covered by utilization samples.
    pub observed_ns: u64,
    /// Its idle and waiting time by cause: what `diff` resamples to measure a run's own noise.
    pub idle_by_cause: BTreeMap<Cause, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuAttribution {
    pub gpu: u32,
    /// Time covered by utilization samples.
    pub observed_ns: u64,
    /// Busy in NVML's sense (a kernel resident), waiting included.
    pub busy_ns: u64,
    /// The part of `busy_ns` where the GPU only waited in collectives (see [`waiting`]).
    pub waiting_ns: u64,
    pub idle_ns: u64,
    pub idle_by_cause: BTreeMap<Cause, u64>,
    /// Idle plus waiting time by cause: the GPU time each cause lost.
    pub lost_by_cause: BTreeMap<Cause, u64>,
    /// How waiting was told from work.
    pub waiting: Option<GpuWaiting>,
    /// Each cause that took idle time, with its evidence, the most idle time first.
    pub causes: Vec<CauseEvidence>,
    /// The longest stalls first.
    pub stalls: Vec<Stall>,
    pub seconds: Vec<SecondLabel>,
    /// The training steps of its feeder (see [`steps`]); `None` when no probe watched it.
    pub steps: Option<Steps>,
    /// How much faster a step would be with each cause fixed (see [`what_if`]), the largest
    /// gain first; empty without steps.
    pub what_if: Vec<WhatIf>,
    /// Each step's parts, in order: what the estimates resample.
    #[serde(skip)]
    pub step_parts: Vec<steps::StepParts>,
    /// Each step marker's end, in order (step `i` runs from the `i`th to the next): what
    /// the timeline draws.
    #[serde(skip)]
    pub step_ends_ns: Vec<u64>,
    /// Window-level labels, in time order: (start, end, idle + waiting, cause); for
    /// flamegraphs per cause.
    #[serde(skip)]
    pub windows: Vec<(u64, u64, u64, Cause)>,
    /// Each window as the rules saw it, in time order: what the timeline draws.
    #[serde(skip)]
    pub labels: Vec<WindowLabel>,
    /// Its clock against the one it ran at unslowed, when it was throttled.
    #[serde(skip)]
    pub slow_clock: Option<throttle::SlowClock>,
}

/// One window's label in full: its idle and waiting time, the cause of each, and every
/// cause's score.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowLabel {
    pub start_ns: u64,
    pub end_ns: u64,
    pub idle_ns: u64,
    /// Busy to NVML, but only waiting in a collective: always `nccl_wait`.
    pub waiting_ns: u64,
    /// The cause of the idle part.
    pub cause: Cause,
    pub reason: Option<String>,
    pub scores: Scores,
}

/// The answer in plain words, in bands after TensorFlow's input-pipeline analyzer: a cause
/// taking ≥ 20% of GPU time is high, ≥ 10% moderate (see [`MODERATE_SHARE`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// `None` when no cause reaches the moderate band.
    pub cause: Option<Cause>,
    /// The cause's idle time over all observed GPU time.
    pub share: f64,
    pub severity: Cow<'static, str>,
    pub text: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Attribution {
    pub roles: Roles,
    pub gpus: Vec<GpuAttribution>,
    pub verdict: Verdict,
    /// Causes the recording lacks a signal to judge: not scored in any window.
    pub unchecked: Vec<signals::Unchecked>,
    /// What to change, every GPU's, the largest expected gain first.
    pub advice: Vec<Advice>,
}

/// TensorFlow calls an input pipeline moderately bound at 5% of step time; NVML duty-cycle
/// sampling and step boundaries leave a few percent of idle in any healthy job, so the
/// moderate band starts at 10% here.
pub const MODERATE_SHARE: f64 = 0.10;
pub const HIGH_SHARE: f64 = 0.20;
/// A window counts toward a stall when at least this much of it was idle.
const STALL_IDLE_FRACTION: f64 = 0.5;
/// At most this many stalls per GPU are kept, the longest.
const MAX_STALLS: usize = 20;
/// The feeder's waits named in a cause's evidence.
const TOP_WAITS: usize = 2;

/// The most of a window that may precede the probes' first sight of the feeder's calls for
/// the window to count as probed, the rest taken to be like what they saw: a window's label is
/// what held for most of it. The probes go on a moment into the recording, and a call then in
/// progress goes unseen, so a feeder that calls CUDA every few tens of ms would otherwise
/// leave the whole first window (a sixth of a second on most GPUs) without a cause.
const UNPROBED_MOST: f64 = 0.5;

/// Why a window of a probed feeder more than [`UNPROBED_MOST`] of which precedes the probes'
/// first sight of its CUDA calls, and which looks like host work, has no cause: the feeder's
/// time in CUDA calls was not measured yet.
pub const BEFORE_PROBES: &str = "before the CUDA probes saw the feeder's first call (a call \
                                 in progress when they attached goes unseen)";

/// Labels every GPU's idle time; `None` when the recording has no GPU samples. `timed` is
/// the recording's (see [`crate::analysis::fold::Folded`]).
pub fn attribute(a: &Analysis, timed: &TimedEvents) -> Option<Attribution> {
    attribute_with(a, timed, &waiting::calibration(&[a]))
}

/// As [`attribute`], with waiting told from work by a calibration over the whole job (see
/// [`waiting::calibration`]).
pub fn attribute_with(
    a: &Analysis,
    timed: &TimedEvents,
    calibration: &waiting::Calibration,
) -> Option<Attribution> {
    if a.gpus.values().all(|g| g.samples.is_empty()) {
        return None;
    }
    let roles = Roles::from_analysis(a);
    let index = window::TimelineIndex::new(&a.timeline);
    let waits = crate::cuda::WaitIndex::new(&a.cuda.waits);
    let mut waiting = waiting::derive(a, calibration);
    let unchecked = signals::unchecked(a);
    let unjudged: CauseSet = unchecked.iter().map(|u| u.cause).collect();
    let mut slow = throttle::slow_clocks(a);
    let mut gpus: Vec<GpuAttribution> = a
        .gpus
        .values()
        .filter(|g| !g.samples.is_empty())
        .map(|g| {
            let w = waiting.remove(&g.info.index);
            let roles = Roles::for_gpu(a, g);
            let lookups = Lookups {
                index: &index,
                waits: &waits,
                unchecked: unjudged,
            };
            attribute_gpu(a, timed, &roles, &lookups, g, w, slow.remove(&g.info.index))
        })
        .collect();
    what_if::bound_by_other_ranks(&mut gpus);
    let mut advice = Vec::new();
    for attributed in &gpus {
        if let Some(g) = a.gpus.get(&attributed.gpu) {
            let roles = Roles::for_gpu(a, g);
            advice.extend(advice::advise(a, &roles, &index, attributed));
        }
    }
    advice.sort_by(|x, y| y.expected_speedup.total_cmp(&x.expected_speedup));
    advice::merge_alike(&mut advice);
    let verdict = verdict(&gpus);
    Some(Attribution {
        roles,
        gpus,
        verdict,
        unchecked,
        advice,
    })
}

/// What each GPU's windows are looked up in, built once per recording.
struct Lookups<'x> {
    index: &'x window::TimelineIndex,
    waits: &'x crate::cuda::WaitIndex<'x>,
    /// Causes the recording cannot judge.
    unchecked: CauseSet,
}

fn attribute_gpu(
    a: &Analysis,
    timed: &TimedEvents,
    roles: &Roles,
    lookups: &Lookups<'_>,
    g: &crate::analysis::model::GpuTimeline,
    waiting: Option<GpuWaiting>,
    slow_clock: Option<throttle::SlowClock>,
) -> GpuAttribution {
    let Lookups {
        index,
        waits,
        unchecked,
    } = *lookups;
    // Until the probes see the feeder's first CUDA call, its time in CUDA calls is not
    // measured (the probes go on a moment into a recording, and a call already in progress
    // then goes unseen), and a sync spinning on-CPU would pass for host work.
    let probed_since = roles.feeders_watched_since(a);
    // Launches per second of the feeder's own CPU time, not of the clock: a loop that other
    // work starves of CPU launches fewer a second, but as many for each unit of its own work,
    // and it is that work which is launching.
    let launch_rate: f64 = roles
        .feeders
        .iter()
        .filter_map(|t| a.threads.get(t))
        .filter_map(|t| {
            let l = a.cuda.launches.get(&t.pid)?;
            let (on_cpu, life) = (t.counters.on_cpu_ns, t.counters.lifetime_ns());
            (on_cpu > 0 && life > 0).then(|| l.per_sec * life as f64 / on_cpu as f64)
        })
        .sum();
    let mut out = GpuAttribution {
        gpu: g.info.index,
        slow_clock,
        ..GpuAttribution::default()
    };
    let feeder_waits = feeder_waits::FeederWaits::new(&a.callers_off_cpu, roles);
    let feeder_top_waits = feeder_waits::top_waits(a, roles, TOP_WAITS);
    let mut open: Option<Stall> = None;
    let mut stalls = Vec::new();
    // Only periods the host timeline covers can be explained: NVML publishes samples late,
    // so the last ones can reach past the final tick, into the recorder's own shutdown.
    let covered = a
        .timeline
        .first()
        .zip(a.timeline.last())
        .map(|(first, last)| (first.start_ns, last.end_ns));
    for (i, s) in g.samples.iter().enumerate() {
        let (start, end) = (s.start_ns(), s.ts_ns);
        if covered.is_some_and(|(from, to)| end > to || start < from) {
            continue;
        }
        let idle = s.idle_ns();
        let busy = f64::from(s.util_pct.min(100)) / 100.0;
        let waiting_fraction = waiting
            .as_ref()
            .and_then(|w| w.fractions.get(i))
            .map_or(0.0, |f| f.clamp(0.0, busy));
        let waited = (waiting_fraction * s.period_ns as f64) as u64;
        // Saturating: periods come from a file, which may be damaged.
        let lost = idle.saturating_add(waited);
        out.observed_ns += s.period_ns;
        out.idle_ns += idle;
        out.waiting_ns = out.waiting_ns.saturating_add(waited);
        let mut host = index.window(&a.timeline, roles, start, end);
        host.launch_bound = launch_rate >= rules::LAUNCH_BOUND_PER_SEC;
        host.waits = feeder_waits.window(start, end);
        // Where the probes' watch of this window begins, when they watched most of it.
        let probed_from = probed_since.map(|since| since.max(start)).filter(|&from| {
            from < end && (from - start) as f64 <= UNPROBED_MOST * (end - start) as f64
        });
        let feeder_probed = probed_from.is_some();
        if let Some(from) = probed_from {
            let totals = waits
                .totals(from, end, |tid| roles.feeders.contains(&tid))
                .scaled((end - start) as f64 / (end - from) as f64);
            let achieved = (totals.copy_ns() > 0.0 && totals.copy_bytes > 0.0)
                .then(|| totals.copy_bytes / totals.copy_ns());
            let link = link::LinkState::at(g, end);
            host.link_limited = link.is_some_and(|l| l.limits(achieved));
            host.link_gbps = link.map(|l| l.current_gbps()).filter(|g| *g > 0.0);
            host.cuda = Some(totals);
        }
        // Waiting is lost time like idle: the rules see only the GPU's real work as busy.
        let mut label = label_window(&host, busy - waiting_fraction, unchecked);
        if label.cause == Cause::Unknown
            && let (Some(reason), Some(most)) = (&mut label.reason, feeder_top_waits.first())
            && host.feeder.blocked > 0.0
        {
            reason.push_str(&format!("; the feeder blocked most in {most}"));
        }
        // Only host work is in doubt: the other causes stand on scheduler and IO evidence.
        if label.cause == Cause::HostCompute && probed_since.is_some() && !feeder_probed {
            label.cause = Cause::Unknown;
            label.reason = Some(BEFORE_PROBES.into());
        }
        *out.idle_by_cause.entry(label.cause).or_default() += idle;
        // Waiting in a collective is nccl_wait whatever the rules made of the idle part.
        let by = out.lost_by_cause.entry(label.cause).or_default();
        *by = by.saturating_add(idle);
        if waited > 0 {
            let by = out.lost_by_cause.entry(Cause::NcclWait).or_default();
            *by = by.saturating_add(waited);
        }
        let window_cause = if waited > idle {
            Cause::NcclWait
        } else {
            label.cause
        };
        out.windows.push((start, end, lost, window_cause));
        out.labels.push(WindowLabel {
            start_ns: start,
            end_ns: end,
            idle_ns: idle,
            waiting_ns: waited,
            cause: label.cause,
            reason: label.reason.clone(),
            scores: label.scores,
        });
        // Waiting for work is idle, not a stall.
        let stalled = s.period_ns > 0
            && lost as f64 >= STALL_IDLE_FRACTION * s.period_ns as f64
            && window_cause.spec().is_stall;
        match (&mut open, stalled) {
            (Some(stall), true)
                if stall.cause == window_cause && stall.end_ns + s.period_ns / 2 >= start =>
            {
                stall.end_ns = end;
                stall.idle_ns += idle;
                stall.waiting_ns = stall.waiting_ns.saturating_add(waited);
            }
            (_, true) => {
                if let Some(stall) = open.take() {
                    stalls.push(stall);
                }
                open = Some(Stall {
                    gpu: g.info.index,
                    start_ns: start,
                    end_ns: end,
                    idle_ns: idle,
                    waiting_ns: waited,
                    cause: window_cause,
                    reason: if window_cause == label.cause {
                        label.reason
                    } else {
                        None
                    },
                    evidence: Evidence::default(),
                });
            }
            (_, false) => {
                if let Some(stall) = open.take() {
                    stalls.push(stall);
                }
            }
        }
    }
    if let Some(stall) = open.take() {
        stalls.push(stall);
    }
    out.busy_ns = out.observed_ns - out.idle_ns;
    // The steps over the time the host timeline covers since the probes watched the feeder.
    if let (Some(since), Some((from, to))) = (probed_since, covered) {
        let link_gbps = link::LinkState::at(g, to)
            .map(|l| l.current_gbps())
            .filter(|g| *g > 0.0)
            .unwrap_or(rules::DEFAULT_LINK_GBPS);
        let lookups = steps::Lookups {
            timeline: &a.timeline,
            index,
            waits,
            link_gbps,
            off_cpu: &a.callers_off_cpu,
        };
        let found = steps::find(&a.cuda.calls, roles, &lookups, (from.max(since), to));
        out.steps = Some(found.steps);
        out.step_ends_ns = found.ends_ns;
        out.step_parts = found.parts;
    }
    out.lost_by_cause.retain(|_, ns| *ns > 0);
    out.waiting = waiting;
    if !out.step_parts.is_empty() && out.observed_ns > 0 {
        let n = out.step_parts.len() as f64;
        let mean_step = out.step_parts.iter().map(|p| p.split.total()).sum::<f64>() / n;
        let working = out.busy_ns.saturating_sub(out.waiting_ns) as f64 / out.observed_ns as f64;
        let link = covered.and_then(|(_, to)| link::LinkState::at(g, to));
        let pace = what_if::Pace {
            kernel_ns: working * mean_step,
            link_gbps: link
                .map(|l| l.current_gbps())
                .filter(|g| *g > 0.0)
                .unwrap_or(rules::DEFAULT_LINK_GBPS),
            max_link_gbps: link.map_or(0.0, |l| l.max_gbps()),
            workers: match (out.step_ends_ns.first(), out.step_ends_ns.last()) {
                (Some(&a0), Some(&a1)) if a1 > a0 && !roles.workers.is_empty() => {
                    let w = index.window(&a.timeline, roles, a0, a1).workers;
                    Some([w.on_cpu, w.runqueue, w.io_wait])
                }
                _ => None,
            },
            loaders: roles
                .workers
                .iter()
                .filter_map(|tid| a.threads.get(tid))
                .filter(|t| t.counters.on_cpu_ns.saturating_add(t.counters.io_wait_ns) > 0)
                .map(|t| t.pid)
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            host_copy_gbps: a.host_copy_gbps,
            kernel_scale: out
                .slow_clock
                .as_ref()
                .map(throttle::SlowClock::kernel_scale),
        };
        out.what_if =
            what_if::estimate(&out.step_parts, &pace, &out.lost_by_cause, out.observed_ns);
    }
    stalls.sort_by(|x, y| {
        (y.idle_ns.saturating_add(y.waiting_ns))
            .cmp(&x.idle_ns.saturating_add(x.waiting_ns))
            .then(x.start_ns.cmp(&y.start_ns))
    });
    stalls.truncate(MAX_STALLS);
    for stall in &mut stalls {
        let range = [(stall.start_ns, stall.end_ns)];
        stall.evidence = evidence::gather(a, timed, roles, stall.cause, &range);
        stall.evidence.cuda = cuda_evidence::gather(a, roles, g, stall.cause, &range);
    }
    out.stalls = stalls;
    out.causes = cause_evidence(a, timed, roles, g, &out.windows);
    for c in &mut out.causes {
        if c.cause.spec().shows_feeder_waits() {
            c.evidence.feeder_waits.clone_from(&feeder_top_waits);
        }
        if c.cause == Cause::NoWork {
            c.evidence.outside = outside_evidence::gather(
                a,
                roles,
                covered,
                out.busy_ns.saturating_sub(out.waiting_ns),
            );
        }
    }
    out.seconds = seconds(a.start_ns, &out.windows);
    out
}

/// The evidence of every cause with idle time, over the windows it labelled (adjacent ones
/// joined into one range).
fn cause_evidence(
    a: &Analysis,
    timed: &TimedEvents,
    roles: &Roles,
    g: &crate::analysis::model::GpuTimeline,
    windows: &[(u64, u64, u64, Cause)],
) -> Vec<CauseEvidence> {
    /// A cause's idle time, windows and the time ranges they cover.
    #[derive(Default)]
    struct Windows {
        idle_ns: u64,
        count: usize,
        ranges: Vec<(u64, u64)>,
    }
    let mut by_cause: BTreeMap<Cause, Windows> = BTreeMap::new();
    for &(start, end, idle, cause) in windows {
        if idle == 0 || end <= start {
            continue;
        }
        let w = by_cause.entry(cause).or_default();
        w.idle_ns = w.idle_ns.saturating_add(idle);
        w.count += 1;
        match w.ranges.last_mut() {
            Some(last) if last.1 >= start => last.1 = last.1.max(end),
            _ => w.ranges.push((start, end)),
        }
    }
    let mut out: Vec<CauseEvidence> = by_cause
        .into_iter()
        .map(
            |(
                cause,
                Windows {
                    idle_ns,
                    count: windows,
                    ranges,
                },
            )| {
                let mut evidence = evidence::gather(a, timed, roles, cause, &ranges);
                evidence.cuda = cuda_evidence::gather(a, roles, g, cause, &ranges);
                CauseEvidence {
                    cause,
                    idle_ns,
                    windows,
                    evidence,
                }
            },
        )
        .collect();
    out.sort_by(|x, y| y.idle_ns.cmp(&x.idle_ns).then(x.cause.cmp(&y.cause)));
    out
}

fn seconds(start_ns: u64, windows: &[(u64, u64, u64, Cause)]) -> Vec<SecondLabel> {
    const SEC: u64 = 1_000_000_000;
    /// One second's observed time and idle time by cause.
    #[derive(Default)]
    struct Second {
        observed_ns: u64,
        idle: BTreeMap<Cause, u64>,
    }
    let mut by_sec: BTreeMap<u64, Second> = BTreeMap::new();
    for &(ws, we, idle, cause) in windows {
        if we <= ws {
            continue;
        }
        // Spread the window's idle time over the seconds it spans, by overlap.
        let mut t = ws;
        while t < we {
            let sec = t.saturating_sub(start_ns) / SEC;
            // Saturating: near the end of the clock this would wrap and the loop never end.
            let sec_end = start_ns.saturating_add((sec + 1).saturating_mul(SEC));
            let part_end = we.min(sec_end);
            let part = idle as u128 * (part_end - t) as u128 / (we - ws) as u128;
            let second = by_sec.entry(sec).or_default();
            second.observed_ns = second.observed_ns.saturating_add(part_end - t);
            *second.idle.entry(cause).or_default() += part as u64;
            t = part_end;
        }
    }
    by_sec
        .into_iter()
        .map(|(sec, Second { observed_ns, idle })| {
            let idle_ns: u64 = idle.values().sum();
            let top = idle
                .iter()
                .max_by_key(|(c, ns)| (**ns, std::cmp::Reverse(**c)));
            SecondLabel {
                start_ns: start_ns + sec * SEC,
                idle_ns,
                cause: top.filter(|_| idle_ns >= SEC / 10).map(|(c, _)| *c),
                observed_ns,
                idle_by_cause: idle.into_iter().filter(|(_, ns)| *ns > 0).collect(),
            }
        })
        .collect()
}

fn verdict(gpus: &[GpuAttribution]) -> Verdict {
    let observed: u64 = gpus.iter().map(|g| g.observed_ns).sum();
    let mut by_cause: BTreeMap<Cause, u64> = BTreeMap::new();
    for g in gpus {
        for (c, ns) in &g.lost_by_cause {
            let by = by_cause.entry(*c).or_default();
            *by = by.saturating_add(*ns);
        }
    }
    let idle: u64 = by_cause.values().sum();
    let waiting: u64 = gpus.iter().map(|g| g.waiting_ns).sum();
    // Idle for want of work is no bottleneck: it is said, never the verdict.
    let top = by_cause
        .iter()
        .filter(|(c, _)| c.spec().is_stall)
        .max_by_key(|(c, ns)| (**ns, std::cmp::Reverse(**c)));
    let no_work: u64 = by_cause
        .iter()
        .filter(|(c, _)| !c.spec().is_stall)
        .map(|(_, ns)| *ns)
        .sum();
    let share = |ns: u64| {
        if observed == 0 {
            0.0
        } else {
            ns as f64 / observed as f64
        }
    };
    let mut lost = if share(waiting) >= 0.005 {
        format!(
            "idled or waited in collectives {:.0}% of the time ({:.0}% waiting, which NVML counts busy)",
            share(idle) * 100.0,
            share(waiting) * 100.0
        )
    } else {
        format!("idled {:.0}% of the time", share(idle) * 100.0)
    };
    if share(no_work) >= 0.005 {
        lost.push_str(&format!(
            " ({:.0}% of GPU time waiting for work from outside the job, which is not a stall)",
            share(no_work) * 100.0
        ));
    }
    match top {
        Some((&cause, &ns)) if share(ns) >= MODERATE_SHARE => {
            let severity = if share(ns) >= HIGH_SHARE {
                "high"
            } else {
                "moderate"
            };
            Verdict {
                cause: Some(cause),
                share: share(ns),
                severity: severity.into(),
                text: format!(
                    "{severity}: the GPU {lost}, {:.0}% of it because of {} ({:.0}% of GPU time). Usual fix: {}.",
                    if idle == 0 {
                        0.0
                    } else {
                        ns as f64 / idle as f64 * 100.0
                    },
                    cause.name(),
                    share(ns) * 100.0,
                    cause.fix()
                ),
            }
        }
        _ => Verdict {
            cause: None,
            share: top.map_or(0.0, |(_, ns)| share(*ns)),
            severity: "none".into(),
            text: format!(
                "no bottleneck: the GPU {lost}, no cause above {:.0}% of GPU time.",
                MODERATE_SHARE * 100.0
            ),
        },
    }
}
