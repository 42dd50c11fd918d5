//! Shared fixtures: a small hand-built recording and helpers to encode and compare it.
#![allow(dead_code, reason = "each test crate uses a different subset")]

use std::path::PathBuf;

use profiler_core::RecordingWriter;
use profiler_core::recording::record::{
    EndReason, EventLoss, Meta, Record, ThreadCounters, UnwindStats,
};

pub const START_NS: u64 = 1_000_000_000;
pub const MS: u64 = 1_000_000;

pub fn counters(tid: u32, pid: u32, ms: [u64; 4], pc_pages: u64) -> ThreadCounters {
    ThreadCounters {
        tid,
        pid,
        on_cpu_ns: ms[0] * MS,
        runqueue_ns: ms[1] * MS,
        io_wait_ns: ms[2] * MS,
        blocked_ns: ms[3] * MS,
        page_cache_misses: pc_pages,
        page_cache_miss_bytes: pc_pages * 4096,
    }
}

fn stack(id: u32, frames: &[&str]) -> Record {
    Record::Stack {
        id,
        frames: frames.iter().map(|f| (*f).to_owned()).collect(),
    }
}

fn block_io(
    ms_after_start: u64,
    tid: u32,
    pid: u32,
    write: bool,
    bytes: u64,
    queue_us: u64,
    service_us: u64,
) -> Record {
    Record::BlockIo {
        ts_ns: START_NS + ms_after_start * MS,
        tid,
        pid,
        dev: (259 << 20) | 1,
        write,
        sector: 2048,
        bytes,
        queue_ns: queue_us * 1000,
        service_ns: service_us * 1000,
    }
}

fn off_cpu(
    ms_after_start: u64,
    tid: u32,
    pid: u32,
    io: bool,
    stack: u32,
    duration_ms: u64,
) -> Record {
    Record::OffCpuSample {
        ts_ns: START_NS + ms_after_start * MS,
        tid,
        pid,
        duration_ns: duration_ms * MS,
        io,
        stack,
    }
}

fn cpu(ms_after_start: u64, tid: u32, pid: u32, stack: u32) -> Record {
    Record::CpuSample {
        ts_ns: START_NS + ms_after_start * MS,
        tid,
        pid,
        stack,
    }
}

