//! Updates and reads of the shared state: what the CUDA side records and the NVML side snapshots.
//!
//! Busy time is tracked as unions. The device's: `active_kernels` counts kernels running now over
//! all processes and lanes, and a busy interval is closed (credited to buckets) when the count
//! drops to zero, so overlapping kernels count once, as NVML's "at least one kernel ran" does. A
//! process's: its busy interval opens when the first of its lanes starts a kernel and closes when
//! the last one ends (per-process utilization samples). SM-active time is a sum instead: every
//! kernel adds its duration times its SM share, whatever else runs (GPM's SM activity).
use std::sync::atomic::Ordering::Relaxed;

use crate::clock;
use crate::gpu::Gpu;
use crate::lane::Lane;
use crate::layout::{
    BUCKET_NS, BUCKET_RING, BUCKETS_PER_PERIOD, DeviceState, PERIOD_NS, PROC_PERIODS, ProcSlot,
    UNTHROTTLED_MILLI,
};
use crate::lock::{LockGuard, lock, pid_alive};
use crate::pcie::{Direction, PcieLink};
use crate::window::{ProcView, Snapshot, share_of, split_bytes, split_interval};

/// Buckets a snapshot covers: 128 sample periods (21 s), enough for the 120-period sample buffer
/// plus the period before it.
pub const SNAPSHOT_BUCKETS: u64 = PROC_PERIODS as u64 * BUCKETS_PER_PERIOD;

/// Device-cumulative counters read at one instant, kernels still running included up to
/// `now_ns`: what a GPM sample holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// CLOCK_MONOTONIC ns when they were read.
    pub now_ns: u64,
    /// Busy ns (union over processes and lanes).
    pub busy_ns: u64,
    /// SM-active ns (sum over kernels of duration times SM share).
    pub sm_active_ns: u64,
    /// Copy bytes device to host and host to device (counted when each copy completes).
    pub tx_bytes: u64,
    pub rx_bytes: u64,
}

