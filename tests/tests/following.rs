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

/// The TIDs and schedstat on-CPU times a finished `churn` workload printed.
fn churned(stdout: &str) -> Vec<(u32, u64)> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(stallscope_tests::cpu::CHURNED)?;
            let rest = rest.strip_prefix(" tid=")?;
            let (tid, on_cpu) = rest.split_once(" on_cpu_ns=")?;
            Some((tid.parse().ok()?, on_cpu.parse().ok()?))
        })
        .collect()
}

/// A `churn` recording: the report, the TIDs and on-CPU times the threads printed, and the
/// time the hypervisor stole from all CPUs meanwhile, in ns.
struct Churn {
    report: serde_json::Value,
    printed: Vec<(u32, u64)>,
    steal_ns: u64,
}

/// /proc/stat counts steal in ticks of 10 ms: a delta can be short by one per CPU.
const STEAL_TICK_NS: u64 = 10_000_000;

/// Starts `churn` (after 2 s, `threads` threads, 4 at a time, burning `burn_ms` each) and
/// records it with `extra` options.
fn record_churn(threads: usize, burn_ms: u64, extra: &[&str]) -> Churn {
    let threads_arg = threads.to_string();
    let burn_arg = burn_ms.to_string();
    let w = Workload::start(&[
        "churn",
        "--delay-ms",
        "2000",
        "--threads",
        &threads_arg,
        "--batch",
        "4",
        "--burn-ms",
        &burn_arg,
        "--secs",
        "5",
    ]);
    let dir = Scratch::new("churn");
    let steal_before = procfs::steal_ns_per_cpu();
    let rec = start_record(&[w.pid], "4s", &dir.join("x.rec"), extra);
    let tracing = wait_tracing(&rec);
    let finished = rec.finish(RECORD_TIMEOUT);
    assert_success(&finished, "stallscope record");
    assert!(
        tracing.contains("tracing 1 thread(s)"),
        "stallscope should have attached before the churn began; it says: {tracing}"
    );
    let steal_after = procfs::steal_ns_per_cpu();
    let steal_ns = steal_after
        .iter()
        .zip(&steal_before)
        .map(|(a, b)| (a - b).max(0.0) as u64 + STEAL_TICK_NS)
        .sum();
    let workload = w.finish(RECORD_TIMEOUT);
    let printed = churned(&workload.stdout);
    assert_eq!(
        printed.len(),
        threads,
        "the workload should report every thread it ran:\n{}",
        workload.describe()
    );
    Churn {
        report: parse_report(&finished.stdout),
        printed,
        steal_ns,
    }
}

/// A thread's own exit path, after it read its CPU time: a generous bound.
const EXIT_PATH_NS: u64 = 500_000;

/// A churned thread's on-CPU time against what the kernel counted for it, and its four
/// states against its lifetime. stallscope's count runs on past the thread's own clock read
/// (to its exit), and includes time stolen by the hypervisor, which the kernel's per-thread
/// clock leaves out; a thread credited with another's time, as a recycled account would be,
/// lands outside.
fn own_account(t: &serde_json::Value, kernel_on_cpu_ns: u64, steal_ns: u64) -> Result<(), String> {
    let ours = u64_field(t, "on_cpu_ns");
    let (lo, hi) = (
        kernel_on_cpu_ns.saturating_sub(EXIT_PATH_NS),
        kernel_on_cpu_ns + EXIT_PATH_NS + steal_ns,
    );
    if !(lo..=hi).contains(&ours) {
        return Err(format!(
            "thread {} ran {:.2} ms by the kernel's count (plus at most {:.1} ms stolen) but \
             stallscope says {:.2} ms: {t}",
            t["tid"],
            kernel_on_cpu_ns as f64 / 1e6,
            steal_ns as f64 / 1e6,
            ours as f64 / 1e6
        ));
    }
    if t["exited"] != true {
        return Err(format!("the thread exited: {t}"));
    }
    split(t);
    Ok(())
}

/// The threads of `printed` in the report.
fn traced(c: &Churn) -> Vec<(&serde_json::Value, u64)> {
    let threads = c.report["threads"].as_array().unwrap();
    c.printed
        .iter()
        .filter_map(|&(tid, ns)| threads.iter().find(|t| t["tid"] == tid).map(|t| (t, ns)))
        .collect()
}

