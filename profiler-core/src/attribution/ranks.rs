//! Several ranks of one job: each rank's time waiting in NCCL collectives, and the rank the
//! others waited for. A collective completes only when every rank has reached it, so the rank
//! that arrives last waits least: the straggler is the rank with the least collective wait
//! while the others waited long. What the straggler itself was doing is its own GPU's cause.
//!
//! Ranks are compared by their wait totals, never by timestamps, so recordings from different
//! hosts (whose monotonic clocks are unrelated) combine without clock alignment.
use serde::Serialize;

use super::{Attribution, Cause};
use crate::analysis::model::Analysis;
use crate::cuda::WaitKind;

#[derive(Clone, Debug, PartialEq, Serialize)]
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
    /// GPU idle time labelled `nccl_wait` over the GPU's observed time (without GPU samples:
    /// time in syncs on collectives over the recording).
    pub nccl_wait_share: f64,
    /// The cause of most of its GPU's idle time other than `nccl_wait`.
    pub own_cause: Option<Cause>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Straggler {
    pub rank: Option<u32>,
    pub pid: u32,
    pub host: String,
    pub own_cause: Option<Cause>,
    pub text: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RankView {
    pub ranks: Vec<RankReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub straggler: Option<Straggler>,
}

/// The others must wait at least this multiple of the straggler's wait...
const WAIT_RATIO: f64 = 2.0;
/// ...and at least this share of the recording.
const WAIT_SHARE_MIN: f64 = 0.05;

fn host_of(a: &Analysis) -> String {
    a.meta
        .as_ref()
        .map(|m| m.hostname.clone())
        .unwrap_or_default()
}

fn own_cause(att: Option<&Attribution>, gpu: Option<u32>) -> Option<Cause> {
    let att = att?;
    let g = att.gpus.iter().find(|g| Some(g.gpu) == gpu)?;
    g.idle_by_cause
        .iter()
        .filter(|(c, _)| !matches!(c, Cause::NcclWait | Cause::Unknown))
        .max_by_key(|(c, ns)| (**ns, std::cmp::Reverse(**c)))
        .filter(|(_, ns)| **ns > 0)
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
            // On its GPU: the idle time labelled nccl_wait, over the observed time (a sync on
            // a collective also covers the kernels queued before it, which are not waiting).
            // Without GPU samples: the time in syncs on collectives, over the recording.
            let on_gpu = attribution.and_then(|att| {
                let g = att.gpus.iter().find(|g| Some(g.gpu) == gpu)?;
                let ns = g.idle_by_cause.get(&Cause::NcclWait).copied().unwrap_or(0);
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
            });
        }
    }
    out.sort_by_key(|r| (r.rank, r.pid));
    let straggler = straggler(&out);
    RankView {
        ranks: out,
        straggler,
    }
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
        "{who} is the straggler: the other ranks' GPUs idled {:.0}% of the time waiting for it in NCCL collectives, its own {:.0}%{}",
        mean_wait * 100.0,
        least.nccl_wait_share * 100.0,
        match least.own_cause {
            Some(c) => format!("; its GPU idled mostly because of {}", c.name()),
            None => String::new(),
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
}
