//! The aarch64 release, cross-built by `cargo xtask dist` on this x86_64 machine and run here
//! under qemu-aarch64-static: an aarch64 executable needing no glibc newer than 2.17, the
//! same in the wheel and the tarball, that starts, and that reports every kept recording
//! (made on x86_64) exactly as the x86_64 binary does. Recording itself needs an aarch64
//! kernel: qemu-user passes no eBPF through, so that part is proven only on a Grace host
//! (scripts/h200/check.sh, unchanged).
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::{
    Scratch,
    dist::{self, only},
};

const QEMU: &str = "qemu-aarch64-static";

/// qemu, with the aarch64 dynamic linker and glibc of Debian's libc6-arm64-cross.
fn qemu() -> Command {
    let mut cmd = Command::new(QEMU);
    cmd.args(["-L", "/usr/aarch64-linux-gnu"]);
    cmd
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn x86_bin() -> PathBuf {
    std::env::var_os("STALLSCOPE_BIN")
        .map_or_else(|| repo().join("target/release/stallscope"), PathBuf::from)
}

fn output(cmd: &mut Command) -> (bool, Vec<u8>, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    (
        out.status.success(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The tarball's binary, unpacked into `dir`.
fn unpacked(dir: &Scratch) -> PathBuf {
    let tarball = only(&dist::dir(), "-aarch64-linux.tar.gz");
    let (ok, _, err) = output(
        Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&dir.path),
    );
    assert!(ok, "tar -xzf {}: {err}", tarball.display());
    let name = tarball.file_name().unwrap().to_string_lossy();
    let top = dir.join(name.trim_end_matches(".tar.gz"));
    for f in [
        "stallscope",
        "README.md",
        "LICENSE-MIT",
        "completions/stallscope.bash",
    ] {
        assert!(top.join(f).is_file(), "{name} has no {f}");
    }
    assert!(
        top.join("man/man1/stallscope.1").is_file(),
        "{name} has no man page"
    );
    top.join("stallscope")
}

#[test]
fn the_release_is_an_aarch64_executable_needing_glibc_2_17_in_wheel_and_tarball_alike() {
    let dir = Scratch::new("aarch64-dist");
    let bin = unpacked(&dir);
    let bytes = std::fs::read(&bin).unwrap();
    assert!(bytes.starts_with(b"\x7fELF"), "not an ELF file");
    assert_eq!(
        u16::from_le_bytes([bytes[18], bytes[19]]),
        183,
        "e_machine is not EM_AARCH64"
    );
    let (ok, dump, err) = output(Command::new("objdump").arg("-T").arg(&bin));
    assert!(ok, "objdump -T: {err}");
    let dump = String::from_utf8_lossy(&dump);
    let newer = stallscope_tests::glibc::newer_than(&dump, (2, 17, 0));
    assert!(newer.is_empty(), "needs a glibc newer than 2.17: {newer:?}");
    assert!(
        stallscope_tests::glibc::newest_needed(&dump).is_some(),
        "objdump -T shows no glibc version: is it dynamically linked?"
    );

    // The wheel carries the same binary (maturin's `bindings = "bin"`: data/scripts).
    let wheel = only(&dist::dir(), "manylinux_2_17_aarch64.whl");
    let script = "import sys, zipfile\n\
                  z = zipfile.ZipFile(sys.argv[1])\n\
                  n = [i for i in z.namelist() if i.endswith('.data/scripts/stallscope')]\n\
                  sys.stdout.buffer.write(z.read(n[0]))\n";
    let (ok, in_wheel, err) = output(Command::new("python3").args(["-c", script]).arg(&wheel));
    assert!(ok, "reading {}: {err}", wheel.display());
    assert!(
        in_wheel == bytes,
        "the wheel's binary differs from the tarball's"
    );
    let (ok, _, err) = output(Command::new("sha256sum").current_dir(dist::dir()).args([
        "--check",
        "--strict",
        "SHA256SUMS",
    ]));
    assert!(ok, "dist/SHA256SUMS does not match: {err}");
}

#[test]
fn it_starts_under_qemu_and_says_the_same_version() {
    let dir = Scratch::new("aarch64-version");
    let bin = unpacked(&dir);
    let (ok, arm, err) = output(qemu().arg(&bin).arg("--version"));
    assert!(ok, "{QEMU} stallscope --version: {err}");
    let (ok, x86, err) = output(Command::new(x86_bin()).arg("--version"));
    assert!(ok, "stallscope --version: {err}");
    assert_eq!(String::from_utf8_lossy(&arm), String::from_utf8_lossy(&x86));
    // Recording needs privileges and an aarch64 kernel; without them it says so and fails.
    let (ok, _, err) = output(
        qemu()
            .arg(&bin)
            .args(["record", "--pid", "1", "--duration", "1s"]),
    );
    assert!(!ok && !err.is_empty(), "recording under qemu succeeded?");
}

/// Every kept recording: the fixture and stallgen's scenarios on the simulated GPU, all
/// recorded on x86_64.
fn recordings() -> Vec<PathBuf> {
    let dir = repo().join("profiler-core/tests/recordings");
    let mut all: Vec<PathBuf> = [dir.clone(), dir.join("gpu")]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap().flatten().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "rec"))
        .collect();
    all.sort();
    assert!(all.len() >= 10, "kept recordings: {all:?}");
    all
}

#[test]
fn it_reports_recordings_made_on_x86_64_as_x86_64_does() {
    let dir = Scratch::new("aarch64-report");
    let bin = unpacked(&dir);
    let recordings = recordings();
    for rec in &recordings {
        for format in ["json", "text"] {
            let report = |cmd: &mut Command| {
                let (ok, out, err) = output(cmd.arg("report").arg(rec).args([
                    "--no-flamegraphs",
                    "--format",
                    format,
                ]));
                assert!(ok, "{cmd:?}: {err}");
                String::from_utf8(out).unwrap()
            };
            let arm = report(qemu().arg(&bin));
            let x86 = report(&mut Command::new(x86_bin()));
            assert!(arm.len() > 200, "{}: a short report", rec.display());
            assert!(
                arm == x86,
                "{} --format {format}: the aarch64 report differs from x86_64's",
                rec.display()
            );
        }
    }
    eprintln!(
        "the same reports from {} recordings on both architectures",
        recordings.len()
    );
}
