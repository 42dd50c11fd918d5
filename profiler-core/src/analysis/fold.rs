//! Folds a stream of records into an [`Analysis`] without keeping the records.
//!
//! The same [`Analyzer`] serves `report` (records replayed from a file, see
//! [`analyze_reader`]) and a live `record` session (records pushed as they are written).
use std::collections::BTreeMap;
use std::io::Read;

use crate::analysis::model::{
    Analysis, BlockIoSummary, BlockedOn, EventCounts, GpuSample, GpuTimeline, PageCacheFileEntry,
    ProcessSummary, ThreadSummary, UnavailableSignal, Waker,
};
use crate::analysis::percentiles::Percentiles;
use crate::analysis::stack_samples::SampleAccumulator;
use crate::analysis::tick_slices::TimelineBuilder;
use crate::analysis::wait_for::{StackWait, WaitFor, Woken, call_wait, classify, stack_wait};
use crate::attribution::Attribution;
use crate::fxhash::FxHashMap;
use crate::recording::format::FormatError;
use crate::recording::reader::{LoadInfo, RecordReader};
use crate::recording::record::{EndReason, GpuInfo, GpuState, Meta, Record, ThreadCounters};

/// The kernel's counters of records it chose not to send under pressure (stack copies,
/// samples) end in this (profiler-common's `kind::THINNED_SUFFIX`).
pub const THINNED_SUFFIX: &str = "_thinned";

/// The longest GPU utilization period believed. The recorder writes NVML's periods, a fraction
/// of a second, clamped to 2 s; a longer one is damage, and left as it is, one damaged sample
/// would make the attribution label every second of years (one entry per second).
const MAX_GPU_PERIOD_NS: u64 = 60 * 1_000_000_000;

/// Records decoded per batch handed from the decoding thread to the analysis.
const DECODE_BATCH: usize = 1024;
/// Batches decoded ahead of the analysis.
const BATCHES_AHEAD: usize = 4;

/// A recording folded: the model the reports read, and the timed samples and IOs that
/// attribution draws its evidence from (held apart, so that they can be freed once it is done
/// while the model is still rendered).
#[derive(Debug, Default)]
pub struct Folded {
    pub analysis: Analysis,
    pub timed: crate::analysis::timed_events::TimedEvents,
}

impl Folded {
    /// Why each GPU idled, judged by this recording's GPUs alone; `None` without GPU samples.
    /// A job of several recordings is attributed through [`crate::pipeline`].
    pub fn attribute(&self) -> Option<Attribution> {
        crate::attribution::attribute(&self.analysis, &self.timed)
    }
}

/// Reads a recording as a stream and folds it, holding only the model in memory.
///
/// Decoding runs on a thread of its own, a few batches ahead of the analysis: on a long
/// recording the two take about as long, so a second core halves the wait.
pub fn load_reader<R: Read + Send>(r: R) -> Result<(Folded, LoadInfo), FormatError> {
    let mut reader = RecordReader::new(r)?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Record>>(BATCHES_AHEAD);
    let mut analyzer = Analyzer::new();
    let decoded = std::thread::scope(|scope| {
        let decode = move || -> Result<RecordReader<R>, FormatError> {
            loop {
                let mut batch = Vec::with_capacity(DECODE_BATCH);
                while batch.len() < DECODE_BATCH {
                    match reader.next_record()? {
                        Some(record) => batch.push(record),
                        None => break,
                    }
                }
                let last = batch.len() < DECODE_BATCH;
                if tx.send(batch).is_err() || last {
                    return Ok(reader);
                }
            }
        };
        let decoder = std::thread::Builder::new()
            .name("decode".into())
            .spawn_scoped(scope, decode);
        match decoder {
            Ok(decoder) => {
                for batch in rx {
                    for record in batch {
                        analyzer.push(record);
                    }
                }
                decoder
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            }
            Err(e) => Err(FormatError::Io(e)),
        }
    });
    let reader = decoded?;
    let info = LoadInfo {
        truncated: reader.truncation(),
        unknown_records: reader.unknown_records(),
        records: reader.records_read(),
    };
    Ok((analyzer.finish(), info))
}

/// Analyses records already in memory (or any other iterator of them).
pub fn analyze<I: IntoIterator<Item = Record>>(records: I) -> Folded {
    let mut analyzer = Analyzer::new();
    for record in records {
        analyzer.push(record);
    }
    analyzer.finish()
}

