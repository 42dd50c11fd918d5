//! Finds the peer tracers (bpftrace, libbpf-tools' runqlat and offcputime, and perf for the
//! per-thread floor) and installs them
//! with apt when missing. A peer that cannot be had is a value with its reason, not an error:
//! the benchmark leaves it out of the table and says why.
use std::{
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

/// Where each peer's binary is, or why there is none.
pub struct Peers {
    pub bpftrace: Result<PathBuf, String>,
    pub runqlat: Result<PathBuf, String>,
    pub offcputime: Result<PathBuf, String>,
    pub perf: Result<PathBuf, String>,
}

/// (binary, Debian package).
const WANTED: [(&str, &str); 4] = [
    ("bpftrace", "bpftrace"),
    ("runqlat", "libbpf-tools"),
    ("offcputime", "libbpf-tools"),
    ("perf", "linux-perf"),
];

pub fn ensure() -> Peers {
    let mut missing_pkgs: Vec<&str> = WANTED
        .iter()
        .filter(|(bin, pkg)| locate(bin, pkg).is_none())
        .map(|&(_, pkg)| pkg)
        .collect();
    missing_pkgs.dedup();
    let mut failed: Vec<(&str, String)> = Vec::new();
    if !missing_pkgs.is_empty() {
        eprintln!("bench: installing {}", missing_pkgs.join(" "));
        if let Err(e) = apt(&["update"]) {
            eprintln!("bench: warning: apt-get update failed ({e}); trying the install anyway");
        }
        let mut args = vec!["install", "-y"];
        args.extend(&missing_pkgs);
        if let Err(e) = apt(&args) {
            // Find out which package is the problem, so that the other one still runs.
            for pkg in &missing_pkgs {
                if let Err(e1) = apt(&["install", "-y", pkg]) {
                    eprintln!("bench: warning: installing {pkg} failed: {e1} (all together: {e})");
                    failed.push((pkg, e1));
                }
            }
        }
    }
    let find = |bin: &str, pkg: &str| -> Result<PathBuf, String> {
        if let Some(p) = locate(bin, pkg) {
            return Ok(p);
        }
        match failed.iter().find(|(p, _)| *p == pkg) {
            Some((_, e)) => Err(format!("`apt-get install {pkg}` failed: {e}")),
            None => Err(format!("no `{bin}` binary found (package {pkg})")),
        }
    };
    Peers {
        bpftrace: find("bpftrace", "bpftrace"),
        runqlat: find("runqlat", "libbpf-tools"),
        offcputime: find("offcputime", "libbpf-tools"),
        perf: find("perf", "linux-perf"),
    }
}

/// Runs apt-get non-interactively with its output on our stderr (stdout is the report).
fn apt(args: &[&str]) -> Result<(), String> {
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| e.to_string())?;
    let status = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(Stdio::from(stderr))
        .status()
        .map_err(|e| format!("cannot run apt-get: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("apt-get {} exited with {status}", args.join(" ")))
    }
}

/// Looks for `bin` on PATH, in the sbin directories (root's tools often live there but PATH
/// may lack them), and in the package's own file list.
fn locate(bin: &str, pkg: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs = path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin"].map(PathBuf::from));
    for dir in dirs {
        let candidate = dir.join(bin);
        if is_executable(&candidate) {
            return Some(candidate);
        }
    }
    let out = Command::new("dpkg").args(["-L", pkg]).output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .find(|p| p.file_name().is_some_and(|n| n == bin) && is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
