//! Attribution end to end on a hand-built recording: a healthy phase, a dataloader-bound phase
//! and a disk-bound phase, with NVML-like sample periods that straddle the phase changes.
use profiler_core::LoadInfo;
use profiler_core::analyze;
use profiler_core::attribution::Cause;
use profiler_core::recording::record::{GpuInfo, Meta, Record, ThreadCounters};
use profiler_core::report::{flamegraph::cause_folded, json::to_json_value, text::write_text};

const MS: u64 = 1_000_000;
const START: u64 = 5_000 * MS;
const TICK: u64 = 50 * MS;
const PERIOD: u64 = 166_666_667;
const FEEDER: u32 = 100;
const WORKERS: [u32; 2] = [200, 201];

/// What each thread does per tick in a phase: (on, rq, io, blocked) fractions, and GPU util.
struct Phase {
    until_ms: u64,
    util: u32,
    feeder: [f64; 4],
    worker: [f64; 4],
}

const PHASES: [Phase; 3] = [
    Phase {
        until_ms: 4000,
        util: 100,
        feeder: [0.95, 0.05, 0.0, 0.0],
        worker: [0.2, 0.0, 0.0, 0.8],
    },
    Phase {
        until_ms: 8000,
        util: 30,
        feeder: [0.3, 0.0, 0.0, 0.7],
        worker: [0.95, 0.03, 0.0, 0.02],
    },
    Phase {
        until_ms: 10000,
        util: 20,
        feeder: [0.2, 0.0, 0.0, 0.8],
        worker: [0.1, 0.0, 0.8, 0.1],
    },
];

/// `cause`'s idle seconds are `want`, give or take the samples that straddle a phase change.
fn assert_idle_s(g: &profiler_core::attribution::GpuAttribution, cause: Cause, want: f64) {
    let got = *g.idle_by_cause.get(&cause).unwrap_or(&0) as f64 / 1e9;
    assert!(
        (got - want).abs() < 0.15,
        "{cause:?}: {got:.2} s, want {want} s: {:?}",
        g.idle_by_cause
    );
}

fn phase_at(phases: &[Phase], ms: u64) -> &Phase {
    phases
        .iter()
        .find(|p| ms < p.until_ms)
        .unwrap_or(&phases[phases.len() - 1])
}

/// The recording's start: its `Meta` and one GPU that the feeder uses.
fn job_start() -> [Record; 2] {
    [
        Record::Meta(Box::new(Meta {
            target_pids: vec![FEEDER],
            start_ns: START,
            tick_ns: TICK,
            ..Meta::default()
        })),
        Record::Gpu(Box::new(GpuInfo {
            index: 0,
            name: "test GPU".into(),
            target_pids: vec![FEEDER],
            ..GpuInfo::default()
        })),
    ]
}

fn recording() -> Vec<Record> {
    recording_of(&PHASES)
}

/// Ten seconds of `phases`, with the workers' stacks sampled while they compute (4 to 8 s)
/// and their IO waits after 8 s.
fn recording_of(phases: &[Phase]) -> Vec<Record> {
    let mut out = Vec::from(job_start());
    out.extend([
        Record::Stack {
            id: 0,
            frames: vec!["main".into(), "worker_loop".into(), "decode_jpeg".into()],
        },
        Record::Stack {
            id: 1,
            frames: vec![
                "main".into(),
                "read_sample".into(),
                "io_schedule_[k]".into(),
            ],
        },
    ]);
    for (tid, name) in [
        (FEEDER, "python"),
        (WORKERS[0], "pt_data_worker"),
        (WORKERS[1], "pt_data_worker"),
    ] {
        out.push(Record::Thread {
            ts_ns: START,
            tid,
            pid: tid,
            comm: name.into(),
        });
    }
    let mut totals: Vec<ThreadCounters> = [FEEDER, WORKERS[0], WORKERS[1]]
        .iter()
        .map(|&tid| ThreadCounters {
            tid,
            pid: tid,
            ..ThreadCounters::default()
        })
        .collect();
    let mut t = START;
    while t < START + 10_000 * MS {
        let p = phase_at(phases, (t - START) / MS);
        for c in &mut totals {
            let f = if c.tid == FEEDER { p.feeder } else { p.worker };
            c.on_cpu_ns += (f[0] * TICK as f64) as u64;
            c.runqueue_ns += (f[1] * TICK as f64) as u64;
            c.io_wait_ns += (f[2] * TICK as f64) as u64;
            c.blocked_ns += (f[3] * TICK as f64) as u64;
        }
        t += TICK;
        out.push(Record::Tick {
            ts_ns: t,
            threads: totals.clone(),
        });
        let ms = (t - START) / MS;
        if (4000..8000).contains(&ms) {
            out.push(Record::CpuSample {
                ts_ns: t - MS,
                tid: WORKERS[0],
                pid: WORKERS[0],
                stack: 0,
            });
        }
        if ms >= 8000 {
            out.push(Record::OffCpuSample {
                ts_ns: t - 20 * MS,
                tid: WORKERS[1],
                pid: WORKERS[1],
                duration_ns: 15 * MS,
                io: true,
                stack: 1,
            });
        }
    }
    // Sample periods do not line up with the phases: the one straddling 4 s mixes them.
    let mut s = START + PERIOD;
    while s <= START + 10_000 * MS {
        let mid_ms = (s - PERIOD / 2 - START) / MS;
        out.push(Record::GpuUtil {
            gpu: 0,
            ts_ns: s,
            period_ns: PERIOD,
            util_pct: phase_at(phases, mid_ms).util,
        });
        s += PERIOD;
    }
    out.push(Record::End {
        ts_ns: START + 10_000 * MS,
        reason: profiler_core::recording::record::EndReason::Duration,
    });
    out
}

