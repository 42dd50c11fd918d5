//! The scenarios added for the CUDA and NCCL probes, on the simulated GPU: each idles the GPU
//! a good part of the time, for its own reason, and data-parallel ranks (DDP-shaped steps) are
//! children of the stallgen process, one per GPU, that run the same steps. Each run gets a fresh state file, because scenarios configure
//! the simulated machine when they create it (the PCIe link, the number of GPUs); the device's
//! busy time is read straight from that file. Needs the simulator built:
//! `cargo build --release -p simgpu-cuda -p simgpu-nvml -p simgpu-nccl`.
use std::{
    io::{BufRead as _, BufReader, Read as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use simgpu_state::{InitConfig, PcieLink, SharedState};

const SECS: &str = "4";
/// The busy time is measured from this long after `ready` for MEASURE.
const SETTLE: Duration = Duration::from_millis(700);
const MEASURE: Duration = Duration::from_millis(2500);

/// Runs measure real time on a small machine: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Run {
    /// stdout up to and including `ready`.
    head: Vec<String>,
    totals: String,
    stderr: String,
    /// Idle share of each GPU over the measured window.
    idle: Vec<f64>,
    /// The stallgen process.
    pid: u32,
    /// What the GPUs' processes were, mid-run.
    gpu_pids: Vec<Vec<u32>>,
    link: PcieLink,
    truth: Vec<serde_json::Value>,
}

fn sim_dir() -> PathBuf {
    let release = Path::new(env!("CARGO_BIN_EXE_stallgen"))
        .parent()
        .expect("the binary has a directory")
        .to_path_buf();
    let dir = std::env::temp_dir().join(format!("stallgen-newlib-{}", std::process::id()));
    if let Err(e) = simgpu_state::install_dir(&release, &dir) {
        panic!("the simulated GPU is not built ({e})");
    }
    dir
}

fn run(name: &str, args: &[&str]) -> Run {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let lib_dir = sim_dir();
    let scratch = std::env::temp_dir().join(format!("stallgen-new-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let state = scratch.join("state");
    let truth_path = scratch.join("truth.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_stallgen"))
        .args(args)
        .args(["--secs", SECS, "--truth"])
        .arg(&truth_path)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .env(simgpu_state::STATE_ENV, &state)
        .env_remove(simgpu_state::PCIE_ENV)
        .env_remove(simgpu_state::DEVICES_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("stallgen starts");
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "{name}: no ready line: {head:?}"
        );
        head.push(line.trim_end().to_owned());
        if line.starts_with("ready pid=") {
            break;
        }
    }
    let shared = SharedState::open(&state, InitConfig::default()).unwrap();
    let gpus: Vec<_> = shared.devices().collect();
    std::thread::sleep(SETTLE);
    let busy = || gpus.iter().map(|g| g.busy_total_ns()).collect::<Vec<_>>();
    let (b0, t0) = (busy(), Instant::now());
    std::thread::sleep(MEASURE);
    let (b1, wall) = (busy(), t0.elapsed().as_nanos() as f64);
    let idle = b0
        .iter()
        .zip(&b1)
        .map(|(a, b)| 1.0 - (b - a) as f64 / wall)
        .collect();
    let gpu_pids = gpus
        .iter()
        .map(|g| g.snapshot().procs.iter().map(|p| p.pid).collect())
        .collect();
    let link = gpus[0].pcie_link();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "{name}: stallgen failed: {status}\n{stderr}"
    );
    let truth = std::fs::read_to_string(&truth_path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("truth lines are JSON"))
        .collect();
    let _ = std::fs::remove_dir_all(&scratch);
    let _ = std::fs::remove_dir_all(&lib_dir);
    let r = Run {
        head,
        totals: rest.lines().next().unwrap_or_default().to_owned(),
        stderr,
        idle,
        pid,
        gpu_pids,
        link,
        truth,
    };
    eprintln!(
        "{name}: idle {:?} {} | {}",
        r.idle
            .iter()
            .map(|i| format!("{:.1} %", i * 100.0))
            .collect::<Vec<_>>(),
        r.totals,
        r.stderr.trim().replace('\n', " | ")
    );
    r
}

/// The share of the run the feeder spent in `part` of its step (stallgen's stderr breakdown),
/// in rank order (ranks finish in any order).
fn feeder_share(stderr: &str, part: &str) -> Vec<f64> {
    let mut found: Vec<(usize, f64)> = stderr
        .lines()
        .filter(|l| l.contains("feeder:"))
        .filter_map(|l| {
            let rank = l
                .split_once("rank ")
                .and_then(|(_, r)| r.split(':').next()?.parse().ok())
                .unwrap_or(0);
            let share = l
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(part)?.strip_prefix('='))
                .and_then(|v| v.trim_end_matches('%').parse().ok())?;
            Some((rank, share))
        })
        .collect();
    found.sort_by_key(|(rank, _)| *rank);
    found.into_iter().map(|(_, share)| share).collect()
}

