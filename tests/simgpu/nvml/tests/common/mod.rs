//! Test harness: installs the built libraries into a temporary directory and runs each scenario
//! in a child process, because each simulated library opens its state file once per process
//! and the configuring environment variables are process-wide.
#![allow(
    dead_code,
    reason = "each test target uses its own part of the harness"
)]
pub mod cuda;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;

/// Set in the child to the name of the scenario it must run.
const CHILD_ENV: &str = "SIMGPU_TEST_CHILD";
/// Directory holding the installed libraries, passed to the child.
const LIB_DIR_ENV: &str = "SIMGPU_TEST_LIB_DIR";

/// A scenario that takes longer is hung (e.g. a sync that never returns): kill it.
const CHILD_TIMEOUT: Duration = Duration::from_secs(120);
/// Scenarios measure real time on a small machine: run them one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Where the child finds the libraries and its state file.
pub struct Paths {
    pub lib_dir: PathBuf,
    pub state: PathBuf,
}

/// Runs `body` in a child process of this test binary with `env` set and a fresh state file.
/// In the parent, this spawns the child and asserts it passed; in the child, it runs `body`.
pub fn in_child(name: &str, env: &[(&str, &str)], body: impl FnOnce(&Paths)) {
    match std::env::var(CHILD_ENV) {
        Ok(child) if child == name => {
            let lib_dir = PathBuf::from(std::env::var_os(LIB_DIR_ENV).expect("lib dir"));
            let state = PathBuf::from(std::env::var_os("STALLSCOPE_SIMGPU_STATE").expect("state"));
            body(&Paths { lib_dir, state });
            return;
        }
        // A child runs exactly one scenario (libtest's filter may match more than one name).
        Ok(_) => return,
        Err(_) => {}
    }
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = std::env::temp_dir().join(format!("simgpu-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let lib_dir = root.join("lib");
    if let Err(e) = simgpu_state::install_dir(&simgpu_state::target_release_dir(), &lib_dir) {
        panic!("cannot install the simulated GPU libraries: {e}");
    }
    let state = root.join("state");
    let log_path = root.join("child.log");
    let log = std::fs::File::create(&log_path).expect("child log");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .env(LIB_DIR_ENV, &lib_dir)
        .env("STALLSCOPE_SIMGPU_STATE", &state)
        .env_remove("STALLSCOPE_SIMGPU_PCIE")
        .env_remove("STALLSCOPE_SIMGPU_DEVICES")
        .env_remove("STALLSCOPE_SIMGPU_SAMPLE_CLOCK")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("child log"))
        .stderr(log)
        .spawn()
        .expect("spawn the test binary");
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        status.is_some_and(|s| s.success()) && log.contains("1 passed"),
        "scenario {name} failed in its child process ({status:?}, None = timed out):\n{log}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Runs `body` only in a worker process started by [`spawn_worker`] for `name`; in any other
/// process the test does nothing (and passes).
pub fn only_as_worker(name: &str, body: impl FnOnce(&Paths)) {
    if std::env::var(CHILD_ENV).is_ok_and(|child| child == name) {
        in_child(name, &[], body);
    }
}

/// Starts this test binary as worker `name`, sharing the calling child's libraries and state
/// file; its stdin and stdout are piped to the caller.
pub fn spawn_worker(name: &str) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn a worker")
}

/// Reads the worker's stdout until a line ending in `marker` (libtest may print "test name
/// ... " in front of it).
pub fn wait_for_line(worker: &mut Child, marker: &str) {
    let stdout = worker.stdout.as_mut().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.ends_with(marker) => return,
            Some(Ok(_)) => {}
            other => panic!("worker ended before printing {marker:?}: {other:?}"),
        }
    }
}

/// nvml-wrapper on the installed simulated NVML.
pub fn nvml(lib_dir: &Path) -> Nvml {
    let path = lib_dir.join("libnvidia-ml.so.1");
    Nvml::builder()
        .lib_path(path.as_os_str())
        .init()
        .expect("nvml-wrapper initializes on the simulated NVML")
}

/// CLOCK_REALTIME now, in µs (the default NVML sample clock).
pub fn realtime_us() -> u64 {
    simgpu_state::clock::realtime_ns() / 1000
}
