//! Maps and load-time globals shared by every program.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf, Stack},
};
use profiler_common::{
    CallEntry, Config, CpuSlot, EventCounts, FileKey, FileMisses, IoKey, IoStart, MAX_SLOTS,
    Offsets, PyProcess, PyStack, TIDS_PER_ELEMENT, ThreadStats, UserStack, kind,
};

/// The tracked threads' accounting, one entry per slot (slot number = index + 1). An array,
/// not a hash keyed by TID: the verifier inlines an array lookup into a bounds check and an
/// add, where a hash lookup hashes the key and walks a bucket, and a tracked context switch
/// looks up two threads.
#[map]
pub static SLOTS: Array<ThreadStats> = Array::with_max_entries(MAX_SLOTS, 0);

/// Free slot numbers. A stack, so that the slots in use stay the lowest ones, which is all
/// user space reads on each tick. User space sizes it and `SLOTS` alike (`--max-threads`)
/// and fills it, after the slots it seeds.
#[map]
pub static FREE_SLOTS: Stack<u32> = Stack::with_max_entries(MAX_SLOTS, 0);

/// Each TID's slot number, 0 when untracked: four TIDs per element, as `u16` lanes, so that
/// the largest `pid_max` (2^22) takes 8 MiB. Sized by user space to cover `pid_max`. A lane
/// is written with a 16-bit store, so setting one never races with another CPU writing its
/// neighbour.
#[map]
pub static TRACKED: Array<[u16; TIDS_PER_ELEMENT as usize]> = Array::with_max_entries(1, 0);

/// `tid`'s slot number, 0 when it is untracked.
#[inline(always)]
pub fn slot_of(tid: u32) -> u32 {
    match TRACKED.get_ptr(tid / TIDS_PER_ELEMENT) {
        // SAFETY: an element of an array map, valid for the program's run; the lane index is
        // within the element.
        Some(lanes) => u32::from(unsafe { (*lanes)[(tid % TIDS_PER_ELEMENT) as usize] }),
        None => 0,
    }
}

/// Whether `TRACKED` has a lane for `tid`.
#[inline(always)]
pub fn covered(tid: u32) -> bool {
    TRACKED.get_ptr(tid / TIDS_PER_ELEMENT).is_some()
}

#[inline(always)]
pub fn set_slot(tid: u32, slot: u32) {
    if let Some(lanes) = TRACKED.get_ptr_mut(tid / TIDS_PER_ELEMENT) {
        // SAFETY: as in `slot_of`.
        unsafe { (*lanes)[(tid % TIDS_PER_ELEMENT) as usize] = slot as u16 };
    }
}

/// The accounting of slot number `slot`; null for 0 (untracked). A plain pointer rather than
/// an `Option` (see `sched_switch`).
#[inline(always)]
pub fn slot_stats(slot: u32) -> *mut ThreadStats {
    if slot == 0 {
        return core::ptr::null_mut();
    }
    SLOTS.get_ptr_mut(slot - 1).unwrap_or(core::ptr::null_mut())
}

/// The accounting of `tid`, if it is tracked.
#[inline(always)]
pub fn thread_stats(tid: u32) -> Option<*mut ThreadStats> {
    let st = slot_stats(slot_of(tid));
    (!st.is_null()).then_some(st)
}

/// Per CPU: the task last switched in and its slot. A `prev` that matches it costs no lookup;
/// one that does not (a switch the kernel did not report) is looked up by its TID, so a
/// missed event cannot hide a tracked thread's switch-out.
#[map]
pub static CPU_CURRENT: PerCpuArray<CpuSlot> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU: `bpf_ktime_get_ns` less the run queue's clock, as measured at the last tracked
/// switch-out there whose switch-in went unseen (always, with per-thread switch events), when
/// the scheduler had just updated that
/// clock (index 0: the gap, as a wrapping difference; index 1: non-zero once measured).
/// Elsewhere the run queue's clock may be a whole scheduler tick old; this turns the
/// scheduler's `last_arrival` into our clock.
#[map]
pub static CLOCK_GAP: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