fn total(r: &Run, key: &str) -> f64 {
    r.totals
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {:?}", r.totals))
}

/// The GPU's idle share over the run by stallgen's own account (its kernel time against the
/// phases' length), and its steps.
fn truth_idle(truth: &[serde_json::Value]) -> (f64, u64) {
    let field =
        |t: &serde_json::Value, k: &str| t[k].as_u64().unwrap_or_else(|| panic!("{k}: {t}"));
    let busy: u64 = truth.iter().map(|t| field(t, "gpu_busy_ns")).sum();
    let wall: u64 = truth
        .iter()
        .map(|t| field(t, "end_ns") - field(t, "start_ns"))
        .sum();
    let steps = truth.iter().map(|t| field(t, "steps")).sum();
    (1.0 - busy as f64 / wall.max(1) as f64, steps)
}

#[test]
fn pageable_copy_idles_the_gpu_while_it_stages() {
    let r = run("pageable", &["--scenario", "pageable-copy"]);
    assert_eq!(r.truth[0]["cause"], "pinned_memory_copy");
    let (expected, steps) = truth_idle(&r.truth);
    assert!(
        expected > 0.3,
        "the scenario should idle the GPU a good part of the time at this host speed: {:?}",
        r.truth
    );
    // The device idled as much as the job's kernel time says, within a step's jitter.
    assert!(
        (r.idle[0] - expected).abs() < 0.1,
        "the device idled {:.2}, stallgen's truth says {expected:.2}",
        r.idle[0]
    );
    // The call itself is the driver's staging memcpy, at the simulated host's rate however
    // fast this machine copies: at least 64 MiB / rate per step.
    let rate = simgpu_state::host::host_rate_from_setting(
        std::env::var(simgpu_state::HOST_GBPS_ENV).ok().as_deref(),
    );
    let staging_ns = simgpu_state::host_copy_ns(64 << 20, rate);
    let copy_ns = r.truth[0]["feeder"]["copy_ns"].as_u64().unwrap();
    assert!(
        copy_ns >= steps * staging_ns * 95 / 100,
        "{steps} steps spent {copy_ns} ns in the copy call, want at least {staging_ns} ns each"
    );
    assert_eq!(r.link, PcieLink::MAX);
}

#[test]
fn pcie_degraded_trains_the_link_down_and_copies_crawl() {
    let r = run("pcie", &["--scenario", "pcie-degraded"]);
    assert_eq!(r.link, PcieLink::new(1, 4).unwrap());
    let (expected, _) = truth_idle(&r.truth);
    assert!(expected > 0.3, "truth: {:?}", r.truth);
    assert!(
        (r.idle[0] - expected).abs() < 0.1,
        "the device idled {:.2}, stallgen's truth says {expected:.2}",
        r.idle[0]
    );
    // Pinned: the copy call returns at once, the wait is in the sync.
    let copy = feeder_share(&r.stderr, "copy");
    assert!(copy[0] < 5.0, "copy {copy:?}");
    assert_eq!(r.truth[0]["cause"], "pcie");
}

#[test]
fn launch_bound_launches_tiny_kernels_as_fast_as_it_can() {
    let r = run("launch", &["--scenario", "launch-bound"]);
    assert!(r.idle[0] > 0.3, "idle {:.2}", r.idle[0]);
    let rate = total(&r, "launches_per_sec");
    assert!(rate >= 20_000.0, "{rate} launches/s");
    assert!(
        total(&r, "steps") >= 1.0,
        "the totals start with steps=: {}",
        r.totals
    );
    let launch = feeder_share(&r.stderr, "launch");
    assert!(
        launch[0] > 60.0,
        "the feeder spends its time launching: {launch:?}"
    );
    assert_eq!(r.truth[0]["cause"], "launch_overhead");
}

/// The rank PIDs of a run of `n` ranks, from its `rank <r> pid=<pid> workers=<pids>` lines,
/// which come before `ready pid=<stallgen>`; checks that rank r is alone on GPU r.
fn rank_pids(r: &Run, n: usize) -> Vec<u32> {
    assert_eq!(r.head.len(), n + 1, "{:?}", r.head);
    let pids: Vec<u32> = (0..n)
        .map(|k| {
            let line = &r.head[k];
            let rest = line.strip_prefix(&format!("rank {k} pid=")).expect(line);
            rest.split_whitespace().next().unwrap().parse().unwrap()
        })
        .collect();
    assert!(r.head[n].starts_with(&format!("ready pid={} workers=", r.pid)));
    let alone: Vec<Vec<u32>> = pids.iter().map(|p| vec![*p]).collect();
    assert_eq!(r.gpu_pids, alone, "rank r alone on GPU r");
    pids
}

