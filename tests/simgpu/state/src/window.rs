//! Busy, SM-active and copy accounting over time windows: splitting intervals into buckets, and
//! reading a [`Snapshot`] of recent buckets back as busy time, SM-active time or bytes for any
//! window. Pure: no OS calls.
use crate::layout::{BUCKET_NS, PCIE_WINDOW_BUCKETS, PERIOD_NS, UNTHROTTLED_MILLI};
use crate::pcie::{Direction, PcieLink};

/// Splits `[start_ns, end_ns)` at multiples of `width_ns`: yields `(slot number, overlap ns)`.
pub fn split_interval(
    start_ns: u64,
    end_ns: u64,
    width_ns: u64,
) -> impl Iterator<Item = (u64, u64)> {
    let mut at = start_ns;
    std::iter::from_fn(move || {
        if at >= end_ns || width_ns == 0 {
            return None;
        }
        let slot = at / width_ns;
        let next = slot.saturating_add(1).saturating_mul(width_ns).min(end_ns);
        let piece = (slot, next - at);
        at = next;
        Some(piece)
    })
}

/// Splits `bytes` moved during `[start_ns, end_ns)` over buckets in proportion to time. The
/// pieces always sum to `bytes`; an instantaneous copy lands whole in the bucket of `start_ns`.
pub fn split_bytes(start_ns: u64, end_ns: u64, bytes: u64) -> Vec<(u64, u64)> {
    if end_ns <= start_ns {
        return vec![(start_ns / BUCKET_NS, bytes)];
    }
    let total_ns = u128::from(end_ns - start_ns);
    let mut given = 0u64;
    let mut pieces: Vec<(u64, u64)> = split_interval(start_ns, end_ns, BUCKET_NS)
        .map(|(slot, ns)| {
            let share = (u128::from(bytes) * u128::from(ns) / total_ns) as u64;
            given += share;
            (slot, share)
        })
        .collect();
    if let Some(last) = pieces.last_mut() {
        last.1 += bytes - given;
    }
    pieces
}

/// `ns` times a share in percent (at most 100).
pub fn share_of(ns: u64, share_pct: u32) -> u64 {
    (u128::from(ns) * u128::from(share_pct.min(100)) / 100) as u64
}

/// Percent of `len_ns` covered by `busy_ns`, rounded to nearest, at most 100.
pub fn percent(busy_ns: u64, len_ns: u64) -> u32 {
    if len_ns == 0 {
        return 0;
    }
    let pct = (u128::from(busy_ns) * 100 + u128::from(len_ns) / 2) / u128::from(len_ns);
    pct.min(100) as u32
}

/// One process as seen in a snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcView {
    pub pid: u32,
    pub mem_used_bytes: u64,
    pub busy_total_ns: u64,
    /// Period number of `period_busy_ns[0]`.
    pub first_period: u64,
    /// Kernel time of this process per sample period, oldest first, including a kernel still
    /// running.
    pub period_busy_ns: Vec<u64>,
}

impl ProcView {
    /// Busy ns of this process in period `period` (0 outside the recorded range).
    pub fn busy_in_period(&self, period: u64) -> u64 {
        period
            .checked_sub(self.first_period)
            .and_then(|i| self.period_busy_ns.get(i as usize))
            .copied()
            .unwrap_or(0)
    }
}

/// A consistent copy of recent device history, taken under the lock at `now_ns`. A kernel still
/// running is already credited up to `now_ns`, so readers need no special case for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// CLOCK_MONOTONIC ns when the snapshot was taken.
    pub now_ns: u64,
    /// Bucket number of element 0 of the vectors below; the last element is the bucket of
    /// `now_ns` (partly elapsed).
    pub first_bucket: u64,
    pub busy_ns: Vec<u64>,
    /// SM-active ns per bucket: summed over concurrent kernels, so possibly above the bucket's
    /// length (readers cap what they derive from it).
    pub sm_ns: Vec<u64>,
    pub tx_bytes: Vec<u64>,
    pub rx_bytes: Vec<u64>,
    pub procs: Vec<ProcView>,
    pub pcie: Option<PcieLink>,
    pub pcie_max: Option<PcieLink>,
    pub mem_total_bytes: u64,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC and CLOCK_BOOTTIME − CLOCK_MONOTONIC, fixed at creation.
    pub realtime_offset_ns: i64,
    pub boottime_offset_ns: i64,
    /// Whether a kernel is running at `now_ns`.
    pub kernel_active: bool,
    /// Kernel slowdown in thousandths; 0 and 1000 both mean full speed.
    pub throttle_milli: u32,
}

