//! Several ranks of one job: each rank's time waiting in NCCL collectives, and the rank the
//! others waited for. A collective completes only when every rank has reached it, so the rank
//! that arrives last waits least: the straggler is the rank with the least collective wait
//! while the others waited long. What the straggler itself was doing is its own GPU's cause.
//!
//! Ranks are compared by their wait totals, never by timestamps, so recordings from different
//! hosts (whose monotonic clocks are unrelated) combine without clock alignment.
use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::Attribution;
use super::causes::Cause;
// A straggler throttled in this share of its busy samples is slow because of its GPU.
use super::throttle::THROTTLED_SHARE;
use crate::analysis::model::Analysis;
use crate::cuda::WaitKind;
use crate::nvml::clock_events;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankReport {
    /// From `ncclCommInitRank` when the probes saw it, else the process's RANK variable;
    /// `None` when neither was there (the communicator was made before attach).
    pub rank: Option<u32>,
    pub nranks: Option<u32>,
    pub pid: u32,
    /// The recording's host.
    pub host: String,
    /// NVML index of the GPU the rank ran on, if NVML listed it.
    pub gpu: Option<u32>,
    pub nccl_wait_ns: u64,
    /// GPU idle and waiting time labelled `nccl_wait` over the GPU's observed time (without GPU samples:
    /// time in syncs on collectives over the recording).
    pub nccl_wait_share: f64,
    /// The cause of most of its GPU's idle time other than `nccl_wait`.
    pub own_cause: Option<Cause>,
    /// How much its GPU ran throttled, where NVML reported its state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle: Option<Throttle>,
    /// Collectives (matched across the recording's ranks) it was the last to queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arrived_last: Option<u64>,
    /// Summed over those, how much later than the others' median it queued them, ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_ns: Option<u64>,
}

/// A GPU's clocks held down, from its NVML state samples while busy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Throttle {
    /// Busy state samples with a slowdown reason, over all busy state samples.
    pub share: f64,
    /// The reasons seen, NVML's names.
    pub reasons: Vec<Cow<'static, str>>,
    /// Median SM clock over the busy samples.
    pub sm_clock_mhz: Option<u32>,
}

/// Each collective's last rank, matched by order on a communicator across the ranks of one
/// recording (one host's clock).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Arrivals {
    /// Collectives every rank of the recording queued.
    pub matched: u64,
    /// Median over them of how much later the last rank queued it than the others' median.
    pub median_late_ns: u64,
    /// The ones with the latest last rank, most late first (at most [`TOP_ARRIVALS`]).
    pub latest: Vec<LateArrival>,
    /// Queueing is the host's arrival: a rank whose GPU (not host) is slow queues late only
    /// by its GPU work after a step's last collective, and shows in the wait totals.
    pub note: Cow<'static, str>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LateArrival {
    pub host: String,
    /// The collective's position on the communicator, counted from the first the probes saw
    /// on the reference rank.
    pub seq: u64,
    pub pid: u32,
    pub rank: Option<u32>,
    pub late_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    pub rank: Option<u32>,
    pub pid: u32,
    pub host: String,
    pub own_cause: Option<Cause>,
    pub text: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankView {
    pub ranks: Vec<RankReport>,
    /// Per recording with several ranks: who queued each collective last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arrivals: Vec<Arrivals>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub straggler: Option<Straggler>,
}

/// The others must wait at least this multiple of the straggler's wait...
const WAIT_RATIO: f64 = 2.0;
/// ...and at least this share of the recording.
const WAIT_SHARE_MIN: f64 = 0.05;
/// Late arrivals listed.
pub const TOP_ARRIVALS: usize = 10;
/// A power-capped clock this far below the other ranks' is a slowdown.
const CAPPED_CLOCK: f64 = 0.9;

fn host_of(a: &Analysis) -> String {
    a.meta
        .as_ref()
        .map(|m| m.hostname.clone())
        .unwrap_or_default()
}

