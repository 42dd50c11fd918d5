//! A disk that fills up while recording, or while the flame graphs are written: the error
//! names the file, the report still comes on stdout, and the recording stays loadable.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{path::PathBuf, process::Command};

use common::{
    Scratch, serial,
    stallscope::{
        RECORD_TIMEOUT, assert_no_panic, assert_success, parse_report, report, start_record,
    },
    workload::Workload,
};

/// A tmpfs of `size_kib` mounted on a directory of its own, with all but `free_kib` taken.
struct FullDisk {
    path: PathBuf,
    _dir: Scratch,
}

impl FullDisk {
    fn new(name: &str, size_kib: u64, free_kib: u64) -> Self {
        let dir = Scratch::new(name);
        let path = dir.join("mnt");
        std::fs::create_dir_all(&path).unwrap();
        let mounted = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size_kib}k,mode=0755"),
                "tmpfs",
            ])
            .arg(&path)
            .status()
            .unwrap();
        assert!(
            mounted.success(),
            "mounting a small tmpfs failed: {mounted}"
        );
        let filler = vec![0x5au8; ((size_kib - free_kib) * 1024) as usize];
        std::fs::write(path.join("filler"), filler).unwrap();
        Self { path, _dir: dir }
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// The report names `file` and the kernel's reason.
fn assert_names(stderr: &str, file: &str) {
    assert!(
        stderr.contains(file) && stderr.contains("No space left on device"),
        "the error should name {file} and say the disk is full:\n{stderr}"
    );
}

#[test]
fn a_disk_filling_up_while_recording_names_the_file_and_still_reports() {
    let _serial = serial();
    let w = Workload::start(&["spin", "--secs", "10"]);
    let disk = FullDisk::new("full-rec", 64, 8);
    let dir = Scratch::new("full-rec-graphs");
    let file = disk.path.join("x.rec");
    let f = start_record(
        &[w.pid],
        "4s",
        &file,
        &["--flamegraph-dir", dir.path.to_str().unwrap()],
    )
    .finish(RECORD_TIMEOUT);
    assert_no_panic(&f, "record onto a full disk");
    assert_eq!(
        f.code(),
        Some(1),
        "an incomplete recording fails:\n{}",
        f.describe()
    );
    assert_names(
        &f.stderr,
        &format!("cannot write the recording {}", file.display()),
    );
    let live = parse_report(&f.stdout);
    assert!(
        live["threads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["pid"] == w.pid),
        "the report covers what was written: {}",
        f.stdout
    );
    // What was written loads on its own.
    let copy = dir.join("copy.rec");
    std::fs::copy(&file, &copy).unwrap();
    let again = report(&copy, true);
    assert_success(&again, "report of the recording the full disk cut short");
    let later = parse_report(&again.stdout);
    assert_eq!(
        later["threads"], live["threads"],
        "the same recording, the same report"
    );
}

#[test]
fn a_disk_filling_up_with_the_flame_graphs_names_the_file_and_still_reports() {
    let _serial = serial();
    let w = Workload::start(&["spin", "--secs", "6"]);
    let disk = FullDisk::new("full-graphs", 16, 4);
    let dir = Scratch::new("full-graphs-rec");
    let file = dir.join("x.rec");
    let f = start_record(
        &[w.pid],
        "2s",
        &file,
        &["--flamegraph-dir", disk.path.to_str().unwrap()],
    )
    .finish(RECORD_TIMEOUT);
    assert_no_panic(&f, "record with flame graphs onto a full disk");
    assert_eq!(
        f.code(),
        Some(1),
        "missing flame graphs fail:\n{}",
        f.describe()
    );
    assert_names(&f.stderr, &format!("cannot write {}", disk.path.display()));
    let live = parse_report(&f.stdout);
    assert!(
        !live["threads"].as_array().unwrap().is_empty(),
        "{}",
        f.stdout
    );
    // The recording itself is whole: reported again, with its graphs beside it.
    let again = report(&file, true);
    assert_success(&again, "report of the recording");
    assert_eq!(parse_report(&again.stdout)["threads"], live["threads"]);
}
