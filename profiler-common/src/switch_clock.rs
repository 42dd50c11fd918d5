//! A CPU's switch time from its run queue's clock, which `__schedule` updates just before the
//! `sched_switch` tracepoint: a load where `bpf_ktime_get_ns` costs a hundred nanoseconds in
//! a VM. The two clocks differ by an offset that drifts slowly, re-measured every
//! [`RECALIBRATE_NS`] against the helper. The run queue's clock can only lag (the scheduler
//! skips an update it judges redundant: after `sched_yield`, a wakeup that preempts, an idle
//! exit), never lead, so a measured offset is at least the true one: the smallest recent
//! measurement is kept, grown by at most what drift could add. Free of kernel calls, so host
//! tests replay clock sequences through it.
use crate::CpuSlot;

/// Re-measure the offset this often, on the run queue's clock.
pub const RECALIBRATE_NS: u64 = 1_000_000;

/// The most a recalibration lets the offset grow: drift between the scheduler's clock and
/// the monotonic clock (NTP slews the latter by at most 500 ppm) over the time since the last
/// one, capped so that one lagging measurement after a long quiet spell costs a few µs.
#[inline(always)]
fn drift_allowance(since: u64) -> u64 {
    (since / 1024).min(4096)
}

impl CpuSlot {
    /// Now on the monotonic clock from the run queue's `rq_clock`, while the offset is recent;
    /// `None` when it is due to be re-measured (see [`CpuSlot::calibrate`]).
    #[inline(always)]
    pub fn clock_estimate(&self, rq_clock: u64) -> Option<u64> {
        let since = rq_clock.wrapping_sub(self.calibrated_rq_ns);
        if self.calibrated_rq_ns == 0 || since >= RECALIBRATE_NS {
            return None;
        }
        // Never before the last switch on this CPU: a smaller offset measured since may move
        // the estimate back by the allowance.
        Some(rq_clock.wrapping_add(self.clock_gap).max(self.ts_ns))
    }

    /// Re-measures the offset at a switch where `now` is `bpf_ktime_get_ns` and `rq_clock` the
    /// run queue's clock. Skip it where the clock is known to lag a lot (a switch from the idle
    /// task, whose clock stopped at the wakeup).
    #[inline(always)]
    pub fn calibrate(&mut self, rq_clock: u64, now: u64) {
        let measured = now.wrapping_sub(rq_clock);
        self.clock_gap = if self.calibrated_rq_ns == 0 {
            measured
        } else {
            let since = rq_clock.wrapping_sub(self.calibrated_rq_ns);
            measured.min(self.clock_gap.wrapping_add(drift_allowance(since)))
        };
        self.calibrated_rq_ns = rq_clock;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The monotonic clock runs `offset` ahead of the run queue's.
    const OFFSET: u64 = 5_000_000_000;

    fn calibrated_at(rq: u64) -> CpuSlot {
        let mut cpu = CpuSlot::default();
        cpu.calibrate(rq, rq + OFFSET);
        cpu
    }

    #[test]
    fn a_fresh_clock_reads_as_the_monotonic_one_until_the_offset_is_due() {
        let cpu = calibrated_at(1_000);
        assert_eq!(cpu.clock_estimate(1_000 + 400), Some(1_400 + OFFSET));
        assert_eq!(
            cpu.clock_estimate(1_000 + RECALIBRATE_NS - 1),
            Some(RECALIBRATE_NS - 1 + 1_000 + OFFSET)
        );
        assert_eq!(cpu.clock_estimate(1_000 + RECALIBRATE_NS), None);
        assert_eq!(CpuSlot::default().clock_estimate(1_000), None);
    }

    #[test]
    fn a_lagging_clock_at_recalibration_does_not_move_later_estimates_ahead() {
        let mut cpu = calibrated_at(1_000);
        // The clock lags 30 µs at the next measurement (an update the scheduler skipped).
        let rq = 1_000 + RECALIBRATE_NS;
        cpu.calibrate(rq, rq + OFFSET + 30_000);
        // Fresh clock afterwards: at most the drift allowance ahead of the truth, not 30 µs.
        let later = rq + 10_000;
        let ahead = cpu.clock_estimate(later).unwrap() - (later + OFFSET);
        assert!(ahead <= drift_allowance(RECALIBRATE_NS), "{ahead} ns ahead");
    }

    #[test]
    fn a_lagging_first_measurement_is_corrected_by_the_next_fresh_one() {
        let mut cpu = CpuSlot::default();
        cpu.calibrate(1_000, 1_000 + OFFSET + 30_000);
        let rq = 1_000 + RECALIBRATE_NS;
        cpu.calibrate(rq, rq + OFFSET);
        assert_eq!(cpu.clock_estimate(rq + 10), Some(rq + 10 + OFFSET));
    }

    #[test]
    fn drift_is_followed_a_little_at_each_recalibration() {
        let mut cpu = calibrated_at(1_000);
        // The monotonic clock gains 100 ppm on the run queue's.
        let mut rq = 1_000;
        for _ in 0..1_000 {
            rq += RECALIBRATE_NS;
            let truth = rq + OFFSET + (rq - 1_000) / 10_000;
            cpu.calibrate(rq, truth);
        }
        let truth = rq + 1 + OFFSET + (rq - 1_000) / 10_000;
        assert_eq!(cpu.clock_estimate(rq + 1), Some(truth));
    }

    #[test]
    fn estimates_never_go_back_past_the_last_switch() {
        let mut cpu = calibrated_at(1_000);
        cpu.ts_ns = 1_000 + OFFSET + 700;
        assert_eq!(cpu.clock_estimate(1_500), Some(1_000 + OFFSET + 700));
    }
}
