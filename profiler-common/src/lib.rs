//! The wire format between stallscope's eBPF programs and its user space.
//!
//! Every struct is `#[repr(C)]` with explicit padding so both sides agree byte for byte.
//! Timestamps are `bpf_ktime_get_ns()`, i.e. CLOCK_MONOTONIC in nanoseconds. Requires Linux
//! 5.8+ (BPF ring buffer) and BTF (tp_btf programs); offsets into kernel structs are never
//! compiled in: user space reads them from BTF or tracefs and passes them as globals.
#![cfg_attr(not(test), no_std)]

mod accounting;
mod switch_clock;

/// Thread states the kernel side keeps per tracked thread.
pub mod state {
    /// On a CPU since `since_ns`.
    pub const ON_CPU: u32 = 0;
    /// Runnable and queued, waiting for a CPU.
    pub const RUNQUEUE: u32 = 1;
    /// Off-CPU in an IO wait (the kernel's `in_iowait`, what delay accounting calls blkio).
    pub const IO_WAIT: u32 = 2;
    /// Off-CPU for any other reason: sleep, futex, pipe, poll.
    pub const BLOCKED: u32 = 3;
}

/// Per-thread accounting, an entry of the `SLOTS` table, found through `TRACKED` (see
/// [`MAX_SLOTS`]).
///
/// The four `*_ns` buckets hold closed intervals only; the open one is
/// `[since_ns, now)` in `state`. Their sum plus the open interval is the time since the
/// thread was first tracked, which is the invariant the report relies on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadStats {
    pub tgid: u32,
    pub state: u32,
    pub since_ns: u64,
    pub on_cpu_ns: u64,
    pub runqueue_ns: u64,
    pub io_wait_ns: u64,
    pub blocked_ns: u64,
    /// Page-cache insertions (misses) made by this thread, in pages and bytes.
    pub pc_misses: u64,
    pub pc_miss_bytes: u64,
    /// When this thread's next off-CPU stack capture is due, all of its burst spent (see
    /// [`ThreadStats::offcpu_sample_due`]).
    pub offcpu_next_sample_ns: u64,
    /// Non-zero while the current off-CPU period has a captured stack waiting for its duration:
    /// [`OFFCPU_PENDING`], then [`OFFCPU_WOKEN`] once its waker was sent.
    pub offcpu_pending: u32,
    /// The state of the last off-CPU period, until its run-queue part is known.
    pub off_state: u32,
    /// The kernel's `sched_info.run_delay` for this task at its last switch-out
    /// ([`RUN_DELAY_UNKNOWN`] before the first).
    pub run_delay_ns: u64,
    /// How long the last off-CPU period lasted.
    pub off_len_ns: u64,
    /// The thread this entry of the `SLOTS` table belongs to; 0 while the entry is free.
    pub tid: u32,
    /// With per-thread switch events: the low half of the kernel's `sched_info.pcount` (runs
    /// on a CPU) at the last switch-out counted, so that a thread that carries two events
    /// (one opened for it, one inherited) has each switch counted once.
    pub runs_counted: u32,
}

/// Most threads tracked at once: entries of the kernel's `SLOTS` table, unless user space
/// sizes it smaller. A slot number is an entry's index plus one, so that 0 can mean
/// "untracked" in a `u16`.
pub const MAX_SLOTS: u32 = 65535;

/// TIDs per element of the kernel's `TRACKED` table: each element holds the slot numbers of
/// four consecutive TIDs, as `u16` lanes (BPF array elements take eight bytes each).
pub const TIDS_PER_ELEMENT: u32 = 4;

/// `ThreadStats::run_delay_ns` before a baseline is known.
pub const RUN_DELAY_UNKNOWN: u64 = u64::MAX;

