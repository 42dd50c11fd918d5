//! The CUDA uprobes against the simulated driver: a library loaded after attach is probed, a
//! library that lacks the probed functions degrades with a named warning while the others
//! keep working, and a library visible only inside the target's mount namespace is probed
//! through /proc/PID/root.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{path::PathBuf, process::Command, time::Duration};

use common::{
    Scratch, require_root, serial,
    spawned::Spawned,
    stallscope::{RECORD_TIMEOUT, assert_success, bin, parse_report, start_record},
    workload::{ready_pid, stallwork},
};
use serde_json::Value;

/// The simulated libraries, installed into a scratch directory.
fn sim_libs(dir: &Scratch) -> PathBuf {
    let libs = dir.join("lib");
    let release = bin().parent().unwrap().to_path_buf();
    simgpu_state::install_dir(&release, &libs).unwrap_or_else(|e| {
        panic!("the simulated GPU is not built ({e}): run `cargo xtask build`")
    });
    libs
}

fn start(cmd: &mut Command) -> (Spawned, u32) {
    let proc = Spawned::start(cmd);
    let line = proc
        .wait_stdout(Duration::from_secs(30), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| panic!("no ready line; stderr:\n{}", proc.stderr_so_far()));
    let pid = ready_pid(&line).unwrap();
    (proc, pid)
}

fn record(pid: u32, dir: &Scratch, secs: &str) -> (Value, String) {
    let rec = start_record(&[pid], secs, &dir.join("x.rec"), &["--no-gpu"]);
    let f = rec.finish(RECORD_TIMEOUT);
    assert_success(&f, "record");
    (parse_report(&f.stdout), f.stderr.clone())
}

fn process(report: &Value, pid: u32) -> &Value {
    report["cuda"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("no CUDA activity for PID {pid}: {}", report["cuda"]))
}

fn calls(report: &Value, pid: u32, api: &str) -> u64 {
    process(report, pid)["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["api"] == api)
        .map_or(0, |c| c["calls"].as_u64().unwrap())
}

fn library<'a>(report: &'a Value, kind: &str) -> &'a Value {
    report["cuda"]["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["library"] == kind)
        .unwrap_or_else(|| panic!("no {kind} library probed: {}", report["cuda"]))
}

#[test]
fn a_driver_loaded_after_attach_is_probed() {
    require_root();
    let _serial = serial();
    let dir = Scratch::new("cuda-late");
    let libs = sim_libs(&dir);
    let (job, pid) = start(
        Command::new(stallwork())
            .env("LD_LIBRARY_PATH", &libs)
            .env("STALLSCOPE_SIMGPU_STATE", dir.join("state"))
            .args(["cuda-late", "--lib", "libcuda.so.1", "--delay-ms", "3500"])
            .args(["--secs", "8"]),
    );
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        !maps.contains("libcuda"),
        "libcuda was mapped before attach"
    );
    let (report, _) = record(pid, &dir, "6s");
    let lib = library(&report, "Driver");
    assert_eq!(lib["pid"], pid);
    assert!(lib["attached"].as_u64().unwrap() > 10, "{lib}");
    let n = calls(&report, pid, "cuCtxSynchronize");
    // The calls the job made while the recording ran, all after the load. The kernel says
    // when a process maps new code, so the probes go on within a scan (200 ms) of the load,
    // not at the next timed read of the maps (3 s later at that point, past the end): most
    // of the calls are seen.
    let (_, end) = common::stallscope::window(&report);
    let out = job.finish(Duration::from_secs(30)).stdout;
    let made = out
        .lines()
        .filter_map(|l| l.strip_prefix("call ns="))
        .filter_map(|t| t.parse::<u64>().ok())
        .filter(|&t| t <= end)
        .count() as u64;
    assert!(made > 50, "the job made only {made} calls while recorded");
    eprintln!("cuCtxSynchronize: {n} seen of {made} made while recorded");
    assert!(
        n as f64 >= 0.7 * made as f64,
        "cuCtxSynchronize seen {n} times of the {made} made while recorded: {}",
        report["cuda"]
    );
}

