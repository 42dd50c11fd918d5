//! The GPU half of the reports, from recordings stallscope made of stallgen's scenarios on the
//! simulated GPU (`tests/recordings/gpu/v1-<scenario>.rec`, made by
//! `scripts/record-gpu-goldens.sh`): golden text and JSON reports for each, and the labels
//! each scenario must get. No root, no timing: the recordings are fixed.
//! Regenerate the reports with `STALLSCOPE_BLESS=1 cargo test -p profiler-core --test gpu_goldens`.
mod common;

use std::path::PathBuf;

use common::assert_golden;
use profiler_core::attribution::Cause;
use profiler_core::report::{json::to_json_value, text::to_text};
use profiler_core::{Analyzed, load_reader};

/// Each recording, and the cause stallgen's scenario injects (for the ranked ones, the slow
/// rank's own cause). `nccl-straggler` was recorded with the simulated NCCL's waits idle and
/// no GPM (two ranks); `nccl-straggler-ddp` and `gpu-straggler` with DDP-form steps, waits
/// busy as on hardware, and GPM (four ranks).
const SCENARIOS: [(&str, Cause); 10] = [
    ("dataloader-cpu", Cause::DataloaderCpu),
    ("disk", Cause::Disk),
    ("cpu-contention", Cause::CpuContention),
    ("host-compute", Cause::HostCompute),
    ("pageable-copy", Cause::PinnedMemoryCopy),
    ("pcie-degraded", Cause::Pcie),
    ("launch-bound", Cause::LaunchOverhead),
    ("nccl-straggler", Cause::Disk),
    ("nccl-straggler-ddp", Cause::Disk),
    ("gpu-straggler", Cause::GpuThrottled),
];

/// Recordings of several ranks, checked by their own tests.
fn ranked(scenario: &str) -> bool {
    scenario.contains("straggler")
}

fn path(scenario: &str) -> PathBuf {
    common::gpu_recording(scenario)
}

fn analyzed(scenario: &str) -> Analyzed {
    let p = path(scenario);
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let (folded, load) = load_reader(&bytes[..]).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert!(
        load.truncated.is_none(),
        "{}: {:?}",
        p.display(),
        load.truncated
    );
    folded.analyzed(load)
}

#[test]
fn golden_reports() {
    for (scenario, _) in SCENARIOS {
        let a = analyzed(scenario);
        let report = a.report();
        assert_golden(&format!("gpu/{scenario}.txt"), &to_text(&report));
        let json = serde_json::to_string_pretty(&to_json_value(&report)).unwrap() + "\n";
        assert_golden(&format!("gpu/{scenario}.json"), &json);
    }
}

#[test]
fn every_scenario_gets_its_cause() {
    for (scenario, cause) in SCENARIOS {
        if ranked(scenario) {
            continue;
        }
        let a = analyzed(scenario);
        let attr = a
            .attribution
            .as_ref()
            .expect("a GPU recording is attributed");
        assert_eq!(attr.gpus.len(), 1, "{scenario}");
        let g = &attr.gpus[0];
        let idle_of = |c: Cause| g.idle_by_cause.get(&c).copied().unwrap_or(0);
        // Most of the idle time carries the injected cause, and the verdict names it.
        assert!(
            idle_of(cause) as f64 >= 0.6 * g.idle_ns as f64,
            "{scenario}: {} of {} ns idle is {}: {:?}",
            idle_of(cause),
            g.idle_ns,
            cause.name(),
            g.idle_by_cause
        );
        assert_eq!(
            attr.verdict.cause,
            Some(cause),
            "{scenario}: {}",
            attr.verdict.text
        );
        // The cause has its evidence, with what its registry entry says it shows.
        let ev = g
            .causes
            .iter()
            .find(|c| c.cause == cause)
            .unwrap_or_else(|| panic!("{scenario}: no evidence for {}", cause.name()));
        assert!(
            !ev.evidence.threads.is_empty(),
            "{scenario}: no threads: {ev:?}"
        );
        match cause.spec().cuda {
            profiler_core::attribution::CudaEvidenceKind::None => {
                assert!(ev.evidence.cuda.is_none(), "{scenario}")
            }
            profiler_core::attribution::CudaEvidenceKind::Launches => {
                let cuda = ev.evidence.cuda.as_ref().expect("launch evidence");
                assert!(
                    cuda.launches_per_sec.unwrap_or(0.0) > 0.0,
                    "{scenario}: {cuda:?}"
                );
            }
            _ => {
                let cuda = ev.evidence.cuda.as_ref().expect("CUDA evidence");
                assert!(!cuda.calls.is_empty(), "{scenario}: {cuda:?}");
            }
        }
    }
}