impl DeviceState {
    fn guard(&self) -> LockGuard<'_> {
        lock(&self.lock_word)
    }

    fn slot_of(&self, pid: u32) -> Option<&ProcSlot> {
        if pid == 0 {
            return None;
        }
        self.procs.iter().find(|s| s.pid.load(Relaxed) == pid)
    }

    fn free_slot(&self) -> Option<&ProcSlot> {
        self.procs.iter().find(|s| s.pid.load(Relaxed) == 0)
    }

    /// Adds busy `[start_ns, end_ns)` to the bucket ring. Buckets already reused by a newer lap
    /// of the ring (interval older than 60 s) are left alone.
    fn credit_buckets(&self, start_ns: u64, end_ns: u64) {
        for (bucket, ns) in split_interval(start_ns, end_ns, BUCKET_NS) {
            if let Some(slot) = self.claim_bucket(bucket) {
                slot.busy_ns.fetch_add(ns, Relaxed);
            }
        }
    }

    /// Adds the SM-active time of a kernel with `share_pct` over `[start_ns, end_ns)` to the
    /// bucket ring; returns the total added (the same sum whether or not old buckets are gone).
    fn credit_sm_buckets(&self, start_ns: u64, end_ns: u64, share_pct: u32) -> u64 {
        let mut total = 0;
        for (bucket, ns) in split_interval(start_ns, end_ns, BUCKET_NS) {
            let part = share_of(ns, share_pct);
            total += part;
            if let Some(slot) = self.claim_bucket(bucket) {
                slot.sm_ns.fetch_add(part, Relaxed);
            }
        }
        total
    }

    /// The ring slot of `bucket`, cleared first if it still holds an older lap; `None` when
    /// a newer lap already reused it (the bucket is over 60 s old).
    fn claim_bucket(&self, bucket: u64) -> Option<&crate::layout::Bucket> {
        let slot = &self.buckets[(bucket % BUCKET_RING as u64) as usize];
        let tag = bucket + 1;
        let current = slot.tag.load(Relaxed);
        if current > tag {
            return None;
        }
        if current < tag {
            slot.tag.store(tag, Relaxed);
            slot.busy_ns.store(0, Relaxed);
            slot.sm_ns.store(0, Relaxed);
            slot.tx_bytes.store(0, Relaxed);
            slot.rx_bytes.store(0, Relaxed);
        }
        Some(slot)
    }

    fn credit_copy_buckets(&self, direction: Direction, start_ns: u64, end_ns: u64, bytes: u64) {
        for (bucket, part) in split_bytes(start_ns, end_ns, bytes) {
            let Some(slot) = self.claim_bucket(bucket) else {
                continue;
            };
            match direction {
                Direction::HostToDevice => slot.rx_bytes.fetch_add(part, Relaxed),
                Direction::DeviceToHost => slot.tx_bytes.fetch_add(part, Relaxed),
            };
        }
    }

    /// Ends the kernel on lane `lane` of `slot` (if one runs) at `now_ns`: credits its SM time,
    /// closes the process's busy interval when it was the process's last running lane, and the
    /// device's when it was the last kernel running anywhere. A kernel already ended (by a reap
    /// or an unregister racing the engine thread) is not ended twice.
    fn end_lane(&self, slot: &ProcSlot, lane: usize, now_ns: u64) {
        let cell = &slot.lanes[lane];
        let start = cell.start_ns.swap(0, Relaxed);
        if start == 0 {
            return;
        }
        let end = now_ns.max(start);
        let share = cell.sm_share_pct.load(Relaxed);
        let sm = self.credit_sm_buckets(start, end, share);
        self.sm_total_ns.fetch_add(sm, Relaxed);
        if slot.lanes.iter().all(|l| l.start_ns.load(Relaxed) == 0) {
            let union_start = slot.union_start_ns.swap(0, Relaxed);
            if union_start != 0 {
                close_process_interval(slot, union_start, end.max(union_start));
            }
        }
        let active = self.active_kernels.load(Relaxed);
        if active == 0 {
            return;
        }
        self.active_kernels.store(active - 1, Relaxed);
        if active == 1 {
            let start = self.union_start_ns.load(Relaxed);
            let end = now_ns.max(start);
            self.credit_buckets(start, end);
            self.busy_total_ns.fetch_add(end - start, Relaxed);
        }
    }

    /// Ends every kernel of `slot` (the process goes away).
    fn end_kernels(&self, slot: &ProcSlot, now_ns: u64) {
        for lane in 0..slot.lanes.len() {
            self.end_lane(slot, lane, now_ns);
        }
    }

    fn clear_slot(&self, slot: &ProcSlot) {
        slot.contexts.store(0, Relaxed);
        slot.mem_used_bytes.store(0, Relaxed);
        slot.busy_total_ns.store(0, Relaxed);
        slot.union_start_ns.store(0, Relaxed);
        for lane in &slot.lanes {
            lane.start_ns.store(0, Relaxed);
            lane.sm_share_pct.store(0, Relaxed);
        }
        for cell in &slot.periods {
            cell.tag.store(0, Relaxed);
            cell.busy_ns.store(0, Relaxed);
        }
        slot.pid.store(0, Relaxed);
    }

    /// SM-active ns of the kernels running now, from their starts to `now_ns`.
    fn running_sm_ns(&self, now_ns: u64) -> u64 {
        self.running_lanes()
            .map(|(start, share)| share_of(now_ns.saturating_sub(start), share))
            .sum()
    }

    /// (start, SM share) of every kernel running now, over all processes and lanes.
    fn running_lanes(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.procs
            .iter()
            .filter(|s| s.pid.load(Relaxed) != 0)
            .flat_map(|s| s.lanes.iter())
            .filter_map(|l| {
                let start = l.start_ns.load(Relaxed);
                (start != 0).then(|| (start, l.sm_share_pct.load(Relaxed)))
            })
    }
}

/// Credits a closed busy interval of a process: its total and its per-period ring.
fn close_process_interval(slot: &ProcSlot, start: u64, end: u64) {
    slot.busy_total_ns.fetch_add(end - start, Relaxed);
    for (period, ns) in split_interval(start, end, PERIOD_NS) {
        let cell = &slot.periods[(period % PROC_PERIODS as u64) as usize];
        if cell.tag.load(Relaxed) != period + 1 {
            cell.tag.store(period + 1, Relaxed);
            cell.busy_ns.store(0, Relaxed);
        }
        cell.busy_ns.fetch_add(ns, Relaxed);
    }
}