/// Each rank's (rank, pid, cause, steps, gpu_busy_ns), in rank order: the runs here have one
/// phase, so one truth line per rank.
fn rank_truth(r: &Run) -> Vec<(u64, u64, String, u64, u64)> {
    let mut lines: Vec<_> = r
        .truth
        .iter()
        .map(|t| {
            let n = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("{k}: {t}"));
            assert!(t["end_ns"].as_u64() > t["start_ns"].as_u64(), "{t}");
            let cause = t["cause"].as_str().unwrap().to_owned();
            (n("rank"), n("pid"), cause, n("steps"), n("gpu_busy_ns"))
        })
        .collect();
    lines.sort_by_key(|l| l.0);
    lines
}

/// A step's kernel time in the presets: 4 kernels × 25 ms, whatever shape the ranks give it.
const STEP_KERNEL_NS: u64 = 100_000_000;

/// Every rank ran the same steps (or one would have waited forever in an all-reduce), each
/// with the presets' kernel time times `slowdown` (a throttled GPU's), and the causes are as
/// given.
fn ranks_agree(r: &Run, pids: &[u32], causes: &[&str], slowdown: &[u64]) {
    let truth = rank_truth(r);
    let got: Vec<(u64, u64, &str)> = truth.iter().map(|t| (t.0, t.1, t.2.as_str())).collect();
    let want: Vec<(u64, u64, &str)> = (0..pids.len())
        .map(|k| (k as u64, u64::from(pids[k]), causes[k]))
        .collect();
    assert_eq!(got, want);
    let steps = truth[0].3;
    assert!(steps >= 3, "{} steps in {SECS} s: {truth:?}", steps);
    for (t, slow) in truth.iter().zip(slowdown) {
        assert_eq!(t.3, steps, "the same steps on every rank: {truth:?}");
        assert_eq!(t.4, steps * STEP_KERNEL_NS * slow, "{truth:?}");
    }
}

#[test]
fn nccl_straggler_ranks_wait_for_the_disk_bound_one() {
    let r = run("nccl", &["--scenario", "nccl-straggler"]);
    let rank_pids = rank_pids(&r, 2);
    // The slow rank's GPU idles while it waits for data. The others' GPUs wait in the
    // all-reduce: busy to NVML if the simulated NCCL's kernel spins there, as a real one does
    // (STALLSCOPE_SIMGPU_NCCL_WAIT=busy), idle if it waits off the GPU (`idle`), so their
    // share is not asserted.
    assert!(
        r.idle[1] > 0.25,
        "the slow rank's GPU idled {:.2}",
        r.idle[1]
    );
    // The healthy rank waits in `.item()`'s sync (behind the all-reduces), the slow one for
    // its batches.
    let waits = feeder_share(&r.stderr, "wait_batch");
    assert!(
        waits.len() == 2 && waits[1] > 20.0 && waits[0] < 5.0,
        "{waits:?}"
    );
    ranks_agree(&r, &rank_pids, &["nccl_wait", "disk"], &[1, 1]);
}

#[test]
fn four_ddp_ranks_wait_for_the_disk_bound_one() {
    let r = run("nccl4", &["--scenario", "nccl-straggler", "--ranks", "4"]);
    let pids = rank_pids(&r, 4);
    let causes = ["nccl_wait", "nccl_wait", "nccl_wait", "disk"];
    ranks_agree(&r, &pids, &causes, &[1; 4]);
    assert!(
        r.idle[3] > 0.25,
        "the slow rank's GPU idled {:.2}",
        r.idle[3]
    );
    // The slow rank waits for its batches; the others in `.item()`'s sync, where the compute
    // stream waits for the all-reduces on the NCCL stream.
    let waits = feeder_share(&r.stderr, "wait_batch");
    let syncs = feeder_share(&r.stderr, "sync");
    assert!(waits.len() == 4 && waits[3] > 20.0, "{waits:?}");
    for k in 0..3 {
        assert!(
            waits[k] < 5.0 && syncs[k] > 50.0,
            "rank {k}: {waits:?} {syncs:?}"
        );
    }
}

#[test]
fn four_healthy_ddp_ranks_train_together() {
    let r = run(
        "healthy4",
        &["--scenario", "healthy", "--ranks", "4", "--buckets", "3"],
    );
    let pids = rank_pids(&r, 4);
    ranks_agree(&r, &pids, &["none"; 4], &[1; 4]);
    let waits = feeder_share(&r.stderr, "wait_batch");
    assert!(
        waits.len() == 4 && waits.iter().all(|w| *w < 5.0),
        "{waits:?}"
    );
}

#[test]
fn a_throttled_gpu_makes_its_rank_the_straggler() {
    let r = run("gpu-straggler", &["--scenario", "gpu-straggler"]);
    let pids = rank_pids(&r, 2);
    // The throttled GPU is busy three times as long per step as its kernels asked.
    ranks_agree(&r, &pids, &["nccl_wait", "gpu_throttled"], &[1, 3]);
    assert!(r.idle[1] < 0.15, "the throttled GPU idled {:.2}", r.idle[1]);
    let waits = feeder_share(&r.stderr, "wait_batch");
    assert!(
        waits.iter().all(|w| *w < 5.0),
        "no rank waits for data: {waits:?}"
    );
}