/// What each CPU last switched to, so that a switch away from the task it switched to costs
/// no lookup. The value of the per-CPU `CPU_CURRENT` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSlot {
    /// The `task_struct` switched in at `ts_ns`, as an address: comparing it with the next
    /// switch's `prev` costs neither a helper call nor a read of the task.
    pub task: u64,
    /// `task`'s slot number (see [`MAX_SLOTS`]); 0 when it is untracked.
    pub slot: u32,
    pub _pad: u32,
    /// The last switch seen on this CPU; 0 before the first.
    pub ts_ns: u64,
    /// `bpf_ktime_get_ns` less the run queue's clock (see [`CpuSlot::clock_estimate`]), last
    /// measured at `calibrated_rq_ns`, the run queue's clock then (0 before the first).
    pub clock_gap: u64,
    pub calibrated_rq_ns: u64,
}

/// How tracked threads' context switches reach the programs: the value of the eBPF
/// `SWITCH_HOOK` map, set by user space before attaching and changed while recording
/// (`record --switch-hook auto`), one step at a time: TRACEPOINT, BOTH, PER_THREAD and back.
pub mod switch_hook {
    /// `sched_switch`'s BTF tracepoint, which runs on every context switch of the host.
    pub const TRACEPOINT: u32 = 0;
    /// A software context-switch perf event on each tracked thread (inherited by the threads
    /// it creates); switch-ins from the scheduler's `sched_info.last_arrival`.
    pub const PER_THREAD: u32 = 1;
    /// During a move between the two, while both are attached: the tracepoint sees every
    /// switch, and the events count a switch-out again only if the tracepoint's program did
    /// not (it read the mode before it changed): `ThreadStats::runs_counted` tells.
    pub const BOTH: u32 = 2;
}

/// Indices of the eBPF `CONTROL` array: switches user space flips while recording.
pub mod control {
    /// Non-zero once the recording is ending: the CUDA probes send and count nothing more.
    pub const STOPPED: u32 = 0;
    /// Non-zero while the launch probes' on-period is credited: launches count only then.
    pub const LAUNCHES_COUNTED: u32 = 1;
    pub const ENTRIES: u32 = 2;
}

/// Ring-buffer record kinds; the first `u32` of every record.
/// [`ThreadStats::offcpu_pending`]: a sampled off-CPU period waits for its waker and its end.
/// How many off-CPU periods of a thread in a row may be sampled closer together than the
/// sampling interval: a wait that follows a short one (a lock inside a CUDA call, then the
/// socket read the server really waits in) is not missed for coming too soon after it.
pub const OFFCPU_SAMPLE_BURST: u64 = 4;

pub const OFFCPU_PENDING: u32 = 1;
/// [`ThreadStats::offcpu_pending`]: its waker was sent; its end is still to come.
pub const OFFCPU_WOKEN: u32 = 2;

pub mod kind {
    pub const CPU_SAMPLE: u32 = 1;
    pub const OFFCPU_SAMPLE: u32 = 2;
    pub const BLOCK_IO: u32 = 3;
    pub const THREAD_EXIT: u32 = 4;
    pub const THREAD_NEW: u32 = 5;
    pub const EXEC: u32 = 6;
    /// End of a sampled off-CPU period (the thread was woken): a bare `Header`.
    pub const OFFCPU_END: u32 = 7;
    /// A CUDA or NCCL call of a tracked thread, entry to return: a `CudaCall`.
    pub const CUDA_CALL: u32 = 8;
    /// No record: a counter of threads created in the tracked tree that could not be
    /// tracked (every slot in use), each counted attempted and dropped.
    pub const THREAD_UNTRACKED: u32 = 9;
    /// A copy of the top of a thread's user stack and its registers: a `UserStack`, sent just
    /// before the sample it belongs to (same TID and timestamp), and only `len` bytes of
    /// `bytes` long.
    pub const USER_STACK: u32 = 10;
    /// The Python frames a thread of a CPython process was running: a `PyStack`, sent just
    /// before the sample or CUDA call it belongs to (same TID and timestamp).
    pub const PY_STACK: u32 = 11;
    /// Who woke a tracked thread from a sampled off-CPU period: a `Woken`, sent from the
    /// waker's context (`sched_waking`) before the period's `OFFCPU_END`.
    pub const WOKEN: u32 = 12;
    /// No record: stack copies left out because the ring buffer was filling (the reader
    /// behind): the sample went with its frame-pointer stack. Thinned, not lost.
    pub const USER_STACK_THINNED: u32 = 13;
    /// No record: on-CPU samples not taken because the ring buffer was half full.
    pub const CPU_SAMPLE_THINNED: u32 = 14;
    /// No record: off-CPU periods not sampled because the ring buffer was half full.
    pub const OFFCPU_SAMPLE_THINNED: u32 = 15;
    /// One past the largest kind: the length of the per-kind counter arrays.
    pub const COUNT: u32 = 16;

