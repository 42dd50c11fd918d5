//! Where a recording's CLOCK_MONOTONIC stamps land on the trace's timeline.
/// A recording's timestamps as the trace writes them.
pub(super) struct Clock {
    pub(super) offset: i128,
}

impl Clock {
    pub(super) fn ts(&self, ns: u64) -> u64 {
        (i128::from(ns) + self.offset).clamp(0, i128::from(u64::MAX)) as u64
    }
}
