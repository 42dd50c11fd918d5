//! `--format perfetto` and `--format html`. The trace is decoded with Perfetto's own schema
//! (`perfetto_trace_pb2`, from the `perfetto` package in the virtualenv `cargo xtask test`
//! installs) and checked against the JSON report of the same run; the page is opened from disk
//! in Debian's headless Chromium, driven by Playwright, with the network refused.
//!
//! The demo's workload (stallgen's phases) is recorded, which needs root; the ranks of two
//! recordings in one trace come from the checked-in recordings and need nothing.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{path::Path, process::Command, time::Duration};

use common::{
    Scratch, require_root, serial,
    simgpu::{Sim, release_dir},
    spawned::Spawned,
    stallscope::{RECORD_TIMEOUT, assert_success, command, parse_report},
};
use serde_json::Value;

/// The virtualenv's interpreter, with `perfetto`, `protobuf` and `playwright`.
fn viewer_python() -> String {
    std::env::var("STALLSCOPE_VIEWER_PYTHON").unwrap_or_else(|_| {
        panic!(
            "STALLSCOPE_VIEWER_PYTHON is not set: `cargo xtask test` installs the viewer \
             virtualenv (perfetto, protobuf, playwright) and sets it"
        )
    })
}

fn chromium() -> String {
    std::env::var("STALLSCOPE_CHROMIUM").unwrap_or_else(|_| {
        panic!("STALLSCOPE_CHROMIUM is not set: `cargo xtask test` installs chromium and sets it")
    })
}

fn script(name: &str) -> String {
    format!("{}/viewer/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn run_python(args: &[&str]) -> Value {
    let out = Command::new(viewer_python())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", viewer_python()));
    assert!(
        out.status.success(),
        "{args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?} printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn summary(trace: &Path) -> Value {
    run_python(&[&script("pftrace_summary.py"), trace.to_str().unwrap()])
}

fn tracks<'a>(s: &'a Value, kind: &str) -> Vec<&'a Value> {
    s["tracks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"] == kind)
        .collect()
}

fn events<'a>(s: &'a Value, track: &Value) -> &'a Value {
    &s["events"][track["uuid"].to_string()]
}