    /// The counters of what was thinned end in this: each counts records never sent.
    pub const THINNED_SUFFIX: &str = "_thinned";

    pub const NAMES: [&str; COUNT as usize] = [
        "none",
        "cpu_sample",
        "offcpu_sample",
        "block_io",
        "thread_exit",
        "thread_new",
        "exec",
        "offcpu_end",
        "cuda_call",
        "thread_untracked",
        "user_stack",
        "py_stack",
        "woken",
        "user_stack_thinned",
        "cpu_sample_thinned",
        "offcpu_sample_thinned",
    ];
}

/// Prefix of every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub kind: u32,
    pub tid: u32,
    pub pid: u32,
    pub cpu: u32,
    pub ts_ns: u64,
}

pub const MAX_USER_FRAMES: usize = 127;
pub const MAX_KERNEL_FRAMES: usize = 64;

/// A sampled stack. `user_len`/`kernel_len` are byte counts as returned by `bpf_get_stack`
/// (negative: the helper's error). Frames are leaf first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Stack {
    pub user_len: i32,
    pub kernel_len: i32,
    pub user: [u64; MAX_USER_FRAMES],
    pub _pad: u64,
    pub kernel: [u64; MAX_KERNEL_FRAMES],
}

/// The most user stack `UserStack` copies: code built without frame pointers is unwound from
/// these bytes with its DWARF CFI, in user space. perf's default for `--call-graph dwarf` is
/// 8 KiB; CPython's evaluation loop and libtorch take more per frame.
pub const STACK_COPY_BYTES: usize = 16384;

/// The fixed part of a `UserStack`: the user registers an unwinder starts from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UserStackHead {
    pub header: Header,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The link register (aarch64's x30): a leaf function's return address, which it keeps
    /// there and never stores. 0 on x86-64, where every return address is on the stack.
    pub lr: u64,
    /// Where a return probe (on a probed CUDA call the thread is inside) replaced a return
    /// address on this stack with its trampoline's, and the address it replaced; 0 if none.
    pub ret_slot: u64,
    pub ret_addr: u64,
    /// Bytes of `bytes` copied from `sp` up; 0 when none could be read.
    pub len: u32,
    pub _pad: u32,
}

/// `kind::USER_STACK`: the user registers and the stack above `sp`. Sent with its head plus
/// `head.len` bytes only.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UserStack {
    pub head: UserStackHead,
    pub bytes: [u8; STACK_COPY_BYTES],
}

/// The most Python frames a `PyStack` holds, shim frames included; a deeper stack keeps its
/// innermost frames.
pub const MAX_PY_FRAMES: usize = 128;

/// One Python frame as the kernel found it: the code object's address and where in it the
/// frame was (`f_lasti` before 3.11, the instruction pointer from 3.11). User space reads
/// the code object for the function, file and line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrame {
    /// The code object's address, with marks in its low bits (objects are aligned):
    /// `PY_FRAME_ENTRY` on the outermost frame that one C call of the interpreter loop
    /// (`_PyEval_EvalFrameDefault`) evaluates, `PY_FRAME_SHIM` on the shim frame such a call
    /// pushes below its first frame (3.12+), which is no Python function.
    pub code: u64,
    pub instr: u64,
}

