//! A live recording: seeds the tracked threads, attaches, then streams ring-buffer records
//! and periodic accounting snapshots into the recording file until the duration ends, a
//! signal arrives or every traced thread has exited.
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use profiler_common::{EventCounts, FileKey, FileMisses, ThreadStats, kind, state};
use profiler_core::recording::record::{EndReason, EventLoss, Record, ThreadCounters};
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
};

use super::{
    clock::monotonic_ns,
    decode::Decoder,
    gpu::GpuSampler,
    kernel::{slots::Slots, switch_control::SwitchControl},
    probes::dlopen::DlopenWatch,
    proc::{files::FileNames, target},
    sink::{Sink, write_process},
};

/// A process's maps as last read: their digest, and when to read them again (in scans);
/// and its threads' page-cache misses when its open files were last listed.
#[derive(Default)]
struct MapsWatch {
    digest: u64,
    every: u64,
    next_scan: u64,
    page_cache_misses: u64,
}

/// The longest wait between two reads of unchanged maps, in scans (200 ms each), for a
/// process whose loader is not probed...
const MAPS_SCANS_AT_MOST_EVERY: u64 = 5;
/// ... and for one whose loader says when it loads a library ([`DlopenWatch`]): then the
/// timer only catches what the loader does not do (code mapped by hand, a JIT).
const WATCHED_MAPS_SCANS_AT_MOST_EVERY: u64 = 25;

pub struct Session {
    pub ebpf: aya::Ebpf,
    pub slots: Slots,
    pub sink: Box<dyn Sink>,
    pub decoder: Decoder,
    /// Last counters written per live thread.
    last: HashMap<u32, ThreadCounters>,
    /// The traced processes, shared with the GPU sampler.
    pids: Arc<Mutex<BTreeSet<u32>>>,
    files: FileNames,
    gpu: Option<GpuSampler>,
    /// Processes already reported as mapping the CUDA driver library.
    cuda: BTreeSet<u32>,
    /// When the last Tick was taken: the recording ends there, since the accounting is
    /// exact only while the programs are attached.
    last_tick_ns: u64,
    comms: HashMap<u32, String>,
    probes: super::probes::cuda::CudaProbes,
    /// When each process's maps are read next.
    maps_watch: HashMap<u32, MapsWatch>,
    /// The loader probes that mark processes loading a library (`MAPS_CHANGED`).
    pub dlopen: DlopenWatch,
    /// Whether the kernel sends Python frames (`record --no-python` turns them off).
    pub python: bool,
    /// Removing the CUDA probes, in the background; joined before exit.
    pub unprobe: Option<std::thread::JoinHandle<()>>,
    /// The helper that removes the links whose removal waits for grace periods.
    pub handed: Option<super::handover::Handed>,
    /// `record --segment`: where each finished segment's file goes, and when the next ends.
    pub segments: Option<SegmentClock>,
    /// Which hook sees the tracked threads' switches (none in unit tests).
    pub switches: Option<SwitchControl>,
    /// Ends the recording as an interrupt does (`top`'s q).
    pub stop: Option<std::sync::Arc<tokio::sync::Notify>>,
}

/// When `record --segment`'s segments end, and who is told of each finished file.
pub struct SegmentClock {
    pub every: Duration,
    pub next_ns: u64,
    pub done: std::sync::mpsc::Sender<PathBuf>,
}

/// A digest of the executable mappings in `maps`: the others (heap arenas, tensors, the
/// shared memory a DataLoader hands its batches over in) come and go with every step, and
/// none of what is read from the maps depends on them.
fn code_digest(maps: &str) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for line in maps.lines() {
        if line
            .split_whitespace()
            .nth(1)
            .is_some_and(|perms| perms.contains('x'))
        {
            line.hash(&mut h);
        }
    }
    h.finish()
}

/// The kernel's per-kind counts of attempted and refused records.
fn event_counts(ebpf: &aya::Ebpf) -> anyhow::Result<PerCpuArray<&MapData, EventCounts>> {
    let map = ebpf
        .map("COUNTS")
        .ok_or_else(|| anyhow::anyhow!("map COUNTS missing"))?;
    Ok(PerCpuArray::try_from(map)?)
}

/// The counters of a live thread, with its open interval credited up to `now`.
fn snapshot(tid: u32, st: &ThreadStats, now: u64) -> ThreadCounters {
    let mut c = crate::capture::decode::counters(tid, st);
    let open = now.saturating_sub(st.since_ns);
    match st.state {
        state::ON_CPU => c.on_cpu_ns += open,
        state::RUNQUEUE => c.runqueue_ns += open,
        state::IO_WAIT => c.io_wait_ns += open,
        _ => c.blocked_ns += open,
    }
    c
}

