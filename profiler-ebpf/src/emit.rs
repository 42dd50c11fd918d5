//! Ring-buffer output with exact loss accounting: every attempt is counted, and every refusal.
use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_smp_processor_id, generated::bpf_get_stack},
    maps::ring_buf::RingBufEntry,
};
use profiler_common::{EventCounts, Header, Stack};

use crate::maps::{COUNTS, EVENTS};

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