/// A rank's own cause must have taken at least this share of its GPU's time.
const OWN_CAUSE_MIN: f64 = 0.02;

fn own_cause(att: Option<&Attribution>, gpu: Option<u32>) -> Option<Cause> {
    let att = att?;
    let g = att.gpus.iter().find(|g| Some(g.gpu) == gpu)?;
    g.idle_by_cause
        .iter()
        .filter(|(c, _)| !matches!(c, Cause::NcclWait | Cause::Unknown))
        .max_by_key(|(c, ns)| (**ns, std::cmp::Reverse(**c)))
        .filter(|(_, ns)| **ns > 0 && **ns as f64 >= OWN_CAUSE_MIN * g.observed_ns as f64)
        .map(|(c, _)| *c)
}

/// The ranks in one or more recordings (one per host, or one for a whole host), each with
/// its attribution.
pub fn ranks(recordings: &[(&Analysis, Option<&Attribution>)]) -> RankView {
    let mut out = Vec::new();
    for &(a, attribution) in recordings {
        // Every process that issued collectives is a rank, named or not.
        let mut pids: std::collections::BTreeSet<u32> = a.cuda.ranks.keys().copied().collect();
        pids.extend(a.cuda.calls.iter().filter_map(|c| {
            matches!(c.op, crate::cuda::CudaOp::Collective { .. }).then_some(c.pid)
        }));
        for pid in pids {
            let info = a.cuda.ranks.get(&pid).or(a.cuda.env_ranks.get(&pid));
            let gpu = a
                .gpus
                .values()
                .find(|g| g.info.target_pids.contains(&pid))
                .map(|g| g.info.index);
            // On its GPU: the idle and waiting time labelled nccl_wait, over the observed time (a sync on
            // a collective also covers the kernels queued before it, which are not waiting).
            // Without GPU samples: the time in syncs on collectives, over the recording.
            let on_gpu = attribution.and_then(|att| {
                let g = att.gpus.iter().find(|g| Some(g.gpu) == gpu)?;
                let ns = g.lost_by_cause.get(&Cause::NcclWait).copied().unwrap_or(0);
                Some((ns, ns as f64 / g.observed_ns.max(1) as f64))
            });
            let (wait, share) = on_gpu.unwrap_or_else(|| {
                let ns: u64 = a
                    .cuda
                    .waits
                    .iter()
                    .filter(|w| w.pid == pid && w.kind == WaitKind::Collective)
                    .map(|w| w.end_ns - w.start_ns)
                    // Saturating: the times come from a file, which may be damaged.
                    .fold(0, u64::saturating_add);
                (ns, ns as f64 / a.duration_ns.max(1) as f64)
            });
            out.push(RankReport {
                rank: info.map(|i| i.rank),
                nranks: info.map(|i| i.nranks).filter(|&n| n > 0),
                pid,
                host: host_of(a),
                gpu,
                nccl_wait_ns: wait,
                nccl_wait_share: share,
                own_cause: own_cause(attribution, gpu),
                throttle: None,
                arrived_last: None,
                late_ns: None,
            });
        }
    }
    let mut arrivals = Vec::new();
    for &(a, _) in recordings {
        if let Some(arr) = arrivals_in(a, &mut out) {
            arrivals.push(arr);
        }
    }
    judge_throttle(recordings, &mut out);
    out.sort_by_key(|r| (r.rank, r.pid));
    let straggler = straggler(&out);
    RankView {
        ranks: out,
        arrivals,
        straggler,
    }
}

/// Median of the busy SM clocks in `states`, the slowdown reasons seen and the busy samples
/// holding one (`None` for the power cap, judged against the other ranks later).
struct Clocks {
    busy: u64,
    slowed: u64,
    capped_clocks: Vec<u32>,
    reasons: u64,
    median_mhz: Option<u32>,
}

