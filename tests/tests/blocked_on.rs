//! What a blocked thread waits in (issue 38, part 1): `record` reads the system call each
//! sampled off-CPU interval blocked in, and what its file descriptor is, into each thread's
//! `blocked_on[]`. Checked on `tests/pyjob/waits.py`'s jobs against what each job says it
//! does: the sparse server's loop waits for requests in `recv` (or `epoll_wait`) on the socket
//! its truth names, the lock job's loop on a futex, the sleeping helper in a sleep. And who
//! ended those waits (`wakers[]`, from `sched_waking`, with `record --wakers`; none without
//! it): the producer thread that held the lock, the client outside the job (or the network
//! receive it ran), a timer. Needs root and the simulated GPU.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{path::Path, process::Command, time::Duration};

use common::{
    Scratch,
    simgpu::Sim,
    spawned::Spawned,
    stallscope::{RECORD_TIMEOUT, assert_success, command, parse_report, thread},
};
use serde_json::Value;

/// The share of a thread's sampled off-CPU time its top wait must hold: each job's loop waits
/// in one place but for a few samples (a page fault, the simulated driver's own futex).
const TOP_SHARE: f64 = 0.8;

struct Run {
    report: Value,
    truth: Value,
}

fn python() -> String {
    std::env::var("STALLSCOPE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Runs `scenario` long enough to record it for 5 s once ready, records it, and waits for
/// its truth.
fn record(scenario: &str, extra: &[&str], wakers: bool) -> Run {
    let sim = Sim::new(&format!("blocked-{scenario}"));
    let dir = Scratch::new(&format!("blocked-{scenario}"));
    let truth_path = dir.join("truth.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("pyjob/waits.py");
    let job = Spawned::start(
        Command::new(python())
            .arg(script)
            .args([scenario, "--secs", "15", "--truth"])
            .arg(&truth_path)
            .args(extra)
            .env("LD_LIBRARY_PATH", &sim.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state),
    );
    let ready = job
        .wait_stdout(Duration::from_secs(60), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| panic!("{scenario} never became ready: {}", job.stderr_so_far()));
    let pid = ready["ready pid=".len()..].trim().to_string();
    let f = Spawned::start(
        command()
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
            .args(["record", "--json", "--no-flamegraphs", "-d", "5s"])
            .args(wakers.then_some("--wakers"))
            .arg("-o")
            .arg(dir.join("x.rec"))
            .args(["--pid", &pid, "--nvml-lib"])
            .arg(sim.libs.join("libnvidia-ml.so.1")),
    )
    .finish(RECORD_TIMEOUT + Duration::from_secs(5));
    assert_success(&f, &format!("record of {scenario}"));
    let done = job.finish(Duration::from_secs(90));
    assert!(done.status.success(), "{scenario}: {}", done.describe());
    let text = std::fs::read_to_string(&truth_path)
        .unwrap_or_else(|e| panic!("{scenario}: no truth ({e}): {}", done.describe()));
    Run {
        report: parse_report(&f.stdout),
        truth: serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{scenario}: truth {text:?}: {e}")),
    }
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// The thread's top wait, checked to hold [`TOP_SHARE`] of its sampled off-CPU time.
fn top_wait(r: &Run, tid: u64) -> &Value {
    let t = thread(&r.report, tid as u32);
    let waits = t["blocked_on"]
        .as_array()
        .unwrap_or_else(|| panic!("thread {tid} has no blocked_on: {t}"));
    let all: u64 = waits.iter().map(|w| u(w, "ns")).sum();
    let top = &waits[0];
    assert!(
        u(top, "ns") as f64 >= TOP_SHARE * all as f64,
        "thread {tid}'s top wait holds under {TOP_SHARE} of its blocked time: {waits:?}"
    );
    top
}

/// The wait's top waker, checked to have ended [`TOP_SHARE`] of the wait's sampled time.
fn top_waker(wait: &Value) -> &Value {
    let wakers = wait["wakers"]
        .as_array()
        .unwrap_or_else(|| panic!("no wakers for {wait}"));
    let top = &wakers[0];
    assert!(
        u(top, "ns") as f64 >= TOP_SHARE * u(wait, "ns") as f64,
        "the top waker ended under {TOP_SHARE} of the wait: {wait}"
    );
    top
}

fn sparse(io: &str, kind: &str, calls: &[&str], wakers: bool) {
    let _serial = common::serial();
    let r = record("sparse-server", &["--io", io], wakers);
    let top = top_wait(&r, u(&r.truth, "feeder_tid"));
    assert_eq!(top["kind"], kind, "{top}");
    let call = top["call"].as_str().unwrap_or_default();
    assert!(
        calls.contains(&call),
        "{call} is not one of {calls:?}: {top}"
    );
    if kind == "socket" {
        // The loop waits on the connection its truth names: its port, and the client's.
        let s = &r.truth["socket"];
        let detail = top["detail"].as_str().unwrap_or_default();
        let want = format!(
            "socket TCP {}:{} <- {}:{}",
            s["local_addr"].as_str().unwrap(),
            u(s, "local_port"),
            s["peer_addr"].as_str().unwrap(),
            u(s, "peer_port")
        );
        assert_eq!(detail, want, "{top}");
    }
    if !wakers {
        assert!(top.get("wakers").is_none(), "no --wakers, no wakers: {top}");
        return;
    }
    // Woken by the client, outside the job: by its own call, or by the network receive its
    // send ran (loopback delivers in the sender's system call).
    let waker = top_waker(top);
    let client = u(&r.truth["client"], "pid");
    assert_ne!(waker["kind"], "thread", "the client is not traced: {waker}");
    assert!(
        u(waker, "pid") == client || waker["who"] == "network receive",
        "woken by the client (PID {client}) or a network receive: {waker}"
    );
}

#[test]
fn a_server_waiting_for_requests_is_blocked_on_its_socket() {
    sparse("recv", "socket", &["recvfrom", "recvmsg", "read"], true);
}

#[test]
fn a_server_waiting_in_epoll_is_blocked_in_poll() {
    sparse(
        "epoll",
        "poll",
        &["epoll_wait", "epoll_pwait", "epoll_pwait2"],
        false,
    );
}

#[test]
fn a_loop_waiting_for_a_lock_and_a_sleeping_thread_say_so() {
    let _serial = common::serial();
    let r = record("lock", &[], true);
    let top = top_wait(&r, u(&r.truth, "feeder_tid"));
    assert_eq!(top["kind"], "futex", "{top}");
    assert_eq!(top["call"], "futex", "{top}");
    // The producer, which held the lock, released it and so ended each wait.
    let waker = top_waker(top);
    let producer = u(&r.truth["holder"], "tid");
    assert_eq!(waker["kind"], "thread", "{waker}");
    assert_eq!(u(waker, "tid"), producer, "{waker}");
    let r = record("gil-asleep", &[], true);
    let holder = u(&r.truth["holder"], "tid");
    let top = top_wait(&r, holder);
    assert_eq!(top["kind"], "sleep", "thread {holder}: {top}");
    assert_eq!(top_waker(top)["kind"], "timer", "thread {holder}: {top}");
}