/// `PyFrame::code`'s marks.
pub const PY_FRAME_ENTRY: u64 = 1;
pub const PY_FRAME_SHIM: u64 = 2;
pub const PY_FRAME_MARKS: u64 = PY_FRAME_ENTRY | PY_FRAME_SHIM;

/// `kind::PY_STACK`: a thread's Python frames, innermost first. Sent with its fixed part and
/// `len` frames only.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyStack {
    pub header: Header,
    pub len: u32,
    /// Non-zero when the walk stopped before the outermost frame (too deep, or a frame
    /// could not be read).
    pub truncated: u32,
    pub frames: [PyFrame; MAX_PY_FRAMES],
}

/// `PyProcess::entry_rule`: how the walk finds where one C call of the interpreter loop
/// ends. Before 3.11 every Python call is one C call.
pub mod py_entry {
    /// Every frame (3.8 to 3.10).
    pub const EVERY_FRAME: u32 = 0;
    /// A frame whose `is_entry` byte is set (3.11).
    pub const FLAG: u32 = 1;
    /// The frame below a shim frame whose `owner` byte is `owner_cstack` (3.12+).
    pub const SHIM: u32 = 2;
}

/// Not present: an offset field of `PyProcess` that a version lacks.
pub const PY_NONE: u32 = u32::MAX;

/// Where a CPython process keeps what the kernel's Python walk reads: offsets into its
/// thread state and frame structs (the value of `PY_PROCS`, keyed by PID).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcess {
    /// In the thread state: the frame pointer (before 3.11, and 3.13+) or the `_PyCFrame`
    /// pointer (3.11, 3.12).
    pub tstate_frame: u32,
    /// In `_PyCFrame`: `current_frame`; `PY_NONE` where there is no `_PyCFrame`.
    pub cframe_current_frame: u32,
    pub frame_code: u32,
    pub frame_previous: u32,
    pub frame_instr: u32,
    /// `is_entry` (3.11) or `owner` (3.12+); `PY_NONE` before 3.11.
    pub frame_owner: u32,
    /// A `py_entry` rule.
    pub entry_rule: u32,
    pub owner_cstack: u32,
}

/// `kind::CPU_SAMPLE`: a perf-event cpu-clock tick that found a tracked thread on-CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CpuSample {
    pub header: Header,
    pub stack: Stack,
}

/// `kind::OFFCPU_SAMPLE`: where a tracked thread was when it blocked, sent at switch-out
/// (`header.ts_ns`). Its end comes later as a `kind::OFFCPU_END` header for the same TID; the
/// user stack can only be read while the thread is current, hence two records.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OffCpuSample {
    pub header: Header,
    /// `state::IO_WAIT` or `state::BLOCKED`.
    pub state: u32,
    /// The system call it blocked in, as its number plus one; 0 when it blocked outside one
    /// (a page fault) or the kernel's register layout is unknown (see [`Offsets::regs_syscall`]).
    pub syscall: u32,
    /// That call's first argument (a file descriptor, a futex's address, a clock).
    pub arg0: u64,
    pub stack: Stack,
}

/// `kind::WOKEN`: the task that woke a tracked thread (`header.tid`, `header.pid`) from a
/// sampled off-CPU period, at `header.ts_ns`: the task current where the wake-up ran, which in
/// an interrupt or a timer is whichever task it interrupted (the idle task's TID 0 on an idle
/// CPU), and the kernel stack there, which tells those apart (`hrtimer_wakeup`,
/// `net_rx_action`, `blk_mq_end_request`, ...).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Woken {
    pub header: Header,
    pub waker_tid: u32,
    pub waker_pid: u32,
    pub waker_comm: [u8; 16],
    /// Bytes of `kernel` filled, as `bpf_get_stack` returns them (negative: its error).
    pub kernel_len: i32,
    pub _pad: u32,
    pub kernel: [u64; MAX_KERNEL_FRAMES],
}

