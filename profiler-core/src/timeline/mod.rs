//! The recording as lanes over time: what the Perfetto trace and the HTML report draw.
//!
//! Built once from the analysis, the attribution and the timed events (kept for it past the
//! attribution), with no format in mind: per GPU its utilization and SM-activity counters,
//! its lost time as slices named by cause, and its stalls; per traced thread its states, its
//! CUDA calls and block IOs; per process its NCCL collectives; the on-CPU samples with their
//! stacks. Every lane holds slices that never overlap (overlapping intervals are packed into
//! several lanes), in time order.
mod lanes;
mod slice;
mod states;

use std::collections::BTreeMap;

use crate::analysis::model::Analysis;
use crate::analysis::timed_events::{CpuSamples, TimedBlockIo, TimedEvents};
use crate::attribution::{Attribution, CAUSES, Cause, Roles, Stall};
use crate::cuda::CudaOp;
use crate::cuda::WaitKind;
use crate::recording::record::IN_PROGRESS;

pub use lanes::pack;
pub use slice::{Arg, Slice};
pub use states::{STATES, StateRun, ThreadState, thread_states};

/// One point of a counter: its value from `ts_ns` on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub ts_ns: u64,
    pub value: f64,
}

/// Whether a lost-time slice is the GPU idling or, busy to NVML, only waiting in a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lost {
    Idle,
    Waiting,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GpuLanes {
    pub index: u32,
    pub name: String,
    /// NVML utilization, percent, per sample period (from its start).
    pub util: Vec<Point>,
    /// GPM SM activity, percent, where the GPU has GPM.
    pub sm_active: Vec<Point>,
    /// Each window's idle, then its waiting, time as slices named by cause, from the window's
    /// start: NVML says how much of a period was idle, not when. With the window's scores.
    pub lost: Vec<(Lost, Cause, Slice)>,
    pub stalls: Vec<(Cause, Slice)>,
    /// The feeder's training steps, each with its parts in ms (see
    /// [`crate::attribution::steps`]).
    pub steps: Vec<Slice>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ThreadLanes {
    pub tid: u32,
    pub name: String,
    /// `feeder`, `worker` or `other`.
    pub role: &'static str,
    pub states: Vec<StateRun>,
    /// CUDA and NCCL calls; a call inside another (cudart over the driver) goes to a lower lane.
    pub cuda: Vec<Vec<Slice>>,
    pub block_io: Vec<Vec<Slice>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProcessLanes {
    pub pid: u32,
    pub name: String,
    pub cmdline: String,
    pub rank: Option<u32>,
    pub threads: Vec<ThreadLanes>,
    /// Each collective from when it was queued to when the GPU finished it.
    pub collectives: Vec<Vec<Slice>>,
}

/// One recording (one host) as lanes.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordingLanes<'a> {
    pub name: String,
    pub host: String,
    pub start_ns: u64,
    pub end_ns: u64,
    /// `start_unix_ns - start_ns`: adds to a timestamp to give wall-clock time; 0 unknown.
    pub wall_offset_ns: i128,
    pub gpus: Vec<GpuLanes>,
    pub processes: Vec<ProcessLanes>,
    /// On-CPU samples of the traced threads, each a stack id into `stacks` (root first).
    pub samples: CpuSamples,
    pub stacks: &'a BTreeMap<u32, Vec<String>>,
}

/// Block IOs of one thread: one request, or past [`MAX_BLOCK_IO_SLICES`] in a recording,
/// all its requests completed in one tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockIoSpan {
    pub start_ns: u64,
    pub end_ns: u64,
    pub tid: u32,
    pub write: bool,
    pub bytes: u64,
    pub requests: u64,
}

/// What the timeline keeps of the timed events, which the attribution's end frees.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimelineEvents {
    pub cpu: CpuSamples,
    pub block_io: Vec<BlockIoSpan>,
}

