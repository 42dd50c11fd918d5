//! Ring-buffer output with exact loss accounting: every attempt is counted, and every refusal.
use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    bindings::{
        BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, pt_regs,
    },
    helpers::{
        bpf_get_smp_processor_id,
        generated::{
            bpf_get_current_task_btf, bpf_get_stack, bpf_loop, bpf_probe_read_user,
            bpf_task_pt_regs,
        },
    },
    maps::ring_buf::RingBufEntry,
};
use profiler_common::{
    EventCounts, Header, MAX_PY_FRAMES, PY_FRAME_ENTRY, PY_FRAME_SHIM, PY_NONE, PyFrame, PyProcess,
    PyStack, STACK_COPY_BYTES, Stack, UserStack, UserStackHead, kind, py_entry,
};

use crate::maps::{
    COUNTS, CUDA_INFLIGHT, EVENTS, EVENTS_BYTES, PY_PROCS, PY_STACK_COPY, PY_THREADS, STACK_COPY,
    STACK_ENDS, config,
};

#[inline(always)]
pub fn count(kind: u32, dropped: bool) {
    if let Some(c) = COUNTS.get_ptr_mut(kind) {
        // SAFETY: a per-CPU slot, so no other writer races with this one.
        let c: &mut EventCounts = unsafe { &mut *c };
        c.attempted += 1;
        if dropped {
            c.dropped += 1;
        }
    }
}

/// Reserves a record of type `T` for `kind`, counting the attempt and any drop.
#[inline(always)]
pub fn reserve<T: 'static>(kind: u32) -> Option<RingBufEntry<T>> {
    let entry = EVENTS.reserve::<T>(0);
    count(kind, entry.is_none());
    entry
}

/// Unread bytes past which a record wakes the reader at once.
const WAKE_AT_BYTES: u64 = 1 << 20;

/// Submit flags: no wakeup per record (user space also drains on every tick, 50 ms by
/// default), unless the ring buffer is filling up. A wakeup per record cost the traced
/// workload a reader context switch per event.
#[inline(always)]
pub fn wakeup_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= WAKE_AT_BYTES {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// How far behind the reader is, and so what is thinned: the attribution needs every state
/// change, CUDA and NCCL call and IO completion, and can spare stack evidence, which is most
/// of the bytes (a stack copy is up to 16 KiB). Past a quarter of the ring buffer unread,
/// samples go without their stack copy (frame-pointer stacks); past half, samples are not
/// taken. Each is counted under its `*_THINNED` kind.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pressure {
    None,
    NoCopies,
    NoSamples,
}

#[inline(always)]
pub fn pressure() -> Pressure {
    let unread = EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    if unread >= u64::from(EVENTS_BYTES / 2) {
        Pressure::NoSamples
    } else if unread >= u64::from(EVENTS_BYTES / 4) {
        Pressure::NoCopies
    } else {
        Pressure::None
    }
}

/// Counts a record thinned under `kind` (one of the `*_THINNED` counters).
#[inline(always)]
pub fn thinned(kind: u32) {
    count(kind, false);
}

#[inline(always)]
pub fn header(kind: u32, tid: u32, pid: u32, ts_ns: u64) -> Header {
    Header {
        kind,
        tid,
        pid,
        // SAFETY: a helper with no preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns,
    }
}

/// Fills `stack` with the current task's user and kernel stacks.
#[inline(always)]
pub fn capture_stack<C: EbpfContext>(ctx: &C, stack: *mut Stack) {
    // SAFETY: `stack` points into a reserved ring-buffer record; the sizes are those of the
    // arrays written to, so the helper cannot write past them.
    unsafe {
        (*stack).user_len = bpf_get_stack(
            ctx.as_ptr(),
            (*stack).user.as_mut_ptr().cast(),
            core::mem::size_of_val(&(*stack).user) as u32,
            BPF_F_USER_STACK as u64,
        ) as i32;
        (*stack).kernel_len = bpf_get_stack(
            ctx.as_ptr(),
            (*stack).kernel.as_mut_ptr().cast(),
            core::mem::size_of_val(&(*stack).kernel) as u32,
            0,
        ) as i32;
    }
}

const PAGE: u64 = 4096;