#[test]
fn a_library_without_the_symbols_degrades_with_a_warning() {
    require_root();
    let _serial = serial();
    let dir = Scratch::new("cuda-missing");
    let libs = sim_libs(&dir);
    // A real shared library under a CUDA runtime name: it has none of cudart's functions.
    let fake = libs.join("libcudart.so.12");
    std::fs::copy(libs.join("libnvidia-ml.so.1"), &fake).unwrap();
    let (_job, pid) = start(
        Command::new(stallwork())
            .env("LD_LIBRARY_PATH", &libs)
            .env("STALLSCOPE_SIMGPU_STATE", dir.join("state"))
            .args(["cuda-late", "--lib", "libcuda.so.1", "--delay-ms", "0"])
            .args(["--preload", fake.to_str().unwrap(), "--secs", "5"]),
    );
    std::thread::sleep(Duration::from_millis(300));
    let (report, stderr) = record(pid, &dir, "2s");
    assert!(
        stderr.contains("libcudart") && stderr.contains("`cudaStreamSynchronize` not probed"),
        "no named warning:\n{stderr}"
    );
    let rt = library(&report, "Runtime");
    assert_eq!(rt["attached"], 0, "{rt}");
    assert!(
        rt["missing"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m[0] == "cudaStreamSynchronize"),
        "{rt}"
    );
    // The driver's probes still work.
    assert!(library(&report, "Driver")["attached"].as_u64().unwrap() > 10);
    assert!(calls(&report, pid, "cuCtxSynchronize") >= 50);
}

#[test]
fn a_library_only_inside_the_targets_mount_namespace_is_probed() {
    require_root();
    let _serial = serial();
    let dir = Scratch::new("cuda-mntns");
    let libs = sim_libs(&dir);
    let hidden = dir.join("hidden");
    std::fs::create_dir_all(&hidden).unwrap();
    let script = format!(
        "mount -t tmpfs tmpfs {h} && cp {l}/libcuda.so.1 {h}/ && exec {w} cuda-late --lib {h}/libcuda.so.1 --delay-ms 0 --secs 6",
        h = hidden.display(),
        l = libs.display(),
        w = stallwork()
    );
    // unshare execs the shell in its own process, and the shell execs stallwork: one PID.
    let (_job, pid) = start(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(&script)
            .env("STALLSCOPE_SIMGPU_STATE", dir.join("state")),
    );
    let path = hidden.join("libcuda.so.1");
    assert!(
        !path.exists(),
        "{} must not be visible outside the namespace",
        path.display()
    );
    std::thread::sleep(Duration::from_millis(300));
    let (report, stderr) = record(pid, &dir, "2s");
    let lib = library(&report, "Driver");
    assert_eq!(lib["path"], path.to_str().unwrap(), "{lib}\n{stderr}");
    assert!(lib["attached"].as_u64().unwrap() > 10, "{lib}\n{stderr}");
    assert!(
        calls(&report, pid, "cuCtxSynchronize") >= 50,
        "{}",
        report["cuda"]
    );
}

/// Code that records an event after every kernel would pay two uprobe traps per call: past
/// the guard's rate the event probes are removed, and the report says so; a DDP-like rate
/// keeps them.
#[test]
fn event_probes_called_too_often_are_removed_and_the_report_says_so() {
    require_root();
    let _serial = serial();
    let dir = Scratch::new("cuda-events");
    let libs = sim_libs(&dir);
    const SECS: u64 = 6;
    for (per_sec, removed) in [(200u64, false), (20_000, true)] {
        let (job, pid) = start(
            Command::new(stallwork())
                .env("LD_LIBRARY_PATH", &libs)
                .env("STALLSCOPE_SIMGPU_STATE", dir.join("state"))
                .args(["cuda-events", "--lib", "libcuda.so.1"])
                .args(["--per-sec", &per_sec.to_string(), "--secs", "10"]),
        );
        std::thread::sleep(Duration::from_millis(300));
        let (report, stderr) = record(pid, &dir, &format!("{SECS}s"));
        drop(job);
        let unavailable = report["unavailable"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["signal"] == "cuda-events")
            .cloned();
        let recorded = calls(&report, pid, "cuEventRecord");
        let made = per_sec * SECS;
        if removed {
            let u = unavailable.unwrap_or_else(|| {
                panic!(
                    "{per_sec}/s: the event probes stayed: {}
{stderr}",
                    report["unavailable"]
                )
            });
            assert!(
                u["reason"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("PID {pid}")),
                "{u}"
            );
            assert!(
                (recorded as f64) < 0.6 * made as f64,
                "{per_sec}/s: {recorded} of about {made} calls recorded after the removal"
            );
        } else {
            assert!(unavailable.is_none(), "{per_sec}/s: {unavailable:?}");
            assert!(
                recorded as f64 >= 0.7 * made as f64,
                "{per_sec}/s: only {recorded} of about {made} calls recorded"
            );
        }
    }
}

