//! `bench soak`: stallscope traces stallgen's phases on the simulated GPU, plus a process
//! that keeps creating short-lived threads, for many minutes; its resources are sampled every
//! few seconds (RSS, descriptors, entries of its hash maps in the kernel, events the kernel
//! dropped) and compared at the start and at the end against stated bounds. A benchmark,
//! not a test: it takes as long as it is told to.
use std::{
    collections::BTreeMap,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::proc::Proc;
use crate::release_bin;

/// Sampling period of the recorder's resources.
const EVERY: Duration = Duration::from_secs(5);
/// What is compared is the first sample after this, against the last: start-up (symbols,
/// first allocations) is not growth.
const WARMUP: Duration = Duration::from_secs(30);
/// The bounds the end may exceed the start by.
const RSS_GROWTH_MIB: f64 = 16.0;
const FD_GROWTH: i64 = 8;
/// A hash map may grow by this much plus a doubling: what is live at the end (threads,
/// in-flight CUDA calls, files read) is bounded by the workload, not by time.
const MAP_GROWTH: u64 = 256;
/// BPF map types whose entry count follows what is traced (hash, per-CPU hash, LRU hashes).
const HASH_TYPES: [u32; 4] = [1, 5, 9, 10];

/// One look at the recorder.
#[derive(Clone, Debug, Default)]
struct Sample {
    at_s: f64,
    rss_kib: u64,
    hwm_kib: u64,
    fds: i64,
    /// Entries of each hash map, by name.
    map_entries: BTreeMap<String, u64>,
    /// Records the kernel could not put into the ring buffer, summed over kinds and CPUs.
    dropped: u64,
    recording_bytes: u64,
}

pub(super) fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The BPF maps `pid` holds: (id, type), from its descriptors' fdinfo.
fn held_maps(pid: u32) -> Vec<(u64, u32)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    let mut maps: Vec<(u64, u32)> = dir
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|info| {
            let field = |k: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            Some((field("map_id:")?, field("map_type:")? as u32))
        })
        .collect();
    maps.sort_unstable();
    maps.dedup();
    maps
}