impl Snapshot {
    /// An empty snapshot at `now_ns` holding `buckets` zeroed buckets (for tests and builders).
    pub fn empty(now_ns: u64, buckets: u64) -> Self {
        let last = now_ns / BUCKET_NS;
        let first = last.saturating_sub(buckets.saturating_sub(1));
        let len = (last - first + 1) as usize;
        Snapshot {
            now_ns,
            first_bucket: first,
            busy_ns: vec![0; len],
            sm_ns: vec![0; len],
            tx_bytes: vec![0; len],
            rx_bytes: vec![0; len],
            ..Snapshot::default()
        }
    }

    /// Adds busy time `[start_ns, end_ns)` (clipped to `now_ns` and to the recorded range).
    pub fn credit_busy(&mut self, start_ns: u64, end_ns: u64) {
        for (bucket, ns) in split_interval(start_ns, end_ns.min(self.now_ns), BUCKET_NS) {
            if let Some(slot) = self.index(bucket) {
                self.busy_ns[slot] += ns;
            }
        }
    }

    /// Adds SM-active time of a kernel with `share_pct` of the SMs over `[start_ns, end_ns)`
    /// (clipped like busy time).
    pub fn credit_sm(&mut self, start_ns: u64, end_ns: u64, share_pct: u32) {
        for (bucket, ns) in split_interval(start_ns, end_ns.min(self.now_ns), BUCKET_NS) {
            if let Some(slot) = self.index(bucket) {
                self.sm_ns[slot] += share_of(ns, share_pct);
            }
        }
    }

    /// Adds a copy of `bytes` during `[start_ns, end_ns)`.
    pub fn credit_copy(&mut self, direction: Direction, start_ns: u64, end_ns: u64, bytes: u64) {
        for (bucket, part) in split_bytes(start_ns, end_ns, bytes) {
            if let Some(slot) = self.index(bucket) {
                match direction {
                    Direction::HostToDevice => self.rx_bytes[slot] += part,
                    Direction::DeviceToHost => self.tx_bytes[slot] += part,
                }
            }
        }
    }

    fn index(&self, bucket: u64) -> Option<usize> {
        let i = bucket.checked_sub(self.first_bucket)? as usize;
        (i < self.busy_ns.len()).then_some(i)
    }

    /// Busy ns within `[start_ns, end_ns)`. Whole buckets count fully; a bucket cut by the
    /// window counts in proportion to the overlap (busy time is assumed spread evenly in it).
    pub fn busy_between(&self, start_ns: u64, end_ns: u64) -> u64 {
        self.sum_between(&self.busy_ns, start_ns, end_ns)
    }

    /// SM-active ns within `[start_ns, end_ns)`, apportioned like busy time; each bucket counts
    /// at most its own length (all SMs active all the time).
    pub fn sm_between(&self, start_ns: u64, end_ns: u64) -> u64 {
        let capped: Vec<u64> = self.sm_ns.iter().map(|ns| (*ns).min(BUCKET_NS)).collect();
        self.sum_between(&capped, start_ns, end_ns)
    }

    /// GPM's SM activity in percent over `[start_ns, end_ns)`.
    pub fn sm_util_pct(&self, start_ns: u64, end_ns: u64) -> u32 {
        percent(
            self.sm_between(start_ns, end_ns),
            end_ns.saturating_sub(start_ns),
        )
    }

    /// How much slower than normal kernels run: 1.0 at full speed.
    pub fn throttle_factor(&self) -> f64 {
        f64::from(self.throttle_milli.max(UNTHROTTLED_MILLI)) / f64::from(UNTHROTTLED_MILLI)
    }

    /// Whether the GPU is throttled (kernels run slower than normal).
    pub fn throttled(&self) -> bool {
        self.throttle_milli > UNTHROTTLED_MILLI
    }

    /// Copy bytes in one direction within `[start_ns, end_ns)`, apportioned like busy time.
    pub fn bytes_between(&self, direction: Direction, start_ns: u64, end_ns: u64) -> u64 {
        let series = match direction {
            Direction::HostToDevice => &self.rx_bytes,
            Direction::DeviceToHost => &self.tx_bytes,
        };
        self.sum_between(series, start_ns, end_ns)
    }

    fn sum_between(&self, series: &[u64], start_ns: u64, end_ns: u64) -> u64 {
        split_interval(start_ns, end_ns, BUCKET_NS)
            .filter_map(|(bucket, ns)| {
                let value = series.get(self.index(bucket)?)?;
                Some((u128::from(*value) * u128::from(ns) / u128::from(BUCKET_NS)) as u64)
            })
            .sum()
    }

    /// Number of the newest sample period that has fully elapsed, if any.
    pub fn newest_complete_period(&self) -> Option<u64> {
        (self.now_ns / PERIOD_NS).checked_sub(1)
    }

