//! `bench agent-soak`: `stallscope agent --all-gpu-processes` on the simulated GPU for many
//! minutes, scraped every few seconds as Prometheus would. In the first half stallgen jobs
//! start and stop under it (a new job every cycle, of a scenario that changes each time,
//! alive for part of the cycle); in the second half one job runs throughout, so that one
//! recorder stays attached for many minutes. The agent's RSS is sampled throughout and held
//! to the bound, its own growth from the first minute to the end to a small one;
//! every job must have been picked up; and through the long job the recorder's RSS must not
//! grow and no time may go unrecorded. A benchmark, not a test: it takes as long as it is
//! told to.
use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{
    proc::{Proc, children},
    soak::status_kib,
};
use crate::release_bin;

const EVERY: Duration = Duration::from_secs(5);
/// A job starts every cycle and lives for `JOB_SECS` of it: the agent sees targets come and
/// go, and minutes with none.
const CYCLE: Duration = Duration::from_secs(60);
const JOB_SECS: u64 = 40;
const SCENARIOS: [&str; 4] = ["dataloader-cpu", "healthy", "host-compute", "disk"];
/// The bound on the agent's RSS over the soak.
const RSS_BOUND_MIB: f64 = 128.0;
/// Growth allowed from the first sample after a minute to the last: start-up is not growth.
const RSS_GROWTH_MIB: f64 = 16.0;
const WARMUP: Duration = Duration::from_secs(60);

fn scrape(addr: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body.split_once("\r\n\r\n")?.1.to_owned())
}

/// A sample's value in an exposition (the first series of that name).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