#[derive(Debug, Default)]
struct ThreadAcc {
    pid: u32,
    comm: String,
    last_tick: Option<ThreadCounters>,
    exit: Option<ThreadCounters>,
    blk_count: u64,
    blk_read_bytes: u64,
    blk_write_bytes: u64,
    blk_latency: Percentiles,
    /// Sampled off-CPU time by (call, detail) it blocked in.
    blocked_on: BTreeMap<(String, String), BlockedAcc>,
}

/// A waker as the kernel saw it: TID, PID, comm and the context it woke from.
type WakerKey = (u32, u32, String, String);

#[derive(Debug, Default)]
struct BlockedAcc {
    ns: u64,
    wakers: BTreeMap<WakerKey, u64>,
}

#[derive(Debug, Default)]
struct ProcessAcc {
    ppid: Option<u32>,
    cmdline: String,
}

/// Incremental analysis: [`Self::push`] each record in file order, then [`Self::finish`].
#[derive(Debug, Default)]
pub struct Analyzer {
    meta: Option<Meta>,
    first_ts_ns: Option<u64>,
    last_ts_ns: u64,
    end: Option<(u64, EndReason)>,
    threads: FxHashMap<u32, ThreadAcc>,
    /// Each thread's last `BlockedIn`, for the off-CPU sample of the same time after it.
    blocked_in: FxHashMap<u32, (u64, String, String)>,
    /// Each thread's last `WokenBy`, likewise.
    woken: FxHashMap<u32, (u64, WakerKey)>,
    /// What each stack's frames say of a wait, once per stack.
    stack_waits: FxHashMap<u32, StackWait>,
    processes: FxHashMap<u32, ProcessAcc>,
    stacks: BTreeMap<u32, Vec<String>>,
    samples: SampleAccumulator,
    page_cache_files: Vec<PageCacheFileEntry>,
    events: BTreeMap<String, EventCounts>,
    unavailable: Vec<UnavailableSignal>,
    timeline: TimelineBuilder,
    gpus: BTreeMap<u32, GpuAcc>,
    timed: crate::analysis::timed_events::TimedEvents,
    cpus: u32,
    host_cpu: Vec<crate::analysis::model::HostCpuReading>,
    unwinding: Option<crate::recording::record::UnwindStats>,
    python: Option<crate::recording::record::PythonStats>,
    /// Python call sites by (tid, start), for the probed call that follows each.
    call_sites: BTreeMap<(u32, u64), Vec<String>>,
    cuda_processes: BTreeMap<u32, String>,
    cuda_calls: Vec<crate::recording::record::CudaCall>,
    cuda_libraries: Vec<crate::cuda::ProbedLibrary>,
    launches_by_api: BTreeMap<u32, BTreeMap<String, u64>>,
    launch_probed_ns: u64,
    env_ranks: BTreeMap<u32, crate::cuda::RankInfo>,
    callers_off_cpu: crate::analysis::off_cpu_spans::OffCpuSpans,
    host_copy_gbps: Option<f64>,
}

#[derive(Debug, Default)]
struct GpuAcc {
    info: GpuInfo,
    samples: Vec<GpuSample>,
    states: Vec<GpuState>,
    process_sm: BTreeMap<u32, (u64, u64)>,
}

impl Analyzer {
    pub fn new() -> Self {
        Self::default()
    }

    fn seen_ts(&mut self, ts_ns: u64) {
        self.first_ts_ns.get_or_insert(ts_ns);
        self.last_ts_ns = self.last_ts_ns.max(ts_ns);
    }

    /// Where the first timeline slice starts.
    fn start_ns(&self) -> u64 {
        match &self.meta {
            Some(m) => m.start_ns,
            None => self.first_ts_ns.unwrap_or(0),
        }
    }

    /// What an off-CPU sample with `stack` waited for, from its waker and its call when the
    /// recording says them.
    fn wait_for(
        &mut self,
        stack: u32,
        waker: Option<&WakerKey>,
        blocked_in: Option<&(u64, String, String)>,
    ) -> WaitFor {
        let stacks = &self.stacks;
        let on_stack = *self.stack_waits.entry(stack).or_insert_with(|| {
            stacks
                .get(&stack)
                .map_or(StackWait::Nothing, |f| stack_wait(f))
        });
        let threads = &self.threads;
        let woken = waker
            .map(|(tid, _, _, context)| Woken::of(*tid, context, |t| threads.contains_key(&t)));
        let processes = &self.processes;
        let call = blocked_in.map(|(_, call, detail)| {
            let kind = BlockedOn::kind_of(call, detail);
            (
                call_wait(kind, detail, |p| processes.contains_key(&p)),
                kind == "futex",
            )
        });
        classify(
            on_stack,
            woken,
            call.map(|c| c.0),
            call.is_some_and(|c| c.1),
        )
    }

