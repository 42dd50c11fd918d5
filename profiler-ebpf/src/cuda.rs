//! Uprobes on the CUDA driver, CUDA runtime and NCCL: what the threads feeding a GPU wait on.
//!
//! One entry and one return program serve every probed function; the attach cookie names the
//! function (user space's table) and says what to read. Arguments are kept raw, six
//! registers and the first stack slot, and decoded in user space, where each function's
//! signature is known. Only the outermost probed call of a thread is reported: cudart's
//! `cudaMemcpyAsync` calling the driver's `cuMemcpyAsync` is one call, with cudart's
//! arguments. Kernel launches get an entry-only counter instead: at tens of thousands of
//! launches a second, a record (let alone a return probe) per launch would cost the job more
//! than everything else stallscope does.
//!
//! The entry and return programs come twice: `cuda_enter`/`cuda_exit` for one perf-event
//! uprobe per function (any kernel), `cuda_enter_multi`/`cuda_exit_multi` for one uprobe_multi
//! link per library (Linux 6.6), which the kernel removes with one grace period rather than
//! one per function. User space loads one pair.
use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
        generated::bpf_get_attach_cookie,
    },
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use profiler_common::{CallEntry, CudaCall, cookie, kind};

use crate::{
    emit::{header, reserve, send_py_stack, wakeup_flags},
    maps::{CONTROL, CUDA_INFLIGHT, LAUNCHES, slot_of, stopped},
    regs,
};

#[inline(always)]
fn launches_counted() -> bool {
    CONTROL
        .get(profiler_common::control::LAUNCHES_COUNTED)
        .is_some_and(|v| *v != 0)
}

#[inline(always)]
fn attach_cookie<C: EbpfContext>(ctx: &C) -> u64 {
    // SAFETY: a helper with no preconditions; 0 when the link has no cookie.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

#[uprobe]
pub fn cuda_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx)
}

#[uprobe]
pub fn cuda_enter_multi(ctx: ProbeContext) -> u32 {
    enter(&ctx)
}

#[inline(always)]
fn enter(ctx: &ProbeContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    if stopped() || slot_of(tid) == 0 {
        return 0;
    }
    // SAFETY: the probe context is the task's saved user registers.
    let regs = unsafe { &*ctx.regs };
    let sp = regs::stack_pointer(regs);
    if let Some(open) = CUDA_INFLIGHT.get_ptr_mut(tid) {
        // SAFETY: map values stay valid for the program's run.
        let open = unsafe { &mut *open };
        if sp < open.sp {
            open.nested += 1;
            return 0;
        }
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let caller = regs::return_address(regs);
    let mut args = regs::call_args(regs);
    let cookie = attach_cookie(ctx);
    if cookie & cookie::ARG2_BY_REF != 0 {
        // SAFETY: a checked user read; the caller's copy lives until the call returns.
        args[6] = unsafe { bpf_probe_read_user(args[2] as *const u64) }.unwrap_or(0);
    }
    let entry = CallEntry {
        start_ns: now,
        cookie,
        sp,
        nested: 0,
        _pad: 0,
        caller,
        args,
    };
    let _ = CUDA_INFLIGHT.insert(tid, entry, 0);
    0
}

#[uretprobe]
pub fn cuda_exit(ctx: RetProbeContext) -> u32 {
    exit(&ctx)
}

#[uretprobe]
pub fn cuda_exit_multi(ctx: RetProbeContext) -> u32 {
    exit(&ctx)
}

#[inline(always)]
fn exit(ctx: &RetProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if stopped() {
        return 0;
    }
    let Some(open) = CUDA_INFLIGHT.get_ptr_mut(tid) else {
        return 0;
    };
    // SAFETY: map values stay valid for the program's run.
    let open = unsafe { &mut *open };
    if open.nested > 0 {
        open.nested -= 1;
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: the probe context is the task's saved user registers.
    let ret = regs::return_value(unsafe { &*ctx.regs });
    let out = if open.cookie & cookie::OUT_PTR != 0 {
        // SAFETY: a checked user read.
        unsafe { bpf_probe_read_user(open.args[0] as *const u64) }.unwrap_or(0)
    } else {
        0
    };
    let h = header(kind::CUDA_CALL, tid, (pid_tgid >> 32) as u32, open.start_ns);
    // The Python line that made the call: its frames are unchanged until it returns.
    send_py_stack(h);
    if let Some(mut e) = reserve::<CudaCall>(kind::CUDA_CALL) {
        e.write(CudaCall {
            header: h,
            end_ns: now,
            cookie: open.cookie,
            nested: 0,
            _pad: 0,
            caller: open.caller,
            args: open.args,
            ret,
            out,
        });
        e.submit(wakeup_flags());
    }
    let _ = CUDA_INFLIGHT.remove(tid);
    0
}

/// Kernel launches: a count per thread and entry point, read by user space on every tick.
#[uprobe]
pub fn cuda_launch(ctx: ProbeContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    if stopped() || !launches_counted() || slot_of(tid) == 0 {
        return 0;
    }
    let key = (u64::from(tid) << 32) | (attach_cookie(&ctx) & 0xffff_ffff);
    match LAUNCHES.get_ptr_mut(key) {
        // SAFETY: only this thread's launches, on the CPU it runs on, write its entries.
        Some(n) => unsafe { *n += 1 },
        None => {
            let _ = LAUNCHES.insert(key, 1, 0);
        }
    }
    0
}
