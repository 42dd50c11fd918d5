//! A real PyTorch job (`tests/pyjob/train.py`: a `torch.utils.data.DataLoader` with worker
//! processes feeding a loop on the simulated GPU), attached by PID. Its scenarios must be
//! labelled as stallgen's are, by its own ground truth, and each cause's flamegraph must name
//! the job's own Python function: the workers' `augment` for `dataloader_cpu`, the loop's
//! `host_preprocess` for `host_compute`. PyTorch comes from PyPI, in the virtualenv that
//! `cargo xtask test` (and `cargo xtask setup`) installs.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{path::Path, process::Command, time::Duration};

use common::{
    Scratch, serial,
    simgpu::{
        IDLE_AGREEMENT, MIN_INJECTED_IDLE, Sim, explained_share, gpu, in_doubt_allowance_ns,
        truth_idle,
    },
    spawned::Spawned,
    stallscope::{RECORD_TIMEOUT, assert_success, command, folded, parse_report},
    torch_python,
};
use serde_json::Value;

struct Run {
    report: Value,
    truth: Vec<Value>,
    /// The cause's flamegraph, as folded stacks with their weights.
    cause_stacks: Vec<(Vec<String>, u64)>,
}

fn run(scenario: &str, cause: &str) -> Run {
    run_with(scenario, cause, &[])
}

/// `run`, with more arguments for train.py.
fn run_with(scenario: &str, cause: &str, extra: &[&str]) -> Run {
    let sim = Sim::new(&format!("torch-{scenario}"));
    let dir = Scratch::new(&format!("torch-{scenario}"));
    let truth_path = dir.join("truth.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("pyjob/train.py");
    let job = Spawned::start(
        Command::new(torch_python())
            .arg(script)
            .args(["--scenario", scenario, "--secs", "10", "--truth"])
            .arg(&truth_path)
            .args(extra)
            .env("LD_LIBRARY_PATH", &sim.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state),
    );
    let ready = job
        .wait_stdout(Duration::from_secs(180), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| {
            panic!(
                "the torch job never became ready; stderr:\n{}",
                job.stderr_so_far()
            )
        });
    let pid = ready["ready pid=".len()..].trim().to_string();
    let f = Spawned::start(
        command()
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
            .args(["record", "--json", "-d", "6s", "-o"])
            .arg(dir.join("x.rec"))
            .args(["--pid", &pid, "--nvml-lib"])
            .arg(sim.libs.join("libnvidia-ml.so.1"))
            .arg("--flamegraph-dir")
            .arg(dir.join("fg")),
    )
    .finish(RECORD_TIMEOUT + Duration::from_secs(6));
    assert_success(&f, &format!("record of the torch job ({scenario})"));
    let _ = job.finish(Duration::from_secs(60));
    let truth = std::fs::read_to_string(&truth_path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    // No flamegraph when the cause was never found: the label check says so.
    let path = dir.join(&format!("fg/x.cause-{cause}.folded"));
    let cause_stacks = if path.exists() {
        folded(&path)
    } else {
        Vec::new()
    };
    Run {
        report: parse_report(&f.stdout),
        truth,
        cause_stacks,
    }
}

fn labelled(r: &Run, scenario: &str, cause: &str, function: &str) -> Result<(), String> {
    let g = gpu(&r.report);
    let expected = truth_idle(&r.truth)?;
    if expected < MIN_INJECTED_IDLE {
        return Err(format!(
            "{scenario} idled the GPU only {:.0}% by its own account: {:?}",
            expected * 100.0,
            r.truth
        ));
    }
    let idle = g["idle_ns"].as_u64().unwrap_or(0) as f64
        / g["observed_ns"].as_u64().unwrap_or(1).max(1) as f64;
    if (idle - expected).abs() > IDLE_AGREEMENT {
        return Err(format!(
            "{scenario}: stallscope saw the GPU {:.1}% idle, the job's kernel time says {:.1}%",
            idle * 100.0,
            expected * 100.0
        ));
    }
    let share = explained_share(g, cause, in_doubt_allowance_ns(&r.truth))?;
    if share < 0.9 {
        return Err(format!(
            "{scenario}: {:.1}% of the explained idle time is labelled {cause}: {}",
            share * 100.0,
            g["idle_by_cause"]
        ));
    }
    if r.report["verdict"]["cause"] != cause {
        return Err(format!("{scenario}: verdict {}", r.report["verdict"]));
    }
    let py = &r.report["python"];
    if py["processes"].as_array().is_none_or(Vec::is_empty)
        || py["warnings"].as_array().is_some_and(|w| !w.is_empty())
    {
        return Err(format!("{scenario}: python: {py}"));
    }
    let total: u64 = r.cause_stacks.iter().map(|s| s.1).sum();
    let frame = format!("{function} (train.py:");
    let named: u64 = r
        .cause_stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f.starts_with(&frame)))
        .map(|s| s.1)
        .sum();
    let named_share = named as f64 / total.max(1) as f64;
    if named_share < 0.5 {
        return Err(format!(
            "{scenario}: {function} is in {:.0}% of the {cause} flamegraph's weight ({total}), want 50%",
            named_share * 100.0
        ));
    }
    eprintln!(
        "{scenario}: {:.0}% of idle labelled {cause}; {function} in {:.0}% of its flamegraph",
        share * 100.0,
        named_share * 100.0
    );
    Ok(())
}

