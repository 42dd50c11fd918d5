//! While per-thread events see the switches (see `switch_control.rs`): which tracked threads
//! carry a context-switch event, the switch-out program's only way in (see profiler-ebpf's
//! switch_event.rs).
//!
//! The threads listed at attach get an event each. The kernel copies an event to every
//! thread and process created by a thread that has one (`inherit`), so the tree is followed
//! with no work here, except for a thread created while its parent had no event yet: one
//! listed at attach that created it before its own event was opened, or a thread of those.
//! The fork record says who created whom and when; a thread created by a parent hooked less
//! than [`INHERIT_SLACK_NS`] before gets an event of its own. The kernel copies a parent's
//! events while it builds the child, before the fork record's clock read, so near the
//! parent's opening the two cannot be ordered; a thread that then carries two events has
//! each switch counted once (the program compares the scheduler's count of its runs).
use std::collections::HashMap;

use super::loader;
use crate::capture::clock::monotonic_ns;

/// Beyond this after its parent's event was opened, a new thread certainly inherited a copy.
const INHERIT_SLACK_NS: u64 = 10_000_000;

/// Whether a thread created at `born_ns` needs an event of its own, given since when its
/// parent's switches reached the program (`None`: never, as far as we know).
pub fn needs_own_event(parent_hooked_ns: Option<u64>, born_ns: u64) -> bool {
    parent_hooked_ns.is_none_or(|since| born_ns <= since.saturating_add(INHERIT_SLACK_NS))
}

#[derive(Default)]
pub struct SwitchHooks {
    /// Per tracked thread: since when its switches reach the program.
    hooked_ns: HashMap<u32, u64>,
    /// The events opened here (not the inherited copies, which close with them).
    links: Vec<aya::programs::perf_event::PerfEventLinkId>,
    /// Threads gone before their event could be opened.
    vanished: u64,
}

impl SwitchHooks {
    /// Opens an event on `tid`, its switches counted from when the call returns. A thread
    /// that no longer exists is not an error: it has nothing left to record.
    pub fn hook(&mut self, ebpf: &mut aya::Ebpf, tid: u32) -> anyhow::Result<()> {
        match loader::hook_switches(ebpf, tid) {
            Ok(link) => {
                self.links.push(link);
                self.hooked_ns.insert(tid, monotonic_ns());
                Ok(())
            }
            Err(e) if gone(&e, tid) => {
                self.vanished += 1;
                Ok(())
            }
            Err(e) => Err(e.context(format!("opening the context-switch event of thread {tid}"))),
        }
    }

    /// A tracked thread was created at `born_ns` by `parent`: it inherited its parent's
    /// event, or gets one now.
    pub fn born(
        &mut self,
        ebpf: &mut aya::Ebpf,
        tid: u32,
        parent: u32,
        born_ns: u64,
    ) -> anyhow::Result<()> {
        if needs_own_event(self.hooked_ns.get(&parent).copied(), born_ns) {
            self.hook(ebpf, tid)
        } else {
            self.hooked_ns.insert(tid, born_ns);
            Ok(())
        }
    }

    pub fn exited(&mut self, tid: u32) {
        self.hooked_ns.remove(&tid);
    }

    /// Closes every event: the tracepoint sees the switches again.
    pub fn unhook_all(self, ebpf: &mut aya::Ebpf) -> anyhow::Result<()> {
        for link in self.links {
            loader::unhook_switches(ebpf, link)?;
        }
        Ok(())
    }

    /// Threads that exited before their event was opened.
    pub fn vanished(&self) -> u64 {
        self.vanished
    }
}

/// Whether opening `tid`'s event failed because the thread is gone: the kernel says so
/// (ESRCH, also for one that exited and awaits its parent's wait), or /proc no longer lists it.
fn gone(e: &anyhow::Error, tid: u32) -> bool {
    let esrch = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::ESRCH))
    });
    esrch || !std::path::Path::new(&format!("/proc/{tid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_created_well_after_its_parent_was_hooked_inherits() {
        assert!(!needs_own_event(Some(1_000), 1_000 + INHERIT_SLACK_NS + 1));
    }

    #[test]
    fn a_thread_created_near_or_before_its_parents_hook_gets_its_own() {
        for born in [0, 999, 1_000, 1_000 + INHERIT_SLACK_NS] {
            assert!(needs_own_event(Some(1_000), born), "born at {born}");
        }
        assert!(needs_own_event(None, 5));
    }
}
