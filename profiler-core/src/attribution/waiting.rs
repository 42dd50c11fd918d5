//! GPU time that NVML counts busy but where the GPU only waited in a collective.
//!
//! On real hardware an NCCL kernel that waits for a late rank is resident and spinning, so
//! NVML's utilization reads it as busy. What tells the wait from work, in order of trust:
//!
//! - **GPM** (Hopper and newer): SM activity per busy time. Compute kernels keep most SMs
//!   active, a waiting NCCL kernel a few of them. The most active GPU's typical ratio is
//!   compute's (`c`) and the low end of all, while a collective is outstanding, waiting's
//!   (`e`); a GPM interval with ratio `r` waited `(c − r) / (c − e)` of its busy time.
//! - **Peers**: ranks of one job do the same work per step, so a rank's GPU busy beyond the
//!   least busy rank's GPU, over the same time and while a collective is outstanding, waited.
//!   Needs several ranks' GPUs in one recording (one host's clock).
//!
//! Either way, only time with a collective outstanding on the GPU's feeders can be waiting:
//! from when a rank queued it to the end of the first sync that waited for it (directly, via
//! `cuStreamWaitEvent`, or the whole context; see [`crate::cuda::build`]). One exception: until
//! the probes saw a feeder's first call, a collective queued before they attached could not be
//! seen, so on a rank's GPU that stretch may be waiting too, told by the signal alone (a
//! recording that starts while the ranks wait for a straggler would otherwise call the wait
//! work).
use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::roles::Roles;
use crate::analysis::model::{Analysis, GpuTimeline};

/// Which signal told waiting from work on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitingSignal {
    Gpm,
    Peers,
    /// Neither: waiting is not told apart (reported as 0).
    None,
}

/// A GPU's waiting, per utilization sample, and how it was found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuWaiting {
    pub signal: WaitingSignal,
    /// `high`, `medium` or `none`.
    pub certainty: Cow<'static, str>,
    pub note: String,
    /// Waiting fraction of each sample period, aligned with the GPU's samples.
    #[serde(skip)]
    pub fractions: Vec<f64>,
}

/// SM activity per busy time is compute's at this quantile of the most active GPU...
const COMPUTE_QUANTILE: f64 = 0.75;
/// ...and waiting's at this one, among intervals mostly with a collective outstanding.
const WAITING_QUANTILE: f64 = 0.1;
/// Intervals busier than this say something about SM activity per busy time.
const MIN_BUSY: f64 = 0.1;
/// Waiting must use at most this share of compute's SM activity to be told apart.
const SEPARABLE: f64 = 0.7;
/// A GPU busy less than this share of the time beyond the least busy rank's did the same.
const PEER_NOISE: f64 = 0.02;
/// GPM intervals needed on each side of the calibration.
const MIN_INTERVALS: usize = 3;

/// Time-weighted busy fraction of `g` over `[start, end)`; periods without a sample idled.
pub fn busy_over(g: &GpuTimeline, start: u64, end: u64) -> f64 {
    if end <= start {
        return 0.0;
    }
    let from = g.samples.partition_point(|s| s.ts_ns <= start);
    let mut busy = 0.0;
    for s in &g.samples[from..] {
        if s.start_ns() >= end {
            break;
        }
        let overlap = s.ts_ns.min(end).saturating_sub(s.start_ns().max(start));
        busy += overlap as f64 * f64::from(s.util_pct.min(100)) / 100.0;
    }
    busy / (end - start) as f64
}

/// Sorted, disjoint intervals.
#[derive(Clone, Debug, Default)]
struct Spans(Vec<(u64, u64)>);

