//! Samples the kernel's per-thread accounting all through a recording, so that the oracle
//! can be read over the recording's window, which only the report reveals afterwards.
//!
//! Two kernel quirks shape it. schedstat's run-queue time grows only when a wait ends, so a
//! window edge that falls inside a wait would drop the wait; edges are moved to readings
//! just after the thread ran (see [`Samples::settled_near`]). And on a virtual machine,
//! schedstat's CPU time leaves out time the hypervisor stole, while stallscope, timing
//! switches with the monotonic clock, cannot see it; steal is read along to bound that.
use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use super::{
    monotonic_ns,
    procfs::{TaskTimes, steal_ns_per_cpu, task_times},
};

/// Readings of counters: an edge moves by at most one interval.
pub const COUNTERS_EVERY: Duration = Duration::from_millis(10);
/// For state-letter shares, which are only as good as their sample count: about 3000
/// readings in a 3 s window.
pub const STATES_EVERY: Duration = Duration::from_millis(1);

/// One reading of every watched thread, at CLOCK_MONOTONIC `t_ns`.
struct Sample {
    t_ns: u64,
    tasks: HashMap<u32, TaskTimes>,
    steal_ns: Vec<f64>,
}

/// A background thread reading /proc at a fixed interval.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    /// Watches `tids` of process `pid` every `every`; a thread that exits keeps its last
    /// reading. Returns after the first reading, so that anything started afterwards is
    /// covered.
    pub fn start(pid: u32, tids: &[u32], every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tids = tids.to_vec();
        let (first_tx, first_rx) = std::sync::mpsc::channel();
        let handle = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut samples: Vec<Sample> = Vec::new();
                loop {
                    let finished = stop.load(Ordering::Relaxed);
                    let mut tasks = samples.last().map(|s| s.tasks.clone()).unwrap_or_default();
                    let before_ns = monotonic_ns();
                    for &tid in &tids {
                        if let Some(t) = task_times(pid, tid) {
                            tasks.insert(tid, t);
                        }
                    }
                    samples.push(Sample {
                        // The middle of the reads: they take microseconds, not nothing.
                        t_ns: before_ns + (monotonic_ns() - before_ns) / 2,
                        tasks,
                        steal_ns: steal_ns_per_cpu(),
                    });
                    let _ = first_tx.send(());
                    // One last reading after the stop request, so the window is covered.
                    if finished {
                        return samples;
                    }
                    std::thread::sleep(every);
                }
            })
        };
        first_rx.recv().unwrap();
        Self { stop, handle }
    }

    pub fn stop(self) -> Samples {
        self.stop.store(true, Ordering::Relaxed);
        Samples(self.handle.join().unwrap())
    }
}

/// The readings of a finished [`Sampler`].
pub struct Samples(Vec<Sample>);

/// The kernel's view of one thread over (nearly) a recording's window, as shares of it.
#[derive(Clone, Copy, Debug)]
pub struct OracleSplit {
    /// schedstat CPU time; leaves out stolen time.
    pub on_cpu: f64,
    /// schedstat run-queue wait.
    pub runqueue: f64,
    /// Delay accounting's blkio counter.
    pub blkio: f64,
    /// The largest share of the window stolen from any one CPU.
    pub steal: f64,
    /// How far the edges were moved from the recording's, in ms (start, end).
    pub edge_shift_ms: (f64, f64),
}

impl OracleSplit {
    /// The range a wall-clock measure of on-CPU time may fall in: stolen time counts for
    /// nothing in schedstat, and at most the whole steal share of the CPU counts as on-CPU
    /// for stallscope.
    pub fn on_cpu_range(&self) -> (f64, f64) {
        (self.on_cpu, self.on_cpu / (1.0 - self.steal).max(0.01))
    }
}

impl Samples {
    fn task(s: &Sample, tid: u32) -> TaskTimes {
        *s.tasks
            .get(&tid)
            .unwrap_or_else(|| panic!("the oracle never read thread {tid}"))
    }

    /// Whether schedstat's run-queue total is complete at reading `k`: the thread ran since
    /// the reading before (so any wait it is in began less than an interval ago), or it is
    /// asleep (so it is in no run queue at all).
    fn settled(&self, tid: u32, k: usize) -> bool {
        let (before, now) = (Self::task(&self.0[k - 1], tid), Self::task(&self.0[k], tid));
        now.on_cpu_ns > before.on_cpu_ns || matches!(now.state, 'S' | 'D')
    }