/// Every traced churned thread has its own account, and together they hold no more than
/// the kernel counted plus what was stolen. Returns how many were traced.
fn accounts(c: &Churn) -> Result<usize, String> {
    let traced = traced(c);
    for &(t, kernel_on_cpu_ns) in &traced {
        own_account(t, kernel_on_cpu_ns, c.steal_ns)?;
    }
    let ours: u64 = traced.iter().map(|(t, _)| u64_field(t, "on_cpu_ns")).sum();
    let kernel: u64 = traced.iter().map(|&(_, ns)| ns).sum();
    let slack = c.steal_ns + EXIT_PATH_NS * traced.len() as u64;
    eprintln!(
        "{} churned threads traced: stallscope {:.1} ms on-CPU, kernel {:.1} ms, stolen at \
         most {:.1} ms",
        traced.len(),
        ours as f64 / 1e6,
        kernel as f64 / 1e6,
        c.steal_ns as f64 / 1e6
    );
    if !(ours + EXIT_PATH_NS >= kernel && ours <= kernel + slack) {
        return Err(format!(
            "the churned threads ran {:.1} ms by the kernel's count (plus at most {:.1} ms \
             stolen and exit paths); stallscope says {:.1} ms",
            kernel as f64 / 1e6,
            slack as f64 / 1e6,
            ours as f64 / 1e6
        ));
    }
    Ok(traced.len())
}

fn assert_accounts(c: &Churn) -> usize {
    accounts(c).unwrap_or_else(|e| panic!("{e}"))
}

/// The checks of one run of 200 churned threads.
fn churned_apart(c: &Churn) -> Result<(), String> {
    let traced = accounts(c)?;
    if traced != 200 {
        return Err(format!(
            "every churned thread should be traced: {traced} of 200"
        ));
    }
    if c.report["lost_events"] != 0 {
        return Err(format!("nothing should be lost: {}", c.report["events"]));
    }
    Ok(())
}

#[test]
fn short_lived_threads_each_get_their_own_account() {
    let _serial = serial();
    // Once in several CI runs, on a loaded machine, one of the 200 threads has had 0.6 to
    // 1.3 ms of its time on a CPU counted as blocked, which 13 runs beside a CPU hog here did
    // not reproduce: one more run is allowed, it must pass on its own, and xtask reports it,
    // so that the loss stays in sight.
    if let Err(first) = churned_apart(&record_churn(200, 5, &[])) {
        stallscope_tests::reruns::note("short_lived_threads", &first);
        if let Err(e) = churned_apart(&record_churn(200, 5, &[])) {
            panic!("{e}");
        }
    }
}

/// With per-thread switch events, threads created after attach inherit their creator's
/// event (or get their own when created near its opening): each still gets its own account.
#[test]
fn short_lived_threads_each_get_their_own_account_with_per_thread_events() {
    let _serial = serial();
    let extra = ["--switch-hook", "per-thread"];
    if let Err(first) = churned_apart(&record_churn(200, 5, &extra)) {
        stallscope_tests::reruns::note("short_lived_threads_per_thread", &first);
        if let Err(e) = churned_apart(&record_churn(200, 5, &extra)) {
            panic!("{e}");
        }
    }
}

#[test]
fn threads_beyond_max_threads_are_counted_not_traced() {
    let _serial = serial();
    // Room for the workload's main thread and two more: each batch of four has two too many.
    let c = record_churn(40, 20, &["--max-threads", "3"]);
    let traced = assert_accounts(&c);
    let untracked = &c.report["events"]["thread_untracked"];
    eprintln!("--max-threads 3: {traced} of 40 churned threads traced, untracked {untracked}");
    assert_eq!(
        u64_field(untracked, "lost") as usize + traced,
        40,
        "every thread is either traced or counted untracked: {untracked}"
    );
    assert!(
        u64_field(untracked, "lost") > 0 && traced >= 2,
        "with four threads at a time and two free slots, some must be traced and some \
         refused: {untracked}"
    );
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
