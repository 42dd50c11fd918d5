//! What the feeder's blocked time was for, window by window: the shares of its sampled
//! off-CPU time spent waiting for the GIL, on a lock of the job, and for work from outside the
//! job (see [`crate::analysis::wait_for`]). The rest is what the DataLoader's causes explain.
use super::roles::{Role, Roles};
use crate::analysis::{off_cpu_spans::OffCpuSpans, wait_for::WaitFor};

/// Fractions of the feeder's sampled off-CPU time in a window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WaitShares {
    /// Taking the GIL back.
    pub gil: f64,
    /// In lock frames, no waker recorded: a lock only when the workers do not explain it
    /// (a DataLoader's queue is a lock and a condition too).
    pub lock: f64,
    /// Woken from a lock or futex by a traced thread that is not a DataLoader worker.
    pub lock_woken: f64,
    /// Input from outside the job.
    pub outside: f64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    gil: u64,
    lock: u64,
    lock_woken: u64,
    outside: u64,
    all: u64,
}

impl Totals {
    fn add(&mut self, roles: &Roles, wait: WaitFor, ns: u64) {
        self.all = self.all.saturating_add(ns);
        let class = match wait {
            WaitFor::Gil => &mut self.gil,
            WaitFor::Lock => &mut self.lock,
            WaitFor::JobThread { tid, lock: true } if roles.role(tid) != Role::Worker => {
                &mut self.lock_woken
            }
            WaitFor::Outside => &mut self.outside,
            _ => return,
        };
        *class = class.saturating_add(ns);
    }

    fn shares(&self) -> Option<WaitShares> {
        let all = self.all as f64;
        (self.all > 0).then(|| WaitShares {
            gil: self.gil as f64 / all,
            lock: self.lock as f64 / all,
            lock_woken: self.lock_woken as f64 / all,
            outside: self.outside as f64 / all,
        })
    }
}

/// The feeders' waits, looked up by window.
pub struct FeederWaits<'x> {
    spans: &'x OffCpuSpans,
    roles: &'x Roles,
    /// Over the whole recording: for a window whose blocked time no sample caught.
    whole: WaitShares,
}

impl<'x> FeederWaits<'x> {
    pub fn new(spans: &'x OffCpuSpans, roles: &'x Roles) -> Self {
        let mut w = Self {
            spans,
            roles,
            whole: WaitShares::default(),
        };
        w.whole = w.totals(0, u64::MAX).shares().unwrap_or_default();
        w
    }

    fn totals(&self, start: u64, end: u64) -> Totals {
        let mut t = Totals::default();
        for &tid in &self.roles.feeders {
            for (wait, ns) in self.spans.waits_inside(tid, start, end) {
                t.add(self.roles, wait, ns);
            }
        }
        t
    }

    /// The shares inside `[start, end)`; the recording's where no sample fell inside.
    pub fn window(&self, start: u64, end: u64) -> WaitShares {
        self.totals(start, end).shares().unwrap_or(self.whole)
    }
}

/// The feeders' top waits over the recording, each with its share of the feeder's sampled
/// blocked time and who ended it most: `futex 0x7f.. (98%), woken by TID 812 (python)`.
pub fn top_waits(a: &crate::analysis::model::Analysis, roles: &Roles, n: usize) -> Vec<String> {
    let mut out: Vec<(u64, String)> = Vec::new();
    for t in roles.feeders.iter().filter_map(|t| a.threads.get(t)) {
        let all: u64 = t.blocked_on.iter().map(|b| b.ns).sum();
        for b in t.blocked_on.iter().take(n) {
            let mut s = b.call.clone();
            if !b.detail.is_empty() {
                s.push_str(&format!(" {}", b.detail));
            }
            s.push_str(&format!(
                " ({:.0}%)",
                b.ns as f64 * 100.0 / all.max(1) as f64
            ));
            if let Some(w) = b.wakers.first() {
                s.push_str(&format!(", woken by {}", w.who));
            }
            out.push((b.ns, s));
        }
    }
    out.sort_by(|x, y| y.0.cmp(&x.0).then_with(|| x.1.cmp(&y.1)));
    out.into_iter().take(n).map(|(_, s)| s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_windows_waits_are_split_by_what_they_were_for_and_a_workers_wake_up_is_theirs() {
        let mut spans = OffCpuSpans::default();
        let feeder = 10;
        let sample = |s: &mut OffCpuSpans, at: u64, len: u64, w: WaitFor| {
            s.off_cpu_sample(at, (feeder, feeder), len, w)
        };
        sample(&mut spans, 0, 40, WaitFor::Gil);
        sample(&mut spans, 40, 20, WaitFor::Outside);
        sample(
            &mut spans,
            60,
            20,
            WaitFor::JobThread {
                tid: 20,
                lock: true,
            },
        );
        sample(
            &mut spans,
            80,
            10,
            WaitFor::JobThread {
                tid: 11,
                lock: true,
            },
        );
        sample(&mut spans, 90, 10, WaitFor::Unsaid);
        sample(&mut spans, 200, 10, WaitFor::Lock);
        spans.finish();
        let roles = Roles {
            feeders: [feeder].into(),
            workers: [20].into(),
        };
        let waits = FeederWaits::new(&spans, &roles);
        let w = waits.window(0, 100);
        assert_eq!(
            w,
            WaitShares {
                gil: 0.4,
                lock: 0.0,
                lock_woken: 0.1,
                outside: 0.2
            }
        );
        assert_eq!(waits.window(200, 300).lock, 1.0);
        // No sample inside: the recording's shares.
        let whole = waits.window(120, 190);
        assert!((whole.gil - 40.0 / 110.0).abs() < 1e-12, "{whole:?}");
    }
}
