//! `bench analyze`: how long `stallscope report` takes on a recording of one hour of an
//! 8-worker training job (about ten million events), and its peak memory.
//!
//! The recording is synthetic but shaped like a real one: 50 ms ticks for 12 threads, NVML
//! samples every 1/6 s, 99 Hz CPU samples on 16 CPUs, rate-limited off-CPU samples, block
//! IO, a few thousand distinct stacks, and a bottleneck that changes every five minutes.
use std::{
    fs::File,
    io::BufWriter,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use profiler_core::{
    RecordingWriter,
    record::{EndReason, GpuInfo, Meta, Record, ThreadCounters},
};

use super::proc::Proc;
use crate::{release_bin, root};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
const HOUR_S: u64 = 3600;
const START: u64 = 10 * SEC;
const FEEDER: u32 = 1000;
const WORKERS: u32 = 8;
const OTHERS: u32 = 3;
const STACKS: u32 = 4000;
const CPUS: u64 = 16;
const TARGET_S: f64 = 1.0;
const TARGET_RSS_MIB: f64 = 160.0;

/// A small deterministic PRNG, so every run measures the same file.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn threads() -> Vec<(u32, u32, &'static str)> {
    let mut t = vec![(FEEDER, FEEDER, "python")];
    t.extend((1..=OTHERS).map(|i| (FEEDER + i, FEEDER, "pt_helper")));
    t.extend((1..=WORKERS).map(|i| (2000 + i, 2000 + i, "pt_data_worker")));
    t
}

/// Fractions (on, queued, io, blocked) per tick for the feeder and the workers, and the GPU
/// utilization, in the phase that runs at `s` seconds.
fn phase(s: u64) -> ([f64; 4], [f64; 4], u32) {
    match (s / 300) % 4 {
        0 => ([0.9, 0.05, 0.0, 0.05], [0.3, 0.0, 0.0, 0.7], 97),
        1 => ([0.3, 0.0, 0.0, 0.7], [0.95, 0.03, 0.0, 0.02], 35),
        2 => ([0.2, 0.0, 0.0, 0.8], [0.2, 0.0, 0.7, 0.1], 25),
        _ => ([0.85, 0.1, 0.0, 0.05], [0.4, 0.0, 0.0, 0.6], 40),
    }
}

