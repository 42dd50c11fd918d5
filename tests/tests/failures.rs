//! Bad inputs and hostile conditions: each must end in a clear message and the right exit
//! code, never a panic or a hang.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{os::unix::fs::PermissionsExt as _, process::Command};

use common::{
    Scratch, find_tool, serial,
    spawned::Spawned,
    stallscope::{
        RECORD_TIMEOUT, assert_clean_error, assert_success, bin, parse_report, report, split,
        start_record, thread, u64_field,
    },
    workload::Workload,
};

/// A PID no process has: the top of the PID range, walking down past any that exist.
fn unused_pid() -> u32 {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (2..max)
        .rev()
        .find(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        .unwrap()
}

#[test]
fn nonexistent_pid_is_a_clear_error() {
    let _serial = serial();
    let dir = Scratch::new("nopid");
    let pid = unused_pid();
    let f = start_record(&[pid], "1s", &dir.join("x.rec"), &[]).finish(RECORD_TIMEOUT);
    assert_clean_error(&f, "record --pid <unused>");
    assert!(
        f.stderr.contains(&format!("no process with PID {pid}")),
        "the error should name the missing PID:\n{}",
        f.describe()
    );
}

#[test]
fn target_exiting_mid_run_ends_the_recording_early() {
    let _serial = serial();
    let w = Workload::start(&["sleep", "--secs", "1.5"]);
    let dir = Scratch::new("exits");
    let f = start_record(&[w.pid], "6s", &dir.join("x.rec"), &[]).finish(RECORD_TIMEOUT);
    assert_success(&f, "record of a target that exits");
    assert!(
        f.stderr.contains("the target exited"),
        "stallscope should say the target exited:\n{}",
        f.describe()
    );
    let report = parse_report(&f.stdout);
    assert_eq!(report["end_reason"], "target_exited", "end_reason");
    assert!(
        u64_field(&report, "duration_ns") < 4_000_000_000,
        "the recording should stop soon after the 1.5 s target exits, not run its 6 s: {}",
        report["duration_ns"]
    );
    let t = thread(&report, w.pid);
    assert_eq!(t["exited"], true, "the target's thread exited: {t}");
    split(t);
}

#[test]
fn missing_privileges_name_the_capabilities() {
    let _serial = serial();
    let setpriv = find_tool("setpriv").expect(
        "setpriv (util-linux) is needed to run stallscope unprivileged; install util-linux",
    );
    // A copy in a directory anyone may enter: the build directory may be private to root.
    let dir = Scratch::under(&std::env::temp_dir(), "nopriv");
    std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.join("stallscope");
    std::fs::copy(bin(), &copy).unwrap();
    let w = Workload::start(&["sleep", "--secs", "30"]);
    let mut cmd = Command::new(setpriv);
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&copy)
        .args(["record", "--pid", &w.pid.to_string(), "-d", "1s", "-o"])
        .arg(dir.join("x.rec"));
    let f = Spawned::start(&mut cmd).finish(RECORD_TIMEOUT);
    assert_clean_error(&f, "record as user nobody");
    assert!(
        f.stderr.contains("insufficient privileges") && f.stderr.contains("CAP_BPF"),
        "the error should name the missing capabilities:\n{}",
        f.describe()
    );
    // sudo resets PATH: the hint names the binary's absolute path, and how to keep PATH.
    let rerun = format!("sudo {} record --pid {}", copy.display(), w.pid);
    assert!(
        f.stderr.contains(&rerun)
            && f.stderr
                .contains("sudo env \"PATH=$PATH\" stallscope record"),
        "the error should say how to rerun it under sudo ({rerun}):\n{}",
        f.describe()
    );
    assert!(
        !dir.join("x.rec").exists(),
        "nothing should be written on failure"
    );
}

#[test]
fn report_rejects_files_that_are_not_recordings() {
    let _serial = serial();
    let dir = Scratch::new("notrec");
    let text = dir.join("notes.txt");
    std::fs::write(&text, "this is not a recording\n").unwrap();
    let json = dir.join("report.json");
    std::fs::write(&json, "{\"version\":1,\"threads\":[]}\n").unwrap();
    for path in [&text, &json, &dir.path] {
        let f = report(path, true);
        assert_clean_error(&f, &format!("report {}", path.display()));
    }
    let f = report(&text, false);
    assert_clean_error(&f, "report notes.txt (text)");
    assert!(
        f.stderr.contains("not a stallscope recording"),
        "the error should say what is wrong:\n{}",
        f.describe()
    );
    let missing = report(&dir.join("missing.rec"), true);
    assert_clean_error(&missing, "report of a missing file");
}