impl TimelineEvents {
    /// `tick_ns` is the recording's tick, the span block IOs are grouped by when there are
    /// too many to draw one by one.
    pub fn keep(timed: TimedEvents, tick_ns: u64) -> Self {
        let span = |b: &TimedBlockIo| BlockIoSpan {
            start_ns: b.ts_ns.saturating_sub(b.latency_ns),
            end_ns: b.ts_ns,
            tid: b.tid,
            write: b.write,
            bytes: b.bytes,
            requests: 1,
        };
        let block_io = if timed.len().2 <= MAX_BLOCK_IO_SLICES {
            timed.block_io_in(0, u64::MAX).map(|b| span(&b)).collect()
        } else {
            let tick = tick_ns.max(1_000_000);
            // A million IOs an hour: grouped a few seconds at a time, so the map stays small
            // enough to live in cache. Windows are whole ticks, so no group is cut.
            let window = tick * 64;
            let mut out = Vec::new();
            let mut groups: crate::fxhash::FxHashMap<(u32, u64, bool), BlockIoSpan> =
                crate::fxhash::FxHashMap::default();
            let (first, last) = timed.block_io_bounds().unwrap_or((0, 0));
            let mut at = first / window * window;
            while at < last {
                for b in timed.block_io_in(at, at.saturating_add(window)) {
                    let one = span(&b);
                    groups
                        .entry((b.tid, b.ts_ns / tick, b.write))
                        .and_modify(|g| {
                            g.start_ns = g.start_ns.min(one.start_ns);
                            g.end_ns = g.end_ns.max(one.end_ns);
                            g.bytes = g.bytes.saturating_add(one.bytes);
                            g.requests += 1;
                        })
                        .or_insert(one);
                }
                let mut these: Vec<_> = groups.drain().collect();
                these.sort_unstable_by_key(|&(key, _)| key);
                out.extend(these.into_iter().map(|(_, g)| g));
                at = at.saturating_add(window);
            }
            out
        };
        TimelineEvents {
            cpu: timed.into_cpu_samples(),
            block_io,
        }
    }
}

/// Past this many block IOs in a recording, each thread's IOs in one tick are drawn as one
/// slice: a disk-bound hour issues tens of millions.
pub const MAX_BLOCK_IO_SLICES: usize = 200_000;

fn ms(ns: u64) -> Arg {
    Arg::Float(ns as f64 / 1e6)
}

/// The lanes of one recording.
pub fn build<'a>(
    name: &str,
    a: &'a Analysis,
    attribution: Option<&Attribution>,
    events: TimelineEvents,
) -> RecordingLanes<'a> {
    let start_ns = a.start_ns;
    let end_ns = a.start_ns + a.duration_ns;
    let wall_offset_ns = a
        .meta
        .as_ref()
        .filter(|m| m.start_unix_ns > 0)
        .map_or(0, |m| i128::from(m.start_unix_ns) - i128::from(m.start_ns));
    let roles = attribution.map_or_else(|| Roles::from_analysis(a), |x| x.roles.clone());
    let TimelineEvents { cpu, block_io } = events;
    let (processes, samples) = std::thread::scope(|scope| {
        let samples = scope.spawn(|| {
            let mut cpu = cpu;
            cpu.retain_threads(|tid| a.threads.contains_key(&tid));
            cpu
        });
        let processes = processes(a, &roles, &block_io);
        (
            processes,
            samples.join().expect("filtering samples does not panic"),
        )
    });
    RecordingLanes {
        name: name.to_owned(),
        host: a
            .meta
            .as_ref()
            .map_or(String::new(), |m| m.hostname.clone()),
        start_ns,
        end_ns,
        wall_offset_ns,
        gpus: gpus(a, attribution),
        processes,
        samples,
        stacks: &a.stacks,
    }
}

