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
use std::time::Duration;

use super::loader::SwitchHook;

/// The target's share of the host's switches under which per-thread events cost less.
pub const PER_THREAD_BELOW_SHARE: f64 = 0.05;
/// How long the rates are measured before attaching.
pub const WINDOW: Duration = Duration::from_millis(200);

/// Context switches per second, of the target's threads and of the whole host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwitchRates {
    pub target_per_s: f64,
    pub host_per_s: f64,
}

impl SwitchRates {
    /// The target's share of the host's switches; 1 when the host made none.
    pub fn target_share(&self) -> f64 {
        if self.host_per_s > 0.0 {
            (self.target_per_s / self.host_per_s).min(1.0)
        } else {
            1.0
        }
    }
}

/// The cheaper hook for these rates.
pub fn choose(rates: &SwitchRates) -> SwitchHook {
    if rates.target_share() < PER_THREAD_BELOW_SHARE {
        SwitchHook::PerThread
    } else {
        SwitchHook::Tracepoint
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
fn host_switches() -> anyhow::Result<u64> {
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

    #[test]
    fn a_target_that_switches_little_next_to_a_busy_host_gets_per_thread_events() {
        let quiet = SwitchRates {
            target_per_s: 20.0,
            host_per_s: 40_000.0,
        };
        assert_eq!(choose(&quiet), SwitchHook::PerThread);
        for busy in [
            SwitchRates {
                target_per_s: 30_000.0,
                host_per_s: 40_000.0,
            },
            SwitchRates {
                target_per_s: 2_100.0,
                host_per_s: 40_000.0,
            },
            // An idle host: nothing to save.
            SwitchRates {
                target_per_s: 0.0,
                host_per_s: 0.0,
            },
        ] {
            assert_eq!(choose(&busy), SwitchHook::Tracepoint, "{busy:?}");
        }
    }
}