#[test]
fn labels_each_phase_with_its_cause() {
    let a = analyze(recording()).analyzed(LoadInfo::default());
    let attr = a
        .attribution
        .as_ref()
        .expect("GPU samples give an attribution");
    assert_eq!(
        attr.roles.feeders.iter().copied().collect::<Vec<_>>(),
        [FEEDER]
    );
    let g = &attr.gpus[0];
    let idle_s = |c: Cause| *g.idle_by_cause.get(&c).unwrap_or(&0) as f64 / 1e9;
    // 4 s at 70% idle and 2 s at 80% idle, give or take the straddling samples.
    assert_idle_s(g, Cause::DataloaderCpu, 2.8);
    assert_idle_s(g, Cause::Disk, 1.6);
    let labelled = idle_s(Cause::DataloaderCpu) + idle_s(Cause::Disk);
    assert!(
        labelled / (g.idle_ns as f64 / 1e9) > 0.95,
        "{:?}",
        g.idle_by_cause
    );
    let secs: Vec<Option<Cause>> = g.seconds.iter().map(|s| s.cause).collect();
    assert_eq!(
        &secs[..4],
        &[None; 4],
        "healthy seconds carry no label: {secs:?}"
    );
    assert!(
        secs[4..8].iter().all(|c| *c == Some(Cause::DataloaderCpu)),
        "{secs:?}"
    );
    assert!(
        secs[8..].iter().all(|c| *c == Some(Cause::Disk)),
        "{secs:?}"
    );

    let v = &attr.verdict;
    assert_eq!(v.cause, Some(Cause::DataloaderCpu));
    assert_eq!(v.severity, "high");
    assert!(v.text.contains("dataloader_cpu"), "{}", v.text);

    let longest = &g.stalls[0];
    assert_eq!(longest.cause, Cause::DataloaderCpu);
    assert!(
        longest.end_ns - longest.start_ns >= 3_500 * MS,
        "{longest:?}"
    );
    let ev = &longest.evidence;
    assert!(ev.threads.iter().all(|t| t.role == "worker"), "{ev:?}");
    assert_eq!(
        ev.stacks[0].frames.last().map(String::as_str),
        Some("decode_jpeg")
    );
    let disk = g
        .stalls
        .iter()
        .find(|s| s.cause == Cause::Disk)
        .expect("a disk stall");
    assert_eq!(
        disk.evidence.stacks[0].frames.last().map(String::as_str),
        Some("io_schedule_[k]")
    );
}

#[test]
fn per_cause_flamegraphs_hold_only_that_cause_s_stacks() {
    let f = analyze(recording());
    let attr = f.attribute();
    let (lines, unit) = cause_folded(&f, attr.as_ref(), Cause::DataloaderCpu);
    assert_eq!(unit, "samples");
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l.contains("decode_jpeg")),
        "{lines:?}"
    );
    let (disk, unit) = cause_folded(&f, attr.as_ref(), Cause::Disk);
    assert_eq!(unit, "us");
    assert!(
        !disk.is_empty() && disk.iter().all(|l| l.contains("[io]")),
        "{disk:?}"
    );
}

