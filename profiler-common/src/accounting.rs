//! The per-thread state machine that the scheduler programs drive, free of kernel calls so
//! that host tests can replay event sequences through it. Everything is `#[inline(always)]`:
//! the programs cannot afford calls, and the verifier checks the code where it is used.
use crate::{OFFCPU_SAMPLE_BURST, RUN_DELAY_UNKNOWN, ThreadStats, state};

impl ThreadStats {
    /// Adds the time since `since_ns` to the bucket of the current state. Written as four
    /// selects rather than a match: LLVM turns the match into an indexed store the verifier
    /// cannot bound.
    #[inline(always)]
    pub fn credit(&mut self, now: u64) {
        let dur = now.saturating_sub(self.since_ns);
        let s = self.state;
        self.on_cpu_ns += if s == state::ON_CPU { dur } else { 0 };
        self.runqueue_ns += if s == state::RUNQUEUE { dur } else { 0 };
        self.io_wait_ns += if s == state::IO_WAIT { dur } else { 0 };
        self.blocked_ns += if s == state::BLOCKED { dur } else { 0 };
        self.since_ns = now;
    }

    /// Ends an off-CPU period at `now`, a switch-in: credits the period to its state and
    /// remembers it for [`Self::settle_run_delay`].
    #[inline(always)]
    pub fn come_back(&mut self, now: u64) {
        self.off_state = self.state;
        self.off_len_ns = now.saturating_sub(self.since_ns);
        self.credit(now);
        self.state = state::ON_CPU;
    }

    /// The thread is on a CPU at `now` (a stack sample landed on it, or it is switching
    /// out). If it is recorded off-CPU, its switch-in went unseen: the kernel did not report
    /// it, or it came before the programs attached. It came after the last switch seen on
    /// this CPU (`cpu_last_switch_ns`, 0 for none), so its off-CPU period ends there, or
    /// where the period began if that is later; the time from then on is on-CPU. Returns
    /// that moment when it ended the period.
    #[inline(always)]
    pub fn found_running(&mut self, cpu_last_switch_ns: u64, now: u64) -> Option<u64> {
        if self.state == state::ON_CPU {
            return None;
        }
        let back = if cpu_last_switch_ns > self.since_ns && cpu_last_switch_ns < now {
            cpu_last_switch_ns
        } else {
            self.since_ns
        };
        self.come_back(back);
        Some(back)
    }

    /// As [`Self::found_running`], with per-thread switch events, where no program runs at a
    /// switch-in: the thread came back at `switched_in_ns` by the scheduler's account (its
    /// `sched_info.last_arrival`, 0 when unknown). Its off-CPU period ends there, held
    /// between where the period began (a switch-in before the programs attached) and `now`
    /// (an estimate past the clock read); unknown, it ends where it began.
    #[inline(always)]
    pub fn came_back_at(&mut self, switched_in_ns: u64, now: u64) -> Option<u64> {
        if self.state == state::ON_CPU {
            return None;
        }
        let back = if switched_in_ns == 0 {
            self.since_ns
        } else {
            switched_in_ns.clamp(self.since_ns, now.max(self.since_ns))
        };
        self.come_back(back);
        Some(back)
    }

    /// At a switch-out, with the kernel's `sched_info.run_delay` of the thread: its growth
    /// since the previous switch-out is the run-queue tail of the last off-CPU period (woken,
    /// waiting for a CPU), which moves out of the bucket the period was credited to.
    #[inline(always)]
    pub fn settle_run_delay(&mut self, run_delay_ns: u64) {
        let rd = run_delay_ns;
        if self.run_delay_ns != RUN_DELAY_UNKNOWN && rd > self.run_delay_ns {
            let waited = (rd - self.run_delay_ns).min(self.off_len_ns);
            if self.off_state == state::IO_WAIT {
                let mv = waited.min(self.io_wait_ns);
                self.io_wait_ns -= mv;
                self.runqueue_ns += mv;
            } else if self.off_state == state::BLOCKED {
                let mv = waited.min(self.blocked_ns);
                self.blocked_ns -= mv;
                self.runqueue_ns += mv;
            }
        }
        if rd != 0 {
            self.run_delay_ns = rd;
        }
        self.off_state = state::ON_CPU;
        self.off_len_ns = 0;
    }

    /// Whether an off-CPU period beginning at `now` may have its stack sampled: one every
    /// `interval` on average, the generic cell rate algorithm's way, so that a thread idle
    /// for a while may take up to [`OFFCPU_SAMPLE_BURST`] in a row. A fixed spacing would
    /// skip whatever wait came next after a short one, however long it then lasted.
    #[inline(always)]
    pub fn offcpu_sample_due(&self, now: u64, interval: u64) -> bool {
        // Not `saturating_mul`, which BPF cannot do (a 128-bit multiply).
        let slack = if interval > u64::MAX / OFFCPU_SAMPLE_BURST {
            u64::MAX
        } else {
            interval * (OFFCPU_SAMPLE_BURST - 1)
        };
        self.offcpu_next_sample_ns <= now.saturating_add(slack)
    }