/// Two processes, three threads: a trainer's main thread (100), its loader thread (101,
/// exits at 250 ms) and a worker process (200, appears after the first tick, exits at 340 ms).
pub fn fixture() -> Vec<Record> {
    let t = |ms: u64| START_NS + ms * MS;
    let mut records = vec![
        Record::Meta(Box::new(Meta {
            target_pids: vec![100],
            command: vec![
                "python".into(),
                "train.py".into(),
                "--epochs".into(),
                "3".into(),
            ],
            start_ns: START_NS,
            start_unix_ns: 1_700_000_000_000_000_000,
            hostname: "gpu-host".into(),
            kernel: "6.18.0".into(),
            sample_hz: 99,
            tick_ns: 100 * MS,
            stallscope_version: "0.1.0".into(),
        })),
        Record::Process {
            ts_ns: t(0),
            pid: 100,
            ppid: 1,
            cmdline: "python train.py --epochs 3".into(),
        },
        Record::Thread {
            ts_ns: t(0),
            tid: 100,
            pid: 100,
            comm: "python".into(),
        },
        Record::Thread {
            ts_ns: t(0),
            tid: 101,
            pid: 100,
            comm: "pt_loader".into(),
        },
        Record::Unavailable {
            signal: "gpu".into(),
            reason: "libnvidia-ml.so.1 not found".into(),
        },
        stack(1, &["_start", "main", "train_step"]),
        stack(2, &["_start", "main", "read<[u8; 8]>"]),
        stack(3, &["clone", "worker_loop", "decode_jpeg"]),
        stack(4, &["clone", "worker_loop", "futex_wait"]),
        block_io(20, 101, 100, false, 128 * 1024, 200, 1300),
        block_io(40, 101, 100, false, 256 * 1024, 100, 2900),
        block_io(60, 101, 100, true, 4096, 50, 450),
        block_io(70, 100, 100, false, 64 * 1024, 500, 500),
    ];
    for i in 0..5 {
        records.push(cpu(10 + i * 10, 100, 100, 1));
    }
    records.extend([
        cpu(15, 101, 100, 2),
        cpu(25, 101, 100, 2),
        off_cpu(30, 101, 100, true, 2, 10),
        off_cpu(50, 101, 100, true, 2, 20),
        off_cpu(80, 101, 100, false, 2, 5),
        off_cpu(90, 100, 100, false, 1, 50),
        Record::Tick {
            ts_ns: t(100),
            threads: vec![counters(100, 100, [60, 5, 5, 30], 0), counters(101, 100, [10, 2, 40, 48], 100)],
        },
        Record::Process { ts_ns: t(120), pid: 200, ppid: 100, cmdline: "python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7) --multiprocessing-fork".into() },
        Record::Thread { ts_ns: t(120), tid: 200, pid: 200, comm: "pt_worker".into() },
    ]);
    for i in 0..4 {
        records.push(cpu(130 + i * 10, 200, 200, 3));
    }
    records.extend([
        off_cpu(190, 200, 200, false, 4, 100),
        Record::Tick {
            ts_ns: t(200),
            threads: vec![
                counters(100, 100, [130, 10, 10, 50], 0),
                counters(101, 100, [20, 4, 100, 76], 300),
                counters(200, 200, [50, 10, 0, 20], 0),
            ],
        },
        Record::ThreadExit {
            ts_ns: t(250),
            counters: counters(101, 100, [25, 5, 130, 90], 400),
        },
        Record::Tick {
            ts_ns: t(300),
            threads: vec![
                counters(100, 100, [190, 15, 20, 75], 0),
                counters(200, 200, [120, 20, 10, 30], 8),
            ],
        },
        Record::ThreadExit {
            ts_ns: t(340),
            counters: counters(200, 200, [150, 22, 12, 36], 10),
        },
        Record::PageCacheFile {
            tid: 101,
            pid: 100,
            dev: (259 << 20) | 1,
            ino: 42,
            path: Some("/data/train.bin".into()),
            pages: 400,
            bytes: 400 * 4096,
        },
        Record::PageCacheFile {
            tid: 200,
            pid: 200,
            dev: (8 << 20) | 1,
            ino: 1234,
            path: None,
            pages: 10,
            bytes: 10 * 4096,
        },
        Record::PageCacheFile {
            tid: 100,
            pid: 100,
            dev: (259 << 20) | 1,
            ino: 42,
            path: Some("/data/train.bin".into()),
            pages: 5,
            bytes: 5 * 4096,
        },
        Record::Loss(EventLoss {
            kind: "sched".into(),
            attempted: 10_000,
            dropped: 10,
            received: 9_980,
        }),
        Record::Loss(EventLoss {
            kind: "block".into(),
            attempted: 50,
            dropped: 0,
            received: 50,
        }),
        Record::Unwinding(Box::new(UnwindStats {
            complete: 90,
            truncated: 8,
            failed: 2,
            by_frame_pointers: 10,
            by_dwarf: 90,
            without_copy: 1,
            dwarf_walks: 92,
            dwarf_ns: 4_500_000,
            warnings: vec!["/opt/lib/libstripped.so has no unwind information".into()],
        })),
        Record::End {
            ts_ns: t(350),
            reason: EndReason::TargetExited,
        },
    ]);
    records
}

/// The records as a recording file.
pub fn encode(records: &[Record]) -> Vec<u8> {
    let mut w = RecordingWriter::new(Vec::new()).expect("writing to a Vec");
    for r in records {
        w.write(r).expect("writing to a Vec");
    }
    w.into_inner()
}

/// Byte offset where each frame starts (after the 12-byte header), plus the file length.
pub fn frame_offsets(file: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut at = 12;
    while at + 8 <= file.len() {
        offsets.push(at);
        let len = u32::from_le_bytes(file[at..at + 4].try_into().unwrap()) as usize;
        at += 8 + len;
    }
    offsets
}

/// Compares `actual` with `tests/golden/<name>`, or rewrites the file when
/// `STALLSCOPE_BLESS=1`.
/// `tests/recordings/gpu/v1-<scenario>.rec`: a recording stallscope made of a stallgen
/// scenario on the simulated GPU.
pub fn gpu_recording(scenario: &str) -> PathBuf {
    [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "recordings",
        "gpu",
        &format!("v1-{scenario}.rec"),
    ]
    .iter()
    .collect()
}

pub fn assert_golden(name: &str, actual: &str) {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "golden", name]
        .iter()
        .collect();
    if std::env::var_os("STALLSCOPE_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, actual).expect("writing golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with STALLSCOPE_BLESS=1 to create it",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{} differs (rerun with STALLSCOPE_BLESS=1 to accept):\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}