fn generate(path: &Path) -> anyhow::Result<u64> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = RecordingWriter::new(BufWriter::with_capacity(1 << 20, file))?;
    let mut rng = Rng(0x5eed_cafe_f00d_d00d);
    let mut n = 0u64;
    let mut put = |w: &mut RecordingWriter<BufWriter<File>>, r: Record| -> anyhow::Result<()> {
        n += 1;
        Ok(w.write(&r)?)
    };
    put(
        &mut w,
        Record::Meta(Box::new(Meta {
            target_pids: vec![FEEDER],
            start_ns: START,
            tick_ns: 50 * MS,
            sample_hz: 99,
            hostname: "bench".into(),
            ..Meta::default()
        })),
    )?;
    put(&mut w, Record::Host { cpus: CPUS as u32 })?;
    put(
        &mut w,
        Record::Gpu(Box::new(GpuInfo {
            index: 0,
            name: "bench GPU".into(),
            target_pids: vec![FEEDER],
            pcie_max_gen: 5,
            pcie_max_width: 16,
            ..GpuInfo::default()
        })),
    )?;
    for (tid, pid, comm) in threads() {
        put(
            &mut w,
            Record::Thread {
                ts_ns: START,
                tid,
                pid,
                comm: comm.into(),
            },
        )?;
    }
    for id in 0..STACKS {
        let depth = 8 + (id % 24) as usize;
        let frames = (0..depth)
            .map(|d| {
                format!(
                    "module{}::function_{}_{}",
                    d % 7,
                    (id as usize * 31 + d) % 997,
                    d
                )
            })
            .collect();
        put(&mut w, Record::Stack { id, frames })?;
    }
    let all = threads();
    let mut totals: Vec<ThreadCounters> = all
        .iter()
        .map(|&(tid, pid, _)| ThreadCounters {
            tid,
            pid,
            ..ThreadCounters::default()
        })
        .collect();
    let tick = 50 * MS;
    let period = SEC / 6;
    let mut next_sample = START + period;
    let mut t = START;
    while t < START + HOUR_S * SEC {
        let (feeder, worker, util) = phase((t - START) / SEC);
        for c in &mut totals {
            let f = if c.tid == FEEDER || c.pid == FEEDER {
                feeder
            } else {
                worker
            };
            c.on_cpu_ns += (f[0] * tick as f64) as u64;
            c.runqueue_ns += (f[1] * tick as f64) as u64;
            c.io_wait_ns += (f[2] * tick as f64) as u64;
            c.blocked_ns += (f[3] * tick as f64) as u64;
        }
        // 99 Hz on 16 CPUs: about 79 CPU samples per 50 ms tick, spread over the threads.
        for _ in 0..79 {
            let (tid, pid, _) = all[rng.below(all.len() as u64) as usize];
            let stack = rng.below(u64::from(STACKS)) as u32;
            put(
                &mut w,
                Record::CpuSample {
                    ts_ns: t + rng.below(tick),
                    tid,
                    pid,
                    stack,
                },
            )?;
        }
        for _ in 0..38 {
            let (tid, pid, _) = all[rng.below(all.len() as u64) as usize];
            put(
                &mut w,
                Record::OffCpuSample {
                    ts_ns: t + rng.below(tick),
                    tid,
                    pid,
                    duration_ns: rng.below(20 * MS),
                    io: rng.below(4) == 0,
                    stack: rng.below(u64::from(STACKS)) as u32,
                },
            )?;
        }
        for _ in 0..14 {
            let tid = 2000 + 1 + rng.below(u64::from(WORKERS)) as u32;
            put(
                &mut w,
                Record::BlockIo {
                    ts_ns: t + rng.below(tick),
                    tid,
                    pid: tid,
                    dev: 254 << 20,
                    write: false,
                    sector: rng.next() >> 20,
                    bytes: 128 * 1024,
                    queue_ns: rng.below(MS),
                    service_ns: rng.below(10 * MS),
                },
            )?;
        }
        t += tick;
        put(
            &mut w,
            Record::Tick {
                ts_ns: t,
                threads: totals.clone(),
            },
        )?;
        while next_sample <= t {
            put(
                &mut w,
                Record::GpuUtil {
                    gpu: 0,
                    ts_ns: next_sample,
                    period_ns: period,
                    util_pct: util,
                },
            )?;
            next_sample += period;
        }
    }
    put(
        &mut w,
        Record::End {
            ts_ns: t,
            reason: EndReason::Duration,
        },
    )?;
    w.flush()?;
    Ok(n)
}

/// `diff` of two recordings may take this many times one `report` of one of them.
const DIFF_RATIO: f64 = 2.2;
/// `diff` of two recordings may need this many times one `report`'s peak memory: it reads its
/// sides one after the other.
const DIFF_RSS_RATIO: f64 = 1.3;
/// Writing the Perfetto trace or the HTML page beside the report may add this much to its time.
const TIMELINE_RATIO: f64 = 1.5;
const TARGET_HTML_MIB: f64 = 20.0;

