//! Python frames from live CPython processes, attached by PID: every interpreter this
//! machine has (pyenv's 3.8 to 3.13 and Debian's python3) runs `tests/pyjob/threads.py`,
//! whose threads burn, sleep and sync in known functions at marked lines. Each thread's
//! samples must show those functions with their lines, in place of the interpreter loop's
//! frames, and the CUDA sync must name the Python line that made it. A Python process that
//! execs another program must leave the kernel's Python tables.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use common::{
    Scratch, serial,
    spawned::Spawned,
    stallscope::{RECORD_TIMEOUT, assert_success, bin, command, folded, parse_report},
};
use serde_json::Value;

fn job_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("pyjob/threads.py")
}

/// The lines of the job's source that end with `marker`: the ground truth of where its
/// threads are.
fn marked_lines(marker: &str) -> Vec<u32> {
    let src = std::fs::read_to_string(job_script()).expect("the job's source");
    let lines: Vec<u32> = src
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_end().ends_with(marker))
        .map(|(i, _)| i as u32 + 1)
        .collect();
    assert!(
        !lines.is_empty(),
        "no line of threads.py is marked {marker}"
    );
    lines
}

/// The interpreters to run: pyenv's CPython 3.8 to 3.13, those installed, and Debian's. The
/// machine's CPython 3.11 and Debian's python3 must be there; the others are run when
/// present.
fn interpreters() -> Vec<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
    let mut found: BTreeMap<u32, PathBuf> = BTreeMap::new();
    for entry in std::fs::read_dir(root.join("versions"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.split('.');
        let (Some("3"), Some(minor)) = (parts.next(), parts.next().and_then(|m| m.parse().ok()))
        else {
            continue;
        };
        let python = entry.path().join("bin/python3");
        if (8..=13).contains(&minor) && python.is_file() {
            found.insert(minor, python);
        }
    }
    assert!(
        found.contains_key(&11),
        "pyenv's CPython 3.11 (the machine's python3) is not under {}",
        root.display()
    );
    let debian = PathBuf::from("/usr/bin/python3");
    assert!(debian.is_file(), "Debian's python3 is not installed");
    found.into_values().chain([debian]).collect()
}

struct Run {
    report: Value,
    truth: Value,
    on_cpu: Vec<(Vec<String>, u64)>,
    off_cpu: Vec<(Vec<String>, u64)>,
}

fn record(python: &Path, sim: &Scratch) -> Run {
    let dir = Scratch::new("python-stacks");
    let truth_path = dir.join("truth.json");
    let libs = sim.join("lib");
    let state = sim.join("state");
    let job = Spawned::start(
        Command::new(python)
            .arg(job_script())
            .arg("8")
            .arg(&truth_path)
            .arg("--cuda")
            .env("LD_LIBRARY_PATH", &libs)
            .env("STALLSCOPE_SIMGPU_STATE", &state),
    );
    job.wait_stdout(Duration::from_secs(60), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| {
            panic!(
                "{} never became ready; stderr:\n{}",
                python.display(),
                job.stderr_so_far()
            )
        });
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(&truth_path).expect("the job's truth"))
            .expect("the truth is JSON");
    let pid = truth["pid"].as_u64().expect("a pid").to_string();
    let f = Spawned::start(
        command()
            .env("STALLSCOPE_SIMGPU_STATE", &state)
            .args(["record", "--json", "-d", "3s", "-o"])
            .arg(dir.join("x.rec"))
            .args(["--pid", &pid, "--nvml-lib"])
            .arg(libs.join("libnvidia-ml.so.1"))
            .arg("--flamegraph-dir")
            .arg(dir.join("fg")),
    )
    .finish(RECORD_TIMEOUT + Duration::from_secs(3));
    assert_success(&f, &format!("record of {} threads.py", python.display()));
    let _ = job.finish(Duration::from_secs(30));
    Run {
        report: parse_report(&f.stdout),
        truth,
        on_cpu: folded(&dir.join("fg/x.oncpu.folded")),
        off_cpu: folded(&dir.join("fg/x.offcpu.folded")),
    }
}

