//! Stack samples: on-CPU counts, off-CPU durations, and scaling off-CPU samples to measured time.
//!
//! The kernel side rate-limits off-CPU stack captures per thread, so the captured durations
//! undercount. Each thread's counters measure its true off-CPU time (`io_wait_ns +
//! blocked_ns`); the captured stacks are scaled up so they add up to it, keeping their
//! proportions. They are never scaled down: if captures exceed the counters, they stand.
use std::collections::BTreeMap;

use crate::analysis::model::{CpuStackSamples, OffCpuStackTime};
use crate::fxhash::FxHashMap;

/// Stack ids index dense per-thread arrays up to this many cells in all (16 MiB of totals,
/// at most twice that allocated);
/// past it, totals go to hash maps. Recorders intern stacks with small sequential ids, so
/// dense arrays are the common case: a sample is then one array increment instead of a hash
/// probe into a table too large for cache, which was most of the analysis time.
pub(crate) const DENSE_CELL_BUDGET: usize = 2 << 20;
/// Larger ids always use the map, so one stray id cannot spend the whole budget at once.
const DENSE_MAX_STACK: usize = 1 << 16;

/// Per-stack totals of one thread and one kind of sample.
#[derive(Debug, Default)]
pub(crate) struct StackTotals {
    dense: Vec<u64>,
    sparse: FxHashMap<u32, u64>,
}

impl StackTotals {
    pub(crate) fn add(&mut self, stack: u32, value: u64, budget: &mut usize) {
        let idx = stack as usize;
        if idx >= self.dense.len() {
            let growth = idx + 1 - self.dense.len();
            if idx >= DENSE_MAX_STACK || growth > *budget {
                let total = self.sparse.entry(stack).or_default();
                *total = total.saturating_add(value);
                return;
            }
            *budget -= growth;
            self.dense.resize(idx + 1, 0);
        }
        self.dense[idx] = self.dense[idx].saturating_add(value);
    }

    /// Non-zero totals, in no particular order.
    pub(crate) fn into_totals(self) -> impl Iterator<Item = (u32, u64)> {
        let dense = self.dense.into_iter().enumerate();
        let dense = dense.filter_map(|(idx, total)| Some((u32::try_from(idx).ok()?, total)));
        dense.chain(self.sparse).filter(|&(_, total)| total > 0)
    }
}

#[derive(Debug, Default)]
struct ThreadSamples {
    /// From the thread's latest sample.
    pid: u32,
    cpu: StackTotals,
    off_cpu_io: StackTotals,
    off_cpu_blocked: StackTotals,
}

/// Samples wait here and are applied in batches of this many. Applying one sample is one
/// likely cache miss; between two samples the decoder runs long enough that the CPU cannot
/// overlap those misses, so each costs a full memory round trip. A tight loop over a batch
/// keeps several misses in flight at once (about 5x faster on a ten-million-record file).
const BATCH: usize = 1024;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Cpu,
    OffCpuIo,
    OffCpuBlocked,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    tid: u32,
    pid: u32,
    stack: u32,
    kind: Kind,
    value: u64,
}

/// Accumulates samples per thread and stack.
#[derive(Debug)]
pub struct SampleAccumulator {
    threads: FxHashMap<u32, ThreadSamples>,
    dense_cells_left: usize,
    pending: Vec<Pending>,
}

impl Default for SampleAccumulator {
    fn default() -> Self {
        Self {
            threads: FxHashMap::default(),
            dense_cells_left: DENSE_CELL_BUDGET,
            pending: Vec::with_capacity(BATCH),
        }
    }
}

impl SampleAccumulator {
    pub fn cpu_sample(&mut self, tid: u32, pid: u32, stack: u32) {
        self.queue(tid, pid, stack, Kind::Cpu, 1);
    }

    pub fn off_cpu_sample(&mut self, tid: u32, pid: u32, stack: u32, io: bool, duration_ns: u64) {
        let kind = if io {
            Kind::OffCpuIo
        } else {
            Kind::OffCpuBlocked
        };
        self.queue(tid, pid, stack, kind, duration_ns);
    }