impl Session {
    pub fn new(
        ebpf: aya::Ebpf,
        slots: Slots,
        decoder: Decoder,
        sink: Box<dyn Sink>,
        pids: Arc<Mutex<BTreeSet<u32>>>,
        gpu: Option<GpuSampler>,
        probes: super::probes::cuda::CudaProbes,
    ) -> Self {
        Self {
            ebpf,
            slots,
            sink,
            decoder,
            last: HashMap::new(),
            pids,
            files: FileNames::default(),
            gpu,
            cuda: BTreeSet::new(),
            last_tick_ns: 0,
            comms: HashMap::new(),
            probes,
            python: true,
            maps_watch: HashMap::new(),
            dlopen: DlopenWatch::default(),
            unprobe: None,
            handed: None,
            segments: None,
            switches: None,
            stop: None,
        }
    }

    fn write_all(&mut self, records: Vec<Record>) -> anyhow::Result<()> {
        for mut r in records {
            match &mut r {
                Record::ThreadExit { counters, .. } => {
                    self.last.remove(&counters.tid);
                }
                Record::Thread { tid, comm, .. } => {
                    self.comms.insert(*tid, comm.clone());
                }
                Record::Process { pid, .. } => {
                    if let Ok(mut pids) = self.pids.lock() {
                        pids.insert(*pid);
                    }
                    self.files.scan(*pid);
                    if self.python {
                        // A DataLoader worker is new: its Python frames from now, not from
                        // the next scan.
                        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
                            .unwrap_or_default();
                        self.decoder.python.scan(&mut self.ebpf, *pid, Some(&maps));
                    }
                    write_process(self.sink.as_mut(), &r)?;
                    continue;
                }
                Record::CudaCall(_) => self.probes.note(&r),
                _ => {}
            }
            self.sink.write(&r)?;
        }
        Ok(())
    }

    fn drain(&mut self, ring: &mut RingBuf<MapData>) -> anyhow::Result<()> {
        let mut out = Vec::new();
        while let Some(item) = ring.next() {
            self.decoder.decode(&item, &mut out);
        }
        self.tell_stack_ends();
        let born = std::mem::take(&mut self.decoder.born);
        let exited = std::mem::take(&mut self.decoder.exited);
        if let Some(switches) = self.switches.as_mut() {
            for (tid, parent, born_ns) in born {
                switches.born(&mut self.ebpf, tid, parent, born_ns);
            }
            for tid in exited {
                switches.exited(tid);
            }
        }
        self.write_all(out)
    }

    /// Hands the kernel where each thread's stack copies may stop, as the decoder learned it
    /// (see `STACK_ENDS` in the eBPF maps). A refused update leaves that thread's copies
    /// whole, as before it was learned.
    fn tell_stack_ends(&mut self) {
        if self.decoder.stack_ends.changed.is_empty() {
            return;
        }
        let Some(Ok(mut map)) = self
            .ebpf
            .map_mut("STACK_ENDS")
            .map(BpfHashMap::<_, u32, u64>::try_from)
        else {
            return;
        };
        for (tid, end) in std::mem::take(&mut self.decoder.stack_ends.changed) {
            let _ = match end {
                Some(end) => map.insert(tid, end, 0),
                None => map.remove(&tid),
            };
        }
    }

    /// One read of the process's maps serves the file names, the CUDA probes, the driver
    /// check and finding a Python interpreter. A torch process maps hundreds of files, and
    /// the kernel's formatting of them was most of the recorder's time: the maps are read
    /// when the process's loader said it loaded or unloaded a library (`changed`), and
    /// otherwise less and less often while they stay the same. The open files are listed
    /// when the process's threads missed the page cache since the last listing: those are
    /// the files the report names. Python threads are looked at on every scan (their list
    /// is walked again when it changed).
    fn scan_process(&mut self, pid: u32, scan: u64, changed: bool) -> anyhow::Result<()> {
        let misses: u64 = self
            .last
            .values()
            .filter(|c| c.pid == pid)
            .map(|c| c.page_cache_misses)
            .sum();
        let watch = self.maps_watch.entry(pid).or_default();
        if misses != watch.page_cache_misses {
            watch.page_cache_misses = misses;
            self.files.scan_open(pid);
        }
        if !changed && scan < watch.next_scan {
            if self.python {
                self.decoder.python.scan(&mut self.ebpf, pid, None);
            }
            return Ok(());
        }
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let digest = code_digest(&maps);
        let longest = if self.dlopen.scan(&mut self.ebpf, pid, &maps) {
            WATCHED_MAPS_SCANS_AT_MOST_EVERY
        } else {
            MAPS_SCANS_AT_MOST_EVERY
        };
        watch.every = if digest == watch.digest {
            (watch.every * 2).clamp(1, longest)
        } else {
            1
        };
        if digest != watch.digest {
            self.decoder.new_code(pid);
        }
        watch.digest = digest;
        watch.next_scan = scan + watch.every;
        self.files.scan_mapped(pid, &maps);
        if self.python {
            self.decoder.python.scan(&mut self.ebpf, pid, Some(&maps));
        }
        for r in self.probes.scan(&mut self.ebpf, pid, &maps) {
            self.sink.write(&r)?;
        }
        if self.cuda.contains(&pid) {
            return Ok(());
        }
        if let Some(path) = crate::capture::proc::files::cuda_library(&maps) {
            self.cuda.insert(pid);
            self.sink.write(&Record::CudaLibrary {
                ts_ns: monotonic_ns(),
                pid,
                path,
            })?;
        }
        Ok(())
    }

