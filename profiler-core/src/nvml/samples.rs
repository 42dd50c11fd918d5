//! NVML's utilization samples of one GPU, turned into `GpuUtil` records on CLOCK_MONOTONIC.
//!
//! While a GPU is idle NVML produces no new samples (`NotFound` for a cursor at the newest
//! one), so gaps between samples are written as 0% samples: idle, not missing. NVML's period
//! differs by product (1/6 s to 1 s) and is learnt from the spacing of the first samples seen
//! together. The sampler thread only calls NVML; everything it decides is here, testable.
use crate::nvml::clock::{ClockReadings, NvmlClock};
use crate::recording::record::Record;

/// NVML's sample period on data-center GPUs; replaced by the measured spacing.
pub const DEFAULT_PERIOD_NS: u64 = 166_667_000;
/// Periods believed: a spacing outside these is a glitch, not the product's period.
const MIN_PERIOD_NS: u64 = 10_000_000;
const MAX_PERIOD_NS: u64 = 2_000_000_000;

/// One sample as NVML gives it: its timestamp (µs, on NVML's clock) and utilization (%).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawSample {
    pub timestamp_us: u64,
    pub util_pct: u32,
}

/// The conversion state of one GPU.
#[derive(Clone, Debug)]
pub struct UtilSamples {
    gpu: u32,
    clock: Option<NvmlClock>,
    /// NVML's cursor: the newest sample timestamp seen, on NVML's clock (µs).
    cursor_us: u64,
    /// End of the last sample written, CLOCK_MONOTONIC ns.
    last_ns: u64,
    period_ns: u64,
    period_known: bool,
}

impl UtilSamples {
    /// Samples that end after `start_ns` (the recording's start) are written.
    pub fn new(gpu: u32, start_ns: u64) -> Self {
        Self {
            gpu,
            clock: None,
            cursor_us: 0,
            last_ns: start_ns,
            period_ns: DEFAULT_PERIOD_NS,
            period_known: false,
        }
    }

    /// The cursor to ask NVML for newer samples with.
    pub fn cursor_us(&self) -> u64 {
        self.cursor_us
    }

    /// NVML's clock, once a sample has shown which it is.
    pub fn clock(&self) -> Option<NvmlClock> {
        self.clock
    }

    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// Samples NVML returned for the cursor, in any order; `now` is read just after.
    pub fn add(&mut self, mut samples: Vec<RawSample>, now: ClockReadings, out: &mut Vec<Record>) {
        samples.sort_by_key(|s| s.timestamp_us);
        if !self.period_known && samples.len() >= 2 {
            let spacing_us = samples
                .windows(2)
                .map(|p| p[1].timestamp_us.saturating_sub(p[0].timestamp_us))
                .filter(|&d| d > 0)
                .min();
            if let Some(us) = spacing_us {
                self.period_ns = us.saturating_mul(1000).clamp(MIN_PERIOD_NS, MAX_PERIOD_NS);
                self.period_known = true;
            }
        }
        for s in samples {
            self.cursor_us = self.cursor_us.max(s.timestamp_us);
            let clock = *self.clock.get_or_insert_with(|| {
                NvmlClock::detect(s.timestamp_us, now).unwrap_or(NvmlClock::Realtime)
            });
            let ts_ns = clock.to_monotonic_ns(s.timestamp_us, now);
            if ts_ns <= self.last_ns {
                // Before the recording, or already covered: only the spacing was learnt.
                continue;
            }
            // No samples between two samples: the GPU was idle in the gap.
            self.idle_until(ts_ns.saturating_sub(self.period_ns), out);
            let period =
                (ts_ns - self.last_ns).clamp(MIN_PERIOD_NS, self.period_ns.max(MIN_PERIOD_NS));
            out.push(self.util(ts_ns, period, s.util_pct));
            self.last_ns = ts_ns;
        }
    }

    /// NVML made no sample newer than the cursor: the GPU is idle. A period of slack is left
    /// for a sample NVML has not published yet.
    pub fn none_newer(&mut self, now_ns: u64, out: &mut Vec<Record>) {
        self.idle_until(now_ns.saturating_sub(self.period_ns), out);
    }

    /// A GPU without sample buffers: NVML's current rate, covering the time since the last.
    pub fn rate(&mut self, util_pct: u32, now_ns: u64, out: &mut Vec<Record>) {
        let period = now_ns.saturating_sub(self.last_ns).max(1);
        out.push(self.util(now_ns, period, util_pct));
        self.last_ns = now_ns;
    }

