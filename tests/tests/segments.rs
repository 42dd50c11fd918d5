//! `record --segment`: one recording cut into back-to-back files while the programs stay
//! attached. Each segment must cover its own stretch, end where the next begins, account
//! each thread's time within its own window as the kernel does, and be a recording that
//! `report` reads as the live one printed it.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use common::{
    Scratch,
    oracle::{COUNTERS_EVERY, Sampler},
    serial,
    spawned::Spawned,
    stallscope::{
        RECORD_TIMEOUT, assert_close, assert_covers_window, assert_in_range, assert_success,
        command, parse_report, report, split, thread, u64_field, window,
    },
    workload::Workload,
};
use serde_json::Value;

/// The documents `record --segment --format json` printed, one per segment.
fn segments(stdout: &str) -> Vec<Value> {
    serde_json::Deserializer::from_str(stdout)
        .into_iter::<Value>()
        .map(|d| d.unwrap_or_else(|e| panic!("not a stream of JSON documents ({e}):\n{stdout}")))
        .collect()
}

#[test]
fn segments_follow_each_other_and_each_accounts_its_own_window() {
    let _serial = serial();
    let cpu = common::last_allowed_cpu().to_string();
    // Two spinners on one CPU: each is on it about half the time and queued the rest, a
    // split that a segment counted from the wrong start would get wrong.
    let w = Workload::start(&["pinned", "--cpu", &cpu, "--secs", "20"]);
    let spinners: Vec<u32> = w.tids().into_iter().filter(|&t| t != w.pid).collect();
    assert_eq!(spinners.len(), 2, "expected two spinning threads");
    let sampler = Sampler::start(w.pid, &w.tids(), COUNTERS_EVERY);
    let dir = Scratch::new("segments");
    let mut cmd = command();
    cmd.args([
        "record",
        "--format",
        "json",
        "-d",
        "4500ms",
        "--segment",
        "1s",
    ])
    .args(["--pid", &w.pid.to_string(), "-o"])
    .arg(dir.join("x.rec"));
    let finished = Spawned::start(&mut cmd).finish(RECORD_TIMEOUT);
    let samples = sampler.stop();
    assert_success(&finished, "stallscope record --segment 1s");
    let docs = segments(&finished.stdout);
    let whole: u64 = docs
        .iter()
        .map(|d| u64_field(&d["report"], "duration_ns"))
        .sum();
    assert_eq!(
        docs.len() as u64,
        whole.div_ceil(1_000_000_000),
        "{:.3} s in segments of 1 s, cut on a grid from the start:\n{}",
        whole as f64 / 1e9,
        finished.describe()
    );
    let mut end_before = None;
    for (i, doc) in docs.iter().enumerate() {
        let n = i + 1;
        assert_eq!(doc["segment"], n, "segments come in order: {doc}");
        let file = dir.join(&format!("x.{n}.rec"));
        assert_eq!(doc["recording"], file.display().to_string());
        let r = &doc["report"];
        let (start, end) = window(r);
        if let Some(before) = end_before {
            assert_eq!(
                start,
                before,
                "segment {n} must start where segment {} ended",
                n - 1
            );
        }
        end_before = Some(end);
        if n < docs.len() {
            let secs = (end - start) as f64 / 1e9;
            // It ends at the first tick (every 50 ms) past its second.
            assert!(
                (0.9..1.25).contains(&secs),
                "segment {n} lasted {secs:.3} s, not its 1 s"
            );
        }
        assert_eq!(r["lost_events"], 0, "segment {n}: {}", r["events"]);
        for &tid in &spinners {
            let t = thread(r, tid);
            assert_covers_window(t, r);
            let s = split(t);
            let o = samples.split(tid, start, end);
            eprintln!("segment {n}, thread {tid}: stallscope {s:?}\nkernel: {o:?}");
            assert_in_range(
                &format!("segment {n}: {tid} on-CPU"),
                s.on_cpu,
                o.on_cpu_range(),
            );
            assert_close(
                &format!("segment {n}: {tid} run queue"),
                s.runqueue,
                o.runqueue,
            );
        }
        // The file is a recording of its own: `report` prints what the live run printed.
        let later = report(&file, true);
        assert_success(&later, &format!("stallscope report {}", file.display()));
        assert_eq!(
            &parse_report(&later.stdout),
            r,
            "segment {n}: `report` of the file differs from the live report"
        );
        assert!(
            dir.join(&format!("x.{n}.oncpu.folded")).is_file(),
            "segment {n}'s flame graphs are drawn"
        );
    }
    // Together they are the whole recording.
    let (first, _) = window(&docs[0]["report"]);
    assert_eq!(first + whole, end_before.unwrap());
    drop(w);
}
