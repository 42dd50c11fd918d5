//! Decodes ring-buffer records into recording records. Kernel records are read with
//! unaligned reads from the byte slice the ring buffer hands out, and anything too short or
//! of an unknown kind is counted, never trusted.
use std::collections::HashMap;

use profiler_common::{
    BlockIo, CpuSample, CudaCall, Header, OffCpuSample, PyFrame, PyStack, STACK_COPY_BYTES,
    ThreadExit, ThreadNew, UserStackHead, Woken, kind, state,
};
use profiler_core::recording::record::{self, Record, ThreadCounters, UnwindStats};

use super::{
    proc::target,
    python::{Python, merge},
    stacks::{Method, Namer, Quality, RawStack, Reach, StackCopy, Stacks, Unwinding},
};

/// A thread's latest user stack copy, waiting for the sample sent right after it.
#[derive(Default)]
struct PendingCopy {
    head: UserStackHead,
    bytes: Vec<u8>,
}

/// Per thread: where the kernel's copies of its stack stop (see [`Reach`]), and the changes
/// the kernel has yet to be told of.
#[derive(Default)]
pub struct StackEnds {
    known: HashMap<u32, u64>,
    /// An end that proved too short (a walk ran off a copy cut there): a walk that ended
    /// early (at a frame in code not yet mapped when the maps were read) must not set it
    /// again.
    floor: HashMap<u32, u64>,
    /// Walks made only to learn the end that found none: a thread whose walks never complete
    /// stops being walked for it.
    tries: HashMap<u32, u32>,
    /// An end, or none (whole copies again).
    pub changed: Vec<(u32, Option<u64>)>,
}

/// Walks a thread's copies get, beyond what its samples need, to learn its end.
const END_TRIES: u32 = 8;

impl StackEnds {
    /// Whether a sample of `tid` should have its copy walked for the end even where frame
    /// pointers need no copy.
    fn wanted(&self, tid: u32) -> bool {
        !self.known.contains_key(&tid) && self.tries.get(&tid).is_none_or(|&n| n < END_TRIES)
    }

    /// What a walk of a `copied`-byte copy of `tid`'s stack says of where its later copies
    /// may stop: further than known (a complete walk), or not there at all (a walk of a copy
    /// cut short ran off its end: a TID reused, a stack switched).
    fn learn(&mut self, tid: u32, copied: usize, reach: Reach) {
        let known = self.known.get(&tid).copied();
        if let Some(k) = known
            && reach.ran_off
            && copied < STACK_COPY_BYTES
        {
            let floor = self.floor.entry(tid).or_default();
            *floor = (*floor).max(k);
            self.known.remove(&tid);
            self.changed.push((tid, None));
            return;
        }
        let floor = self.floor.get(&tid).copied().unwrap_or(0);
        match reach.end {
            Some(end) if end > floor && known.is_none_or(|k| end > k) => {
                self.known.insert(tid, end);
                self.changed.push((tid, Some(end)));
            }
            _ if known.is_none() => *self.tries.entry(tid).or_default() += 1,
            _ => {}
        }
    }

    /// `tid` exited or exec'ed: what was learned of its stack is gone with it.
    fn forget(&mut self, tid: u32) {
        self.floor.remove(&tid);
        self.tries.remove(&tid);
        if self.known.remove(&tid).is_some() {
            self.changed.push((tid, None));
        }
    }
}

/// A thread's latest Python frames, waiting for the sample or call sent right after them.
#[derive(Default)]
struct PendingPython {
    ts_ns: u64,
    frames: Vec<PyFrame>,
    truncated: bool,
}

/// A probed CUDA call, from a ring-buffer record or an entry still open at the end.
struct Call {
    tid: u32,
    pid: u32,
    start_ns: u64,
    end_ns: u64,
    cookie: u64,
    args: [u64; profiler_common::CALL_ARGS],
    out: u64,
    status: u64,
    caller: u64,
}

