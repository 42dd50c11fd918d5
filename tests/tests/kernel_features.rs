//! Older kernels' choices, run on this one: `STALLSCOPE_KERNEL_AS` takes away what a mainline
//! release lacks (5.14: RHEL 9; 5.15: Ubuntu 22.04), and the recorder must name each part it
//! leaves out once, keep the rest working, and read a thread's state from the task where
//! `sched_switch` has no prev_state (before 5.18). A Python job with a spinning thread and a
//! sleeping one gives the ground truth: the spinner is never blocked, the sleeper nearly
//! always is, whichever way the state is read.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{process::Command, time::Duration};

use common::{
    Scratch, serial,
    spawned::Spawned,
    stallscope::{RECORD_TIMEOUT, assert_success, command, folded, parse_report},
};
use serde_json::Value;

const JOB: &str = "\
import os, threading, time
def sleep_here():
    print(f'sleeper={threading.get_native_id()}', flush=True)
    while True:
        time.sleep(0.002)
def spin_here():
    n = 0
    while True:
        n += sum(range(1000))
threading.Thread(target=sleep_here, daemon=True).start()
time.sleep(0.2)
print(f'ready pid={os.getpid()}', flush=True)
spin_here()
";

fn thread(report: &Value, tid: u32) -> &Value {
    report["threads"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["tid"] == tid))
        .unwrap_or_else(|| panic!("thread {tid} is not in the report"))
}

fn share(t: &Value, key: &str) -> f64 {
    t[key].as_u64().unwrap() as f64 / t["lifetime_ns"].as_u64().unwrap().max(1) as f64
}

#[test]
fn older_kernels_leave_out_what_they_lack_once_and_keep_the_rest() {
    let _serial = serial();
    let dir = Scratch::new("kernel-as");
    let script = dir.join("job.py");
    std::fs::write(&script, JOB).unwrap();
    let job = Spawned::start(Command::new("/usr/bin/python3").arg(&script));
    let sleeper: u32 = job
        .wait_stdout(Duration::from_secs(30), |l| l.starts_with("sleeper="))
        .unwrap_or_else(|| panic!("no sleeper line:\n{}", job.stderr_so_far()))
        .trim_start_matches("sleeper=")
        .trim()
        .parse()
        .unwrap();
    job.wait_stdout(Duration::from_secs(30), |l| l.starts_with("ready pid="))
        .expect("the job never became ready");
    let pid = job.pid;

    // (release, what it leaves out, the feature each names)
    let cases: [(&str, &[&str], &[&str]); 3] = [
        (
            "5.14",
            &["python_stacks", "task_pt_regs", "cuda"],
            &[
                "bpf_loop (Linux 5.17)",
                "bpf_task_pt_regs (Linux 5.15)",
                "bpf_get_attach_cookie (Linux 5.15)",
            ],
        ),
        ("5.15", &["python_stacks"], &["bpf_loop (Linux 5.17)"]),
        ("6.1", &[], &[]),
    ];
    for (release, left_out, named) in cases {
        let name = release.replace('.', "_");
        let f = Spawned::start(
            command()
                .env("STALLSCOPE_KERNEL_AS", release)
                .args(["record", "--pid", &pid.to_string(), "-d", "3s"])
                .args(["--no-gpu", "--json", "-o"])
                .arg(dir.join(&format!("{name}.rec")))
                .arg("--flamegraph-dir")
                .arg(dir.join(&format!("fg-{name}"))),
        )
        .finish(RECORD_TIMEOUT);
        assert_success(&f, &format!("record as Linux {release}"));
        let report = parse_report(&f.stdout);
        let kernel_signals = ["python_stacks", "task_pt_regs", "cuda"];
        let mut unavailable: Vec<&str> = report["unavailable"]
            .as_array()
            .expect("an unavailable list")
            .iter()
            .filter_map(|u| u["signal"].as_str())
            .filter(|s| kernel_signals.contains(s))
            .collect();
        unavailable.sort_unstable();
        let mut want = left_out.to_vec();
        want.sort_unstable();
        assert_eq!(
            unavailable, want,
            "Linux {release}: {}",
            report["unavailable"]
        );
        for feature in named {
            assert_eq!(
                f.stderr.matches(feature).count(),
                1,
                "Linux {release}: {feature} should be named once:\n{}",
                f.stderr
            );
        }

        // The thread states hold, prev_state read from the tracepoint or from the task.
        let spinner = thread(&report, pid);
        let runnable = share(spinner, "on_cpu_ns") + share(spinner, "runqueue_ns");
        assert!(
            runnable > 0.8 && share(spinner, "blocked_ns") < 0.1,
            "Linux {release}: the spinner is on a CPU or waiting for one, never blocked: {spinner}"
        );
        let sleeper_t = thread(&report, sleeper);
        assert!(
            share(sleeper_t, "blocked_ns") > 0.8 && share(sleeper_t, "runqueue_ns") < 0.1,
            "Linux {release}: the sleeper is blocked, not queued: {sleeper_t}"
        );

        // Python frames only where the kernel has bpf_loop.
        let stacks = folded(&dir.join(&format!("fg-{name}/{name}.oncpu.folded")));
        let total: u64 = stacks.iter().map(|s| s.1).sum();
        let in_python: u64 = stacks
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| f.starts_with("spin_here (job.py:")))
            .map(|s| s.1)
            .sum();
        if left_out.contains(&"python_stacks") {
            assert_eq!(
                in_python, 0,
                "Linux {release}: Python frames without bpf_loop"
            );
            assert!(total > 0, "Linux {release}: no on-CPU samples");
        } else {
            assert!(
                in_python * 2 > total,
                "Linux {release}: spin_here in {in_python} of {total} samples"
            );
        }
    }
    drop(job);
}