    fn thread(&mut self, tid: u32, pid: u32) -> &mut ThreadAcc {
        let t = self.threads.entry(tid).or_default();
        if pid != 0 {
            t.pid = pid;
        }
        t
    }

    /// Folds one record into the model.
    pub fn push(&mut self, record: Record) {
        match record {
            Record::Meta(meta) => {
                if self.meta.is_none() {
                    self.meta = Some(*meta);
                }
            }
            Record::Thread {
                ts_ns,
                tid,
                pid,
                comm,
            } => {
                self.seen_ts(ts_ns);
                self.thread(tid, pid).comm = comm;
            }
            Record::Process {
                ts_ns,
                pid,
                ppid,
                cmdline,
            } => {
                self.seen_ts(ts_ns);
                let p = self.processes.entry(pid).or_default();
                p.ppid = Some(ppid);
                p.cmdline = cmdline;
            }
            Record::Tick { ts_ns, threads } => {
                self.seen_ts(ts_ns);
                let start_ns = self.start_ns();
                self.timeline.tick(ts_ns, start_ns, &threads);
                for c in threads {
                    self.thread(c.tid, c.pid).last_tick = Some(c);
                }
            }
            Record::ThreadExit { ts_ns, counters } => {
                self.seen_ts(ts_ns);
                self.timeline.exit(&counters);
                self.thread(counters.tid, counters.pid).exit = Some(counters);
            }
            Record::Stack { id, frames } => {
                self.stacks.insert(id, frames);
            }
            Record::CpuSample {
                ts_ns,
                tid,
                pid,
                stack,
            } => {
                // The thread joins `threads` in `finish`: one map probe less per sample.
                self.seen_ts(ts_ns);
                self.samples.cpu_sample(tid, pid, stack);
                self.timed.cpu_sample(ts_ns, tid, stack);
            }
            Record::OffCpuSample {
                ts_ns,
                tid,
                pid,
                duration_ns,
                io,
                stack,
            } => {
                self.seen_ts(ts_ns);
                let waker = self
                    .woken
                    .remove(&tid)
                    .filter(|(at, _)| *at == ts_ns)
                    .map(|(_, w)| w);
                let blocked_in = self.blocked_in.remove(&tid).filter(|(at, ..)| *at == ts_ns);
                if self.callers_off_cpu.keeps(tid, pid) {
                    let wait = self.wait_for(stack, waker.as_ref(), blocked_in.as_ref());
                    self.callers_off_cpu
                        .off_cpu_sample(ts_ns, (tid, pid), duration_ns, wait);
                }
                if let Some((_, call, detail)) = blocked_in {
                    let t = self.thread(tid, pid);
                    let acc = t.blocked_on.entry((call, detail)).or_default();
                    acc.ns = acc.ns.saturating_add(duration_ns);
                    if let Some(w) = waker {
                        let ns = acc.wakers.entry(w).or_default();
                        *ns = ns.saturating_add(duration_ns);
                    }
                }
                self.samples
                    .off_cpu_sample(tid, pid, stack, io, duration_ns);
                self.timed
                    .off_cpu_sample(ts_ns, tid, stack, io, duration_ns);
            }
            Record::BlockedIn {
                ts_ns,
                tid,
                call,
                detail,
            } => {
                self.blocked_in.insert(tid, (ts_ns, call, detail));
            }
            Record::WokenBy {
                ts_ns,
                tid,
                waker_tid,
                waker_pid,
                waker_comm,
                context,
            } => {
                self.woken
                    .insert(tid, (ts_ns, (waker_tid, waker_pid, waker_comm, context)));
            }
            Record::BlockIo {
                ts_ns,
                tid,
                pid,
                write,
                bytes,
                queue_ns,
                service_ns,
                ..
            } => {
                self.seen_ts(ts_ns);
                let t = self.thread(tid, pid);
                t.blk_count += 1;
                if write {
                    t.blk_write_bytes = t.blk_write_bytes.saturating_add(bytes);
                } else {
                    t.blk_read_bytes = t.blk_read_bytes.saturating_add(bytes);
                }
                let latency_ns = queue_ns.saturating_add(service_ns);
                t.blk_latency.record(latency_ns);
                self.timed.block_io(ts_ns, tid, write, bytes, latency_ns);
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
                self.thread(tid, pid);
                self.page_cache_files.push(PageCacheFileEntry {
                    tid,
                    pid,
                    dev,
                    ino,
                    path,
                    pages,
                    bytes,
                });
            }
            Record::Unavailable { signal, reason } => {
                self.unavailable.push(UnavailableSignal { signal, reason });
            }
            Record::Loss(loss) if loss.kind.ends_with(THINNED_SUFFIX) => {
                // Records the kernel chose not to send: none was attempted, none is lost.
                let e = self.events.entry(loss.kind).or_default();
                e.attempted = e.attempted.saturating_add(loss.attempted);
                e.thinned = e.thinned.saturating_add(loss.attempted);
            }
            Record::Loss(loss) => {
                let e = self.events.entry(loss.kind).or_default();
                let missing = loss
                    .attempted
                    .saturating_sub(loss.dropped.saturating_add(loss.received));
                e.attempted = e.attempted.saturating_add(loss.attempted);
                e.dropped = e.dropped.saturating_add(loss.dropped);
                e.received = e.received.saturating_add(loss.received);
                e.lost = e.lost.saturating_add(loss.dropped.saturating_add(missing));
            }
            Record::End { ts_ns, reason } => {
                self.seen_ts(ts_ns);
                if self.end.is_none() {
                    self.end = Some((ts_ns, reason));
                }
            }
            Record::Host { cpus } => self.cpus = cpus,
            Record::HostCopy { bytes, ns } => {
                // A file may say anything: a rate only from a copy that took time.
                self.host_copy_gbps = (bytes > 0 && ns > 0).then(|| bytes as f64 / ns as f64);
            }
            Record::HostCpu {
                ts_ns,
                busy_ns,
                total_ns,
            } => {
                self.seen_ts(ts_ns);
                self.host_cpu.push(crate::analysis::model::HostCpuReading {
                    ts_ns,
                    busy_ns,
                    total_ns,
                });
            }
            Record::Unwinding(stats) => self.unwinding = Some(*stats),
            Record::PythonStacks(stats) => self.python = Some(*stats),
            Record::CudaCallSite {
                tid,
                start_ns,
                python,
            } => {
                self.call_sites.insert((tid, start_ns), python);
            }
            Record::CudaLibrary { ts_ns, pid, path } => {
                self.seen_ts(ts_ns);
                self.cuda_processes.insert(pid, path);
            }
            Record::Gpu(info) => {
                let index = info.index;
                self.gpus.entry(index).or_default().info = *info;
            }
            Record::GpuUtil {
                gpu,
                ts_ns,
                period_ns,
                util_pct,
            } => {
                self.gpus.entry(gpu).or_default().samples.push(GpuSample {
                    ts_ns,
                    period_ns: period_ns.min(MAX_GPU_PERIOD_NS),
                    util_pct,
                });
            }
            Record::GpuState(state) => {
                self.gpus.entry(state.gpu).or_default().states.push(*state);
            }
            Record::CudaProbes {
                ts_ns,
                pid,
                path,
                library,
                attached,
                missing,
            } => {
                self.seen_ts(ts_ns);
                self.cuda_libraries.push(crate::cuda::ProbedLibrary {
                    pid,
                    path,
                    library,
                    attached: attached.len(),
                    missing,
                    attached_ns: ts_ns,
                });
            }
            Record::ProcessEnv { pid, vars } => {
                if let Some(r) = crate::cuda::rank_from_env(&vars) {
                    self.env_ranks.insert(pid, r);
                }
            }
            Record::CudaCall(mut call) => {
                self.seen_ts(call.start_ns);
                if let Some(site) = self.call_sites.remove(&(call.tid, call.start_ns)) {
                    call.caller = python_caller(&site, &call.caller);
                }
                self.callers_off_cpu.calls_cuda(call.tid);
                self.cuda_calls.push(*call);
            }
            Record::Launches {
                ts_ns,
                probed_ns,
                counts,
            } => {
                self.seen_ts(ts_ns);
                // Saturating: the counts come from a file, which may be damaged.
                self.launch_probed_ns = self.launch_probed_ns.saturating_add(probed_ns);
                for c in counts {
                    let n = self
                        .launches_by_api
                        .entry(c.pid)
                        .or_default()
                        .entry(c.api)
                        .or_default();
                    *n = n.saturating_add(c.launches);
                }
            }
            Record::GpuProcessUtil {
                gpu, pid, sm_pct, ..
            } => {
                let acc = self.gpus.entry(gpu).or_default();
                let e = acc.process_sm.entry(pid).or_default();
                e.0 += u64::from(sm_pct);
                e.1 += 1;
            }
        }
    }

