//! Scheduler accounting from BTF tracepoints: each tracked thread's time is split into
//! on-CPU, run-queue wait, IO wait and other blocked time, and new threads are followed.
//! Switches reach it through `sched_switch` here, or through per-thread perf events (see
//! switch_event.rs), or both while user space moves from one to the other
//! (`maps::SWITCH_HOOK`).
//!
//! The wake-up program (`sched_waking`) runs for every wake-up in the system, tracked or not,
//! so it does one load and one lookup before it leaves, and sends something only for the
//! first wake-up of a tracked thread's sampled off-CPU period: who woke it.
//!
//! An off-CPU period is credited whole to its state (blocked, IO, or run queue when
//! preempted) at switch-in; its run-queue tail (woken, waiting for a CPU) is moved over at
//! the thread's next switch-out, from the kernel's own `sched_info.run_delay` counter, which
//! the scheduler updates just after the switch-in tracepoint.
//!
//! At `sched_switch`, `prev` is first recognised by its address, against the task this CPU
//! last switched to (`CPU_CURRENT`), which also holds its slot; only one not recognised that
//! way is looked up, by its TID (see `maps::SLOTS`). Task fields (both threads' pids, a
//! tracked `prev`'s `run_delay` and `in_iowait`, a forked task's ids) are read at offsets
//! user space found in BTF, with plain loads the verifier checks once (see `task_field`).
use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_task_pt_regs, generated::bpf_get_stack,
    },
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use profiler_common::{
    Header, OFFCPU_PENDING, OFFCPU_WOKEN, OffCpuSample, ThreadExit, ThreadNew, ThreadStats, Woken,
    kind, state,
};

use crate::{
    emit::{
        Pressure, capture_stack, count, header, pressure, reserve, send_py_stack, send_user_stack,
        thinned, wakeup_flags,
    },
    maps::{
        CPU_CURRENT, FREE_SLOTS, SWITCHES_OUT, config, covered, offset, per_thread_switches,
        prev_state_arg, set_slot, slot_of, slot_stats, tracepoint_sees_switches,
    },
};

const TASK_RUNNING: u64 = 0;

/// A field of a task (or of a structure reached from one), read with a plain load. Every
/// `task` here is a BTF pointer (a BTF tracepoint's argument, `bpf_get_current_task_btf`'s
/// result, or a pointer field loaded from one) and every offset a constant of the frozen
/// .rodata, so the verifier checks each access against the kernel's BTF once, at load, where
/// a checked read would cost a helper call on every run: on every context switch of the
/// host, for `next`.
///
/// # Safety
///
/// `task` must be such a pointer and `offset` the offset of a `T`-sized field in what it
/// points to.
#[inline(always)]
pub unsafe fn task_field<T: Copy>(task: *const u8, offset: u32) -> T {
    // SAFETY: per the contract above; the verifier rejects any other access at load.
    unsafe { core::ptr::read_volatile(task.add(offset as usize) as *const T) }
}

/// Settles the run-queue tail of the thread's last off-CPU period (see
/// [`ThreadStats::settle_run_delay`]). `task` is the thread's own `task_struct` (see
/// [`task_field`]).
#[inline(always)]
fn settle_run_delay(st: &mut ThreadStats, task: *const u8) {
    if offset!(task_run_delay) == 0 {
        return;
    }
    // SAFETY: `task` is a BTF task pointer; the offset is BTF's `sched_info.run_delay`.
    let rd: u64 = unsafe { task_field(task, offset!(task_run_delay)) };
    st.settle_run_delay(rd);
}

/// Ends an off-CPU period at `now`, a switch-in: its stack sample, if one is waiting, gets
/// its end.
#[inline(always)]
fn come_back(st: &mut ThreadStats, tid: u32, now: u64) {
    end_offcpu(st, tid, now);
    st.come_back(now);
}