/// How tracked threads' switches reach us (`profiler_common::switch_hook`), set by user space
/// after load and changed while recording (see profiler's `switch_control.rs`): a map, not
/// .rodata.
#[map]
pub static SWITCH_HOOK: Array<u32> = Array::with_max_entries(1, 0);

#[inline(always)]
fn switch_mode() -> u32 {
    SWITCH_HOOK
        .get(0)
        .copied()
        .unwrap_or(profiler_common::switch_hook::TRACEPOINT)
}

/// Whether only per-thread events see tracked threads' switches, so that no switch-in is
/// seen and no CPU's record is kept.
#[inline(always)]
pub fn per_thread_switches() -> bool {
    switch_mode() == profiler_common::switch_hook::PER_THREAD
}

/// Whether the `sched_switch` program accounts switches (alone, or during a move).
#[inline(always)]
pub fn tracepoint_sees_switches() -> bool {
    switch_mode() != profiler_common::switch_hook::PER_THREAD
}

/// Whether the per-thread events' program accounts switch-outs (alone, or during a move).
#[inline(always)]
pub fn events_see_switches() -> bool {
    switch_mode() != profiler_common::switch_hook::TRACEPOINT
}

/// Per CPU: the tracked threads' switch-outs accounted, whichever hook saw them. User space
/// weighs their rate against the host's to keep the cheaper hook.
#[map]
pub static SWITCHES_OUT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU: the user stack copy being built, too large for the BPF stack and sent with only
/// the bytes it holds (a ring-buffer reservation has a fixed size).
#[map]
pub static STACK_COPY: PerCpuArray<UserStack> = PerCpuArray::with_max_entries(1, 0);

/// Per thread (by TID): one byte past the highest stack address its user-space unwinding
/// needed, as user space learned it from a complete walk of an earlier copy (see
/// `send_user_stack`). LRU: user space removes a thread's entry when it exits; a TID reused
/// before that gets short copies until user space reads one whose walk ran off its end (the
/// next drain) and removes the entry.
#[map]
pub static STACK_ENDS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);

/// Per CPU: the Python stack being read, sent with only the frames it holds.
#[map]
pub static PY_STACK_COPY: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

/// The ring buffer's size: what the reader may fall behind by before records are thinned
/// (a quarter, half) or refused.
pub const EVENTS_BYTES: u32 = 8 * 1024 * 1024;

#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

#[map]
pub static COUNTS: PerCpuArray<EventCounts> = PerCpuArray::with_max_entries(kind::COUNT, 0);

/// Bios of tracked threads between queueing and completion. LRU because a bio merged into
/// another request never completes under its own key.
#[map]
pub static INFLIGHT_IO: LruHashMap<IoKey, IoStart> = LruHashMap::with_max_entries(16384, 0);

/// Tracked threads inside a probed CUDA/NCCL call. LRU: a thread that exits mid-call never
/// returns.
#[map]
pub static CUDA_INFLIGHT: LruHashMap<u32, CallEntry> = LruHashMap::with_max_entries(16384, 0);

/// Kernel launches per tracked thread and entry point (key: TID << 32 | the probe's cookie,
/// an index into user space's API table) since first counted.
#[map]
pub static LAUNCHES: LruHashMap<u64, u64> = LruHashMap::with_max_entries(16384, 0);

/// Index 0 ([`profiler_common::control::STOPPED`]): non-zero once user space is ending the
/// recording. Removing uprobes takes a grace period each, so they are removed after the
/// recording is complete; until then this keeps them from sending (or counting) anything.
/// Index 1 ([`profiler_common::control::LAUNCHES_COUNTED`]): non-zero while a launch
/// on-period is being credited. Opening and closing the launch probes takes far longer than
/// an on-period on a real libcudart (a probe stayed live for 0.4 s of a 20 ms on-period on an
/// H200 host, and the launch rate read 50 times the job's), so launches count only between
/// the moments user space credits.
#[map]
pub static CONTROL: aya_ebpf::maps::Array<u32> =
    aya_ebpf::maps::Array::with_max_entries(profiler_common::control::ENTRIES, 0);

