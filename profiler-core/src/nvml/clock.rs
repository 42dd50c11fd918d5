//! Rebasing NVML sample timestamps onto CLOCK_MONOTONIC, the clock of every other record.
//!
//! NVML stamps utilization samples in microseconds, on the Unix epoch on some hosts and on
//! boot time on others. The clock is recognised by which of the two the first timestamp is
//! close to, then converted with the offset between that clock and CLOCK_MONOTONIC read at
//! the same moment.

/// The three clocks read back to back, in ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockReadings {
    pub realtime_ns: u64,
    pub boottime_ns: u64,
    pub monotonic_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvmlClock {
    Realtime,
    Boottime,
}

/// How far a sample may lag "now" and still identify its clock: NVML keeps about 20 s of
/// samples, so allow a minute.
const MAX_LAG_NS: u64 = 60_000_000_000;

impl NvmlClock {
    /// Which clock `ts_us` was taken on, given the clocks read shortly after; `None` when it
    /// is close to neither.
    pub fn detect(ts_us: u64, now: ClockReadings) -> Option<Self> {
        let ts_ns = ts_us.saturating_mul(1000);
        let lag = |clock_ns: u64| clock_ns.abs_diff(ts_ns);
        let (real, boot) = (lag(now.realtime_ns), lag(now.boottime_ns));
        let (best, best_lag) = if real <= boot {
            (NvmlClock::Realtime, real)
        } else {
            (NvmlClock::Boottime, boot)
        };
        (best_lag <= MAX_LAG_NS).then_some(best)
    }

    /// `ts_us` on this clock, as CLOCK_MONOTONIC ns.
    pub fn to_monotonic_ns(self, ts_us: u64, now: ClockReadings) -> u64 {
        let clock_now = match self {
            NvmlClock::Realtime => now.realtime_ns,
            NvmlClock::Boottime => now.boottime_ns,
        };
        let ts_ns = ts_us.saturating_mul(1000) as i128;
        let offset = clock_now as i128 - now.monotonic_ns as i128;
        (ts_ns - offset).max(0) as u64
    }

    /// CLOCK_MONOTONIC ns as a timestamp on this clock, in µs (for NVML's cursors).
    pub fn from_monotonic_ns(self, mono_ns: u64, now: ClockReadings) -> u64 {
        let clock_now = match self {
            NvmlClock::Realtime => now.realtime_ns,
            NvmlClock::Boottime => now.boottime_ns,
        };
        let offset = clock_now as i128 - now.monotonic_ns as i128;
        ((mono_ns as i128 + offset).max(0) / 1000) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: ClockReadings = ClockReadings {
        realtime_ns: 1_790_000_000_000_000_000,
        boottime_ns: 3_600_000_000_000,
        monotonic_ns: 3_500_000_000_000,
    };

    #[test]
    fn recognises_the_epoch_clock_and_rebases_it() {
        let ts_us = NOW.realtime_ns / 1000 - 500_000;
        assert_eq!(NvmlClock::detect(ts_us, NOW), Some(NvmlClock::Realtime));
        let mono = NvmlClock::Realtime.to_monotonic_ns(ts_us, NOW);
        assert_eq!(mono, NOW.monotonic_ns - 500_000_000);
        assert_eq!(NvmlClock::Realtime.from_monotonic_ns(mono, NOW), ts_us);
    }

    #[test]
    fn recognises_the_boot_clock_and_rebases_it() {
        // Boot time runs ahead of monotonic by the time spent suspended (100 s here).
        let ts_us = NOW.boottime_ns / 1000 - 2_000_000;
        assert_eq!(NvmlClock::detect(ts_us, NOW), Some(NvmlClock::Boottime));
        let mono = NvmlClock::Boottime.to_monotonic_ns(ts_us, NOW);
        assert_eq!(mono, NOW.monotonic_ns - 2_000_000_000);
        assert_eq!(NvmlClock::Boottime.from_monotonic_ns(mono, NOW), ts_us);
    }

    #[test]
    fn refuses_a_timestamp_near_neither_clock() {
        assert_eq!(NvmlClock::detect(12_345, NOW), None);
        assert_eq!(NvmlClock::detect(NOW.realtime_ns / 1000 / 2, NOW), None);
    }
}
