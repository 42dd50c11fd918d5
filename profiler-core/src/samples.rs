//! Stack samples: on-CPU counts, off-CPU durations, and scaling off-CPU samples to measured time.
//!
//! The kernel side rate-limits off-CPU stack captures per thread, so the captured durations
//! undercount. Each thread's counters measure its true off-CPU time (`io_wait_ns +
//! blocked_ns`); the captured stacks are scaled up so they add up to it, keeping their
//! proportions. They are never scaled down: if captures exceed the counters, they stand.
use std::collections::BTreeMap;

use crate::fxhash::FxHashMap;
use crate::model::{CpuStackSamples, OffCpuStackTime};

/// Accumulates samples keyed by thread and stack.
///
/// Keys pack `tid << 32 | stack` into one u64 and values are bare totals: with tens of
/// thousands of (thread, stack) pairs hit millions of times, entry size decides how much of
/// the table stays in cache. The PID is looked up per thread at the end.
#[derive(Debug, Default)]
pub struct SampleAccumulator {
    /// (tid, stack) -> samples
    cpu: FxHashMap<u64, u64>,
    /// (tid, stack) -> sampled ns, waiting on IO
    off_cpu_io: FxHashMap<u64, u64>,
    /// (tid, stack) -> sampled ns, blocked otherwise
    off_cpu_blocked: FxHashMap<u64, u64>,
}

fn key(tid: u32, stack: u32) -> u64 {
    (u64::from(tid) << 32) | u64::from(stack)
}

fn unkey(key: u64) -> (u32, u32) {
    ((key >> 32) as u32, key as u32)
}

impl SampleAccumulator {
    pub fn cpu_sample(&mut self, tid: u32, stack: u32) {
        let samples = self.cpu.entry(key(tid, stack)).or_default();
        *samples = samples.saturating_add(1);
    }

    pub fn off_cpu_sample(&mut self, tid: u32, stack: u32, io: bool, duration_ns: u64) {
        let map = if io {
            &mut self.off_cpu_io
        } else {
            &mut self.off_cpu_blocked
        };
        let total = map.entry(key(tid, stack)).or_default();
        *total = total.saturating_add(duration_ns);
    }

    /// Sorted on-CPU counts and scaled off-CPU times. `pid_of` names each thread's process;
    /// `measured_off_cpu_ns` gives its measured off-CPU total (unknown threads stay unscaled).
    pub fn finish(
        self,
        pid_of: impl Fn(u32) -> u32,
        measured_off_cpu_ns: impl Fn(u32) -> Option<u64>,
    ) -> (Vec<CpuStackSamples>, Vec<OffCpuStackTime>) {
        let mut cpu: Vec<CpuStackSamples> = self
            .cpu
            .into_iter()
            .map(|(k, samples)| {
                let (tid, stack) = unkey(k);
                CpuStackSamples {
                    tid,
                    pid: pid_of(tid),
                    stack,
                    samples,
                }
            })
            .collect();
        cpu.sort_by_key(|s| (s.tid, s.stack));

        let io = self.off_cpu_io.into_iter().map(|e| (e, true));
        let blocked = self.off_cpu_blocked.into_iter().map(|e| (e, false));
        let mut off: Vec<OffCpuStackTime> = io
            .chain(blocked)
            .map(|((k, sampled_ns), io)| {
                let (tid, stack) = unkey(k);
                OffCpuStackTime {
                    tid,
                    pid: pid_of(tid),
                    stack,
                    io,
                    sampled_ns,
                    scaled_ns: sampled_ns,
                }
            })
            .collect();
        off.sort_by_key(|s| (s.tid, s.stack, s.io));
        for run in off.chunk_by_mut(|a, b| a.tid == b.tid) {
            if let Some(measured) = measured_off_cpu_ns(run[0].tid) {
                scale_to(run, measured);
            }
        }
        (cpu, off)
    }
}

/// Scales one thread's entries so their `scaled_ns` add up to exactly `measured_ns`, when that
/// is more than they captured. Rounds cumulatively, so no nanosecond is lost or invented.
pub fn scale_to(entries: &mut [OffCpuStackTime], measured_ns: u64) {
    let sampled: u128 = entries.iter().map(|e| u128::from(e.sampled_ns)).sum();
    if sampled == 0 || u128::from(measured_ns) <= sampled {
        return;
    }
    let measured = u128::from(measured_ns);
    let mut cumulative_sampled = 0u128;
    let mut assigned = 0u128;
    for e in entries {
        cumulative_sampled += u128::from(e.sampled_ns);
        // Never above `measured`, which fits in u64.
        let upto = cumulative_sampled * measured / sampled;
        e.scaled_ns = u64::try_from(upto - assigned).unwrap_or(u64::MAX);
        assigned = upto;
    }
}

/// Each thread's total of `scaled_ns`, by TID.
pub fn off_cpu_totals(entries: &[OffCpuStackTime]) -> BTreeMap<u32, u64> {
    let mut totals = BTreeMap::new();
    for e in entries {
        let t: &mut u64 = totals.entry(e.tid).or_default();
        *t = t.saturating_add(e.scaled_ns);
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_up_to_measured_time_keeping_proportions() {
        let mut acc = SampleAccumulator::default();
        acc.off_cpu_sample(7, 10, true, 1_000);
        acc.off_cpu_sample(7, 10, true, 1_000);
        acc.off_cpu_sample(7, 11, false, 1_000);
        acc.off_cpu_sample(8, 10, false, 500);
        acc.cpu_sample(7, 3);
        acc.cpu_sample(7, 3);
        let measured = |tid| match tid {
            7 => Some(10_000),
            8 => Some(100), // fewer than captured: not scaled down
            _ => None,
        };
        let (cpu, off) = acc.finish(|_| 1, measured);
        assert_eq!(cpu, [CpuStackSamples { tid: 7, pid: 1, stack: 3, samples: 2 }]);
        let scaled: Vec<(u32, u32, bool, u64, u64)> = off
            .iter()
            .map(|e| (e.tid, e.stack, e.io, e.sampled_ns, e.scaled_ns))
            .collect();
        assert_eq!(
            scaled,
            [
                (7, 10, true, 2_000, 6_666),
                (7, 11, false, 1_000, 3_334),
                (8, 10, false, 500, 500),
            ]
        );
        let totals = off_cpu_totals(&off);
        assert_eq!(totals[&7], 10_000);
        assert_eq!(totals[&8], 500);
    }

    #[test]
    fn unknown_thread_and_zero_samples_are_left_alone() {
        let mut entries = [OffCpuStackTime::default()];
        scale_to(&mut entries, 1_000);
        assert_eq!(entries[0].scaled_ns, 0);
        let mut acc = SampleAccumulator::default();
        acc.off_cpu_sample(9, 1, true, 42);
        let (_, off) = acc.finish(|tid| tid, |_| None);
        assert_eq!(off[0].scaled_ns, 42);
    }
}