/// Whether the recording is ending (see [`CONTROL`]): a program that may still be attached
/// after the last read of the ring (uprobes, classic tracepoints: their removal is left to a
/// helper process) sends nothing from then on.
#[inline(always)]
pub fn stopped() -> bool {
    CONTROL
        .get(profiler_common::control::STOPPED)
        .is_some_and(|v| *v != 0)
}

/// Traced CPython processes, by PID: where their interpreter keeps a thread's frames.
#[map]
pub static PY_PROCS: HashMap<u32, PyProcess> = HashMap::with_max_entries(4096, 0);

/// Each thread of a traced CPython process, by TID: the address of its `PyThreadState`,
/// found by user space walking the interpreter's thread list.
#[map]
pub static PY_THREADS: HashMap<u32, u64> = HashMap::with_max_entries(65536, 0);

/// Processes that loaded or unloaded a library since user space last looked (dlopen.rs).
#[map]
pub static MAPS_CHANGED: HashMap<u32, u8> = HashMap::with_max_entries(4096, 0);

#[map]
pub static PAGE_CACHE_FILES: HashMap<FileKey, FileMisses> = HashMap::with_max_entries(16384, 0);

#[unsafe(no_mangle)]
pub static OFFSETS: Offsets = Offsets {
    task_pid: 0,
    task_tgid: 0,
    task_in_iowait_byte: 0,
    task_in_iowait_mask: 0,
    submit_sector: 0,
    rq_issue_dev: 0,
    rq_issue_sector: 0,
    rq_complete_dev: 0,
    rq_complete_sector: 0,
    rq_complete_nr_sector: 0,
    rq_complete_error: 0,
    rq_complete_rwbs: 0,
    filemap_ino: 0,
    filemap_dev: 0,
    filemap_order: 0,
    task_run_delay: 0,
    task_state: 0,
    task_last_arrival: 0,
    task_pcount: 0,
    task_cfs_rq: 0,
    cfs_rq_rq: 0,
    rq_clock: 0,
    regs_syscall: 0,
    regs_arg0: 0,
};

#[unsafe(no_mangle)]
pub(crate) static CONFIG: Config = Config {
    offcpu_sample_interval_ns: 5_000_000,
    page_size: 4096,
    copy_user_stack: 1,
    python_stacks: 1,
    prev_state_arg: 1,
    _pad: 0,
};

/// One field of the offsets user space wrote: a volatile read of that field alone, so the
/// compiler cannot fold the zero initialiser in, and a program loads only what it uses (a
/// read of the whole struct cost every context switch seventeen loads).
macro_rules! offset {
    ($field:ident) => {{
        // Used inside other unsafe blocks too, where this one is redundant.
        #[allow(unused_unsafe)]
        // SAFETY: a plain read of a global that user space rewrites before load.
        let value = unsafe { core::ptr::read_volatile(&raw const $crate::maps::OFFSETS.$field) };
        value
    }};
}
pub(crate) use offset;

/// One field of the configuration user space wrote, read alone (see [`offset!`]): the
/// off-CPU sampling interval is read on every tracked switch-out.
macro_rules! config {
    ($field:ident) => {{
        #[allow(unused_unsafe)]
        // SAFETY: a plain read of a global that user space rewrites before load.
        let value = unsafe { core::ptr::read_volatile(&raw const $crate::maps::CONFIG.$field) };
        value
    }};
}
pub(crate) use config;

/// Whether `sched_switch` has its `prev_state` argument: one load on every switch, not the
/// whole of `CONFIG`.
#[inline(always)]
pub fn prev_state_arg() -> bool {
    config!(prev_state_arg) != 0
}