fn bpftool_json(bpftool: &Path, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let out = Command::new(bpftool)
        .arg("-j")
        .args(args)
        .output()
        .with_context(|| format!("running bpftool {args:?}"))?;
    anyhow::ensure!(
        out.status.success(),
        "bpftool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The dropped records in the recorder's COUNTS map (per-CPU array of {attempted, dropped}
/// u64 pairs, one element per event kind).
fn dropped(bpftool: &Path, id: u64) -> u64 {
    let Ok(v) = bpftool_json(bpftool, &["map", "dump", "id", &id.to_string()]) else {
        return 0;
    };
    let mut sum = 0;
    for elem in v.as_array().into_iter().flatten() {
        for cpu in elem["values"].as_array().into_iter().flatten() {
            // The value as bytes: attempted (8) then dropped (8), little-endian.
            let bytes: Vec<u8> = cpu["value"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| {
                    b.as_str()
                        .and_then(|s| u8::from_str_radix(s.trim_start_matches("0x"), 16).ok())
                })
                .collect();
            if bytes.len() >= 16 {
                sum += u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
            }
        }
    }
    sum
}

fn sample(bpftool: &Path, pid: u32, recording: &Path, t0: Instant) -> Sample {
    let mut s = Sample {
        at_s: t0.elapsed().as_secs_f64(),
        rss_kib: status_kib(pid, "VmRSS:"),
        hwm_kib: status_kib(pid, "VmHWM:"),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as i64),
        recording_bytes: std::fs::metadata(recording).map_or(0, |m| m.len()),
        ..Sample::default()
    };
    for (id, kind) in held_maps(pid) {
        let Ok(info) = bpftool_json(bpftool, &["map", "show", "id", &id.to_string()]) else {
            continue;
        };
        let name = info["name"].as_str().unwrap_or("?").to_string();
        if name == "COUNTS" {
            s.dropped = dropped(bpftool, id);
        } else if HASH_TYPES.contains(&kind) {
            let entries = bpftool_json(bpftool, &["map", "dump", "id", &id.to_string()])
                .map_or(0, |v| v.as_array().map_or(0, |a| a.len() as u64));
            s.map_entries.insert(name, entries);
        }
    }
    s
}

/// Runs the soak for `minutes` and prints the figures; fails if a bound is exceeded.
pub fn soak(minutes: f64) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the soak benchmark loads eBPF programs: run it as root");
    }
    crate::setup::ensure_debian(&[("bpftool", "bpftool")])?;
    let bpftool = ["/usr/sbin/bpftool", "/usr/bin/bpftool", "/sbin/bpftool"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .context("bpftool is not installed")?;
    let secs = (minutes * 60.0).max(60.0);
    let dir = std::env::temp_dir().join(format!("stallscope-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let lib = dir.join("lib");
    simgpu_state::install_dir(&crate::root().join("target/release"), &lib)?;
    let state = dir.join("gpu-state");
    let job_secs = secs + 30.0;
    let job = Proc::spawn(
        Command::new(release_bin("stallgen"))
            .args(["--scenario", "phases", "--secs", &format!("{job_secs}")])
            .env("LD_LIBRARY_PATH", &lib)
            .env("STALLSCOPE_SIMGPU_STATE", &state),
    )?;
    job.wait_line(Duration::from_secs(60), |l| l.starts_with("ready pid="))
        .context("stallgen never became ready")?;
    // About 20 threads a second for the whole run, each alive for a few milliseconds.
    let threads = (secs as usize + 30) * 20;
    let churn = Proc::spawn(Command::new(release_bin("stallwork")).args([
        "churn",
        "--delay-ms",
        "0",
        "--threads",
        &threads.to_string(),
        "--batch",
        "4",
        "--burn-ms",
        "2",
        "--pause-ms",
        "200",
        "--secs",
        &format!("{job_secs}"),
    ]))?;
    churn
        .wait_line(Duration::from_secs(30), |l| l.starts_with("ready pid="))
        .context("the churn workload never became ready")?;
    let recording = dir.join("soak.rec");
    let mut rec = Proc::spawn(
        Command::new(release_bin("stallscope"))
            .args([
                "record",
                "--no-flamegraphs",
                "-d",
                &format!("{secs}s"),
                "-o",
            ])
            .arg(&recording)
            .args(["--pid", &job.pid().to_string()])
            .args(["--pid", &churn.pid().to_string()])
            .arg("--nvml-lib")
            .arg(lib.join("libnvidia-ml.so.1"))
            .env("STALLSCOPE_SIMGPU_STATE", &state),
    )?;
    rec.wait_line(Duration::from_secs(60), |l| {
        l.starts_with("stallscope: tracing ")
    })
    .context("stallscope never started tracing")?;
    eprintln!(
        "soak: tracing stallgen's phases and a thread churn for {:.0} min; sampling every {} s",
        secs / 60.0,
        EVERY.as_secs()
    );
    let t0 = Instant::now();
    let mut samples = Vec::new();
    while t0.elapsed().as_secs_f64() < secs - 2.0 {
        std::thread::sleep(EVERY);
        let s = sample(bpftool, rec.pid(), &recording, t0);
        if s.rss_kib == 0 {
            break;
        }
        samples.push(s);
    }
    let exit = rec.wait_exit(Duration::from_secs(120));
    let (_, rec_out, _) = rec.stop(Duration::from_secs(1), Duration::from_secs(5));
    let _ = job.stop(Duration::from_secs(1), Duration::from_secs(5));
    let _ = churn.stop(Duration::from_secs(1), Duration::from_secs(5));
    let exit = exit.context("stallscope did not finish")?;
    anyhow::ensure!(
        exit.success(),
        "stallscope failed ({}): {}",
        exit.describe(),
        super::proc::tail(&rec_out)
    );
    let first = samples
        .iter()
        .find(|s| s.at_s >= WARMUP.as_secs_f64())
        .or(samples.first())
        .cloned()
        .context("no sample of the recorder")?;
    let last = samples
        .last()
        .cloned()
        .context("no sample of the recorder")?;
    let ok = print(&first, &last, exit.maxrss_kib, threads, &rec_out);
    let _ = std::fs::remove_dir_all(&dir);
    if !ok {
        bail!("soak: a resource grew past its bound");
    }
    Ok(())
}

/// Prints start against end with the bounds; whether every bound held.
fn print(first: &Sample, last: &Sample, maxrss_kib: u64, threads: usize, out: &str) -> bool {
    let mib = |kib: u64| kib as f64 / 1024.0;
    let mut ok = true;
    let mut row = |what: &str, start: String, end: String, bound: String, pass: bool| {
        ok &= pass;
        println!(
            "| {what} | {start} | {end} | {bound} | {} |",
            if pass { "PASS" } else { "FAIL" }
        );
    };
    println!(
        "\n## soak: {:.0} s traced (figures at {:.0} s and at {:.0} s)\n",
        last.at_s, first.at_s, last.at_s
    );
    println!("| resource | start | end | bound | |\n|---|---|---|---|---|");
    let rss_growth = mib(last.rss_kib) - mib(first.rss_kib);
    row(
        "RSS",
        format!("{:.1} MiB", mib(first.rss_kib)),
        format!("{:.1} MiB", mib(last.rss_kib)),
        format!("end ≤ start + {RSS_GROWTH_MIB} MiB"),
        rss_growth <= RSS_GROWTH_MIB,
    );
    row(
        "peak RSS (VmHWM)",
        format!("{:.1} MiB", mib(first.hwm_kib)),
        format!(
            "{:.1} MiB (wait4: {:.1} MiB)",
            mib(last.hwm_kib),
            mib(maxrss_kib)
        ),
        format!("end ≤ start + {RSS_GROWTH_MIB} MiB"),
        mib(last.hwm_kib) - mib(first.hwm_kib) <= RSS_GROWTH_MIB,
    );
    row(
        "descriptors",
        first.fds.to_string(),
        last.fds.to_string(),
        format!("end ≤ start + {FD_GROWTH}"),
        last.fds <= first.fds + FD_GROWTH,
    );
    for (name, &end) in &last.map_entries {
        let start = first.map_entries.get(name).copied().unwrap_or(0);
        row(
            &format!("map {name} entries"),
            start.to_string(),
            end.to_string(),
            format!("end ≤ 2 × start + {MAP_GROWTH}"),
            end <= 2 * start + MAP_GROWTH,
        );
    }
    row(
        "events dropped",
        first.dropped.to_string(),
        last.dropped.to_string(),
        "none".into(),
        last.dropped == 0,
    );
    let rate = (last.recording_bytes - first.recording_bytes.min(last.recording_bytes)) as f64
        / (last.at_s - first.at_s).max(1.0);
    println!(
        "\nrecording: {:.1} MiB at the end, growing {:.1} KiB/s (by design: it is the data); \
         {threads} short-lived threads were started over the run",
        last.recording_bytes as f64 / 1048576.0,
        rate / 1024.0
    );
    if let Some(summary) = out
        .lines()
        .find(|l| l.starts_with("stallscope: target pid"))
    {
        println!("report: {summary}");
    }
    ok
}