fn ns(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn close(got: u64, want: u64, what: &str) {
    let tolerance = (want as f64 * 0.01).max(1e6);
    assert!(
        (got as f64 - want as f64).abs() <= tolerance,
        "{what}: the trace has {got} ns, the report {want} ns"
    );
}

/// Every track's timestamps go forward and its slices never overlap or stay open.
fn well_formed(s: &Value) {
    for (uuid, e) in s["events"].as_object().unwrap() {
        assert_eq!(e["monotonic"], true, "track {uuid}'s timestamps go back");
        assert_eq!(e["overlaps"], 0, "track {uuid} has overlapping slices");
        assert_eq!(e["unclosed"], 0, "track {uuid} has a slice left open");
    }
}

/// The trace against one recording's JSON report: a utilization counter per GPU, cause
/// slices that add up to the idle time by cause, thread states that add up to each thread's
/// totals, every CUDA call.
fn matches_report(s: &Value, report: &Value) {
    well_formed(s);
    let named = |t: &Value, prefix: &str| t["name"].as_str().unwrap_or("").starts_with(prefix);
    for g in report["gpus"].as_array().unwrap() {
        let index = &g["index"];
        let util = tracks(s, "counter")
            .into_iter()
            .find(|t| named(t, &format!("GPU {index} utilization")))
            .unwrap_or_else(|| panic!("no utilization counter for GPU {index}"));
        assert_eq!(
            events(s, util)["counters"],
            g["samples"],
            "GPU {index}'s samples"
        );
        let lost = tracks(s, "plain")
            .into_iter()
            .find(|t| named(t, &format!("GPU {index} lost time")))
            .unwrap_or_else(|| panic!("no lost-time track for GPU {index}"));
        let e = events(s, lost);
        let mut idle_total = 0;
        for (cause, want) in g["idle_by_cause"].as_object().unwrap() {
            // Idle slices are named by cause; nccl_wait's waiting part is told by its `part`.
            let got = if cause == "nccl_wait" {
                ns(&e["by_name"][cause]).saturating_sub(ns(&e["by_part"]["waiting: busy to NVML"]))
            } else {
                ns(&e["by_name"][cause])
            };
            close(got, ns(want), &format!("GPU {index} idle time of {cause}"));
            idle_total += ns(want);
        }
        close(
            ns(&e["by_part"]["idle"]),
            idle_total,
            &format!("GPU {index} idle time"),
        );
        close(
            ns(&e["by_part"]["waiting: busy to NVML"]),
            ns(&g["waiting_ns"]),
            &format!("GPU {index} waiting time"),
        );
    }
    let threads = tracks(s, "thread");
    for t in report["threads"].as_array().unwrap() {
        let track = threads
            .iter()
            .find(|x| x["tid"] == t["tid"])
            .unwrap_or_else(|| panic!("no track for thread {}", t["tid"]));
        let e = events(s, track);
        for (state, field) in [
            ("on-CPU", "on_cpu_ns"),
            ("run queue", "runqueue_ns"),
            ("IO wait", "io_wait_ns"),
            ("blocked", "blocked_ns"),
        ] {
            close(
                ns(&e["by_name"][state]),
                ns(&t[field]),
                &format!("thread {} {state}", t["tid"]),
            );
        }
    }
    let calls_in_trace: u64 = tracks(s, "plain")
        .into_iter()
        .filter(|t| t["name"].as_str().unwrap_or("").contains(": CUDA calls"))
        .map(|t| ns(&events(s, t)["slices"]))
        .sum();
    let calls_in_report: u64 = report["cuda"]["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["calls"].as_array().into_iter().flatten())
        .map(|c| ns(&c["calls"]))
        .sum();
    assert!(calls_in_report > 0, "the report has no CUDA calls");
    assert_eq!(calls_in_trace, calls_in_report, "CUDA call slices");
}

#[test]
fn the_demo_recording_as_a_perfetto_trace_and_a_page_chromium_opens() {
    require_root();
    let _serial = serial();
    let sim = Sim::new("timeline");
    let dir = Scratch::new("timeline");
    let job = Spawned::start(
        Command::new(release_dir().join("stallgen"))
            .env("LD_LIBRARY_PATH", &sim.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
            .args(["--scenario", "phases", "--secs", "20"]),
    );
    let ready = job
        .wait_stdout(Duration::from_secs(60), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| panic!("stallgen never became ready:\n{}", job.stderr_so_far()));
    let pid = ready["ready pid=".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let rec = dir.join("demo.rec");
    let f = Spawned::start(
        command()
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
            .args([
                "record",
                "--format",
                "json,perfetto,html",
                "-d",
                "10s",
                "-o",
            ])
            .arg(&rec)
            .args(["--pid", &pid, "--nvml-lib"])
            .arg(sim.libs.join("libnvidia-ml.so.1")),
    )
    .finish(RECORD_TIMEOUT + Duration::from_secs(10));
    assert_success(&f, "record --format json,perfetto,html");
    let _ = job.finish(Duration::from_secs(40));
    let report = parse_report(&f.stdout);
    let trace = dir.join("demo.pftrace");
    let page = dir.join("demo.html");
    for (file, how) in [
        (
            &trace,
            "open it at https://ui.perfetto.dev (Open trace file)",
        ),
        (&page, "in a browser"),
    ] {
        let said = format!("wrote {}: ", file.display());
        assert!(
            f.stderr
                .lines()
                .any(|l| l.contains(&said) && l.contains(how)),
            "record does not say where {} went and how to open it:\n{}",
            file.display(),
            f.stderr
        );
    }

    let s = summary(&trace);
    matches_report(&s, &report);
    assert!(ns(&s["perf_samples"]) > 0, "no on-CPU samples in the trace");

    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("timeline-demo");
    let checked = run_python(&[
        &script("html_check.py"),
        page.to_str().unwrap(),
        out.to_str().unwrap(),
        &chromium(),
    ]);
    assert_eq!(checked["errors"], Value::Array(vec![]), "console errors");
    assert_eq!(
        checked["requests"],
        Value::Array(vec![]),
        "the page asked the network"
    );
    let lanes = checked["lanes"].as_array().unwrap();
    let count = |kind: &str| lanes.iter().filter(|l| l["kind"] == kind).count();
    assert_eq!(count("gpu"), report["gpus"].as_array().unwrap().len());
    assert_eq!(
        count("process"),
        report["processes"].as_array().unwrap().len(),
        "a lane per traced process"
    );
    let with_steps = report["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["steps"]["count"].as_u64().unwrap_or(0) > 1)
        .count();
    assert_eq!(count("steps"), with_steps, "a step lane per GPU with steps");
    let advised: Vec<&Value> = report["advice"]
        .as_array()
        .map(|a| a.iter().map(|a| &a["cause"]).collect())
        .unwrap_or_default();
    let shown: Vec<&Value> = checked["advice"].as_array().unwrap().iter().collect();
    assert_eq!(
        shown, advised,
        "the page's What to change, in the report's order"
    );
    let clicked = &checked["clicked"];
    assert!(
        clicked.is_object(),
        "the demo has no stall to click: {}",
        report["stalls"]
    );
    let cause = clicked["cause"].as_str().unwrap();
    assert_eq!(
        clicked["point_cause"], cause,
        "the click found another stall"
    );
    let text = clicked["text"].as_str().unwrap();
    assert!(
        clicked["visible"] == true,
        "clicking the longest stall showed nothing"
    );
    assert!(
        text.contains("Stall on GPU") && text.contains(cause),
        "the evidence does not name the cause {cause}:\n{text}"
    );
    assert!(
        text.contains("Threads") || text.contains("Stacks"),
        "the evidence shows no threads or stacks:\n{text}"
    );
    assert!(Path::new(checked["screenshot"].as_str().unwrap()).is_file());
}

#[test]
fn ranks_of_two_recordings_share_one_trace_one_process_each() {
    let dir = Scratch::new("timeline-job");
    let recordings = format!(
        "{}/../profiler-core/tests/recordings/gpu",
        env!("CARGO_MANIFEST_DIR")
    );
    let a = format!("{recordings}/v1-nccl-straggler-ddp.rec");
    let b = format!("{recordings}/v1-gpu-straggler.rec");
    let f = Spawned::start(
        command()
            .args([
                "report",
                &a,
                &b,
                "--format",
                "json,perfetto",
                "--flamegraph-dir",
            ])
            .arg(dir.join("out"))
            .arg("--no-flamegraphs"),
    )
    .finish(RECORD_TIMEOUT);
    assert_success(&f, "report of two recordings --format json,perfetto");
    let job = parse_report(&f.stdout);
    let s = summary(&dir.join("out/v1-nccl-straggler-ddp-job.pftrace"));
    well_formed(&s);
    let processes = tracks(&s, "process");
    let ranked = processes
        .iter()
        .filter(|p| p["name"].as_str().unwrap_or("").contains("· rank"))
        .count();
    assert_eq!(
        ranked,
        job["ranks"]["ranks"].as_array().unwrap().len(),
        "one process per rank: {processes:?}"
    );
    let mut pids: Vec<i64> = processes.iter().filter_map(|p| p["pid"].as_i64()).collect();
    let n = pids.len();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), n, "two hosts' processes merged");
    let hosts = tracks(&s, "plain")
        .into_iter()
        .filter(|t| t["parent"].is_null())
        .count();
    assert_eq!(hosts, 2, "one group per recording");
    let meta = s["metadata"].as_array().unwrap();
    assert_eq!(meta.len(), 2);
    for m in meta {
        assert!(
            m["clock_caveat"]
                .as_str()
                .is_some_and(|c| c.contains("clock")),
            "no clock caveat in {m}"
        );
    }
}
