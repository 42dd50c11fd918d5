//! What the feeder waited for, as causes (issue 38): `tests/pyjob/waits.py`'s jobs recorded as
//! a user would, without `--wakers`, each labelled with the cause its truth names over at
//! least 80% of the GPU's idle time, with `unknown` under 3% of GPU time:
//! - a loop whose process has a tokenizer thread holding the GIL: `gil_contention`, whose
//!   evidence names the holder thread and its Python function; the same thread asleep:
//!   healthy, no cause;
//! - a loop waiting on a lock its producer thread holds: `lock_wait`, the producer named (and
//!   the same with `--wakers`, where the producer's wake-ups say so);
//! - a server with sparse requests over TCP (in `recv`, or in `epoll_wait`): `no_work`, no
//!   verdict, the socket named with the requests per second the client sent;
//! - a host-bound server: `host_compute`.
//!
//! Needs root and the simulated GPU.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use common::waits_job::{Run, record, u};
use serde_json::Value;

/// The share of the GPU's idle time the job's cause must take.
const LABELLED: f64 = 0.8;
/// `unknown`'s most, as a share of GPU time.
const UNKNOWN_MAX: f64 = 0.03;

fn gpu(r: &Run) -> &Value {
    &r.report["gpus"][0]
}

fn lost(r: &Run, cause: &str) -> u64 {
    gpu(r)["lost_by_cause"][cause].as_u64().unwrap_or(0)
}

/// Checks the job's truth names `cause`, that it took [`LABELLED`] of the idle time, and
/// that `unknown` stayed under [`UNKNOWN_MAX`]; returns the cause's evidence.
fn labelled<'r>(r: &'r Run, cause: &str) -> &'r Value {
    assert_eq!(r.truth["cause"], cause, "the job's truth: {}", r.truth);
    let g = gpu(r);
    let idle = u(g, "idle_ns") + u(g, "waiting_ns");
    assert!(
        lost(r, cause) as f64 >= LABELLED * idle as f64,
        "{cause} took under {LABELLED} of {idle} ns idle: {}",
        g["lost_by_cause"]
    );
    no_unknown(r);
    g["causes"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["cause"] == cause))
        .map(|c| &c["evidence"])
        .unwrap_or_else(|| panic!("no evidence for {cause}: {}", g["causes"]))
}

fn no_unknown(r: &Run) {
    let g = gpu(r);
    let unknown = lost(r, "unknown") as f64 / u(g, "observed_ns") as f64;
    assert!(
        unknown < UNKNOWN_MAX,
        "unknown took {:.1}% of GPU time: {}; unknown's evidence: {}",
        unknown * 100.0,
        g["lost_by_cause"],
        g["causes"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["cause"] == "unknown"))
            .unwrap_or(&Value::Null)
    );
}

/// The holder the truth names is the evidence's first thread, and its function is in the
/// evidence's top stack.
fn names_the_holder(evidence: &Value, truth: &Value) {
    let holder = &truth["holder"];
    assert_eq!(
        evidence["threads"][0]["tid"], holder["tid"],
        "the holder {holder} leads the evidence: {}",
        evidence["threads"]
    );
    let function = holder["function"].as_str().unwrap();
    let top = &evidence["stacks"][0]["frames"];
    assert!(
        top.as_array().unwrap().iter().any(|f| f
            .as_str()
            .unwrap_or_default()
            .starts_with(&format!("{function} ("))),
        "{function} is not in the top stack {top}"
    );
}

fn verdict(r: &Run) -> &Value {
    &r.report["verdict"]["cause"]
}

#[test]
fn a_thread_holding_the_gil_is_gil_contention_and_one_asleep_is_nothing() {
    let _serial = common::serial();
    let r = record("gil-busy", &[], false);
    let evidence = labelled(&r, "gil_contention");
    names_the_holder(evidence, &r.truth);
    assert_eq!(verdict(&r), "gil_contention");
    let advice = &r.report["advice"][0];
    assert_eq!(advice["cause"], "gil_contention", "{advice}");
    let function = r.truth["holder"]["function"].as_str().unwrap();
    assert!(
        advice["change"].as_str().unwrap().contains(function),
        "{advice}"
    );

    let r = record("gil-asleep", &[], false);
    assert!(r.truth["cause"].is_null(), "{}", r.truth);
    assert_eq!(
        lost(&r, "gil_contention"),
        0,
        "{}",
        gpu(&r)["lost_by_cause"]
    );
    assert!(verdict(&r).is_null(), "{}", r.report["verdict"]);
    no_unknown(&r);
}

#[test]
fn a_lock_held_by_another_thread_is_lock_wait() {
    let _serial = common::serial();
    for wakers in [false, true] {
        let r = record("lock", &[], wakers);
        let evidence = labelled(&r, "lock_wait");
        names_the_holder(evidence, &r.truth);
        assert_eq!(verdict(&r), "lock_wait", "--wakers {wakers}");
    }
}

#[test]
fn a_server_waiting_for_requests_has_no_work_and_no_verdict() {
    let _serial = common::serial();
    for io in ["recv", "epoll"] {
        let r = record("sparse-server", &["--io", io], false);
        let evidence = labelled(&r, "no_work");
        assert!(verdict(&r).is_null(), "{io}: {}", r.report["verdict"]);
        assert!(
            r.report["verdict"]["text"]
                .as_str()
                .unwrap()
                .contains("waiting for work"),
            "{}",
            r.report["verdict"]
        );
        let outside = &evidence["outside"];
        let s = &r.truth["socket"];
        let socket = format!(
            "socket TCP {}:{} <- {}:{}",
            s["local_addr"].as_str().unwrap(),
            u(s, "local_port"),
            s["peer_addr"].as_str().unwrap(),
            u(s, "peer_port")
        );
        let on = outside["waited_on"][0].as_str().unwrap_or_default();
        assert!(on.contains(&socket), "{io}: {on} is not on {socket}");
        // The client's rate, as the job counted what it served: the recording sees a few
        // seconds of it.
        let want = r.truth["requests_per_sec"].as_f64().unwrap();
        let got = outside["requests_per_sec"].as_f64().unwrap();
        assert!(
            (got - want).abs() <= 0.25 * want,
            "{io}: {got} requests/s against the job's {want}"
        );
        let service = u(&r.truth, "service_p50_ns") as f64;
        let seen = u(outside, "service_p50_ns") as f64;
        assert!(
            (seen - service).abs() <= 0.25 * service,
            "{io}: service p50 {seen} ns against the job's {service}"
        );
        assert!(
            r.report["advice"].as_array().is_none_or(|a| a.is_empty()),
            "nothing to change on the host: {}",
            r.report["advice"]
        );
    }
}

#[test]
fn a_host_bound_server_is_host_compute() {
    let _serial = common::serial();
    let r = record("busy-server", &[], false);
    labelled(&r, "host_compute");
    assert_eq!(verdict(&r), "host_compute");
}
