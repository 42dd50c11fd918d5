//! Building the [`CudaView`] from the probed calls: each wait classified by what it waited for.
//!
//! A sync waits for everything queued on its stream (or, for context and event syncs,
//! every stream of the process, since the probes do not see which stream an event was
//! recorded on) since the previous sync that covered that stream. A sync with an NCCL
//! collective outstanding waits for the slowest rank; one with a copy outstanding waits for
//! the copy engine (as well as for kernels queued behind it); otherwise it waits for kernels.
//! Copies from pageable memory stage through a bounce buffer inside the call, so the call is
//! a wait too, as is a synchronous copy.
use std::collections::{BTreeMap, HashMap, HashSet};

use super::view::{
    CollectiveSpan, CudaView, HostWait, LaunchStats, ProbedLibrary, RankInfo, WaitKind,
};
use super::{APIS, CopyDir, CudaOp, Library, SyncScope};
use crate::recording::record::CudaCall;

/// Page-locked host ranges of one process over time.
#[derive(Default)]
struct Pinned {
    ranges: BTreeMap<u64, u64>,
}

impl Pinned {
    fn contains(&self, addr: u64) -> bool {
        self.ranges
            .range(..=addr)
            .next_back()
            .is_some_and(|(start, len)| addr < start.saturating_add(*len))
    }
}

#[derive(Clone, Copy)]
enum Queued {
    Copy {
        pinned: bool,
        bytes: u64,
        call_ns: u64,
    },
    /// Index into the collective spans.
    Collective(usize),
}

/// An asynchronous copy call this short did not stage its bytes through a bounce buffer...
const NO_STAGING_NS: u64 = 200_000;
/// ...when it moved at least this much (staging a small copy is quick too).
const NO_STAGING_MIN_BYTES: u64 = 4 << 20;
/// A stream's list of queued items is pruned of completed ones past this length (a stream
/// that is never synced itself, like DDP's NCCL stream, would otherwise grow forever).
const PRUNE_AT: usize = 64;

/// The work queued in each process since it was last waited for: per stream, and what each
/// event stands for. Items are shared: an event copies a stream's items, a stream that waits
/// on the event takes them on, and a sync anywhere completes them everywhere.
#[derive(Default)]
struct Queues {
    items: Vec<(Queued, bool)>,
    streams: HashMap<(u32, u64), Vec<usize>>,
    events: HashMap<(u32, u64), Vec<usize>>,
}

impl Queues {
    fn push(&mut self, key: (u32, u64), q: Queued) {
        self.items.push((q, false));
        let id = self.items.len() - 1;
        let list = self.streams.entry(key).or_default();
        list.push(id);
        if list.len() > PRUNE_AT {
            let items = &self.items;
            list.retain(|&i| !items[i].1);
        }
    }

    fn pending(&self, ids: &[usize]) -> Vec<usize> {
        ids.iter().copied().filter(|&i| !self.items[i].1).collect()
    }

    fn record_event(&mut self, pid: u32, event: u64, stream: u64) {
        let ids = self
            .streams
            .get(&(pid, stream))
            .map(|l| self.pending(l))
            .unwrap_or_default();
        self.events.insert((pid, event), ids);
    }

    fn wait_event(&mut self, pid: u32, stream: u64, event: u64) {
        let Some(ids) = self.events.get(&(pid, event)).map(|l| self.pending(l)) else {
            return;
        };
        let list = self.streams.entry((pid, stream)).or_default();
        for id in ids {
            if !list.contains(&id) {
                list.push(id);
            }
        }
    }

    /// Takes the pending items of `ids` as completed.
    fn complete(&mut self, ids: impl IntoIterator<Item = usize>) -> Vec<Queued> {
        let mut out = Vec::new();
        for id in ids {
            let item = &mut self.items[id];
            if !item.1 {
                item.1 = true;
                out.push(item.0);
            }
        }
        out
    }