/// A short record of PID 1 as if on `release`: its stderr, and whether it failed.
fn record_as(release: &str) -> (bool, String) {
    let out = command()
        .env("STALLSCOPE_KERNEL_AS", release)
        .args([
            "record",
            "--pid",
            "1",
            "-d",
            "1s",
            "--no-gpu",
            "-o",
            "/tmp/never.rec",
        ])
        .output()
        .unwrap();
    (
        !out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_release_that_is_not_one_is_refused_by_name() {
    let _serial = serial();
    let (failed, stderr) = record_as("soon");
    assert!(failed, "took STALLSCOPE_KERNEL_AS=soon: {stderr}");
    assert!(
        stderr.contains("STALLSCOPE_KERNEL_AS=soon"),
        "the error should name the variable: {stderr}"
    );
    let (failed, stderr) = record_as("5.10");
    assert!(failed, "recorded as if on 5.10: {stderr}");
    assert!(
        stderr.contains("bpf_get_current_task_btf (Linux 5.11)")
            && stderr.contains("BPF callbacks (Linux 5.13)"),
        "the error should name what 5.10 lacks: {stderr}"
    );
}

#[test]
fn doctor_reports_what_the_kernel_lacks_for_recording() {
    let _serial = serial();
    let check = |release: Option<&str>| -> Value {
        let mut cmd = command();
        cmd.args(["doctor", "--format", "json"]);
        if let Some(r) = release {
            cmd.env("STALLSCOPE_KERNEL_AS", r);
        }
        let out = cmd.output().unwrap();
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "doctor's JSON: {e}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "kernel: eBPF features")
            .cloned()
            .expect("doctor has a kernel features check")
    };
    // This machine's kernel (6.x) has everything.
    assert_eq!(check(None)["status"], "pass");
    let ubuntu = check(Some("5.15"));
    assert_eq!(ubuntu["status"], "warn", "{ubuntu}");
    assert!(
        ubuntu["evidence"]
            .as_str()
            .unwrap()
            .contains("bpf_loop (Linux 5.17)"),
        "{ubuntu}"
    );
    assert_eq!(check(Some("5.10"))["status"], "fail");
}