    /// Busy ns of sample period `period` (`[period * PERIOD_NS, (period + 1) * PERIOD_NS)`).
    pub fn period_busy_ns(&self, period: u64) -> u64 {
        self.busy_between(period * PERIOD_NS, (period + 1) * PERIOD_NS)
    }

    /// GPU utilization in percent over `[start_ns, end_ns)`.
    pub fn utilization_pct(&self, start_ns: u64, end_ns: u64) -> u32 {
        percent(
            self.busy_between(start_ns, end_ns),
            end_ns.saturating_sub(start_ns),
        )
    }

    /// Utilization of the newest complete sample period: what `nvmlDeviceGetUtilizationRates`
    /// reports as `gpu`.
    pub fn last_period_pct(&self) -> u32 {
        self.newest_complete_period()
            .map_or(0, |p| percent(self.period_busy_ns(p), PERIOD_NS))
    }

    /// Whether any kernel ran during the trailing sample period `[now - PERIOD_NS, now)`.
    pub fn busy_recently(&self) -> bool {
        self.kernel_active
            || self.busy_between(self.now_ns.saturating_sub(PERIOD_NS), self.now_ns) > 0
    }

    /// PCIe throughput in KiB/s over the last complete 20 ms window (NVML's definition).
    pub fn pcie_kib_per_s(&self, direction: Direction) -> u32 {
        let end = (self.now_ns / BUCKET_NS) * BUCKET_NS;
        let window = PCIE_WINDOW_BUCKETS * BUCKET_NS;
        let bytes = self.bytes_between(direction, end.saturating_sub(window), end);
        let per_s = u128::from(bytes) * 1_000_000_000 / u128::from(window) / 1024;
        per_s.min(u128::from(u32::MAX)) as u32
    }

    /// Copy-engine load of the newest complete period, in percent of what the current link can
    /// move: stands in for NVML's memory utilization.
    pub fn copy_load_pct(&self) -> u32 {
        let (Some(period), Some(link)) = (self.newest_complete_period(), self.pcie) else {
            return 0;
        };
        let (start, end) = (period * PERIOD_NS, (period + 1) * PERIOD_NS);
        let bytes = self.bytes_between(Direction::HostToDevice, start, end)
            + self.bytes_between(Direction::DeviceToHost, start, end);
        let capacity = link.bytes_per_s() * PERIOD_NS as f64 / 1e9;
        ((bytes as f64 * 100.0 / capacity).round() as u32).min(100)
    }