    fn stream(&mut self, pid: u32, stream: u64) -> Vec<Queued> {
        let ids = self.streams.remove(&(pid, stream)).unwrap_or_default();
        self.complete(ids)
    }

    fn all_streams(&mut self, pid: u32) -> Vec<Queued> {
        let keys: Vec<(u32, u64)> = self
            .streams
            .keys()
            .filter(|k| k.0 == pid)
            .copied()
            .collect();
        let ids: Vec<usize> = keys
            .into_iter()
            .flat_map(|k| self.streams.remove(&k).unwrap_or_default())
            .collect();
        self.complete(ids)
    }

    /// Collectives pending on any stream of `pid`.
    fn collectives_anywhere(&mut self, pid: u32) -> Vec<Queued> {
        let ids: Vec<usize> = self
            .streams
            .iter()
            .filter(|(k, _)| k.0 == pid)
            .flat_map(|(_, l)| l.iter().copied())
            .filter(|&i| matches!(self.items[i].0, Queued::Collective(_)))
            .collect();
        self.complete(ids)
    }
}

/// A process's kernel launches from its counts per entry point. A launch through the runtime
/// (`cudaLaunchKernel`) goes on into the driver's exported entry point (CUDA 13 on an H200 host
/// counted 1,318,630 of each), so each layer alone is every launch it saw: the busier layer
/// counts, never the sum. (A runtime that reached the driver by an unexported path, alongside
/// direct driver launches, would be under-counted by the smaller layer.)
pub fn launches_once(by_api: &BTreeMap<String, u64>) -> u64 {
    let mut by_library: BTreeMap<Library, u64> = BTreeMap::new();
    for (api, &n) in by_api {
        let library = APIS
            .iter()
            .find(|a| a.name == api)
            .map_or(Library::Driver, |a| a.library);
        let sum = by_library.entry(library).or_default();
        *sum = sum.saturating_add(n);
    }
    by_library.into_values().max().unwrap_or(0)
}