    /// The processes the kernel saw map new code since the last call, taken off its list.
    fn maps_changed(&mut self) -> HashSet<u32> {
        let Some(map) = self.ebpf.map_mut("MAPS_CHANGED") else {
            return HashSet::new();
        };
        let Ok(mut map) = BpfHashMap::<_, u32, u8>::try_from(map) else {
            return HashSet::new();
        };
        let pids: HashSet<u32> = map.keys().flatten().collect();
        for pid in &pids {
            let _ = map.remove(pid);
        }
        pids
    }

    /// Writes a Tick (and the host's CPU time); returns the tracked threads alive.
    fn tick(&mut self) -> anyhow::Result<Vec<u32>> {
        let now = monotonic_ns();
        self.last_tick_ns = now;
        self.slots.handed_out(self.decoder.highest_slot);
        let counts = event_counts(&self.ebpf)?;
        let mut threads = Vec::new();
        for (tid, st) in self.slots.read(&counts)? {
            // Raw values: when the kernel moves time between states after the fact (a switch
            // it did not report), the timeline spreads the correction; a field-wise maximum
            // here would count that time twice.
            let c = snapshot(tid, &st, now);
            self.last.insert(tid, c);
            threads.push(c);
        }
        threads.sort_by_key(|c| c.tid);
        let alive = threads.iter().map(|c| c.tid).collect();
        self.sink.write(&Record::Tick {
            ts_ns: now,
            threads,
        })?;
        if let Some(r) = host_cpu(now) {
            self.sink.write(&r)?;
        }
        if let Some(r) = self.probes.tick() {
            self.sink.write(&r)?;
        }
        if let Some(r) = self.probes.guard_events(now) {
            self.sink.write(&r)?;
        }
        if let Some(gpu) = &self.gpu {
            for r in gpu.drain() {
                self.sink.write(&r)?;
            }
        }
        self.sink.flush()?;
        Ok(alive)
    }