pub fn agent_soak(minutes: f64) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the agent soak loads eBPF programs: run it as root");
    }
    let secs = (minutes * 60.0).max(120.0);
    let dir = std::env::temp_dir().join(format!("stallscope-agent-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let lib = dir.join("lib");
    simgpu_state::install_dir(&crate::root().join("target/release"), &lib)?;
    let state = dir.join("gpu-state");
    let mut agent = Proc::spawn(
        Command::new(release_bin("stallscope"))
            .args(["agent", "--listen", "127.0.0.1:0", "--all-gpu-processes"])
            .args(["--segment", "15s", "--flamegraphs", "5m", "--nvml-lib"])
            .arg(lib.join("libnvidia-ml.so.1"))
            .env("STALLSCOPE_SIMGPU_STATE", &state),
    )?;
    let line = agent
        .wait_line(Duration::from_secs(30), |l| l.contains("serving http://"))
        .context("the agent never served")?;
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .context("no address in the agent's line")?
        .to_owned();
    eprintln!(
        "agent-soak: {:.0} min, a stallgen job of {JOB_SECS} s every {} s, sampling every {} s",
        secs / 60.0,
        CYCLE.as_secs(),
        EVERY.as_secs()
    );
    let t0 = Instant::now();
    let mut job: Option<Proc> = None;
    let mut jobs = 0usize;
    let mut next_job = t0;
    // The long job's start, once it has started, and the uncovered seconds a minute into it.
    let long_from = secs / 2.0;
    let mut long_started: Option<f64> = None;
    let mut uncovered_then: Option<f64> = None;
    let mut uncovered_now = 0.0;
    // (seconds, agent RSS KiB, the largest recorder's RSS KiB, the agent's and all its
    // recorders' RSS KiB)
    let mut samples: Vec<(f64, u64, u64, u64)> = Vec::new();
    let (mut failed_scrapes, mut last_text) = (0usize, String::new());
    let mut segments_per_job: Vec<f64> = Vec::new();
    let mut segments_before = 0.0;
    while t0.elapsed().as_secs_f64() < secs {
        let now_s = t0.elapsed().as_secs_f64();
        let long = long_started.is_none() && now_s >= long_from;
        if long || (long_started.is_none() && Instant::now() >= next_job) {
            if let Some(j) = job.take() {
                let _ = j.stop(Duration::from_secs(1), Duration::from_secs(5));
            }
            let scenario = SCENARIOS[jobs % SCENARIOS.len()];
            let life = if long {
                long_started = Some(now_s);
                (secs - now_s) as u64 + 60
            } else {
                JOB_SECS
            };
            let j = Proc::spawn(
                Command::new(release_bin("stallgen"))
                    .args(["--scenario", scenario, "--secs", &life.to_string()])
                    .arg("--data-dir")
                    .arg(dir.join("data"))
                    .env("LD_LIBRARY_PATH", &lib)
                    .env("STALLSCOPE_SIMGPU_STATE", &state),
            )?;
            j.wait_line(Duration::from_secs(60), |l| l.starts_with("ready pid="))
                .with_context(|| format!("stallgen --scenario {scenario} never became ready"))?;
            job = Some(j);
            jobs += 1;
            next_job += CYCLE;
        }
        std::thread::sleep(EVERY);
        if agent.wait_exit(Duration::ZERO).is_some() {
            bail!("the agent exited during the soak");
        }
        let pid = agent.pid();
        let recorders: Vec<u64> = children(pid)
            .into_iter()
            .map(|c| status_kib(c, "VmRSS:"))
            .collect();
        let own = status_kib(pid, "VmRSS:");
        samples.push((
            t0.elapsed().as_secs_f64(),
            own,
            recorders.iter().copied().max().unwrap_or(0),
            own + recorders.iter().sum::<u64>(),
        ));
        match scrape(&addr) {
            Some(text) => {
                uncovered_now =
                    value(&text, "stallscope_agent_uncovered_seconds_total").unwrap_or(0.0);
                if long_started.is_some_and(|s| now_s >= s + WARMUP.as_secs_f64())
                    && uncovered_then.is_none()
                {
                    uncovered_then = Some(uncovered_now);
                }
                let segments = value(&text, "stallscope_agent_segments_total").unwrap_or(0.0);
                if segments_per_job.len() < jobs {
                    segments_per_job.push(0.0);
                }
                if let Some(n) = segments_per_job.last_mut() {
                    *n += segments - segments_before;
                }
                segments_before = segments;
                last_text = text;
            }
            None => failed_scrapes += 1,
        }
    }
    let hwm_kib = status_kib(agent.pid(), "VmHWM:");
    if let Some(j) = job.take() {
        let _ = j.stop(Duration::from_secs(1), Duration::from_secs(5));
    }
    let _ = agent.stop(Duration::from_secs(2), Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&dir);

    let mib = |kib: u64| kib as f64 / 1024.0;
    let first = samples
        .iter()
        .find(|s| s.0 >= WARMUP.as_secs_f64())
        .or(samples.first())
        .copied()
        .context("no sample of the agent")?;
    let last = *samples.last().context("no sample of the agent")?;
    let peak = samples.iter().map(|s| s.1).max().unwrap_or(0).max(hwm_kib);
    let recorder_peak = samples.iter().map(|s| s.2).max().unwrap_or(0);
    let tree_peak = samples.iter().map(|s| s.3).max().unwrap_or(0);
    // The long job's recorder, from a minute into the job to the end.
    let long_job: Vec<&(f64, u64, u64, u64)> = long_started
        .map(|from| {
            samples
                .iter()
                .filter(|s| s.0 >= from + WARMUP.as_secs_f64() && s.2 > 0)
                .collect()
        })
        .unwrap_or_default();
    let failures = value(&last_text, "stallscope_agent_segment_failures_total").unwrap_or(-1.0);
    let missed = segments_per_job.iter().filter(|n| **n < 1.0).count();
    let mut ok = true;
    let mut row = |what: &str, got: String, bound: String, pass: bool| {
        ok &= pass;
        println!(
            "| {what} | {got} | {bound} | {} |",
            if pass { "PASS" } else { "FAIL" }
        );
    };
    println!(
        "\n## agent-soak: {:.0} s, {jobs} jobs started and stopped\n",
        last.0
    );
    println!("| what | measured | bound | |\n|---|---|---|---|");
    row(
        "agent peak RSS (VmHWM)",
        format!("{:.1} MiB", mib(peak)),
        format!("≤ {RSS_BOUND_MIB} MiB"),
        mib(peak) <= RSS_BOUND_MIB,
    );
    // The recorders are the agent's children: what the host gives the agent is both.
    row(
        "agent and its recorders together, peak RSS (summed at each sample)",
        format!("{:.1} MiB", mib(tree_peak)),
        format!("≤ {RSS_BOUND_MIB} MiB"),
        mib(tree_peak) <= RSS_BOUND_MIB,
    );
    row(
        "agent RSS growth",
        format!(
            "{:.1} MiB at {:.0} s → {:.1} MiB at {:.0} s",
            mib(first.1),
            first.0,
            mib(last.1),
            last.0
        ),
        format!("≤ {RSS_GROWTH_MIB} MiB"),
        mib(last.1) - mib(first.1) <= RSS_GROWTH_MIB,
    );
    row(
        "jobs picked up (a segment while each ran)",
        format!(
            "{}/{}",
            segments_per_job.len() - missed,
            segments_per_job.len()
        ),
        "all".into(),
        missed == 0 && segments_per_job.len() == jobs,
    );
    row(
        "segment failures",
        format!("{failures}"),
        "0".into(),
        failures == 0.0,
    );
    row(
        "scrapes unanswered",
        failed_scrapes.to_string(),
        "0".into(),
        failed_scrapes == 0,
    );
    match (long_job.first(), long_job.last()) {
        (Some(a), Some(b)) => row(
            "the long job's recorder RSS growth",
            format!(
                "{:.1} MiB at {:.0} s → {:.1} MiB at {:.0} s",
                mib(a.2),
                a.0,
                mib(b.2),
                b.0
            ),
            format!("≤ {RSS_GROWTH_MIB} MiB"),
            mib(b.2) - mib(a.2) <= RSS_GROWTH_MIB,
        ),
        _ => row(
            "the long job's recorder RSS growth",
            "no sample".into(),
            "a minute of samples".into(),
            false,
        ),
    }
    let unrecorded = uncovered_then.map(|then| uncovered_now - then);
    row(
        "time unrecorded during the long job, after its first minute",
        unrecorded.map_or("no reading".into(), |u| format!("{u:.3} s")),
        "0 s".into(),
        unrecorded == Some(0.0),
    );
    println!(
        "\nthe recorders (one per job, each cutting 15 s segments): peak RSS {:.1} MiB",
        mib(recorder_peak)
    );
    if !ok {
        bail!("agent-soak: a bound did not hold");
    }
    Ok(())
}
