//! The state file's `#[repr(C)]` layout. Every field is an atomic so that several processes may
//! map it at once; multi-field updates of one device happen under that device's spin lock
//! ([`DeviceState::lock_word`]).
//!
//! All timestamps are CLOCK_MONOTONIC nanoseconds (the device clock). Time is cut into buckets of
//! [`BUCKET_NS`]; [`BUCKETS_PER_PERIOD`] buckets make one NVML sample period, so sample values are
//! exact sums of whole buckets, and [`PCIE_WINDOW_BUCKETS`] buckets make NVML's 20 ms PCIe
//! window. A zeroed file is a valid, empty state: the creator fills the config fields and then
//! sets `init` to [`INIT_READY`].
//!
//! | part      | size                        | holds                                        |
//! |-----------|-----------------------------|----------------------------------------------|
//! | header    | 32 bytes                    | magic, init flag, device count, clock offsets |
//! | devices   | `MAX_DEVICES` × 855,248 bytes | one [`DeviceState`] each; only the first `device_count` are used |
//!
//! | device part | size                      | holds                                          |
//! |-------------|---------------------------|------------------------------------------------|
//! | header      | 80 bytes                  | lock, PCIe link, throttle, union-busy tracker, totals (busy, SM-active, PCIe) |
//! | buckets     | `BUCKET_RING` × 40 bytes  | per-bucket busy ns (union over processes), SM-active ns (sum over kernels), PCIe tx/rx bytes |
//! | processes   | `MAX_PROCS` × 2,112 bytes | pid, live contexts, memory used, busy ns, open busy interval, the kernel running on each of its [`LANES`] lanes and its SM share, per-period busy ring |
//!
//! Unused devices cost nothing: the file is sparse and their pages are never touched.
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64};

/// "SIMGPU" plus the layout version in the low byte: bump it whenever this file changes.
pub const MAGIC: u64 = 0x5349_4d47_5055_0000 | 3;

/// Width of one accounting bucket: 3.33334 ms. 50 of them are 166.667 ms (NVML's 1/6 s sample
/// period on data-center boards) and 6 of them are 20.00004 ms (NVML's PCIe counter window).
pub const BUCKET_NS: u64 = 3_333_340;
pub const BUCKETS_PER_PERIOD: u64 = 50;
/// One NVML utilization sample period: 166,667 µs.
pub const PERIOD_NS: u64 = BUCKET_NS * BUCKETS_PER_PERIOD;
/// Buckets in NVML's PCIe throughput window (20 ms).
pub const PCIE_WINDOW_BUCKETS: u64 = 6;
/// Bucket ring length: 60 s of history.
pub const BUCKET_RING: usize = 18_000;
/// Process slots: at most this many processes may hold a context at once.
pub const MAX_PROCS: usize = 64;
/// Most simulated GPUs one machine (state file) can have.
pub const MAX_DEVICES: usize = 8;
/// Per-process ring of per-period busy time: 128 periods, about 21 s.
pub const PROC_PERIODS: usize = 128;
/// Kernels one process can run at once: one per [`crate::lane::Lane`].
pub const LANES: usize = 2;
/// `throttle_milli` of a GPU that runs at full speed.
pub const UNTHROTTLED_MILLI: u32 = 1000;

/// `init` values: never touched, being filled by its creator, ready.
pub const INIT_EMPTY: u32 = 0;
pub const INIT_BUSY: u32 = 1;
pub const INIT_READY: u32 = 2;

/// One accounting bucket. `tag` is the absolute bucket number plus one (0 = never used), so a
/// slot left over from an earlier lap of the ring reads as empty.
#[repr(C)]
pub struct Bucket {
    pub tag: AtomicU64,
    /// Nanoseconds in this bucket during which at least one kernel ran (any process).
    pub busy_ns: AtomicU64,
    /// SM-active nanoseconds: each kernel's overlap with the bucket times its SM share, summed
    /// over concurrent kernels (so it may exceed the bucket's length; readers cap it).
    pub sm_ns: AtomicU64,
    /// Copy bytes device to host (NVML "TX", seen from the GPU).
    pub tx_bytes: AtomicU64,
    /// Copy bytes host to device (NVML "RX").
    pub rx_bytes: AtomicU64,
}

/// Busy time of one process in one sample period; `tag` is the period number plus one.
#[repr(C)]
pub struct PeriodBusy {
    pub tag: AtomicU64,
    pub busy_ns: AtomicU64,
}