impl Gpu<'_> {
    /// Records that `pid` created (or retained) a context. Fails when all process slots are taken.
    pub fn register_process(&self, pid: u32) -> Result<(), String> {
        let _g = self.guard();
        if let Some(slot) = self.slot_of(pid) {
            slot.contexts.fetch_add(1, Relaxed);
            return Ok(());
        }
        let slot = self
            .free_slot()
            .ok_or_else(|| format!("all {} simgpu process slots are taken", self.procs.len()))?;
        self.clear_slot(slot);
        slot.contexts.store(1, Relaxed);
        slot.pid.store(pid, Relaxed);
        Ok(())
    }

    /// Records that `pid` destroyed a context; its slot is freed with its last context.
    pub fn unregister_process(&self, pid: u32) {
        let _g = self.guard();
        let Some(slot) = self.slot_of(pid) else {
            return;
        };
        if slot.contexts.load(Relaxed) <= 1 {
            self.end_kernels(slot, clock::monotonic_ns());
            self.clear_slot(slot);
        } else {
            slot.contexts.fetch_sub(1, Relaxed);
        }
    }

    /// Forgets `pid` entirely (process exit).
    pub fn forget_process(&self, pid: u32) {
        let _g = self.guard();
        if let Some(slot) = self.slot_of(pid) {
            self.end_kernels(slot, clock::monotonic_ns());
            self.clear_slot(slot);
        }
    }

    /// Frees the slots of processes that died without unregistering (SIGKILL, abort).
    pub fn reap_dead(&self) {
        let _g = self.guard();
        let now = clock::monotonic_ns();
        for slot in &self.procs {
            let pid = slot.pid.load(Relaxed);
            if pid != 0 && !pid_alive(pid) {
                self.end_kernels(slot, now);
                self.clear_slot(slot);
            }
        }
    }

    /// Charges `bytes` of device memory to `pid`; false when the device is full.
    pub fn try_alloc_mem(&self, pid: u32, bytes: u64) -> bool {
        let _g = self.guard();
        let used: u64 = self
            .procs
            .iter()
            .map(|s| s.mem_used_bytes.load(Relaxed))
            .sum();
        let total = self.mem_total_bytes.load(Relaxed);
        if used.saturating_add(bytes) > total {
            return false;
        }
        if let Some(slot) = self.slot_of(pid) {
            slot.mem_used_bytes.fetch_add(bytes, Relaxed);
        }
        true
    }

    /// Returns `bytes` of device memory charged to `pid`.
    pub fn free_mem(&self, pid: u32, bytes: u64) {
        let _g = self.guard();
        if let Some(slot) = self.slot_of(pid) {
            let used = slot.mem_used_bytes.load(Relaxed);
            slot.mem_used_bytes
                .store(used.saturating_sub(bytes), Relaxed);
        }
    }

    /// A kernel of `pid` starts on `lane` at `now_ns` (CLOCK_MONOTONIC), keeping `sm_share_pct`
    /// percent of the SMs active (capped at 100). Only a registered process (one holding a
    /// context) runs kernels; for any other pid this records nothing.
    pub fn kernel_begin(&self, pid: u32, lane: Lane, sm_share_pct: u32, now_ns: u64) {
        let _g = self.guard();
        let Some(slot) = self.slot_of(pid) else {
            return;
        };
        let cell = &slot.lanes[lane.index()];
        if cell.start_ns.load(Relaxed) != 0 {
            // One engine per lane: a second begin means the first end was lost.
            self.end_lane(slot, lane.index(), now_ns);
        }
        if slot.union_start_ns.load(Relaxed) == 0 {
            slot.union_start_ns.store(now_ns.max(1), Relaxed);
        }
        if self.active_kernels.load(Relaxed) == 0 {
            self.union_start_ns.store(now_ns, Relaxed);
        }
        self.active_kernels.fetch_add(1, Relaxed);
        cell.sm_share_pct.store(sm_share_pct.min(100), Relaxed);
        cell.start_ns.store(now_ns.max(1), Relaxed);
    }

    /// The kernel of `pid` running on `lane` ends at `now_ns`.
    pub fn kernel_end(&self, pid: u32, lane: Lane, now_ns: u64) {
        let _g = self.guard();
        if let Some(slot) = self.slot_of(pid) {
            self.end_lane(slot, lane.index(), now_ns);
        }
    }

    /// A copy of `bytes` ran over PCIe during `[start_ns, end_ns)`.
    pub fn copy_done(&self, direction: Direction, bytes: u64, start_ns: u64, end_ns: u64) {
        let _g = self.guard();
        self.credit_copy_buckets(direction, start_ns, end_ns, bytes);
        match direction {
            Direction::HostToDevice => self.rx_total_bytes.fetch_add(bytes, Relaxed),
            Direction::DeviceToHost => self.tx_total_bytes.fetch_add(bytes, Relaxed),
        };
    }

    /// The link the device is trained to now.
    pub fn pcie_link(&self) -> PcieLink {
        PcieLink {
            generation: self.pcie_gen.load(Relaxed),
            width: self.pcie_width.load(Relaxed),
        }
    }

    /// Retrains the link (a test can degrade it mid-run).
    pub fn set_pcie_link(&self, link: PcieLink) {
        let _g = self.guard();
        self.pcie_gen.store(link.generation, Relaxed);
        self.pcie_width.store(link.width, Relaxed);
    }

    /// How many times longer than asked kernels take on this GPU: 1.0 unless throttled.
    pub fn throttle_factor(&self) -> f64 {
        let milli = self.throttle_milli.load(Relaxed).max(UNTHROTTLED_MILLI);
        f64::from(milli) / f64::from(UNTHROTTLED_MILLI)
    }

    /// Throttles the GPU (kernels starting from now take `factor` times their duration, NVML
    /// shows a slowed SM clock and slowdown reasons), or ends the throttle with 1.0. Factors
    /// below 1 (or not finite) mean full speed; the factor keeps three decimals.
    pub fn set_throttle(&self, factor: f64) {
        let milli = if factor.is_finite() && factor > 1.0 {
            (factor * f64::from(UNTHROTTLED_MILLI))
                .round()
                .min(f64::from(u32::MAX)) as u32
        } else {
            UNTHROTTLED_MILLI
        };
        let _g = self.guard();
        self.throttle_milli.store(milli, Relaxed);
    }

    /// Total busy ns (union over processes) so far, including a busy interval still open.
    pub fn busy_total_ns(&self) -> u64 {
        self.totals().busy_ns
    }

    /// Total SM-active ns so far (each kernel's time times its SM share, summed over kernels),
    /// including kernels still running.
    pub fn sm_active_total_ns(&self) -> u64 {
        self.totals().sm_active_ns
    }

    /// The cumulative counters, read together now.
    pub fn totals(&self) -> Totals {
        let _g = self.guard();
        let now_ns = clock::monotonic_ns();
        let mut busy_ns = self.busy_total_ns.load(Relaxed);
        if self.active_kernels.load(Relaxed) > 0 {
            busy_ns += now_ns.saturating_sub(self.union_start_ns.load(Relaxed));
        }
        Totals {
            now_ns,
            busy_ns,
            sm_active_ns: self.sm_total_ns.load(Relaxed) + self.running_sm_ns(now_ns),
            tx_bytes: self.tx_total_bytes.load(Relaxed),
            rx_bytes: self.rx_total_bytes.load(Relaxed),
        }
    }

    /// A consistent copy of the last [`SNAPSHOT_BUCKETS`] buckets and all processes, taken now.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_at(clock::monotonic_ns())
    }

    /// As [`Gpu::snapshot`], at a given CLOCK_MONOTONIC time (not before the last
    /// update, or open intervals are clipped).
    pub fn snapshot_at(&self, now_ns: u64) -> Snapshot {
        self.snapshot_covering(now_ns, SNAPSHOT_BUCKETS)
    }

    /// A snapshot reaching `history_ns` back (at most the ring's 60 s), for utilization over
    /// older windows than the NVML sample buffer needs.
    pub fn snapshot_history(&self, history_ns: u64) -> Snapshot {
        let buckets = history_ns.div_ceil(BUCKET_NS) + 1;
        self.snapshot_covering(clock::monotonic_ns(), buckets)
    }

    fn snapshot_covering(&self, now_ns: u64, buckets: u64) -> Snapshot {
        let _g = self.guard();
        let buckets = buckets.clamp(1, BUCKET_RING as u64);
        let mut snap = Snapshot::empty(now_ns, buckets);
        for i in 0..snap.busy_ns.len() {
            let bucket = snap.first_bucket + i as u64;
            let slot = &self.buckets[(bucket % BUCKET_RING as u64) as usize];
            if slot.tag.load(Relaxed) == bucket + 1 {
                snap.busy_ns[i] = slot.busy_ns.load(Relaxed);
                snap.sm_ns[i] = slot.sm_ns.load(Relaxed);
                snap.tx_bytes[i] = slot.tx_bytes.load(Relaxed);
                snap.rx_bytes[i] = slot.rx_bytes.load(Relaxed);
            }
        }
        snap.kernel_active = self.active_kernels.load(Relaxed) > 0;
        if snap.kernel_active {
            snap.credit_busy(self.union_start_ns.load(Relaxed), now_ns);
        }
        for (start, share) in self.running_lanes().collect::<Vec<_>>() {
            snap.credit_sm(start, now_ns, share);
        }
        snap.throttle_milli = self.throttle_milli.load(Relaxed);
        snap.procs = self
            .procs
            .iter()
            .filter(|s| s.pid.load(Relaxed) != 0)
            .map(|s| proc_view(s, now_ns))
            .collect();
        snap.pcie = Some(self.pcie_link());
        snap.pcie_max = Some(PcieLink {
            generation: self.pcie_max_gen.load(Relaxed),
            width: self.pcie_max_width.load(Relaxed),
        });
        snap.mem_total_bytes = self.mem_total_bytes.load(Relaxed);
        snap.realtime_offset_ns = self.file().realtime_offset_ns.load(Relaxed);
        snap.boottime_offset_ns = self.file().boottime_offset_ns.load(Relaxed);
        snap
    }
}

