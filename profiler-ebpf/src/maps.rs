//! Maps and load-time globals shared by every program.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use profiler_common::{
    CallEntry, Config, CpuSlot, EventCounts, FileKey, FileMisses, IoKey, IoStart, Offsets,
    ThreadStats, kind,
};

/// The tracked threads: seeded by user space, grown on fork, shrunk on exit. Being a key here
/// is what "tracked" means.
#[map]
pub static THREADS: HashMap<u32, ThreadStats> = HashMap::with_max_entries(65536, 0);

/// One flag per TID, set while the TID is a key of `THREADS`: a switch to an untracked thread,
/// most switches on a busy host, costs an array index instead of a hash lookup. Sized by
/// user space to the kernel's `pid_max` (capped); a TID past the end reads as "maybe
/// tracked" and takes the lookup. Each flag has its own element, so setting one never races
/// with another CPU clearing its neighbour.
#[map]
pub static TRACKED: Array<u32> = Array::with_max_entries(1, 0);

/// Whether `tid` may be a key of `THREADS`; `false` only when it is not.
#[inline(always)]
pub fn maybe_tracked(tid: u32) -> bool {
    TRACKED.get(tid).is_none_or(|flag| *flag != 0)
}

#[inline(always)]
pub fn set_tracked(tid: u32, tracked: bool) {
    if let Some(flag) = TRACKED.get_ptr_mut(tid) {
        // SAFETY: an element of an array map, valid for the program's run.
        unsafe { *flag = u32::from(tracked) };
    }
}

/// Per CPU: the task last switched in and whether it is tracked. An untracked `prev` that
/// matches it costs no hash lookup; one that does not (a switch the kernel did not report)
/// is looked up, so a missed event cannot hide a tracked thread's switch-out.
#[map]
pub static CPU_CURRENT: PerCpuArray<CpuSlot> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(8 * 1024 * 1024, 0);

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

/// Index 0: non-zero once user space is ending the recording. Removing uprobes takes a grace
/// period each, so they are removed after the recording is complete; until then this keeps
/// them from sending (or counting) anything.
#[map]
pub static CONTROL: aya_ebpf::maps::Array<u32> = aya_ebpf::maps::Array::with_max_entries(1, 0);

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
    _pad: 0,
};

#[unsafe(no_mangle)]
static CONFIG: Config = Config {
    offcpu_sample_interval_ns: 5_000_000,
    page_size: 4096,
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

#[inline(always)]
pub fn config() -> Config {
    // SAFETY: as for `offsets`.
    unsafe { core::ptr::read_volatile(&CONFIG) }
}