#[test]
fn the_two_ranks_name_the_straggler_and_its_own_cause() {
    let a = analyzed("nccl-straggler");
    let report = a.report();
    let ranks = &report.ranks;
    assert_eq!(ranks.ranks.len(), 2, "{ranks:?}");
    let straggler = ranks.straggler.as_ref().expect("a straggler");
    assert_eq!(straggler.own_cause, Some(Cause::Disk), "{}", straggler.text);
    let other = ranks
        .ranks
        .iter()
        .find(|r| r.pid != straggler.pid)
        .expect("the other rank");
    assert!(
        other.nccl_wait_share
            > 2.0
                * ranks
                    .ranks
                    .iter()
                    .find(|r| r.pid == straggler.pid)
                    .unwrap()
                    .nccl_wait_share,
        "{ranks:?}"
    );
}

/// The DDP-form straggler with waits busy to NVML: every waiting rank's GPU reads busy, yet
/// most of its time is waiting, told by GPM, and labelled `nccl_wait`; the straggler is named
/// with its own cause; the throttled one with `gpu_throttled`.
#[test]
fn ranks_waiting_busy_to_nvml_are_found_by_gpm() {
    for (scenario, cause) in [
        ("nccl-straggler-ddp", Cause::Disk),
        ("gpu-straggler", Cause::GpuThrottled),
    ] {
        let a = analyzed(scenario);
        let report = a.report();
        let straggler = report.ranks.straggler.as_ref().expect("a straggler");
        assert_eq!(straggler.own_cause, Some(cause), "{}", straggler.text);
        let attr = a.attribution.as_ref().expect("attributed");
        assert_eq!(attr.gpus.len(), 4, "{scenario}");
        assert_eq!(attr.verdict.cause, Some(Cause::NcclWait), "{scenario}");
        let slow_gpu = report
            .ranks
            .ranks
            .iter()
            .find(|r| r.pid == straggler.pid)
            .and_then(|r| r.gpu);
        for g in attr.gpus.iter().filter(|g| Some(g.gpu) != slow_gpu) {
            let w = g.waiting.as_ref().expect("waiting judged");
            assert_eq!(
                w.signal,
                profiler_core::attribution::WaitingSignal::Gpm,
                "{scenario}"
            );
            assert!(
                g.busy_ns as f64 >= 0.9 * g.observed_ns as f64,
                "{scenario} GPU {}: {} of {} busy",
                g.gpu,
                g.busy_ns,
                g.observed_ns
            );
            assert!(
                g.waiting_ns as f64 >= 0.5 * g.observed_ns as f64,
                "{scenario} GPU {}: waited {} of {}",
                g.gpu,
                g.waiting_ns,
                g.observed_ns
            );
            let lost = g.waiting_ns + g.idle_ns;
            let nccl = g.lost_by_cause.get(&Cause::NcclWait).copied().unwrap_or(0);
            assert!(
                nccl as f64 >= 0.8 * lost as f64,
                "{scenario} GPU {}: {:?}",
                g.gpu,
                g.lost_by_cause
            );
        }
        // The slow rank queues every matched collective last. When its host is slow, by about
        // what the others wait; when its GPU is, only by its GPU work after the last
        // collective of a step (the optimizer kernel, three times slower): a small part of it.
        let arrivals = &report.ranks.arrivals[0];
        let slow = report
            .ranks
            .ranks
            .iter()
            .find(|r| r.pid == straggler.pid)
            .unwrap();
        assert!(
            slow.arrived_last.unwrap_or(0) as f64 >= 0.9 * arrivals.matched as f64,
            "{scenario}: {arrivals:?}"
        );
        let late_ms = arrivals.median_late_ns as f64 / 1e6;
        match cause {
            Cause::Disk => assert!(late_ms >= 100.0, "{scenario}: {arrivals:?}"),
            _ => assert!(late_ms <= 30.0, "{scenario}: {arrivals:?}"),
        }
    }
}

/// The timeline's thread states against each thread's counters, in every recording: the
/// recorder moves time between states after the fact (a run-queue wait estimated at a tick,
/// settled at the next switch), and the timeline must follow it, not keep what an earlier
/// tick showed. Exact: a correction is made within a tick or two.
#[test]
fn every_threads_timeline_states_add_up_to_its_counters() {
    use profiler_core::timeline::{STATES, ThreadState, thread_states};
    for (scenario, _) in SCENARIOS {
        let a = analyzed(scenario).analysis;
        let lanes = thread_states(&a.timeline);
        for (tid, t) in &a.threads {
            let runs = lanes.get(tid).map_or(&[][..], Vec::as_slice);
            for state in STATES {
                let shown: u64 = runs
                    .iter()
                    .filter(|r| r.state == state)
                    .map(|r| r.dur_ns())
                    .sum();
                let c = &t.counters;
                let counted = match state {
                    ThreadState::OnCpu => c.on_cpu_ns,
                    ThreadState::RunQueue => c.runqueue_ns,
                    ThreadState::IoWait => c.io_wait_ns,
                    ThreadState::Blocked => c.blocked_ns,
                };
                assert_eq!(
                    shown,
                    counted,
                    "{scenario} thread {tid} {}: the timeline shows {shown} ns, the counters {counted} ns",
                    state.name()
                );
            }
        }
    }
}