impl Spans {
    fn from(mut v: Vec<(u64, u64)>) -> Self {
        v.retain(|(s, e)| e > s);
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (s, e) in v {
            match out.last_mut() {
                Some(last) if last.1 >= s => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        Spans(out)
    }

    /// Fraction of `[start, end)` covered.
    fn cover(&self, start: u64, end: u64) -> f64 {
        if end <= start {
            return 0.0;
        }
        let from = self.0.partition_point(|&(_, e)| e <= start);
        let mut ns = 0;
        for &(s, e) in &self.0[from..] {
            if s >= end {
                break;
            }
            ns += e.min(end) - s.max(start);
        }
        ns as f64 / (end - start) as f64
    }
}

/// When collectives were outstanding on the feeders of a GPU. One never waited for ends
/// when the next on its communicator was queued (NCCL runs a communicator's work in order),
/// or at the end of the recording.
fn outstanding(a: &Analysis, pids: &[u32]) -> Spans {
    let end_of_recording = a.start_ns.saturating_add(a.duration_ns);
    let mine: Vec<_> = a
        .cuda
        .collectives
        .iter()
        .filter(|c| pids.contains(&c.pid))
        .collect();
    // Each collective's next on its communicator, from the back: one pass, not a scan each.
    let mut next: std::collections::HashMap<(u32, u64), u64> = Default::default();
    let mut spans: Vec<(u64, u64)> = Vec::with_capacity(mine.len());
    for c in mine.iter().rev() {
        let end = c.done_ns.unwrap_or_else(|| {
            next.get(&(c.pid, c.comm))
                .copied()
                .unwrap_or(end_of_recording)
        });
        spans.push((c.enqueue_ns, end.max(c.enqueue_ns)));
        next.insert((c.pid, c.comm), c.enqueue_ns);
    }
    Spans::from(spans)
}

/// When a GPU may have waited: its feeders' collectives outstanding, and, if it has any, the
/// stretch before the probes saw a feeder's first call.
fn waiting_possible(a: &Analysis, g: &GpuTimeline) -> Spans {
    let roles = Roles::for_gpu(a, g);
    let mut pids: Vec<u32> = roles
        .feeders
        .iter()
        .filter_map(|t| a.threads.get(t).map(|t| t.pid))
        .collect();
    pids.extend(g.info.target_pids.iter().copied());
    pids.sort_unstable();
    pids.dedup();
    let mut spans = outstanding(a, &pids);
    if !spans.0.is_empty() {
        let end_of_recording = a.start_ns.saturating_add(a.duration_ns);
        if let Some(until) = roles.feeders_watched_since(a) {
            spans.0.push((a.start_ns, until.min(end_of_recording)));
            spans = Spans::from(spans.0);
        }
    }
    spans
}

/// One GPM interval: SM activity per busy time, and how much a collective was outstanding.
#[derive(Clone, Copy, Debug)]
struct GpmInterval {
    start: u64,
    end: u64,
    busy: f64,
    /// SM activity over busy time.
    ratio: f64,
    outstanding: f64,
}

fn gpm_intervals(g: &GpuTimeline, out: &Spans) -> Vec<GpmInterval> {
    let mut v = Vec::new();
    let mut prev: Option<u64> = None;
    for st in &g.states {
        let Some(sm) = st.sm_active_pct else {
            continue;
        };
        if let Some(start) = prev.filter(|p| *p < st.ts_ns) {
            let busy = busy_over(g, start, st.ts_ns);
            v.push(GpmInterval {
                start,
                end: st.ts_ns,
                busy,
                ratio: if busy > 0.0 {
                    (f64::from(sm.min(100)) / 100.0 / busy).min(1.0)
                } else {
                    0.0
                },
                outstanding: out.cover(start, st.ts_ns),
            });
        }
        prev = Some(st.ts_ns);
    }
    v
}

fn quantile(mut v: Vec<f64>, q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    Some(v[i])
}

/// Compute's and waiting's SM activity per busy time, from each GPU's intervals: compute's
/// is the highest GPU's typical ratio (the straggler's GPU computes whenever it is busy, however
/// many ranks wait for it), waiting's the low end among intervals with a collective
/// outstanding.
fn calibrate(per_gpu: &[Vec<GpmInterval>]) -> Result<(f64, f64), String> {
    let busy = |v: &[GpmInterval]| -> Vec<f64> {
        v.iter()
            .filter(|i| i.busy >= MIN_BUSY)
            .map(|i| i.ratio)
            .collect()
    };
    let highest = |q: f64| {
        per_gpu
            .iter()
            .map(|v| busy(v))
            .filter(|r| r.len() >= MIN_INTERVALS)
            .filter_map(|r| quantile(r, q))
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    let waiting: Vec<f64> = per_gpu
        .iter()
        .flatten()
        .filter(|i| i.busy >= MIN_BUSY && i.outstanding >= 0.5)
        .map(|i| i.ratio)
        .collect();
    let (Some(c), true) = (highest(COMPUTE_QUANTILE), waiting.len() >= MIN_INTERVALS) else {
        return Err(format!(
            "too few GPM intervals ({} with a collective outstanding)",
            waiting.len()
        ));
    };
    let e = quantile(waiting, WAITING_QUANTILE).unwrap_or(0.0);
    let separable = |c: f64| c > 0.0 && e <= SEPARABLE * c;
    if separable(c) {
        return Ok((c, e));
    }
    // Every GPU judged waited nearly all the time (a rank alone in its recording, behind a
    // straggler many times slower): its typical interval is a waiting one, and compute's
    // activity shows only in the few intervals where it computed, its most active.
    if let Some(top) = highest(1.0).filter(|&top| separable(top)) {
        return Ok((top, e));
    }
    Err(format!(
        "SM activity per busy time is alike throughout ({:.0}% at most, {:.0}% with a \
         collective outstanding): no waiting told apart",
        highest(1.0).unwrap_or(c) * 100.0,
        e * 100.0
    ))
}

/// Compute's and waiting's SM activity per busy time, judged over every GPU of one job: the
/// recordings of all its hosts when they are reported together, so that a host whose GPUs
/// all waited is judged against the straggler's host.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration(Result<(f64, f64), String>);

/// The calibration over these recordings' GPUs.
pub fn calibration(analyses: &[&Analysis]) -> Calibration {
    let per_gpu: Vec<Vec<GpmInterval>> = analyses
        .iter()
        .flat_map(|a| {
            a.gpus
                .values()
                .filter(|g| !g.samples.is_empty())
                .map(|g| gpm_intervals(g, &waiting_possible(a, g)))
        })
        .collect();
    Calibration(calibrate(&per_gpu))
}

/// Every GPU's waiting, by NVML index.
pub fn derive(a: &Analysis, calibration: &Calibration) -> BTreeMap<u32, GpuWaiting> {
    let gpus: Vec<(&GpuTimeline, Spans)> = a
        .gpus
        .values()
        .filter(|g| !g.samples.is_empty())
        .map(|g| (g, waiting_possible(a, g)))
        .collect();
    let intervals: Vec<Vec<GpmInterval>> =
        gpus.iter().map(|(g, out)| gpm_intervals(g, out)).collect();
    let calibration = &calibration.0;
    // The GPUs of ranks: those whose feeders queued collectives.
    let ranked: Vec<&GpuTimeline> = gpus
        .iter()
        .filter(|(_, out)| !out.0.is_empty())
        .map(|(g, _)| *g)
        .collect();
    gpus.iter()
        .zip(&intervals)
        .map(|((g, out), gpm)| {
            let w = if out.0.is_empty() {
                GpuWaiting {
                    signal: WaitingSignal::None,
                    certainty: "none".into(),
                    note: "no collective was outstanding on this GPU's processes".into(),
                    fractions: vec![0.0; g.samples.len()],
                }
            } else if !gpm.is_empty() {
                by_gpm(g, out, gpm, calibration)
            } else if ranked.len() >= 2 {
                by_peers(g, out, &ranked)
            } else {
                GpuWaiting {
                    signal: WaitingSignal::None,
                    certainty: "none".into(),
                    note: "this GPU has no GPM and no other rank's GPU is in the recording: \
                           time its collectives waited reads as busy (compare the ranks' \
                           recordings together)"
                        .into(),
                    fractions: vec![0.0; g.samples.len()],
                }
            };
            (g.info.index, w)
        })
        .collect()
}

fn by_gpm(
    g: &GpuTimeline,
    out: &Spans,
    gpm: &[GpmInterval],
    calibration: &Result<(f64, f64), String>,
) -> GpuWaiting {
    let (c, e) = match calibration {
        Ok(ce) => *ce,
        Err(why) => {
            return GpuWaiting {
                signal: WaitingSignal::Gpm,
                certainty: "medium".into(),
                note: why.clone(),
                fractions: vec![0.0; g.samples.len()],
            };
        }
    };
    let fractions = g
        .samples
        .iter()
        .map(|s| {
            let (start, end) = (s.start_ns(), s.ts_ns);
            let u = f64::from(s.util_pct.min(100)) / 100.0;
            // GPM's intervals and NVML's sample periods are not aligned: the share is that of
            // the intervals overlapping the period, weighted by their overlap.
            let from = gpm.partition_point(|i| i.end <= start);
            let (mut weighted, mut covered) = (0.0, 0u64);
            for i in gpm[from..].iter().take_while(|i| i.start < end) {
                let overlap = i.end.min(end).saturating_sub(i.start.max(start));
                weighted += overlap as f64 * ((c - i.ratio) / (c - e)).clamp(0.0, 1.0);
                covered += overlap;
            }
            if covered == 0 {
                return 0.0;
            }
            let share = weighted / covered as f64;
            (u * share).min(out.cover(start, end))
        })
        .collect();
    GpuWaiting {
        signal: WaitingSignal::Gpm,
        certainty: "high".into(),
        note: format!(
            "GPM SM activity: compute keeps {:.0}% of SMs active per busy time, a waiting \
             collective {:.0}%",
            c * 100.0,
            e * 100.0
        ),
        fractions,
    }
}

/// Where `g` was sampled: its first sample's start to its last one's end.
fn sampled(g: &GpuTimeline) -> (u64, u64) {
    match (g.samples.first(), g.samples.last()) {
        (Some(f), Some(l)) => (f.start_ns(), l.ts_ns),
        _ => (0, 0),
    }
}

/// Per window, the busy time beyond the least busy rank's GPU; scaled down so that the total
/// is at most this GPU's busy time beyond the least busy rank's over the whole recording, so
/// that GPUs busy at different moments of a step (phase, not waiting) cancel out. A rank's GPU
/// is compared only where it was sampled: one seen late (its rank started after the
/// recording) or lost early (its rank ended first) did not idle outside, and taking it as
/// idle there made the other ranks wait for it then.
fn by_peers(g: &GpuTimeline, out: &Spans, ranked: &[&GpuTimeline]) -> GpuWaiting {
    let mut raw: Vec<f64> = g
        .samples
        .iter()
        .map(|s| {
            let (start, end) = (s.start_ns(), s.ts_ns);
            let u = f64::from(s.util_pct.min(100)) / 100.0;
            let least = ranked
                .iter()
                .filter(|p| {
                    let (from, to) = sampled(p);
                    from <= start && end <= to
                })
                .map(|p| busy_over(p, start, end))
                .fold(u, f64::min);
            (u - least).max(0.0).min(out.cover(start, end))
        })
        .collect();
    let (from, to) = sampled(g);
    let span = to.saturating_sub(from) as f64;
    // Against each rank's GPU over the time both were sampled, the largest difference.
    let excess = ranked
        .iter()
        .filter_map(|p| {
            let (p_from, p_to) = sampled(p);
            let (start, end) = (from.max(p_from), to.min(p_to));
            (end > start).then(|| busy_over(g, start, end) - busy_over(p, start, end))
        })
        .fold(0.0, f64::max);
    // Sampling and step boundaries leave GPUs of equal work a little apart.
    let excess_ns = if excess < PEER_NOISE {
        0.0
    } else {
        excess * span
    };
    let raw_ns: f64 = raw
        .iter()
        .zip(&g.samples)
        .map(|(f, s)| f * s.period_ns as f64)
        .sum();
    if raw_ns > excess_ns {
        let scale = if raw_ns > 0.0 {
            excess_ns / raw_ns
        } else {
            0.0
        };
        raw.iter_mut().for_each(|f| *f *= scale);
    } else {
        // Per window, the least busy GPU is the straggler's while it computes, and the others'
        // wait for it then reads as nothing beyond it: the recording's total excess is the
        // wait, spread over what each window has left of busy time with a collective
        // outstanding.
        let room: Vec<f64> = g
            .samples
            .iter()
            .zip(&raw)
            .map(|(s, f)| {
                let u = f64::from(s.util_pct.min(100)) / 100.0;
                (u.min(out.cover(s.start_ns(), s.ts_ns)) - f).max(0.0)
            })
            .collect();
        let room_ns: f64 = room
            .iter()
            .zip(&g.samples)
            .map(|(r, s)| r * s.period_ns as f64)
            .sum();
        if room_ns > 0.0 {
            let share = ((excess_ns - raw_ns) / room_ns).min(1.0);
            raw.iter_mut().zip(&room).for_each(|(f, r)| *f += r * share);
        }
    }
    GpuWaiting {
        signal: WaitingSignal::Peers,
        certainty: "medium".into(),
        note: format!(
            "no GPM: busy time beyond the least busy of {} ranks' GPUs while a collective was \
             outstanding",
            ranked.len()
        ),
        fractions: raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::model::{GpuSample, ThreadSummary};
    use crate::cuda::{Collective, CollectiveSpan};
    use crate::recording::record::{GpuInfo, GpuState};

    const P: u64 = 100_000_000;

    fn derive_alone(a: &Analysis) -> BTreeMap<u32, GpuWaiting> {
        derive(a, &calibration(&[a]))
    }

    /// A GPU fed by PID `pid` with one sample per 100 ms at `utils`, and GPM every 200 ms at
    /// `sm` (none when empty).
    fn gpu(index: u32, pid: u32, utils: &[u32], sm: &[u32]) -> GpuTimeline {
        GpuTimeline {
            info: GpuInfo {
                index,
                target_pids: vec![pid],
                ..GpuInfo::default()
            },
            samples: utils
                .iter()
                .enumerate()
                .map(|(i, &u)| GpuSample {
                    ts_ns: (i as u64 + 1) * P,
                    period_ns: P,
                    util_pct: u,
                })
                .collect(),
            states: std::iter::once(0)
                .chain(sm.iter().copied())
                .enumerate()
                .filter(|_| !sm.is_empty())
                .map(|(i, s)| GpuState {
                    gpu: index,
                    ts_ns: i as u64 * 2 * P,
                    sm_active_pct: Some(s),
                    ..GpuState::default()
                })
                .collect(),
            ..GpuTimeline::default()
        }
    }

    use super::super::fixtures::all_reduce as span;

    fn analysis(gpus: Vec<GpuTimeline>, spans: Vec<CollectiveSpan>) -> Analysis {
        let mut a = Analysis {
            duration_ns: 20 * P,
            ..Analysis::default()
        };
        for g in gpus {
            let pid = g.info.target_pids[0];
            a.threads.insert(
                pid,
                ThreadSummary {
                    tid: pid,
                    pid,
                    ..ThreadSummary::default()
                },
            );
            a.gpus.insert(g.info.index, g);
        }
        a.cuda.collectives = spans;
        a
    }

    /// Rank 0 waits for rank 1 through the second half of every 400 ms; rank 1 computes.
    fn straggler(sm0: &[u32], sm1: &[u32]) -> Analysis {
        let util0 = [100; 20];
        let util1: Vec<u32> = (0..20).map(|i| if i % 4 < 2 { 90 } else { 10 }).collect();
        let spans = (0..5u64)
            .flat_map(|k| {
                [
                    span(10, k, k * 4 * P + 2 * P, Some(k * 4 * P + 4 * P)),
                    span(11, k, k * 4 * P + 3 * P, Some(k * 4 * P + 4 * P)),
                ]
            })
            .collect();
        analysis(
            vec![gpu(0, 10, &util0, sm0), gpu(1, 11, &util1, sm1)],
            spans,
        )
    }

    #[test]
    fn with_gpm_a_busy_gpu_with_few_sms_active_waits() {
        // GPM every 200 ms: rank 0 alternates compute (90% of SMs) and waiting (15%).
        let sm0: Vec<u32> = (0..10).map(|i| if i % 2 == 0 { 90 } else { 15 }).collect();
        let sm1: Vec<u32> = (0..10).map(|i| if i % 2 == 0 { 81 } else { 9 }).collect();
        let w = derive_alone(&straggler(&sm0, &sm1));
        let w0 = &w[&0];
        assert_eq!(w0.signal, WaitingSignal::Gpm);
        let waited: f64 = w0.fractions.iter().sum();
        // Ten 100 ms samples of pure waiting.
        assert!((waited - 10.0).abs() < 0.5, "{waited} {:?}", w0.fractions);
        // The straggler computes whenever it is busy.
        assert!(w[&1].fractions.iter().sum::<f64>() < 0.5, "{:?}", w[&1]);
    }

    #[test]
    fn a_lone_rank_that_waits_nearly_always_is_told_from_its_few_computing_intervals() {
        // One rank alone in its recording (an agent's host), behind a straggler ten times
        // slower: 2 s of compute (90% of SMs) in 18 s of waiting (15%), a collective
        // outstanding throughout. Its typical interval is a waiting one.
        let sm: Vec<u32> = (0..10).map(|i| if i == 4 { 90 } else { 15 }).collect();
        let a = analysis(
            vec![gpu(0, 10, &[100; 20], &sm)],
            vec![span(10, 0, 0, Some(20 * P))],
        );
        let w = derive_alone(&a);
        assert_eq!(w[&0].signal, WaitingSignal::Gpm, "{}", w[&0].note);
        let waited: f64 = w[&0].fractions.iter().sum();
        // Eighteen 100 ms samples of pure waiting.
        assert!(
            (waited - 18.0).abs() < 0.5,
            "{waited} {:?}",
            w[&0].fractions
        );
    }

    #[test]
    fn a_wait_under_way_when_the_probes_attached_is_told_by_gpm_alone() {
        // The recording starts while rank 0 waits for its straggler: the all-reduce it waits
        // in was queued before the probes came, and its first call seen is at 800 ms. GPM
        // shows waiting's 15% until then, compute's 90% and waiting in turn after.
        let sm0: Vec<u32> = (0..10)
            .map(|i| if i < 4 || i % 2 == 1 { 15 } else { 90 })
            .collect();
        let mut a = analysis(
            vec![
                gpu(0, 10, &[100; 20], &sm0),
                gpu(1, 11, &[50; 20], &[90; 10]),
            ],
            (2..5)
                .flat_map(|k| {
                    [
                        span(10, k, k * 4 * P + 2 * P, Some(k * 4 * P + 4 * P)),
                        span(11, k, k * 4 * P + 3 * P, Some(k * 4 * P + 4 * P)),
                    ]
                })
                .collect(),
        );
        let first_call = crate::recording::record::CudaCall {
            tid: 10,
            pid: 10,
            start_ns: 8 * P,
            end_ns: 8 * P + 1,
            api: "cuStreamSynchronize".into(),
            op: crate::cuda::CudaOp::Sync {
                scope: crate::cuda::SyncScope::Stream,
                handle: 1,
            },
            status: 0,
            caller: String::new(),
        };
        a.cuda.calls = vec![first_call];
        let w = derive_alone(&a);
        let before: f64 = w[&0].fractions[..8].iter().sum();
        assert!((before - 8.0).abs() < 0.3, "{:?}", w[&0].fractions);
        // After it, only the halves with a collective outstanding wait.
        let after: f64 = w[&0].fractions[8..].iter().sum();
        assert!((after - 6.0).abs() < 0.3, "{:?}", w[&0].fractions);
    }

    #[test]
    fn a_sample_straddling_two_gpm_intervals_takes_both_shares() {
        // GPM intervals start 50 ms after the samples: [50, 250) waited (15% of SMs),
        // [250, 450) computed (90%), and so on; a collective is outstanding throughout.
        let mut g = gpu(0, 10, &[100; 20], &[]);
        g.states = (0..11)
            .map(|i| GpuState {
                gpu: 0,
                ts_ns: P / 2 + i * 2 * P,
                sm_active_pct: Some(if i % 2 == 1 { 15 } else { 90 }),
                ..GpuState::default()
            })
            .collect();
        let a = analysis(vec![g], vec![span(10, 0, 0, Some(20 * P))]);
        let w = derive_alone(&a);
        let f = &w[&0].fractions;
        // [100, 200) lies in the waiting interval; [200, 300) half in each.
        assert!(f[1] > 0.95, "{f:?}");
        assert!((f[2] - 0.5).abs() < 0.05, "{f:?}");
    }

    #[test]
    fn with_gpm_alike_throughout_nothing_waits() {
        let sm = vec![88; 10];
        let a = analysis(
            vec![gpu(0, 10, &[100; 20], &sm), gpu(1, 11, &[100; 20], &sm)],
            (0..5)
                .map(|k| span(10, k, k * 4 * P, Some(k * 4 * P + 4 * P)))
                .chain((0..5).map(|k| span(11, k, k * 4 * P, Some(k * 4 * P + 4 * P))))
                .collect(),
        );
        let w = derive_alone(&a);
        assert_eq!(w[&0].signal, WaitingSignal::Gpm);
        assert!(w[&0].fractions.iter().all(|f| *f == 0.0));
        assert!(w[&0].note.contains("alike"), "{}", w[&0].note);
    }

    #[test]
    fn without_gpm_peers_show_the_wait() {
        let w = derive_alone(&straggler(&[], &[]));
        let w0 = &w[&0];
        assert_eq!(w0.signal, WaitingSignal::Peers);
        // Rank 0 is busy beyond rank 1 by 0.1 in the compute half and 0.9 in the waiting
        // half; only the half with a collective outstanding counts. Rank 1's 0.1 there is
        // the straggler computing while rank 0 waits for it: rank 0, busy throughout, has
        // 0.5 of the time more than rank 1 over the recording, all of it waiting.
        let waited: f64 = w0.fractions.iter().sum();
        assert!((waited - 10.0).abs() < 0.3, "{waited} {:?}", w0.fractions);
        assert!(w[&1].fractions.iter().sum::<f64>() < 0.01);
    }

    #[test]
    fn without_gpm_a_rank_sampled_late_did_not_idle_before() {
        // Rank 1's GPU appears halfway (its rank started later), half busy; rank 0 is busy
        // throughout with a collective outstanding. Where both were sampled rank 0 is 0.5
        // busier: 0.5 of its 20 windows waited, not the 0.75 that taking rank 1 as idle
        // before it appeared would give.
        let mut late = gpu(1, 11, &[50; 10], &[]);
        for s in &mut late.samples {
            s.ts_ns += 10 * P;
        }
        let a = analysis(
            vec![gpu(0, 10, &[100; 20], &[]), late],
            vec![
                span(10, 0, 0, Some(20 * P)),
                span(11, 0, 10 * P, Some(20 * P)),
            ],
        );
        let w = derive_alone(&a);
        let waited: f64 = w[&0].fractions.iter().sum();
        assert!(
            (waited - 10.0).abs() < 0.3,
            "{waited} {:?}",
            w[&0].fractions
        );
    }

    #[test]
    fn without_gpm_ranks_busy_alike_but_out_of_phase_do_not_wait() {
        // Both GPUs 50% busy, in alternate windows, with collectives always outstanding.
        let a0: Vec<u32> = (0..20).map(|i| if i % 2 == 0 { 100 } else { 0 }).collect();
        let a1: Vec<u32> = (0..20).map(|i| if i % 2 == 1 { 100 } else { 0 }).collect();
        let a = analysis(
            vec![gpu(0, 10, &a0, &[]), gpu(1, 11, &a1, &[])],
            vec![span(10, 0, 0, Some(20 * P)), span(11, 0, 0, Some(20 * P))],
        );
        let w = derive_alone(&a);
        for g in [0, 1] {
            assert_eq!(w[&g].signal, WaitingSignal::Peers);
            assert!(w[&g].fractions.iter().sum::<f64>() < 0.01, "{:?}", w[&g]);
        }
    }

    #[test]
    fn a_lone_rank_without_gpm_says_it_cannot_tell() {
        let a = analysis(
            vec![gpu(0, 10, &[100; 20], &[])],
            vec![span(10, 0, 0, Some(20 * P))],
        );
        let w = derive_alone(&a);
        assert_eq!(w[&0].signal, WaitingSignal::None);
        assert!(w[&0].fractions.iter().all(|f| *f == 0.0));
        assert!(w[&0].note.contains("no GPM"), "{}", w[&0].note);
    }

    #[test]
    fn without_a_collective_outstanding_nothing_waits() {
        let sm0: Vec<u32> = (0..10).map(|i| if i % 2 == 0 { 90 } else { 15 }).collect();
        let mut a = straggler(&sm0, &sm0);
        a.cuda.collectives.retain(|c| c.pid == 11);
        let w = derive_alone(&a);
        assert_eq!(w[&0].signal, WaitingSignal::None);
        assert!(w[&0].fractions.iter().all(|f| *f == 0.0));
    }

    #[test]
    fn a_collective_never_waited_for_is_outstanding_until_the_next() {
        let a = analysis(
            vec![gpu(0, 10, &[100; 20], &[])],
            vec![span(10, 0, 0, None), span(10, 1, 5 * P, Some(6 * P))],
        );
        let out = outstanding(&a, &[10]);
        assert_eq!(out.0, vec![(0, 6 * P)]);
    }

    /// The probed calls of one DDP rank: every 400 ms an all-reduce on the NCCL stream (5) at
    /// +200 ms, and `.item()`'s sync on the compute stream (1) until +400 ms; with `events`,
    /// the end event recorded on the NCCL stream and waited for by the compute stream.
    fn ddp_calls(pid: u32, events: bool) -> Vec<crate::recording::record::CudaCall> {
        use crate::cuda::{CudaOp, SyncScope};
        let call = |start: u64, end: u64, op| crate::recording::record::CudaCall {
            tid: pid,
            pid,
            start_ns: start,
            end_ns: end,
            api: "x".into(),
            op,
            status: 0,
            caller: String::new(),
        };
        let mut v = Vec::new();
        for k in 0..5u64 {
            let t = k * 4 * P;
            v.push(call(
                t + 2 * P,
                t + 2 * P + 1,
                CudaOp::Collective {
                    op: Collective::AllReduce,
                    bytes: 4,
                    comm: 1,
                    stream: 5,
                    peer: None,
                },
            ));
            if events {
                v.push(call(
                    t + 2 * P + 2,
                    t + 2 * P + 3,
                    CudaOp::EventRecord {
                        event: 0xe0,
                        stream: 5,
                    },
                ));
                v.push(call(
                    t + 2 * P + 4,
                    t + 2 * P + 5,
                    CudaOp::StreamWaitEvent {
                        stream: 1,
                        event: 0xe0,
                    },
                ));
            }
            v.push(call(
                t + 2 * P + 10,
                t + 4 * P,
                CudaOp::Sync {
                    scope: SyncScope::Stream,
                    handle: 1,
                },
            ));
        }
        v
    }

    #[test]
    fn the_wait_is_found_with_or_without_the_event_probes() {
        let sm0: Vec<u32> = (0..10).map(|i| if i % 2 == 0 { 90 } else { 15 }).collect();
        let sm1: Vec<u32> = (0..10).map(|i| if i % 2 == 0 { 81 } else { 9 }).collect();
        for events in [true, false] {
            let mut a = straggler(&sm0, &sm1);
            let mut calls = ddp_calls(10, events);
            calls.extend(ddp_calls(11, events));
            a.cuda = crate::cuda::build(calls, Vec::new(), BTreeMap::new(), 0);
            assert_eq!(a.cuda.event_deps.contains(&10), events);
            // Each all-reduce is outstanding from its queueing to the end of `.item()`'s sync.
            assert!(
                a.cuda.collectives.iter().all(|c| c.done_ns.is_some()),
                "{:?}",
                a.cuda.collectives
            );
            let w = derive_alone(&a);
            let waited: f64 = w[&0].fractions.iter().sum();
            assert!((waited - 10.0).abs() < 0.5, "events {events}: {waited}");
        }
    }

    #[test]
    fn with_an_event_the_probes_missed_the_wait_lasts_until_the_next_collective() {
        // The end event's record was not seen: the sync cannot tie itself to the all-reduce,
        // which stays outstanding until the next one on its communicator.
        let mut calls: Vec<_> = ddp_calls(10, true)
            .into_iter()
            .filter(|c| !matches!(c.op, crate::cuda::CudaOp::EventRecord { .. }))
            .collect();
        calls.extend(ddp_calls(11, true));
        let mut a = straggler(&[], &[]);
        a.cuda = crate::cuda::build(calls, Vec::new(), BTreeMap::new(), 0);
        let mine: Vec<_> = a.cuda.collectives.iter().filter(|c| c.pid == 10).collect();
        assert!(mine.iter().all(|c| c.done_ns.is_none()), "{mine:?}");
        let out = outstanding(&a, &[10]);
        assert_eq!(out.0.first().map(|s| s.0), Some(2 * P));
        assert_eq!(out.0.last().map(|s| s.1), Some(a.duration_ns));
        // Without GPM the peers still show the wait.
        let w = derive_alone(&a);
        assert_eq!(w[&0].signal, WaitingSignal::Peers);
        assert!(w[&0].fractions.iter().sum::<f64>() > 8.0, "{:?}", w[&0]);
    }
}
