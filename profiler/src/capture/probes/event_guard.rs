//! Keeps the event probes off a hot path. `cuEventRecord` and `cuStreamWaitEvent` run a few
//! times per collective in a DDP step, but some code records an event after every kernel,
//! and each probed call costs two uprobe traps (microseconds each). Past
//! [`MAX_PER_SEC`] calls a second from one process, the session removes the event probes
//! and the analysis falls back to what it assumes without them (see `profiler_core::cuda`).
use std::collections::HashMap;

/// Event calls a second from one process past which their probes go: at the ~10 µs two
/// traps cost here, 2% of a core.
pub const MAX_PER_SEC: f64 = 2_000.0;
/// The rate is judged over at least this long, so that a burst at start-up does not count.
const WINDOW_NS: u64 = 1_000_000_000;

/// Event calls per process since the window began.
#[derive(Default)]
pub struct EventRate {
    since_ns: u64,
    calls: HashMap<u32, u64>,
}

impl EventRate {
    pub fn note(&mut self, pid: u32) {
        *self.calls.entry(pid).or_default() += 1;
    }

    /// At `now_ns`: the busiest process and its rate when it is past [`MAX_PER_SEC`]; a new
    /// window begins whenever one has run its length.
    pub fn over(&mut self, now_ns: u64) -> Option<(u32, f64)> {
        if self.since_ns == 0 {
            self.since_ns = now_ns;
            return None;
        }
        let elapsed = now_ns.saturating_sub(self.since_ns);
        if elapsed < WINDOW_NS {
            return None;
        }
        let busiest = self
            .calls
            .iter()
            .map(|(&pid, &n)| (pid, n as f64 / (elapsed as f64 / 1e9)))
            .max_by(|x, y| x.1.total_cmp(&y.1));
        self.calls.clear();
        self.since_ns = now_ns;
        busiest.filter(|(_, rate)| *rate > MAX_PER_SEC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_process_past_the_rate_is_named_once_a_window_has_passed() {
        let mut r = EventRate::default();
        assert_eq!(r.over(S), None);
        for _ in 0..3_000 {
            r.note(7);
        }
        for _ in 0..100 {
            r.note(8);
        }
        // Half a window: not judged yet.
        assert_eq!(r.over(S + S / 2), None);
        assert_eq!(r.over(2 * S), Some((7, 3_000.0)));
        // A new window, quiet.
        for _ in 0..1_000 {
            r.note(7);
        }
        assert_eq!(r.over(3 * S), None);
    }
}
