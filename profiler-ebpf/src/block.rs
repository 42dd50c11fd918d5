//! Block IO of tracked threads. A request is created in the submitter's context
//! (`block_io_start`, or `block_bio_queue` before Linux 6.5), but issue and completion may run
//! in a kworker or in IRQ context, so the submitter is remembered under the request's start
//! sector and found again by it. Keying requests rather than bios keeps bios that were merged
//! into a request (or split from one) from being lost. Classic tracepoints: block IO is rare next to
//! context switches, and their record layout (read from tracefs) is all we need.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use profiler_common::{BlockIo, IoKey, IoStart, kind};

use crate::{
    emit::{header, reserve, wakeup_flags},
    maps::{INFLIGHT_IO, offset, slot_of, stopped},
};

#[inline(always)]
fn read<T>(ctx: &TracePointContext, offset: u32) -> Option<T> {
    // SAFETY: a checked read from the tracepoint record.
    unsafe { ctx.read_at::<T>(offset as usize) }.ok()
}

/// Bio and request devices differ for partitions (a bio names the partition, a request the
/// whole disk), while the sector is already remapped to the disk: key by sector alone.
#[inline(always)]
fn key(sector: u64) -> IoKey {
    IoKey {
        dev: 0,
        _pad: 0,
        sector,
    }
}

/// 0 read, 1 write, 2 anything else (flush, discard), from the tracepoint's rwbs string.
#[inline(always)]
fn direction(rwbs: u64) -> u32 {
    let mut i = 0;
    while i < 4 {
        match ((rwbs >> (i * 8)) & 0xff) as u8 {
            b'W' => return 1,
            b'R' => return 0,
            b'D' | b'N' | 0 => return 2,
            _ => {}
        }
        i += 1;
    }
    2
}

#[tracepoint(category = "block", name = "block_io_start")]
pub fn block_submit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if slot_of(tid) == 0 || stopped() {
        return 0;
    }
    let Some(sector) = read::<u64>(&ctx, offset!(submit_sector)) else {
        return 0;
    };
    let start = IoStart {
        tid,
        pid: (pid_tgid >> 32) as u32,
        // SAFETY: a helper with no preconditions.
        queued_ns: unsafe { bpf_ktime_get_ns() },
        issued_ns: 0,
    };
    let _ = INFLIGHT_IO.insert(key(sector), start, 0);
    0
}

#[tracepoint(category = "block", name = "block_rq_issue")]
pub fn block_rq_issue(ctx: TracePointContext) -> u32 {
    let Some(sector) = read::<u64>(&ctx, offset!(rq_issue_sector)) else {
        return 0;
    };
    if let Some(start) = INFLIGHT_IO.get_ptr_mut(key(sector)) {
        // SAFETY: map values stay valid for the program's run.
        unsafe { (*start).issued_ns = bpf_ktime_get_ns() };
    }
    0
}

#[tracepoint(category = "block", name = "block_rq_complete")]
pub fn block_rq_complete(ctx: TracePointContext) -> u32 {
    if stopped() {
        return 0;
    }
    let Some(sector) = read::<u64>(&ctx, offset!(rq_complete_sector)) else {
        return 0;
    };
    let k = key(sector);
    let Some(start) = INFLIGHT_IO.get_ptr(k) else {
        return 0;
    };
    // SAFETY: map values stay valid for the program's run; copied before the delete.
    let start = unsafe { *start };
    let _ = INFLIGHT_IO.remove(k);
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let issued = if start.issued_ns == 0 {
        start.queued_ns
    } else {
        start.issued_ns
    };
    let nr_sector = read::<u32>(&ctx, offset!(rq_complete_nr_sector)).unwrap_or(0);
    if let Some(mut entry) = reserve::<BlockIo>(kind::BLOCK_IO) {
        entry.write(BlockIo {
            header: header(kind::BLOCK_IO, start.tid, start.pid, start.queued_ns),
            dev: read::<u32>(&ctx, offset!(rq_complete_dev)).unwrap_or(0),
            write: direction(read::<u64>(&ctx, offset!(rq_complete_rwbs)).unwrap_or(0)),
            sector,
            bytes: u64::from(nr_sector) * 512,
            queue_ns: issued.saturating_sub(start.queued_ns),
            service_ns: now.saturating_sub(issued),
            error: read::<i32>(&ctx, offset!(rq_complete_error)).unwrap_or(0),
            _pad: 0,
        });
        entry.submit(wakeup_flags());
    }
    0
}
