//! Per-tick timeline: turns cumulative `Tick` counters into per-slice thread-state deltas.
//!
//! Each `Tick` closes a slice that began at the previous tick (or the recording start). A
//! thread's delta is its counters minus its previous tick's; a thread seen for the first time
//! counts from zero, since its counters start when it is first tracked. A thread that exits
//! between ticks contributes `exit counters - last tick` to the next slice (or to a final slice
//! ending at the recording's end), so each thread's deltas add up to its final counters.
use crate::analysis::model::{ThreadDelta, TickSlice};
use crate::fxhash::FxHashMap;
use crate::recording::record::ThreadCounters;

/// `cur - prev` per state. A thread's lifetime (the sum) only grows, but the recorder may move
/// time between states after the fact (it learns of a missed context switch later): a state
/// that went down takes its decrease out of the states that went up, largest first, so the
/// slice still adds up to the lifetime gained. A lifetime that shrank by more than half is a
/// reused TID: the new thread counts from zero. A smaller shrink (a torn read of a value being
/// updated) yields an empty delta; see [`TimelineBuilder::tick`] for how it is not lost.
pub fn counter_delta(prev: Option<&ThreadCounters>, cur: &ThreadCounters) -> ThreadDelta {
    let fields = |c: &ThreadCounters| [c.on_cpu_ns, c.runqueue_ns, c.io_wait_ns, c.blocked_ns];
    let now = fields(cur);
    let delta = |d: [u64; 4]| ThreadDelta {
        tid: cur.tid,
        on_cpu_ns: d[0],
        runqueue_ns: d[1],
        io_wait_ns: d[2],
        blocked_ns: d[3],
    };
    let Some(prev) = prev else {
        return delta(now);
    };
    let before = fields(prev);
    let (sum_now, sum_before) = (cur.lifetime_ns(), prev.lifetime_ns());
    if sum_now < sum_before / 2 {
        return delta(now);
    }
    if sum_now <= sum_before {
        return delta([0; 4]);
    }
    let mut up = [0u64; 4];
    let mut down = 0u64;
    for i in 0..4 {
        if now[i] >= before[i] {
            up[i] = now[i] - before[i];
        } else {
            down += before[i] - now[i];
        }
    }
    let mut order = [0usize, 1, 2, 3];
    order.sort_by_key(|&i| std::cmp::Reverse(up[i]));
    for i in order {
        let take = up[i].min(down);
        up[i] -= take;
        down -= take;
    }
    delta(up)
}

fn is_zero(d: &ThreadDelta) -> bool {
    d.on_cpu_ns == 0 && d.runqueue_ns == 0 && d.io_wait_ns == 0 && d.blocked_ns == 0
}

/// Folds ticks and exits into [`TickSlice`]s as they stream past.
#[derive(Debug, Default)]
pub struct TimelineBuilder {
    /// Each live thread's counters at its latest tick.
    prev: FxHashMap<u32, ThreadCounters>,
    last_tick_ns: Option<u64>,
    /// Final deltas of threads that exited since the last tick.
    pending_exits: Vec<ThreadDelta>,
    slices: Vec<TickSlice>,
}