fn assert_labelled(scenario: &str, cause: &str, function: &str) {
    common::require_root();
    let _serial = serial();
    let r = run(scenario, cause);
    let Err(first) = labelled(&r, scenario, cause, function) else {
        return;
    };
    stallscope_tests::reruns::note(&format!("torch {scenario}"), &first);
    let r = run(scenario, cause);
    if let Err(e) = labelled(&r, scenario, cause, function) {
        panic!("{e}");
    }
}

#[test]
fn torch_dataloader_workers_name_their_function() {
    assert_labelled("dataloader-cpu", "dataloader_cpu", "augment");
}

#[test]
fn torch_loop_names_its_own_function() {
    assert_labelled("host-compute", "host_compute", "host_preprocess");
}

/// The job's steps per second untraced with `workers` DataLoader workers, from its own truth
/// line (the steps after it was ready, and the time they took).
fn untraced_rate(scenario: &str, workers: u64) -> Result<f64, String> {
    let sim = Sim::new(&format!("torch-rate-{workers}"));
    let dir = Scratch::new(&format!("torch-rate-{workers}"));
    let truth_path = dir.join("truth.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("pyjob/train.py");
    let job = Spawned::start(
        Command::new(torch_python())
            .arg(script)
            .args(["--scenario", scenario, "--secs", "8", "--truth"])
            .arg(&truth_path)
            .args(["--workers", &workers.to_string()])
            .env("LD_LIBRARY_PATH", &sim.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state),
    );
    let _ = job.finish(Duration::from_secs(240));
    let text = std::fs::read_to_string(&truth_path)
        .map_err(|e| format!("{workers} workers: no truth file: {e}"))?;
    let t: Value = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .next_back()
        .ok_or_else(|| format!("{workers} workers: an empty truth file"))?;
    let steps = t["steps"].as_f64().unwrap_or(0.0);
    let secs = (t["end_ns"].as_f64().unwrap_or(0.0) - t["start_ns"].as_f64().unwrap_or(0.0)) / 1e9;
    if steps <= 0.0 || secs <= 0.0 {
        return Err(format!("{workers} workers: no steps: {t}"));
    }
    Ok(steps / secs)
}

/// How far the speedup the advice predicts may be from the one its change gives, as a share of
/// the latter.
const ADVICE_AGREEMENT: f64 = 0.2;

/// One prescription end to end: a job starved by its one DataLoader worker gets the
/// `num_workers` that would feed the GPU on this host's free CPUs, and running it with that
/// many makes it as much faster as the advice said.
fn advised_workers_deliver() -> Result<(), String> {
    let r = run_with("dataloader-cpu", "dataloader_cpu", &["--workers", "1"]);
    let advice = r.report["advice"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["cause"] == "dataloader_cpu")
        .ok_or_else(|| format!("no dataloader_cpu advice: {}", r.report["advice"]))?;
    let workers = advice["settings"]["num_workers"]
        .as_u64()
        .ok_or_else(|| format!("the advice names no num_workers: {advice}"))?;
    if workers < 2 {
        return Err(format!("the advice keeps one worker: {advice}"));
    }
    let expected = advice["expected_speedup"].as_f64().unwrap_or(0.0);
    let one = untraced_rate("dataloader-cpu", 1)?;
    let advised = untraced_rate("dataloader-cpu", workers)?;
    let measured = advised / one;
    eprintln!(
        "advice: num_workers={workers}, {expected:.2}× predicted; measured {one:.1} → \
         {advised:.1} steps/s, {measured:.2}×"
    );
    if (measured - expected).abs() > ADVICE_AGREEMENT * measured {
        return Err(format!(
            "num_workers={workers} made the job {measured:.2}× faster ({one:.1} → {advised:.1} \
             steps/s), the advice said {expected:.2}×: {advice}"
        ));
    }
    Ok(())
}

#[test]
fn the_advised_num_workers_speeds_the_job_up_as_predicted() {
    common::require_root();
    let _serial = serial();
    let Err(first) = advised_workers_deliver() else {
        return;
    };
    stallscope_tests::reruns::note("torch advised num_workers", &first);
    if let Err(e) = advised_workers_deliver() {
        panic!("{e}");
    }
}