    /// Spends one sample of the budget at `now` (taken, or thinned away).
    #[inline(always)]
    pub fn offcpu_sample_taken(&mut self, now: u64, interval: u64) {
        self.offcpu_next_sample_ns = self.offcpu_next_sample_ns.max(now).saturating_add(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As user space seeds a thread at attach, from its /proc state.
    fn seeded(st: u32, at: u64) -> ThreadStats {
        ThreadStats {
            state: st,
            since_ns: at,
            off_state: state::ON_CPU,
            run_delay_ns: RUN_DELAY_UNKNOWN,
            ..ThreadStats::default()
        }
    }

    fn buckets(s: &ThreadStats) -> [u64; 4] {
        [s.on_cpu_ns, s.runqueue_ns, s.io_wait_ns, s.blocked_ns]
    }

    #[test]
    fn off_cpu_samples_come_one_per_interval_after_a_burst() {
        let mut s = seeded(state::ON_CPU, 0);
        let interval = 5;
        let mut taken = Vec::new();
        // A wait every unit of time from 1000 on: the burst, then one per interval, counted
        // from the first (the fifth is the one the interval from 1000 to 1005 earned).
        for now in 1000..1030 {
            if s.offcpu_sample_due(now, interval) {
                s.offcpu_sample_taken(now, interval);
                taken.push(now);
            }
        }
        assert_eq!(
            taken,
            [1000, 1001, 1002, 1003, 1005, 1010, 1015, 1020, 1025]
        );
        // Quiet long enough to earn the whole burst back, and no more: the burst, then the
        // one its first interval earns.
        let later = 1025 + interval * OFFCPU_SAMPLE_BURST + 100;
        let burst = (later..later + 10)
            .filter(|&now| {
                let due = s.offcpu_sample_due(now, interval);
                if due {
                    s.offcpu_sample_taken(now, interval);
                }
                due
            })
            .count();
        assert_eq!(burst as u64, OFFCPU_SAMPLE_BURST + 1);
    }

    #[test]
    fn a_zero_interval_samples_every_off_cpu_period() {
        let mut s = seeded(state::ON_CPU, 0);
        for now in [7, 7, 8, 9] {
            assert!(s.offcpu_sample_due(now, 0));
            s.offcpu_sample_taken(now, 0);
        }
    }

    #[test]
    fn a_thread_running_at_attach_is_on_cpu_from_its_first_sample() {
        // Seeded as queued (/proc said R) at 100; no switch seen on its CPU since.
        let mut s = seeded(state::RUNQUEUE, 100);
        assert_eq!(s.found_running(0, 110), Some(100));
        assert_eq!(s.state, state::ON_CPU);
        s.credit(400);
        assert_eq!(buckets(&s), [300, 0, 0, 0]);
        // A second sample changes nothing.
        assert_eq!(s.found_running(0, 500), None);
    }

    #[test]
    fn an_unseen_switch_in_ends_the_wait_at_the_cpus_last_seen_switch() {
        let mut s = seeded(state::ON_CPU, 0);
        // Preempted at 100; another thread of ours ran on the CPU until 130; then the switch
        // back to this one went unreported.
        s.credit(100);
        s.state = state::RUNQUEUE;
        assert_eq!(s.found_running(130, 140), Some(130));
        s.credit(200);
        assert_eq!(buckets(&s), [100 + 70, 30, 0, 0]);
    }

    #[test]
    fn a_switch_in_ends_the_wait_where_the_scheduler_says_it_came_back() {
        let mut s = seeded(state::ON_CPU, 0);
        // Preempted at 100; back on a CPU at 130 by the scheduler's account, seen at 140.
        s.credit(100);
        s.state = state::RUNQUEUE;
        assert_eq!(s.came_back_at(130, 140), Some(130));
        s.credit(140);
        assert_eq!(buckets(&s), [110, 30, 0, 0]);
        assert_eq!(s.came_back_at(150, 160), None, "already on-CPU");
    }

    #[test]
    fn a_scheduler_switch_in_outside_the_wait_is_held_to_it() {
        // Before the wait began (before attach): the wait ends where it began. Past the clock
        // read (an estimate off a stale clock): it ends now. Unknown: where it began.
        for (at, back) in [(50, 100), (300, 200), (0, 100)] {
            let mut s = seeded(state::BLOCKED, 100);
            assert_eq!(s.came_back_at(at, 200), Some(back), "switch-in at {at}");
            s.credit(200);
            assert_eq!(buckets(&s)[0], 200 - back, "switch-in at {at}");
        }
    }

    #[test]
    fn a_cpu_switch_outside_the_wait_does_not_bound_it() {
        // The CPU's last seen switch came before the wait began, or is in the future of a
        // clock read on another CPU: the wait ends where it began.
        for last in [50, 300] {
            let mut s = seeded(state::BLOCKED, 100);
            assert_eq!(s.found_running(last, 200), Some(100));
            s.credit(200);
            assert_eq!(buckets(&s), [100, 0, 0, 0], "last seen switch {last}");
        }
    }

    #[test]
    fn run_delay_moves_the_wake_up_wait_out_of_the_sleep() {
        let mut s = seeded(state::ON_CPU, 0);
        s.run_delay_ns = 1_000;
        s.credit(100);
        s.state = state::IO_WAIT;
        s.come_back(400);
        s.credit(450);
        // 40 of the 300 off-CPU were a wait for a CPU after the IO completed.
        s.settle_run_delay(1_040);
        assert_eq!(buckets(&s), [150, 40, 260, 0]);
        assert_eq!(s.run_delay_ns, 1_040);
        // Growth beyond the period is capped at it.
        s.state = state::BLOCKED;
        s.come_back(470);
        s.settle_run_delay(1_200);
        assert_eq!(buckets(&s), [150, 60, 260, 0]);
    }

    #[test]
    fn the_first_switch_out_only_sets_the_baseline() {
        let mut s = seeded(state::BLOCKED, 0);
        s.come_back(50);
        s.settle_run_delay(9_999);
        assert_eq!(buckets(&s), [0, 0, 0, 50]);
        assert_eq!(s.run_delay_ns, 9_999);
    }
}