/// The stacks of thread `tid` (the folded lines begin with the process, then the thread).
fn of_thread(stacks: &[(Vec<String>, u64)], tid: u64) -> Vec<&(Vec<String>, u64)> {
    let tag = format!("({tid})");
    stacks
        .iter()
        .filter(|(frames, _)| frames.get(1).is_some_and(|t| t.ends_with(&tag)))
        .collect()
}

/// Whether `frames` holds frames naming each of `chain` in order (caller first, others may
/// lie between), each `function (file:line)` with its line one of the given.
fn holds(frames: &[String], chain: &[(&str, &[u32])]) -> bool {
    let mut rest = frames.iter();
    chain.iter().all(|(function, lines)| {
        rest.any(|f| {
            let Some((name, place)) = f.split_once(" (threads.py:") else {
                return false;
            };
            let line: Option<u32> = place.strip_suffix(')').and_then(|l| l.parse().ok());
            (name == *function || name.ends_with(&format!(".{function}")))
                && (lines.is_empty() || line.is_some_and(|l| lines.contains(&l)))
        })
    })
}

fn share(stacks: &[&(Vec<String>, u64)], pred: impl Fn(&[String]) -> bool) -> f64 {
    let total: u64 = stacks.iter().map(|s| s.1).sum();
    let hit: u64 = stacks.iter().filter(|s| pred(&s.0)).map(|s| s.1).sum();
    hit as f64 / total.max(1) as f64
}

fn check(python: &Path, r: &Run) -> Result<(), String> {
    let hot = marked_lines("# hot");
    let sleep = marked_lines("# sleep");
    let sync = marked_lines("# sync");
    let tid = |name: &str| {
        r.truth["tids"][name]
            .as_u64()
            .expect("the truth has the TIDs")
    };
    let version = r.truth["version"].as_str().unwrap_or("?");
    let pid = r.truth["pid"].as_u64().unwrap_or(0);
    let py = &r.report["python"];
    let found = py["processes"]
        .as_array()
        .is_some_and(|ps| ps.iter().any(|p| p[0] == pid && p[1] == version));
    if !found {
        return Err(format!(
            "the report does not list PID {pid} as CPython {version}: {py}"
        ));
    }
    if py["warnings"].as_array().is_some_and(|w| !w.is_empty()) {
        return Err(format!("python warnings: {}", py["warnings"]));
    }
    let worker = of_thread(&r.on_cpu, tid("worker"));
    let w = share(&worker, |f| {
        holds(f, &[("worker_loop", &[]), ("burn_worker", &hot)])
    });
    if w < 0.8 {
        return Err(format!(
            "{:.0}% of the worker's on-CPU samples show worker_loop -> burn_worker at lines {hot:?}, want 80%: {worker:?}",
            w * 100.0
        ));
    }
    let leftover = share(&worker, |f| {
        f.iter().any(|x| x == "_PyEval_EvalFrameDefault")
    });
    if leftover > 0.05 {
        return Err(format!(
            "{:.0}% of the worker's samples keep an interpreter loop frame: {worker:?}",
            leftover * 100.0
        ));
    }
    let main = of_thread(&r.on_cpu, tid("main"));
    let m = share(&main, |f| {
        holds(f, &[("run", &[]), ("step", &[]), ("burn_worker", &hot)])
    });
    if m < 0.6 {
        return Err(format!(
            "{:.0}% of the main thread's on-CPU samples show Trainer.run -> step -> burn_worker, want 60%: {main:?}",
            m * 100.0
        ));
    }
    let sleeper = of_thread(&r.off_cpu, tid("sleepy"));
    let s = share(&sleeper, |f| holds(f, &[("sleepy", &sleep)]));
    if s < 0.8 {
        return Err(format!(
            "{:.0}% of the sleeper's off-CPU time shows sleepy at line {sleep:?}, want 80%: {sleeper:?}",
            s * 100.0
        ));
    }
    let calls = r.report.to_string();
    let site = format!("wait_for_gpu (threads.py:{})", sync[0]);
    if !calls.contains(&site) {
        return Err(format!(
            "no CUDA call names its Python line {site}: {}",
            r.report["cuda"]
        ));
    }
    eprintln!(
        "{}: CPython {version}: worker {:.0}%, main {:.0}%, sleeper {:.0}%, {} samples with Python frames",
        python.display(),
        w * 100.0,
        m * 100.0,
        s * 100.0,
        py["samples"]
    );
    Ok(())
}

