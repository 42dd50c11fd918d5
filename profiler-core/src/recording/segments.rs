//! One live recording cut into back-to-back segment files, each a recording of its own
//! (`record --segment`, the agent's recorder): the probes stay attached across the cut, so the
//! segments cover the job without a gap.
//!
//! [`Segments`] sits between the session and the files. It watches every record that passes
//! and keeps what a recording needs to make sense from its first record on: the meta, the
//! host, the signals that were unavailable, the GPUs, the live processes and threads, the
//! CUDA libraries and probes. At a cut, [`Segments::begin`] gives the next file's opening
//! records. Counters the kernel and the decoder keep from the start of the session (thread
//! accounting, event counts, unwind and Python statistics, page-cache misses per file) are
//! rebased to the start of the segment as they pass, so each file reads as if it had been
//! recorded alone. Pure: no OS calls.
use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
};

use crate::recording::record::{EventLoss, Meta, PythonStats, Record, ThreadCounters, UnwindStats};

/// The cumulative figures a recording ends with, as last written: the next segment's are
/// what they say less these.
#[derive(Clone, Debug, Default)]
struct Closing {
    losses: BTreeMap<String, (u64, u64, u64)>,
    unwinding: UnwindStats,
    python: PythonStats,
    page_cache: HashMap<(u32, u32, u64), (u64, u64)>,
}

#[derive(Debug, Default)]
pub struct Segments {
    meta: Option<Meta>,
    host: Option<Record>,
    host_copy: Option<Record>,
    unavailable: Vec<Record>,
    gpus: BTreeMap<u32, Record>,
    processes: BTreeMap<u32, Record>,
    process_env: BTreeMap<u32, Record>,
    threads: BTreeMap<u32, Record>,
    cuda_libraries: BTreeMap<u32, Record>,
    cuda_probes: Vec<Record>,
    /// Each live thread's counters at the start of this segment, as the session counts them.
    base: HashMap<u32, ThreadCounters>,
    /// Each live thread's counters at the last tick, as the session counts them.
    last: HashMap<u32, ThreadCounters>,
    /// What the previous segment ended with, and what this one has ended with so far.
    prior: Closing,
    closing: Closing,
}

fn rebase(c: ThreadCounters, base: Option<&ThreadCounters>) -> ThreadCounters {
    let Some(b) = base else { return c };
    ThreadCounters {
        on_cpu_ns: c.on_cpu_ns.saturating_sub(b.on_cpu_ns),
        runqueue_ns: c.runqueue_ns.saturating_sub(b.runqueue_ns),
        io_wait_ns: c.io_wait_ns.saturating_sub(b.io_wait_ns),
        blocked_ns: c.blocked_ns.saturating_sub(b.blocked_ns),
        page_cache_misses: c.page_cache_misses.saturating_sub(b.page_cache_misses),
        page_cache_miss_bytes: c
            .page_cache_miss_bytes
            .saturating_sub(b.page_cache_miss_bytes),
        ..c
    }
}

/// Warnings are named once per session: a segment lists those it saw first.
fn new_warnings(now: &[String], before: &[String]) -> Vec<String> {
    now.iter()
        .filter(|w| !before.contains(w))
        .cloned()
        .collect()
}

fn unwinding_since(now: &UnwindStats, before: &UnwindStats) -> UnwindStats {
    UnwindStats {
        complete: now.complete.saturating_sub(before.complete),
        truncated: now.truncated.saturating_sub(before.truncated),
        failed: now.failed.saturating_sub(before.failed),
        by_frame_pointers: now
            .by_frame_pointers
            .saturating_sub(before.by_frame_pointers),
        by_dwarf: now.by_dwarf.saturating_sub(before.by_dwarf),
        without_copy: now.without_copy.saturating_sub(before.without_copy),
        dwarf_walks: now.dwarf_walks.saturating_sub(before.dwarf_walks),
        dwarf_ns: now.dwarf_ns.saturating_sub(before.dwarf_ns),
        warnings: new_warnings(&now.warnings, &before.warnings),
    }
}

fn python_since(now: &PythonStats, before: &PythonStats) -> PythonStats {
    PythonStats {
        processes: now.processes.clone(),
        samples: now.samples.saturating_sub(before.samples),
        frames: now.frames.saturating_sub(before.frames),
        unreadable: now.unreadable.saturating_sub(before.unreadable),
        truncated: now.truncated.saturating_sub(before.truncated),
        warnings: new_warnings(&now.warnings, &before.warnings),
    }
}