/// The thread `task` is on this CPU at `now`; if its switch-in went unseen, ends its
/// off-CPU period (see [`ThreadStats::found_running`]): after the last switch seen on this CPU
/// (`cpu_last_switch_ns`), or, where none is (per-thread events, a CPU's record cleared by a
/// move between hooks, none since attach), where the scheduler says the thread got its CPU.
/// `fresh`: at a switch-out (see `switch_event::found_running_at`).
#[inline(always)]
pub fn found_running(
    st: &mut ThreadStats,
    tid: u32,
    task: *const u8,
    cpu_last_switch_ns: u64,
    now: u64,
    fresh: bool,
) {
    if st.state == state::ON_CPU {
        return;
    }
    if cpu_last_switch_ns == 0 && offset!(rq_clock) != 0 {
        crate::switch_event::found_running_at(st, tid, task, now, fresh);
    } else if let Some(back) = st.found_running(cpu_last_switch_ns, now) {
        end_offcpu(st, tid, back);
    }
}

#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    let Some(cpu) = CPU_CURRENT.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: a per-CPU slot; only this CPU's switches touch it.
    let cpu = unsafe { &mut *cpu };
    let prev_task: u64 = ctx.arg(1);
    let next_task: u64 = ctx.arg(2);
    // SAFETY: `next` is the tracepoint's task argument; the offset is BTF's `pid`.
    let next_tid: u32 = unsafe { task_field(next_task as *const u8, offset!(task_pid)) };
    let next_slot = slot_of(next_tid);
    let prev_known = cpu.task == prev_task && cpu.ts_ns != 0;
    if prev_known && cpu.slot == 0 && next_slot == 0 {
        // Neither thread is ours, as in most switches on a busy host: no clock read. The
        // CPU's record keeps the time of the last switch that was, which only bounds a
        // tracked thread's switch-in that went unseen.
        cpu.task = next_task;
        return 0;
    }
    // After the untracked switches' path, which then costs no mode lookup: with per-thread
    // events (this program attached only while moving to or from them) it writes nothing
    // that counts, since a move to the tracepoint clears the CPUs' records first.
    if !tracepoint_sees_switches() {
        return 0;
    }
    // SAFETY: `prev` is the tracepoint's task argument; the offset is BTF's `pid`.
    let prev_tid: u32 = unsafe { task_field(prev_task as *const u8, offset!(task_pid)) };
    let now = switch_clock(cpu, prev_task as *const u8, prev_tid);
    if !(prev_known && cpu.slot == 0) {
        let mut st = if prev_known {
            slot_stats(cpu.slot)
        } else {
            core::ptr::null_mut()
        };
        // The CPU's record can be stale only after a switch the kernel did not report; the
        // slot's owner settles it, and the TID's own slot is the answer then.
        // SAFETY: map values stay valid for the program's run; null is none.
        if unsafe { st.as_ref() }.is_none_or(|s| s.tid != prev_tid) {
            st = slot_stats(slot_of(prev_tid));
        }
        // SAFETY: as above.
        if let Some(st) = unsafe { st.as_mut() } {
            switch_out(&ctx, st, prev_tid, now, cpu.ts_ns);
        }
    }
    cpu.task = next_task;
    cpu.ts_ns = now;
    // A plain pointer, null for none, rather than an `Option`: LLVM split the option into a
    // flag and a pointer it left undefined when none, and spilled that undefined register on
    // a path the verifier walks ("R9 !read_ok").
    let next_stats = slot_stats(next_slot);
    // SAFETY: map values stay valid for the program's run; null is none.
    cpu.slot = match unsafe { next_stats.as_mut() } {
        Some(st) => {
            if st.state == state::ON_CPU {
                st.credit(now);
            } else {
                come_back(st, next_tid, now);
            }
            next_slot
        }
        None => 0,
    };
    0
}