/// (ID, name) of a program, (program ID, type) of a link.
type Objects = Vec<(u64, String)>;

/// Every loaded eBPF program and every link, from bpftool.
fn kernel_objects(bpftool: &std::path::Path) -> (Objects, Objects) {
    let list = |what: &str| -> Vec<Value> {
        let out = Command::new(bpftool)
            .args(["-j", what, "list"])
            .output()
            .unwrap();
        assert!(out.status.success(), "bpftool {what} list failed: {out:?}");
        serde_json::from_slice::<Value>(&out.stdout)
            .unwrap()
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let progs = list("prog")
        .iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap_or("").to_owned();
            (p["id"].as_u64().unwrap_or(0), name)
        })
        .collect();
    // bpftool before 7.4 names a uprobe_multi link by its number, 12.
    let links = list("link")
        .iter()
        .map(|l| {
            let ty = match &l["type"] {
                Value::String(s) => s.clone(),
                Value::Number(n) if n.as_u64() == Some(12) => "uprobe_multi".to_owned(),
                other => other.to_string(),
            };
            (l["prog_id"].as_u64().unwrap_or(0), ty)
        })
        .collect();
    (progs, links)
}

/// On this kernel (6.6 and later) the CUDA probes are one uprobe_multi link per library and
/// side; the recorder exits with its report while a helper removes them, and soon nothing of
/// the recording is left in the kernel.
#[test]
fn the_probes_are_one_uprobe_multi_link_per_library_and_are_gone_after_the_recording() {
    require_root();
    let _serial = serial();
    let bpftool = common::find_tool("bpftool")
        .expect("bpftool is installed by `cargo xtask setup`: apt-get install bpftool");
    let dir = Scratch::new("cuda-multi");
    let libs = sim_libs(&dir);
    let (job, pid) = start(
        Command::new(stallwork())
            .env("LD_LIBRARY_PATH", &libs)
            .env("STALLSCOPE_SIMGPU_STATE", dir.join("state"))
            .args(["cuda-late", "--lib", "libcuda.so.1", "--delay-ms", "0"])
            .args(["--secs", "10"]),
    );
    let rec = start_record(&[pid], "4s", &dir.join("x.rec"), &["--no-gpu"]);
    common::stallscope::wait_tracing(&rec);
    // The library is probed within a scan of its load.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let cuda_links = loop {
        let (progs, links) = kernel_objects(&bpftool);
        let cuda: std::collections::BTreeSet<u64> = progs
            .iter()
            .filter(|(_, n)| n.starts_with("cuda_enter") || n.starts_with("cuda_exit"))
            .map(|(id, _)| *id)
            .collect();
        let held: Vec<String> = links
            .into_iter()
            .filter(|(p, _)| cuda.contains(p))
            .map(|(_, t)| t)
            .collect();
        if held.len() >= 2 || std::time::Instant::now() >= deadline {
            break held;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        cuda_links.len() >= 2 && cuda_links.iter().all(|t| t == "uprobe_multi"),
        "the CUDA probes' links: {cuda_links:?}, want an entry and a return uprobe_multi link"
    );
    // The simulated driver is one library: one link per side, however many functions.
    assert!(cuda_links.len() <= 4, "{cuda_links:?}");
    let f = rec.finish(RECORD_TIMEOUT);
    assert_success(&f, "record");
    let report = parse_report(&f.stdout);
    assert!(
        calls(&report, pid, "cuCtxSynchronize") > 0,
        "{}",
        report["cuda"]
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (progs, links) = kernel_objects(&bpftool);
        let left: Vec<&String> = progs
            .iter()
            .filter(|(_, n)| n.starts_with("cuda_") || n == "sched_switch")
            .map(|(_, n)| n)
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "30 s after the recording, still loaded: {left:?} ({} links); stderr:\n{}",
            links.len(),
            f.stderr
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(job);
}
