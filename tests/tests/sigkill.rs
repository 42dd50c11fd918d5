//! A recorder killed outright (SIGKILL: no cleanup runs) must leave no eBPF programs or
//! links in the kernel, a target that runs on unharmed, and a readable recording.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    collections::BTreeSet,
    os::unix::process::ExitStatusExt as _,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use common::{
    Scratch, find_tool, procfs, serial,
    stallscope::{
        RECORD_TIMEOUT, assert_success, parse_report, report, start_record, wait_tracing,
    },
    workload::Workload,
};
use serde_json::Value;

/// Every loaded eBPF program as (id, name), from bpftool.
fn loaded_programs(bpftool: &Path) -> Vec<(u64, String)> {
    let out = Command::new(bpftool)
        .args(["-j", "prog", "list"])
        .output()
        .unwrap();
    assert!(out.status.success(), "bpftool prog list failed: {out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_u64().unwrap(),
                p["name"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Links that hold any of `progs`, from bpftool.
fn links_holding(bpftool: &Path, progs: &BTreeSet<u32>) -> Vec<Value> {
    let out = Command::new(bpftool)
        .args(["-j", "link", "list"])
        .output()
        .unwrap();
    assert!(out.status.success(), "bpftool link list failed: {out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .filter(|l| {
            l["prog_id"]
                .as_u64()
                .is_some_and(|id| progs.contains(&(id as u32)))
        })
        .cloned()
        .collect()
}

#[test]
fn sigkill_leaves_no_programs_and_an_unharmed_target() {
    let _serial = serial();
    let bpftool = find_tool("bpftool")
        .expect("bpftool is needed to check that no eBPF program is left behind: install it (apt-get install bpftool)");
    let w = Workload::start(&["spin", "--secs", "30"]);
    let dir = Scratch::new("sigkill");
    let file = dir.join("x.rec");
    let rec = start_record(&[w.pid], "20s", &file, &["--switch-hook", "tracepoint"]);
    wait_tracing(&rec);
    std::thread::sleep(Duration::from_millis(1500));

    // What this recorder holds, by its own descriptors, so other eBPF users do not count.
    let held = procfs::bpf_prog_ids_held(rec.pid);
    let loaded = loaded_programs(&bpftool);
    let names: BTreeSet<&str> = loaded
        .iter()
        .filter(|(id, _)| held.contains(&(*id as u32)))
        .map(|(_, name)| name.as_str())
        .collect();
    assert!(
        names.contains("sched_switch"),
        "the running recorder should hold its sched_switch program; it holds {held:?} ({names:?})"
    );

    rec.signal(libc::SIGKILL);
    let f = rec.finish(RECORD_TIMEOUT);
    assert_eq!(f.status.signal(), Some(libc::SIGKILL), "{}", f.describe());

    // The kernel frees programs once their last reference goes, after an RCU grace period.
    let deadline = Instant::now() + Duration::from_secs(5);
    let left = loop {
        let left: Vec<(u64, String)> = loaded_programs(&bpftool)
            .into_iter()
            .filter(|(id, _)| held.contains(&(*id as u32)))
            .collect();
        if left.is_empty() || Instant::now() >= deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        left.is_empty(),
        "eBPF programs outlived the killed recorder: {left:?}"
    );
    let links = links_holding(&bpftool, &held);
    assert!(
        links.is_empty(),
        "eBPF links outlived the killed recorder: {links:?}"
    );

    // The target neither died nor stopped.
    let state = procfs::state(w.pid);
    assert!(
        matches!(state, Some('R' | 'S')),
        "the target should still run after the recorder's death; its state is {state:?}"
    );
    let cpu_before = procfs::task_times(w.pid, w.pid).unwrap().on_cpu_ns;
    std::thread::sleep(Duration::from_millis(300));
    let cpu_after = procfs::task_times(w.pid, w.pid).unwrap().on_cpu_ns;
    assert!(
        cpu_after > cpu_before + 50e6,
        "the target should keep spinning: {:.0} ms of CPU in 300 ms",
        (cpu_after - cpu_before) / 1e6
    );

    // What was flushed before the kill is a readable recording without an end.
    let after = report(&file, true);
    assert_success(&after, "report of the killed recorder's file");
    assert_eq!(parse_report(&after.stdout)["ended"], false);
}
