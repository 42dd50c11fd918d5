//! Per-process totals of what the CUDA/NCCL probes saw, for the reports.
use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CudaView, LaunchStats, ProbedLibrary, RankInfo, WaitKind};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CudaSummary<'a> {
    pub libraries: Cow<'a, [ProbedLibrary]>,
    pub processes: Vec<ProcessCuda>,
    /// How long launches were counted: launch rates are counts over this.
    pub launch_probed_ns: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessCuda {
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<RankInfo>,
    /// Time inside CUDA calls by what was waited for, ns: `copy_calls` (staging or
    /// synchronous copies), and syncs `after_copy` (a copy queued, kernels maybe behind it),
    /// `on_collective`, `on_kernels`.
    pub wait_ns: BTreeMap<Cow<'static, str>, u64>,
    pub calls: Vec<ApiTotal>,
    pub pinned_copy_bytes: u64,
    pub pageable_copy_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launches: Option<LaunchStats>,
    /// Launches counted per entry point (which ones a job reaches).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub launches_by_api: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiTotal {
    pub api: String,
    pub calls: u64,
    pub total_ns: u64,
    /// Calls that returned an error.
    pub errors: u64,
    /// Where the calls came from, most time first (the three largest): the Python line
    /// when the caller runs CPython, else the native function.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callers: Vec<CallerTotal>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerTotal {
    pub caller: String,
    pub calls: u64,
    pub total_ns: u64,
}

/// Callers kept per API.
const CALLERS_KEPT: usize = 3;

pub fn summarize(v: &CudaView) -> CudaSummary<'_> {
    let mut procs: BTreeMap<u32, ProcessCuda> = BTreeMap::new();
    let mut apis: BTreeMap<(u32, &str), ApiTotal> = BTreeMap::new();
    let mut callers: BTreeMap<(u32, &str, &str), CallerTotal> = BTreeMap::new();
    for c in &v.calls {
        if !c.caller.is_empty() {
            let t = callers
                .entry((c.pid, c.api.as_str(), c.caller.as_str()))
                .or_insert_with(|| CallerTotal {
                    caller: c.caller.clone(),
                    ..CallerTotal::default()
                });
            t.calls += 1;
            t.total_ns = t
                .total_ns
                .saturating_add(c.end_ns.saturating_sub(c.start_ns));
        }
        procs.entry(c.pid).or_default();
        let t = apis
            .entry((c.pid, c.api.as_str()))
            .or_insert_with(|| ApiTotal {
                api: c.api.clone(),
                ..ApiTotal::default()
            });
        t.calls += 1;
        // Saturating: the times come from a file, which may be damaged.
        t.total_ns = t
            .total_ns
            .saturating_add(c.end_ns.saturating_sub(c.start_ns));
        if c.status != 0 && c.status != crate::recording::record::IN_PROGRESS {
            t.errors += 1;
        }
    }
    for w in &v.waits {
        let what = match (w.kind, w.sync) {
            (WaitKind::PageableCopy | WaitKind::PinnedCopy, false) => "copy_calls",
            (WaitKind::PageableCopy | WaitKind::PinnedCopy, true) => "sync_after_copy",
            (WaitKind::Collective, _) => "sync_on_collective",
            (WaitKind::Kernel, _) => "sync_on_kernels",
        };
        let ns = procs
            .entry(w.pid)
            .or_default()
            .wait_ns
            .entry(what.into())
            .or_default();
        *ns = ns.saturating_add(w.end_ns - w.start_ns);
    }
    for (pid, l) in &v.launches {
        procs.entry(*pid).or_default().launches = Some(*l);
    }
    for (pid, by_api) in &v.launches_by_api {
        procs.entry(*pid).or_default().launches_by_api = by_api.clone();
    }
    for (pid, (pinned, pageable)) in &v.copy_bytes {
        let p = procs.entry(*pid).or_default();
        p.pinned_copy_bytes = *pinned;
        p.pageable_copy_bytes = *pageable;
    }
    for ((pid, api, _), t) in callers {
        if let Some(a) = apis.get_mut(&(pid, api)) {
            a.callers.push(t);
        }
    }
    for ((pid, _), mut t) in apis {
        t.callers
            .sort_by(|x, y| y.total_ns.cmp(&x.total_ns).then(x.caller.cmp(&y.caller)));
        t.callers.truncate(CALLERS_KEPT);
        procs.entry(pid).or_default().calls.push(t);
    }
    let processes = procs
        .into_iter()
        .map(|(pid, mut p)| {
            p.pid = pid;
            p.rank = v.ranks.get(&pid).copied();
            p.calls
                .sort_by(|x, y| y.total_ns.cmp(&x.total_ns).then(x.api.cmp(&y.api)));
            p
        })
        .collect();
    CudaSummary {
        libraries: Cow::Borrowed(&v.libraries),
        processes,
        launch_probed_ns: v.launch_probed_ns,
    }
}