    fn idle_until(&mut self, end_ns: u64, out: &mut Vec<Record>) {
        while end_ns.saturating_sub(self.last_ns) >= self.period_ns {
            let ts_ns = self.last_ns + self.period_ns;
            out.push(self.util(ts_ns, self.period_ns, 0));
            self.last_ns = ts_ns;
        }
    }

    fn util(&self, ts_ns: u64, period_ns: u64, util_pct: u32) -> Record {
        Record::GpuUtil {
            gpu: self.gpu,
            ts_ns,
            period_ns,
            util_pct: util_pct.min(100),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    /// The clocks at a moment 100 s after boot, with CLOCK_MONOTONIC 1 s behind boot time.
    fn now_at(mono_ns: u64) -> ClockReadings {
        ClockReadings {
            realtime_ns: 1_700_000_000_000_000_000 + mono_ns,
            boottime_ns: mono_ns + 1_000 * MS,
            monotonic_ns: mono_ns,
        }
    }

    /// A boot-time NVML sample that ends at `mono_ns`.
    fn sample(mono_ns: u64, util_pct: u32) -> RawSample {
        RawSample {
            timestamp_us: (mono_ns + 1_000 * MS) / 1000,
            util_pct,
        }
    }

    fn utils(out: &[Record]) -> Vec<(u64, u64, u32)> {
        out.iter()
            .map(|r| match r {
                Record::GpuUtil {
                    ts_ns,
                    period_ns,
                    util_pct,
                    ..
                } => (*ts_ns / MS, *period_ns / MS, *util_pct),
                other => panic!("not a GpuUtil: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn learns_the_period_and_the_clock_and_skips_what_came_before_the_start() {
        let start = 100_000 * MS;
        let mut u = UtilSamples::new(0, start);
        let mut out = Vec::new();
        let batch = [99_800, 100_000, 100_200, 100_400].map(|t| sample(t * MS, 40));
        u.add(batch.to_vec(), now_at(100_500 * MS), &mut out);
        assert_eq!(u.period_ns(), 200 * MS);
        assert_eq!(u.clock(), Some(NvmlClock::Boottime));
        assert_eq!(utils(&out), [(100_200, 200, 40), (100_400, 200, 40)]);
        assert_eq!(u.cursor_us(), batch[3].timestamp_us);
    }

    #[test]
    fn a_gap_between_samples_is_idle_not_missing() {
        let start = 100_000 * MS;
        let mut u = UtilSamples::new(1, start);
        let mut out = Vec::new();
        u.add(
            vec![sample(100_200 * MS, 90), sample(100_400 * MS, 90)],
            now_at(100_500 * MS),
            &mut out,
        );
        out.clear();
        // The next sample comes 1 s later: four periods without one were idle.
        u.add(
            vec![sample(101_400 * MS, 70)],
            now_at(101_500 * MS),
            &mut out,
        );
        assert_eq!(
            utils(&out),
            [
                (100_600, 200, 0),
                (100_800, 200, 0),
                (101_000, 200, 0),
                (101_200, 200, 0),
                (101_400, 200, 70)
            ]
        );
    }

    #[test]
    fn no_newer_sample_fills_idle_up_to_a_period_of_slack() {
        let start = 100_000 * MS;
        let mut u = UtilSamples::new(0, start);
        let mut out = Vec::new();
        u.none_newer(start + 1_000 * MS, &mut out);
        let p = DEFAULT_PERIOD_NS / MS;
        // Up to 1 s minus a period of slack: four whole default periods.
        assert_eq!(utils(&out).len(), 4, "{:?}", utils(&out));
        assert!(
            utils(&out)
                .iter()
                .all(|&(_, period, util)| period == p && util == 0)
        );
        let last = utils(&out).last().unwrap().0;
        assert!(last * MS <= start + 1_000 * MS - DEFAULT_PERIOD_NS);
    }

    #[test]
    fn spacing_and_values_out_of_range_are_clamped() {
        let mut u = UtilSamples::new(0, 0);
        let mut out = Vec::new();
        // 1 ms apart: faster than any NVML period; 250% is a damaged value.
        u.add(
            vec![sample(5_000 * MS, 250), sample(5_001 * MS, 10)],
            now_at(5_100 * MS),
            &mut out,
        );
        assert_eq!(u.period_ns(), MIN_PERIOD_NS);
        assert!(utils(&out).iter().all(|&(_, _, util)| util <= 100));
    }

    #[test]
    fn rates_cover_the_time_since_the_last_record() {
        let mut u = UtilSamples::new(0, 1_000 * MS);
        let mut out = Vec::new();
        u.rate(55, 1_300 * MS, &mut out);
        u.rate(65, 1_350 * MS, &mut out);
        assert_eq!(utils(&out), [(1_300, 300, 55), (1_350, 50, 65)]);
    }
}
