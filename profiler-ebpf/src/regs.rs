//! The registers the programs read, by architecture: `bpf_target_arch`, which aya-build sets
//! from the architecture the binary is built for, so an aarch64 binary carries programs that
//! read aarch64 registers. A call's arguments and return value at a uprobe, and the pc, stack
//! and frame pointers a user stack copy starts from.
use aya_ebpf::bindings::pt_regs;
#[cfg(bpf_target_arch = "x86_64")]
use aya_ebpf::helpers::bpf_probe_read_user;
use profiler_common::CALL_ARGS;

#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
compile_error!(
    "stallscope's programs read x86_64 and aarch64 registers only; build them through \
     profiler/build.rs, whose aya-build sets bpf_target_arch"
);

/// A function's first `CALL_ARGS` integer arguments at its entry. x86-64 passes six in
/// registers and the seventh on the stack, just above the return address; aarch64 passes
/// eight in x0-x7.
#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
pub fn call_args(regs: &pt_regs) -> [u64; CALL_ARGS] {
    // SAFETY: user reads through the helper fail instead of faulting.
    let seventh = unsafe { bpf_probe_read_user((regs.rsp + 8) as *const u64) }.unwrap_or(0);
    [
        regs.rdi, regs.rsi, regs.rdx, regs.rcx, regs.r8, regs.r9, seventh,
    ]
}

#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
pub fn call_args(regs: &pt_regs) -> [u64; CALL_ARGS] {
    let mut args = [0u64; CALL_ARGS];
    let mut i = 0;
    while i < CALL_ARGS {
        args[i] = regs.regs[i];
        i += 1;
    }
    args
}

/// Where a function returns to, read at its entry: the word the call pushed at the stack
/// pointer on x86-64, the link register on aarch64.
#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
pub fn return_address(regs: &pt_regs) -> u64 {
    // SAFETY: a checked user read.
    unsafe { bpf_probe_read_user(regs.rsp as *const u64) }.unwrap_or(0)
}

#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
pub fn return_address(regs: &pt_regs) -> u64 {
    regs.regs[30]
}

#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
pub fn stack_pointer(regs: &pt_regs) -> u64 {
    regs.rsp
}

#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
pub fn stack_pointer(regs: &pt_regs) -> u64 {
    regs.sp
}

#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
pub fn return_value(regs: &pt_regs) -> u64 {
    regs.rax
}

#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
pub fn return_value(regs: &pt_regs) -> u64 {
    regs.regs[0]
}

/// The pc, stack pointer, frame pointer and link register (0 on x86-64, which has none) of
/// saved user registers that live in kernel memory (`bpf_task_pt_regs`); 0 for a failed read.
///
/// # Safety
/// `regs` must point at a task's saved registers (the helper's result).
#[inline(always)]
pub unsafe fn user_frame(regs: *const pt_regs) -> (u64, u64, u64, u64) {
    use aya_ebpf::helpers::bpf_probe_read_kernel as read;
    #[cfg(bpf_target_arch = "x86_64")]
    // SAFETY: the caller's pointer; failed reads are 0.
    let (pc, sp, fp, lr) = unsafe {
        (
            read(&raw const (*regs).rip),
            read(&raw const (*regs).rsp),
            read(&raw const (*regs).rbp),
            Ok::<u64, i64>(0),
        )
    };
    #[cfg(bpf_target_arch = "aarch64")]
    // SAFETY: as above; arm64's pt_regs begins with the user_pt_regs aya names pt_regs.
    let (pc, sp, fp, lr) = unsafe {
        (
            read(&raw const (*regs).pc),
            read(&raw const (*regs).sp),
            read(&raw const (*regs).regs[29]),
            read(&raw const (*regs).regs[30]),
        )
    };
    (
        pc.unwrap_or(0),
        sp.unwrap_or(0),
        fp.unwrap_or(0),
        lr.unwrap_or(0),
    )
}