/// One `stallscope report FILE --format FORMATS` into an empty directory: wall seconds, peak
/// RSS (MiB), and the directory (for the files it wrote).
fn report_run(file: &Path, formats: &str, dir: &Path) -> anyhow::Result<(f64, f64, PathBuf)> {
    let out = dir.join(format!(
        "report-{}-{}",
        std::process::id(),
        formats.replace(',', "-")
    ));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let started = Instant::now();
    let mut p = Proc::spawn(
        Command::new(release_bin("stallscope"))
            .arg("report")
            .arg(file)
            .args(["--format", formats, "--flamegraph-dir"])
            .arg(&out),
    )?;
    let exit = p.wait_exit(Duration::from_secs(600)).with_context(|| {
        format!("stallscope report --format {formats} did not finish in 10 minutes")
    })?;
    let wall = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        exit.success(),
        "stallscope report --format {formats} failed: {}",
        exit.describe()
    );
    Ok((wall, exit.maxrss_kib as f64 / 1024.0, out))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Reports with the Perfetto trace and with the HTML page, each run beside a plain one so the
/// ratio is of one moment's machine; then the page's load in headless Chromium.
fn timeline_formats(file: &Path, dir: &Path, reps: u32) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let mut page = None;
    for (format, ext) in [("json,perfetto", "pftrace"), ("json,html", "html")] {
        let (mut plain, mut with, mut rss, mut size) = (Vec::new(), Vec::new(), 0.0f64, 0.0);
        for _ in 0..reps.max(1) {
            let (w, _, out) = report_run(file, "json", dir)?;
            let _ = std::fs::remove_dir_all(&out);
            plain.push(w);
            let (w, r, out) = report_run(file, format, dir)?;
            with.push(w);
            rss = rss.max(r);
            let written = out.join(format!("hour-8-workers.{ext}"));
            size = std::fs::metadata(&written)
                .with_context(|| format!("{} was not written", written.display()))?
                .len() as f64
                / (1 << 20) as f64;
            if ext == "html" {
                let kept = dir.join("hour-8-workers.html");
                std::fs::rename(&written, &kept)?;
                page = Some(kept);
            }
            let _ = std::fs::remove_dir_all(&out);
        }
        let (plain, with) = (median(plain), median(with));
        rows.push((format, ext, plain, with, rss, size));
    }
    println!();
    println!("| report with | file | size | median wall | plain report | ratio | peak RSS |");
    println!("|---|---|---|---|---|---|---|");
    for (format, ext, plain, with, rss, size) in &rows {
        println!(
            "| --format {format} | .{ext} | {size:.1} MiB | {with:.2} s | {plain:.2} s | {:.2}× | {rss:.0} MiB |",
            with / plain
        );
    }
    println!();
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    for (format, _, plain, with, _, size) in &rows {
        let ratio = with / plain;
        println!(
            "- {} --format {format} adds ≤ 50% to the report: {ratio:.2}×",
            verdict(ratio <= TIMELINE_RATIO)
        );
        if format.ends_with("html") {
            println!(
                "- {} the page ≤ {TARGET_HTML_MIB} MiB: {size:.1} MiB",
                verdict(*size <= TARGET_HTML_MIB)
            );
        }
    }
    if let Some(page) = page {
        let (python, chromium) = crate::setup::ensure_viewer()?;
        let shots = dir.join("page-shots");
        let out = Command::new(python)
            .arg(root().join("tests/viewer/html_check.py"))
            .arg(&page)
            .arg(&shots)
            .arg(chromium)
            .output()
            .context("running tests/viewer/html_check.py")?;
        anyhow::ensure!(
            out.status.success(),
            "html_check.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        println!(
            "- the page loads and draws in headless Chromium in {:.2} s (console errors: {}; screenshot {})",
            v["load_s"].as_f64().unwrap_or(f64::NAN),
            v["errors"].as_array().map_or(0, Vec::len),
            shots.join("report.png").display()
        );
    }
    Ok(())
}