/// Builds the view from the probed calls, in any order; `launches_by_api` is each process's
/// launch count per entry point, `launch_probed_ns` the time the launch probes were on.
pub fn build(
    mut calls: Vec<CudaCall>,
    libraries: Vec<ProbedLibrary>,
    launches_by_api: BTreeMap<u32, BTreeMap<String, u64>>,
    launch_probed_ns: u64,
) -> CudaView {
    calls.sort_by_key(|c| (c.start_ns, c.tid));
    // Processes whose event records and cross-stream waits the probes saw.
    let with_events: std::collections::BTreeSet<u32> = calls
        .iter()
        .filter(|c| {
            matches!(
                c.op,
                CudaOp::EventRecord { .. } | CudaOp::StreamWaitEvent { .. }
            )
        })
        .map(|c| c.pid)
        .collect();
    let mut pinned: HashMap<u32, Pinned> = HashMap::new();
    let mut queues = Queues::default();
    let mut waits = Vec::new();
    let mut ranks = BTreeMap::new();
    let mut comm_ids: HashMap<(u32, u64), u64> = HashMap::new();
    let mut seqs: HashMap<(u32, u64), u64> = HashMap::new();
    let mut collectives: Vec<CollectiveSpan> = Vec::new();
    let mut copy_bytes: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    // When each process last recorded or waited for an event, and each stream was last synced.
    let mut last_event: HashMap<u32, u64> = HashMap::new();
    let mut last_sync: HashMap<(u32, u64), u64> = HashMap::new();
    let mut known_streams: HashSet<(u32, u64)> = Default::default();
    let mut known_pids: HashSet<u32> = Default::default();
    let mut provisional: Vec<(usize, (u32, Option<u64>))> = Vec::new();
    let mut sync_keys: Vec<(usize, (u32, Option<u64>), bool)> = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        let wait = |kind, bytes| HostWait {
            tid: c.tid,
            pid: c.pid,
            start_ns: c.start_ns,
            end_ns: c.end_ns.max(c.start_ns),
            kind,
            bytes,
            call: i,
            sync: matches!(c.op, CudaOp::Sync { .. }),
            pinned_bytes: 0,
            staged_ns: 0,
        };
        match c.op {
            CudaOp::Pin { addr, bytes } if c.status == 0 && addr != 0 => {
                pinned.entry(c.pid).or_default().ranges.insert(addr, bytes);
            }
            CudaOp::Unpin { addr } if c.status == 0 => {
                pinned.entry(c.pid).or_default().ranges.remove(&addr);
            }
            CudaOp::Copy {
                dir,
                dst,
                src,
                bytes,
                stream,
                asynchronous,
            } => {
                let p = pinned.entry(c.pid).or_default();
                let known = match dir {
                    CopyDir::HostToDevice => p.contains(src),
                    CopyDir::DeviceToHost => p.contains(dst),
                    CopyDir::HostToHost => p.contains(src) && p.contains(dst),
                    // Unified addressing: whichever side is host memory. Device-to-device
                    // copies never stage.
                    CopyDir::Unknown | CopyDir::DeviceToDevice => true,
                };
                // Memory pinned before the probes were attached (a caching host allocator
                // fills its pool at start-up) is not in the map; an asynchronous copy that
                // returned without staging its bytes was from pinned memory all the same.
                let is_pinned = known
                    || (asynchronous
                        && c.end_ns.saturating_sub(c.start_ns) <= NO_STAGING_NS
                        && bytes >= NO_STAGING_MIN_BYTES);
                let e = copy_bytes.entry(c.pid).or_default();
                // Saturating: sizes come from a file, which may be damaged.
                if is_pinned {
                    e.0 = e.0.saturating_add(bytes);
                } else {
                    e.1 = e.1.saturating_add(bytes);
                }
                let kind = if is_pinned {
                    WaitKind::PinnedCopy
                } else {
                    WaitKind::PageableCopy
                };
                // The call's own time: staging for pageable memory, the whole copy when
                // synchronous. An asynchronous copy's DMA may still run after the call
                // returns (after staging, for pageable memory), so the next sync on its
                // stream waits for it too.
                if !asynchronous || !is_pinned {
                    waits.push(wait(kind, bytes));
                }
                if asynchronous {
                    queues.push(
                        (c.pid, stream),
                        Queued::Copy {
                            pinned: is_pinned,
                            bytes,
                            call_ns: c.end_ns.saturating_sub(c.start_ns),
                        },
                    );
                }
            }
            CudaOp::Collective {
                op,
                bytes,
                comm,
                stream,
                ..
            } => {
                let seq = seqs.entry((c.pid, comm)).or_default();
                collectives.push(CollectiveSpan {
                    pid: c.pid,
                    tid: c.tid,
                    op,
                    bytes,
                    comm,
                    comm_id: comm_ids.get(&(c.pid, comm)).copied(),
                    seq: *seq,
                    enqueue_ns: c.start_ns,
                    done_ns: None,
                });
                *seq += 1;
                queues.push((c.pid, stream), Queued::Collective(collectives.len() - 1));
            }
            CudaOp::EventRecord { event, stream } => {
                queues.record_event(c.pid, event, stream);
                last_event.insert(c.pid, c.start_ns);
            }
            CudaOp::StreamWaitEvent { stream, event } => {
                queues.wait_event(c.pid, stream, event);
                last_event.insert(c.pid, c.start_ns);
            }
            CudaOp::CommInit {
                nranks,
                rank,
                id,
                comm,
            } if c.status == 0 => {
                ranks.insert(
                    c.pid,
                    RankInfo {
                        rank,
                        nranks,
                        comm_id: id,
                    },
                );
                comm_ids.insert((c.pid, comm), id);
            }
            CudaOp::Sync { scope, handle } => {
                // Work queued before the probes came is invisible: the first sync on a
                // stream (or, for context and event syncs, the process's first call) takes
                // the class of the next sync on it, as training steps repeat.
                let key = match scope {
                    SyncScope::Stream => (c.pid, Some(handle)),
                    SyncScope::Event | SyncScope::Context => (c.pid, None),
                };
                let blind = match key.1 {
                    Some(stream) => !known_streams.contains(&(c.pid, stream)),
                    None => !known_pids.contains(&c.pid),
                };
                if blind {
                    provisional.push((waits.len(), key));
                }
                sync_keys.push((waits.len(), key, blind));
                let outstanding = match scope {
                    SyncScope::Stream => {
                        let mut q = queues.stream(c.pid, handle);
                        // Without event calls since the last sync on this stream (no event
                        // probes, or removed for their rate), assume what frameworks do: the
                        // stream waited for would wait for the collectives on the NCCL stream.
                        let since = last_sync.insert((c.pid, handle), c.start_ns);
                        let events_since = last_event
                            .get(&c.pid)
                            .is_some_and(|&e| since.is_none_or(|s| e >= s));
                        if !events_since {
                            q.extend(queues.collectives_anywhere(c.pid));
                        }
                        q
                    }
                    SyncScope::Event => match queues.events.get(&(c.pid, handle)).cloned() {
                        Some(ids) => queues.complete(ids),
                        None => queues.all_streams(c.pid),
                    },
                    SyncScope::Context => queues.all_streams(c.pid),
                };
                let end = c.end_ns.max(c.start_ns);
                // A sync cut off by the end of the recording saw nothing complete.
                let returned = c.status != crate::recording::record::IN_PROGRESS;
                for q in outstanding.iter().filter(|_| returned) {
                    if let Queued::Collective(span) = *q {
                        collectives[span].done_ns = Some(end);
                    }
                }
                let kind = if outstanding
                    .iter()
                    .any(|q| matches!(q, Queued::Collective(_)))
                {
                    WaitKind::Collective
                } else if outstanding
                    .iter()
                    .any(|q| matches!(q, Queued::Copy { pinned: true, .. }))
                {
                    WaitKind::PinnedCopy
                } else if !outstanding.is_empty() {
                    WaitKind::PageableCopy
                } else {
                    WaitKind::Kernel
                };
                let (mut bytes, mut pinned_bytes, mut staged_ns) = (0, 0, 0);
                for q in &outstanding {
                    if let Queued::Copy {
                        pinned,
                        bytes: b,
                        call_ns,
                    } = *q
                    {
                        let add = |sum: &mut u64, v: u64| *sum = sum.saturating_add(v);
                        add(&mut bytes, b);
                        if pinned {
                            add(&mut pinned_bytes, b);
                        } else {
                            add(&mut staged_ns, call_ns);
                        }
                    }
                }
                let mut w = wait(kind, bytes);
                w.pinned_bytes = pinned_bytes;
                w.staged_ns = staged_ns;
                waits.push(w);
                if let Some(stream) = key.1 {
                    known_streams.insert((c.pid, stream));
                }
            }
            _ => {}
        }
        known_pids.insert(c.pid);
        match c.op {
            CudaOp::Copy { stream, .. } | CudaOp::Collective { stream, .. } => {
                known_streams.insert((c.pid, stream));
            }
            _ => {}
        }
    }
    for (i, key) in provisional {
        let next = sync_keys
            .iter()
            .find(|(j, k, blind)| *j > i && *k == key && !blind)
            .map(|(j, _, _)| waits[*j].kind);
        if let Some(kind) = next {
            waits[i].kind = kind;
        }
    }
    waits.sort_by_key(|w| (w.start_ns, w.tid));
    let launches = launches_by_api
        .iter()
        .map(|(&pid, by_api)| {
            let counted = launches_once(by_api);
            let per_sec = if launch_probed_ns > 0 {
                counted as f64 / (launch_probed_ns as f64 / 1e9)
            } else {
                0.0
            };
            (pid, LaunchStats { counted, per_sec })
        })
        .collect();
    CudaView {
        libraries,
        calls,
        waits,
        ranks,
        collectives,
        event_deps: with_events,
        env_ranks: BTreeMap::new(),
        launches_by_api,
        launches,
        launch_probed_ns,
        copy_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::Collective;
    use crate::cuda::WaitIndex;

    fn call(start: u64, end: u64, op: CudaOp) -> CudaCall {
        CudaCall {
            tid: 7,
            pid: 7,
            start_ns: start,
            end_ns: end,
            api: "x".into(),
            op,
            status: 0,
            caller: String::new(),
        }
    }

    fn h2d(start: u64, end: u64, src: u64, asynchronous: bool) -> CudaCall {
        call(
            start,
            end,
            CudaOp::Copy {
                dir: CopyDir::HostToDevice,
                dst: 0xd000,
                src,
                bytes: 100,
                stream: 1,
                asynchronous,
            },
        )
    }

    fn sync(start: u64, end: u64) -> CudaCall {
        call(
            start,
            end,
            CudaOp::Sync {
                scope: SyncScope::Stream,
                handle: 1,
            },
        )
    }

    fn kinds(v: &CudaView) -> Vec<(u64, WaitKind, u64)> {
        v.waits
            .iter()
            .map(|w| (w.start_ns, w.kind, w.bytes))
            .collect()
    }

    #[test]
    fn syncs_are_classed_by_what_their_stream_had_queued() {
        let calls = vec![
            call(
                0,
                1,
                CudaOp::Pin {
                    addr: 0x1000,
                    bytes: 0x1000,
                },
            ),
            // Pinned, asynchronous: the wait shows in the next sync.
            h2d(10, 11, 0x1800, true),
            sync(12, 50),
            // Nothing queued: kernels.
            sync(60, 70),
            // Pageable: staged inside the call.
            h2d(80, 95, 0x9000, true),
            sync(96, 100),
            call(
                110,
                111,
                CudaOp::Collective {
                    op: Collective::AllReduce,
                    bytes: 4,
                    comm: 9,
                    stream: 1,
                    peer: None,
                },
            ),
            h2d(112, 113, 0x1800, true),
            sync(114, 200),
            call(210, 211, CudaOp::Unpin { addr: 0x1000 }),
            h2d(220, 240, 0x1800, true),
            // Unknown memory, but 8 MiB queued in 20 µs: pinned before the probes came.
            call(
                300,
                20_300,
                CudaOp::Copy {
                    dir: CopyDir::HostToDevice,
                    dst: 0xd000,
                    src: 0x5_0000,
                    bytes: 8 << 20,
                    stream: 1,
                    asynchronous: true,
                },
            ),
            sync(20_400, 30_000),
        ];
        let v = build(calls, Vec::new(), BTreeMap::new(), 0);
        assert_eq!(
            kinds(&v),
            vec![
                (12, WaitKind::PinnedCopy, 100),
                (60, WaitKind::Kernel, 0),
                (80, WaitKind::PageableCopy, 100),
                (96, WaitKind::PageableCopy, 100),
                (114, WaitKind::Collective, 100),
                (220, WaitKind::PageableCopy, 100),
                (20_400, WaitKind::PinnedCopy, (8 << 20) + 100),
            ]
        );
        assert_eq!(v.copy_bytes[&7], (200 + (8 << 20), 200));
        // The sync after the pageable copy knows how long it took to stage; the one after
        // the pinned copy how many bytes the link moved.
        let after_pageable = v.waits.iter().find(|w| w.start_ns == 96).unwrap();
        assert_eq!(
            (after_pageable.staged_ns, after_pageable.pinned_bytes),
            (15, 0)
        );
        let after_pinned = v.waits.iter().find(|w| w.start_ns == 12).unwrap();
        assert_eq!(
            (after_pinned.staged_ns, after_pinned.pinned_bytes),
            (0, 100)
        );
    }

    #[test]
    fn the_first_sync_after_attach_is_classed_like_the_next() {
        let coll = |t| {
            call(
                t,
                t + 1,
                CudaOp::Collective {
                    op: Collective::AllReduce,
                    bytes: 4,
                    comm: 1,
                    stream: 1,
                    peer: None,
                },
            )
        };
        // The first step's all-reduce was queued before attach.
        let v = build(
            vec![sync(0, 50), coll(60), sync(61, 100), sync(110, 120)],
            Vec::new(),
            BTreeMap::new(),
            0,
        );
        let k: Vec<WaitKind> = v.waits.iter().map(|w| w.kind).collect();
        assert_eq!(
            k,
            [WaitKind::Collective, WaitKind::Collective, WaitKind::Kernel]
        );
    }

    #[test]
    fn a_context_sync_waits_for_every_stream() {
        let mut coll = call(
            0,
            1,
            CudaOp::Collective {
                op: Collective::AllGather,
                bytes: 8,
                comm: 1,
                stream: 42,
                peer: None,
            },
        );
        coll.pid = 7;
        let ctx = call(
            5,
            9,
            CudaOp::Sync {
                scope: SyncScope::Context,
                handle: 0,
            },
        );
        let v = build(vec![ctx, coll], Vec::new(), BTreeMap::new(), 0);
        assert_eq!(kinds(&v), vec![(5, WaitKind::Collective, 0)]);
    }

    fn on(start: u64, end: u64, op: CudaOp) -> CudaCall {
        call(start, end, op)
    }

    fn all_reduce(t: u64, stream: u64) -> CudaCall {
        on(
            t,
            t + 1,
            CudaOp::Collective {
                op: Collective::AllReduce,
                bytes: 4,
                comm: 9,
                stream,
                peer: None,
            },
        )
    }

    fn stream_sync(start: u64, end: u64, stream: u64) -> CudaCall {
        on(
            start,
            end,
            CudaOp::Sync {
                scope: SyncScope::Stream,
                handle: stream,
            },
        )
    }

    /// DDP: the all-reduce on the NCCL stream (5), its end event, the compute stream (1)
    /// waiting on it, and `.item()` syncing the compute stream.
    fn ddp_step(t: u64, events: bool) -> Vec<CudaCall> {
        let mut v = vec![all_reduce(t, 5)];
        if events {
            v.push(on(
                t + 2,
                t + 3,
                CudaOp::EventRecord {
                    event: 0xe0,
                    stream: 5,
                },
            ));
            v.push(on(
                t + 4,
                t + 5,
                CudaOp::StreamWaitEvent {
                    stream: 1,
                    event: 0xe0,
                },
            ));
        }
        v.push(stream_sync(t + 10, t + 90, 1));
        v
    }

    #[test]
    fn a_sync_on_the_compute_stream_waits_for_the_collective_through_its_event() {
        let mut calls = vec![stream_sync(0, 1, 1)];
        calls.extend(ddp_step(100, true));
        calls.extend(ddp_step(200, true));
        // A step whose end event was recorded before the all-reduce: the sync waits for
        // kernels only.
        calls.push(on(
            300,
            301,
            CudaOp::EventRecord {
                event: 0xe0,
                stream: 5,
            },
        ));
        calls.push(all_reduce(302, 5));
        calls.push(on(
            304,
            305,
            CudaOp::StreamWaitEvent {
                stream: 1,
                event: 0xe0,
            },
        ));
        calls.push(stream_sync(310, 390, 1));
        let v = build(calls, Vec::new(), BTreeMap::new(), 0);
        let k: Vec<(u64, WaitKind)> = v.waits.iter().map(|w| (w.start_ns, w.kind)).collect();
        assert_eq!(
            &k[1..],
            [
                (110, WaitKind::Collective),
                (210, WaitKind::Collective),
                (310, WaitKind::Kernel)
            ]
        );
        let spans: Vec<(u64, u64, Option<u64>)> = v
            .collectives
            .iter()
            .map(|c| (c.seq, c.enqueue_ns, c.done_ns))
            .collect();
        assert_eq!(
            spans,
            [(0, 100, Some(190)), (1, 200, Some(290)), (2, 302, None)]
        );
        assert!(v.event_deps.contains(&7));
    }

    #[test]
    fn a_sync_cut_off_by_the_end_of_the_recording_completes_no_collective() {
        let mut calls = ddp_step(100, true);
        calls.extend(ddp_step(200, true));
        calls.last_mut().unwrap().status = crate::recording::record::IN_PROGRESS;
        let v = build(calls, Vec::new(), BTreeMap::new(), 0);
        let done: Vec<Option<u64>> = v.collectives.iter().map(|c| c.done_ns).collect();
        assert_eq!(done, [Some(190), None]);
    }

    #[test]
    fn once_the_event_probes_are_gone_a_stream_sync_takes_the_other_streams_collectives() {
        let mut calls = ddp_step(100, true);
        // The event probes were removed for their rate: the next steps have no event calls.
        calls.extend(ddp_step(200, false));
        calls.extend(ddp_step(300, false));
        let v = build(calls, Vec::new(), BTreeMap::new(), 0);
        assert!(
            v.waits.iter().all(|w| w.kind == WaitKind::Collective),
            "{:?}",
            v.waits
        );
        assert!(v.collectives.iter().all(|c| c.done_ns.is_some()));
    }

    #[test]
    fn without_event_probes_a_stream_sync_takes_the_other_streams_collectives() {
        let mut calls = Vec::new();
        calls.extend(ddp_step(100, false));
        calls.extend(ddp_step(200, false));
        let v = build(calls, Vec::new(), BTreeMap::new(), 0);
        assert!(v.waits.iter().all(|w| w.kind == WaitKind::Collective));
        assert_eq!(v.collectives[1].done_ns, Some(290));
        assert!(v.event_deps.is_empty());
    }

    #[test]
    fn window_totals_prorate_by_overlap() {
        let v = build(
            vec![h2d(0, 100, 0x9000, false), sync(100, 200)],
            Vec::new(),
            BTreeMap::new(),
            0,
        );
        let t = WaitIndex::new(&v.waits).totals(50, 150, |_| true);
        assert_eq!(t.call_copy_ns, 50.0);
        assert_eq!(t.kernel_ns, 50.0);
        assert_eq!(t.copy_bytes, 50.0);
        assert_eq!(
            WaitIndex::new(&v.waits).totals(50, 150, |t| t != 7).total(),
            0.0
        );
    }

    #[test]
    fn launch_rates_scale_by_the_probed_time() {
        let v = build(
            Vec::new(),
            Vec::new(),
            BTreeMap::from([(7, BTreeMap::from([("cuLaunchKernel".to_string(), 500)]))]),
            250_000_000,
        );
        assert_eq!(v.launches[&7].per_sec, 2000.0);
    }

    #[test]
    fn a_runtime_launch_seen_again_in_the_driver_counts_once() {
        let counts = |pairs: &[(&str, u64)]| {
            pairs
                .iter()
                .map(|&(api, n)| (api.to_string(), n))
                .collect::<BTreeMap<_, _>>()
        };
        // Every runtime launch reached the driver, and a few kernels (Triton's) went to the
        // driver directly.
        let layered = counts(&[
            ("cudaLaunchKernel", 1000),
            ("cuLaunchKernel", 1000),
            ("cuLaunchKernelEx", 40),
        ]);
        assert_eq!(launches_once(&layered), 1040);
        // Entry points of one layer add up.
        let driver = counts(&[("cuLaunchKernel", 300), ("cuLaunchKernel_ptsz", 200)]);
        assert_eq!(launches_once(&driver), 500);
        let v = build(
            Vec::new(),
            Vec::new(),
            BTreeMap::from([(3, layered)]),
            1_000_000_000,
        );
        assert_eq!(v.launches[&3].counted, 1040);
    }
}
