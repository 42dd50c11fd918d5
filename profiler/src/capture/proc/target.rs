//! The traced process tree: the root PIDs, every descendant process and all their threads,
//! as found in /proc at attach time. The kernel side follows forks from then on.
use std::collections::{BTreeMap, BTreeSet};

use profiler_common::state;

use crate::privileges;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedThread {
    pub tid: u32,
    pub pid: u32,
    /// The kernel-side state to start from, from /proc's state letter.
    pub state: u32,
    /// The kernel's run_delay for the thread now (/proc's schedstat), the baseline of its
    /// run-queue accounting.
    pub run_delay_ns: Option<u64>,
}

/// A thread's time spent waiting on a run queue, from /proc/PID/task/TID/schedstat.
pub fn run_delay(pid: u32, tid: u32) -> Option<u64> {
    let proc = procfs::process::Process::new(pid as i32).ok()?;
    task_run_delay(&proc.task_from_tid(tid as i32).ok()?)
}

fn task_run_delay(task: &procfs::process::Task) -> Option<u64> {
    task.schedstat().ok().map(|s| s.run_delay)
}

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("no process with PID {0} (check the PID; `pgrep -f <name>` finds one by name)")]
    NoSuchProcess(u32),
    #[error("may not trace PID {pid}: {why}")]
    NotYours { pid: u32, why: String },
    #[error("cannot read /proc: {0}")]
    Proc(String),
}

/// Maps /proc's state letter to where the kernel-side accounting starts. A running and a
/// runnable task look the same in /proc, so 'R' starts as queued: if the task was in fact
/// running, its switch-out finds it was never seen switching in and counts it on-CPU since
/// the last switch seen on that CPU (none yet: since attach).
pub fn seed_state(letter: char) -> u32 {
    match letter {
        'R' => state::RUNQUEUE,
        'D' => state::IO_WAIT,
        _ => state::BLOCKED,
    }
}

/// The roots and all their descendants, by walking every process's parent in /proc. A root
/// that `caller` may not trace is refused (see [`privileges::refusal`]); a descendant that it
/// may not (a setuid program the job ran) is left out, with a warning.
pub fn process_tree(roots: &[u32], caller: u32) -> Result<BTreeSet<u32>, TargetError> {
    for &pid in roots {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(TargetError::NoSuchProcess(pid));
        }
        if let Some(why) =
            privileges::process_uids(pid).and_then(|uids| privileges::refusal(caller, uids))
        {
            return Err(TargetError::NotYours { pid, why });
        }
    }
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let all = procfs::process::all_processes().map_err(|e| TargetError::Proc(e.to_string()))?;
    for p in all.flatten() {
        if let Ok(stat) = p.stat() {
            children
                .entry(stat.ppid as u32)
                .or_default()
                .push(p.pid as u32);
        }
    }
    let mut tree = descendants(roots, &children);
    let (_, refused) =
        privileges::split_traceable(caller, &tree.iter().copied().collect::<Vec<_>>());
    for (pid, why) in refused {
        eprintln!("stallscope: warning: not tracing PID {pid}, a descendant: {why}");
        tree.remove(&pid);
    }
    Ok(tree)
}

/// Pure part of `process_tree`: the closure of `roots` under the parent → children map.
pub fn descendants(roots: &[u32], children: &BTreeMap<u32, Vec<u32>>) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    let mut todo: Vec<u32> = roots.to_vec();
    while let Some(pid) = todo.pop() {
        if out.insert(pid) {
            todo.extend(children.get(&pid).into_iter().flatten().copied());
        }
    }
    out
}

/// Every thread of `pids`. Processes that exit meanwhile are skipped.
pub fn threads(pids: &BTreeSet<u32>) -> Vec<SeedThread> {
    let mut out = Vec::new();
    for &pid in pids {
        let Ok(proc) = procfs::process::Process::new(pid as i32) else {
            continue;
        };
        let Ok(tasks) = proc.tasks() else { continue };
        for task in tasks.flatten() {
            let letter = task.stat().map(|s| s.state).unwrap_or('S');
            out.push(SeedThread {
                tid: task.tid as u32,
                pid,
                state: seed_state(letter),
                run_delay_ns: task_run_delay(&task),
            });
        }
    }
    out
}

pub fn comm(tid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{tid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

pub fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let parts: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    Some(parts.join(" "))
}

pub fn ppid(pid: u32) -> u32 {
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .map(|s| s.ppid as u32)
        .unwrap_or(0)
}

/// Launcher variables that say which rank a process is.
const RANK_VARS: [&str; 13] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "CUDA_VISIBLE_DEVICES",
];

/// The rank variables in `pid`'s environment as it was exec'd; empty when there are none.
pub fn rank_env(pid: u32) -> Vec<(String, String)> {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return Vec::new();
    };
    raw.split(|&b| b == 0)
        .filter_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            let (k, v) = kv.split_once('=')?;
            RANK_VARS
                .contains(&k)
                .then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// The process a thread belongs to (`/proc/TID` resolves any thread's ID).
pub fn tgid(tid: u32) -> Option<u32> {
    procfs::process::Process::new(tid as i32)
        .and_then(|p| p.status())
        .map(|s| s.tgid as u32)
        .ok()
}

/// Whether `pid` sees files where this process does: the same mount namespace and root.
/// Its files can then be opened by the paths its maps list, rather than through
/// `/proc/PID/root`, which names the same file differently for every process (and so
/// defeats any cache keyed by path).
pub fn shares_our_files(pid: u32) -> bool {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    let root = |p: &str| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(format!("/proc/{p}/root"))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    let pid = pid.to_string();
    let (their_ns, their_root) = (ns(&pid), root(&pid));
    their_ns.is_some()
        && their_ns == ns("self")
        && their_root.is_some()
        && their_root == root("self")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_follow_the_tree_and_ignore_others() {
        let mut children = BTreeMap::new();
        children.insert(1, vec![10, 20]);
        children.insert(10, vec![11]);
        children.insert(20, vec![21, 22]);
        children.insert(99, vec![100]);
        let got = descendants(&[10, 20], &children);
        assert_eq!(got, BTreeSet::from([10, 11, 20, 21, 22]));
    }

    #[test]
    fn missing_pid_is_a_clear_error() {
        let err = process_tree(&[u32::MAX - 1], 0).unwrap_err();
        assert!(err.to_string().contains("no process with PID"));
    }
}