/// Now, on `bpf_ktime_get_ns`'s clock: from the run queue's clock that `__schedule` has just
/// updated, a few plain loads (see [`profiler_common::CpuSlot::clock_estimate`]), and from the
/// helper where that clock is missing, due to be re-measured, or stopped at an idle exit.
#[inline(always)]
fn switch_clock(cpu: &mut profiler_common::CpuSlot, prev: *const u8, prev_tid: u32) -> u64 {
    if offset!(rq_clock) == 0 {
        return unsafe { bpf_ktime_get_ns() };
    }
    // SAFETY: `prev` is a BTF task pointer; the offsets are BTF's `se.cfs_rq`, `cfs_rq.rq` and
    // `rq.clock` (a null pointer on the way reads as 0).
    let rq_clock: u64 = unsafe {
        let cfs_rq: *const u8 = task_field(prev, offset!(task_cfs_rq));
        let rq: *const u8 = task_field(cfs_rq, offset!(cfs_rq_rq));
        task_field(rq, offset!(rq_clock))
    };
    if rq_clock != 0 && prev_tid != 0 {
        if let Some(now) = cpu.clock_estimate(rq_clock) {
            return now;
        }
    }
    let now = unsafe { bpf_ktime_get_ns() };
    if rq_clock != 0 && prev_tid != 0 {
        cpu.calibrate(rq_clock, now);
    }
    // An estimate since the last measurement may have run up to the drift allowance ahead.
    now.max(cpu.ts_ns)
}

/// Closes the interval of a thread leaving the CPU. A thread not marked on-CPU was switched
/// in without us seeing it (before attach, or an event the kernel did not report): it has run
/// at most since the last switch seen on this CPU, so the time before that stays in its
/// recorded state and only the rest counts as on-CPU.
#[inline(always)]
fn switch_out(
    ctx: &BtfTracePointContext,
    st: &mut ThreadStats,
    tid: u32,
    now: u64,
    cpu_last_switch_ns: u64,
) {
    let prev: *const u8 = ctx.arg(1);
    found_running(st, tid, prev, cpu_last_switch_ns, now, true);
    if offset!(task_pcount) != 0 {
        // So that the thread's switch event, while one is attached, knows this switch-out is
        // counted (see `switch_hook::BOTH`).
        // SAFETY: `prev` is the tracepoint's task argument; the offset is BTF's
        // `sched_info.pcount`.
        st.runs_counted = unsafe { task_field::<u64>(prev, offset!(task_pcount)) } as u32;
    }
    let preempt = ctx.arg::<u64>(0) & 0xff != 0;
    let prev_state = if prev_state_arg() {
        ctx.arg::<u64>(3) & 0xffff_ffff
    } else {
        // Before Linux 5.18 the tracepoint has no prev_state: the state the task is leaving
        // in, from the task itself, as the per-thread hook reads it.
        // SAFETY: `prev` is the tracepoint's task argument; the offset is BTF's `__state`
        // (or `state`, whose low word holds it).
        u64::from(unsafe { task_field::<u32>(prev, offset!(task_state)) })
    };
    leave_cpu(
        ctx,
        st,
        tid,
        prev,
        now,
        preempt || prev_state == TASK_RUNNING,
    );
}

/// A tracked thread leaves its CPU at `now`, runnable (preempted, or yielding) or not:
/// credits its on-CPU interval and opens the off-CPU one, in the run queue, in IO wait or
/// blocked, with a stack sample now and then. `task` is the thread's own `task_struct` (see
/// [`task_field`]).
#[inline(always)]
pub fn leave_cpu<C: EbpfContext>(
    ctx: &C,
    st: &mut ThreadStats,
    tid: u32,
    task: *const u8,
    now: u64,
    runnable: bool,
) {
    if let Some(n) = SWITCHES_OUT.get_ptr_mut(0) {
        // SAFETY: this CPU's counter; its switches run with interrupts off.
        unsafe { *n += 1 };
    }
    st.credit(now);
    settle_run_delay(st, task);
    if runnable {
        st.state = state::RUNQUEUE;
        return;
    }
    // SAFETY: `task` is a BTF task pointer; the offset is the byte that holds the
    // `in_iowait` bit.
    let iowait_byte: u8 = unsafe { task_field(task, offset!(task_in_iowait_byte)) };
    let mask = offset!(task_in_iowait_mask);
    st.state = if mask != 0 && u32::from(iowait_byte) & mask != 0 {
        state::IO_WAIT
    } else {
        state::BLOCKED
    };
    let interval = config!(offcpu_sample_interval_ns);
    if st.offcpu_pending == 0 && st.offcpu_sample_due(now, interval) {
        if pressure() == Pressure::NoSamples {
            // This period goes unsampled, and spends its place in the budget as a sample.
            thinned(kind::OFFCPU_SAMPLE_THINNED);
            st.offcpu_sample_taken(now, interval);
            return;
        }
        let h = header(kind::OFFCPU_SAMPLE, tid, st.tgid, now);
        send_py_stack(h);
        send_user_stack(h);
        if let Some(mut entry) = reserve::<OffCpuSample>(kind::OFFCPU_SAMPLE) {
            let rec = entry.as_mut_ptr();
            // SAFETY: `rec` is a reserved record of the right size; every field is written
            // before submit.
            unsafe {
                (*rec).header = h;
                (*rec).state = st.state;
                let (syscall, arg0) = syscall_of(task);
                (*rec).syscall = syscall;
                (*rec).arg0 = arg0;
                capture_stack(ctx, &raw mut (*rec).stack);
            }
            entry.submit(wakeup_flags());
            st.offcpu_sample_taken(now, interval);
            st.offcpu_pending = OFFCPU_PENDING;
        }
    }
}

