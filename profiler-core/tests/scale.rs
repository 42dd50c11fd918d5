//! Scale check: ten million records stream through the analysis in bounded time and memory.
//! Ignored by default (it writes a ~200 MB temp file); run it in release:
//! `cargo test --release -p profiler-core --test scale -- --ignored --nocapture`.
use std::fs::File;
use std::io::{BufWriter, Write};
use std::time::Instant;

use profiler_core::RecordingWriter;
use profiler_core::recording::record::{EndReason, Meta, Record, ThreadCounters};

const THREADS: u32 = 20;
const TICKS: u64 = 72_000;
const TICK_NS: u64 = 50_000_000;
const RECORDS: u64 = 10_000_000;

/// A one-hour, 8-worker-shaped recording: ticks every 50 ms, CPU samples, off-CPU samples and
/// block IO filling the rest.
fn write_big(w: impl Write) -> std::io::Result<u64> {
    let mut w = RecordingWriter::new(w)?;
    let mut written = 0u64;
    let mut put = |w: &mut RecordingWriter<_>, r: &Record| {
        written += 1;
        w.write(r)
    };
    put(
        &mut w,
        &Record::Meta(Box::new(Meta {
            target_pids: vec![1000],
            tick_ns: TICK_NS,
            ..Meta::default()
        })),
    )?;
    for tid in 0..THREADS {
        let pid = 1000 + tid / 3;
        put(
            &mut w,
            &Record::Thread {
                ts_ns: 0,
                tid: 1000 + tid,
                pid,
                comm: format!("worker{tid}"),
            },
        )?;
    }
    for id in 0..5_000u32 {
        let frames = (0..12)
            .map(|d| format!("module::function_{}_{d}", id % 97))
            .collect();
        put(&mut w, &Record::Stack { id, frames })?;
    }
    let per_tick = (RECORDS - 5_100) / TICKS - 1;
    let mut x = 0x1234_5678_9abc_def0u64;
    for tick in 1..=TICKS {
        let ts = tick * TICK_NS;
        for i in 0..per_tick {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let tid = 1000 + (x % u64::from(THREADS)) as u32;
            let pid = 1000 + (tid - 1000) / 3;
            let stack = ((x >> 20) % 5_000) as u32;
            let r = match i % 16 {
                0..=10 => Record::CpuSample {
                    ts_ns: ts,
                    tid,
                    pid,
                    stack,
                },
                11..=14 => Record::OffCpuSample {
                    ts_ns: ts,
                    tid,
                    pid,
                    duration_ns: (x >> 40) % 10_000_000,
                    io: x & 1 == 0,
                    stack,
                },
                _ => Record::BlockIo {
                    ts_ns: ts,
                    tid,
                    pid,
                    dev: 1,
                    write: false,
                    sector: x >> 8,
                    bytes: 131_072,
                    queue_ns: (x >> 30) % 1_000_000,
                    service_ns: (x >> 12) % 5_000_000,
                },
            };
            put(&mut w, &r)?;
        }
        let threads = (0..THREADS)
            .map(|t| {
                let k = tick * 1_000_000;
                ThreadCounters {
                    tid: 1000 + t,
                    pid: 1000 + t / 3,
                    on_cpu_ns: 20 * k,
                    runqueue_ns: 5 * k,
                    io_wait_ns: 10 * k,
                    blocked_ns: 15 * k,
                    page_cache_misses: tick,
                    page_cache_miss_bytes: tick * 4096,
                }
            })
            .collect();
        put(&mut w, &Record::Tick { ts_ns: ts, threads })?;
    }
    put(
        &mut w,
        &Record::End {
            ts_ns: TICKS * TICK_NS,
            reason: EndReason::Duration,
        },
    )?;
    w.flush()?;
    Ok(written)
}

/// CPU seconds this thread has used (user + system). Wall time is reported too, but the
/// assertion uses CPU time so that a busy machine does not fail the check.
fn thread_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // USER_HZ is 100 on every Linux architecture.
    Some((utime + stime) / 100.0)
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
#[ignore = "writes a ~200 MB file; run in release"]
fn ten_million_records_stream_in_bounded_time_and_memory() {
    let path = std::env::temp_dir().join(format!("stallscope-scale-{}.rec", std::process::id()));
    let written = write_big(BufWriter::new(File::create(&path).unwrap())).unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    let rss_before = peak_rss_kib();
    let started = Instant::now();
    let cpu_before = thread_cpu_s();
    let (folded, info) = profiler_core::load_reader(File::open(&path).unwrap()).unwrap();
    let done = folded.analyzed(info);
    let analysis = &done.analysis;
    let elapsed = started.elapsed();
    let cpu_s = thread_cpu_s()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let text = profiler_core::report::text::to_text(&done.report());
    let total = started.elapsed();
    let rss_after = peak_rss_kib();
    std::fs::remove_file(&path).unwrap();
    eprintln!(
        "{written} records, {size} bytes: analysed in {elapsed:?} ({cpu_s:?} CPU s), with text \
         report {total:?}; peak RSS before {rss_before:?} KiB, after {rss_after:?} KiB; \
         {} timeline slices",
        analysis.timeline.len()
    );
    assert_eq!(info.records, written);
    assert!(text.contains("20 threads"));
    let seconds = cpu_s.unwrap_or(elapsed.as_secs_f64());
    assert!(seconds < 2.0, "took {seconds} s");
    if let Some(rss) = rss_after {
        assert!(rss < 256 * 1024, "peak RSS {rss} KiB");
    }
}