pub fn analyze(reps: u32) -> anyhow::Result<()> {
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let file: PathBuf = dir.join("hour-8-workers.rec");
    if !file.exists() {
        eprintln!(
            "xtask: generating {} (one hour, 8 workers)…",
            file.display()
        );
        let t = Instant::now();
        let n = generate(&file)?;
        eprintln!("xtask: {n} records in {:.1} s", t.elapsed().as_secs_f64());
    }
    let size_mib = std::fs::metadata(&file)?.len() as f64 / (1 << 20) as f64;
    // A second hour for `diff` to compare against (the same job, so no regression: the
    // common case in CI, and the one without differential flame graphs to draw).
    let other: PathBuf = dir.join("hour-8-workers-again.rec");
    if !other.exists() {
        std::fs::copy(&file, &other)?;
    }
    let mut runs = Vec::new();
    let mut diffs = Vec::new();
    for _ in 0..reps.max(1) {
        // An empty directory each time, as for a recording's first report: overwriting the
        // last run's 150 MB of graphs would add the file system's cost of freeing them.
        let out = tempdir(&dir)?;
        let started = Instant::now();
        let mut p = Proc::spawn(
            Command::new(release_bin("stallscope"))
                .arg("report")
                .arg(&file)
                .arg("--json")
                .arg("--flamegraph-dir")
                .arg(&out),
        )?;
        let exit = p
            .wait_exit(Duration::from_secs(600))
            .context("stallscope report did not finish in 10 minutes")?;
        let wall = started.elapsed().as_secs_f64();
        anyhow::ensure!(
            exit.success(),
            "stallscope report failed: {}",
            exit.describe()
        );
        runs.push((wall, exit.cpu_s, exit.maxrss_kib as f64 / 1024.0));
        let _ = std::fs::remove_dir_all(&out);
        // Side by side with the report: `diff` of the two hours.
        let started = Instant::now();
        let mut p = Proc::spawn(
            Command::new(release_bin("stallscope"))
                .arg("diff")
                .args([&file, &other])
                .args(["--format", "json"]),
        )?;
        let exit = p
            .wait_exit(Duration::from_secs(600))
            .context("stallscope diff did not finish in 10 minutes")?;
        anyhow::ensure!(
            exit.success(),
            "stallscope diff failed: {}",
            exit.describe()
        );
        diffs.push((
            started.elapsed().as_secs_f64(),
            exit.maxrss_kib as f64 / 1024.0,
        ));
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (wall, cpu, rss) = runs[runs.len() / 2];
    let peak = runs.iter().map(|r| r.2).fold(0.0, f64::max);
    println!("| recording | size | runs | median wall | CPU | peak RSS |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| 1 h, 8 workers | {size_mib:.0} MiB | {} | {wall:.2} s | {cpu:.2} s | {rss:.0} MiB (max {peak:.0}) |",
        runs.len()
    );
    println!();
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    println!(
        "- {} report time ≤ {TARGET_S} s: {wall:.2} s",
        verdict(wall <= TARGET_S)
    );
    println!(
        "- {} peak RSS ≤ {TARGET_RSS_MIB} MiB: {peak:.0} MiB",
        verdict(peak <= TARGET_RSS_MIB)
    );
    diffs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (diff_wall, _) = diffs[diffs.len() / 2];
    let diff_rss = diffs.iter().map(|d| d.1).fold(0.0, f64::max);
    let ratio = diff_wall / wall;
    println!(
        "- {} `diff` of two such hours ≤ {DIFF_RATIO}× one report: {diff_wall:.2} s, {ratio:.2}× \
         (peak RSS {diff_rss:.0} MiB), run after each report",
        verdict(ratio <= DIFF_RATIO)
    );
    let rss_ratio = diff_rss / peak;
    println!(
        "- {} `diff`'s peak RSS ≤ {DIFF_RSS_RATIO}× one report's: {diff_rss:.0} MiB against \
         {peak:.0} MiB, {rss_ratio:.2}×",
        verdict(rss_ratio <= DIFF_RSS_RATIO)
    );
    println!(
        "Each report run writes the JSON report and every flame graph and folded file into an \
         empty directory."
    );
    timeline_formats(&file, &dir, reps)
}

fn tempdir(parent: &Path) -> anyhow::Result<PathBuf> {
    let d = parent.join(format!("report-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
