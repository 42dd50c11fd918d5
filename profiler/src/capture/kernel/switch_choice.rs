//! Which hook sees the tracked threads' context switches, from how often they switch
//! against the rest of the host.
//!
//! `sched_switch`'s tracepoint runs a program on every switch of the host: an untracked
//! switch costs the dispatch and a map lookup. A per-thread perf event runs nothing for
//! untracked switches (they pay only the kernel's look for per-task events), but each switch
//! of a tracked thread pays the kernel's per-task perf context as well as the program.
//! Measured side by side on the overhead bench's ping-pong (2 vCPUs, `cargo xtask bench
//! overhead --workloads w1,w1u`): a tracked switch lost 9.6% of its rate to the tracepoint and
//! 38% to per-thread events; an untracked one 3.4% to the tracepoint and 1.4–2% to
//! per-thread events (another process's event present). Per-thread events are cheaper overall
//! when `28 × target < 1.6 × others`: the target makes under about 5% of the host's switches.
//! A job's rates change as it runs (starting up, loading data, checkpointing), so `auto`
//! keeps measuring and moves between hooks ([`Chooser`], `switch_control.rs`).
use std::time::Duration;

use super::loader::SwitchHook;

/// The target's share of the host's switches under which per-thread events cost less.
pub const PER_THREAD_BELOW_SHARE: f64 = 0.05;
/// Over this share, per-thread events are given up for the tracepoint at once: between the
/// two thresholds neither hook costs much more than the other, and the recording keeps the
/// one it has.
pub const TRACEPOINT_ABOVE_SHARE: f64 = 0.08;
/// Other threads' switches per second under which the tracepoint costs too little to save:
/// at about 0.1 µs each, under 0.01% of a CPU.
pub const WORTH_SAVING_PER_S: f64 = 1_000.0;
/// How long the rates are measured before attaching.
pub const WINDOW: Duration = Duration::from_millis(200);
/// The shortest window of a recording, read at ticks (50 ms by default): a target that turns
/// busy pays per-thread events' price on each of its switches until the window ends.
pub const LIVE_WINDOW: Duration = Duration::from_millis(40);
/// How long the target must stay under the threshold before a recording moves to per-thread
/// events; doubled by each move back to the tracepoint, so that a job whose phases alternate
/// costs a bounded number of moves (each opens an event per thread).
pub const FIRST_QUIET: Duration = Duration::from_secs(1);
pub const LONGEST_QUIET: Duration = Duration::from_secs(64);

/// Context switches per second, of the target's threads and of the whole host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwitchRates {
    pub target_per_s: f64,
    pub host_per_s: f64,
}

impl SwitchRates {
    /// The target's share of the host's switches; 0 when the host made none.
    pub fn target_share(&self) -> f64 {
        if self.host_per_s > 0.0 {
            (self.target_per_s / self.host_per_s).min(1.0)
        } else {
            0.0
        }
    }

    fn others_per_s(&self) -> f64 {
        (self.host_per_s - self.target_per_s).max(0.0)
    }
}

/// The cheaper hook for these rates.
pub fn choose(rates: &SwitchRates) -> SwitchHook {
    if rates.target_share() < PER_THREAD_BELOW_SHARE && rates.others_per_s() >= WORTH_SAVING_PER_S {
        SwitchHook::PerThread
    } else {
        SwitchHook::Tracepoint
    }
}

/// `--switch-hook auto` through a recording: the hook to move to, window by window. A target
/// that starts to switch often leaves per-thread events (38% of each of its switches) at the
/// first window over [`TRACEPOINT_ABOVE_SHARE`]; one that goes quiet gets them back only once
/// it has stayed under [`PER_THREAD_BELOW_SHARE`] for the quiet time.
#[derive(Clone, Debug)]
pub struct Chooser {
    current: SwitchHook,
    /// Where the current run of windows that favour per-thread events began.
    quiet_since_ns: Option<u64>,
    quiet_needed_ns: u64,
}

impl Chooser {
    pub fn new(current: SwitchHook) -> Self {
        Self {
            current,
            quiet_since_ns: None,
            quiet_needed_ns: FIRST_QUIET.as_nanos() as u64,
        }
    }

    /// The rates over the window [`start_ns`, `end_ns`]; returns the hook to move to.
    pub fn window(
        &mut self,
        rates: &SwitchRates,
        start_ns: u64,
        end_ns: u64,
    ) -> Option<SwitchHook> {
        let to = match self.current {
            SwitchHook::PerThread => {
                (rates.target_share() > TRACEPOINT_ABOVE_SHARE).then_some(SwitchHook::Tracepoint)
            }
            SwitchHook::Tracepoint if choose(rates) == SwitchHook::PerThread => {
                let since = *self.quiet_since_ns.get_or_insert(start_ns);
                (end_ns.saturating_sub(since) >= self.quiet_needed_ns)
                    .then_some(SwitchHook::PerThread)
            }
            SwitchHook::Tracepoint => {
                self.quiet_since_ns = None;
                None
            }
        }?;
        if to == SwitchHook::Tracepoint {
            self.quiet_needed_ns = (self.quiet_needed_ns * 2).min(LONGEST_QUIET.as_nanos() as u64);
        }
        self.current = to;
        self.quiet_since_ns = None;
        Some(to)
    }
}

