//! On-CPU stack sampling: a cpu-clock perf event on every CPU; ticks that land on a tracked
//! thread send its user and kernel stacks.
//!
//! A sample also repairs a switch-in the kernel did not report. Some switches never reach
//! `sched_switch`'s programs, ftrace's event included (seen here: every switch back from a
//! VM agent's thread that preempts once a second); the thread then reads as off-CPU, in its
//! old state, while it runs, until its next switch-out, which may be long for a thread that
//! computes. A sample that finds a tracked thread running is proof that it was switched in:
//! its off-CPU period ends at the last switch seen on this CPU (or when it began, if later),
//! as at a switch-out that finds the same, so the error lasts one sampling period at most.
//! With per-thread switch events, where no switch-in is ever seen, it ends where the
//! scheduler says the thread got its CPU.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns},
    macros::perf_event,
    programs::PerfEventContext,
};
use profiler_common::{CpuSample, kind, state};

use crate::{
    emit::{
        Pressure, capture_stack, header, pressure, reserve, send_py_stack, send_user_stack,
        thinned, wakeup_flags,
    },
    maps::{CPU_CURRENT, per_thread_switches, slot_of, slot_stats},
    sched::found_running,
    switch_event::current_task,
};

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if tid == 0 {
        return 0;
    }
    let slot = slot_of(tid);
    // SAFETY: map values stay valid for the program's run; null is none.
    let Some(st) = (unsafe { slot_stats(slot).as_mut() }) else {
        return 0;
    };
    // The thread is running here, so no other CPU's switch touches its entry, and this
    // CPU's switches run with interrupts off, so none interleaves with this.
    let now = unsafe { bpf_ktime_get_ns() };
    if st.state != state::ON_CPU && per_thread_switches() {
        found_running(st, tid, current_task(), 0, now, false);
    } else if st.state != state::ON_CPU
        && let Some(cpu) = CPU_CURRENT.get_ptr_mut(0)
    {
        // SAFETY: this CPU's record; its switches cannot run while this does.
        let cpu = unsafe { &mut *cpu };
        found_running(st, tid, current_task(), cpu.ts_ns, now, false);
        // SAFETY: the helper only returns the current task's address.
        cpu.task = unsafe { bpf_get_current_task() };
        cpu.slot = slot;
    }
    if pressure() == Pressure::NoSamples {
        thinned(kind::CPU_SAMPLE_THINNED);
        return 0;
    }
    let h = header(kind::CPU_SAMPLE, tid, (pid_tgid >> 32) as u32, now);
    send_py_stack(h);
    send_user_stack(h);
    if let Some(mut entry) = reserve::<CpuSample>(kind::CPU_SAMPLE) {
        let rec = entry.as_mut_ptr();
        // SAFETY: `rec` is a reserved record of the right size, fully written before submit.
        unsafe {
            (*rec).header = h;
            capture_stack(&ctx, &raw mut (*rec).stack);
        }
        entry.submit(wakeup_flags());
    }
    0
}