#[test]
fn json_has_the_gpu_contract() {
    let a = analyze(recording()).analyzed(LoadInfo::default());
    let v = to_json_value(&a.report());
    let gpu = &v["gpus"][0];
    for key in ["index", "busy_ns", "idle_ns", "idle_by_cause"] {
        assert!(!gpu[key].is_null(), "gpus[0].{key} missing: {gpu}");
    }
    assert!(gpu["idle_by_cause"]["dataloader_cpu"].as_u64().unwrap() > 0);
    let stall = &v["stalls"][0];
    for key in ["gpu", "start_ns", "end_ns", "cause"] {
        assert!(!stall[key].is_null(), "stalls[0].{key} missing: {stall}");
    }
    assert_eq!(stall["cause"], "dataloader_cpu");
    assert_eq!(v["verdict"]["cause"], "dataloader_cpu");
    assert!(v["verdict"]["share"].as_f64().unwrap() > 0.2);
}

#[test]
fn no_gpu_samples_means_no_attribution() {
    let records: Vec<Record> = recording()
        .into_iter()
        .filter(|r| !matches!(r, Record::GpuUtil { .. }))
        .collect();
    assert!(analyze(records).attribute().is_none());
}

/// Four seconds of a feeder busy on its own while the GPU idles 70%: host work, or a sync
/// spinning on-CPU, which only the CUDA probes tell apart. The probes attach at `attach_ms`
/// and see the feeder's first call, a short copy, at once.
fn host_work(attach_ms: u64) -> Vec<Record> {
    let mut out = Vec::from(job_start());
    out.extend([
        Record::Thread {
            ts_ns: START,
            tid: FEEDER,
            pid: FEEDER,
            comm: "python".into(),
        },
        Record::CudaProbes {
            ts_ns: START + attach_ms * MS,
            pid: FEEDER,
            path: "/usr/lib/libcuda.so.1".into(),
            library: profiler_core::cuda::Library::Driver,
            attached: vec!["cuStreamSynchronize".into()],
            missing: Vec::new(),
        },
        first_call(START + attach_ms * MS),
    ]);
    let mut c = ThreadCounters {
        tid: FEEDER,
        pid: FEEDER,
        ..ThreadCounters::default()
    };
    let mut t = START;
    while t < START + 4000 * MS {
        c.on_cpu_ns += TICK * 95 / 100;
        c.blocked_ns += TICK * 5 / 100;
        t += TICK;
        out.push(Record::Tick {
            ts_ns: t,
            threads: vec![c],
        });
    }
    let mut s = START + PERIOD;
    while s <= START + 4000 * MS {
        out.push(Record::GpuUtil {
            gpu: 0,
            ts_ns: s,
            period_ns: PERIOD,
            util_pct: 30,
        });
        s += PERIOD;
    }
    out
}

/// A 10 µs copy by the feeder at `ts_ns`.
fn first_call(ts_ns: u64) -> Record {
    Record::CudaCall(Box::new(profiler_core::recording::record::CudaCall {
        tid: FEEDER,
        pid: FEEDER,
        start_ns: ts_ns,
        end_ns: ts_ns + 10_000,
        api: "cuMemcpyHtoDAsync_v2".into(),
        op: profiler_core::cuda::CudaOp::Copy {
            dir: profiler_core::cuda::CopyDir::HostToDevice,
            dst: 0x1000,
            src: 0x2000,
            bytes: 4096,
            stream: 0,
            asynchronous: true,
        },
        status: 0,
        caller: String::new(),
    }))
}

#[test]
fn before_the_cuda_probes_see_a_call_host_work_is_not_claimed() {
    // Probes on at the start, but the feeder's first call comes at 2 s: it may have been
    // inside a sync since before the probes attached, spinning.
    let mut records = host_work(0);
    records.retain(|r| !matches!(r, Record::CudaCall(_)));
    records.push(first_call(START + 2000 * MS));
    let a = analyze(records).analyzed(LoadInfo::default());
    let g = &a.attribution.as_ref().expect("attributed").gpus[0];
    assert_idle_s(g, Cause::Unknown, 1.4);
    assert_idle_s(g, Cause::HostCompute, 1.4);
    // A feeder the probes never saw calling anything: in doubt throughout.
    let mut records = host_work(0);
    records.retain(|r| !matches!(r, Record::CudaCall(_)));
    let a = analyze(records).analyzed(LoadInfo::default());
    let g = &a.attribution.as_ref().expect("attributed").gpus[0];
    assert_idle_s(g, Cause::HostCompute, 0.0);
}

