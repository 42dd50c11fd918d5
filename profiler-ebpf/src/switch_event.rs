//! Switch-outs through a software context-switch perf event on each tracked thread, for jobs
//! whose threads switch rarely next to a host that switches often (user space chooses, see
//! profiler's `switch_choice.rs`). No program runs for switches of threads we do not track:
//! they pay only the kernel's look for per-task events, where a `sched_switch` program runs
//! on every context switch of the host. The price is the kernel's per-task perf context on
//! every switch of a tracked thread, several times a tracepoint program's.
//!
//! There is no switch-in program: the scheduler's own `sched_info.last_arrival` says when the
//! thread got its CPU, and the run queue's clock, just updated at a switch-out, gives how
//! long ago that was. Between a switch-in and the thread's next switch-out or on-CPU sample,
//! it still reads as off-CPU.
use aya_ebpf::{
    helpers::{bpf_get_current_task_btf, bpf_ktime_get_ns},
    macros::perf_event,
    programs::PerfEventContext,
};
use profiler_common::{ThreadStats, state};

use crate::{
    maps::{CLOCK_GAP, events_see_switches, offset, slot_of, slot_stats},
    sched::{end_offcpu, leave_cpu, task_field},
};

const TASK_RUNNING: u32 = 0;

/// The current task, as a BTF pointer.
#[inline(always)]
pub fn current_task() -> *const u8 {
    // SAFETY: the helper takes no arguments and returns the running task.
    unsafe { bpf_get_current_task_btf() as *const u8 }
}

/// When `task`, which is running or just leaving its CPU, got that CPU, on the clock of
/// `now` (`bpf_ktime_get_ns`); 0 when unknown. The scheduler's `last_arrival` is on its run
/// queue's clock. At a switch-out (`fresh`) the scheduler has just updated that clock, so the
/// time since is its reading less `last_arrival`, and the gap between the two clocks is kept
/// for this CPU. Elsewhere (a stack sample, an exit) the run queue's clock may be a tick old
/// (it often still equals `last_arrival`), and `last_arrival` is moved over by the gap last
/// kept here instead.
#[inline(always)]
fn switched_in_ns(task: *const u8, now: u64, fresh: bool) -> u64 {
    if offset!(rq_clock) == 0 {
        return 0;
    }
    // SAFETY: `task` is a BTF task pointer; the offsets are BTF's `sched_info.last_arrival`,
    // `se.cfs_rq`, `cfs_rq.rq` and `rq.clock`, each load typed by the verifier from the last.
    let (arrived, clock): (u64, u64) = unsafe {
        let arrived = task_field(task, offset!(task_last_arrival));
        let cfs_rq: *const u8 = task_field(task, offset!(task_cfs_rq));
        let rq: *const u8 = task_field(cfs_rq, offset!(cfs_rq_rq));
        (arrived, task_field(rq, offset!(rq_clock)))
    };
    if arrived == 0 || clock < arrived {
        return 0;
    }
    let (Some(gap), Some(known)) = (CLOCK_GAP.get_ptr_mut(0), CLOCK_GAP.get_ptr_mut(1)) else {
        return now.saturating_sub(clock - arrived);
    };
    // SAFETY: this CPU's entries; the programs that use them run with this CPU's switches
    // (interrupts off) or in its interrupts: a torn pair only costs one estimate.
    unsafe {
        if fresh {
            *gap = now.wrapping_sub(clock);
            *known = 1;
            now.saturating_sub(clock - arrived)
        } else if *known != 0 {
            arrived.wrapping_add(*gap).min(now)
        } else {
            now.saturating_sub(clock - arrived)
        }
    }
}

/// The thread is on its CPU at `now`; if it is recorded off-CPU, its off-CPU period ends at
/// its switch-in, and a stack sample waiting for that end gets it (see
/// [`ThreadStats::came_back_at`]). `fresh`: at a switch-out (see [`switched_in_ns`]).
#[inline(always)]
pub fn found_running_at(st: &mut ThreadStats, tid: u32, task: *const u8, now: u64, fresh: bool) {
    if st.state == state::ON_CPU {
        return;
    }
    if let Some(back) = st.came_back_at(switched_in_ns(task, now, fresh), now) {
        end_offcpu(st, tid, back);
    }
}

/// A tracked thread leaves its CPU: the perf event of its context switches, which fires in
/// the scheduler as the thread switches out, still as the current task.
#[perf_event]
pub fn switch_out(ctx: PerfEventContext) -> u32 {
    if !events_see_switches() {
        // Still attached after a move to the tracepoint, until user space closes it.
        return 0;
    }
    let task = current_task();
    // SAFETY: `task` is the current task's BTF pointer; the offset is BTF's `pid`.
    let tid: u32 = unsafe { task_field(task, offset!(task_pid)) };
    // SAFETY: map values stay valid for the program's run; null is none.
    let Some(st) = (unsafe { slot_stats(slot_of(tid)).as_mut() }) else {
        return 0;
    };
    // SAFETY: as above; the offset is BTF's `sched_info.pcount`.
    let runs = unsafe { task_field::<u64>(task, offset!(task_pcount)) } as u32;
    if offset!(task_pcount) != 0 && st.runs_counted == runs {
        // This switch, seen through the thread's other event or the tracepoint.
        return 0;
    }
    st.runs_counted = runs;
    let now = unsafe { bpf_ktime_get_ns() };
    found_running_at(st, tid, task, now, true);
    // SAFETY: as above; the offset is BTF's `__state`.
    let task_state: u32 = unsafe { task_field(task, offset!(task_state)) };
    leave_cpu(&ctx, st, tid, task, now, task_state == TASK_RUNNING);
    0
}