fn clocks(g: &crate::analysis::model::GpuTimeline) -> Option<Clocks> {
    let busy: Vec<&crate::recording::record::GpuState> = g
        .states
        .iter()
        .filter(|s| {
            s.throttle_reasons
                .is_some_and(|r| r & clock_events::GPU_IDLE == 0)
        })
        .collect();
    if busy.is_empty() {
        return None;
    }
    let mut c = Clocks {
        busy: busy.len() as u64,
        slowed: 0,
        capped_clocks: Vec::new(),
        reasons: 0,
        median_mhz: None,
    };
    let mut mhz: Vec<u32> = busy.iter().filter_map(|s| s.sm_clock_mhz).collect();
    mhz.sort_unstable();
    c.median_mhz = mhz.get(mhz.len() / 2).copied();
    for s in busy {
        let r = s.throttle_reasons.unwrap_or(0);
        if clock_events::slows_any_load(r) {
            c.slowed += 1;
            c.reasons |= r;
        } else if r & clock_events::SW_POWER_CAP != 0 {
            // Normal under full load: a slowdown only when the clock it leaves is well below
            // the other ranks'.
            c.capped_clocks.push(s.sm_clock_mhz.unwrap_or(0));
        }
    }
    Some(c)
}

/// Each rank's throttling: slowdown reasons, plus power-capped samples whose SM clock is
/// well below the fastest other rank's median.
fn judge_throttle(recordings: &[(&Analysis, Option<&Attribution>)], out: &mut [RankReport]) {
    let mut per_rank: Vec<Option<Clocks>> = out
        .iter()
        .map(|r| {
            let (a, _) = recordings
                .iter()
                .find(|(a, _)| host_of(a) == r.host && a.cuda.probed_pids().any(|p| p == r.pid))
                .or(recordings.first())?;
            clocks(a.gpus.get(&r.gpu?)?)
        })
        .collect();
    let medians: Vec<Option<u32>> = per_rank
        .iter()
        .map(|c| c.as_ref().and_then(|c| c.median_mhz))
        .collect();
    for (i, (r, c)) in out.iter_mut().zip(per_rank.iter_mut()).enumerate() {
        let Some(c) = c else { continue };
        let fastest_other = medians
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, m)| *m)
            .max();
        let capped = fastest_other.map_or(0, |f| {
            c.capped_clocks
                .iter()
                .filter(|&&mhz| f64::from(mhz) < CAPPED_CLOCK * f64::from(f))
                .count() as u64
        });
        let mut slowing: Vec<&clock_events::Reason> = clock_events::set_in(c.reasons)
            .filter(|r| r.slows_any_load)
            .collect();
        slowing.sort_by_key(|r| r.bit);
        let mut reasons: Vec<&'static str> = slowing.iter().map(|r| r.key).collect();
        if capped > 0 {
            let cap = clock_events::set_in(clock_events::SW_POWER_CAP).map(|r| r.key);
            reasons.extend(cap);
        }
        let share = (c.slowed + capped) as f64 / c.busy as f64;
        if share >= THROTTLED_SHARE {
            r.own_cause = Some(Cause::GpuThrottled);
        }
        r.throttle = Some(Throttle {
            share,
            reasons: reasons.into_iter().map(Cow::Borrowed).collect(),
            sm_clock_mhz: c.median_mhz,
        });
    }
}