    /// The finished model.
    pub fn finish(mut self) -> Folded {
        for (tid, pid) in self.samples.sampled_threads() {
            self.threads.entry(tid).or_insert_with(|| ThreadAcc {
                pid,
                ..ThreadAcc::default()
            });
        }
        let start_ns = self.start_ns();
        let end_ns = self.end.map_or(self.last_ts_ns, |(ts, _)| ts).max(start_ns);
        let threads = finish_threads(self.threads);
        let processes = finish_processes(self.processes, &threads);
        let (cpu_samples, off_cpu) = self.samples.finish(
            |tid| threads.get(&tid).map(|t| t.pid),
            |tid| {
                threads
                    .get(&tid)
                    .map(|t| t.counters.io_wait_ns.saturating_add(t.counters.blocked_ns))
            },
        );
        let mut page_cache_files = self.page_cache_files;
        page_cache_files.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then(a.tid.cmp(&b.tid))
                .then(a.dev.cmp(&b.dev))
                .then(a.ino.cmp(&b.ino))
        });
        let lost_events = self
            .events
            .values()
            .fold(0u64, |sum, e| sum.saturating_add(e.lost));
        let attempted_events = self
            .events
            .values()
            .filter(|e| e.thinned == 0)
            .fold(0u64, |sum, e| sum.saturating_add(e.attempted));
        let gpus = finish_gpus(self.gpus);
        let mut timed = self.timed;
        timed.finish();
        let mut callers_off_cpu = self.callers_off_cpu;
        callers_off_cpu.finish();
        let analysis = Analysis {
            meta: self.meta,
            start_ns,
            duration_ns: end_ns - start_ns,
            ended: self.end.is_some(),
            end_reason: self.end.map(|(_, reason)| reason),
            threads,
            processes,
            stacks: self.stacks,
            cpu_samples,
            off_cpu,
            page_cache_files,
            events: self.events,
            lost_events,
            attempted_events,
            unavailable: self.unavailable,
            timeline: self.timeline.finish(start_ns, end_ns),
            gpus,
            cpus: self.cpus,
            host_copy_gbps: self.host_copy_gbps,
            host_cpu: {
                let mut readings = self.host_cpu;
                readings.sort_by_key(|r| r.ts_ns);
                readings
            },
            unwinding: self.unwinding,
            python: self.python,
            callers_off_cpu,
            cuda_processes: self.cuda_processes,
            cuda: crate::cuda::CudaView {
                env_ranks: self.env_ranks,
                ..crate::cuda::build(
                    self.cuda_calls,
                    self.cuda_libraries,
                    self.launches_by_api,
                    self.launch_probed_ns,
                )
            },
        };
        Folded { analysis, timed }
    }
}

