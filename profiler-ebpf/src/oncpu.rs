//! On-CPU stack sampling: a cpu-clock perf event on every CPU; ticks that land on a tracked
//! thread send its user and kernel stacks.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::perf_event,
    programs::PerfEventContext,
};
use profiler_common::{CpuSample, kind};

use crate::{
    emit::{capture_stack, header, reserve, wakeup_flags},
    maps::THREADS,
};

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if tid == 0 || THREADS.get_ptr(tid).is_none() {
        return 0;
    }
    if let Some(mut entry) = reserve::<CpuSample>(kind::CPU_SAMPLE) {
        let rec = entry.as_mut_ptr();
        // SAFETY: `rec` is a reserved record of the right size, fully written before submit.
        unsafe {
            (*rec).header = header(
                kind::CPU_SAMPLE,
                tid,
                (pid_tgid >> 32) as u32,
                bpf_ktime_get_ns(),
            );
            capture_stack(&ctx, &raw mut (*rec).stack);
        }
        entry.submit(wakeup_flags());
    }
    0
}