/// Matches the collectives of the ranks in one recording and finds each one's last rank.
fn arrivals_in(a: &Analysis, out: &mut [RankReport]) -> Option<Arrivals> {
    use std::collections::BTreeMap;
    // By communicator (its cross-rank id; one group when the probes missed the inits).
    type Times = Vec<(u64, Option<u64>)>;
    let mut by_comm: BTreeMap<Option<u64>, BTreeMap<u32, Times>> = BTreeMap::new();
    for c in &a.cuda.collectives {
        by_comm
            .entry(c.comm_id)
            .or_default()
            .entry(c.pid)
            .or_default()
            .push((c.enqueue_ns, c.done_ns));
    }
    let host = host_of(a);
    let mut lates: Vec<LateArrival> = Vec::new();
    let mut matched = 0;
    for ranks in by_comm.values() {
        if ranks.len() < 2 {
            continue;
        }
        let (&reference, ref_times) = ranks.iter().max_by_key(|(_, v)| v.len())?;
        // The probes reach each rank at a different moment: line each up with the reference
        // at the offset that makes their completions agree best (a collective completes on
        // every rank at once; queue times cannot say, since a rank that waited queues its
        // next collective as the late rank queues this one).
        let offsets: BTreeMap<u32, i64> = ranks
            .iter()
            .map(|(&pid, times)| {
                let off = if pid == reference {
                    0
                } else {
                    best_offset(ref_times, times)
                };
                (pid, off)
            })
            .collect();
        for (k, _) in ref_times.iter().enumerate() {
            let mut at: Vec<(u32, u64)> = Vec::new();
            for (&pid, times) in ranks {
                let j = k as i64 + offsets[&pid];
                if let Some(&(t, _)) = usize::try_from(j).ok().and_then(|j| times.get(j)) {
                    at.push((pid, t));
                }
            }
            if at.len() < ranks.len() {
                continue;
            }
            matched += 1;
            at.sort_by_key(|&(_, t)| t);
            let (last_pid, last) = *at.last()?;
            let others: Vec<u64> = at[..at.len() - 1].iter().map(|&(_, t)| t).collect();
            let median = others[others.len() / 2];
            let late = last.saturating_sub(median);
            let rank = out
                .iter()
                .find(|r| r.pid == last_pid && r.host == host)
                .and_then(|r| r.rank);
            lates.push(LateArrival {
                host: host.clone(),
                seq: k as u64,
                pid: last_pid,
                rank,
                late_ns: late,
            });
        }
    }
    if matched == 0 {
        return None;
    }
    for r in out.iter_mut().filter(|r| r.host == host) {
        let mine: Vec<&LateArrival> = lates.iter().filter(|l| l.pid == r.pid).collect();
        r.arrived_last = Some(mine.len() as u64);
        r.late_ns = Some(mine.iter().map(|l| l.late_ns).fold(0, u64::saturating_add));
    }
    let mut late: Vec<u64> = lates.iter().map(|l| l.late_ns).collect();
    late.sort_unstable();
    lates.sort_by(|x, y| y.late_ns.cmp(&x.late_ns).then(x.seq.cmp(&y.seq)));
    lates.truncate(TOP_ARRIVALS);
    Some(Arrivals {
        matched,
        median_late_ns: late[late.len() / 2],
        latest: lates,
        note: "queue times on the host's clock: a rank whose GPU, not its host, is slow queues \
               late only by its GPU work after a step's last collective, well short of the \
               wait it causes (see the wait totals)"
            .into(),
    })
}

/// The shift of `times` against `reference` (in collectives, at most a few either way) whose
/// completion times agree best on average (several collectives of a step complete in the
/// same sync, so a median would not tell shifts within a step apart); 0 without completions.
fn best_offset(reference: &[(u64, Option<u64>)], times: &[(u64, Option<u64>)]) -> i64 {
    const MAX_SHIFT: i64 = 4;
    (-MAX_SHIFT..=MAX_SHIFT)
        .filter_map(|off| {
            let d: Vec<u64> = reference
                .iter()
                .enumerate()
                .filter_map(|(k, &(_, done))| {
                    let j = usize::try_from(k as i64 + off).ok()?;
                    Some(done?.abs_diff(times.get(j)?.1?))
                })
                .collect();
            if d.is_empty() || d.len() < reference.len().min(times.len()) / 2 {
                return None;
            }
            let mean = d.iter().map(|&x| x as f64).sum::<f64>() / d.len() as f64;
            Some((mean, off.abs(), off))
        })
        .min_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)))
        .map_or(0, |(_, _, off)| off)
}