    pub async fn run(
        &mut self,
        ring: RingBuf<MapData>,
        tick_every: Duration,
        duration: Option<Duration>,
    ) -> anyhow::Result<EndReason> {
        // SAFETY: the ring buffer owns its map fd, which stays open and unchanged for as long
        // as the AsyncFd owns the ring buffer.
        let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("registering the ring buffer with tokio: {e}"))?;
        let mut ticker = tokio::time::interval(tick_every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let deadline = tokio::time::sleep(duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
        tokio::pin!(deadline);
        let mut scans = 0u64;
        let has_stop = self.stop.is_some();
        let stop = self.stop.clone().unwrap_or_default();
        let reason = loop {
            tokio::select! {
                guard = ring.readable_mut() => {
                    let mut guard = guard?;
                    self.drain(guard.get_inner_mut())?;
                    guard.clear_ready();
                }
                _ = ticker.tick() => {
                    // Records are submitted without a wakeup while the buffer is far from
                    // full, so the tick is when they are read.
                    self.drain(ring.get_mut())?;
                    scans += 1;
                    if scans % 4 == 1 {
                        let pids: Vec<u32> = self
                            .pids
                            .lock()
                            .map(|p| p.iter().copied().collect())
                            .unwrap_or_default();
                        let changed = self.maps_changed();
                        for pid in pids {
                            self.scan_process(pid, scans / 4, changed.contains(&pid))?;
                        }
                    }
                    let alive = self.tick()?;
                    if alive.is_empty() {
                        break EndReason::TargetExited;
                    }
                    if let Some(switches) = self.switches.as_mut() {
                        switches.tick(&mut self.ebpf, self.last_tick_ns, &alive);
                    }
                    if self.segments.as_ref().is_some_and(|s| self.last_tick_ns >= s.next_ns) {
                        self.drain(ring.get_mut())?;
                        self.cut()?;
                    }
                }
                _ = sigint.recv() => break EndReason::Signal,
                _ = stop.notified(), if has_stop => break EndReason::Signal,
                _ = sigterm.recv() => break EndReason::Signal,
                _ = &mut deadline, if duration.is_some() => break EndReason::Duration,
            }
        };
        // The last snapshot while the programs still keep the accounting current; then detach,
        // so that every event the kernel counted as attempted has reached the ring buffer
        // before the final drain: the loss accounting then closes exactly.
        self.tick()?;
        self.probes.silence(&mut self.ebpf);
        self.open_calls()?;
        if let Some(r) = self.probes.finish() {
            self.sink.write(&r)?;
        }
        // The programs that can still be attached past the last read are silent from here
        // on: their links are left to a helper process, and closing them here is then quick.
        let slow = super::handover::slow_programs(&self.ebpf);
        self.handed = super::handover::hand_over(&slow);
        // uprobe_multi links are removed first, alongside the other programs (concurrent
        // removals share the kernel's grace periods, and the job's calls into the CUDA probes
        // are readers each grace period waits out). Perf-event uprobes hold the kernel's
        // trace-event lock for a grace period each, which classic tracepoints' detach would
        // queue behind: those go after.
        let cuda_first = if self.probes.multi() {
            self.probes.release()
        } else {
            None
        };
        crate::capture::kernel::loader::detach_all(&mut self.ebpf);
        let cuda = cuda_first.or_else(|| self.probes.release());
        let loaders = self.dlopen.release();
        self.unprobe = (cuda.is_some() || !loaders.is_empty()).then(|| {
            std::thread::spawn(move || {
                std::thread::scope(|s| {
                    for link in loaders {
                        s.spawn(move || drop(link));
                    }
                });
                if let Some(h) = cuda {
                    let _ = h.join();
                }
            })
        });
        // A program that passed its stop check just before it was set, or a BTF
        // tracepoint's run that began before its (asynchronous) detach, may still be
        // writing, preempted on a busy host: read until every record the kernel counted has
        // arrived, two seconds at most, past which the rest is counted lost.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            std::thread::sleep(Duration::from_millis(5));
            self.drain(ring.get_mut())?;
            if self.all_arrived()? || std::time::Instant::now() >= deadline {
                break;
            }
        }
        self.finish(reason)?;
        if let (Some(s), Some(last)) = (&self.segments, self.sink.segment()) {
            let _ = s.done.send(last);
        }
        Ok(reason)
    }

    /// Ends the current segment at the last tick and starts the next there: the finished
    /// file gets what a recording ends with (the calls still in progress, page-cache misses,
    /// event counts), as its figures so far; the sink rebases them for the next.
    fn cut(&mut self) -> anyhow::Result<()> {
        let now = self.last_tick_ns;
        self.open_calls()?;
        self.page_cache_files()?;
        self.losses(true)?;
        self.sink.write(&Record::End {
            ts_ns: now,
            reason: EndReason::Duration,
        })?;
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            .saturating_sub(monotonic_ns().saturating_sub(now));
        let done = self.sink.cut(now, unix_ns)?;
        self.decoder.new_segment();
        if let Some(s) = &mut self.segments {
            // On a grid from the start, so that late ticks do not add up.
            let every = (s.every.as_nanos() as u64).max(1);
            while s.next_ns <= now {
                s.next_ns += every;
            }
            if let Some(path) = done {
                // The reader may be gone (the recorder is stopping); the file stays.
                let _ = s.done.send(path);
            }
        }
        Ok(())
    }

    fn finish(&mut self, reason: EndReason) -> anyhow::Result<()> {
        let now = self.last_tick_ns;
        let mut out = Vec::new();
        self.decoder.finish(now, &mut out);
        // Thread names can change (prctl, exec) without an event: take the last word.
        for tid in self.last.keys().copied().collect::<Vec<_>>() {
            if let Some(comm) = target::comm(tid)
                && self.comms.get(&tid) != Some(&comm)
            {
                let pid = self.last[&tid].pid;
                out.push(Record::Thread {
                    ts_ns: now,
                    tid,
                    pid,
                    comm,
                });
            }
        }
        if let Some(gpu) = self.gpu.take() {
            out.extend(gpu.stop());
        }
        self.write_all(out)?;
        self.page_cache_files()?;
        self.losses(false)?;
        self.sink.write(&Record::End { ts_ns: now, reason })?;
        self.sink.flush()?;
        Ok(())
    }

