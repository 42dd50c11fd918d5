//! The waits inside a window of time: summed by kind over the threads asked about, each
//! prorated by its overlap with the window.
use super::view::{HostWait, WaitKind};

/// Wait time of `tids` inside `[start, end)`, by kind, and the copy bytes prorated into it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WaitTotals {
    /// Inside copy calls: staging pageable memory, or a synchronous copy.
    pub call_copy_ns: f64,
    /// In syncs with a copy outstanding (which also wait for the kernels queued after it).
    pub sync_copy_ns: f64,
    /// The pinned bytes those syncs' copies moved (at the link's pace)...
    pub sync_pinned_bytes: f64,
    /// ...and the staging time of their pageable copies (a bound on the DMA after it).
    pub sync_staged_ns: f64,
    pub collective_ns: f64,
    pub kernel_ns: f64,
    /// All copy bytes, calls and syncs (a copy a sync waited for counts in both).
    pub copy_bytes: f64,
    /// The bytes of the copy calls alone: each copy once.
    pub call_copy_bytes: f64,
}

impl WaitTotals {
    pub fn total(&self) -> f64 {
        self.call_copy_ns + self.sync_copy_ns + self.collective_ns + self.kernel_ns
    }

    pub fn copy_ns(&self) -> f64 {
        self.call_copy_ns + self.sync_copy_ns
    }

    /// Every total times `k`: what a part of a window saw, taken for the whole of it.
    pub fn scaled(self, k: f64) -> Self {
        Self {
            call_copy_ns: self.call_copy_ns * k,
            sync_copy_ns: self.sync_copy_ns * k,
            sync_pinned_bytes: self.sync_pinned_bytes * k,
            sync_staged_ns: self.sync_staged_ns * k,
            collective_ns: self.collective_ns * k,
            kernel_ns: self.kernel_ns * k,
            copy_bytes: self.copy_bytes * k,
            call_copy_bytes: self.call_copy_bytes * k,
        }
    }
}

/// Finds waits overlapping a window quickly: waits are short next to a recording, so a
/// search on start plus a bounded look-back (the longest wait) finds every overlap.
pub struct WaitIndex<'a> {
    waits: &'a [HostWait],
    longest: u64,
}

impl<'a> WaitIndex<'a> {
    pub fn new(waits: &'a [HostWait]) -> Self {
        let longest = waits
            .iter()
            .map(|w| w.end_ns - w.start_ns)
            .max()
            .unwrap_or(0);
        Self { waits, longest }
    }

    pub fn totals(&self, start: u64, end: u64, tid: impl Fn(u32) -> bool) -> WaitTotals {
        let mut t = WaitTotals::default();
        let from = self
            .waits
            .partition_point(|w| w.start_ns < start.saturating_sub(self.longest));
        for w in &self.waits[from..] {
            if w.start_ns >= end {
                break;
            }
            if !tid(w.tid) {
                continue;
            }
            let overlap = end.min(w.end_ns).saturating_sub(start.max(w.start_ns));
            if overlap == 0 {
                continue;
            }
            let ns = overlap as f64;
            let len = (w.end_ns - w.start_ns).max(1) as f64;
            let bytes = w.bytes as f64 * ns / len;
            match (w.kind, w.sync) {
                (WaitKind::PageableCopy | WaitKind::PinnedCopy, false) => {
                    t.call_copy_ns += ns;
                    t.call_copy_bytes += bytes;
                }
                (WaitKind::PageableCopy | WaitKind::PinnedCopy, true) => {
                    t.sync_copy_ns += ns;
                    t.sync_pinned_bytes += w.pinned_bytes as f64 * ns / len;
                    t.sync_staged_ns += w.staged_ns as f64 * ns / len;
                }
                (WaitKind::Collective, _) => t.collective_ns += ns,
                (WaitKind::Kernel, _) => t.kernel_ns += ns,
            }
            t.copy_bytes += bytes;
        }
        t
    }
}