fn straggler(ranks: &[RankReport]) -> Option<Straggler> {
    if ranks.len() < 2 {
        return None;
    }
    let least = ranks.iter().min_by(|x, y| {
        x.nccl_wait_share
            .total_cmp(&y.nccl_wait_share)
            .then(x.rank.cmp(&y.rank))
    })?;
    let others: Vec<&RankReport> = ranks
        .iter()
        .filter(|r| r.pid != least.pid || r.host != least.host)
        .collect();
    let waited = others.iter().all(|r| {
        r.nccl_wait_share >= WAIT_SHARE_MIN
            && r.nccl_wait_share >= WAIT_RATIO * least.nccl_wait_share
    });
    if !waited {
        return None;
    }
    let mean_wait = others.iter().map(|r| r.nccl_wait_share).sum::<f64>() / others.len() as f64;
    let host = if least.host.is_empty() {
        String::new()
    } else {
        format!(" on {}", least.host)
    };
    let who = match least.rank {
        Some(r) => format!("rank {r} (PID {}{host})", least.pid),
        None => format!("the rank in PID {}{host}", least.pid),
    };
    let text = format!(
        "{who} is the straggler: the other ranks' GPUs idled or waited for it in NCCL collectives {:.0}% of the time, its own {:.0}%{}",
        mean_wait * 100.0,
        least.nccl_wait_share * 100.0,
        match (least.own_cause, &least.throttle) {
            (Some(Cause::GpuThrottled), Some(t)) => format!(
                "; its GPU ran throttled in {:.0}% of its busy samples ({}{})",
                t.share * 100.0,
                t.reasons.join(", "),
                t.sm_clock_mhz
                    .map_or(String::new(), |m| format!(", SM clock {m} MHz"))
            ),
            (Some(c), _) => format!("; its GPU idled mostly because of {}", c.name()),
            (None, _) => String::new(),
        }
    );
    Some(Straggler {
        rank: least.rank,
        pid: least.pid,
        host: least.host.clone(),
        own_cause: least.own_cause,
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: u32, share: f64, cause: Option<Cause>) -> RankReport {
        RankReport {
            rank: Some(rank),
            nranks: Some(3),
            pid: 100 + rank,
            host: "h".into(),
            gpu: Some(rank),
            nccl_wait_ns: (share * 1e9) as u64,
            nccl_wait_share: share,
            own_cause: cause,
            throttle: None,
            arrived_last: None,
            late_ns: None,
        }
    }

    #[test]
    fn the_rank_everyone_waited_for_is_named_with_its_cause() {
        let s = straggler(&[
            rank(0, 0.4, None),
            rank(1, 0.02, Some(Cause::Disk)),
            rank(2, 0.35, None),
        ])
        .unwrap();
        assert_eq!((s.rank, s.own_cause), (Some(1), Some(Cause::Disk)));
        assert!(s.text.contains("disk"), "{}", s.text);
    }

    #[test]
    fn balanced_ranks_have_no_straggler() {
        assert!(straggler(&[rank(0, 0.3, None), rank(1, 0.25, None)]).is_none());
        assert!(straggler(&[rank(0, 0.01, None), rank(1, 0.0, None)]).is_none());
    }

    use crate::analysis::model::GpuTimeline;
    use crate::cuda::{CollectiveSpan, RankInfo};
    use crate::recording::record::{GpuInfo, GpuState};

    fn span(pid: u32, seq: u64, at: u64) -> CollectiveSpan {
        super::super::fixtures::all_reduce(pid, seq, at, None)
    }

    /// Three ranks, PIDs 10..12 on GPUs 0..2; rank 2 queues every collective 50 ms late, and
    /// the probes reached rank 1 one collective late.
    fn job() -> Analysis {
        let mut a = Analysis::default();
        for r in 0..3u32 {
            let pid = 10 + r;
            a.cuda.ranks.insert(
                pid,
                RankInfo {
                    rank: r,
                    nranks: 3,
                    comm_id: 9,
                },
            );
            a.gpus.insert(
                r,
                GpuTimeline {
                    info: GpuInfo {
                        index: r,
                        target_pids: vec![pid],
                        ..GpuInfo::default()
                    },
                    ..GpuTimeline::default()
                },
            );
            let skip = u64::from(r == 1);
            for k in skip..20 {
                let late = if r == 2 {
                    50_000_000
                } else {
                    u64::from(r) * 1_000
                };
                let mut c = span(pid, k - skip, k * 1_000_000_000 + late);
                // Every rank's sync returns once the late rank has queued it.
                c.done_ns = Some(k * 1_000_000_000 + 60_000_000 + u64::from(r) * 1_000);
                a.cuda.collectives.push(c);
            }
        }
        a
    }

    #[test]
    fn each_collectives_last_rank_is_found_across_probe_start_offsets() {
        let a = job();
        let v = ranks(&[(&a, None)]);
        assert_eq!(v.arrivals.len(), 1);
        let arr = &v.arrivals[0];
        assert_eq!(arr.matched, 19, "{arr:?}");
        assert!(arr.latest.iter().all(|l| l.rank == Some(2)), "{arr:?}");
        assert!(
            (49_000_000..=50_000_000).contains(&arr.median_late_ns),
            "{arr:?}"
        );
        let r2 = v.ranks.iter().find(|r| r.rank == Some(2)).unwrap();
        assert_eq!(r2.arrived_last, Some(19));
        let r0 = v.ranks.iter().find(|r| r.rank == Some(0)).unwrap();
        assert_eq!(r0.arrived_last, Some(0));
    }

    fn states(reasons: u64, mhz: u32, n: u64) -> Vec<GpuState> {
        (0..n)
            .map(|i| GpuState {
                ts_ns: i * 500_000_000,
                throttle_reasons: Some(reasons),
                sm_clock_mhz: Some(mhz),
                ..GpuState::default()
            })
            .collect()
    }

    #[test]
    fn a_gpu_slowed_by_a_thermal_reason_or_a_low_power_capped_clock_is_throttled() {
        let mut a = job();
        a.gpus.get_mut(&0).unwrap().states = states(0x4, 1980, 10);
        a.gpus.get_mut(&1).unwrap().states = states(0x4, 1700, 10);
        a.gpus.get_mut(&2).unwrap().states = states(0x20, 1100, 10);
        let v = ranks(&[(&a, None)]);
        let by_rank = |r| v.ranks.iter().find(|x| x.rank == Some(r)).unwrap();
        // The power cap alone is normal under load; 1700 MHz against 1980 is 14% slower.
        assert_eq!(by_rank(0).own_cause, None);
        assert_eq!(by_rank(1).own_cause, Some(Cause::GpuThrottled));
        assert_eq!(
            by_rank(1).throttle.as_ref().unwrap().reasons,
            ["sw_power_cap"]
        );
        let t2 = by_rank(2).throttle.as_ref().unwrap();
        assert_eq!(
            (t2.share, t2.reasons.as_slice()),
            (
                1.0,
                &[std::borrow::Cow::Borrowed("sw_thermal_slowdown")][..]
            )
        );
        assert_eq!(by_rank(2).own_cause, Some(Cause::GpuThrottled));
        // Idle samples do not count.
        a.gpus.get_mut(&2).unwrap().states = states(0x1 | 0x20, 1100, 10);
        let v = ranks(&[(&a, None)]);
        assert_eq!(v.ranks[2].throttle, None);
    }

    #[test]
    fn a_throttled_straggler_is_named_with_its_gpu() {
        let mut r2 = rank(2, 0.01, Some(Cause::GpuThrottled));
        r2.throttle = Some(Throttle {
            share: 0.9,
            reasons: vec!["sw_thermal_slowdown".into()],
            sm_clock_mhz: Some(1100),
        });
        let s = straggler(&[rank(0, 0.4, None), rank(1, 0.35, None), r2]).unwrap();
        assert_eq!(s.own_cause, Some(Cause::GpuThrottled));
        assert!(
            s.text.contains("throttled") && s.text.contains("1100 MHz"),
            "{}",
            s.text
        );
    }
}
