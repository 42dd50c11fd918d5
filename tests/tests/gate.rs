//! `stallscope diff` and `stallscope check` as CI runs them: exit codes, formats, mixed inputs
//! and bad inputs, on the recordings of stallgen's scenarios kept in
//! `profiler-core/tests/recordings/gpu/` (no root, no GPU, no timing).
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{Scratch, stallscope::command};
use serde_json::Value;

fn recording(scenario: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../profiler-core/tests/recordings/gpu")
        .join(format!("v1-{scenario}.rec"))
}

fn stallscope(args: &[&std::ffi::OsStr]) -> Output {
    command().args(args).output().expect("stallscope runs")
}

fn diff(base: &Path, new: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&std::ffi::OsStr> = vec!["diff".as_ref(), base.as_os_str(), new.as_os_str()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    // Not beside NEW, which is in the source tree.
    if !extra.contains(&"--flamegraph-dir") {
        args.push("--no-flamegraphs".as_ref());
    }
    stallscope(&args)
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The (metric, change) pairs of a JSON diff.
fn verdicts(v: &Value) -> Vec<(String, String)> {
    v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["metric"].as_str().unwrap().to_owned(),
                r["change"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn json_report(rec: &Path, dir: &Scratch, name: &str) -> PathBuf {
    let out = stallscope(&[
        "report".as_ref(),
        rec.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
        "--no-flamegraphs".as_ref(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join(name);
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

#[test]
fn the_same_run_twice_exits_0_with_every_delta_zero() {
    let rec = recording("disk");
    let out = diff(&rec, &rec, &["--format", "json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    assert_eq!(v["regressions"], 0);
    assert!(
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["delta"] == 0.0),
        "{v}"
    );
}

#[test]
fn a_new_cause_is_a_regression_named_in_every_format() {
    let (base, new) = (recording("host-compute"), recording("dataloader-cpu"));
    let dir = Scratch::new("gate-regression");
    let graphs = dir.join("graphs");
    let graphs_arg = graphs.display().to_string();
    let out = diff(
        &base,
        &new,
        &["--format", "json", "--flamegraph-dir", &graphs_arg],
    );
    assert_eq!(out.status.code(), Some(1));
    let v = json_of(&out);
    // What changed: the workers' stacks and time behind the new cause, and its graph.
    let change = &v["changes"][0];
    assert_eq!(change["cause"], "dataloader_cpu", "{v}");
    assert_eq!(
        change["threads"][0]["what"], "worker pt_data_worker",
        "{change}"
    );
    assert!(
        change["stacks"][0]["new"].as_f64().unwrap() > 0.0,
        "{change}"
    );
    let svg = std::fs::read_to_string(graphs.join("stallscope-diff.dataloader_cpu.svg"))
        .expect("a differential flame graph of the regressed cause");
    assert!(
        svg.starts_with("<?xml") && svg.contains("burn_cpu"),
        "{svg}"
    );
    let rows = verdicts(&v);
    assert!(
        rows.contains(&("dataloader_cpu".into(), "regression".into())),
        "{rows:?}"
    );
    assert!(
        rows.contains(&("host_compute".into(), "improvement".into())),
        "{rows:?}"
    );
    let text = diff(&base, &new, &[]);
    assert_eq!(text.status.code(), Some(1));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("dataloader_cpu on GPU 0"), "{text}");
    let md = diff(&base, &new, &["--format", "markdown"]);
    let md = String::from_utf8_lossy(&md.stdout);
    assert!(md.starts_with("### stallscope diff:"), "{md}");
    assert!(
        md.contains("| 0 | `dataloader_cpu` |") && md.contains("**REGRESSION**"),
        "{md}"
    );
    // Improvements never fail: the other way round exits 1 only for host_compute's rise.
    let back = json_of(&diff(&new, &base, &["--format", "json"]));
    assert!(verdicts(&back).contains(&("dataloader_cpu".into(), "improvement".into())));
}

#[test]
fn a_json_baseline_gives_the_verdict_of_its_recording() {
    let dir = Scratch::new("gate-mixed");
    let (base, new) = (recording("pageable-copy"), recording("pcie-degraded"));
    let base_json = json_report(&base, &dir, "base.json");
    let from_recordings = json_of(&diff(&base, &new, &["--format", "json"]));
    let mixed = diff(&base_json, &new, &["--format", "json"]);
    let from_mixed = json_of(&mixed);
    assert_eq!(verdicts(&from_recordings), verdicts(&from_mixed));
    assert_eq!(from_recordings["rows"], from_mixed["rows"]);
    assert_eq!(mixed.status.code(), Some(1), "pcie is new: a regression");
}

#[test]
fn a_directory_is_repeated_runs() {
    let dir = Scratch::new("gate-dir");
    let runs = dir.join("base");
    std::fs::create_dir_all(&runs).unwrap();
    for (i, s) in ["disk", "disk"].iter().enumerate() {
        std::fs::copy(recording(s), runs.join(format!("run{i}.rec"))).unwrap();
    }
    let out = diff(&runs, &recording("disk"), &["--format", "json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json_of(&out)["base"].as_array().unwrap().len(), 2);
}

#[test]
fn thresholds_decide_what_fails() {
    let (base, new) = (recording("host-compute"), recording("dataloader-cpu"));
    let lax = diff(&base, &new, &["--threshold", "any=90"]);
    assert_eq!(
        lax.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&lax.stdout)
    );
    let bad = diff(&base, &new, &["--threshold", "gpu_melted=3"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a cause"));
}

#[test]
fn bad_inputs_exit_2_naming_the_file() {
    let dir = Scratch::new("gate-bad");
    let good = recording("disk");
    // Cut short: the recorder was killed.
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.join("cut.rec");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    // A JSON report of another version.
    let json = json_report(&good, &dir, "report.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    v["version"] = 99.into();
    let old = dir.join("v99.json");
    std::fs::write(&old, v.to_string()).unwrap();
    // Of this version, but a field of the wrong type.
    v["version"] = 1.into();
    v["gpus"][0]["busy_ns"] = "a lot".into();
    let malformed = dir.join("malformed.json");
    std::fs::write(&malformed, v.to_string()).unwrap();
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let missing = dir.join("missing.rec");
    for (bad, want) in [
        (&cut, "cut short"),
        (&old, "version 99"),
        (&malformed, "does not read as one"),
        (&empty, "holds no recording"),
        (&missing, "cannot read"),
        (&recording("nccl-straggler"), "different GPUs"),
    ] {
        let out = diff(&good, bad, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", bad.display());
        let named = if want == "different GPUs" {
            err.contains("v1-disk.rec") || err.contains("v1-nccl-straggler.rec")
        } else {
            err.contains(&bad.display().to_string())
        };
        assert!(named && err.contains(want), "{}: {err}", bad.display());
    }
}

#[test]
fn check_holds_a_run_to_its_budget() {
    let dir = Scratch::new("gate-check");
    let rec = recording("dataloader-cpu");
    let budget = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let run = |budget: &Path, format: &str| {
        stallscope(&[
            "check".as_ref(),
            rec.as_os_str(),
            "--budget".as_ref(),
            budget.as_os_str(),
            "--format".as_ref(),
            format.as_ref(),
        ])
    };
    let tight = budget("tight.toml", "dataloader_cpu = \"5%\"\nlost_events = 0\n");
    let out = run(&tight, "json");
    assert_eq!(out.status.code(), Some(1));
    let v = json_of(&out);
    assert_eq!(v["failures"], 1, "{v}");
    let loose = budget("loose.toml", "dataloader_cpu = \"95%\"\nidle = \"95%\"\n");
    assert_eq!(run(&loose, "text").status.code(), Some(0));
    let md = run(&tight, "markdown");
    assert!(String::from_utf8_lossy(&md.stdout).contains("**over budget**"));
    let wrong = budget("wrong.toml", "dataloader = \"5%\"\n");
    let out = run(&wrong, "text");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("wrong.toml") && err.contains("unknown budget"),
        "{err}"
    );
}
