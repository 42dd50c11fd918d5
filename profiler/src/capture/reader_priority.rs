//! The recorder's reading thread at a real-time priority while it records. On a host whose
//! CPUs are saturated (DataLoader workers, other jobs, a noisy neighbour), a reader at the
//! normal priority gets only its fair share of a CPU, and the kernel's ring buffer fills
//! behind it: the evidence is lost exactly when the host is in trouble.
//!
//! SCHED_FIFO at priority 1, the lowest real-time one (what `perf record -r 1` offers): the
//! reader runs as soon as it has work, and only then, taking from the job exactly the CPU it
//! would have taken anyway, only sooner. The kernel's real-time throttling
//! (`sched_rt_runtime_us`, 95% by default) still leaves every CPU to the others should the
//! reader ever spin. `SCHED_RESET_ON_FORK` keeps the threads it starts at the normal
//! priority, and the guard puts the thread back before the report is made. It is raised
//! just before the recorder gives up its capabilities (CAP_SYS_NICE among them); lowering it
//! again needs none.

/// What the reading thread got.
#[derive(Debug, PartialEq, Eq)]
pub enum Got {
    /// SCHED_FIFO 1.
    Realtime,
    /// Not real time (the error says why), but this nice value.
    Niced { nice: i32, why: String },
    /// Neither (both errors).
    Normal { why: String },
}

/// The calling thread's raised priority, until dropped.
pub struct Raised {
    pub got: Got,
    tid: libc::pid_t,
}

/// The nice value tried when real time is refused: as high as an unprivileged-but-capable
/// process would ask, short of the kernel threads' -20.
const FALLBACK_NICE: i32 = -10;

/// Raises the calling thread: SCHED_FIFO 1, else nice -10, else nothing.
/// `STALLSCOPE_READER_PRIORITY=normal` leaves it (for the benchmarks' side-by-side runs).
pub fn raise() -> Raised {
    // SAFETY: gettid has no preconditions. Through syscall(2): glibc's wrapper is 2.30's,
    // and the release binary needs nothing above 2.17.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t;
    if std::env::var_os("STALLSCOPE_READER_PRIORITY").is_some_and(|v| v == "normal") {
        return Raised {
            got: Got::Normal {
                why: "STALLSCOPE_READER_PRIORITY=normal".into(),
            },
            tid,
        };
    }
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: `param` is a valid sched_param; `tid` is the calling thread.
    let rc = unsafe {
        libc::sched_setscheduler(tid, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if rc == 0 {
        return Raised {
            got: Got::Realtime,
            tid,
        };
    }
    let realtime = std::io::Error::last_os_error();
    // On Linux a TID names one thread for setpriority.
    // SAFETY: plain system call on the calling thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, FALLBACK_NICE) };
    let got = if rc == 0 {
        Got::Niced {
            nice: FALLBACK_NICE,
            why: format!("SCHED_FIFO refused: {realtime}"),
        }
    } else {
        Got::Normal {
            why: format!(
                "SCHED_FIFO refused: {realtime}; nice {FALLBACK_NICE} refused: {}",
                std::io::Error::last_os_error()
            ),
        }
    };
    Raised { got, tid }
}

impl Raised {
    /// What the report says when the reader could not run at real-time priority.
    pub fn shortfall(&self) -> Option<String> {
        match &self.got {
            Got::Realtime => None,
            Got::Niced { nice, why } => Some(format!(
                "the reader ran at nice {nice}, not real time ({why}): on a saturated host it \
                 can fall behind and lose events (counted in lost_events)"
            )),
            Got::Normal { why } => Some(format!(
                "the reader ran at the normal priority ({why}): on a saturated host it can \
                 fall behind and lose events (counted in lost_events)"
            )),
        }
    }
}

impl Drop for Raised {
    fn drop(&mut self) {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: as in `raise`; back to the normal policy (keeping SCHED_RESET_ON_FORK:
        // clearing it needs CAP_SYS_NICE, dropped since), then the normal nice value.
        unsafe {
            if self.got == Got::Realtime {
                libc::sched_setscheduler(
                    self.tid,
                    libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK,
                    &param,
                );
            }
            libc::setpriority(libc::PRIO_PROCESS, self.tid as libc::id_t, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> i32 {
        // SAFETY: 0 is the calling thread.
        unsafe { libc::sched_getscheduler(0) & !libc::SCHED_RESET_ON_FORK }
    }

    #[test]
    fn the_thread_is_raised_while_held_and_put_back_after() {
        std::thread::spawn(|| {
            let raised = raise();
            match &raised.got {
                Got::Realtime => assert_eq!(policy(), libc::SCHED_FIFO),
                other => assert!(raised.shortfall().is_some(), "{other:?}"),
            }
            // A thread it starts runs at the normal policy.
            let child = std::thread::spawn(policy).join().unwrap();
            assert_eq!(child, libc::SCHED_OTHER);
            drop(raised);
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }
}
