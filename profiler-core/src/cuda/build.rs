//! Building the [`CudaView`] from the probed calls: each wait classified by what it waited for.
//!
//! A sync waits for everything queued on its stream (or, for context and event syncs,
//! every stream of the process, since the probes do not see which stream an event was
//! recorded on) since the previous sync that covered that stream. A sync with an NCCL
//! collective outstanding waits for the slowest rank; one with a copy outstanding waits for
//! the copy engine (as well as for kernels queued behind it); otherwise it waits for kernels.
//! Copies from pageable memory stage through a bounce buffer inside the call, so the call is
//! a wait too, as is a synchronous copy.
use std::collections::{BTreeMap, HashMap};

use super::view::{CudaView, HostWait, LaunchStats, ProbedLibrary, RankInfo, WaitKind};
use super::{CopyDir, CudaOp, SyncScope};
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
    Collective,
}

/// An asynchronous copy call this short did not stage its bytes through a bounce buffer...
const NO_STAGING_NS: u64 = 200_000;
/// ...when it moved at least this much (staging a small copy is quick too).
const NO_STAGING_MIN_BYTES: u64 = 4 << 20;

/// Builds the view from the probed calls, in any order.
pub fn build(
    mut calls: Vec<CudaCall>,
    libraries: Vec<ProbedLibrary>,
    launch_counts: &BTreeMap<u32, u64>,
    launch_probed_ns: u64,
) -> CudaView {
    calls.sort_by_key(|c| (c.start_ns, c.tid));
    let mut pinned: HashMap<u32, Pinned> = HashMap::new();
    let mut queued: HashMap<(u32, u64), Vec<Queued>> = HashMap::new();
    let mut waits = Vec::new();
    let mut ranks = BTreeMap::new();
    let mut copy_bytes: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut known_streams: std::collections::HashSet<(u32, u64)> = Default::default();
    let mut known_pids: std::collections::HashSet<u32> = Default::default();
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
                    queued
                        .entry((c.pid, stream))
                        .or_default()
                        .push(Queued::Copy {
                            pinned: is_pinned,
                            bytes,
                            call_ns: c.end_ns.saturating_sub(c.start_ns),
                        });
                }
            }
            CudaOp::Collective { stream, .. } => {
                queued
                    .entry((c.pid, stream))
                    .or_default()
                    .push(Queued::Collective);
            }
            CudaOp::CommInit {
                nranks, rank, id, ..
            } if c.status == 0 => {
                ranks.insert(
                    c.pid,
                    RankInfo {
                        rank,
                        nranks,
                        comm_id: id,
                    },
                );
            }
            CudaOp::Sync { scope, handle } => {
                let mut outstanding = Vec::new();
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
                match scope {
                    SyncScope::Stream => {
                        if let Some(q) = queued.remove(&(c.pid, handle)) {
                            outstanding = q;
                        }
                    }
                    SyncScope::Event | SyncScope::Context => {
                        let keys: Vec<(u32, u64)> =
                            queued.keys().filter(|k| k.0 == c.pid).copied().collect();
                        for k in keys {
                            outstanding.extend(queued.remove(&k).unwrap_or_default());
                        }
                    }
                }
                let kind = if outstanding.iter().any(|q| matches!(q, Queued::Collective)) {
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
    let launches = launch_counts
        .iter()
        .map(|(&pid, &counted)| {
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
        env_ranks: BTreeMap::new(),
        launches_by_api: BTreeMap::new(),
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
        let v = build(calls, Vec::new(), &BTreeMap::new(), 0);
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
            &BTreeMap::new(),
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
        let v = build(vec![ctx, coll], Vec::new(), &BTreeMap::new(), 0);
        assert_eq!(kinds(&v), vec![(5, WaitKind::Collective, 0)]);
    }

    #[test]
    fn window_totals_prorate_by_overlap() {
        let v = build(
            vec![h2d(0, 100, 0x9000, false), sync(100, 200)],
            Vec::new(),
            &BTreeMap::new(),
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
            &BTreeMap::from([(7, 500)]),
            250_000_000,
        );
        assert_eq!(v.launches[&7].per_sec, 2000.0);
    }
}