/// `kind::BLOCK_IO`: one completed block request. `header.tid`/`pid` is the thread that
/// submitted the first bio of the request (completion runs in IRQ context), `header.ts_ns` the
/// time that bio was queued.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockIo {
    pub header: Header,
    pub dev: u32,
    /// Non-zero for writes.
    pub write: u32,
    pub sector: u64,
    pub bytes: u64,
    /// From bio queued to request issued to the driver.
    pub queue_ns: u64,
    /// From issue to completion: the device's service time.
    pub service_ns: u64,
    pub error: i32,
    pub _pad: u32,
}

/// `kind::THREAD_EXIT`: a tracked thread's final accounting, sent from `sched_process_exit`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadExit {
    pub header: Header,
    pub comm: [u8; 16],
    pub stats: ThreadStats,
}

/// `kind::THREAD_NEW` (fork or clone of a tracked thread; `header.tid` is the child) and
/// `kind::EXEC` (a tracked process replaced its image; user space re-reads its maps).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadNew {
    pub header: Header,
    pub parent_tid: u32,
    /// The new thread's slot number (0 for an exec, which keeps its slot).
    pub slot: u32,
}

/// Bits of a CUDA/NCCL uprobe's attach cookie: the low 32 bits name the API (user space's
/// table), the flags below say what the probes must read.
pub mod cookie {
    /// The API returns its result through the pointer in its first argument
    /// (`cuMemHostAlloc(void **pp, ...)`): read `*arg0` at return.
    pub const OUT_PTR: u64 = 1 << 32;
    /// The third argument points at one passed by reference (AAPCS64 passes a composite
    /// over 16 bytes so: `ncclCommInitRank`'s `ncclUniqueId`): read its first 8 bytes at
    /// entry into the seventh slot, where x86-64's stack has them.
    pub const ARG2_BY_REF: u64 = 1 << 33;
}

/// Argument slots a CUDA/NCCL record carries: the six integer registers and the first stack
/// slot (NCCL collectives take their stream seventh).
pub const CALL_ARGS: usize = 7;

/// A tracked thread inside a probed CUDA/NCCL function, between its entry and return: the
/// value of the `CUDA_INFLIGHT` map (key: TID).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallEntry {
    pub start_ns: u64,
    /// The attach cookie of the outermost probed call.
    pub cookie: u64,
    /// The stack pointer at entry: a call at the same or a shallower depth means this entry's
    /// return was never seen (a detach mid-call), so it is stale.
    pub sp: u64,
    /// Probed calls made from inside this one (cudart into the driver), not reported apart.
    pub nested: u32,
    pub _pad: u32,
    pub caller: u64,
    pub args: [u64; CALL_ARGS],
}

/// `kind::CUDA_CALL`: one outermost probed call; `header.ts_ns` is its entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaCall {
    pub header: Header,
    pub end_ns: u64,
    pub cookie: u64,
    pub nested: u32,
    pub _pad: u32,
    /// The return address at entry: the caller, where frame-pointer stacks fail.
    pub caller: u64,
    pub args: [u64; CALL_ARGS],
    /// The return value (`CUresult`, `ncclResult_t`).
    pub ret: u64,
    /// `*args[0]` at return, for `cookie::OUT_PTR` APIs; 0 otherwise or when unreadable.
    pub out: u64,
}

/// Key of the `PAGE_CACHE_FILES` map: page-cache misses per thread and file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub tid: u32,
    pub dev: u32,
    pub ino: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileMisses {
    pub pages: u64,
    pub bytes: u64,
}

/// Key of the in-flight block-IO map: the kernel's own identity of a bio/request start.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IoKey {
    pub dev: u32,
    pub _pad: u32,
    pub sector: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStart {
    pub tid: u32,
    pub pid: u32,
    pub queued_ns: u64,
    pub issued_ns: u64,
}

/// Per-kind event counters (a per-CPU array indexed by `kind`): every record the kernel
/// tried to send is `attempted`; the ones the ring buffer refused are `dropped`. User space
/// checks `received + dropped == attempted`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventCounts {
    pub attempted: u64,
    pub dropped: u64,
}

