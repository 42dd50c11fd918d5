//! The evidence behind a label: which threads did what during a stall, or during every window
//! of one cause, the stacks sampled there, and the block IO seen there.
use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::causes::{Cause, Metric, Speakers, Stacks};
use super::roles::{Role, Roles};
use crate::analysis::model::Analysis;
use crate::analysis::percentiles::Percentiles;
use crate::fxhash::FxHashMap;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// The threads that spent the most time in the state the cause is about.
    pub threads: Vec<ThreadEvidence>,
    /// The most frequent stacks of those threads in the stall, root first.
    pub stacks: Vec<StackEvidence>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_io: Option<IoEvidence>,
    /// For the causes the CUDA probes name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda: Option<super::cuda_evidence::CudaEvidence>,
    /// What the feeder blocked in most over the recording and who woke it, for the causes
    /// about its waits (see `CauseSpec::shows_feeder_waits`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feeder_waits: Vec<String>,
    /// For `no_work`: what the feeder waited on, and the requests it served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside: Option<super::outside_evidence::OutsideEvidence>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadEvidence {
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    pub role: Cow<'static, str>,
    pub on_cpu_ns: u64,
    pub runqueue_ns: u64,
    pub io_wait_ns: u64,
    pub blocked_ns: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackEvidence {
    /// On-CPU samples, or off-CPU nanoseconds for `disk`.
    pub weight: u64,
    pub unit: Cow<'static, str>,
    pub frames: Vec<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoEvidence {
    pub requests: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
}

const TOP_THREADS: usize = 5;
const TOP_STACKS: usize = 3;

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Feeder => "feeder",
        Role::Worker => "worker",
        Role::Other => "other",
    }
}

/// The samples `cause`'s stacks are drawn from inside `ranges` (see
/// [`Stacks`]), per (thread, stack): (tid, stack, samples or IO-wait ns).
pub fn stack_totals(
    timed: &crate::analysis::timed_events::TimedEvents,
    cause: Cause,
    ranges: &[(u64, u64)],
) -> Vec<(u32, u32, u64)> {
    if cause.spec().stacks == Stacks::IoWait {
        timed.io_wait_totals_in(ranges)
    } else {
        timed.cpu_totals_in(ranges)
    }
}

/// Whether a thread's samples speak for `cause`.
pub fn relevant(roles: &Roles, cause: Cause, tid: u32) -> bool {
    match cause.spec().speakers {
        Speakers::Workers => roles.role(tid) == Role::Worker,
        Speakers::Feeder => roles.role(tid) == Role::Feeder,
        Speakers::Others => roles.role(tid) == Role::Other,
        Speakers::All => true,
    }
}

fn metric(cause: Cause, t: &ThreadEvidence) -> u64 {
    match cause.spec().metric {
        Metric::OnCpu => t.on_cpu_ns,
        Metric::InCuda => t.on_cpu_ns.saturating_add(t.runqueue_ns),
        Metric::IoWait => t.io_wait_ns,
        Metric::Runqueue => t.runqueue_ns,
        Metric::Blocked => t.blocked_ns,
    }
}

/// The evidence for `cause` over `ranges`: `[start, end)` CLOCK_MONOTONIC ns, in time order
/// and not overlapping (one stall, or every window of the cause).
pub fn gather(
    a: &Analysis,
    timed: &crate::analysis::timed_events::TimedEvents,
    roles: &Roles,
    cause: Cause,
    ranges: &[(u64, u64)],
) -> Evidence {
    let mut per_thread: FxHashMap<u32, ThreadEvidence> = FxHashMap::default();
    for &(start, end) in ranges {
        add_thread_time(a, roles, start, end, &mut per_thread);
    }
    let mut threads: Vec<ThreadEvidence> = per_thread
        .into_values()
        .filter(|t| relevant(roles, cause, t.tid) && metric(cause, t) > 0)
        .collect();
    threads.sort_by(|x, y| {
        metric(cause, y)
            .cmp(&metric(cause, x))
            .then(x.tid.cmp(&y.tid))
    });
    threads.truncate(TOP_THREADS);

    let mut weights: FxHashMap<u32, u64> = Default::default();
    let io_stacks = cause.spec().stacks == Stacks::IoWait;
    let unit = if io_stacks { "ns" } else { "samples" };
    for (tid, stack, v) in stack_totals(timed, cause, ranges) {
        if io_stacks || relevant(roles, cause, tid) {
            let w = weights.entry(stack).or_default();
            *w = w.saturating_add(v);
        }
    }
    let no_frames = Vec::new();
    let frames_of = |id: &u32| a.stacks.get(id).unwrap_or(&no_frames);
    let mut ranked: Vec<(u32, u64)> = weights.into_iter().collect();
    ranked.sort_by(|x, y| {
        y.1.cmp(&x.1)
            .then_with(|| frames_of(&x.0).cmp(frames_of(&y.0)))
    });
    let stacks = ranked
        .into_iter()
        .take(TOP_STACKS)
        .map(|(id, weight)| StackEvidence {
            weight,
            unit: unit.into(),
            frames: frames_of(&id).clone(),
        })
        .collect();

    let mut io = IoEvidence::default();
    let mut lat = Percentiles::new();
    for b in ranges
        .iter()
        .flat_map(|&(start, end)| timed.block_io_in(start, end))
    {
        io.requests += 1;
        if b.write {
            io.write_bytes = io.write_bytes.saturating_add(b.bytes);
        } else {
            io.read_bytes = io.read_bytes.saturating_add(b.bytes);
        }
        lat.record(b.latency_ns);
    }
    io.p50_ns = lat.percentile(50);
    io.p99_ns = lat.percentile(99);
    Evidence {
        threads,
        stacks,
        block_io: (io.requests > 0).then_some(io),
        cuda: None,
        feeder_waits: Vec::new(),
        outside: None,
    }
}

/// Adds each thread's time in `[start, end)` to `per_thread`, from the tick slices that
/// overlap it (a slice counts in proportion to its overlap).
fn add_thread_time(
    a: &Analysis,
    roles: &Roles,
    start: u64,
    end: u64,
    per_thread: &mut FxHashMap<u32, ThreadEvidence>,
) {
    // Slices are in time order and do not overlap.
    let first = a.timeline.partition_point(|s| s.end_ns <= start);
    for slice in a.timeline[first..]
        .iter()
        .take_while(|s| s.start_ns < end)
        .filter(|s| s.end_ns > start)
    {
        let len = slice.end_ns.saturating_sub(slice.start_ns).max(1);
        let overlap = end
            .min(slice.end_ns)
            .saturating_sub(start.max(slice.start_ns));
        let part = |ns: u64| (ns as u128 * overlap as u128 / len as u128) as u64;
        for d in &slice.threads {
            let t = per_thread.entry(d.tid).or_insert_with(|| {
                let info = a.threads.get(&d.tid);
                ThreadEvidence {
                    tid: d.tid,
                    pid: info.map_or(0, |t| t.pid),
                    comm: info.map_or_else(String::new, |t| t.comm.clone()),
                    role: role_name(roles.role(d.tid)).into(),
                    ..ThreadEvidence::default()
                }
            });
            // Saturating: the deltas come from a file, which may be damaged.
            t.on_cpu_ns = t.on_cpu_ns.saturating_add(part(d.on_cpu_ns));
            t.runqueue_ns = t.runqueue_ns.saturating_add(part(d.runqueue_ns));
            t.io_wait_ns = t.io_wait_ns.saturating_add(part(d.io_wait_ns));
            t.blocked_ns = t.blocked_ns.saturating_add(part(d.blocked_ns));
        }
    }
}