fn finish_gpus(gpus: BTreeMap<u32, GpuAcc>) -> BTreeMap<u32, GpuTimeline> {
    gpus.into_iter()
        .map(|(index, mut g)| {
            g.samples.sort_by_key(|s| s.ts_ns);
            g.samples.dedup_by_key(|s| s.ts_ns);
            g.states.sort_by_key(|s| s.ts_ns);
            let process_sm_pct = g
                .process_sm
                .into_iter()
                .filter(|(_, (_, n))| *n > 0)
                .map(|(pid, (sum, n))| (pid, sum as f64 / n as f64))
                .collect();
            let mut info = g.info;
            info.index = index;
            let timeline = GpuTimeline {
                info,
                samples: g.samples,
                states: g.states,
                process_sm_pct,
            };
            (index, timeline)
        })
        .collect()
}

fn finish_threads(threads: FxHashMap<u32, ThreadAcc>) -> BTreeMap<u32, ThreadSummary> {
    let traced: Vec<u32> = threads.keys().copied().collect();
    let traced = |tid: u32| traced.contains(&tid);
    threads
        .into_iter()
        .map(|(tid, t)| {
            let counters = t.exit.or(t.last_tick).unwrap_or(ThreadCounters {
                tid,
                pid: t.pid,
                ..ThreadCounters::default()
            });
            let block_io = BlockIoSummary {
                count: t.blk_count,
                read_bytes: t.blk_read_bytes,
                write_bytes: t.blk_write_bytes,
                p50_ns: t.blk_latency.percentile(50),
                p99_ns: t.blk_latency.percentile(99),
                max_ns: t.blk_latency.percentile(100),
            };
            let mut blocked_on: Vec<BlockedOn> = t
                .blocked_on
                .into_iter()
                .map(|((call, detail), acc)| {
                    // A timer or an interrupt is one waker whichever task it interrupted.
                    let mut wakers: Vec<Waker> = Vec::new();
                    for ((tid, pid, comm, context), ns) in &acc.wakers {
                        let w = Waker::classify((*tid, *pid, comm, context), traced, *ns);
                        match wakers
                            .iter_mut()
                            .find(|o| o.kind == w.kind && o.who == w.who)
                        {
                            Some(o) => o.ns = o.ns.saturating_add(w.ns),
                            None => wakers.push(w),
                        }
                    }
                    wakers.sort_by(|x, y| y.ns.cmp(&x.ns).then_with(|| x.who.cmp(&y.who)));
                    BlockedOn {
                        kind: BlockedOn::kind_of(&call, &detail),
                        call,
                        detail,
                        ns: acc.ns,
                        wakers,
                    }
                })
                .collect();
            blocked_on.sort_by(|x, y| y.ns.cmp(&x.ns).then_with(|| x.call.cmp(&y.call)));
            let summary = ThreadSummary {
                tid,
                pid: t.pid,
                comm: t.comm,
                counters,
                exited: t.exit.is_some(),
                block_io,
                blocked_on,
            };
            (tid, summary)
        })
        .collect()
}