    fn queue(&mut self, tid: u32, pid: u32, stack: u32, kind: Kind, value: u64) {
        self.pending.push(Pending {
            tid,
            pid,
            stack,
            kind,
            value,
        });
        if self.pending.len() >= BATCH {
            self.apply_pending();
        }
    }

    fn apply_pending(&mut self) {
        for p in self.pending.drain(..) {
            let t = self.threads.entry(p.tid).or_default();
            t.pid = p.pid;
            let totals = match p.kind {
                Kind::Cpu => &mut t.cpu,
                Kind::OffCpuIo => &mut t.off_cpu_io,
                Kind::OffCpuBlocked => &mut t.off_cpu_blocked,
            };
            totals.add(p.stack, p.value, &mut self.dense_cells_left);
        }
    }

    /// Every sampled thread as (tid, pid of its latest sample), in no particular order.
    pub fn sampled_threads(&mut self) -> Vec<(u32, u32)> {
        self.apply_pending();
        self.threads.iter().map(|(&tid, t)| (tid, t.pid)).collect()
    }

    /// Sorted on-CPU counts and scaled off-CPU times. `pid_of` names each thread's process
    /// (`None`: the samples' own); `measured_off_cpu_ns` gives its measured off-CPU total
    /// (unknown threads stay unscaled).
    pub fn finish(
        mut self,
        pid_of: impl Fn(u32) -> Option<u32>,
        measured_off_cpu_ns: impl Fn(u32) -> Option<u64>,
    ) -> (Vec<CpuStackSamples>, Vec<OffCpuStackTime>) {
        self.apply_pending();
        let mut cpu = Vec::new();
        let mut off = Vec::new();
        for (tid, t) in self.threads {
            let pid = pid_of(tid).unwrap_or(t.pid);
            cpu.extend(t.cpu.into_totals().map(|(stack, samples)| CpuStackSamples {
                tid,
                pid,
                stack,
                samples,
            }));
            let io = t.off_cpu_io.into_totals().map(|e| (e, true));
            let blocked = t.off_cpu_blocked.into_totals().map(|e| (e, false));
            off.extend(
                io.chain(blocked)
                    .map(|((stack, sampled_ns), io)| OffCpuStackTime {
                        tid,
                        pid,
                        stack,
                        io,
                        sampled_ns,
                        scaled_ns: sampled_ns,
                    }),
            );
        }
        cpu.sort_by_key(|s| (s.tid, s.stack));
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
        acc.off_cpu_sample(7, 1, 10, true, 1_000);
        acc.off_cpu_sample(7, 1, 10, true, 1_000);
        acc.off_cpu_sample(7, 1, 11, false, 1_000);
        acc.off_cpu_sample(8, 1, 10, false, 500);
        acc.cpu_sample(7, 1, 3);
        acc.cpu_sample(7, 1, 3);
        let measured = |tid| match tid {
            7 => Some(10_000),
            8 => Some(100), // fewer than captured: not scaled down
            _ => None,
        };
        let (cpu, off) = acc.finish(|_| None, measured);
        assert_eq!(
            cpu,
            [CpuStackSamples {
                tid: 7,
                pid: 1,
                stack: 3,
                samples: 2
            }]
        );
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
        acc.off_cpu_sample(9, 9, 1, true, 42);
        let (_, off) = acc.finish(|_| None, |_| None);
        assert_eq!(off[0].scaled_ns, 42);
    }

    #[test]
    fn huge_stack_ids_fall_back_to_a_map() {
        let mut acc = SampleAccumulator::default();
        acc.cpu_sample(1, 1, u32::MAX);
        acc.cpu_sample(1, 1, 5);
        acc.cpu_sample(1, 1, u32::MAX);
        let (cpu, _) = acc.finish(|_| None, |_| None);
        let got: Vec<(u32, u64)> = cpu.iter().map(|s| (s.stack, s.samples)).collect();
        assert_eq!(got, [(5, 1), (u32::MAX, 2)]);
    }
}
