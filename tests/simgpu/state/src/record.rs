//! Updates and reads of the shared state: what the CUDA side records and the NVML side snapshots.
//!
//! Busy time is tracked as the union over processes: `active_kernels` counts kernels running
//! now, and a busy interval is closed (credited to buckets) when the count drops to zero. So two
//! processes' overlapping kernels count once, as NVML's "at least one kernel ran" does.
use std::sync::atomic::Ordering::Relaxed;

use crate::clock;
use crate::gpu::Gpu;
use crate::layout::{
    BUCKET_NS, BUCKET_RING, BUCKETS_PER_PERIOD, DeviceState, PERIOD_NS, PROC_PERIODS, ProcSlot,
};
use crate::lock::{LockGuard, lock, pid_alive};
use crate::pcie::{Direction, PcieLink};
use crate::window::{ProcView, Snapshot, split_bytes, split_interval};

/// Buckets a snapshot covers: 128 sample periods (21 s), enough for the 120-period sample buffer
/// plus the period before it.
pub const SNAPSHOT_BUCKETS: u64 = PROC_PERIODS as u64 * BUCKETS_PER_PERIOD;

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

    /// Ends the kernel of `slot` (if one runs) at `now_ns`, and the device busy interval with it
    /// when it was the last one running. A kernel already ended (by a reap or an unregister
    /// racing the engine thread) is not ended twice.
    fn end_kernel(&self, slot: &ProcSlot, now_ns: u64) {
        let start = slot.kernel_start_ns.swap(0, Relaxed);
        if start == 0 {
            return;
        }
        let end = now_ns.max(start);
        slot.busy_total_ns.fetch_add(end - start, Relaxed);
        for (period, ns) in split_interval(start, end, PERIOD_NS) {
            let cell = &slot.periods[(period % PROC_PERIODS as u64) as usize];
            if cell.tag.load(Relaxed) != period + 1 {
                cell.tag.store(period + 1, Relaxed);
                cell.busy_ns.store(0, Relaxed);
            }
            cell.busy_ns.fetch_add(ns, Relaxed);
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

    fn clear_slot(&self, slot: &ProcSlot) {
        slot.contexts.store(0, Relaxed);
        slot.mem_used_bytes.store(0, Relaxed);
        slot.busy_total_ns.store(0, Relaxed);
        slot.kernel_start_ns.store(0, Relaxed);
        for cell in &slot.periods {
            cell.tag.store(0, Relaxed);
            cell.busy_ns.store(0, Relaxed);
        }
        slot.pid.store(0, Relaxed);
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
            self.end_kernel(slot, clock::monotonic_ns());
            self.clear_slot(slot);
        } else {
            slot.contexts.fetch_sub(1, Relaxed);
        }
    }

    /// Forgets `pid` entirely (process exit).
    pub fn forget_process(&self, pid: u32) {
        let _g = self.guard();
        if let Some(slot) = self.slot_of(pid) {
            self.end_kernel(slot, clock::monotonic_ns());
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
                self.end_kernel(slot, now);
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

    /// A kernel of `pid` starts at `now_ns` (CLOCK_MONOTONIC). Only a registered process (one
    /// holding a context) runs kernels; for any other pid this records nothing.
    pub fn kernel_begin(&self, pid: u32, now_ns: u64) {
        let _g = self.guard();
        let Some(slot) = self.slot_of(pid) else {
            return;
        };
        if slot.kernel_start_ns.load(Relaxed) != 0 {
            // One compute engine per process: a second begin means the first end was lost.
            self.end_kernel(slot, now_ns);
        }
        if self.active_kernels.load(Relaxed) == 0 {
            self.union_start_ns.store(now_ns, Relaxed);
        }
        self.active_kernels.fetch_add(1, Relaxed);
        slot.kernel_start_ns.store(now_ns.max(1), Relaxed);
    }

    /// The running kernel of `pid` ends at `now_ns`.
    pub fn kernel_end(&self, pid: u32, now_ns: u64) {
        let _g = self.guard();
        if let Some(slot) = self.slot_of(pid) {
            self.end_kernel(slot, now_ns);
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

    /// Total busy ns (union over processes) so far, including a busy interval still open.
    pub fn busy_total_ns(&self) -> u64 {
        let _g = self.guard();
        let closed = self.busy_total_ns.load(Relaxed);
        if self.active_kernels.load(Relaxed) == 0 {
            return closed;
        }
        closed + clock::monotonic_ns().saturating_sub(self.union_start_ns.load(Relaxed))
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
                snap.tx_bytes[i] = slot.tx_bytes.load(Relaxed);
                snap.rx_bytes[i] = slot.rx_bytes.load(Relaxed);
            }
        }
        snap.kernel_active = self.active_kernels.load(Relaxed) > 0;
        if snap.kernel_active {
            snap.credit_busy(self.union_start_ns.load(Relaxed), now_ns);
        }
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

/// Reads one process slot (under the lock), crediting its running kernel up to `now_ns`.
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
    let start = slot.kernel_start_ns.load(Relaxed);
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
        dev.kernel_begin(1, T0);
        dev.kernel_begin(2, T0 + PERIOD_NS / 4);
        dev.kernel_end(1, T0 + PERIOD_NS / 2);
        dev.kernel_end(2, T0 + 3 * PERIOD_NS / 4);
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
        dev.kernel_begin(7, T0);
        let snap = dev.snapshot_at(T0 + PERIOD_NS + PERIOD_NS / 2);
        assert!(snap.kernel_active);
        assert_eq!(snap.last_period_pct(), 100);
        assert_eq!(snap.procs[0].busy_total_ns, PERIOD_NS + PERIOD_NS / 2);
        let samples = gpu_util_samples(&snap, SampleClock::Boot, 0);
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].percent, 100);
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
        dev.kernel_begin(dead, clock::monotonic_ns());
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
        dev.kernel_begin(3, T0);
        dev.kernel_end(3, T0 + BUCKET_NS);
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
        dev.kernel_begin(4, start);
        dev.kernel_end(4, start + 1_000 * MS);
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
        b.kernel_begin(2, T0);
        b.kernel_end(2, T0 + PERIOD_NS);
        assert!(b.try_alloc_mem(2, 1 << 30));
        a.kernel_begin(2, T0);
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
