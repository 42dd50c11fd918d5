//! The analysis model over the fixture: thread accounting, scaling, timeline and JSON contract.
mod common;

use common::{MS, START_NS, counters, fixture};
use profiler_core::recording::record::{EndReason, Record};
use profiler_core::report::json as report_json;
use profiler_core::{LoadInfo, analyze};

#[test]
fn threads_processes_and_end() {
    let a = analyze(fixture()).analysis;
    assert_eq!(a.duration_ns, 350 * MS);
    assert!(a.ended);
    assert_eq!(a.end_reason, Some(EndReason::TargetExited));
    assert_eq!(
        a.threads.keys().copied().collect::<Vec<_>>(),
        [100, 101, 200]
    );
    let loader = &a.threads[&101];
    assert!(loader.exited);
    assert_eq!(loader.counters, counters(101, 100, [25, 5, 130, 90], 400));
    let main = &a.threads[&100];
    assert!(!main.exited);
    assert_eq!(main.counters, counters(100, 100, [190, 15, 20, 75], 0));
    assert_eq!(loader.block_io.count, 3);
    assert_eq!(loader.block_io.read_bytes, 384 * 1024);
    assert_eq!(loader.block_io.write_bytes, 4096);
    assert_eq!(loader.block_io.p50_ns, Some(1_500_000));
    assert_eq!(loader.block_io.p99_ns, Some(3_000_000));

    assert_eq!(a.processes.len(), 2);
    assert_eq!(a.processes[&100].threads, [100, 101]);
    assert_eq!(a.processes[&100].comm, "python");
    assert_eq!(a.processes[&200].ppid, Some(100));
    assert_eq!(a.lost_events, 20);
    assert_eq!(a.attempted_events, 10_050);
    assert_eq!(a.unavailable.len(), 1);
    let files = a.top_page_cache_files(5);
    assert_eq!(files[0].path.as_deref(), Some("/data/train.bin"));
    assert_eq!(files[0].pages, 405);
    assert_eq!(files[1].display_name(), "dev 8:1 ino 1234");
}

#[test]
fn off_cpu_samples_scale_to_measured_time() {
    let a = analyze(fixture()).analysis;
    for tid in [100, 101] {
        let t = &a.threads[&tid];
        let measured = t.counters.io_wait_ns + t.counters.blocked_ns;
        let entries: Vec<_> = a.off_cpu.iter().filter(|e| e.tid == tid).collect();
        let scaled: u64 = entries.iter().map(|e| e.scaled_ns).sum();
        assert_eq!(scaled, measured, "thread {tid}");
        for e in entries {
            assert!(e.scaled_ns >= e.sampled_ns);
        }
    }
    // Thread 200 captured more than its counters measured: left as captured.
    let worker: Vec<_> = a.off_cpu.iter().filter(|e| e.tid == 200).collect();
    assert_eq!(worker.len(), 1);
    assert_eq!(worker[0].scaled_ns, 100 * MS);
    assert_eq!(worker[0].sampled_ns, 100 * MS);
}

#[test]
fn timeline_deltas_add_up_to_final_counters() {
    let a = analyze(fixture()).analysis;
    let spans: Vec<(u64, u64)> = a
        .timeline
        .iter()
        .map(|s| (s.start_ns - START_NS, s.end_ns - START_NS))
        .collect();
    assert_eq!(
        spans,
        [
            (0, 100 * MS),
            (100 * MS, 200 * MS),
            (200 * MS, 300 * MS),
            (300 * MS, 350 * MS)
        ]
    );
    // Thread 200 appears mid-recording: absent from the first slice.
    assert!(a.timeline[0].threads.iter().all(|d| d.tid != 200));
    for t in a.threads.values() {
        let sum: u64 = a
            .timeline
            .iter()
            .flat_map(|s| &s.threads)
            .filter(|d| d.tid == t.tid)
            .map(|d| d.on_cpu_ns + d.runqueue_ns + d.io_wait_ns + d.blocked_ns)
            .sum();
        assert_eq!(sum, t.counters.lifetime_ns(), "thread {}", t.tid);
    }
}

