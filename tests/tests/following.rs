//! Following a process tree: processes and threads created after attach must be traced,
//! and launch mode (`record -- CMD`) must trace the command from its start to its exit.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use common::{
    Scratch,
    oracle::{COUNTERS_EVERY, Sampler},
    procfs, serial,
    spawned::Spawned,
    stallscope::{
        RECORD_TIMEOUT, assert_in_range, assert_success, command, parse_report, split,
        start_record, thread, u64_field, wait_tracing,
    },
    workload::{Workload, ready_pid, stallwork},
};

#[test]
fn follows_processes_and_threads_created_after_attach() {
    let _serial = serial();
    // The tree grows 2 s after `ready`, well after stallscope has attached.
    let w = Workload::start(&["fork-tree", "--delay-ms", "2000", "--secs", "9"]);
    let before = procfs::tree_threads(w.pid);
    let dir = Scratch::new("fork-tree");
    let rec = start_record(&[w.pid], "3s", &dir.join("x.rec"), &[]);
    let tracing = wait_tracing(&rec);
    let finished = rec.finish(RECORD_TIMEOUT);
    assert_success(&finished, "stallscope record");
    assert!(
        tracing.contains("tracing 1 thread(s)"),
        "stallscope should have attached while the workload had one thread, so that it has \
         to follow the rest; it says: {tracing}"
    );
    let after = procfs::tree_threads(w.pid);
    let report = parse_report(&finished.stdout);
    let new: Vec<(u32, u32)> = after
        .iter()
        .filter(|(tid, _)| !before.contains_key(tid))
        .map(|(&tid, &pid)| (tid, pid))
        .collect();
    // Two processes of two threads each, and two threads in the root process.
    assert_eq!(
        new.len(),
        6,
        "the workload should have grown by 6 threads: {new:?}"
    );
    for (tid, pid) in new {
        let t = thread(&report, tid);
        assert_eq!(
            u64_field(t, "pid"),
            u64::from(pid),
            "wrong process for thread {tid}: {t}"
        );
        let s = split(t);
        assert!(
            s.total_ns > 0 && u64_field(t, "on_cpu_ns") > 0,
            "thread {tid} was followed but never seen running: {t}"
        );
        if pid != w.pid {
            let p = report["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["pid"] == pid)
                .unwrap_or_else(|| panic!("process {pid} missing from the report"));
            assert_eq!(
                p["ppid"], w.pid,
                "process {pid} should be a child of the root: {p}"
            );
        }
    }
}

#[test]
fn launch_mode_traces_the_command_to_its_exit() {
    let _serial = serial();
    let dir = Scratch::new("launch");
    let mut cmd = command();
    cmd.args(["record", "-d", "4s", "--json", "-o"])
        .arg(dir.join("x.rec"))
        .args(["--", stallwork(), "spin", "--secs", "2"]);
    let rec = Spawned::start(&mut cmd);
    // The command shares stallscope's stdout, so its `ready` line shows up there.
    let pid = rec
        .wait_stdout(RECORD_TIMEOUT, |l| l.starts_with("ready pid="))
        .as_deref()
        .and_then(ready_pid)
        .unwrap_or_else(|| {
            panic!(
                "the launched command never started:\n{}",
                rec.stderr_so_far()
            )
        });
    let sampler = Sampler::start(pid, &[pid], COUNTERS_EVERY);
    let finished = rec.finish(RECORD_TIMEOUT);
    let samples = sampler.stop();
    assert_success(&finished, "stallscope record -- stallwork spin");
    assert!(
        finished.stderr.contains("the target exited"),
        "stallscope should say the target exited:\n{}",
        finished.describe()
    );
    let report = parse_report(&finished.stdout);
    assert_eq!(report["end_reason"], "target_exited", "end_reason");
    assert!(
        u64_field(&report, "duration_ns") < 3_900_000_000,
        "the recording should end when the command exits, not at the 4 s duration: {}",
        report["duration_ns"]
    );
    let t = thread(&report, pid);
    assert_eq!(
        t["comm"], "stallwork",
        "the thread should carry the command's name: {t}"
    );
    assert_eq!(t["exited"], true, "the command's thread exited: {t}");
    let s = split(t);
    // The thread lived from the launch (before the start of the window) to its exit, so its
    // whole schedstat CPU time belongs to the recording.
    // Stolen time is missing from schedstat's figure (see common::oracle).
    let kernel_on_cpu = samples.last(pid).on_cpu_ns / s.total_ns as f64;
    let steal = samples.steal();
    eprintln!(
        "launched spinner: stallscope {s:?}, kernel on-CPU {kernel_on_cpu:.3}, steal {steal:.3}"
    );
    assert_in_range(
        "launched spinner on-CPU",
        s.on_cpu,
        (kernel_on_cpu, kernel_on_cpu / (1.0 - steal)),
    );
    assert!(
        u64_field(t, "on_cpu_ns") > 1_000_000_000 / 2,
        "a 2 s spinner should be on a CPU for well over 0.5 s: {t}"
    );
}
