//! Test harness: installs the built simulator, and runs ranks as child processes of the test
//! binary (each simulated library opens its state once per process, and a rank is a process).
pub mod api;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// Set in a child to the test it runs and its rank.
const CHILD_ENV: &str = "SIMGPU_NCCL_TEST_CHILD";
const RANK_ENV: &str = "SIMGPU_NCCL_TEST_RANK";
const ID_ENV: &str = "SIMGPU_NCCL_TEST_ID";
const LIB_ENV: &str = "SIMGPU_NCCL_TEST_LIB_DIR";

/// Scenarios measure real time on a small machine: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// What a child is told.
pub struct Child {
    pub rank: usize,
    pub lib_dir: PathBuf,
    pub state: PathBuf,
    /// The communicator's unique id, made by the parent with ncclGetUniqueId.
    pub id: [u8; 128],
}

/// A scratch directory with the installed libraries and a fresh state file.
pub struct Machine {
    pub root: PathBuf,
    pub lib_dir: PathBuf,
    pub state: PathBuf,
}

impl Machine {
    pub fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!("simgpu-nccl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let lib_dir = root.join("lib");
        if let Err(e) = simgpu_state::install_dir(&simgpu_state::target_release_dir(), &lib_dir) {
            panic!("cannot install the simulated GPU libraries: {e}");
        }
        let state = root.join("state");
        Machine {
            root,
            lib_dir,
            state,
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// In a child started for `name`, runs `body` and returns true; elsewhere returns false.
pub fn as_child(name: &str, body: impl FnOnce(&Child)) -> bool {
    if std::env::var(CHILD_ENV).ok().as_deref() != Some(name) {
        return false;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is set"));
    let hex = var(ID_ENV);
    let mut id = [0u8; 128];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex id");
    }
    body(&Child {
        rank: var(RANK_ENV).parse().expect("rank"),
        lib_dir: PathBuf::from(var(LIB_ENV)),
        state: PathBuf::from(var("STALLSCOPE_SIMGPU_STATE")),
        id,
    });
    true
}

/// Runs `ranks` children of test `name` on `machine` at once, with `env`; returns their
/// outputs in rank order, after checking that each passed.
pub fn run_ranks(
    name: &str,
    machine: &Machine,
    ranks: usize,
    id: &[u8; 128],
    env: &[(&str, &str)],
) -> Vec<Output> {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let children: Vec<_> = (0..ranks)
        .map(|rank| {
            Command::new(std::env::current_exe().expect("test binary"))
                .args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, name)
                .env(RANK_ENV, rank.to_string())
                .env(ID_ENV, &hex)
                .env(LIB_ENV, &machine.lib_dir)
                .env("STALLSCOPE_SIMGPU_STATE", &machine.state)
                .env("LD_LIBRARY_PATH", &machine.lib_dir)
                .env_remove("STALLSCOPE_SIMGPU_PCIE")
                .env_remove("STALLSCOPE_SIMGPU_DEVICES")
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("a rank's output"))
        .collect();
    for (rank, out) in outputs.iter().enumerate() {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "rank {rank} of {name} failed ({}):\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    outputs
}

/// The value of `key=` in a child's stdout line that starts with `tag`.
pub fn reported(out: &Output, tag: &str, key: &str) -> u64 {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| l.split_once(tag).map(|(_, rest)| rest))
        .flat_map(str::split_whitespace)
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .unwrap_or_else(|| panic!("no {tag} {key}= in:\n{text}"))
}

pub const MS: u64 = 1_000_000;

/// A sleep that says what it stands for.
pub fn straggle(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}
