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

use common::{
    stallscope::thread,
    waits_job::{Run, record, u},
};
use serde_json::Value;

/// The share of a thread's sampled off-CPU time its top wait must hold: each job's loop waits
/// in one place but for a few samples (a page fault, the simulated driver's own futex).
const TOP_SHARE: f64 = 0.8;

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
