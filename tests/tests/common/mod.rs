//! Shared helpers for the root-only end-to-end tests: privileges, serial execution, scratch
//! space and the clock the recordings use.
pub mod dist;
pub mod endpoint;
pub mod oracle;
pub mod procfs;
pub mod simgpu;
pub mod spawned;
pub mod stallscope;
pub mod waits_job;
pub mod workload;

use std::{
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
};

static SERIAL: Mutex<()> = Mutex::new(());

/// Fails (never skips) when not root: these tests exist to exercise real eBPF.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the stallscope end-to-end tests load eBPF and must run as root (euid is {euid}); \
         run them with `sudo -E cargo xtask test`"
    );
}

/// Holds the lock that runs these tests one at a time: they measure CPU time, and two
/// workloads at once would steal it from each other. Also checks for root.
pub fn serial() -> MutexGuard<'static, ()> {
    require_root();
    // A test that panicked while holding the lock leaves nothing to repair.
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// CLOCK_MONOTONIC in ns, the clock of the recordings' `start_ns`.
pub use simgpu_state::clock::monotonic_ns;

/// A fresh directory, removed again when dropped.
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    /// Under cargo's per-target temporary directory, which lives on the build disk: a tmpfs
    /// /tmp would have no block device for the IO tests to wait on.
    pub fn new(name: &str) -> Self {
        Self::under(Path::new(env!("CARGO_TARGET_TMPDIR")), name)
    }

    pub fn under(parent: &Path, name: &str) -> Self {
        let path = parent.join(format!("{name}-{}-{}", std::process::id(), monotonic_ns()));
        std::fs::create_dir_all(&path).unwrap();
        Self { path }
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The highest CPU this process may run on: the one pinned workloads share.
pub fn last_allowed_cpu() -> usize {
    let cpus = stallscope_tests::sys::allowed_cpus().expect("sched_getaffinity");
    *cpus.last().expect("this process may run on some CPU")
}

/// Finds a program on PATH or in the sbin directories, which a plain user's PATH may lack.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The virtualenv's interpreter, with PyTorch in it.
pub fn torch_python() -> PathBuf {
    let python = std::env::var_os("STALLSCOPE_TORCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            Path::new(&home).join(".cache/stallscope/torch-venv/bin/python")
        });
    assert!(
        python.exists(),
        "PyTorch's virtualenv is not at {}: run `cargo xtask setup`",
        python.display()
    );
    python
}
