//! NVML-style utilization samples generated from a [`Snapshot`]. Pure: no OS calls.
//!
//! Like the driver, we produce one sample per elapsed sample period ([`PERIOD_NS`]) whose value
//! is the percent of the period in which at least one kernel ran, stamped with the period's end.
//! The driver stops sampling while the GPU sits idle: a period yields a sample only if it or the
//! period before it saw a kernel, so activity ends with one trailing 0% sample and then
//! `NVML_ERROR_NOT_FOUND` for as long as the GPU stays idle.
use crate::layout::PERIOD_NS;
use crate::window::{Snapshot, percent};

/// How many sample periods back the driver's sample buffer reaches (120 periods, 20 s).
pub const SAMPLE_BUFFER_PERIODS: u64 = 120;
/// Env var selecting the sample timestamp clock: `realtime` (default) or `boot`.
pub const SAMPLE_CLOCK_ENV: &str = "STALLSCOPE_SIMGPU_SAMPLE_CLOCK";

/// The clock of NVML sample timestamps; real hosts differ, and the profiler must rebase either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SampleClock {
    /// CLOCK_REALTIME µs (Unix epoch).
    #[default]
    Realtime,
    /// CLOCK_BOOTTIME µs.
    Boot,
}

impl SampleClock {
    /// From the value of `STALLSCOPE_SIMGPU_SAMPLE_CLOCK`; anything but `boot` means realtime.
    pub fn from_setting(value: Option<&str>) -> Self {
        match value.map(str::trim) {
            Some(v) if v.eq_ignore_ascii_case("boot") || v.eq_ignore_ascii_case("boottime") => {
                SampleClock::Boot
            }
            _ => SampleClock::Realtime,
        }
    }

    /// Converts a CLOCK_MONOTONIC ns stamp to this clock, in µs.
    pub fn to_us(self, snap: &Snapshot, monotonic_ns: u64) -> u64 {
        let offset = match self {
            SampleClock::Realtime => snap.realtime_offset_ns,
            SampleClock::Boot => snap.boottime_offset_ns,
        };
        let ns = (i128::from(monotonic_ns) + i128::from(offset)).max(0);
        (ns / 1000) as u64
    }
}

/// One GPU utilization sample (`nvmlSample_t` with an unsigned-int value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtilSample {
    /// End of the sample period, µs on the sample clock.
    pub timestamp_us: u64,
    pub percent: u32,
}

/// One per-process sample (`nvmlProcessUtilizationSample_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessSample {
    pub pid: u32,
    /// End of the sample period, µs on the sample clock.
    pub timestamp_us: u64,
    pub sm_percent: u32,
}

/// Periods the sample buffer covers now, oldest first.
fn buffered_periods(snap: &Snapshot) -> std::ops::RangeInclusive<u64> {
    let Some(newest) = snap.newest_complete_period() else {
        #[expect(clippy::reversed_empty_ranges, reason = "an empty range on purpose")]
        return 1..=0;
    };
    newest.saturating_sub(SAMPLE_BUFFER_PERIODS - 1)..=newest
}

/// The GPU utilization samples newer than `last_seen_us`, oldest first (empty means NVML's
/// `NOT_FOUND`).
pub fn gpu_util_samples(snap: &Snapshot, clock: SampleClock, last_seen_us: u64) -> Vec<UtilSample> {
    let periods = buffered_periods(snap);
    let mut previous_busy = periods
        .start()
        .checked_sub(1)
        .map_or(0, |p| snap.period_busy_ns(p));
    let mut out = Vec::new();
    for period in periods {
        let busy = snap.period_busy_ns(period);
        let sampled = busy > 0 || previous_busy > 0;
        previous_busy = busy;
        let timestamp_us = clock.to_us(snap, (period + 1) * PERIOD_NS);
        if sampled && timestamp_us > last_seen_us {
            out.push(UtilSample {
                timestamp_us,
                percent: percent(busy, PERIOD_NS),
            });
        }
    }
    out
}