fn read<T: Copy>(bytes: &[u8]) -> Option<T> {
    (bytes.len() >= size_of::<T>()).then(|| {
        // SAFETY: the length is checked; read_unaligned copes with any alignment, and T is a
        // plain-old-data wire struct for which every bit pattern is valid.
        unsafe { bytes.as_ptr().cast::<T>().read_unaligned() }
    })
}

pub fn counters(tid: u32, s: &profiler_common::ThreadStats) -> ThreadCounters {
    ThreadCounters {
        tid,
        pid: s.tgid,
        on_cpu_ns: s.on_cpu_ns,
        runqueue_ns: s.runqueue_ns,
        io_wait_ns: s.io_wait_ns,
        blocked_ns: s.blocked_ns,
        page_cache_misses: s.pc_misses,
        page_cache_miss_bytes: s.pc_miss_bytes,
    }
}

fn comm_string(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// How many raw stacks the decoder remembers before starting over.
const RAW_STACKS_KEPT: usize = 16_384;

struct PendingOffCpu {
    ts_ns: u64,
    pid: u32,
    io: bool,
    stack: u32,
    /// The system call it blocked in, plus one (0: none), and its first argument.
    syscall: u32,
    arg0: u64,
    /// Who woke it: TID, PID, comm and context (see [`super::waker`]).
    waker: Option<(u32, u32, String, &'static str)>,
}

/// Per-session decoding state.
#[derive(Default)]
pub struct Decoder {
    namer: Namer,
    unwinding: Unwinding,
    stacks: Stacks,
    /// Raw stacks already named, keyed by pid followed by the user and kernel addresses:
    /// a repeated stack (the common case) costs a hash lookup, not a symbolization.
    /// With each: whether Python frames were merged into it (for the Python counts).
    raw: HashMap<Vec<u64>, (u32, bool)>,
    pending: HashMap<u32, PendingOffCpu>,
    blocked_in: super::proc::blocked_in::BlockedIn,
    copies: HashMap<u32, PendingCopy>,
    pub stack_ends: StackEnds,
    python_frames: HashMap<u32, PendingPython>,
    /// The CPython processes traced, and the code objects of their frames.
    pub python: Python,
    /// Whether the kernel side sends stack copies.
    pub copying: bool,
    /// How the stack samples were unwound, so far.
    pub unwind: UnwindStats,
    /// Records received per kind, for `received + dropped == attempted`.
    pub received: [u64; kind::COUNT as usize],
    pub malformed: u64,
    /// TIDs the kernel reported as exited.
    pub exited: Vec<u32>,
    /// Threads the kernel reported created, since the session last took them: TID, parent
    /// TID, when.
    pub born: Vec<(u32, u32, u64)>,
    /// The highest slot number a new thread was reported with (see `super::kernel::slots`).
    pub highest_slot: u32,
}

impl Decoder {
    /// A decoder with the kernel's symbols already loaded (see [`Namer::load_kernel_symbols`]).
    pub fn with_kernel_symbols(unwinding: Unwinding, copying: bool) -> Self {
        let mut d = Self {
            unwinding,
            copying,
            ..Self::default()
        };
        d.namer.load_kernel_symbols();
        d
    }

    fn stack(&mut self, h: &Header, stack: &profiler_common::Stack, out: &mut Vec<Record>) -> u32 {
        let pid = h.pid;
        let copy = self
            .copies
            .get(&h.tid)
            .filter(|c| c.head.header.ts_ns == h.ts_ns)
            .map(|c| StackCopy {
                ip: c.head.ip,
                sp: c.head.sp,
                bp: c.head.bp,
                lr: c.head.lr,
                ret_fix: (c.head.ret_slot != 0).then_some((c.head.ret_slot, c.head.ret_addr)),
                bytes: &c.bytes,
            });
        if self.copying && copy.is_none() {
            self.unwind.without_copy += 1;
        }
        let copied = copy.map(|c| c.bytes.len());
        let raw = RawStack {
            find_end: self.stack_ends.wanted(h.tid),
            ..RawStack::of(pid, stack, copy)
        };
        let unwound = self.unwinding.0.unwind(&raw, &mut self.namer);
        if let Some(copied) = copied {
            self.stack_ends.learn(h.tid, copied, unwound.reach);
        }
        let u = &mut self.unwind;
        if let Some(ns) = unwound.walk_ns {
            u.dwarf_walks += 1;
            u.dwarf_ns += ns;
        }
        *match unwound.quality {
            Quality::Complete => &mut u.complete,
            Quality::Truncated => &mut u.truncated,
            Quality::Failed => &mut u.failed,
        } += 1;
        *match unwound.method {
            Method::FramePointers => &mut u.by_frame_pointers,
            Method::Dwarf => &mut u.by_dwarf,
        } += 1;
        let (user, kernel) = (&unwound.user[..], raw.kernel);
        let python = self
            .python_frames
            .get(&h.tid)
            .filter(|p| p.ts_ns == h.ts_ns);
        let py_len = python.map_or(0, |p| p.frames.len());
        let mut key = Vec::with_capacity(3 + user.len() + kernel.len() + 2 * py_len);
        key.push(u64::from(pid));
        key.push(user.len() as u64);
        key.push(py_len as u64);
        key.extend_from_slice(user);
        key.extend(
            python
                .iter()
                .flat_map(|p| &p.frames)
                .flat_map(|f| [f.code, f.instr]),
        );
        key.extend_from_slice(kernel);
        if let Some(&(id, merged)) = self.raw.get(&key) {
            if merged && let Some(p) = self.python_frames.remove(&h.tid) {
                self.python.count_sample(&p.frames, p.truncated);
            }
            return id;
        }
        let (mut frames, user_len) = self.namer.name_stack_parts(pid, user, kernel);
        let mut merged = false;
        if let Some(p) = self
            .python_frames
            .remove(&h.tid)
            .filter(|p| p.ts_ns == h.ts_ns)
            && let Some(runs) = self.python.runs(pid, &p.frames)
        {
            self.python.count_sample(&p.frames, p.truncated);
            frames = merge::merge(&frames, user_len, &runs);
            merged = true;
        }
        let (id, new) = self.stacks.intern(frames);
        if let Some(frames) = new {
            out.push(Record::Stack { id, frames });
        }
        // Unwound stacks are up to 4.5 KiB each and a long run can see many: forget them rather
        // than grow without bound (names stay cached per address, ids per named stack).
        if self.raw.len() >= RAW_STACKS_KEPT {
            self.raw.clear();
        }
        self.raw.insert(key, (id, merged));
        id
    }

    /// Decodes one ring-buffer record, appending what it yields to `out`.
    pub fn decode(&mut self, bytes: &[u8], out: &mut Vec<Record>) {
        let Some(h) = read::<Header>(bytes) else {
            self.malformed += 1;
            return;
        };
        if h.kind >= kind::COUNT {
            self.malformed += 1;
            return;
        }
        let ok = match h.kind {
            kind::USER_STACK => self.user_stack(&h, bytes),
            kind::PY_STACK => self.py_stack(&h, bytes),
            kind::CPU_SAMPLE => read::<CpuSample>(bytes).map(|s| {
                let stack = self.stack(&h, &s.stack, out);
                out.push(Record::CpuSample {
                    ts_ns: h.ts_ns,
                    tid: h.tid,
                    pid: h.pid,
                    stack,
                });
            }),
            kind::OFFCPU_SAMPLE => read::<OffCpuSample>(bytes).map(|s| {
                let stack = self.stack(&h, &s.stack, out);
                self.pending.insert(
                    h.tid,
                    PendingOffCpu {
                        ts_ns: h.ts_ns,
                        pid: h.pid,
                        io: s.state == state::IO_WAIT,
                        stack,
                        syscall: s.syscall,
                        arg0: s.arg0,
                        waker: None,
                    },
                );
            }),
            kind::WOKEN => read::<Woken>(bytes).map(|w| {
                // A wake-up whose sample was lost, or came after its period's end (another
                // CPU's record), has nothing to join.
                if self.pending.contains_key(&h.tid) {
                    let context = super::waker::context_of(&mut self.namer, &w);
                    if let Some(p) = self.pending.get_mut(&h.tid) {
                        p.waker = Some((
                            w.waker_tid,
                            w.waker_pid,
                            comm_string(&w.waker_comm),
                            context,
                        ));
                    }
                }
            }),
            kind::OFFCPU_END => {
                self.close_offcpu(h.tid, h.ts_ns, out);
                Some(())
            }
            kind::BLOCK_IO => read::<BlockIo>(bytes).map(|b| {
                out.push(Record::BlockIo {
                    ts_ns: h.ts_ns,
                    tid: h.tid,
                    pid: h.pid,
                    dev: b.dev,
                    write: b.write == 1,
                    sector: b.sector,
                    bytes: b.bytes,
                    queue_ns: b.queue_ns,
                    service_ns: b.service_ns,
                });
            }),
            kind::CUDA_CALL => read::<CudaCall>(bytes).and_then(|c| {
                let call = Call {
                    tid: h.tid,
                    pid: h.pid,
                    start_ns: h.ts_ns,
                    end_ns: c.end_ns,
                    cookie: c.cookie,
                    args: c.args,
                    out: c.out,
                    // CUresult and ncclResult_t are 32-bit enums.
                    status: c.ret & 0xffff_ffff,
                    caller: c.caller,
                };
                let record = self.cuda_call(&call)?;
                if let Some(site) = self.call_site(h.tid, h.pid, h.ts_ns) {
                    out.push(site);
                }
                out.push(record);
                Some(())
            }),
            kind::THREAD_EXIT => read::<ThreadExit>(bytes).map(|e| {
                self.close_offcpu(h.tid, h.ts_ns, out);
                out.push(Record::Thread {
                    ts_ns: h.ts_ns,
                    tid: h.tid,
                    pid: h.pid,
                    comm: comm_string(&e.comm),
                });
                out.push(Record::ThreadExit {
                    ts_ns: h.ts_ns,
                    counters: counters(h.tid, &e.stats),
                });
                self.copies.remove(&h.tid);
                self.python_frames.remove(&h.tid);
                self.stack_ends.forget(h.tid);
                self.exited.push(h.tid);
            }),
            kind::THREAD_NEW | kind::EXEC => read::<ThreadNew>(bytes).map(|new| {
                self.highest_slot = self.highest_slot.max(new.slot);
                if h.kind == kind::THREAD_NEW {
                    self.born.push((h.tid, new.parent_tid, h.ts_ns));
                }
                if h.kind == kind::EXEC {
                    self.python.forget(h.pid);
                    self.namer.forget(h.pid);
                    self.unwinding.0.forget(h.pid);
                    self.raw.retain(|k, _| k[0] != u64::from(h.pid));
                    self.stack_ends.forget(h.tid);
                }
                let comm = target::comm(h.tid).unwrap_or_default();
                out.push(Record::Thread {
                    ts_ns: h.ts_ns,
                    tid: h.tid,
                    pid: h.pid,
                    comm,
                });
                if h.tid == h.pid {
                    out.push(Record::Process {
                        ts_ns: h.ts_ns,
                        pid: h.pid,
                        ppid: target::ppid(h.pid),
                        cmdline: target::cmdline(h.pid).unwrap_or_default(),
                    });
                }
            }),
            _ => None,
        };
        match ok {
            Some(()) => self.received[h.kind as usize] += 1,
            None => self.malformed += 1,
        }
    }

    /// Keeps a thread's Python frames for the sample or call that follows them. The record
    /// holds only the frames read: its fixed part, then `len` frames.
    fn py_stack(&mut self, h: &Header, bytes: &[u8]) -> Option<()> {
        let start = std::mem::offset_of!(PyStack, frames);
        let len = read::<u32>(bytes.get(std::mem::offset_of!(PyStack, len)..)?)? as usize;
        let truncated = read::<u32>(bytes.get(std::mem::offset_of!(PyStack, truncated)..)?)?;
        if len > profiler_common::MAX_PY_FRAMES {
            return None;
        }
        let frames = bytes.get(start..start + len * size_of::<PyFrame>())?;
        let pending = self.python_frames.entry(h.tid).or_default();
        pending.ts_ns = h.ts_ns;
        pending.truncated = truncated != 0;
        pending.frames.clear();
        pending.frames.extend(
            frames
                .chunks_exact(size_of::<PyFrame>())
                .filter_map(read::<PyFrame>),
        );
        Some(())
    }

    /// Keeps a thread's stack copy for the sample that follows it.
    fn user_stack(&mut self, h: &Header, bytes: &[u8]) -> Option<()> {
        let head = read::<UserStackHead>(bytes)?;
        let start = size_of::<UserStackHead>();
        let data = bytes.get(start..start.checked_add(head.len as usize)?)?;
        let copy = self.copies.entry(h.tid).or_default();
        copy.head = head;
        copy.bytes.clear();
        copy.bytes.extend_from_slice(data);
        Some(())
    }

    fn close_offcpu(&mut self, tid: u32, end_ns: u64, out: &mut Vec<Record>) {
        if let Some(p) = self.pending.remove(&tid) {
            if p.syscall != 0 {
                let (call, detail) = self.blocked_in.describe(p.pid, p.syscall - 1, p.arg0);
                out.push(Record::BlockedIn {
                    ts_ns: p.ts_ns,
                    tid,
                    call,
                    detail,
                });
            }
            if let Some((waker_tid, waker_pid, waker_comm, context)) = p.waker {
                out.push(Record::WokenBy {
                    ts_ns: p.ts_ns,
                    tid,
                    waker_tid,
                    waker_pid,
                    waker_comm,
                    context: context.to_owned(),
                });
            }
            out.push(Record::OffCpuSample {
                ts_ns: p.ts_ns,
                tid,
                pid: p.pid,
                duration_ns: end_ns.saturating_sub(p.ts_ns),
                io: p.io,
                stack: p.stack,
            });
        }
    }

    /// The Python frames a probed call of `tid` starting at `start_ns` was made from.
    fn call_site(&mut self, tid: u32, pid: u32, start_ns: u64) -> Option<Record> {
        let p = self
            .python_frames
            .remove(&tid)
            .filter(|p| p.ts_ns == start_ns)?;
        let python = self.python.call_site(pid, &p.frames)?;
        Some(Record::CudaCallSite {
            tid,
            start_ns,
            python,
        })
    }

    fn cuda_call(&mut self, c: &Call) -> Option<Record> {
        let api = profiler_core::cuda::APIS.get(c.cookie as u32 as usize)?;
        Some(Record::CudaCall(Box::new(record::CudaCall {
            tid: c.tid,
            pid: c.pid,
            start_ns: c.start_ns,
            end_ns: c.end_ns,
            api: api.name.to_string(),
            op: api.decode(&c.args, c.out),
            status: c.status,
            caller: self.namer.name_return_address(c.pid, c.caller),
        })))
    }

    /// A new segment file starts: the stacks its samples use are written into it again.
    pub fn new_segment(&mut self) {
        self.stacks.new_segment();
        // A raw stack found here skips interning, which is where a stack is written out.
        self.raw.clear();
    }

    /// `pid`'s executable mappings changed since they were last read: the unwinder and the
    /// namer look again for addresses they had found in none.
    pub fn new_code(&mut self, pid: u32) {
        self.namer.new_code(pid);
        self.unwinding.0.new_code(pid);
    }

    /// A probed call of `tid` (of `pid`) that had not returned when the recording ended at
    /// `end_ns`: recorded as ending there, with [`record::IN_PROGRESS`] as its status, so
    /// that a wait that outlasts the recording (a hung collective) is still a wait.
    pub fn open_call(
        &mut self,
        tid: u32,
        pid: u32,
        e: &profiler_common::CallEntry,
        end_ns: u64,
    ) -> Option<Record> {
        self.cuda_call(&Call {
            tid,
            pid,
            start_ns: e.start_ns,
            end_ns: end_ns.max(e.start_ns),
            cookie: e.cookie,
            args: e.args,
            out: 0,
            status: record::IN_PROGRESS,
            caller: e.caller,
        })
    }

    pub fn finish(&mut self, end_ns: u64, out: &mut Vec<Record>) {
        let tids: Vec<u32> = self.pending.keys().copied().collect();
        for tid in tids {
            self.close_offcpu(tid, end_ns, out);
        }
    }

    /// How the stacks were unwound, with the unwinder's warnings.
    pub fn unwind_stats(&self) -> UnwindStats {
        UnwindStats {
            warnings: self.unwinding.0.warnings().to_vec(),
            ..self.unwind.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(at: u64) -> Reach {
        Reach {
            end: Some(at),
            ran_off: false,
        }
    }

    const RAN_OFF: Reach = Reach {
        end: None,
        ran_off: true,
    };

    #[test]
    fn a_threads_copies_stop_at_the_farthest_end_its_walks_reached() {
        let mut ends = StackEnds::default();
        ends.learn(7, STACK_COPY_BYTES, end(0x9000));
        // A walk that read less says nothing new; one that read more moves the end.
        ends.learn(7, 600, end(0x8ff0));
        ends.learn(7, 600, end(0x9010));
        assert_eq!(ends.known[&7], 0x9010);
        assert_eq!(
            std::mem::take(&mut ends.changed),
            [(7, Some(0x9000)), (7, Some(0x9010))]
        );
    }

    #[test]
    fn a_short_copy_that_ran_off_its_end_brings_whole_copies_back() {
        let mut ends = StackEnds::default();
        ends.learn(7, STACK_COPY_BYTES, end(0x9000));
        // A whole copy that was not enough (a stack deeper than the copy) is no sign the end
        // is wrong.
        ends.learn(7, STACK_COPY_BYTES, RAN_OFF);
        assert!(ends.known.contains_key(&7));
        ends.learn(7, 512, RAN_OFF);
        assert!(!ends.known.contains_key(&7));
        assert_eq!(ends.changed, [(7, Some(0x9000)), (7, None)]);
        // A walk that ends as short again (early, at code not yet mapped) does not cut the
        // copies there a second time; one that reaches further does.
        ends.learn(7, STACK_COPY_BYTES, end(0x9000));
        assert!(!ends.known.contains_key(&7));
        ends.learn(7, STACK_COPY_BYTES, end(0x9040));
        assert_eq!(ends.known.get(&7), Some(&0x9040));
        // An exit forgets it all, and tells the kernel; an unknown thread tells it nothing.
        ends.forget(7);
        ends.forget(8);
        assert_eq!(ends.changed.len(), 4);
        assert!(ends.floor.is_empty());
    }

    #[test]
    fn a_thread_whose_walks_never_end_stops_being_walked_for_it() {
        let mut ends = StackEnds::default();
        for _ in 0..END_TRIES {
            assert!(ends.wanted(9));
            ends.learn(9, STACK_COPY_BYTES, Reach::default());
        }
        assert!(!ends.wanted(9));
        ends.learn(9, STACK_COPY_BYTES, end(0x7000));
        assert!(!ends.wanted(9), "known now");
        assert!(ends.changed.contains(&(9, Some(0x7000))));
    }
}
