//! Evidence for the causes the CUDA probes name: the calls the feeder's process waited in,
//! pinned against pageable bytes, the bandwidth copies achieved, and the PCIe link.
use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::causes::{Cause, CudaEvidenceKind};
use super::intervals::{contains, overlaps};
use super::{link::LinkState, roles::Roles};
use crate::analysis::model::{Analysis, GpuTimeline};
use crate::cuda::{CudaOp, WaitKind};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CudaEvidence {
    /// Time the GPU's processes spent in the waits this cause is about, ns.
    pub wait_ns: u64,
    /// The calls behind it, longest total first.
    pub calls: Vec<CallEvidence>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copies: Option<CopyEvidence>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkEvidence>,
    /// NCCL collectives enqueued in the stall, by op.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collectives: Vec<CollectiveEvidence>,
    /// For `launch_overhead`: the feeder processes' kernel launches per second over the
    /// recording, and per entry point as counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launches_per_sec: Option<f64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub launches_by_api: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallEvidence {
    pub api: String,
    /// Who called it (the return address at entry, symbolized).
    pub caller: String,
    pub calls: u64,
    pub total_ns: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CopyEvidence {
    pub pinned_bytes: u64,
    pub pageable_bytes: u64,
    /// Bytes over the time the feeder waited on copies: a lower bound, since a sync on a
    /// copy also waits for kernels queued behind it.
    pub achieved_gbps: Option<f64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkEvidence {
    pub generation: u32,
    pub width: u32,
    pub max_gen: u32,
    pub max_width: u32,
    /// What the link gives now, and at its maximum generation and width.
    pub current_gbps: f64,
    pub expected_gbps: f64,
    pub saturated: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveEvidence {
    pub op: Cow<'static, str>,
    pub calls: u64,
    pub bytes: u64,
}

fn wanted(kind: CudaEvidenceKind, wait: WaitKind) -> bool {
    match kind {
        CudaEvidenceKind::Copies => matches!(wait, WaitKind::PageableCopy | WaitKind::PinnedCopy),
        CudaEvidenceKind::Collectives => wait == WaitKind::Collective,
        CudaEvidenceKind::Launches | CudaEvidenceKind::None => false,
    }
}

/// The CUDA evidence for `cause` over `ranges` (sorted, not overlapping; see
/// [`super::evidence::gather`]); `None` for the causes the probes do not speak to.
pub fn gather(
    a: &Analysis,
    roles: &Roles,
    g: &GpuTimeline,
    cause: Cause,
    ranges: &[(u64, u64)],
) -> Option<CudaEvidence> {
    let kind = cause.spec().cuda;
    if kind == CudaEvidenceKind::None {
        return None;
    }
    let end = ranges.last().map_or(0, |r| r.1);
    let gpu_pids: Vec<u32> = roles
        .feeders
        .iter()
        .filter_map(|t| a.threads.get(t).map(|t| t.pid))
        .collect();
    let mut ev = CudaEvidence::default();
    let mut calls: BTreeMap<(String, String), CallEvidence> = BTreeMap::new();
    let (mut copy_ns, mut copy_bytes) = (0u64, 0u64);
    let (mut pinned, mut pageable) = (0u64, 0u64);
    for w in &a.cuda.waits {
        if !wanted(kind, w.kind) || !gpu_pids.contains(&w.pid) {
            continue;
        }
        if !overlaps(ranges, w.start_ns, w.end_ns) {
            continue;
        }
        let ns = w.end_ns - w.start_ns;
        // Saturating: durations and sizes come from a file, which may be damaged.
        ev.wait_ns = ev.wait_ns.saturating_add(ns);
        let call = &a.cuda.calls[w.call];
        if matches!(w.kind, WaitKind::PageableCopy | WaitKind::PinnedCopy) {
            copy_ns = copy_ns.saturating_add(ns);
            // Each copy's bytes once: a copy call that waited (staging, or a synchronous
            // copy) counts them; a sync after it waits for the same bytes, so it counts only
            // the asynchronous pinned copies, whose calls did not wait.
            let (p, q) = match call.op {
                CudaOp::Copy { .. } if w.kind == WaitKind::PinnedCopy => (w.bytes, 0),
                CudaOp::Copy { .. } => (0, w.bytes),
                _ => (w.pinned_bytes, 0),
            };
            pinned = pinned.saturating_add(p);
            pageable = pageable.saturating_add(q);
            copy_bytes = copy_bytes.saturating_add(p).saturating_add(q);
        }
        let e = calls
            .entry((call.api.clone(), call.caller.clone()))
            .or_insert_with(|| CallEvidence {
                api: call.api.clone(),
                caller: call.caller.clone(),
                ..CallEvidence::default()
            });
        e.calls += 1;
        e.total_ns = e.total_ns.saturating_add(ns);
    }
    let mut calls: Vec<CallEvidence> = calls.into_values().collect();
    calls.sort_by(|x, y| y.total_ns.cmp(&x.total_ns).then(x.api.cmp(&y.api)));
    calls.truncate(5);
    ev.calls = calls;
    if kind == CudaEvidenceKind::Copies {
        let achieved = (copy_ns > 0 && copy_bytes > 0).then(|| copy_bytes as f64 / copy_ns as f64);
        ev.copies = Some(CopyEvidence {
            pinned_bytes: pinned,
            pageable_bytes: pageable,
            achieved_gbps: achieved,
        });
        ev.link = LinkState::at(g, end).map(|l| LinkEvidence {
            generation: l.generation,
            width: l.width,
            max_gen: l.max_gen,
            max_width: l.max_width,
            current_gbps: l.current_gbps(),
            expected_gbps: l.max_gbps(),
            saturated: l.saturated(),
        });
    }
    if kind == CudaEvidenceKind::Launches {
        let mut pids = gpu_pids.clone();
        pids.sort_unstable();
        pids.dedup();
        ev.launches_per_sec = Some(
            pids.iter()
                .filter_map(|p| a.cuda.launches.get(p))
                .map(|l| l.per_sec)
                .sum(),
        );
        for p in &pids {
            for (api, n) in a.cuda.launches_by_api.get(p).into_iter().flatten() {
                *ev.launches_by_api.entry(api.clone()).or_default() += n;
            }
        }
    }
    if kind == CudaEvidenceKind::Collectives {
        let mut by_op: BTreeMap<&'static str, CollectiveEvidence> = BTreeMap::new();
        for c in &a.cuda.calls {
            if !gpu_pids.contains(&c.pid) || !contains(ranges, c.start_ns) {
                continue;
            }
            if let CudaOp::Collective { op, bytes, .. } = c.op {
                let e = by_op
                    .entry(op.name())
                    .or_insert_with(|| CollectiveEvidence {
                        op: op.name().into(),
                        ..CollectiveEvidence::default()
                    });
                e.calls += 1;
                e.bytes = e.bytes.saturating_add(bytes);
            }
        }
        ev.collectives = by_op.into_values().collect();
    }
    Some(ev)
}
