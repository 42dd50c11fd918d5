//! A kernel without a signal, and a program the verifier refuses: stallscope degrades or fails
//! cleanly, naming what happened.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::path::Path;

use common::{
    Scratch, serial,
    spawned::Spawned,
    stallscope::{RECORD_TIMEOUT, assert_clean_error, assert_success, command, parse_report},
    workload::Workload,
};

/// Copies the tracefs format files of `categories` into `root`, standing in for a kernel that
/// has only those tracepoints (stallscope reads layouts from $STALLSCOPE_TRACEFS).
fn fake_tracefs(root: &Path, categories: &[&str]) {
    let real = ["/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.join("block").is_dir())
        .expect("tracefs is not mounted at /sys/kernel/tracing (mount -t tracefs nodev /sys/kernel/tracing)");
    for cat in categories {
        for entry in std::fs::read_dir(real.join(cat)).unwrap().flatten() {
            let format = entry.path().join("format");
            let Ok(text) = std::fs::read_to_string(&format) else {
                continue;
            };
            let dir = root.join("events").join(cat).join(entry.file_name());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("format"), text).unwrap();
        }
    }
}

#[test]
fn a_missing_tracepoint_is_named_and_the_rest_still_works() {
    let _serial = serial();
    let dir = Scratch::new("degrade");
    let tracefs = dir.join("tracefs");
    fake_tracefs(&tracefs, &["block"]);
    let data = Path::new(env!("CARGO_TARGET_TMPDIR")).join("stallwork-cold.dat");
    let w = Workload::start(&[
        "cold-read",
        "--file",
        data.to_str().unwrap(),
        "--mb",
        "64",
        "--secs",
        "4",
    ]);
    let mut cmd = command();
    cmd.env("STALLSCOPE_TRACEFS", &tracefs)
        .args(["record", "--json", "-d", "2s", "-o"])
        .arg(dir.join("x.rec"))
        .args(["--pid", &w.pid.to_string()]);
    let f = Spawned::start(&mut cmd).finish(RECORD_TIMEOUT);
    assert_success(&f, "record without the filemap tracepoint");
    assert!(
        f.stderr.contains("page_cache unavailable")
            && f.stderr.contains("mm_filemap_add_to_page_cache"),
        "the missing signal and its tracepoint should be named:\n{}",
        f.describe()
    );
    let report = parse_report(&f.stdout);
    let unavailable = report["unavailable"].as_array().unwrap();
    assert!(
        unavailable.iter().any(|u| u["signal"] == "page_cache"),
        "the report should list page_cache as unavailable: {unavailable:?}"
    );
    let threads = report["threads"].as_array().unwrap();
    let reader = threads
        .iter()
        .find(|t| t["tid"] == w.pid)
        .expect("the reader is in the report");
    assert_eq!(reader["page_cache_misses"], 0, "page-cache tracing was off");
    assert!(
        reader["read_bytes"].as_u64().unwrap() > 0 && reader["io_wait_ns"].as_u64().unwrap() > 0,
        "block IO and IO wait are still measured: {reader}"
    );
}

#[test]
fn a_verifier_rejection_shows_the_program_and_its_log() {
    let _serial = serial();
    let dir = Scratch::new("verifier");
    let w = Workload::start(&["sleep", "--secs", "3"]);
    let out = dir.join("x.rec");
    let mut cmd = command();
    cmd.env("STALLSCOPE_TEST_VERIFIER_CANARY", "1")
        .args(["record", "-d", "1s", "-o"])
        .arg(&out)
        .args(["--pid", &w.pid.to_string()]);
    let f = Spawned::start(&mut cmd).finish(RECORD_TIMEOUT);
    assert_clean_error(&f, "record with a program the verifier rejects");
    assert!(
        f.stderr
            .contains("verifier rejected eBPF program `verifier_canary`"),
        "the rejected program should be named:\n{}",
        f.describe()
    );
    assert!(
        f.stderr.contains("--- verifier log ---") && f.stderr.contains("processed")
            || f.stderr.contains("disallowed"),
        "the verifier's own log should follow:\n{}",
        f.describe()
    );
    assert!(
        !f.stderr.contains("stallscope: tracing"),
        "nothing may be attached after a rejection"
    );
    assert!(!out.exists(), "no recording is started after a rejection");
}