    /// The probed calls still in progress at the last tick (their returns will not come), for
    /// the threads still alive: each ends with the recording. The probes are silenced first,
    /// so none can end in between.
    fn open_calls(&mut self) -> anyhow::Result<()> {
        let Some(map) = self.ebpf.map("CUDA_INFLIGHT") else {
            return Ok(());
        };
        let open: BpfHashMap<_, u32, profiler_common::CallEntry> = BpfHashMap::try_from(map)?;
        let entries: Vec<(u32, profiler_common::CallEntry)> = open.iter().flatten().collect();
        for (tid, entry) in entries {
            let Some(pid) = self.last.get(&tid).map(|c| c.pid) else {
                continue;
            };
            if let Some(r) = self.decoder.open_call(tid, pid, &entry, self.last_tick_ns) {
                self.sink.write(&r)?;
            }
        }
        Ok(())
    }

    fn page_cache_files(&mut self) -> anyhow::Result<()> {
        let map = self
            .ebpf
            .map("PAGE_CACHE_FILES")
            .ok_or_else(|| anyhow::anyhow!("map PAGE_CACHE_FILES missing"))?;
        let files: BpfHashMap<_, FileKey, FileMisses> = BpfHashMap::try_from(map)?;
        let mut rows: Vec<(FileKey, FileMisses)> = files.iter().flatten().collect();
        rows.sort_by_key(|(k, _)| (k.tid, k.dev, k.ino));
        let pids: HashMap<u32, u32> = self.last.iter().map(|(t, c)| (*t, c.pid)).collect();
        // A file opened since the last listing, still open now.
        let mut listed = HashSet::new();
        for (k, _) in &rows {
            if let Some(&pid) = pids.get(&k.tid)
                && self.files.name(k.dev, k.ino).is_none()
                && listed.insert(pid)
            {
                self.files.scan_open(pid);
            }
        }
        for (k, m) in rows {
            let record = Record::PageCacheFile {
                tid: k.tid,
                pid: pids.get(&k.tid).copied().unwrap_or(0),
                dev: k.dev,
                ino: k.ino,
                path: self.files.name(k.dev, k.ino),
                pages: m.pages,
                bytes: m.bytes,
            };
            self.sink.write(&record)?;
        }
        Ok(())
    }

    /// Whether every record the kernel counted as sent has been read.
    fn all_arrived(&self) -> anyhow::Result<bool> {
        let counts = event_counts(&self.ebpf)?;
        for k in 1..kind::COUNT {
            if kind::NAMES[k as usize].ends_with(kind::THINNED_SUFFIX) {
                // Counted, never sent.
                continue;
            }
            let sent = counts
                .get(&k, 0)?
                .iter()
                .fold(0u64, |n, c| n + c.attempted.saturating_sub(c.dropped));
            if sent > self.decoder.received[k as usize] {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The kernel's counts of each kind's records against those read, as totals since the
    /// start (the segment files rebase them). At a segment's cut (`at_cut`) the programs are
    /// still sending: a record counted but not yet read is in flight, not lost, and is left
    /// to the next segment, which reads it; at the end the last read has waited for them.
    fn losses(&mut self, at_cut: bool) -> anyhow::Result<()> {
        let counts = event_counts(&self.ebpf)?;
        for k in 1..kind::COUNT {
            let per_cpu = counts.get(&k, 0)?;
            let (attempted, dropped) = per_cpu
                .iter()
                .fold((0, 0), |(a, d), c| (a + c.attempted, d + c.dropped));
            let name = kind::NAMES[k as usize];
            let received = self.decoder.received[k as usize];
            let attempted = if at_cut && !name.ends_with(kind::THINNED_SUFFIX) {
                attempted.min(dropped + received)
            } else {
                attempted
            };
            let loss = EventLoss {
                kind: name.to_string(),
                attempted,
                dropped,
                received,
            };
            self.sink.write(&Record::Loss(loss))?;
        }
        self.sink
            .write(&Record::Unwinding(Box::new(self.decoder.unwind_stats())))?;
        if self.python {
            self.sink.write(&Record::PythonStacks(Box::new(
                self.decoder.python.stats.clone(),
            )))?;
        }
        Ok(())
    }
}

/// The whole host's CPU time now; `None` when /proc/stat cannot be read (the report then
/// sizes the DataLoader against the traced tree's own use only).
fn host_cpu(ts_ns: u64) -> Option<Record> {
    let (busy_ns, total_ns) = super::proc::host_cpu::busy_and_total_ns()?;
    Some(Record::HostCpu {
        ts_ns,
        busy_ns,
        total_ns,
    })
}
