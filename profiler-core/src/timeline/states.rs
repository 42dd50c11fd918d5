//! Each thread's states over time, from the per-tick accounting.
//!
//! A tick says how long a thread spent in each state, not in what order: its slice for the
//! tick is cut into one piece per state, ending at the tick (a thread that started during the
//! tick shows from when its time begins), in the fixed order of [`STATES`]. Neighbouring
//! pieces in one state are joined, so a thread blocked for a minute is one slice. Every
//! thread's slices add up to its counted time.
use std::collections::BTreeMap;

use crate::fxhash::FxHashMap;

use crate::analysis::model::TickSlice;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ThreadState {
    Blocked,
    IoWait,
    RunQueue,
    OnCpu,
}

/// The order of a tick's pieces.
pub const STATES: [ThreadState; 4] = [
    ThreadState::Blocked,
    ThreadState::IoWait,
    ThreadState::RunQueue,
    ThreadState::OnCpu,
];

impl ThreadState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Blocked => "blocked",
            Self::IoWait => "IO wait",
            Self::RunQueue => "run queue",
            Self::OnCpu => "on-CPU",
        }
    }
}

/// A stretch of one state: an hour of a busy thread has millions, so they are kept small.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateRun {
    pub start_ns: u64,
    pub end_ns: u64,
    pub state: ThreadState,
}

impl StateRun {
    pub fn dur_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
}

/// Every thread's state runs, by TID.
pub fn thread_states(ticks: &[TickSlice]) -> BTreeMap<u32, Vec<StateRun>> {
    // An hour is about a million thread-ticks: each finds its lane by a hash of the TID, and
    // the lanes go into the ordered map once at the end.
    let mut index: FxHashMap<u32, usize> = FxHashMap::default();
    let mut lanes: Vec<(u32, Vec<StateRun>)> = Vec::new();
    for tick in ticks {
        for d in &tick.threads {
            let parts = [d.blocked_ns, d.io_wait_ns, d.runqueue_ns, d.on_cpu_ns];
            let total: u64 = parts.iter().fold(0u64, |s, &p| s.saturating_add(p));
            if total == 0 {
                continue;
            }
            let at_lane = *index.entry(d.tid).or_insert_with(|| {
                lanes.push((d.tid, Vec::new()));
                lanes.len() - 1
            });
            let lane = &mut lanes[at_lane].1;
            let prev_end = lane.last().map_or(0, |s| s.end_ns);
            // The recorder can move time between ticks after the fact, so a tick can hold more
            // than its length: it then starts where the last one ended, and runs past its end.
            let mut at = tick.end_ns.saturating_sub(total).max(prev_end);
            for (state, ns) in STATES.into_iter().zip(parts) {
                if ns == 0 {
                    continue;
                }
                let end = at.saturating_add(ns);
                match lane.last_mut() {
                    Some(s) if s.state == state && s.end_ns == at => s.end_ns = end,
                    _ => lane.push(StateRun {
                        start_ns: at,
                        end_ns: end,
                        state,
                    }),
                }
                at = end;
            }
        }
    }
    lanes.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::model::ThreadDelta;

    fn tick(start: u64, end: u64, threads: Vec<ThreadDelta>) -> TickSlice {
        TickSlice {
            start_ns: start,
            end_ns: end,
            threads,
        }
    }

    #[test]
    fn pieces_end_at_the_tick_join_across_ticks_and_sum_to_the_counters() {
        let d = |on, blocked| ThreadDelta {
            tid: 7,
            on_cpu_ns: on,
            blocked_ns: blocked,
            ..ThreadDelta::default()
        };
        let ticks = vec![
            tick(0, 100, vec![d(30, 40)]),
            tick(100, 200, vec![d(0, 100)]),
            tick(200, 300, vec![d(60, 40)]),
        ];
        let lanes = thread_states(&ticks);
        let lane = &lanes[&7];
        let got: Vec<(ThreadState, u64, u64)> = lane
            .iter()
            .map(|s| (s.state, s.start_ns, s.end_ns))
            .collect();
        assert_eq!(
            got,
            [
                (ThreadState::Blocked, 30, 70),
                (ThreadState::OnCpu, 70, 100),
                (ThreadState::Blocked, 100, 240),
                (ThreadState::OnCpu, 240, 300),
            ]
        );
        let on: u64 = lane
            .iter()
            .filter(|s| s.state == ThreadState::OnCpu)
            .map(StateRun::dur_ns)
            .sum();
        assert_eq!(on, 90);
    }

    #[test]
    fn an_overfull_tick_starts_where_the_last_ended_and_never_overlaps_it() {
        let d = |on| ThreadDelta {
            tid: 1,
            on_cpu_ns: on,
            ..ThreadDelta::default()
        };
        let ticks = vec![tick(0, 100, vec![d(100)]), tick(100, 200, vec![d(150)])];
        let lane = &thread_states(&ticks)[&1];
        assert_eq!(lane.len(), 1, "one on-CPU run: {lane:?}");
        assert_eq!((lane[0].start_ns, lane[0].end_ns), (0, 250));
    }
}