#[test]
fn a_window_the_probes_watched_most_of_has_its_cause() {
    // Windows end every PERIOD from START; the one from 2000 ms runs to 2166.7 ms.
    let cause_at = |first_call_ms: u64| {
        let mut records = host_work(0);
        records.retain(|r| !matches!(r, Record::CudaCall(_)));
        records.push(first_call(START + first_call_ms * MS));
        let a = analyze(records).analyzed(LoadInfo::default());
        let g = &a.attribution.as_ref().expect("attributed").gpus[0];
        g.labels
            .iter()
            .find(|w| w.start_ns <= START + 2050 * MS && START + 2050 * MS < w.end_ns)
            .map(|w| w.cause)
            .expect("a window at 2050 ms")
    };
    // 12% and 42% of it before the first call seen: taken as probed throughout.
    assert_eq!(cause_at(2020), Cause::HostCompute);
    assert_eq!(cause_at(2070), Cause::HostCompute);
    // 60%: in doubt.
    assert_eq!(cause_at(2100), Cause::Unknown);
}

#[test]
fn before_the_cuda_probes_attach_host_work_is_not_claimed() {
    let a = analyze(host_work(2000)).analyzed(LoadInfo::default());
    let g = &a.attribution.as_ref().expect("attributed").gpus[0];
    // The first two seconds at 70% idle came before the probes; the rest, with the feeder's
    // CUDA calls watched and none seen, is host work.
    assert_idle_s(g, Cause::Unknown, 1.4);
    assert_idle_s(g, Cause::HostCompute, 1.4);
    let before = g
        .stalls
        .iter()
        .find(|s| s.start_ns < START + 1000 * MS && s.end_ns > START + 1000 * MS)
        .expect("a stall at 1 s");
    assert_eq!(before.cause, Cause::Unknown);
    assert_eq!(
        before.reason.as_deref(),
        Some(profiler_core::attribution::BEFORE_PROBES)
    );
}

#[test]
fn before_the_cuda_probes_attach_other_causes_stand() {
    let mut records = recording();
    records.push(Record::CudaProbes {
        ts_ns: START + 9000 * MS,
        pid: FEEDER,
        path: "/usr/lib/libcuda.so.1".into(),
        library: profiler_core::cuda::Library::Driver,
        attached: vec!["cuStreamSynchronize".into()],
        missing: Vec::new(),
    });
    let a = analyze(records).analyzed(LoadInfo::default());
    let g = &a.attribution.as_ref().expect("attributed").gpus[0];
    assert_idle_s(g, Cause::DataloaderCpu, 2.8);
    assert_idle_s(g, Cause::Disk, 1.6);
    assert_idle_s(g, Cause::Unknown, 0.0);
}

/// A feeder waiting for workers that compute, with the GPU 29% idle in every window: no window
/// is a stall, and the report must still say why.
const EVEN: [Phase; 1] = [Phase {
    until_ms: 10000,
    util: 71,
    feeder: [0.3, 0.0, 0.0, 0.7],
    worker: [0.95, 0.03, 0.0, 0.02],
}];