/// Sends the current task's user registers and the top of its user stack (a
/// `kind::USER_STACK` record), for the sample that follows it. A sample may interrupt the
/// kernel (a syscall, a page fault) and `sched_switch` always runs in it, so the registers
/// are the user ones the kernel saved on entry (`task_pt_regs`), not the context's.
#[inline(always)]
pub fn send_user_stack(header: Header) {
    if config!(copy_user_stack) == 0 {
        return;
    }
    if pressure() >= Pressure::NoCopies {
        thinned(kind::USER_STACK_THINNED);
        return;
    }
    let Some(rec) = STACK_COPY.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: the current task's own saved registers; a failed read leaves zeros, which
    // user space reads as no stack.
    let (ip, sp, bp, lr) = unsafe {
        crate::regs::user_frame(bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs)
    };
    // SAFETY: this CPU's scratch record; programs on one CPU do not interleave.
    let rec: &mut UserStack = unsafe { &mut *rec };
    let (ret_slot, ret_addr) = match CUDA_INFLIGHT.get_ptr(header.tid) {
        // SAFETY: map values stay valid for the program's run.
        Some(open) => unsafe { ((*open).sp, (*open).caller) },
        None => (0, 0),
    };
    rec.head = UserStackHead {
        header: Header {
            kind: kind::USER_STACK,
            ..header
        },
        ip,
        sp,
        bp,
        lr,
        ret_slot,
        ret_addr,
        len: 0,
        _pad: 0,
    };
    // Where user space found the thread's first frames, the copy stops there: a thread's
    // live stack is often a few hundred bytes of the 16 KiB, and the copy (twice: into the
    // scratch record, then into the ring) was most of a sample's cost.
    // SAFETY: map values stay valid for the program's run.
    let end = unsafe { STACK_ENDS.get(&header.tid) }.copied().unwrap_or(0);
    let needed = end.wrapping_sub(sp);
    // Otherwise the stack's top end is unknown here, and a read that runs past it fails
    // whole. It ends at a page boundary: if the whole copy fails, each page end within reach
    // is tried, farthest first (the main thread's stack ends at its mapping; a thread's has
    // its TLS above it, so the whole copy usually succeeds).
    // SAFETY (all reads): at most `STACK_COPY_BYTES` into `bytes`, from a user address the
    // helper checks.
    if end > sp
        && needed <= STACK_COPY_BYTES as u64
        && unsafe {
            bpf_probe_read_user(rec.bytes.as_mut_ptr().cast(), needed as u32, sp as *const _)
        } == 0
    {
        rec.head.len = needed as u32;
    } else if unsafe {
        bpf_probe_read_user(
            rec.bytes.as_mut_ptr().cast(),
            STACK_COPY_BYTES as u32,
            sp as *const _,
        )
    } == 0
    {
        rec.head.len = STACK_COPY_BYTES as u32;
    } else {
        // `sp`'s offset into its page, so that each length is bounded for the verifier.
        let in_page = sp & (PAGE - 1);
        for pages in (1..=(STACK_COPY_BYTES as u64 / PAGE)).rev() {
            let len = pages * PAGE - in_page;
            if len <= STACK_COPY_BYTES as u64
                && unsafe {
                    bpf_probe_read_user(rec.bytes.as_mut_ptr().cast(), len as u32, sp as *const _)
                } == 0
            {
                rec.head.len = len as u32;
                break;
            }
        }
    }
    let len = rec.head.len as usize;
    if len > STACK_COPY_BYTES {
        return;
    }
    let size = core::mem::size_of::<UserStackHead>() + len;
    // SAFETY: `size` bytes of the scratch record, checked above to lie within it.
    let bytes =
        unsafe { core::slice::from_raw_parts((rec as *const UserStack).cast::<u8>(), size) };
    let sent = EVENTS.output::<[u8]>(bytes, wakeup_flags());
    count(kind::USER_STACK, sent.is_err());
}

/// A value of type `T` at user address `addr` of the current task, if readable.
#[inline(always)]
fn user<T>(addr: u64) -> Option<T> {
    // SAFETY: the helper checks the address and copies at most `size_of::<T>()` bytes.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(addr as *const T) }.ok()
}

/// The state of one Python walk, shared with [`py_step`] through `bpf_loop`.
#[repr(C)]
struct PyWalk {
    /// The next frame to read; 0 once the outermost was read.
    frame: u64,
    len: u64,
    p: PyProcess,
}