#[test]
fn without_meta_or_end_duration_runs_to_the_last_event() {
    let records: Vec<Record> = fixture()
        .into_iter()
        .filter(|r| !matches!(r, Record::Meta(_) | Record::End { .. }))
        .collect();
    let done = analyze(records).analyzed(LoadInfo::default());
    let a = &done.analysis;
    assert!(!a.ended);
    assert_eq!(a.start_ns, START_NS);
    assert_eq!(a.duration_ns, 340 * MS);
    assert!(a.meta.is_none());
    let json = report_json::to_json_value(&done.report());
    assert!(json["target"]["pid"].is_null());
}

#[test]
fn json_has_the_required_keys_and_each_thread_partitions_its_lifetime() {
    let done = analyze(fixture()).analyzed(LoadInfo::default());
    let json = report_json::to_json_value(&done.report());
    assert_eq!(json["version"], 1);
    assert_eq!(json["target"]["pid"], 100);
    assert_eq!(json["target"]["pids"], serde_json::json!([100]));
    assert_eq!(json["target"]["command"][1], "train.py");
    assert_eq!(json["duration_ns"], 350 * MS);
    assert_eq!(json["lost_events"], 20);
    let threads = json["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 3);
    let mut keys = Vec::new();
    for t in threads {
        for key in [
            "tid",
            "pid",
            "comm",
            "on_cpu_ns",
            "runqueue_ns",
            "io_wait_ns",
            "blocked_ns",
            "page_cache_misses",
            "read_bytes",
        ] {
            assert!(t.get(key).is_some(), "thread lacks {key}: {t}");
        }
        let four: u64 = ["on_cpu_ns", "runqueue_ns", "io_wait_ns", "blocked_ns"]
            .iter()
            .map(|k| t[*k].as_u64().unwrap())
            .sum();
        assert_eq!(four, t["lifetime_ns"].as_u64().unwrap());
        keys.push((t["pid"].as_u64().unwrap(), t["tid"].as_u64().unwrap()));
    }
    assert_eq!(keys, [(100, 100), (100, 101), (200, 200)]);
    assert_eq!(threads[1]["read_bytes"], 384 * 1024);
    assert_eq!(threads[1]["page_cache_misses"], 400);
    assert_eq!(json["events"]["sched"]["dropped"], 10);
}

/// An off-CPU sample of thread 100, not in IO.
fn blocked_sample(ts_ns: u64, duration_ns: u64) -> Record {
    Record::OffCpuSample {
        ts_ns,
        tid: 100,
        pid: 100,
        duration_ns,
        io: false,
        stack: 1,
    }
}

/// The JSON report of `a`, with no attribution.
fn report_of(a: &profiler_core::analysis::model::Analysis) -> serde_json::Value {
    let load = LoadInfo::default();
    let report = profiler_core::Report::new(a, None, &load);
    serde_json::to_value(report_json::JsonReport::new(&report)).unwrap()
}

fn thread_of(json: &serde_json::Value, tid: u32) -> &serde_json::Value {
    json["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == tid)
        .unwrap()
}

/// Who ended each wait comes with the off-CPU sample of the same time after it: a traced
/// thread, a task outside the job, a timer; a waker of another time belongs to no sample.
#[test]
fn each_wait_says_who_ended_it_a_traced_thread_a_task_outside_or_a_timer() {
    let mut records = fixture();
    let blocked = |ts_ns: u64, call: &str| Record::BlockedIn {
        ts_ns,
        tid: 100,
        call: call.into(),
        detail: "0x7f00".into(),
    };
    let woken = |ts_ns: u64, waker_tid: u32, comm: &str, context: &str| Record::WokenBy {
        ts_ns,
        tid: 100,
        waker_tid,
        waker_pid: if waker_tid == 101 { 100 } else { waker_tid },
        waker_comm: comm.into(),
        context: context.into(),
    };
    let at = START_NS + 10 * MS;
    records.extend([
        blocked(at, "futex"),
        woken(at, 101, "worker", "task"),
        blocked_sample(at, 30 * MS),
        blocked(at + 40 * MS, "futex"),
        woken(at + 40 * MS, 999, "curl", "task"),
        blocked_sample(at + 40 * MS, 10 * MS),
        blocked(at + 60 * MS, "futex"),
        woken(at + 60 * MS, 0, "swapper/1", "timer"),
        blocked_sample(at + 60 * MS, 5 * MS),
        blocked(at + 70 * MS, "futex"),
        woken(at + 70 * MS, 0, "swapper/0", "network receive"),
        blocked_sample(at + 70 * MS, 2 * MS),
        // A timer that interrupted another task is the same timer.
        blocked(at + 75 * MS, "futex"),
        woken(at + 75 * MS, 999, "curl", "timer"),
        blocked_sample(at + 75 * MS, MS),
        blocked(at + 80 * MS, "nanosleep"),
        woken(at + 79 * MS, 101, "worker", "task"),
        blocked_sample(at + 80 * MS, 7 * MS),
    ]);
    let a = analyze(records).analysis;
    let on = &a.threads[&100].blocked_on;
    assert_eq!((on[0].call.as_str(), on[0].ns), ("futex", 48 * MS));
    let wakers: Vec<_> = on[0]
        .wakers
        .iter()
        .map(|w| (w.kind, w.who.as_str(), w.ns))
        .collect();
    assert_eq!(
        wakers,
        [
            ("thread", "TID 101 (worker)", 30 * MS),
            ("process", "PID 999 (curl)", 10 * MS),
            ("timer", "timer", 6 * MS),
            ("interrupt", "network receive", 2 * MS),
        ]
    );
    assert!(on[1].wakers.is_empty(), "{:?}", on[1]);
    let json = report_of(&a);
    let t = thread_of(&json, 100);
    assert_eq!(t["blocked_on"][0]["wakers"][0]["kind"], "thread");
    assert_eq!(t["blocked_on"][0]["wakers"][0]["tid"], 101);
    assert_eq!(t["blocked_on"][0]["wakers"][1]["who"], "PID 999 (curl)");
    assert!(t["blocked_on"][1].get("wakers").is_none(), "{t}");
}

/// What a thread blocked in comes with the off-CPU sample of the same time after it, and only
/// then: a `BlockedIn` whose sample never came (the recording cut) counts nothing.
#[test]
fn each_thread_says_what_it_blocked_in_the_most_time_first() {
    let mut records = fixture();
    let blocked = |ts_ns: u64, call: &str, detail: &str| Record::BlockedIn {
        ts_ns,
        tid: 100,
        call: call.into(),
        detail: detail.into(),
    };
    let socket = "socket TCP 127.0.0.1:5000 <- 127.0.0.1:40412";
    let at = START_NS + 10 * MS;
    records.extend([
        blocked(at, "recvfrom", socket),
        blocked_sample(at, 30 * MS),
        blocked(at + 40 * MS, "futex", "0x7f00"),
        blocked_sample(at + 40 * MS, 5 * MS),
        blocked(at + 50 * MS, "recvfrom", socket),
        blocked_sample(at + 50 * MS, 20 * MS),
        // A sample of another time: not this call's.
        blocked(at + 80 * MS, "nanosleep", ""),
        blocked_sample(at + 81 * MS, 7 * MS),
    ]);
    let a = analyze(records).analysis;
    let on: Vec<_> = a.threads[&100]
        .blocked_on
        .iter()
        .map(|b| (b.kind, b.call.as_str(), b.detail.as_str(), b.ns))
        .collect();
    assert_eq!(
        on,
        [
            ("socket", "recvfrom", socket, 50 * MS),
            ("futex", "futex", "0x7f00", 5 * MS)
        ]
    );
    let json = report_of(&a);
    let t = thread_of(&json, 100);
    assert_eq!(t["blocked_on"][0]["kind"], "socket");
    assert_eq!(t["blocked_on"][0]["detail"], socket);
    assert_eq!(t["blocked_on"][0]["ns"], 50 * MS);
    // A thread that never said has no key at all.
    assert!(thread_of(&json, 101).get("blocked_on").is_none());
}

/// What each sampled wait of a main thread was for, as the fold keeps it for the rules: the
/// GIL by its stack whoever woke it, a socket's request from outside, a lock by its frames,
/// a lock released by another thread of the job, a wait inside a CUDA call the GPU's.
#[test]
fn each_sampled_wait_of_a_main_thread_keeps_what_it_waited_for() {
    use profiler_core::analysis::wait_for::WaitFor;
    let mut records = fixture();
    let stack = |id: u32, frames: &[&str]| Record::Stack {
        id,
        frames: frames.iter().map(|f| f.to_string()).collect(),
    };
    let sample = |ts_ns: u64, stack: u32| Record::OffCpuSample {
        ts_ns,
        tid: 100,
        pid: 100,
        duration_ns: 5 * MS,
        io: false,
        stack,
    };
    let blocked = |ts_ns: u64, call: &str, detail: &str| Record::BlockedIn {
        ts_ns,
        tid: 100,
        call: call.into(),
        detail: detail.into(),
    };
    let woken = |ts_ns: u64, waker_tid: u32, context: &str| Record::WokenBy {
        ts_ns,
        tid: 100,
        waker_tid,
        waker_pid: waker_tid,
        waker_comm: "x".into(),
        context: context.into(),
    };
    let at = |i: u64| START_NS + (10 + 10 * i) * MS;
    records.extend([
        stack(
            50,
            &[
                "main",
                "PyEval_RestoreThread",
                "take_gil",
                "pthread_cond_timedwait",
            ],
        ),
        stack(51, &["main", "serve_one (srv.py:9)", "__libc_recv"]),
        stack(52, &["main", "lock_PyThread_acquire_lock", "sem_clockwait"]),
        stack(53, &["main", "cuCtxSynchronize", "pthread_cond_wait"]),
        blocked(at(0), "futex", "0x7f00"),
        woken(at(0), 999, "task"),
        sample(at(0), 50),
        blocked(
            at(1),
            "recvfrom",
            "socket TCP 127.0.0.1:5000 <- 127.0.0.1:40412",
        ),
        sample(at(1), 51),
        blocked(at(2), "futex", "0x7f10"),
        sample(at(2), 52),
        blocked(at(3), "futex", "0x7f10"),
        woken(at(3), 101, "task"),
        sample(at(3), 51),
        sample(at(4), 53),
        blocked(at(5), "read", "pipe:[9] with PID 4242 (feeder)"),
        sample(at(5), 51),
    ]);
    let a = analyze(records).analysis;
    let waits: Vec<WaitFor> = (0..6)
        .map(|i| {
            let w: Vec<_> = a
                .callers_off_cpu
                .waits_inside(100, at(i), at(i) + MS)
                .collect();
            assert_eq!(w.len(), 1, "wait {i}: {w:?}");
            w[0].0
        })
        .collect();
    assert_eq!(
        waits,
        [
            WaitFor::Gil,
            WaitFor::Outside,
            WaitFor::Lock,
            WaitFor::JobThread {
                tid: 101,
                lock: true
            },
            WaitFor::InCuda,
            WaitFor::Outside,
        ]
    );
}

/// Samples and stack copies the kernel chose not to send while the reader was behind are
/// counted under their `*_thinned` kinds, apart from the losses: nothing attempted, nothing
/// lost, and the text report says what was thinned, and what each real loss weakens.
#[test]
fn thinned_records_are_counted_apart_from_losses() {
    use profiler_core::recording::record::EventLoss;
    let mut records = fixture();
    let at = records
        .iter()
        .position(|r| matches!(r, Record::Loss(_)))
        .unwrap();
    for (kind, n) in [("user_stack_thinned", 700), ("offcpu_sample_thinned", 40)] {
        records.insert(
            at,
            Record::Loss(EventLoss {
                kind: kind.into(),
                attempted: n,
                dropped: 0,
                received: 0,
            }),
        );
    }
    records.insert(
        at,
        Record::Loss(EventLoss {
            kind: "block_io".into(),
            attempted: 10,
            dropped: 2,
            received: 8,
        }),
    );
    let analyzed = analyze(records);
    let a = analyzed.analysis.clone();
    assert_eq!(a.lost_events, 22);
    assert_eq!(a.attempted_events, 10_060);
    assert_eq!(a.events["user_stack_thinned"].thinned, 700);
    assert_eq!(a.events["user_stack_thinned"].lost, 0);
    assert_eq!(a.events["offcpu_sample_thinned"].thinned, 40);
    assert_eq!(a.events["sched"].thinned, 0);
    let text =
        profiler_core::report::text::to_text(&analyzed.analyzed(LoadInfo::default()).report());
    assert!(
        text.contains("thinned while the reader was behind")
            && text.contains("700 user stack thinned")
            && text.contains("40 offcpu sample thinned")
            && text.contains("lost 2 block io: weakens disk"),
        "{text}"
    );
    let plain = profiler_core::report::text::to_text(
        &analyze(fixture()).analyzed(LoadInfo::default()).report(),
    );
    assert!(!plain.contains("thinned"), "{plain}");
}