#[test]
fn a_job_idling_a_little_everywhere_gets_evidence_per_cause() {
    let a = analyze(recording_of(&EVEN)).analyzed(LoadInfo::default());
    let g = &a.attribution.as_ref().expect("attributed").gpus[0];
    assert!(
        g.stalls.is_empty(),
        "no window is half idle: {:?}",
        g.stalls
    );
    let idle_share = g.idle_ns as f64 / g.observed_ns as f64;
    assert!((idle_share - 0.29).abs() < 0.02, "{idle_share}");
    let top = &g.causes[0];
    assert_eq!(top.cause, Cause::DataloaderCpu, "{:?}", g.causes);
    assert_eq!(top.idle_ns, g.idle_by_cause[&Cause::DataloaderCpu]);
    assert_eq!(
        g.causes.iter().map(|c| c.idle_ns).sum::<u64>(),
        g.idle_ns,
        "every cause with idle time is listed"
    );
    assert!(top.windows >= 55, "{} windows", top.windows);
    let ev = &top.evidence;
    assert!(
        !ev.threads.is_empty() && ev.threads.iter().all(|t| t.role == "worker"),
        "{ev:?}"
    );
    // Summed over the whole run: each worker ran about 95% of 10 s.
    assert!(
        ev.threads.iter().all(|t| t.on_cpu_ns > 9_000 * MS),
        "{:?}",
        ev.threads
    );
    assert_eq!(
        ev.stacks[0].frames.last().map(String::as_str),
        Some("decode_jpeg")
    );
    let v = to_json_value(&a.report());
    let cause = &v["gpus"][0]["causes"][0];
    assert_eq!(cause["cause"], "dataloader_cpu", "{cause}");
    assert_eq!(
        cause["evidence"]["stacks"][0]["frames"][2], "decode_jpeg",
        "{cause}"
    );
    assert!(v["stalls"].as_array().unwrap().is_empty());
    let mut text = Vec::new();
    write_text(&a.report(), &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    let why = text
        .split_once("why, by cause")
        .unwrap_or_else(|| panic!("no per-cause evidence in the text report:\n{text}"))
        .1;
    assert!(
        why.contains("dataloader_cpu")
            && why.contains("pt_data_worker")
            && why.contains("decode_jpeg"),
        "{text}"
    );
}

#[test]
fn launch_overhead_evidence_gives_the_launch_rate() {
    let mut records = host_work(0);
    // 1,000 launches in the 10 ms the launch probes were on: 100,000 per second.
    records.push(Record::Launches {
        ts_ns: START + 1000 * MS,
        probed_ns: 10 * MS,
        counts: vec![profiler_core::recording::record::LaunchCount {
            tid: FEEDER,
            pid: FEEDER,
            launches: 1000,
            api: "cuLaunchKernel".into(),
        }],
    });
    let a = analyze(records).analyzed(LoadInfo::default());
    let g = &a.attribution.as_ref().expect("attributed").gpus[0];
    assert_idle_s(g, Cause::LaunchOverhead, 2.8);
    let stall = &g.stalls[0];
    assert_eq!(stall.cause, Cause::LaunchOverhead);
    for cuda in [&stall.evidence.cuda, &g.causes[0].evidence.cuda] {
        let cuda = cuda.as_ref().expect("launch_overhead has CUDA evidence");
        assert_eq!(cuda.launches_per_sec, Some(100_000.0), "{cuda:?}");
        assert_eq!(cuda.launches_by_api.get("cuLaunchKernel"), Some(&1000));
    }
    let mut text = Vec::new();
    write_text(&a.report(), &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    let stalls = text.split_once("longest stalls").expect("a stall").1;
    assert!(stalls.contains("kernel launches: about 100000/s"), "{text}");
}

#[test]
fn copy_evidence_counts_each_copy_once() {
    // A recording of stallgen's pageable-copy scenario: each step's copy call stages its
    // bytes, and the sync after it waits for the same bytes.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/recordings/v1-stallgen-pageable-copy.rec"
    );
    let (f, _) = profiler_core::load_reader(std::fs::File::open(path).unwrap()).unwrap();
    let attr = f.attribute().expect("attributed");
    let a = &f.analysis;
    let copied: u64 = a
        .cuda
        .calls
        .iter()
        .filter_map(|c| match c.op {
            profiler_core::cuda::CudaOp::Copy { bytes, .. } => Some(bytes),
            _ => None,
        })
        .sum();
    let cause = attr.gpus[0]
        .causes
        .iter()
        .find(|c| c.cause == Cause::PinnedMemoryCopy)
        .expect("the scenario's cause");
    let copies = cause.evidence.cuda.as_ref().unwrap().copies.unwrap();
    assert!(copies.pageable_bytes > copied / 2, "{copies:?} of {copied}");
    assert!(
        copies.pageable_bytes <= copied,
        "{copies:?} of {copied} copied in all"
    );
}

#[test]
fn a_sync_still_waiting_when_the_recording_ends_is_a_wait_not_an_error() {
    // The feeder spins in one sync from 1 s to the end (a hung collective, say): the recorder
    // writes it as ending with the recording, status IN_PROGRESS.
    let mut records = host_work(0);
    records.push(Record::CudaCall(Box::new(
        profiler_core::recording::record::CudaCall {
            tid: FEEDER,
            pid: FEEDER,
            start_ns: START + 1000 * MS,
            end_ns: START + 4000 * MS,
            api: "cuStreamSynchronize".into(),
            op: profiler_core::cuda::CudaOp::Sync {
                scope: profiler_core::cuda::SyncScope::Stream,
                handle: 0,
            },
            status: profiler_core::recording::record::IN_PROGRESS,
            caller: String::new(),
        },
    )));
    let a = analyze(records).analyzed(LoadInfo::default());
    let wait = a
        .analysis
        .cuda
        .waits
        .iter()
        .find(|w| w.start_ns == START + 1000 * MS)
        .expect("the open sync is a wait");
    assert_eq!(wait.end_ns, START + 4000 * MS);
    let summary = profiler_core::cuda::summarize(&a.analysis.cuda);
    let sync = summary.processes[0]
        .calls
        .iter()
        .find(|c| c.api == "cuStreamSynchronize")
        .unwrap();
    assert_eq!(sync.errors, 0, "still waiting is not an error");
    // Its time is the sync's, not the feeder's own work.
    let g = &a.attribution.as_ref().expect("attributed").gpus[0];
    assert_idle_s(g, Cause::HostCompute, 0.7);
}
