//! When the threads that call CUDA were off their CPU, exactly, as their off-CPU samples say.
//!
//! The tick timeline says how long a thread was off-CPU per tick (50 ms), not when inside
//! it: a step of 40–80 ms split by ticks prorates the feeder's sleep over both steps a tick
//! spans, and one step's input wait lands in its neighbour's host time. The off-CPU samples
//! carry their switch-out and their length, so where one was taken the time is known
//! exactly; only the feeders need it, so only threads seen calling CUDA and main threads
//! (a feeder before the probes see it call) are kept (a few hundred spans a second at most:
//! one per sampling interval). Each span keeps what it waited for ([`WaitFor`]).
use super::wait_for::WaitFor;
use crate::fxhash::{FxHashMap, FxHashSet};

/// An off-CPU period: `[start, start + len)`, CLOCK_MONOTONIC ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Span {
    start: u64,
    len: u64,
    wait: WaitFor,
}

impl Span {
    fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }
}

/// Off-CPU spans by thread, for the threads that call CUDA.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OffCpuSpans {
    callers: FxHashSet<u32>,
    by_tid: FxHashMap<u32, Vec<Span>>,
}

impl OffCpuSpans {
    /// `tid` called CUDA: its off-CPU samples from now on are kept.
    pub fn calls_cuda(&mut self, tid: u32) {
        self.callers.insert(tid);
    }

    /// Whether an off-CPU sample of `tid` (of process `pid`) is kept.
    pub fn keeps(&self, tid: u32, pid: u32) -> bool {
        tid == pid || self.callers.contains(&tid)
    }

    pub fn off_cpu_sample(
        &mut self,
        ts_ns: u64,
        (tid, pid): (u32, u32),
        duration_ns: u64,
        wait: WaitFor,
    ) {
        if duration_ns > 0 && self.keeps(tid, pid) {
            self.by_tid.entry(tid).or_default().push(Span {
                start: ts_ns,
                len: duration_ns,
                wait,
            });
        }
    }

    /// Sorts the spans; queries need this first. Spans of one thread cannot overlap, but a
    /// damaged file may say they do: the later one is cut where the earlier ends.
    pub fn finish(&mut self) {
        for spans in self.by_tid.values_mut() {
            spans.sort_unstable_by_key(|s| (s.start, s.len));
            let mut last_end = 0;
            spans.retain_mut(|s| {
                if s.start < last_end {
                    s.len = s.end().saturating_sub(last_end);
                    s.start = last_end;
                }
                last_end = last_end.max(s.end());
                s.len > 0
            });
        }
    }

    /// Whether any span of `tid` was kept.
    pub fn has(&self, tid: u32) -> bool {
        self.by_tid.get(&tid).is_some_and(|s| !s.is_empty())
    }

    /// The sampled off-CPU periods of `tid` that start inside `[start, end)`, in time order:
    /// (start, length, what it waited for).
    pub fn spans_of(
        &self,
        tid: u32,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (u64, u64, WaitFor)> + '_ {
        let spans = self.by_tid.get(&tid).map_or(&[][..], Vec::as_slice);
        let first = spans.partition_point(|s| s.start < start);
        spans[first..]
            .iter()
            .take_while(move |s| s.start < end)
            .map(|s| (s.start, s.len, s.wait))
    }

    /// How long the samples of `tid` say it was off its CPU inside `[start, end)`.
    pub fn inside(&self, tid: u32, start: u64, end: u64) -> u64 {
        self.waits_inside(tid, start, end).map(|(_, ns)| ns).sum()
    }

    /// What `tid`'s sampled waits inside `[start, end)` were for, each with its ns there.
    pub fn waits_inside(
        &self,
        tid: u32,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (WaitFor, u64)> + '_ {
        let spans = self.by_tid.get(&tid).map_or(&[][..], Vec::as_slice);
        // The first span that ends after `start`: spans are sorted and disjoint, so their
        // ends are sorted too.
        let first = spans.partition_point(|s| s.end() <= start);
        spans[first..]
            .iter()
            .take_while(move |s| s.start < end)
            .map(move |s| (s.wait, s.end().min(end).saturating_sub(s.start.max(start))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cuda_callers_and_main_threads_are_kept_and_windows_cut_spans_at_their_edges() {
        let mut s = OffCpuSpans::default();
        let w = WaitFor::Unsaid;
        s.off_cpu_sample(0, (1, 9), 50, w);
        s.calls_cuda(1);
        s.off_cpu_sample(300, (1, 9), 100, WaitFor::Gil);
        s.off_cpu_sample(100, (1, 9), 50, w);
        s.off_cpu_sample(100, (2, 9), 50, w);
        s.off_cpu_sample(100, (3, 3), 50, w);
        s.finish();
        assert!(s.has(1) && !s.has(2) && s.has(3));
        assert_eq!(
            s.waits_inside(1, 320, 1000).collect::<Vec<_>>(),
            [(WaitFor::Gil, 80)]
        );
        assert_eq!(s.inside(1, 0, 1000), 150);
        assert_eq!(
            s.inside(1, 0, 100),
            0,
            "the span before the thread called CUDA"
        );
        assert_eq!(s.inside(1, 120, 350), 30 + 50);
        assert_eq!(s.inside(1, 150, 300), 0);
        assert_eq!(s.inside(2, 0, 1000), 0);
    }

    #[test]
    fn overlapping_spans_from_a_damaged_file_count_once() {
        let mut s = OffCpuSpans::default();
        s.calls_cuda(1);
        let w = WaitFor::Unsaid;
        s.off_cpu_sample(0, (1, 9), 100, w);
        s.off_cpu_sample(50, (1, 9), 100, w);
        s.off_cpu_sample(60, (1, 9), 10, w);
        s.off_cpu_sample(u64::MAX - 5, (1, 9), 100, w);
        s.finish();
        assert_eq!(s.inside(1, 0, 200), 150);
        assert_eq!(s.inside(1, u64::MAX - 10, u64::MAX), 5);
    }
}
