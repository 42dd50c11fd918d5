//! The kernel's own per-thread accounting, read from /proc: the oracle the tests hold
//! stallscope's numbers against.
use std::collections::{BTreeMap, BTreeSet};

/// Cumulative times of one thread since it started, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TaskTimes {
    /// schedstat field 1: time on a CPU (`se.sum_exec_runtime`).
    pub on_cpu_ns: f64,
    /// schedstat field 2: time runnable but waiting in a run queue (`sched_info.run_delay`).
    pub runqueue_ns: f64,
    /// stat field 42, `delayacct_blkio_ticks`: time blocked on block IO, in clock ticks.
    /// Counted only while kernel.task_delayacct is on (see [`enable_delay_accounting`]).
    pub blkio_ns: f64,
    /// stat field 3, the state letter at the moment of reading (R, S, D, ...).
    pub state: char,
}

/// Reads a thread's times; `None` once it is gone.
pub fn task_times(pid: u32, tid: u32) -> Option<TaskTimes> {
    let dir = format!("/proc/{pid}/task/{tid}");
    let schedstat = std::fs::read_to_string(format!("{dir}/schedstat")).ok()?;
    let mut fields = schedstat.split_whitespace().map(|f| f.parse::<f64>().ok());
    let on_cpu_ns = fields.next()??;
    let runqueue_ns = fields.next()??;
    let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
    // The name in parentheses may hold spaces; fields after it start at field 3 (state).
    let after_name = &stat[stat.rfind(')')? + 1..];
    let state = after_name.trim_start().chars().next()?;
    let blkio_ticks: f64 = after_name.split_whitespace().nth(42 - 3)?.parse().ok()?;
    Some(TaskTimes {
        on_cpu_ns,
        runqueue_ns,
        blkio_ns: blkio_ticks * 1e9 / clock_ticks_per_sec(),
        state,
    })
}

/// Time each CPU's hypervisor ran something else while this guest wanted the CPU ("steal"
/// in /proc/stat), in ns, by CPU number. Threads' CPU time in schedstat excludes it.
pub fn steal_ns_per_cpu() -> Vec<f64> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    stat.lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            let ticks: f64 = l
                .split_whitespace()
                .nth(8)
                .and_then(|f| f.parse().ok())
                .unwrap_or(0.0);
            ticks * 1e9 / clock_ticks_per_sec()
        })
        .collect()
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// Turns on per-task delay accounting, without which stat's blkio field stays 0. Before the
/// workload starts: a task already blocked when it is switched on would be charged for time
/// it waited before.
pub fn enable_delay_accounting() {
    let knob = "/proc/sys/kernel/task_delayacct";
    if std::fs::read_to_string(knob).is_ok_and(|v| v.trim() == "1") {
        return;
    }
    std::fs::write(knob, "1").unwrap_or_else(|e| {
        panic!("cannot enable delay accounting (the IO-wait oracle) through {knob}: {e}")
    });
}

/// The thread IDs of a process.
pub fn tids(pid: u32) -> Vec<u32> {
    let mut out: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Every thread of `root` and its descendant processes, as TID → PID.
pub fn tree_threads(root: u32) -> BTreeMap<u32, u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Some(parent) = ppid(pid) {
            children.entry(parent).or_default().push(pid);
        }
    }
    let mut pids = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        if pids.insert(pid) {
            todo.extend(children.get(&pid).into_iter().flatten());
        }
    }
    pids.iter()
        .flat_map(|&pid| tids(pid).into_iter().map(move |tid| (tid, pid)))
        .collect()
}

/// The one-letter state of a process (R, S, D, Z, ...), `None` once it is reaped.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// IDs of the eBPF programs a process holds open, from its descriptors' fdinfo: a program fd
/// shows `prog_id`, and so does a link fd, naming the program it holds.
pub fn bpf_prog_ids_held(pid: u32) -> BTreeSet<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return BTreeSet::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|info| {
            info.lines()
                .filter_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}