#[test]
fn every_interpreter_shows_its_threads_python_frames() {
    common::require_root();
    let _serial = serial();
    let sim = Scratch::new("python-sim");
    let release = bin().parent().expect("a directory").to_path_buf();
    simgpu_state::install_dir(&release, &sim.join("lib")).unwrap_or_else(|e| {
        panic!("the simulated GPU is not built ({e}): run `cargo xtask build`")
    });
    let mut failures = Vec::new();
    for python in interpreters() {
        let mut r = record(&python, &sim);
        let mut result = check(&python, &r);
        if let Err(first) = &result {
            stallscope_tests::reruns::note(&format!("python {}", python.display()), first);
            r = record(&python, &sim);
            result = check(&python, &r);
        }
        if let Err(e) = result {
            failures.push(format!("{}: {e}", python.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The keys of the kernel map `name` (u32 keys: PIDs or TIDs), from bpftool.
fn kernel_keys(name: &str) -> Vec<u32> {
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "name", name])
        .output()
        .expect("bpftool is installed by `cargo xtask setup`");
    assert!(
        out.status.success(),
        "bpftool map dump {name} failed: {out:?}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .filter_map(|e| match &e["key"] {
            Value::Number(n) => n.as_u64().map(|k| k as u32),
            // Without BTF: the key's bytes as hex strings, little-endian.
            Value::Array(bytes) => {
                let b: Vec<u8> = bytes
                    .iter()
                    .filter_map(|h| {
                        u8::from_str_radix(h.as_str()?.trim_start_matches("0x"), 16).ok()
                    })
                    .collect();
                Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?))
            }
            _ => None,
        })
        .collect()
}

/// Polls until `done` holds, for at most `within`; whether it did.
fn eventually(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + within;
    while std::time::Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

#[test]
fn a_python_process_that_execs_leaves_the_kernels_tables() {
    let _serial = serial();
    let dir = Scratch::new("python-exec");
    // Python, then (after `exec` on stdout) a program that is not Python, in the same PID.
    let script = "import os, sys, time\n\
                  print(f'ready pid={os.getpid()}', flush=True)\n\
                  time.sleep(float(sys.argv[1]))\n\
                  print('exec', flush=True)\n\
                  os.execv('/bin/sleep', ['sleep', sys.argv[2]])\n";
    let job = Spawned::start(Command::new("/usr/bin/python3").args(["-c", script, "3", "4"]));
    let line = job
        .wait_stdout(Duration::from_secs(30), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| panic!("no ready line; stderr:\n{}", job.stderr_so_far()));
    let pid: u32 = line
        .trim_start_matches("ready pid=")
        .trim()
        .parse()
        .unwrap();
    let rec = common::stallscope::start_record(&[pid], "7s", &dir.join("x.rec"), &["--no-gpu"]);
    common::stallscope::wait_tracing(&rec);
    assert!(
        eventually(Duration::from_secs(10), || kernel_keys("PY_PROCS")
            .contains(&pid)
            && kernel_keys("PY_THREADS").contains(&pid)),
        "the Python process {pid} never reached the kernel's tables"
    );
    job.wait_stdout(Duration::from_secs(30), |l| l == "exec")
        .expect("the job never exec'ed");
    assert!(
        eventually(Duration::from_secs(10), || !kernel_keys("PY_PROCS")
            .contains(&pid)
            && !kernel_keys("PY_THREADS").contains(&pid)),
        "PID {pid} exec'ed /bin/sleep but is still in the kernel's Python tables"
    );
    let f = rec.finish(RECORD_TIMEOUT);
    assert_success(&f, "record across the exec");
}