/// The system call `task` (the current task, leaving its CPU) blocked in, as its number
/// plus one (0: none, or the register layout unknown), with its first argument: read from
/// the user registers the kernel saved at entry, once per off-CPU sample, not per switch.
#[inline(always)]
fn syscall_of(task: *const u8) -> (u32, u64) {
    let (nr_at, arg_at) = (offset!(regs_syscall), offset!(regs_arg0));
    if nr_at == 0 || arg_at == 0 {
        return (0, 0);
    }
    // SAFETY: `task` is a BTF task pointer, as the helper requires.
    let regs = unsafe { bpf_task_pt_regs(task as *mut _) } as *const u8;
    if regs.is_null() {
        return (0, 0);
    }
    // SAFETY: checked reads; a failed one reads as no call.
    let nr: i32 =
        unsafe { bpf_probe_read_kernel(regs.add(nr_at as usize) as *const i32) }.unwrap_or(-1);
    if nr < 0 {
        return (0, 0);
    }
    // SAFETY: as above.
    let arg0: u64 =
        unsafe { bpf_probe_read_kernel(regs.add(arg_at as usize) as *const u64) }.unwrap_or(0);
    (nr as u32 + 1, arg0)
}

#[inline(always)]
pub fn end_offcpu(st: &mut ThreadStats, tid: u32, now: u64) {
    if st.offcpu_pending == 0 {
        return;
    }
    st.offcpu_pending = 0;
    if let Some(mut entry) = reserve::<Header>(kind::OFFCPU_END) {
        entry.write(header(kind::OFFCPU_END, tid, st.tgid, now));
        entry.submit(wakeup_flags());
    }
}

/// Who woke a tracked thread from a sampled off-CPU period (see `kind::WOKEN`): the task
/// current here and the kernel stack, which in an interrupt or a timer is the interrupted
/// task's. Every wake-up of the host runs this; one of an untracked thread costs a field load
/// and a lookup, and only the first wake-up of a sampled period sends anything.
#[btf_tracepoint(function = "sched_waking")]
pub fn sched_waking(ctx: BtfTracePointContext) -> i32 {
    let task: *const u8 = ctx.arg(0);
    // SAFETY: `task` is the tracepoint's task argument; the offset is BTF's `pid`.
    let tid: u32 = unsafe { task_field(task, offset!(task_pid)) };
    let slot = slot_of(tid);
    if slot == 0 {
        return 0;
    }
    // SAFETY: map values stay valid for the program's run; null is none.
    let Some(st) = (unsafe { slot_stats(slot).as_mut() }) else {
        return 0;
    };
    if st.offcpu_pending != OFFCPU_PENDING || st.tid != tid {
        return 0;
    }
    st.offcpu_pending = OFFCPU_WOKEN;
    let now = unsafe { bpf_ktime_get_ns() };
    let waker = bpf_get_current_pid_tgid();
    if let Some(mut entry) = reserve::<Woken>(kind::WOKEN) {
        let rec = entry.as_mut_ptr();
        // SAFETY: `rec` is a reserved record of the right size; every field is written
        // before submit, and the helper writes at most the size of the array it is given.
        unsafe {
            (*rec).header = header(kind::WOKEN, tid, st.tgid, now);
            (*rec).waker_tid = waker as u32;
            (*rec).waker_pid = (waker >> 32) as u32;
            (*rec).waker_comm = bpf_get_current_comm().unwrap_or([0; 16]);
            (*rec)._pad = 0;
            (*rec).kernel_len = bpf_get_stack(
                ctx.as_ptr(),
                (*rec).kernel.as_mut_ptr().cast(),
                core::mem::size_of_val(&(*rec).kernel) as u32,
                0,
            ) as i32;
        }
        entry.submit(wakeup_flags());
    }
    0
}