fn finish_processes(
    processes: FxHashMap<u32, ProcessAcc>,
    threads: &BTreeMap<u32, ThreadSummary>,
) -> BTreeMap<u32, ProcessSummary> {
    let mut out: BTreeMap<u32, ProcessSummary> = processes
        .into_iter()
        .map(|(pid, p)| {
            let summary = ProcessSummary {
                pid,
                ppid: p.ppid,
                cmdline: p.cmdline,
                ..ProcessSummary::default()
            };
            (pid, summary)
        })
        .collect();
    // Threads iterate by ascending TID, so each process's list comes out sorted.
    for t in threads.values() {
        let p = out.entry(t.pid).or_insert_with(|| ProcessSummary {
            pid: t.pid,
            ..ProcessSummary::default()
        });
        p.threads.push(t.tid);
    }
    for p in out.values_mut() {
        let main = threads
            .get(&p.pid)
            .filter(|t| t.pid == p.pid)
            .or_else(|| p.threads.first().and_then(|tid| threads.get(tid)));
        if let Some(main) = main {
            p.comm.clone_from(&main.comm);
        }
    }
    out
}

/// A probed call's caller as a Python user reads it: the line of their own code that made it
/// (the last of `site`, innermost first), then the native function that called the API.
fn python_caller(site: &[String], native: &str) -> String {
    match (site.last(), native.is_empty() || native == "[unknown]") {
        (None, _) => native.to_string(),
        (Some(line), true) => line.clone(),
        (Some(line), false) => format!("{line} via {native}"),
    }
}

#[cfg(test)]
mod python_caller_tests {
    use super::python_caller;

    #[test]
    fn the_users_line_comes_first_then_the_native_caller() {
        let site = vec![
            "synchronize (torch/cuda/__init__.py:985)".to_string(),
            "train_step (train.py:57)".to_string(),
        ];
        assert_eq!(
            python_caller(&site, "at::cuda::sync"),
            "train_step (train.py:57) via at::cuda::sync"
        );
        assert_eq!(python_caller(&site, ""), "train_step (train.py:57)");
        assert_eq!(
            python_caller(&site, "[unknown]"),
            "train_step (train.py:57)"
        );
        assert_eq!(python_caller(&[], "at::cuda::sync"), "at::cuda::sync");
    }
}
