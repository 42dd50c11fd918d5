//! What the feeder and the workers did during one window of time, from the per-tick
//! accounting, each tick prorated by how much of it falls inside the window.
use crate::analysis::model::{ThreadDelta, TickSlice};

use super::roles::{Role, Roles};

/// Time in each state, summed over a group of threads.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct States {
    pub on_cpu: f64,
    pub runqueue: f64,
    pub io_wait: f64,
    pub blocked: f64,
}

impl States {
    pub fn total(&self) -> f64 {
        self.on_cpu + self.runqueue + self.io_wait + self.blocked
    }

    fn add(&mut self, d: &ThreadDelta, weight: f64) {
        self.on_cpu += d.on_cpu_ns as f64 * weight;
        self.runqueue += d.runqueue_ns as f64 * weight;
        self.io_wait += d.io_wait_ns as f64 * weight;
        self.blocked += d.blocked_ns as f64 * weight;
    }

    /// Each state as a fraction of the total (all zero without time).
    pub fn fractions(&self) -> States {
        let t = self.total();
        if t <= 0.0 {
            return States::default();
        }
        States {
            on_cpu: self.on_cpu / t,
            runqueue: self.runqueue / t,
            io_wait: self.io_wait / t,
            blocked: self.blocked / t,
        }
    }
}

/// Host activity during one window, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostWindow {
    pub feeder: States,
    pub workers: States,
    pub other: States,
    /// The feeder's time inside CUDA calls, by what it waited for; `None` when no probe
    /// watched its process.
    pub cuda: Option<crate::cuda::WaitTotals>,
    /// The PCIe link limits copies: trained below its maximum generation or width with
    /// copies far below what the full link gives, or saturated.
    pub link_limited: bool,
    /// What the link carries now, GB/s (bytes per ns), when NVML says.
    pub link_gbps: Option<f64>,
    /// The feeder's process launches kernels at a launch-bound rate.
    pub launch_bound: bool,
    /// What the feeder's blocked time was for, as its off-CPU samples say.
    pub waits: super::feeder_waits::WaitShares,
}

/// Finds the ticks that overlap a window without scanning the whole timeline.
pub struct TimelineIndex {
    ends: Vec<u64>,
}

impl TimelineIndex {
    pub fn new(timeline: &[TickSlice]) -> Self {
        Self {
            ends: timeline.iter().map(|s| s.end_ns).collect(),
        }
    }

    /// The ticks that overlap `[start, end)`, each with the part of it inside.
    pub fn slices<'t>(
        &self,
        timeline: &'t [TickSlice],
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (&'t TickSlice, f64)> + 't {
        let first = self.ends.partition_point(|&e| e <= start);
        timeline
            .get(first..)
            .unwrap_or(&[])
            .iter()
            .take_while(move |slice| slice.start_ns < end)
            .filter_map(move |slice| {
                let len = slice.end_ns.saturating_sub(slice.start_ns);
                let overlap = end
                    .min(slice.end_ns)
                    .saturating_sub(start.max(slice.start_ns));
                (len > 0).then(|| (slice, overlap as f64 / len as f64))
            })
    }

    pub fn window(
        &self,
        timeline: &[TickSlice],
        roles: &Roles,
        start: u64,
        end: u64,
    ) -> HostWindow {
        let mut w = HostWindow::default();
        for (slice, weight) in self.slices(timeline, start, end) {
            for d in &slice.threads {
                let group = match roles.role(d.tid) {
                    Role::Feeder => &mut w.feeder,
                    Role::Worker => &mut w.workers,
                    Role::Other => &mut w.other,
                };
                group.add(d, weight);
            }
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(start: u64, end: u64, deltas: &[(u32, u64, u64, u64, u64)]) -> TickSlice {
        TickSlice {
            start_ns: start,
            end_ns: end,
            threads: deltas
                .iter()
                .map(|&(tid, on, rq, io, bl)| ThreadDelta {
                    tid,
                    on_cpu_ns: on,
                    runqueue_ns: rq,
                    io_wait_ns: io,
                    blocked_ns: bl,
                })
                .collect(),
        }
    }

    #[test]
    fn prorates_ticks_by_overlap() {
        let timeline = vec![
            slice(0, 100, &[(1, 100, 0, 0, 0), (2, 0, 0, 100, 0)]),
            slice(100, 200, &[(1, 0, 0, 0, 100), (2, 50, 50, 0, 0)]),
        ];
        let roles = Roles {
            feeders: [1].into(),
            workers: [2].into(),
        };
        let index = TimelineIndex::new(&timeline);
        let w = index.window(&timeline, &roles, 50, 150);
        assert_eq!(w.feeder.on_cpu, 50.0);
        assert_eq!(w.feeder.blocked, 50.0);
        assert_eq!(w.workers.io_wait, 50.0);
        assert_eq!(w.workers.on_cpu, 25.0);
        assert_eq!(w.workers.runqueue, 25.0);
        let outside = index.window(&timeline, &roles, 300, 400);
        assert_eq!(outside.feeder.total(), 0.0);
    }
}
