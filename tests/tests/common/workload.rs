//! Starting a `stallwork` workload and waiting until its whole tree exists.
use std::{process::Command, time::Duration};

use super::spawned::{Finished, Spawned};

/// Building the demo's 64 MiB file on a slow disk takes a while.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

pub fn stallwork() -> &'static str {
    env!("CARGO_BIN_EXE_stallwork")
}

/// The `pid` a `ready pid=<pid>` line announces.
pub fn ready_pid(line: &str) -> Option<u32> {
    line.strip_prefix("ready pid=")?.trim().parse().ok()
}

/// A running workload; killed (with its children, by their death signal) when dropped.
pub struct Workload {
    pub proc: Spawned,
    pub pid: u32,
}

impl Workload {
    /// Starts `stallwork ARGS` and returns once it has printed `ready`.
    pub fn start(args: &[&str]) -> Self {
        let proc = Spawned::start(Command::new(stallwork()).args(args));
        let line = proc.wait_stdout(READY_TIMEOUT, |l| l.starts_with("ready pid="));
        let Some(pid) = line.as_deref().and_then(ready_pid) else {
            panic!(
                "stallwork {args:?} never said `ready`; stderr:\n{}",
                proc.stderr_so_far()
            );
        };
        assert_eq!(pid, proc.pid, "stallwork announced another PID");
        Self { proc, pid }
    }

    pub fn tids(&self) -> Vec<u32> {
        super::procfs::tids(self.pid)
    }

    pub fn finish(self, timeout: Duration) -> Finished {
        self.proc.finish(timeout)
    }
}