/// The kernel one lane of a process runs now.
#[repr(C)]
pub struct LaneSlot {
    /// Start of the kernel running on this lane, 0 when none.
    pub start_ns: AtomicU64,
    /// Its SM share in percent (0 to 100).
    pub sm_share_pct: AtomicU32,
    pub _reserved: AtomicU32,
}

/// One process holding at least one context. `pid == 0` marks a free slot.
#[repr(C)]
pub struct ProcSlot {
    pub pid: AtomicU32,
    /// Live contexts of this process (created plus retained primary contexts).
    pub contexts: AtomicU32,
    pub mem_used_bytes: AtomicU64,
    /// Total kernel time of this process since it registered: the union over its lanes, of
    /// closed busy intervals.
    pub busy_total_ns: AtomicU64,
    /// When the process's open busy interval began (the first of its lanes started), 0 while
    /// none of its lanes runs a kernel.
    pub union_start_ns: AtomicU64,
    /// Indexed by [`crate::lane::Lane::index`].
    pub lanes: [LaneSlot; LANES],
    /// Per-period busy time, the union over its lanes.
    pub periods: [PeriodBusy; PROC_PERIODS],
}

/// One simulated GPU.
#[repr(C)]
pub struct DeviceState {
    /// Spin lock word: pid of the holder, 0 when free.
    pub lock_word: AtomicU32,
    pub pcie_gen: AtomicU32,
    pub pcie_width: AtomicU32,
    pub pcie_max_gen: AtomicU32,
    pub pcie_max_width: AtomicU32,
    /// Kernels running now, over all processes and lanes; the device is busy while this is
    /// non-zero.
    pub active_kernels: AtomicU32,
    /// Kernel slowdown in thousandths ([`UNTHROTTLED_MILLI`] or 0: full speed).
    pub throttle_milli: AtomicU32,
    pub _reserved: AtomicU32,
    pub mem_total_bytes: AtomicU64,
    /// When `active_kernels` last went from 0 to 1.
    pub union_start_ns: AtomicU64,
    /// Total busy time (union over processes) of closed busy intervals.
    pub busy_total_ns: AtomicU64,
    /// SM-active time of ended kernels: each one's duration times its SM share, summed.
    pub sm_total_ns: AtomicU64,
    pub tx_total_bytes: AtomicU64,
    pub rx_total_bytes: AtomicU64,
    pub buckets: [Bucket; BUCKET_RING],
    pub procs: [ProcSlot; MAX_PROCS],
}

/// The whole file.
#[repr(C)]
pub struct StateFile {
    pub magic: AtomicU64,
    pub init: AtomicU32,
    /// Devices in use: `devices[..device_count]`.
    pub device_count: AtomicU32,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC at creation: fixed so that every process converts a
    /// period end to the same NVML timestamp (a cursor must match exactly).
    pub realtime_offset_ns: AtomicI64,
    /// CLOCK_BOOTTIME minus CLOCK_MONOTONIC at creation.
    pub boottime_offset_ns: AtomicI64,
    pub devices: [DeviceState; MAX_DEVICES],
}

/// Size of one device's part of the state file.
pub const DEVICE_STATE_BYTES: usize = std::mem::size_of::<DeviceState>();
/// Size of the state file in bytes.
pub const STATE_FILE_BYTES: usize = std::mem::size_of::<StateFile>();

const _: () = assert!(std::mem::size_of::<Bucket>() == 40);
const _: () = assert!(std::mem::size_of::<LaneSlot>() == 16);
const _: () = assert!(std::mem::size_of::<ProcSlot>() == 32 + LANES * 16 + PROC_PERIODS * 16);
const _: () = assert!(
    DEVICE_STATE_BYTES == 80 + BUCKET_RING * 40 + MAX_PROCS * (32 + LANES * 16 + PROC_PERIODS * 16),
    "the device header has implicit padding: fix the field order"
);
const _: () = assert!(
    STATE_FILE_BYTES == 32 + MAX_DEVICES * DEVICE_STATE_BYTES,
    "the file header has implicit padding: fix the field order"
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes the table at the top of this file states.
    #[test]
    fn sizes_match_the_documented_table() {
        assert_eq!(DEVICE_STATE_BYTES, 855_248);
        assert_eq!(std::mem::size_of::<ProcSlot>(), 2_112);
        assert_eq!(STATE_FILE_BYTES, 32 + 8 * 855_248);
    }
}