/// The runs on a CPU so far (schedstat's `pcount`) of every thread of `pids`. A thread that
/// ends between the reads is missed; one that starts counts only its own runs, as the host's
/// count does.
fn target_runs(pids: &[u32]) -> std::collections::HashMap<i32, u64> {
    pids.iter()
        .filter_map(|&pid| procfs::process::Process::new(pid as i32).ok()?.tasks().ok())
        .flatten()
        .flatten()
        .filter_map(|t| Some((t.tid, t.schedstat().ok()?.pcount)))
        .collect()
}

/// The host's context switches so far (`/proc/stat`'s `ctxt`).
pub fn host_switches() -> anyhow::Result<u64> {
    use procfs::CurrentSI as _;
    Ok(procfs::KernelStats::current()
        .map_err(|e| anyhow::anyhow!("reading /proc/stat: {e}"))?
        .ctxt)
}

/// Measures both rates over [`WINDOW`].
pub fn measure(pids: &[u32]) -> anyhow::Result<SwitchRates> {
    let (host0, target0, t0) = (
        host_switches()?,
        target_runs(pids),
        std::time::Instant::now(),
    );
    std::thread::sleep(WINDOW);
    let (host1, target1) = (host_switches()?, target_runs(pids));
    let secs = t0.elapsed().as_secs_f64().max(1e-3);
    let target: u64 = target1
        .iter()
        .map(|(tid, &n)| n.saturating_sub(target0.get(tid).copied().unwrap_or(0)))
        .sum();
    Ok(SwitchRates {
        target_per_s: target as f64 / secs,
        host_per_s: host1.saturating_sub(host0) as f64 / secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(target_per_s: f64, host_per_s: f64) -> SwitchRates {
        SwitchRates {
            target_per_s,
            host_per_s,
        }
    }

    #[test]
    fn a_target_that_switches_little_next_to_a_busy_host_gets_per_thread_events() {
        assert_eq!(choose(&rates(20.0, 40_000.0)), SwitchHook::PerThread);
        for busy in [
            rates(30_000.0, 40_000.0),
            rates(2_100.0, 40_000.0),
            // A quiet host: nothing worth saving.
            rates(0.0, 0.0),
            rates(1.0, 900.0),
        ] {
            assert_eq!(choose(&busy), SwitchHook::Tracepoint, "{busy:?}");
        }
    }

    const MS: u64 = 1_000_000;

    /// Feeds 200 ms windows of `rates` from `t`; returns each window's answer.
    fn feed(c: &mut Chooser, t: &mut u64, r: SwitchRates, n: usize) -> Vec<Option<SwitchHook>> {
        (0..n)
            .map(|_| {
                *t += 200 * MS;
                c.window(&r, *t - 200 * MS, *t)
            })
            .collect()
    }

    #[test]
    fn a_busy_target_leaves_per_thread_events_at_the_first_busy_window() {
        let mut c = Chooser::new(SwitchHook::PerThread);
        let mut t = 0;
        // Between the thresholds: kept.
        assert_eq!(feed(&mut c, &mut t, rates(2_600.0, 40_000.0), 5), [None; 5]);
        assert_eq!(
            feed(&mut c, &mut t, rates(20_000.0, 40_000.0), 2),
            [Some(SwitchHook::Tracepoint), None]
        );
    }

    #[test]
    fn a_quiet_target_gets_per_thread_events_back_after_a_quiet_time_that_doubles() {
        let (quiet, busy) = (rates(10.0, 40_000.0), rates(20_000.0, 40_000.0));
        let mut c = Chooser::new(SwitchHook::Tracepoint);
        let mut t = 0;
        // 1 s of quiet, broken by a busy window, then 1 s unbroken.
        assert_eq!(feed(&mut c, &mut t, quiet, 4), [None; 4]);
        assert_eq!(feed(&mut c, &mut t, busy, 1), [None]);
        let mut answers = feed(&mut c, &mut t, quiet, 5);
        assert_eq!(answers.pop(), Some(Some(SwitchHook::PerThread)));
        assert_eq!(answers, [None; 4]);
        // Back to the tracepoint, and the next quiet time is 2 s.
        assert_eq!(
            feed(&mut c, &mut t, busy, 1),
            [Some(SwitchHook::Tracepoint)]
        );
        let answers = feed(&mut c, &mut t, quiet, 10);
        assert_eq!(answers[9], Some(SwitchHook::PerThread));
        assert!(answers[..9].iter().all(Option::is_none), "{answers:?}");
        // Each round trip doubles it, up to the longest.
        for _ in 0..10 {
            feed(&mut c, &mut t, busy, 1);
            let n = (LONGEST_QUIET.as_nanos() as u64 / (200 * MS)) as usize;
            let answers = feed(&mut c, &mut t, quiet, n + 1);
            assert_eq!(
                answers.iter().flatten().count(),
                1,
                "one move per quiet time"
            );
        }
    }
}