fn gpus(a: &Analysis, attribution: Option<&Attribution>) -> Vec<GpuLanes> {
    a.gpus
        .values()
        .map(|g| {
            let index = g.info.index;
            let labelled = attribution.and_then(|x| x.gpus.iter().find(|ga| ga.gpu == index));
            let mut lost = Vec::new();
            for w in labelled.map_or(&[][..], |ga| &ga.labels[..]) {
                let mut scores: Vec<(f64, &str)> = CAUSES
                    .iter()
                    .filter(|c| c.score.is_some())
                    .map(|c| (w.scores.get(c.cause), c.name))
                    .collect();
                scores.sort_by(|x, y| y.0.total_cmp(&x.0));
                let scores = serde_json::Value::Object(
                    scores
                        .into_iter()
                        .map(|(s, n)| (n.to_owned(), serde_json::json!((s * 1e4).round() / 1e4)))
                        .collect(),
                );
                let period = w.end_ns - w.start_ns;
                let with_window = |s: Slice| {
                    s.arg("window_start_ns", Arg::Int(w.start_ns as i64))
                        .arg("window_ms", ms(period))
                        .arg("idle_ms", ms(w.idle_ns))
                        .arg("waiting_ms", ms(w.waiting_ns))
                };
                let idle_end = w.start_ns + w.idle_ns.min(period);
                if w.idle_ns > 0 {
                    let mut s = with_window(Slice::new(w.start_ns, idle_end, w.cause.name()))
                        .arg("scores", Arg::Json(scores.clone()));
                    if let Some(r) = &w.reason {
                        s = s.arg("reason", Arg::Str(r.clone()));
                    }
                    lost.push((Lost::Idle, w.cause, s));
                }
                if w.waiting_ns > 0 {
                    let end = (idle_end + w.waiting_ns).min(w.end_ns);
                    let s = with_window(Slice::new(idle_end, end, Cause::NcclWait.name()))
                        .arg("part", Arg::Str("waiting: busy to NVML".into()));
                    lost.push((Lost::Waiting, Cause::NcclWait, s));
                }
            }
            let mut stalls: Vec<(Cause, Slice)> = labelled
                .map_or(&[][..], |ga| &ga.stalls[..])
                .iter()
                .map(|st| (st.cause, stall_slice(st)))
                .collect();
            stalls.sort_by_key(|(_, s)| s.start_ns);
            let steps = labelled.map_or_else(Vec::new, step_slices);
            GpuLanes {
                index,
                name: g.info.name.clone(),
                util: g
                    .samples
                    .iter()
                    .map(|s| Point {
                        ts_ns: s.start_ns(),
                        value: f64::from(s.util_pct.min(100)),
                    })
                    .collect(),
                sm_active: g
                    .states
                    .iter()
                    .filter_map(|s| {
                        s.sm_active_pct.map(|p| Point {
                            ts_ns: s.ts_ns,
                            value: f64::from(p),
                        })
                    })
                    .collect(),
                lost,
                stalls,
                steps,
            }
        })
        .collect()
}

/// One slice per step, `step N`, with its parts.
fn step_slices(ga: &crate::attribution::GpuAttribution) -> Vec<Slice> {
    let ms = |ns: f64| Arg::Float((ns / 1e3).round() / 1e3);
    ga.step_ends_ns
        .windows(2)
        .zip(&ga.step_parts)
        .enumerate()
        .map(|(i, (w, p))| {
            let s = &p.split;
            Slice::new(w[0], w[1], format!("step {}", i + 1))
                .arg("input_wait_ms", ms(s.input_wait))
                .arg("copy_ms", ms(s.copy))
                .arg("host_ms", ms(s.host))
                .arg("gpu_ms", ms(s.gpu))
                .arg("collective_ms", ms(s.collective))
        })
        .collect()
}

fn stall_slice(st: &Stall) -> Slice {
    let mut s = Slice::new(st.start_ns, st.end_ns, st.cause.name())
        .arg("idle_ms", ms(st.idle_ns))
        .arg("waiting_ms", ms(st.waiting_ns));
    if let Some(r) = &st.reason {
        s = s.arg("reason", Arg::Str(r.clone()));
    }
    if let Ok(v) = serde_json::to_value(&st.evidence) {
        s = s.arg("evidence", Arg::Json(v));
    }
    s
}