impl Segments {
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes `record` and returns what the current segment's file gets in its place: the
    /// record itself, or rebased to the segment's start, or `None` when nothing of it falls
    /// in the segment (a file's page-cache misses, all from earlier segments).
    pub fn pass<'a>(&mut self, record: &'a Record) -> Option<Cow<'a, Record>> {
        let kept = || Some(Cow::Borrowed(record));
        match record {
            Record::Meta(m) => self.meta = Some((**m).clone()),
            Record::Host { .. } => self.host = Some(record.clone()),
            Record::HostCopy { .. } => self.host_copy = Some(record.clone()),
            Record::Unavailable { .. } if !self.unavailable.contains(record) => {
                self.unavailable.push(record.clone());
            }
            Record::Gpu(g) => {
                self.gpus.insert(g.index, record.clone());
            }
            Record::Process { pid, .. } => {
                self.processes.insert(*pid, record.clone());
            }
            Record::ProcessEnv { pid, .. } => {
                self.process_env.insert(*pid, record.clone());
            }
            Record::Thread { tid, .. } => {
                self.threads.insert(*tid, record.clone());
            }
            Record::CudaLibrary { pid, .. } => {
                self.cuda_libraries.insert(*pid, record.clone());
            }
            Record::CudaProbes { .. } => self.cuda_probes.push(record.clone()),
            Record::Tick { ts_ns, threads } => {
                let threads = threads
                    .iter()
                    .map(|&c| {
                        self.last.insert(c.tid, c);
                        rebase(c, self.base.get(&c.tid))
                    })
                    .collect();
                return Some(Cow::Owned(Record::Tick {
                    ts_ns: *ts_ns,
                    threads,
                }));
            }
            Record::ThreadExit { ts_ns, counters } => {
                let tid = counters.tid;
                let rebased = rebase(*counters, self.base.get(&tid));
                self.base.remove(&tid);
                self.last.remove(&tid);
                self.threads.remove(&tid);
                return Some(Cow::Owned(Record::ThreadExit {
                    ts_ns: *ts_ns,
                    counters: rebased,
                }));
            }
            Record::Loss(l) => {
                let now = (l.attempted, l.dropped, l.received);
                let before = self.prior.losses.get(&l.kind).copied().unwrap_or_default();
                self.closing.losses.insert(l.kind.clone(), now);
                return Some(Cow::Owned(Record::Loss(EventLoss {
                    kind: l.kind.clone(),
                    attempted: now.0.saturating_sub(before.0),
                    dropped: now.1.saturating_sub(before.1),
                    received: now.2.saturating_sub(before.2),
                })));
            }
            Record::Unwinding(u) => {
                let since = unwinding_since(u, &self.prior.unwinding);
                self.closing.unwinding = (**u).clone();
                return Some(Cow::Owned(Record::Unwinding(Box::new(since))));
            }
            Record::PythonStacks(p) => {
                let since = python_since(p, &self.prior.python);
                self.closing.python = (**p).clone();
                return Some(Cow::Owned(Record::PythonStacks(Box::new(since))));
            }
            Record::PageCacheFile {
                tid,
                pid,
                dev,
                ino,
                path,
                pages,
                bytes,
            } => {
                let key = (*tid, *dev, *ino);
                let (p0, b0) = self.prior.page_cache.get(&key).copied().unwrap_or_default();
                self.closing.page_cache.insert(key, (*pages, *bytes));
                let (pages, bytes) = (pages.saturating_sub(p0), bytes.saturating_sub(b0));
                if pages == 0 && bytes == 0 {
                    return None;
                }
                return Some(Cow::Owned(Record::PageCacheFile {
                    tid: *tid,
                    pid: *pid,
                    dev: *dev,
                    ino: *ino,
                    path: path.clone(),
                    pages,
                    bytes,
                }));
            }
            // Timed events, and counts already per interval (a launch count is what the probes
            // counted since the last read): each belongs to the segment it falls in as it is.
            // Listed one by one, so that a new cumulative record cannot pass un-rebased.
            Record::Unavailable { .. }
            | Record::Stack { .. }
            | Record::CpuSample { .. }
            | Record::OffCpuSample { .. }
            | Record::BlockIo { .. }
            | Record::End { .. }
            | Record::GpuUtil { .. }
            | Record::GpuState(_)
            | Record::GpuProcessUtil { .. }
            | Record::CudaCall(_)
            | Record::Launches { .. }
            | Record::CudaCallSite { .. }
            | Record::BlockedIn { .. }
            | Record::WokenBy { .. } => {}
            // Cumulative since boot, but read only as differences between two readings of
            // one segment: it needs no rebasing.
            Record::HostCpu { .. } => {}
        }
        kept()
    }

    /// Starts the next segment at `start_ns` (the last tick's time, where the previous one
    /// ended): its opening records, the live processes and threads as of now, and a tick at
    /// which every live thread's counters start from zero.
    pub fn begin(&mut self, start_ns: u64, start_unix_ns: u64) -> Vec<Record> {
        self.base = self.last.clone();
        self.prior = self.closing.clone();
        let live: std::collections::BTreeSet<u32> = self
            .threads
            .values()
            .filter_map(|t| match t {
                Record::Thread { pid, .. } => Some(*pid),
                _ => None,
            })
            .collect();
        self.processes.retain(|pid, _| live.contains(pid));
        self.process_env.retain(|pid, _| live.contains(pid));
        self.cuda_libraries.retain(|pid, _| live.contains(pid));
        let mut out = Vec::new();
        if let Some(meta) = &self.meta {
            out.push(Record::Meta(Box::new(Meta {
                start_ns,
                start_unix_ns,
                ..meta.clone()
            })));
        }
        out.extend(self.host.clone());
        out.extend(self.host_copy.clone());
        out.extend(self.unavailable.iter().cloned());
        out.extend(self.gpus.values().cloned());
        for (pid, p) in &self.processes {
            if let Record::Process {
                pid, ppid, cmdline, ..
            } = p
            {
                out.push(Record::Process {
                    ts_ns: start_ns,
                    pid: *pid,
                    ppid: *ppid,
                    cmdline: cmdline.clone(),
                });
            }
            out.extend(self.process_env.get(pid).cloned());
        }
        for t in self.threads.values() {
            if let Record::Thread { tid, pid, comm, .. } = t {
                out.push(Record::Thread {
                    ts_ns: start_ns,
                    tid: *tid,
                    pid: *pid,
                    comm: comm.clone(),
                });
            }
        }
        out.extend(self.cuda_libraries.values().map(|r| match r {
            Record::CudaLibrary { pid, path, .. } => Record::CudaLibrary {
                ts_ns: start_ns,
                pid: *pid,
                path: path.clone(),
            },
            other => other.clone(),
        }));
        out.extend(self.cuda_probes.iter().cloned());
        let mut zero: Vec<ThreadCounters> = self
            .base
            .values()
            .map(|c| ThreadCounters {
                tid: c.tid,
                pid: c.pid,
                ..ThreadCounters::default()
            })
            .collect();
        zero.sort_by_key(|c| c.tid);
        out.push(Record::Tick {
            ts_ns: start_ns,
            threads: zero,
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::fold::Analyzer;
    use crate::recording::record::EndReason;

    fn counters(tid: u32, on: u64, blocked: u64) -> ThreadCounters {
        ThreadCounters {
            tid,
            pid: 10,
            on_cpu_ns: on,
            blocked_ns: blocked,
            ..ThreadCounters::default()
        }
    }

    fn meta(start_ns: u64) -> Record {
        Record::Meta(Box::new(Meta {
            target_pids: vec![10],
            start_ns,
            tick_ns: 100,
            ..Meta::default()
        }))
    }

    /// Passes `records` through, keeping what comes out.
    fn through(s: &mut Segments, records: Vec<Record>) -> Vec<Record> {
        records
            .iter()
            .filter_map(|r| s.pass(r).map(Cow::into_owned))
            .collect()
    }

    fn analyse(records: Vec<Record>) -> crate::Analysis {
        let mut a = Analyzer::new();
        for r in records {
            a.push(r);
        }
        a.finish().analysis
    }

    fn thread_on_cpu(a: &crate::Analysis, tid: u32) -> (u64, u64) {
        let c = a.threads[&tid].counters;
        (c.on_cpu_ns, c.blocked_ns)
    }

    #[test]
    fn the_second_segment_reads_as_a_recording_of_its_own() {
        let mut s = Segments::new();
        let first = through(
            &mut s,
            vec![
                meta(0),
                Record::Host { cpus: 2 },
                Record::Process {
                    ts_ns: 0,
                    pid: 10,
                    ppid: 1,
                    cmdline: "train.py".into(),
                },
                Record::Thread {
                    ts_ns: 0,
                    tid: 10,
                    pid: 10,
                    comm: "python".into(),
                },
                Record::Thread {
                    ts_ns: 0,
                    tid: 11,
                    pid: 10,
                    comm: "worker".into(),
                },
                Record::Tick {
                    ts_ns: 100,
                    threads: vec![counters(10, 60, 40), counters(11, 10, 90)],
                },
                Record::Tick {
                    ts_ns: 200,
                    threads: vec![counters(10, 150, 50), counters(11, 20, 180)],
                },
                Record::Loss(EventLoss {
                    kind: "cpu_sample".into(),
                    attempted: 30,
                    dropped: 1,
                    received: 29,
                }),
                Record::End {
                    ts_ns: 200,
                    reason: EndReason::Duration,
                },
            ],
        );
        // The first segment is the session's records as they were.
        assert!(matches!(&first[5], Record::Tick { threads, .. } if threads[0].on_cpu_ns == 60));
        let mut second = s.begin(200, 5_000);
        second.extend(through(
            &mut s,
            vec![
                Record::Tick {
                    ts_ns: 300,
                    threads: vec![counters(10, 230, 70), counters(11, 25, 275)],
                },
                Record::ThreadExit {
                    ts_ns: 350,
                    counters: counters(11, 30, 320),
                },
                Record::Tick {
                    ts_ns: 400,
                    threads: vec![counters(10, 320, 80)],
                },
                Record::Loss(EventLoss {
                    kind: "cpu_sample".into(),
                    attempted: 50,
                    dropped: 1,
                    received: 49,
                }),
                Record::End {
                    ts_ns: 400,
                    reason: EndReason::Duration,
                },
            ],
        ));
        let Record::Meta(m) = &second[0] else {
            panic!("a segment opens with its meta: {second:?}")
        };
        assert_eq!((m.start_ns, m.start_unix_ns, m.tick_ns), (200, 5_000, 100));
        let a = analyse(second.clone());
        // Each thread's time from the cut on, partitioning its life in the segment.
        assert_eq!(thread_on_cpu(&a, 10), (170, 30));
        assert_eq!(thread_on_cpu(&a, 11), (10, 140));
        let loss = second
            .iter()
            .find_map(|r| match r {
                Record::Loss(l) => Some(l.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!((loss.attempted, loss.dropped, loss.received), (20, 0, 20));
        // The process and both threads are named in the segment, from its start.
        assert!(second.iter().any(
            |r| matches!(r, Record::Process { pid: 10, ts_ns: 200, cmdline, .. } if cmdline == "train.py")
        ));
        // The worker exited in the second segment: a third knows only the main thread.
        let third = s.begin(400, 6_000);
        let threads: Vec<u32> = third
            .iter()
            .filter_map(|r| match r {
                Record::Thread { tid, .. } => Some(*tid),
                _ => None,
            })
            .collect();
        assert_eq!(threads, [10]);
        assert!(
            matches!(third.last(), Some(Record::Tick { ts_ns: 400, threads }) if threads.len() == 1 && threads[0].on_cpu_ns == 0)
        );
    }

    #[test]
    fn a_process_whose_threads_all_exited_is_not_carried_over() {
        let mut s = Segments::new();
        through(
            &mut s,
            vec![
                meta(0),
                Record::Process {
                    ts_ns: 0,
                    pid: 20,
                    ppid: 10,
                    cmdline: "worker".into(),
                },
                Record::ProcessEnv {
                    pid: 20,
                    vars: vec![("RANK".into(), "1".into())],
                },
                Record::Thread {
                    ts_ns: 0,
                    tid: 20,
                    pid: 20,
                    comm: "worker".into(),
                },
                Record::CudaLibrary {
                    ts_ns: 0,
                    pid: 20,
                    path: "/usr/lib/libcuda.so.1".into(),
                },
                Record::ThreadExit {
                    ts_ns: 50,
                    counters: counters(20, 10, 40),
                },
            ],
        );
        let next = s.begin(100, 0);
        assert!(
            !next.iter().any(|r| matches!(
                r,
                Record::Process { .. } | Record::ProcessEnv { .. } | Record::CudaLibrary { .. }
            )),
            "{next:?}"
        );
    }

    #[test]
    fn statistics_and_file_misses_count_from_the_cut() {
        let mut s = Segments::new();
        let miss = |pages, bytes| Record::PageCacheFile {
            tid: 10,
            pid: 10,
            dev: 1,
            ino: 2,
            path: Some("/data/x".into()),
            pages,
            bytes,
        };
        let unwinding = |complete, warnings: &[&str]| {
            Record::Unwinding(Box::new(UnwindStats {
                complete,
                warnings: warnings.iter().map(|w| w.to_string()).collect(),
                ..UnwindStats::default()
            }))
        };
        through(
            &mut s,
            vec![miss(4, 16384), unwinding(100, &["libx: no CFI"])],
        );
        s.begin(100, 0);
        // No new misses of the file: nothing of it belongs to the second segment.
        assert_eq!(s.pass(&miss(4, 16384)), None);
        assert_eq!(
            s.pass(&unwinding(130, &["libx: no CFI", "liby: unreadable"]))
                .map(Cow::into_owned),
            Some(Record::Unwinding(Box::new(UnwindStats {
                complete: 30,
                warnings: vec!["liby: unreadable".into()],
                ..UnwindStats::default()
            })))
        );
        s.begin(200, 0);
        assert_eq!(
            s.pass(&miss(6, 24576)).map(Cow::into_owned),
            Some(miss(2, 8192))
        );
    }
}