impl TimelineBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A `Tick` at `ts_ns`; `start_ns` is where the first slice begins.
    pub fn tick(&mut self, ts_ns: u64, start_ns: u64, threads: &[ThreadCounters]) {
        let mut deltas = std::mem::take(&mut self.pending_exits);
        deltas.reserve(threads.len());
        for cur in threads {
            let prev = self.prev.get(&cur.tid);
            let delta = counter_delta(prev, cur);
            // Keep the larger of a torn (shrunk) reading and the previous one as the base, so
            // the next delta is neither lost nor counted twice.
            let keep_prev = prev.is_some_and(|p| {
                cur.lifetime_ns() <= p.lifetime_ns() && cur.lifetime_ns() >= p.lifetime_ns() / 2
            });
            if !keep_prev {
                self.prev.insert(cur.tid, *cur);
            }
            deltas.push(delta);
        }
        let start_ns = self.last_tick_ns.unwrap_or(start_ns).min(ts_ns);
        self.last_tick_ns = Some(ts_ns);
        self.push_slice(start_ns, ts_ns, deltas);
    }

    /// A `ThreadExit`: the thread's last delta joins the next slice.
    pub fn exit(&mut self, counters: &ThreadCounters) {
        let delta = counter_delta(self.prev.remove(&counters.tid).as_ref(), counters);
        self.pending_exits.push(delta);
    }

    /// Closes the timeline at `end_ns`: exits after the last tick get a final slice.
    pub fn finish(mut self, start_ns: u64, end_ns: u64) -> Vec<TickSlice> {
        let pending = std::mem::take(&mut self.pending_exits);
        if !pending.is_empty() {
            let slice_start = self.last_tick_ns.unwrap_or(start_ns);
            self.push_slice(slice_start, end_ns.max(slice_start), pending);
        }
        self.slices
    }

    fn push_slice(&mut self, start_ns: u64, end_ns: u64, mut deltas: Vec<ThreadDelta>) {
        deltas.retain(|d| !is_zero(d));
        deltas.sort_by_key(|d| d.tid);
        // An exit and a tick entry for the same TID (a reused TID) share one row.
        deltas.dedup_by(|later, kept| {
            if later.tid != kept.tid {
                return false;
            }
            kept.on_cpu_ns = kept.on_cpu_ns.saturating_add(later.on_cpu_ns);
            kept.runqueue_ns = kept.runqueue_ns.saturating_add(later.runqueue_ns);
            kept.io_wait_ns = kept.io_wait_ns.saturating_add(later.io_wait_ns);
            kept.blocked_ns = kept.blocked_ns.saturating_add(later.blocked_ns);
            true
        });
        deltas.shrink_to_fit();
        self.slices.push(TickSlice {
            start_ns,
            end_ns,
            threads: deltas,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(tid: u32, on: u64, rq: u64, io: u64, blocked: u64) -> ThreadCounters {
        ThreadCounters {
            tid,
            pid: 1,
            on_cpu_ns: on,
            runqueue_ns: rq,
            io_wait_ns: io,
            blocked_ns: blocked,
            ..ThreadCounters::default()
        }
    }

    fn row(tid: u32, on: u64, rq: u64, io: u64, blocked: u64) -> ThreadDelta {
        ThreadDelta {
            tid,
            on_cpu_ns: on,
            runqueue_ns: rq,
            io_wait_ns: io,
            blocked_ns: blocked,
        }
    }

    #[test]
    fn delta_from_nothing_and_after_reuse() {
        let c = counters(5, 10, 20, 30, 40);
        assert_eq!(counter_delta(None, &c), row(5, 10, 20, 30, 40));
        let later = counters(5, 15, 20, 31, 40);
        assert_eq!(counter_delta(Some(&c), &later), row(5, 5, 0, 1, 0));
        // Counters going backwards mean a new thread with the same TID.
        let reused = counters(5, 1, 0, 0, 0);
        assert_eq!(counter_delta(Some(&later), &reused), row(5, 1, 0, 0, 0));
    }

    #[test]
    fn thread_appearing_mid_recording_and_exiting() {
        let mut tl = TimelineBuilder::new();
        tl.tick(100, 0, &[counters(1, 60, 10, 0, 30)]);
        // Thread 2 starts between the ticks: its first delta is all of its counters.
        tl.tick(
            200,
            0,
            &[counters(1, 120, 20, 10, 50), counters(2, 30, 5, 0, 5)],
        );
        // Thread 2 exits after 250; its last stretch lands in the next slice.
        tl.exit(&counters(2, 50, 5, 20, 5));
        tl.tick(300, 0, &[counters(1, 180, 20, 10, 90)]);
        // Thread 1 exits after the last tick: a closing slice up to the end.
        tl.exit(&counters(1, 190, 20, 10, 100));
        let slices = tl.finish(0, 320);

        let spans: Vec<(u64, u64)> = slices.iter().map(|s| (s.start_ns, s.end_ns)).collect();
        assert_eq!(spans, [(0, 100), (100, 200), (200, 300), (300, 320)]);
        assert_eq!(slices[0].threads, [row(1, 60, 10, 0, 30)]);
        assert_eq!(
            slices[1].threads,
            [row(1, 60, 10, 10, 20), row(2, 30, 5, 0, 5)]
        );
        assert_eq!(
            slices[2].threads,
            [row(1, 60, 0, 0, 40), row(2, 20, 0, 20, 0)]
        );
        assert_eq!(slices[3].threads, [row(1, 10, 0, 0, 10)]);

        // Each thread's deltas add up to its final counters.
        for (tid, lifetime) in [(1, 320), (2, 80)] {
            let sum: u64 = slices
                .iter()
                .flat_map(|s| &s.threads)
                .filter(|d| d.tid == tid)
                .map(|d| d.on_cpu_ns + d.runqueue_ns + d.io_wait_ns + d.blocked_ns)
                .sum();
            assert_eq!(sum, lifetime, "thread {tid}");
        }
    }

    #[test]
    fn idle_slices_drop_zero_rows() {
        let mut tl = TimelineBuilder::new();
        tl.tick(10, 0, &[counters(1, 5, 0, 0, 5)]);
        tl.tick(20, 0, &[counters(1, 5, 0, 0, 5)]);
        let slices = tl.finish(0, 20);
        assert_eq!(slices.len(), 2);
        assert!(slices[1].threads.is_empty());
    }

    #[test]
    fn time_moved_between_states_is_spread_not_double_counted() {
        // The recorder first saw 40 ns queued, then learned the thread had been running.
        let prev = counters(7, 10, 40, 0, 0);
        let cur = counters(7, 80, 0, 0, 0);
        let d = counter_delta(Some(&prev), &cur);
        assert_eq!((d.on_cpu_ns, d.runqueue_ns), (30, 0));
        assert_eq!(
            d.on_cpu_ns + d.runqueue_ns,
            cur.lifetime_ns() - prev.lifetime_ns()
        );
    }

    #[test]
    fn a_torn_reading_is_neither_lost_nor_double_counted() {
        let mut b = TimelineBuilder::new();
        b.tick(100, 0, &[counters(1, 100, 0, 0, 0)]);
        b.tick(200, 0, &[counters(1, 90, 0, 0, 0)]);
        b.tick(300, 0, &[counters(1, 300, 0, 0, 0)]);
        let slices = b.finish(0, 300);
        let total: u64 = slices
            .iter()
            .flat_map(|s| s.threads.iter())
            .map(|d| d.on_cpu_ns)
            .sum();
        assert_eq!(total, 300);
    }
}