/// Reads one process slot (under the lock), crediting its open busy interval up to `now_ns`.
fn proc_view(slot: &ProcSlot, now_ns: u64) -> ProcView {
    let newest = now_ns / PERIOD_NS;
    let first = newest.saturating_sub(PROC_PERIODS as u64 - 1);
    let mut view = ProcView {
        pid: slot.pid.load(Relaxed),
        mem_used_bytes: slot.mem_used_bytes.load(Relaxed),
        busy_total_ns: slot.busy_total_ns.load(Relaxed),
        first_period: first,
        period_busy_ns: (first..=newest)
            .map(|p| {
                let cell = &slot.periods[(p % PROC_PERIODS as u64) as usize];
                if cell.tag.load(Relaxed) == p + 1 {
                    cell.busy_ns.load(Relaxed)
                } else {
                    0
                }
            })
            .collect(),
    };
    let start = slot.union_start_ns.load(Relaxed);
    if start != 0 {
        view.busy_total_ns += now_ns.saturating_sub(start);
        for (period, ns) in split_interval(start, now_ns, PERIOD_NS) {
            if let Some(i) = period.checked_sub(first) {
                view.period_busy_ns[i as usize] += ns;
            }
        }
    }
    view
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::samples::{SampleClock, gpu_util_samples};
    use crate::shm::{InitConfig, SharedState};

    fn machine() -> SharedState {
        SharedState::anonymous(InitConfig::default()).unwrap()
    }

    const MS: u64 = 1_000_000;

    /// A time well past boot, at a period boundary.
    const T0: u64 = 50_000 * PERIOD_NS;

    #[test]
    fn overlapping_kernels_of_two_processes_count_once() {
        let state = machine();
        let dev = state.device(0).unwrap();
        dev.register_process(1).unwrap();
        dev.register_process(2).unwrap();
        dev.kernel_begin(1, Lane::Compute, 90, T0);
        dev.kernel_begin(2, Lane::Compute, 90, T0 + PERIOD_NS / 4);
        dev.kernel_end(1, Lane::Compute, T0 + PERIOD_NS / 2);
        dev.kernel_end(2, Lane::Compute, T0 + 3 * PERIOD_NS / 4);
        let snap = dev.snapshot_at(T0 + 2 * PERIOD_NS);
        assert_eq!(snap.period_busy_ns(T0 / PERIOD_NS), 3 * PERIOD_NS / 4);
        let per_pid: Vec<u64> = snap.procs.iter().map(|p| p.busy_total_ns).collect();
        assert_eq!(per_pid, vec![PERIOD_NS / 2, PERIOD_NS / 2]);
        assert_eq!(dev.busy_total_ns.load(Relaxed), 3 * PERIOD_NS / 4);
    }

    #[test]
    fn a_running_kernel_shows_in_snapshots() {
        let state = machine();
        let dev = state.device(0).unwrap();
        dev.register_process(7).unwrap();
        dev.kernel_begin(7, Lane::Compute, 90, T0);
        let snap = dev.snapshot_at(T0 + PERIOD_NS + PERIOD_NS / 2);
        assert!(snap.kernel_active);
        assert_eq!(snap.last_period_pct(), 100);
        assert_eq!(snap.procs[0].busy_total_ns, PERIOD_NS + PERIOD_NS / 2);
        let samples = gpu_util_samples(&snap, SampleClock::Boot, 0);
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].percent, 100);
    }

    #[test]
    fn two_lanes_of_one_process_count_once_in_busy_and_sum_in_sm() {
        let state = machine();
        let dev = state.device(0).unwrap();
        dev.register_process(5).unwrap();
        // Compute [0, 1/2) at 90%, comm [1/4, 3/4) at 15% of period T0.
        dev.kernel_begin(5, Lane::Compute, 90, T0);
        dev.kernel_begin(5, Lane::Comm, 15, T0 + PERIOD_NS / 4);
        dev.kernel_end(5, Lane::Compute, T0 + PERIOD_NS / 2);
        dev.kernel_end(5, Lane::Comm, T0 + 3 * PERIOD_NS / 4);
        let snap = dev.snapshot_at(T0 + 2 * PERIOD_NS);
        let period = T0 / PERIOD_NS;
        assert_eq!(snap.period_busy_ns(period), 3 * PERIOD_NS / 4);
        assert_eq!(snap.procs[0].busy_total_ns, 3 * PERIOD_NS / 4);
        assert_eq!(snap.procs[0].busy_in_period(period), 3 * PERIOD_NS / 4);
        let sm = share_of(PERIOD_NS / 2, 90) + share_of(PERIOD_NS / 2, 15);
        // Shares are taken per bucket piece, so rounding may lose a nanosecond or so.
        assert!(dev.sm_active_total_ns().abs_diff(sm) < 100);
        let raw: u64 = snap.sm_ns.iter().sum();
        assert!(raw.abs_diff(sm) < 100, "buckets hold the uncapped sum");
        // 90% for a quarter, 105% capped at 100% for a quarter, 15% for a quarter: 51.25%.
        let window = (T0, T0 + PERIOD_NS);
        assert_eq!(snap.sm_util_pct(window.0, window.1), 51);
        assert_eq!(dev.busy_total_ns(), 3 * PERIOD_NS / 4);
    }

    #[test]
    fn per_process_busy_is_the_union_of_its_lanes_with_gaps() {
        let state = machine();
        let dev = state.device(0).unwrap();
        dev.register_process(6).unwrap();
        dev.register_process(8).unwrap();
        // Pid 6: comm [0, 1/10), then compute [2/10, 3/10): a gap between them.
        dev.kernel_begin(6, Lane::Comm, 15, T0);
        dev.kernel_end(6, Lane::Comm, T0 + PERIOD_NS / 10);
        dev.kernel_begin(6, Lane::Compute, 90, T0 + 2 * PERIOD_NS / 10);
        // Pid 8's comm kernel spans pid 6's compute kernel and its end.
        dev.kernel_begin(8, Lane::Comm, 15, T0 + 2 * PERIOD_NS / 10);
        dev.kernel_end(6, Lane::Compute, T0 + 3 * PERIOD_NS / 10);
        dev.kernel_end(8, Lane::Comm, T0 + 5 * PERIOD_NS / 10);
        let snap = dev.snapshot_at(T0 + PERIOD_NS + 1);
        let busy: Vec<u64> = snap.procs.iter().map(|p| p.busy_total_ns).collect();
        assert_eq!(busy, vec![2 * PERIOD_NS / 10, 3 * PERIOD_NS / 10]);
        assert_eq!(snap.period_busy_ns(T0 / PERIOD_NS), 4 * PERIOD_NS / 10);
    }

    #[test]
    fn running_kernels_of_both_lanes_show_in_snapshots_and_totals() {
        let state = machine();
        let dev = state.device(0).unwrap();
        let me = std::process::id();
        dev.register_process(me).unwrap();
        let start = clock::monotonic_ns();
        dev.kernel_begin(me, Lane::Compute, 90, start);
        dev.kernel_begin(me, Lane::Comm, 15, start);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let snap = dev.snapshot();
        let elapsed = snap.now_ns - start;
        assert!(snap.kernel_active);
        assert_eq!(snap.procs[0].busy_total_ns, elapsed);
        // Whole buckets around the kernel, so that no bucket is apportioned.
        let (from, to) = (
            start / BUCKET_NS * BUCKET_NS,
            (snap.now_ns / BUCKET_NS + 1) * BUCKET_NS,
        );
        assert_eq!(snap.busy_between(from, to), elapsed);
        let raw: u64 = snap.sm_ns.iter().sum();
        let both = share_of(elapsed, 90) + share_of(elapsed, 15);
        assert!(raw.abs_diff(both) < 20, "{raw} against {both}");
        // 105% of the SMs in a bucket the kernels cover fully: capped at the bucket.
        let full = start / BUCKET_NS + 1;
        let (b0, b1) = (full * BUCKET_NS, (full + 1) * BUCKET_NS);
        assert_eq!(snap.sm_between(b0, b1), BUCKET_NS);
        let totals = dev.totals();
        let running = totals.now_ns - start;
        assert_eq!(totals.busy_ns, running);
        let sm = share_of(running, 90) + share_of(running, 15);
        assert_eq!(
            totals.sm_active_ns, sm,
            "the cumulative counter is not capped"
        );
        // A lost end: a second begin on the same lane ends the first kernel.
        dev.kernel_begin(me, Lane::Comm, 15, totals.now_ns);
        dev.kernel_end(me, Lane::Comm, totals.now_ns + 10);
        dev.kernel_end(me, Lane::Compute, totals.now_ns + 10);
        let ended = dev.totals();
        assert_eq!(ended.busy_ns, running + 10);
        assert!(!dev.snapshot().kernel_active);
    }

    #[test]
    fn throttle_is_per_gpu_and_can_be_lifted() {
        let config = InitConfig {
            devices: 2,
            ..InitConfig::default()
        };
        let state = SharedState::anonymous(config).unwrap();
        let (a, b) = (state.device(0).unwrap(), state.device(1).unwrap());
        assert_eq!(a.throttle_factor(), 1.0);
        a.set_throttle(2.5);
        assert_eq!(a.throttle_factor(), 2.5);
        assert_eq!(a.snapshot().throttle_factor(), 2.5);
        assert_eq!(b.throttle_factor(), 1.0);
        a.set_throttle(0.5);
        assert_eq!(a.throttle_factor(), 1.0, "no speed-ups");
        a.set_throttle(f64::NAN);
        assert!(!a.snapshot().throttled());
    }

    #[test]
    fn process_slots_count_contexts_and_memory() {
        let state = machine();
        let dev = state.device(0).unwrap();
        dev.register_process(9).unwrap();
        dev.register_process(9).unwrap();
        assert!(dev.try_alloc_mem(9, 1 << 30));
        assert!(
            !dev.try_alloc_mem(9, 80 << 30),
            "more than the device holds"
        );
        dev.unregister_process(9);
        assert_eq!(dev.snapshot().mem_used_bytes(), 1 << 30);
        dev.free_mem(9, 1 << 29);
        assert_eq!(dev.snapshot().mem_used_bytes(), 1 << 29);
        dev.unregister_process(9);
        assert!(dev.snapshot().procs.is_empty());
    }

    #[test]
    fn dead_processes_are_reaped_and_their_kernel_ended() {
        let state = machine();
        let dev = state.device(0).unwrap();
        let dead = 0x7fff_fff0;
        dev.register_process(dead).unwrap();
        dev.kernel_begin(dead, Lane::Compute, 90, clock::monotonic_ns());
        dev.reap_dead();
        let snap = dev.snapshot();
        assert!(snap.procs.is_empty());
        assert!(!snap.kernel_active);
    }

    #[test]
    fn copies_land_in_the_pcie_counters() {
        let state = machine();
        let dev = state.device(0).unwrap();
        let start = T0 + 10 * BUCKET_NS;
        dev.copy_done(Direction::HostToDevice, 3000, start, start + 3 * BUCKET_NS);
        dev.copy_done(Direction::DeviceToHost, 500, start, start);
        let snap = dev.snapshot_at(start + 4 * BUCKET_NS);
        let all = start - BUCKET_NS..start + 4 * BUCKET_NS;
        assert_eq!(
            snap.bytes_between(Direction::HostToDevice, all.start, all.end),
            3000
        );
        assert_eq!(
            snap.bytes_between(Direction::DeviceToHost, all.start, all.end),
            500
        );
        assert_eq!(dev.rx_total_bytes.load(Relaxed), 3000);
    }

    #[test]
    fn stale_ring_slots_read_as_empty() {
        let state = machine();
        let dev = state.device(0).unwrap();
        dev.register_process(3).unwrap();
        dev.kernel_begin(3, Lane::Compute, 90, T0);
        dev.kernel_end(3, Lane::Compute, T0 + BUCKET_NS);
        // 60 s later the same ring slot belongs to a new bucket.
        let later = T0 + BUCKET_RING as u64 * BUCKET_NS;
        let snap = dev.snapshot_at(later + 1);
        assert_eq!(snap.busy_ns.iter().sum::<u64>(), 0);
        assert_eq!(
            dev.snapshot_at(T0 + 2 * BUCKET_NS)
                .busy_ns
                .iter()
                .sum::<u64>(),
            BUCKET_NS
        );
    }

    #[test]
    fn history_reaches_back_a_minute() {
        let state = machine();
        let dev = state.device(0).unwrap();
        dev.register_process(4).unwrap();
        let start = T0 - 50_000 * MS;
        dev.kernel_begin(4, Lane::Compute, 90, start);
        dev.kernel_end(4, Lane::Compute, start + 1_000 * MS);
        let snap = dev.snapshot_covering(T0, 59_000 * MS / BUCKET_NS);
        assert!(snap.busy_between(start - MS, start + 2_000 * MS) >= 999 * MS);
        assert_eq!(snap.utilization_pct(start, start + 2_000 * MS), 50);
        let default = dev.snapshot_at(T0);
        assert_eq!(default.busy_ns.iter().sum::<u64>(), 0, "21 s by default");
        assert!(dev.snapshot_history(1).busy_ns.len() <= 2);
    }

    #[test]
    fn each_gpu_keeps_its_own_timeline_and_processes() {
        let config = InitConfig {
            devices: 3,
            ..InitConfig::default()
        };
        let state = SharedState::anonymous(config).unwrap();
        let (a, b) = (state.device(0).unwrap(), state.device(2).unwrap());
        a.register_process(1).unwrap();
        b.register_process(2).unwrap();
        b.kernel_begin(2, Lane::Compute, 90, T0);
        b.kernel_end(2, Lane::Compute, T0 + PERIOD_NS);
        assert!(b.try_alloc_mem(2, 1 << 30));
        a.kernel_begin(2, Lane::Compute, 90, T0);
        assert!(
            !a.snapshot_at(T0 + 1).kernel_active,
            "pid 2 has no context on GPU 0"
        );
        let (sa, sb) = (
            a.snapshot_at(T0 + 2 * PERIOD_NS),
            b.snapshot_at(T0 + 2 * PERIOD_NS),
        );
        assert_eq!(sa.period_busy_ns(T0 / PERIOD_NS), 0);
        assert_eq!(sb.period_busy_ns(T0 / PERIOD_NS), PERIOD_NS);
        assert_eq!(sa.procs.iter().map(|p| p.pid).collect::<Vec<_>>(), [1]);
        assert_eq!(sb.procs.iter().map(|p| p.pid).collect::<Vec<_>>(), [2]);
        assert_eq!((sa.mem_used_bytes(), sb.mem_used_bytes()), (0, 1 << 30));
        state.forget_process(2);
        assert!(b.snapshot().procs.is_empty());
        assert_eq!(a.snapshot().procs.len(), 1);
        assert!(state.device(3).is_none());
        assert_eq!(
            state.devices().map(|g| g.index()).collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }

    #[test]
    fn pcie_link_can_be_retrained() {
        let state = machine();
        let dev = state.device(0).unwrap();
        assert_eq!(dev.pcie_link(), PcieLink::MAX);
        dev.set_pcie_link(PcieLink::new(2, 8).unwrap());
        assert_eq!(dev.snapshot().pcie, Some(PcieLink::new(2, 8).unwrap()));
        assert_eq!(dev.snapshot().pcie_max, Some(PcieLink::MAX));
    }
}