    /// Device memory used by all processes.
    pub fn mem_used_bytes(&self) -> u64 {
        self.procs.iter().map(|p| p.mem_used_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_split_at_bucket_edges() {
        let pieces: Vec<_> = split_interval(5, 25, 10).collect();
        assert_eq!(pieces, vec![(0, 5), (1, 10), (2, 5)]);
        assert_eq!(split_interval(10, 10, 10).count(), 0);
        assert_eq!(split_interval(0, 10, 0).count(), 0);
    }

    #[test]
    fn copy_bytes_are_conserved() {
        let start = 10 * BUCKET_NS + BUCKET_NS / 2;
        let pieces = split_bytes(start, start + 2 * BUCKET_NS, 1001);
        assert_eq!(pieces.iter().map(|p| p.1).sum::<u64>(), 1001);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces[0], (10, 250));
        assert_eq!(split_bytes(start, start, 7), vec![(10, 7)]);
    }

    #[test]
    fn percent_rounds_and_caps() {
        assert_eq!(percent(0, 10), 0);
        assert_eq!(percent(5, 10), 50);
        assert_eq!(percent(1, 3), 33);
        assert_eq!(percent(2, 3), 67);
        assert_eq!(percent(20, 10), 100);
        assert_eq!(percent(1, 0), 0);
    }

    #[test]
    fn utilization_of_whole_and_partial_windows() {
        let now = 1000 * PERIOD_NS + 7;
        let mut snap = Snapshot::empty(now, 5 * 50);
        // Busy for the first half of period 997 and all of period 998.
        snap.credit_busy(997 * PERIOD_NS, 997 * PERIOD_NS + PERIOD_NS / 2);
        snap.credit_busy(998 * PERIOD_NS, 999 * PERIOD_NS);
        assert_eq!(snap.period_busy_ns(997), PERIOD_NS / 2);
        assert_eq!(snap.utilization_pct(997 * PERIOD_NS, 998 * PERIOD_NS), 50);
        assert_eq!(snap.utilization_pct(998 * PERIOD_NS, 999 * PERIOD_NS), 100);
        assert_eq!(snap.utilization_pct(999 * PERIOD_NS, 1000 * PERIOD_NS), 0);
        // Two periods at once: 1.5 of 2 periods busy.
        assert_eq!(snap.utilization_pct(997 * PERIOD_NS, 999 * PERIOD_NS), 75);
        // A window cutting a busy bucket in half counts half of it.
        let b = 998 * PERIOD_NS;
        assert_eq!(snap.busy_between(b, b + BUCKET_NS / 2), BUCKET_NS / 2);
        assert_eq!(snap.last_period_pct(), 0);
        assert!(!snap.busy_recently());
        // Outside the recorded range counts as idle rather than failing.
        assert_eq!(snap.busy_between(0, 10 * PERIOD_NS), 0);
    }

    #[test]
    fn credit_is_clipped_to_now() {
        let now = 100 * BUCKET_NS + 10;
        let mut snap = Snapshot::empty(now, 3);
        snap.credit_busy(99 * BUCKET_NS, now + 1_000_000);
        assert_eq!(snap.busy_ns, vec![0, BUCKET_NS, 10]);
        assert!(snap.busy_recently());
    }

    #[test]
    fn sm_time_sums_shares_and_caps_per_bucket() {
        let now = 100 * BUCKET_NS;
        let mut snap = Snapshot::empty(now, 10);
        let b = 95 * BUCKET_NS;
        // Two buckets at 90%, and a 15% kernel over the second one as well: 105%, capped.
        snap.credit_sm(b, b + 2 * BUCKET_NS, 90);
        snap.credit_sm(b + BUCKET_NS, b + 2 * BUCKET_NS, 15);
        // Buckets 91 to 100 are held, so bucket 95 is element 4.
        assert_eq!(snap.sm_ns[4], share_of(BUCKET_NS, 90));
        assert_eq!(
            snap.sm_ns[5],
            share_of(BUCKET_NS, 90) + share_of(BUCKET_NS, 15)
        );
        assert_eq!(snap.sm_between(b, b + BUCKET_NS), share_of(BUCKET_NS, 90));
        assert_eq!(snap.sm_between(b + BUCKET_NS, b + 2 * BUCKET_NS), BUCKET_NS);
        assert_eq!(snap.sm_util_pct(b, b + 2 * BUCKET_NS), 95);
        assert_eq!(snap.sm_util_pct(b, b + 4 * BUCKET_NS), 48);
        // Clipped to now, like busy time; shares above 100 count as 100.
        snap.credit_sm(now - 10, now + 1_000, 250);
        assert_eq!(snap.sm_ns[8], 10);
        assert_eq!(snap.sm_ns[9], 0);
        assert_eq!(share_of(1000, 15), 150);
    }

    #[test]
    fn throttle_reads_as_a_factor() {
        let mut snap = Snapshot::empty(10, 1);
        assert_eq!(snap.throttle_factor(), 1.0);
        assert!(!snap.throttled());
        snap.throttle_milli = 1000;
        assert!(!snap.throttled());
        snap.throttle_milli = 2500;
        assert_eq!(snap.throttle_factor(), 2.5);
        assert!(snap.throttled());
    }

    #[test]
    fn pcie_throughput_uses_the_last_complete_20ms() {
        let now = 1000 * BUCKET_NS + 5;
        let mut snap = Snapshot::empty(now, 20);
        // 1 MiB host to device during the 6 buckets before `now`'s bucket.
        let end = 1000 * BUCKET_NS;
        snap.credit_copy(Direction::HostToDevice, end - 6 * BUCKET_NS, end, 1 << 20);
        // 1 MiB (1024 KiB) in 20.00004 ms is 51,199.9 KiB/s.
        assert_eq!(snap.pcie_kib_per_s(Direction::HostToDevice), 51_199);
        assert_eq!(snap.pcie_kib_per_s(Direction::DeviceToHost), 0);
        // A copy in the current (incomplete) bucket is not counted yet.
        snap.credit_copy(Direction::DeviceToHost, end, end, 4096);
        assert_eq!(snap.pcie_kib_per_s(Direction::DeviceToHost), 0);
    }

    #[test]
    fn copy_load_is_relative_to_the_current_link() {
        let now = 10 * PERIOD_NS + 1;
        let mut snap = Snapshot::empty(now, 100);
        snap.pcie = Some(PcieLink::new(3, 4).unwrap());
        // Half of what gen3 x4 moves in one period.
        let bytes = (3.152e9 * (PERIOD_NS as f64 / 1e9) / 2.0) as u64;
        snap.credit_copy(
            Direction::DeviceToHost,
            9 * PERIOD_NS,
            10 * PERIOD_NS,
            bytes,
        );
        assert_eq!(snap.copy_load_pct(), 50);
    }
}