/// One frame of the walk: its code object, instruction and owner, then on to the frame
/// that called it. A `bpf_loop` callback, so the verifier checks it once rather than once
/// per iteration and per state of the program that walks (an unrolled loop of 128 frames
/// cost each recording more than a second of verification in three programs).
unsafe extern "C" fn py_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `PyWalk` on the stack of `send_py_stack`, which passes it.
    let w = unsafe { &mut *ctx.cast::<PyWalk>() };
    let i = index as usize;
    if w.frame == 0 || i >= MAX_PY_FRAMES {
        return 1;
    }
    let Some(rec) = PY_STACK_COPY.get_ptr_mut(0) else {
        return 1;
    };
    let p = &w.p;
    let frame = w.frame;
    let code = user::<u64>(frame + u64::from(p.frame_code)).unwrap_or(0);
    let instr = user::<u64>(frame + u64::from(p.frame_instr)).unwrap_or(0);
    let owner = if p.frame_owner == PY_NONE {
        0
    } else {
        u32::from(user::<u8>(frame + u64::from(p.frame_owner)).unwrap_or(0))
    };
    let mark = match p.entry_rule {
        py_entry::EVERY_FRAME => PY_FRAME_ENTRY,
        py_entry::FLAG if owner != 0 => PY_FRAME_ENTRY,
        py_entry::SHIM if owner == p.owner_cstack => PY_FRAME_SHIM,
        _ => 0,
    };
    // SAFETY: this CPU's scratch record; `i` is below the array's length.
    unsafe {
        (*rec).frames[i] = PyFrame {
            code: code | mark,
            instr,
        };
    }
    w.len = index + 1;
    w.frame = user::<u64>(frame + u64::from(p.frame_previous)).unwrap_or(0);
    0
}

/// Sends the Python frames the current thread is in (a `kind::PY_STACK` record), if it is a
/// thread of a CPython process user space told the kernel of. The walk reads the frame
/// chain from the thread state, as the interpreter itself links it: a pointer read per field
/// and no lock, so the target never stops. The code objects are read later, by user space.
/// Every frame read is sent, shims included; the record carries only the frames read.
#[inline(always)]
pub fn send_py_stack(header: Header) {
    if config!(python_stacks) == 0 {
        return;
    }
    // SAFETY (both): map values stay valid for the program's run.
    let Some(&tstate) = (unsafe { PY_THREADS.get(header.tid) }) else {
        return;
    };
    let Some(&p) = (unsafe { PY_PROCS.get(header.pid) }) else {
        return;
    };
    let Some(mut frame) = user::<u64>(tstate + u64::from(p.tstate_frame)) else {
        return;
    };
    if p.cframe_current_frame != PY_NONE && frame != 0 {
        frame = user::<u64>(frame + u64::from(p.cframe_current_frame)).unwrap_or(0);
    }
    let mut walk = PyWalk { frame, len: 0, p };
    // SAFETY: `py_step` has the callback signature bpf_loop calls, and `walk` outlives the
    // call. The function's address reaches the helper as is (a BPF_PSEUDO_FUNC load), never
    // through an integer.
    unsafe {
        let step = py_step as *mut c_void;
        bpf_loop(MAX_PY_FRAMES as u32, step, (&raw mut walk).cast(), 0);
    }
    let Some(rec) = PY_STACK_COPY.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch record; programs on one CPU do not interleave.
    let rec: &mut PyStack = unsafe { &mut *rec };
    let len = (walk.len as usize).min(MAX_PY_FRAMES);
    rec.header = Header {
        kind: kind::PY_STACK,
        ..header
    };
    rec.len = len as u32;
    rec.truncated = u32::from(walk.frame != 0);
    let size = core::mem::offset_of!(PyStack, frames) + len * core::mem::size_of::<PyFrame>();
    if size > core::mem::size_of::<PyStack>() {
        return;
    }
    // SAFETY: `size` bytes of the scratch record, checked above to lie within it.
    let bytes = unsafe { core::slice::from_raw_parts((rec as *const PyStack).cast::<u8>(), size) };
    let sent = EVENTS.output::<[u8]>(bytes, wakeup_flags());
    count(kind::PY_STACK, sent.is_err());
}
