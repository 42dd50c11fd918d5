//! `cargo xtask dist`: what a user installs without building it, in `dist/`: a manylinux2014
//! wheel (`pip install stallscope`, the binary alone, as py-spy ships), a tarball with the
//! binary, README, licences, shell completions and man pages, and their SHA-256 sums. The
//! binary is linked by zig against glibc 2.17, so it starts on RHEL 7 and every later
//! distribution; the eBPF object is inside it, as in any build.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use stallscope_tests::glibc;

use crate::{root, run, setup};

pub const TARGET: &str = "x86_64-unknown-linux-gnu";
/// The newest glibc the binary may need: manylinux2014's.
pub const MAX_GLIBC: (u32, u32, u32) = (2, 17, 0);

/// The release binary of the dist build.
pub fn binary() -> PathBuf {
    root()
        .join("target")
        .join(TARGET)
        .join("release/stallscope")
}

pub fn dir() -> PathBuf {
    root().join("dist")
}

pub fn dist() -> anyhow::Result<()> {
    // bpf-linker and the nightly's rust-src build the eBPF object, as for any build.
    setup::setup()?;
    setup::ensure_debian(&[("objdump", "binutils")])?;
    let tools = setup::ensure_dist_tools()?;
    let out = dir();
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    let path = std::env::join_paths(std::iter::once(tools.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    run(Command::new(tools.join("maturin"))
        .current_dir(root())
        .args(["build", "--release", "--strip", "--zig"])
        .args(["--compatibility", "manylinux2014", "--target", TARGET])
        .args(["--manifest-path", "profiler/Cargo.toml", "--out"])
        .arg(&out)
        .env("PATH", path))?;
    let bin = binary();
    check_glibc(&bin)?;
    let version = version_of(&bin)?;
    let tarball = tarball(&bin, &version, &out)?;
    let wheel = std::fs::read_dir(&out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| format!("maturin left no wheel in {}", out.display()))?;
    let names = [&wheel, &tarball].map(|p| p.file_name().unwrap().to_owned());
    let sums = Command::new("sha256sum")
        .current_dir(&out)
        .args(names)
        .output()
        .context("running sha256sum")?;
    if !sums.status.success() {
        bail!("sha256sum: {}", String::from_utf8_lossy(&sums.stderr));
    }
    std::fs::write(out.join("SHA256SUMS"), &sums.stdout)?;
    eprintln!("xtask: dist/ holds:");
    for p in [&wheel, &tarball, &out.join("SHA256SUMS")] {
        let len = std::fs::metadata(p)?.len();
        eprintln!(
            "  {} ({:.1} MiB)",
            p.file_name().unwrap().to_string_lossy(),
            len as f64 / (1 << 20) as f64
        );
    }
    eprintln!(
        "xtask: install with `pip install {}` or unpack {}",
        wheel.display(),
        tarball.display()
    );
    Ok(())
}

/// Fails naming each symbol that needs a glibc newer than [`MAX_GLIBC`].
fn check_glibc(bin: &Path) -> anyhow::Result<()> {
    let dump = Command::new("objdump")
        .arg("-T")
        .arg(bin)
        .output()
        .context("running objdump -T")?;
    if !dump.status.success() {
        bail!(
            "objdump -T {}: {}",
            bin.display(),
            String::from_utf8_lossy(&dump.stderr)
        );
    }
    let dump = String::from_utf8_lossy(&dump.stdout);
    let newer = glibc::newer_than(&dump, MAX_GLIBC);
    if !newer.is_empty() {
        bail!(
            "{} needs a glibc newer than 2.17: {}",
            bin.display(),
            newer.join(", ")
        );
    }
    let (a, b, _) = glibc::newest_needed(&dump).context("no GLIBC versions in objdump -T")?;
    eprintln!("xtask: {} needs glibc {a}.{b} at most", bin.display());
    Ok(())
}

/// The version `stallscope --version` prints.
fn version_of(bin: &Path) -> anyhow::Result<String> {
    let out = Command::new(bin).arg("--version").output()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .map(str::to_owned)
        .with_context(|| format!("{} --version printed no version", bin.display()))
}

/// `stallscope-VERSION-x86_64-linux.tar.gz`: the binary, README, licences, completions for
/// bash, zsh and fish, and the man pages, under one folder of that name.
fn tarball(bin: &Path, version: &str, out: &Path) -> anyhow::Result<PathBuf> {
    let name = format!("stallscope-{version}-x86_64-linux");
    let staging = root().join("target/dist-staging");
    let _ = std::fs::remove_dir_all(&staging);
    let top = staging.join(&name);
    std::fs::create_dir_all(top.join("completions"))?;
    std::fs::copy(bin, top.join("stallscope"))?;
    for doc in ["README.md", "LICENSE-MIT", "LICENSE-APACHE"] {
        std::fs::copy(root().join(doc), top.join(doc)).with_context(|| format!("copying {doc}"))?;
    }
    for (shell, file) in [
        ("bash", "stallscope.bash"),
        ("zsh", "_stallscope"),
        ("fish", "stallscope.fish"),
    ] {
        let script = Command::new(bin).args(["completions", shell]).output()?;
        if !script.status.success() || script.stdout.is_empty() {
            bail!("{} completions {shell} failed", bin.display());
        }
        std::fs::write(top.join("completions").join(file), script.stdout)?;
    }
    run(Command::new(bin)
        .arg("manpages")
        .arg(top.join("man/man1"))
        .stderr(std::process::Stdio::null()))?;
    let tarball = out.join(format!("{name}.tar.gz"));
    // Owned by root with fixed times, so the same tree makes the same tarball.
    run(Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
            "-czf",
        ])
        .arg(&tarball)
        .arg("-C")
        .arg(&staging)
        .arg(&name))?;
    Ok(tarball)
}