/// Per-process SM utilization samples newer than `last_seen_us`: one per process and period in
/// which that process ran a kernel, oldest period first.
pub fn process_util_samples(
    snap: &Snapshot,
    clock: SampleClock,
    last_seen_us: u64,
) -> Vec<ProcessSample> {
    let mut out = Vec::new();
    for period in buffered_periods(snap) {
        let timestamp_us = clock.to_us(snap, (period + 1) * PERIOD_NS);
        if timestamp_us <= last_seen_us {
            continue;
        }
        for proc in &snap.procs {
            let busy = proc.busy_in_period(period);
            if busy > 0 {
                out.push(ProcessSample {
                    pid: proc.pid,
                    timestamp_us,
                    sm_percent: percent(busy, PERIOD_NS),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::ProcView;

    /// A snapshot 1000 periods after boot, with realtime 1.7e18 ns ahead of monotonic.
    fn snapshot() -> Snapshot {
        let mut snap = Snapshot::empty(1000 * PERIOD_NS + 1234, 130 * 50);
        snap.realtime_offset_ns = 1_700_000_000_000_000_000;
        snap.boottime_offset_ns = 5_000;
        snap
    }

    #[test]
    fn clock_setting_parses() {
        assert_eq!(SampleClock::from_setting(None), SampleClock::Realtime);
        assert_eq!(SampleClock::from_setting(Some("boot")), SampleClock::Boot);
        assert_eq!(
            SampleClock::from_setting(Some("BOOTTIME")),
            SampleClock::Boot
        );
        assert_eq!(SampleClock::from_setting(Some("x")), SampleClock::Realtime);
    }

    #[test]
    fn idle_device_has_no_samples() {
        assert!(gpu_util_samples(&snapshot(), SampleClock::Realtime, 0).is_empty());
        assert!(gpu_util_samples(&Snapshot::empty(5, 10), SampleClock::Realtime, 0).is_empty());
    }

    #[test]
    fn busy_then_idle_yields_values_and_one_trailing_zero() {
        let mut snap = snapshot();
        // Periods 990 and 991 fully busy, 992 a quarter busy, then idle.
        snap.credit_busy(990 * PERIOD_NS, 992 * PERIOD_NS + PERIOD_NS / 4);
        let samples = gpu_util_samples(&snap, SampleClock::Boot, 0);
        let values: Vec<u32> = samples.iter().map(|s| s.percent).collect();
        assert_eq!(values, vec![100, 100, 25, 0]);
        // Timestamps are period ends on the chosen clock, in µs.
        assert_eq!(samples[0].timestamp_us, (991 * PERIOD_NS + 5_000) / 1000);
        assert_eq!(samples[3].timestamp_us - samples[2].timestamp_us, 166_667);
        // The newest timestamp as a cursor: nothing newer while idle (NVML's NOT_FOUND).
        let newest = samples[3].timestamp_us;
        assert!(gpu_util_samples(&snap, SampleClock::Boot, newest).is_empty());
        // A cursor in the middle returns only what came after it.
        let tail = gpu_util_samples(&snap, SampleClock::Boot, samples[1].timestamp_us);
        assert_eq!(tail, samples[2..].to_vec());
    }

    #[test]
    fn realtime_stamps_are_unix_epoch_microseconds() {
        let mut snap = snapshot();
        snap.credit_busy(999 * PERIOD_NS, 999 * PERIOD_NS + 1);
        let samples = gpu_util_samples(&snap, SampleClock::Realtime, 0);
        assert_eq!(samples.len(), 1);
        assert_eq!(
            samples[0].timestamp_us,
            (1000 * PERIOD_NS + 1_700_000_000_000_000_000) / 1000
        );
        assert_eq!(samples[0].percent, 0, "1 ns busy rounds to 0%");
    }

    #[test]
    fn the_buffer_reaches_back_120_periods() {
        let mut snap = snapshot();
        snap.credit_busy(800 * PERIOD_NS, 1000 * PERIOD_NS);
        let samples = gpu_util_samples(&snap, SampleClock::Boot, 0);
        assert_eq!(samples.len(), 120);
        assert!(samples.iter().all(|s| s.percent == 100));
    }

    #[test]
    fn process_samples_follow_each_process() {
        let mut snap = snapshot();
        snap.procs = vec![
            ProcView {
                pid: 10,
                first_period: 990,
                period_busy_ns: vec![PERIOD_NS / 2, 0, PERIOD_NS],
                ..ProcView::default()
            },
            ProcView {
                pid: 11,
                first_period: 991,
                period_busy_ns: vec![PERIOD_NS / 10],
                ..ProcView::default()
            },
        ];
        let samples = process_util_samples(&snap, SampleClock::Boot, 0);
        let brief: Vec<(u32, u32)> = samples.iter().map(|s| (s.pid, s.sm_percent)).collect();
        assert_eq!(brief, vec![(10, 50), (11, 10), (10, 100)]);
        let after = process_util_samples(&snap, SampleClock::Boot, samples[1].timestamp_us);
        assert_eq!(after, samples[2..].to_vec());
    }
}