    /// The settled reading nearest to `t_ns`.
    fn settled_near(&self, tid: u32, t_ns: u64) -> usize {
        let s = &self.0;
        let first = s.first().unwrap().t_ns;
        let last = s.last().unwrap().t_ns;
        assert!(
            first <= t_ns && t_ns <= last,
            "the oracle's readings ({first}..{last}) do not cover {t_ns}"
        );
        let nearest = s.partition_point(|x| x.t_ns < t_ns).min(s.len() - 1);
        (0..s.len())
            .flat_map(|d| [nearest.checked_add(d), nearest.checked_sub(d)])
            .flatten()
            .find(|&k| k >= 1 && k < s.len() && self.settled(tid, k))
            .unwrap_or_else(|| panic!("thread {tid} never ran while the oracle watched it"))
    }

    /// An upper bound on the thread's run-queue wait within `[start_ns, end_ns]`: the growth
    /// of schedstat's total from the last reading before `start_ns` to the first settled one
    /// after `end_ns`. A wait still open at that reading began after the thread last ran, so
    /// less than one interval before it, and is missing from the bound.
    pub fn runqueue_at_most(&self, tid: u32, start_ns: u64, end_ns: u64) -> f64 {
        let s = &self.0;
        let a = s.partition_point(|x| x.t_ns <= start_ns).checked_sub(1);
        let a = a.unwrap_or_else(|| panic!("no oracle reading before {start_ns}"));
        let b = (s.partition_point(|x| x.t_ns < end_ns).max(1)..s.len())
            .find(|&k| self.settled(tid, k))
            .unwrap_or_else(|| panic!("no settled oracle reading after {end_ns}"));
        Self::task(&s[b], tid).runqueue_ns - Self::task(&s[a], tid).runqueue_ns
    }

    /// What share of (about) `[start_ns, end_ns]` the thread spent on CPU, queued and in
    /// IO wait.
    pub fn split(&self, tid: u32, start_ns: u64, end_ns: u64) -> OracleSplit {
        let (a, b) = (
            &self.0[self.settled_near(tid, start_ns)],
            &self.0[self.settled_near(tid, end_ns)],
        );
        let (ta, tb) = (Self::task(a, tid), Self::task(b, tid));
        let window = (b.t_ns - a.t_ns) as f64;
        let steal = a
            .steal_ns
            .iter()
            .zip(&b.steal_ns)
            .map(|(x, y)| (y - x) / window)
            .fold(0.0, f64::max);
        let shift_ms = |x: u64, y: u64| (x as f64 - y as f64) / 1e6;
        OracleSplit {
            on_cpu: (tb.on_cpu_ns - ta.on_cpu_ns) / window,
            runqueue: (tb.runqueue_ns - ta.runqueue_ns) / window,
            blkio: (tb.blkio_ns - ta.blkio_ns) / window,
            steal,
            edge_shift_ms: (shift_ms(a.t_ns, start_ns), shift_ms(b.t_ns, end_ns)),
        }
    }

    /// The share of readings within `[start_ns, end_ns]` that found the thread in `state`.
    pub fn state_share(&self, tid: u32, start_ns: u64, end_ns: u64, state: char) -> f64 {
        let inside: Vec<char> = self
            .0
            .iter()
            .filter(|s| (start_ns..=end_ns).contains(&s.t_ns))
            .map(|s| Self::task(s, tid).state)
            .collect();
        assert!(
            inside.len() >= 100,
            "only {} state readings in the window: too few for a share",
            inside.len()
        );
        inside.iter().filter(|&&c| c == state).count() as f64 / inside.len() as f64
    }

    /// The largest share of the sampled period stolen from any one CPU.
    pub fn steal(&self) -> f64 {
        let (a, b) = (self.0.first().unwrap(), self.0.last().unwrap());
        let period = (b.t_ns - a.t_ns).max(1) as f64;
        a.steal_ns
            .iter()
            .zip(&b.steal_ns)
            .map(|(x, y)| (y - x) / period)
            .fold(0.0, f64::max)
    }

    /// The last reading of a thread (its totals, if it exited while watched).
    pub fn last(&self, tid: u32) -> TaskTimes {
        Self::task(self.0.last().unwrap(), tid)
    }
}
