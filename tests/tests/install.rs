//! The release as a user gets it: `cargo xtask dist`'s wheel, installed with pip into a fresh
//! virtualenv of Debian's python3 and run from a PATH with no Rust toolchain on it. It must
//! start, print its completions, need no glibc newer than 2.17, and record a Python process
//! with the process's own function in the on-CPU flame graph.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{path::Path, process::Command, time::Duration};

use common::{
    Scratch,
    dist::{self, only},
    serial,
    spawned::Spawned,
    stallscope::{RECORD_TIMEOUT, assert_success, folded},
};

fn output(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A Python job whose one thread spends its time in `spin_in_the_wheel_test`.
const JOB: &str = "\
import os, sys, time
def spin_in_the_wheel_test():
    n = 0
    while True:
        n += sum(range(1000))
print(f'ready pid={os.getpid()}', flush=True)
spin_in_the_wheel_test()
";

#[test]
fn the_wheel_installs_with_pip_and_records_a_python_process_without_a_toolchain() {
    let _serial = serial();
    let dist = dist::dir();
    let wheel = only(&dist, "_x86_64.whl");
    let tarball = only(&dist, "-x86_64-linux.tar.gz");
    let (ok, _, err) = output(Command::new("sha256sum").current_dir(&dist).args([
        "--check",
        "--strict",
        "SHA256SUMS",
    ]));
    assert!(ok, "dist/SHA256SUMS does not match: {err}");
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("stallscope-") && name.contains("manylinux_2_17_x86_64"),
        "not a manylinux 2.17 wheel: {name}"
    );

    let dir = Scratch::new("install");
    let venv = dir.join("venv");
    let (ok, _, err) = output(
        Command::new("/usr/bin/python3")
            .args(["-m", "venv"])
            .arg(&venv),
    );
    assert!(ok, "python3 -m venv: {err}");
    let (ok, _, err) = output(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--no-index", "--no-deps", "-q"])
            .arg(&wheel),
    );
    assert!(ok, "pip install {name}: {err}");
    let exe = venv.join("bin/stallscope");
    assert!(exe.is_file(), "pip installed no {}", exe.display());

    // Nothing in the binary needs a glibc newer than manylinux2014's.
    let (ok, dump, err) = output(Command::new("objdump").arg("-T").arg(&exe));
    assert!(ok, "objdump -T: {err}");
    let newer = stallscope_tests::glibc::newer_than(&dump, (2, 17, 0));
    assert!(newer.is_empty(), "needs a glibc newer than 2.17: {newer:?}");
    assert!(
        stallscope_tests::glibc::newest_needed(&dump).is_some(),
        "objdump -T shows no glibc version: is it dynamically linked?"
    );

    // Run by name from the virtualenv's PATH, with no Rust toolchain on it.
    let path = format!(
        "{}:/usr/sbin:/usr/bin:/sbin:/bin",
        venv.join("bin").display()
    );
    for d in path.split(':') {
        assert!(
            !Path::new(d).join("cargo").exists() && !Path::new(d).join("rustc").exists(),
            "{d} on the test's PATH has a Rust toolchain"
        );
    }
    let stallscope = || {
        let mut c = Command::new("stallscope");
        c.env_clear().env("PATH", &path).current_dir(&dir.path);
        c
    };
    let (ok, version, err) = output(stallscope().arg("--version"));
    assert!(ok, "stallscope --version: {err}");
    let v = version.trim().strip_prefix("stallscope ").unwrap_or("?");
    assert!(
        name.starts_with(&format!("stallscope-{v}-")) && tarball.to_string_lossy().contains(v),
        "--version says {version:?}, the wheel is {name}"
    );
    let (ok, completion, err) = output(stallscope().args(["completions", "bash"]));
    assert!(ok, "stallscope completions bash: {err}");
    assert!(
        completion.contains("_stallscope") && completion.contains("record"),
        "not a bash completion for stallscope: {}",
        &completion[..completion.len().min(300)]
    );

    let script = dir.join("job.py");
    std::fs::write(&script, JOB).unwrap();
    let job = Spawned::start(Command::new(venv.join("bin/python")).arg(&script));
    let pid = job
        .wait_stdout(Duration::from_secs(30), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| panic!("the job never became ready:\n{}", job.stderr_so_far()))
        .trim_start_matches("ready pid=")
        .trim()
        .to_owned();
    let rec = Spawned::start(stallscope().args([
        "record",
        "--pid",
        &pid,
        "-d",
        "3s",
        "--no-gpu",
        "--json",
        "-o",
        "x.rec",
        "--flamegraph-dir",
        "fg",
    ]))
    .finish(RECORD_TIMEOUT);
    assert_success(&rec, "record by the installed wheel");
    drop(job);
    let stacks = folded(&dir.join("fg/x.oncpu.folded"));
    let total: u64 = stacks.iter().map(|s| s.1).sum();
    let in_job: u64 = stacks
        .iter()
        .filter(|(frames, _)| {
            frames
                .iter()
                .any(|f| f.starts_with("spin_in_the_wheel_test (job.py:"))
        })
        .map(|s| s.1)
        .sum();
    assert!(
        total > 0 && in_job * 2 > total,
        "spin_in_the_wheel_test is in {in_job} of {total} on-CPU samples: {stacks:?}"
    );
}
