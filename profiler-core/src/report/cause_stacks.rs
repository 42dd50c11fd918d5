//! What a cause's flame graph needs of the timed samples, summed per thread and stack while
//! they are still held: the pipeline frees them right after the attribution, and the flame
//! graphs are drawn later from these totals.
use crate::analysis::timed_events::TimedEvents;
use crate::attribution::{
    Attribution, Cause,
    evidence::{relevant, stack_totals},
};

/// One cause's samples summed per thread and stack, before any text is built: all a cause's
/// flame graph needs of the timed samples, so those can be freed before rendering.
#[derive(Clone, Debug)]
pub struct CauseStacks {
    cause: Cause,
    /// (tid, stack, samples or IO-wait ns), relevant threads only.
    totals: Vec<(u32, u32, u64)>,
}

impl CauseStacks {
    pub fn cause(&self) -> Cause {
        self.cause
    }

    pub fn is_empty(&self) -> bool {
        self.totals.is_empty()
    }

    /// (tid, stack, samples or IO-wait ns) of the threads the cause is about.
    pub fn totals(&self) -> &[(u32, u32, u64)] {
        &self.totals
    }
}

/// `timed` is the recording's (see [`Folded`](crate::analysis::fold::Folded)), `attribution` its attribution.
pub fn cause_stacks(
    timed: &TimedEvents,
    attribution: Option<&Attribution>,
    cause: Cause,
) -> CauseStacks {
    let mut out = CauseStacks {
        cause,
        totals: Vec::new(),
    };
    let Some(attr) = attribution else {
        return out;
    };
    let mut windows: Vec<(u64, u64)> = attr
        .gpus
        .iter()
        .flat_map(|g| g.windows.iter())
        .filter(|w| w.3 == cause && w.2 > 0)
        .map(|w| (w.0, w.1))
        .collect();
    windows.sort_unstable();
    // Windows of several GPUs overlap: merge them so that each sample counts once.
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(windows.len());
    for (start, end) in windows {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    out.totals = stack_totals(timed, cause, &merged)
        .into_iter()
        .filter(|&(tid, _, _)| relevant(&attr.roles, cause, tid))
        .collect();
    out
}