fn processes(a: &Analysis, roles: &Roles, block_io: &[BlockIoSpan]) -> Vec<ProcessLanes> {
    // The states, a million thread-ticks an hour, are cut on another thread meanwhile.
    std::thread::scope(|scope| {
        let states = scope.spawn(|| thread_states(&a.timeline));
        let mut cuda: BTreeMap<u32, Vec<Slice>> = BTreeMap::new();
        let waits: BTreeMap<usize, WaitKind> =
            a.cuda.waits.iter().map(|w| (w.call, w.kind)).collect();
        let end_ns = a.start_ns + a.duration_ns;
        for (i, c) in a.cuda.calls.iter().enumerate() {
            cuda.entry(c.tid)
                .or_default()
                .push(cuda_slice(c, waits.get(&i), end_ns));
        }
        let mut io = block_io_slices(block_io);
        let mut collectives: BTreeMap<u32, Vec<Slice>> = BTreeMap::new();
        for c in &a.cuda.collectives {
            let end = c.done_ns.unwrap_or(end_ns);
            let mut s = Slice::new(c.enqueue_ns, end, c.op.name())
                .arg("bytes", Arg::Int(c.bytes as i64))
                .arg("seq", Arg::Int(c.seq as i64))
                .arg("queued_by_tid", Arg::Int(i64::from(c.tid)));
            if c.done_ns.is_none() {
                s = s.arg("done", Arg::Str("not seen to finish".into()));
            }
            collectives.entry(c.pid).or_default().push(s);
        }
        let mut states = states.join().expect("cutting thread states does not panic");
        a.processes
            .values()
            .map(|p| ProcessLanes {
                pid: p.pid,
                name: p.comm.clone(),
                cmdline: p.cmdline.clone(),
                rank: a
                    .cuda
                    .ranks
                    .get(&p.pid)
                    .or_else(|| a.cuda.env_ranks.get(&p.pid))
                    .map(|r| r.rank),
                threads: a
                    .threads
                    .values()
                    .filter(|t| t.pid == p.pid)
                    .map(|t| ThreadLanes {
                        tid: t.tid,
                        name: t.comm.clone(),
                        role: if roles.feeders.contains(&t.tid) {
                            "feeder"
                        } else if roles.workers.contains(&t.tid) {
                            "worker"
                        } else {
                            "other"
                        },
                        states: states.remove(&t.tid).unwrap_or_default(),
                        cuda: pack(cuda.remove(&t.tid).unwrap_or_default()),
                        block_io: pack(io.remove(&t.tid).unwrap_or_default()),
                    })
                    .collect(),
                collectives: pack(collectives.remove(&p.pid).unwrap_or_default()),
            })
            .collect()
    })
}

fn cuda_slice(c: &crate::recording::record::CudaCall, wait: Option<&WaitKind>, end: u64) -> Slice {
    let call_end = if c.status == IN_PROGRESS {
        end.max(c.start_ns)
    } else {
        c.end_ns
    };
    let mut s = Slice::new(c.start_ns, call_end, c.api.clone());
    match &c.op {
        CudaOp::Copy {
            dir,
            bytes,
            asynchronous,
            ..
        } => {
            s = s
                .arg("bytes", Arg::Int(*bytes as i64))
                .arg("direction", Arg::Str(format!("{dir:?}")))
                .arg("asynchronous", Arg::Str(asynchronous.to_string()));
            let memory = match wait {
                Some(WaitKind::PageableCopy) => Some("pageable"),
                Some(WaitKind::PinnedCopy) => Some("pinned"),
                _ => None,
            };
            if let Some(m) = memory {
                s = s.arg("host_memory", Arg::Str(m.into()));
            }
        }
        CudaOp::Collective { op, bytes, .. } => {
            s = s
                .arg("collective", Arg::Str(op.name().into()))
                .arg("bytes", Arg::Int(*bytes as i64));
        }
        CudaOp::Sync { scope, .. } => {
            s = s.arg("sync", Arg::Str(format!("{scope:?}")));
            if let Some(k) = wait {
                s = s.arg("waited_for", Arg::Str(format!("{k:?}")));
            }
        }
        _ => {}
    }
    if c.status == IN_PROGRESS {
        s = s.arg("status", Arg::Str("in progress at the end".into()));
    } else if c.status != 0 {
        s = s.arg("status", Arg::Int(c.status as i64));
    }
    if !c.caller.is_empty() {
        s = s.arg("caller", Arg::Str(c.caller.clone()));
    }
    s
}

/// Each thread's block IOs as slices from issue to completion.
fn block_io_slices(ios: &[BlockIoSpan]) -> BTreeMap<u32, Vec<Slice>> {
    let mut out: BTreeMap<u32, Vec<Slice>> = BTreeMap::new();
    for b in ios {
        let mut s = if b.requests == 1 {
            let kind = if b.write { "write" } else { "read" };
            Slice::new(b.start_ns, b.end_ns, kind).arg("latency_ms", ms(b.end_ns - b.start_ns))
        } else {
            // Named by kind alone, so the hundreds of thousands of groups share one name.
            let kind = if b.write { "writes" } else { "reads" };
            Slice::new(b.start_ns, b.end_ns, kind).arg("requests", Arg::Int(b.requests as i64))
        };
        s = s.arg("bytes", Arg::Int(b.bytes as i64));
        out.entry(b.tid).or_default().push(s);
    }
    out
}

#[cfg(test)]
mod tests;
