//! The issue-38 jobs (`tests/pyjob/waits.py`: a feeder that waits on the GIL, on a lock, or on
//! a socket) each inject what their truth line says, checked without the profiler: each runs
//! ~3 s on the simulated GPU and its own measures must agree with its cause. A job that no
//! longer injects its cause here would let a profiler test pass or fail for the wrong reason.
//! No root needed; the simulated GPU must be built (`STALLSCOPE_BIN` locates it, as for the
//! other tests), and its absence fails these tests.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    path::Path,
    process::Command,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use common::{
    Scratch,
    simgpu::{MIN_INJECTED_IDLE, Sim, truth_idle},
    spawned::Spawned,
};
use serde_json::Value;

const SECS: &str = "3";

/// One job at a time: their steps/s are compared, and two at once would share the CPUs.
/// (`common::serial` would also demand root, which these checks do not need.)
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn python() -> String {
    std::env::var("STALLSCOPE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// What a server job's client looked like while the job ran.
struct ClientSeen {
    comm: String,
    /// The client's ancestors, nearest first, while the server ran.
    ancestors: Vec<u32>,
}

struct Run {
    truth: Value,
    pid: u32,
    client: Option<ClientSeen>,
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The comm may hold spaces and parentheses: the fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(1)?.parse().ok()
}

fn ancestors(mut pid: u32) -> Vec<u32> {
    let mut up = Vec::new();
    while let Some(p) = ppid(pid) {
        if p == 0 {
            break;
        }
        up.push(p);
        pid = p;
    }
    up
}

fn run(scenario: &str, extra: &[&str]) -> Run {
    let sim = Sim::new(&format!("waits-{scenario}"));
    let dir = Scratch::new(&format!("waits-{scenario}"));
    let truth_path = dir.join("truth.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("pyjob/waits.py");
    let job = Spawned::start(
        Command::new(python())
            .arg(script)
            .args([scenario, "--secs", SECS, "--truth"])
            .arg(&truth_path)
            .args(extra)
            .env("LD_LIBRARY_PATH", &sim.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state),
    );
    let ready = job
        .wait_stdout(Duration::from_secs(60), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| {
            panic!(
                "{scenario} never became ready; stderr:\n{}",
                job.stderr_so_far()
            )
        });
    let pid: u32 = ready["ready pid=".len()..].trim().parse().unwrap();
    let client = job
        .wait_stdout(Duration::ZERO, |l| l.starts_with("client pid="))
        .map(|l| {
            let cpid: u32 = l["client pid=".len()..]
                .split(' ')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("{scenario}: a bad client line {l:?}"));
            ClientSeen {
                comm: std::fs::read_to_string(format!("/proc/{cpid}/comm"))
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
                ancestors: ancestors(cpid),
            }
        });
    let f = job.finish(Duration::from_secs(90));
    assert!(f.status.success(), "{scenario}: {}", f.describe());
    let text = std::fs::read_to_string(&truth_path)
        .unwrap_or_else(|e| panic!("{scenario}: no truth file ({e}): {}", f.describe()));
    let truth: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{scenario}: truth {text:?}: {e}"));
    assert_eq!(truth["scenario"], scenario, "{truth}");
    assert_eq!(truth["pid"], pid, "{truth}");
    assert!(truth["steps"].as_u64().unwrap_or(0) > 0, "{truth}");
    Run { truth, pid, client }
}

fn u(t: &Value, key: &str) -> u64 {
    t[key]
        .as_u64()
        .unwrap_or_else(|| panic!("the truth has no {key}: {t}"))
}

fn wall_ns(t: &Value) -> u64 {
    u(t, "end_ns") - u(t, "start_ns")
}

/// The GPU's idle time in the job's window, by the job's own kernel count.
fn idle_ns(t: &Value) -> u64 {
    wall_ns(t).saturating_sub(u(t, "gpu_busy_ns"))
}

fn mean_step_ns(t: &Value) -> f64 {
    wall_ns(t) as f64 / u(t, "steps") as f64
}

fn injected(t: &Value) {
    let idle = truth_idle(std::slice::from_ref(t)).unwrap();
    assert!(
        idle >= MIN_INJECTED_IDLE,
        "{} idled the GPU only {:.0}% by its own account: {t}",
        t["scenario"],
        idle * 100.0
    );
}

/// The issue wants each job labelled over 80% of its idle time; a job whose own measure of
/// the wait covers less than that could not pass however right the profiler were.
const COVERED: f64 = 0.8;

#[test]
fn a_gil_holding_thread_slows_the_loop_and_a_sleeping_one_does_not() {
    let _one = one_at_a_time();
    let busy = run("gil-busy", &[]).truth;
    let asleep = run("gil-asleep", &[]).truth;
    let alone = run("gil-busy", &["--no-thread"]).truth;
    assert_eq!(busy["cause"], "gil_contention");
    assert!(asleep["cause"].is_null(), "{asleep}");
    assert_eq!(alone["thread"], false, "{alone}");
    for (t, function) in [(&busy, "tokenize"), (&asleep, "sleepy_metrics")] {
        let holder = &t["holder"];
        assert_eq!(holder["function"], function, "{t}");
        let tid = u(holder, "tid");
        assert!(tid != 0 && tid != u(t, "feeder_tid"), "{t}");
    }
    injected(&busy);
    // After each return from the driver the loop waits for the holder, which CPython asks
    // to let go only once the switch interval has passed: at least that long a step after
    // the synchronize. Half of it leaves room for a loop the host slows anyway.
    let interval = u(&busy, "switch_interval_ns") as f64;
    let (b, s, a) = (
        mean_step_ns(&busy),
        mean_step_ns(&asleep),
        mean_step_ns(&alone),
    );
    eprintln!(
        "mean step: holder busy {:.2} ms, asleep {:.2} ms, no thread {:.2} ms (switch interval {:.1} ms)",
        b / 1e6,
        s / 1e6,
        a / 1e6,
        interval / 1e6
    );
    assert!(
        b - a >= interval / 2.0,
        "a busy GIL holder cost the loop {:.2} ms a step, want at least half the {:.1} ms \
         switch interval: {busy} against {alone}",
        (b - a) / 1e6,
        interval / 1e6
    );
    assert!(
        s - a < interval / 2.0,
        "a sleeping helper cost the loop {:.2} ms a step, as much as a GIL holder: {asleep} \
         against {alone}",
        (s - a) / 1e6
    );
    let idle = truth_idle(std::slice::from_ref(&asleep)).unwrap();
    assert!(
        idle < MIN_INJECTED_IDLE,
        "the healthy job idled the GPU {:.0}%: {asleep}",
        idle * 100.0
    );
}

#[test]
fn the_lock_job_waits_on_its_producer() {
    let _one = one_at_a_time();
    let t = run("lock", &[]).truth;
    assert_eq!(t["cause"], "lock_wait");
    injected(&t);
    let holder = &t["holder"];
    assert_eq!(holder["function"], "prepare_batch", "{t}");
    assert_ne!(u(holder, "tid"), u(&t, "feeder_tid"), "{t}");
    let waited = u(&t, "lock_wait_ns") as f64;
    assert!(
        waited >= COVERED * idle_ns(&t) as f64,
        "the loop waited on the lock {:.0} ms of the GPU's {:.0} ms idle: {t}",
        waited / 1e6,
        idle_ns(&t) as f64 / 1e6
    );
}

/// A server job's common checks: the client was outside the job and the socket is named.
fn served(r: &Run) -> &Value {
    let t = &r.truth;
    let client = r.client.as_ref().expect("a server prints its client's PID");
    assert_eq!(client.comm, t["client"]["comm"], "{t}");
    assert!(
        !client.ancestors.contains(&r.pid),
        "the client (ancestors {:?}) descends from the server {}: a profiler would trace it",
        client.ancestors,
        r.pid
    );
    let s = &t["socket"];
    assert_eq!(s["protocol"], "tcp", "{t}");
    assert_eq!(s["local_addr"], "127.0.0.1", "{t}");
    assert!(u(s, "local_port") > 0 && u(s, "peer_port") > 0, "{t}");
    assert_eq!(u(t, "requests"), u(t, "steps"), "{t}");
    t
}

fn sparse(io: &str) {
    let _one = one_at_a_time();
    let r = run("sparse-server", &["--io", io]);
    let t = served(&r);
    assert_eq!(t["cause"], "no_work");
    assert_eq!(t["io"], io);
    injected(t);
    let gap = t["gap_ms"].as_array().expect("gap_ms");
    let (lo, hi) = (gap[0].as_f64().unwrap(), gap[1].as_f64().unwrap());
    // The client sends on a schedule of uniform gaps: the window holds about wall / mean gap
    // requests. Its count varies by well under one request a second; 10% and 2 more cover it
    // and a schedule the loaded host delays a little.
    let expected = wall_ns(t) as f64 / 1e6 / ((lo + hi) / 2.0);
    let got = u(t, "requests") as f64;
    assert!(
        (got - expected).abs() <= 2.0 + 0.1 * expected,
        "served {got} requests, the client's gaps make {expected:.1}: {t}"
    );
    let waited = u(t, "wait_ns") as f64;
    assert!(
        waited >= COVERED * idle_ns(t) as f64,
        "the server waited for requests {:.0} ms of the GPU's {:.0} ms idle: {t}",
        waited / 1e6,
        idle_ns(t) as f64 / 1e6
    );
    // No request waits for another: each takes its kernel and a little host work, and the
    // next comes only after the shortest gap.
    let latency = u(t, "latency_p50_ns");
    assert!(
        latency >= u(t, "kernel_ns") && (latency as f64) < lo * 1e6,
        "p50 latency {latency} ns: {t}"
    );
}

#[test]
fn the_sparse_server_waits_for_requests_in_recv() {
    sparse("recv");
}

#[test]
fn the_sparse_server_waits_for_requests_in_epoll() {
    sparse("epoll");
}

#[test]
fn the_busy_server_never_waits_for_work() {
    let _one = one_at_a_time();
    let r = run("busy-server", &[]);
    let t = served(&r);
    assert_eq!(t["cause"], "host_compute");
    injected(t);
    let idle = idle_ns(t) as f64;
    let (host, waited) = (u(t, "host_ns") as f64, u(t, "wait_ns") as f64);
    assert!(
        host >= COVERED * idle && waited <= (1.0 - COVERED) * idle,
        "of the GPU's {:.0} ms idle, the server worked {:.0} ms and waited for requests \
         {:.0} ms: {t}",
        idle / 1e6,
        host / 1e6,
        waited / 1e6
    );
    // With two requests outstanding, each waits in the socket for the one ahead of it: its
    // latency is about two services, well past one and a half.
    let (latency, service) = (u(t, "latency_p50_ns"), u(t, "service_p50_ns"));
    assert!(
        latency as f64 >= 1.5 * service as f64,
        "p50 latency {latency} ns against a p50 service of {service} ns: nothing queued: {t}"
    );
}