#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> i32 {
    let parent_tid = bpf_get_current_pid_tgid() as u32;
    if slot_of(parent_tid) == 0 {
        return 0;
    }
    let child: *const u8 = ctx.arg(1);
    // SAFETY: `child` is the tracepoint's task argument; the offsets are BTF's `pid`, `tgid`.
    let (tid, tgid): (u32, u32) = unsafe {
        (
            task_field(child, offset!(task_pid)),
            task_field(child, offset!(task_tgid)),
        )
    };
    // A full table or a TID past `TRACKED` loses the thread: counted, as a ring-buffer
    // refusal is, under a kind of its own.
    let slot = match covered(tid).then(|| FREE_SLOTS.pop()) {
        Some(Ok(Some(slot))) => slot,
        _ => 0,
    };
    let st = slot_stats(slot);
    if st.is_null() {
        count(kind::THREAD_UNTRACKED, true);
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    // Not runnable until wake_up_new_task; its wait from there to its first run is in its
    // run_delay, which starts at zero, when it first switches out.
    // SAFETY: a free slot's entry, which nothing else writes until `TRACKED` names it.
    unsafe {
        *st = ThreadStats {
            tgid,
            state: state::BLOCKED,
            since_ns: now,
            off_state: state::ON_CPU,
            tid,
            ..ThreadStats::default()
        };
    }
    // The TID's lane after its entry: a lane never names an entry not yet written.
    set_slot(tid, slot);
    if let Some(mut entry) = reserve::<ThreadNew>(kind::THREAD_NEW) {
        entry.write(ThreadNew {
            header: header(kind::THREAD_NEW, tid, tgid, now),
            parent_tid,
            slot,
        });
        entry.submit(wakeup_flags());
    }
    0
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let slot = slot_of(tid);
    // SAFETY: map values stay valid for the program's run; null is none.
    let Some(st) = (unsafe { slot_stats(slot).as_mut() }) else {
        return 0;
    };
    // The exiting task, which is the current one.
    let task: *const u8 = ctx.arg(0);
    // Nothing may reach the slot once it is free, another thread's then: not the TID's lane,
    // nor this CPU's record of its current task, which the final switch-out reads.
    set_slot(tid, 0);
    let now = unsafe { bpf_ktime_get_ns() };
    // The thread runs this: a switch-in not seen ends its off-CPU period, as at a
    // switch-out.
    if per_thread_switches() {
        found_running(st, tid, task, 0, now, false);
    } else if let Some(cpu) = CPU_CURRENT.get_ptr_mut(0) {
        // SAFETY: this CPU's record; its switches cannot run while this does.
        let cpu = unsafe { &mut *cpu };
        if cpu.task == task as u64 {
            cpu.slot = 0;
        }
        found_running(st, tid, task, cpu.ts_ns, now, false);
    }
    st.credit(now);
    settle_run_delay(st, task);
    if let Some(mut entry) = reserve::<ThreadExit>(kind::THREAD_EXIT) {
        entry.write(ThreadExit {
            header: header(kind::THREAD_EXIT, tid, (pid_tgid >> 32) as u32, now),
            comm: bpf_get_current_comm().unwrap_or([0; 16]),
            stats: *st,
        });
        entry.submit(wakeup_flags());
    }
    st.tid = 0;
    let _ = FREE_SLOTS.push(slot, 0);
    0
}

#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(_ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if slot_of(tid) == 0 {
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(mut entry) = reserve::<ThreadNew>(kind::EXEC) {
        entry.write(ThreadNew {
            header: header(kind::EXEC, tid, (pid_tgid >> 32) as u32, now),
            parent_tid: 0,
            slot: 0,
        });
        entry.submit(wakeup_flags());
    }
    0
}