/// Offsets the programs need, read by user space from BTF and tracefs before load.
/// Classic tracepoint fields are offsets into the raw record; `task_*` are offsets into
/// `struct task_struct`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    /// Byte holding the `in_iowait` bitfield, and the bit's mask within that byte.
    pub task_in_iowait_byte: u32,
    pub task_in_iowait_mask: u32,
    /// `sector` in `block_io_start` (or `block_bio_queue`, whichever is attached).
    pub submit_sector: u32,
    pub rq_issue_dev: u32,
    pub rq_issue_sector: u32,
    pub rq_complete_dev: u32,
    pub rq_complete_sector: u32,
    pub rq_complete_nr_sector: u32,
    pub rq_complete_error: u32,
    pub rq_complete_rwbs: u32,
    pub filemap_ino: u32,
    pub filemap_dev: u32,
    pub filemap_order: u32,
    /// `task_struct.sched_info.run_delay`; 0 when the kernel has no sched_info.
    pub task_run_delay: u32,
    /// For per-thread switch events (see [`switch_hook`]): `task_struct.__state`;
    /// `task_struct.sched_info.last_arrival` and `.pcount` (when the task last got a CPU, on
    /// its run queue's clock, and how many times it has); `task_struct.se.cfs_rq`,
    /// `cfs_rq.rq` and `rq.clock` (the run queue's clock, read at a switch-out, when the
    /// scheduler has just updated it). `rq_clock` is 0 when any of them is missing.
    pub task_state: u32,
    pub task_last_arrival: u32,
    pub task_pcount: u32,
    pub task_cfs_rq: u32,
    pub cfs_rq_rq: u32,
    pub rq_clock: u32,
    /// In `struct pt_regs`, the user registers saved at kernel entry: the system call's
    /// number (x86-64 `orig_ax`, arm64 `syscallno`, read as 32 bits: negative outside a call)
    /// and its first argument (`di`, `orig_x0`); 0 when BTF lacks them.
    pub regs_syscall: u32,
    pub regs_arg0: u32,
}

/// Tunables set by user space before load.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Mean spacing of off-CPU stack captures per thread, with bursts of up to
    /// [`OFFCPU_SAMPLE_BURST`]; 0 captures every block.
    pub offcpu_sample_interval_ns: u64,
    pub page_size: u64,
    /// Non-zero: send a `UserStack` before each stack sample, for DWARF unwinding.
    pub copy_user_stack: u32,
    /// Non-zero: send a `PyStack` before each stack sample and CUDA call of a thread that
    /// `PY_THREADS` knows.
    pub python_stacks: u32,
    /// Non-zero: `sched_switch` has its `prev_state` argument (Linux 5.18); else the
    /// program reads the task's state field.
    pub prev_state_arg: u32,
    pub _pad: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            offcpu_sample_interval_ns: 5_000_000,
            page_size: 4096,
            copy_user_stack: 1,
            python_stacks: 1,
            prev_state_arg: 1,
            _pad: 0,
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all of these are repr(C), made only of integers with explicit padding, so every
    // bit pattern is valid.
    unsafe impl aya::Pod for ThreadStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for CpuSlot {}
    // SAFETY: as above.
    unsafe impl aya::Pod for FileKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for FileMisses {}
    // SAFETY: as above.
    unsafe impl aya::Pod for EventCounts {}
    // SAFETY: as above.
    unsafe impl aya::Pod for Offsets {}
    // SAFETY: as above.
    unsafe impl aya::Pod for Config {}
    // SAFETY: as above.
    unsafe impl aya::Pod for PyProcess {}
    // SAFETY: as above.
    unsafe impl aya::Pod for IoKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for IoStart {}
    // SAFETY: as above.
    unsafe impl aya::Pod for CallEntry {}
}

const _: () =
    assert!(core::mem::offset_of!(UserStack, bytes) == core::mem::size_of::<UserStackHead>());
