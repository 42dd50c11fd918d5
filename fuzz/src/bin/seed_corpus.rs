//! Writes the fuzzers' seed corpus: small valid recordings that between them use every record
//! kind, and hand-made damaged files (empty, header only, cut-short frames, bad crc, ...).
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --bin seed_corpus` rewrites
//! `fuzz/corpus/decode/` and `fuzz/corpus/report/` (the same files in both). The output is
//! deterministic, so an unchanged generator leaves the checked-in files unchanged.
use std::path::{Path, PathBuf};

use profiler_core::RecordingWriter;
use profiler_core::cuda::{CopyDir, CudaOp, Library, SyncScope};
use profiler_core::recording::format::{HEADER_LEN, MAGIC};
use profiler_core::recording::record::{
    CudaCall, EndReason, EventLoss, GpuInfo, GpuState, LaunchCount, Meta, PythonStats, Record,
    ThreadCounters, UnwindStats,
};

const MS: u64 = 1_000_000;
const START: u64 = 1_000 * MS;
/// The corpus files are kept small: libFuzzer mutates small inputs much faster.
const MAX_SEED_BYTES: usize = 20 * 1024;

fn encode(records: &[Record]) -> Vec<u8> {
    let mut w = RecordingWriter::new(Vec::new()).expect("writing to a Vec");
    for r in records {
        w.write(r).expect("writing to a Vec");
    }
    w.into_inner()
}

/// Byte offsets of every frame (after the header).
fn frames(file: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = HEADER_LEN;
    while at + 8 <= file.len() {
        out.push(at);
        let len = u32::from_le_bytes(file[at..at + 4].try_into().expect("4 bytes")) as usize;
        at += 8 + len;
    }
    out
}

fn meta(target: u32, tick_ns: u64) -> Record {
    Record::Meta(Box::new(Meta {
        target_pids: vec![target],
        command: vec!["python".into(), "train.py".into()],
        start_ns: START,
        start_unix_ns: 1_700_000_000_000_000_000,
        hostname: "seed-host".into(),
        kernel: "6.12.0".into(),
        sample_hz: 99,
        tick_ns,
        stallscope_version: "0.1.0".into(),
    }))
}

fn thread(tid: u32, pid: u32, comm: &str) -> Record {
    Record::Thread {
        ts_ns: START,
        tid,
        pid,
        comm: comm.into(),
    }
}

fn stack(id: u32, frames: &[&str]) -> Record {
    Record::Stack {
        id,
        frames: frames.iter().map(|f| (*f).to_owned()).collect(),
    }
}

fn gpu(index: u32, pids: &[u32]) -> Record {
    Record::Gpu(Box::new(GpuInfo {
        index,
        name: "NVIDIA H100 80GB HBM3".into(),
        uuid: format!("GPU-0000000{index}-seed"),
        pci_bus_id: format!("00000000:0{index}:00.0"),
        driver_version: "550.54.15".into(),
        pcie_max_gen: 5,
        pcie_max_width: 16,
        memory_total_bytes: 80 << 30,
        target_pids: pids.to_vec(),
    }))
}

fn gpu_state(gpu: u32, ts_ns: u64, pcie_gen: u32, idle: bool) -> Record {
    Record::GpuState(Box::new(GpuState {
        gpu,
        ts_ns,
        sm_clock_mhz: Some(1980),
        mem_clock_mhz: Some(2619),
        throttle_reasons: Some(u64::from(idle)),
        pcie_gen: Some(pcie_gen),
        pcie_width: Some(16),
        pcie_tx_kbps: Some(1_000_000),
        pcie_rx_kbps: Some(12_000_000),
        power_mw: Some(350_000),
        temperature_c: Some(61),
        memory_used_bytes: Some(20 << 30),
        sm_active_pct: if idle { None } else { Some(80) },
        sm_occupancy_pct: Some(40),
    }))
}

/// Threads' cumulative counters grown by one tick of (on, runqueue, io, blocked) fractions.
fn advance(c: &mut ThreadCounters, tick_ns: u64, f: [u64; 4]) {
    c.on_cpu_ns += tick_ns * f[0] / 100;
    c.runqueue_ns += tick_ns * f[1] / 100;
    c.io_wait_ns += tick_ns * f[2] / 100;
    c.blocked_ns += tick_ns * f[3] / 100;
}

fn counters(tid: u32, pid: u32) -> ThreadCounters {
    ThreadCounters {
        tid,
        pid,
        ..ThreadCounters::default()
    }
}

/// A CPU-only recording: processes, threads, stacks, on- and off-CPU samples, block IO, ticks,
/// thread exits, page-cache files, event losses, an unavailable signal and the end.
fn cpu_io() -> Vec<Record> {
    let tick = 100 * MS;
    let mut out = vec![
        meta(100, tick),
        Record::Host { cpus: 8 },
        Record::HostCopy {
            bytes: 32 << 20,
            ns: 4_000_000,
        },
        Record::Process {
            ts_ns: START,
            pid: 100,
            ppid: 1,
            cmdline: "python train.py --epochs 3".into(),
        },
        thread(100, 100, "python"),
        thread(101, 100, "pt_loader"),
        Record::Unavailable {
            signal: "gpu".into(),
            reason: "libnvidia-ml.so.1 not found".into(),
        },
        stack(1, &["_start", "main", "train_step"]),
        stack(2, &["_start", "main", "read<[u8; 8]>", "vfs_read_[k]"]),
        stack(3, &["clone", "worker_loop", "decode_jpeg"]),
        stack(4, &["clone", "worker_loop", "futex_wait_[k]"]),
    ];
    let mut c = [counters(100, 100), counters(101, 100), counters(200, 200)];
    for i in 0..6u64 {
        let t = START + i * tick;
        out.push(Record::CpuSample {
            ts_ns: t + 10 * MS,
            tid: 100,
            pid: 100,
            stack: 1,
        });
        out.push(Record::CpuSample {
            ts_ns: t + 20 * MS,
            tid: 101,
            pid: 100,
            stack: 2,
        });
        out.push(Record::OffCpuSample {
            ts_ns: t + 30 * MS,
            tid: 101,
            pid: 100,
            duration_ns: 20 * MS,
            io: true,
            stack: 2,
        });
        out.push(Record::BlockIo {
            ts_ns: t + 50 * MS,
            tid: 101,
            pid: 100,
            dev: (259 << 20) | 1,
            write: i % 3 == 2,
            sector: 2048 + 256 * i,
            bytes: 128 * 1024,
            queue_ns: 200_000,
            service_ns: 1_300_000,
        });
        if i == 2 {
            out.push(Record::Process {
                ts_ns: t,
                pid: 200,
                ppid: 100,
                cmdline: "python -c from multiprocessing.spawn import spawn_main".into(),
            });
            out.push(thread(200, 200, "pt_worker"));
        }
        if i >= 2 {
            out.push(Record::CpuSample {
                ts_ns: t + 40 * MS,
                tid: 200,
                pid: 200,
                stack: 3,
            });
            out.push(Record::BlockedIn {
                ts_ns: t + 60 * MS,
                tid: 200,
                call: "recvfrom".into(),
                detail: "socket TCP 127.0.0.1:5000 <- 127.0.0.1:40412".into(),
            });
            out.push(Record::WokenBy {
                ts_ns: t + 60 * MS,
                tid: 200,
                waker_tid: 0,
                waker_pid: 0,
                waker_comm: "swapper/1".into(),
                context: "network receive".into(),
            });
            out.push(Record::OffCpuSample {
                ts_ns: t + 60 * MS,
                tid: 200,
                pid: 200,
                duration_ns: 30 * MS,
                io: false,
                stack: 4,
            });
        }
        advance(&mut c[0], tick, [60, 5, 5, 30]);
        advance(&mut c[1], tick, [10, 2, 40, 48]);
        c[1].page_cache_misses += 100;
        c[1].page_cache_miss_bytes += 100 * 4096;
        let mut live = vec![c[0], c[1]];
        if i >= 2 {
            advance(&mut c[2], tick, [50, 10, 0, 40]);
            live.push(c[2]);
        }
        out.push(Record::Tick {
            ts_ns: t + tick,
            threads: live,
        });
    }
    out.extend([
        Record::ThreadExit {
            ts_ns: START + 620 * MS,
            counters: c[2],
        },
        Record::PageCacheFile {
            tid: 101,
            pid: 100,
            dev: (259 << 20) | 1,
            ino: 42,
            path: Some("/data/train.bin".into()),
            pages: 600,
            bytes: 600 * 4096,
        },
        Record::PageCacheFile {
            tid: 100,
            pid: 100,
            dev: (8 << 20) | 1,
            ino: 1234,
            path: None,
            pages: 3,
            bytes: 3 * 4096,
        },
        Record::Loss(EventLoss {
            kind: "sched".into(),
            attempted: 10_000,
            dropped: 10,
            received: 9_980,
        }),
        Record::Loss(EventLoss {
            kind: "block".into(),
            attempted: 6,
            dropped: 0,
            received: 6,
        }),
        Record::Unwinding(Box::new(UnwindStats {
            complete: 40,
            truncated: 3,
            failed: 1,
            by_frame_pointers: 4,
            by_dwarf: 40,
            without_copy: 0,
            dwarf_walks: 41,
            dwarf_ns: 2_000_000,
            warnings: vec!["/usr/lib/libstripped.so has no unwind information".into()],
        })),
        Record::PythonStacks(Box::new(PythonStats {
            processes: vec![(100, "3.11".into())],
            samples: 40,
            frames: 400,
            unreadable: 2,
            truncated: 1,
            warnings: vec!["python: PID 7 runs CPython 3.14".into()],
        })),
        Record::End {
            ts_ns: START + 650 * MS,
            reason: EndReason::TargetExited,
        },
    ]);
    out
}

/// A GPU job whose bottleneck moves from none to the DataLoader workers to the disk: GPU
/// utilization, device state and per-process utilization next to the host's ticks, so the
/// attribution labels windows and the per-cause flame graphs have stacks.
fn gpu_phases() -> Vec<Record> {
    let tick = 50 * MS;
    let period = 166 * MS;
    let (feeder, workers) = (100u32, [200u32, 201]);
    let mut out = vec![
        meta(feeder, tick),
        Record::Host { cpus: 4 },
        gpu(0, &[feeder]),
        thread(feeder, feeder, "python"),
        thread(workers[0], workers[0], "pt_data_worker"),
        thread(workers[1], workers[1], "pt_data_worker"),
        stack(0, &["main", "worker_loop", "decode_jpeg"]),
        stack(1, &["main", "read_sample", "io_schedule_[k]"]),
        stack(2, &["main", "train_step", "cuStreamSynchronize"]),
    ];
    // (until ms, GPU util, feeder fractions, worker fractions)
    let phases: [(u64, u32, [u64; 4], [u64; 4]); 3] = [
        (1000, 100, [95, 5, 0, 0], [20, 0, 0, 80]),
        (2000, 30, [30, 0, 0, 70], [95, 3, 0, 2]),
        (3000, 20, [20, 0, 0, 80], [10, 0, 80, 10]),
    ];
    let phase = |ms: u64| phases.iter().find(|p| ms < p.0).unwrap_or(&phases[2]);
    let mut c = [
        counters(feeder, feeder),
        counters(workers[0], workers[0]),
        counters(workers[1], workers[1]),
    ];
    let mut t = START;
    while t < START + 3000 * MS {
        let p = phase((t - START) / MS);
        advance(&mut c[0], tick, p.2);
        advance(&mut c[1], tick, p.3);
        advance(&mut c[2], tick, p.3);
        t += tick;
        out.push(Record::Tick {
            ts_ns: t,
            threads: c.to_vec(),
        });
        let ms = (t - START) / MS;
        out.push(Record::CpuSample {
            ts_ns: t - MS,
            tid: if ms < 1000 { feeder } else { workers[0] },
            pid: if ms < 1000 { feeder } else { workers[0] },
            stack: if ms < 1000 { 2 } else { 0 },
        });
        if ms >= 2000 {
            out.push(Record::OffCpuSample {
                ts_ns: t - 20 * MS,
                tid: workers[1],
                pid: workers[1],
                duration_ns: 15 * MS,
                io: true,
                stack: 1,
            });
            out.push(Record::BlockIo {
                ts_ns: t - 5 * MS,
                tid: workers[1],
                pid: workers[1],
                dev: (259 << 20) | 1,
                write: false,
                sector: ms * 8,
                bytes: 1 << 20,
                queue_ns: 3 * MS,
                service_ns: 9 * MS,
            });
        }
    }
    let mut s = START + period;
    while s <= START + 3000 * MS {
        let p = phase((s - period / 2 - START) / MS);
        out.push(Record::GpuUtil {
            gpu: 0,
            ts_ns: s,
            period_ns: period,
            util_pct: p.1,
        });
        out.push(Record::GpuProcessUtil {
            gpu: 0,
            ts_ns: s,
            pid: feeder,
            sm_pct: p.1,
            mem_pct: p.1 / 2,
        });
        if ((s - START) / period).is_multiple_of(3) {
            out.push(gpu_state(0, s, 5, p.1 < 50));
        }
        s += period;
    }
    out.push(Record::PageCacheFile {
        tid: workers[1],
        pid: workers[1],
        dev: (259 << 20) | 1,
        ino: 77,
        path: Some("/data/shard-0001.tar".into()),
        pages: 2560,
        bytes: 2560 * 4096,
    });
    out.push(Record::End {
        ts_ns: START + 3000 * MS,
        reason: EndReason::Duration,
    });
    out
}

/// The Python line a probed call was made from, written just before the call.
fn call_site(tid: u32, start_ns: u64) -> Record {
    Record::CudaCallSite {
        tid,
        start_ns,
        python: vec![
            "synchronize (torch/cuda/__init__.py:985)".into(),
            "train_step (train.py:57)".into(),
        ],
    }
}

fn call(tid: u32, start_ns: u64, dur_ns: u64, api: &str, op: CudaOp) -> Record {
    Record::CudaCall(Box::new(CudaCall {
        tid,
        pid: tid,
        start_ns,
        end_ns: start_ns + dur_ns,
        api: api.into(),
        op,
        status: 0,
        caller: "train_step".into(),
    }))
}

/// A feeder that stages pageable host-to-device copies and syncs, on a GPU whose PCIe link
/// trained down to gen 3: CUDA libraries, probes, calls of each kind, launch counts.
fn cuda_copies() -> Vec<Record> {
    let tick = 100 * MS;
    let period = 100 * MS;
    let feeder = 300u32;
    let mut out = vec![
        meta(feeder, tick),
        Record::Host { cpus: 16 },
        gpu(0, &[feeder]),
        thread(feeder, feeder, "python"),
        Record::Process {
            ts_ns: START,
            pid: feeder,
            ppid: 1,
            cmdline: "python train.py".into(),
        },
        Record::CudaLibrary {
            ts_ns: START,
            pid: feeder,
            path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
        },
        Record::CudaProbes {
            ts_ns: START,
            pid: feeder,
            path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            library: Library::Driver,
            attached: vec![
                "cuStreamSynchronize".into(),
                "cuMemcpyHtoDAsync_v2".into(),
                "cuMemHostAlloc".into(),
                "cuMemFreeHost".into(),
                "cuLaunchKernel".into(),
            ],
            missing: vec![("cuLaunchKernelEx".into(), "not in this driver".into())],
        },
        Record::CudaProbes {
            ts_ns: START + MS,
            pid: feeder,
            path: "/opt/venv/lib/libcudart.so.12".into(),
            library: Library::Runtime,
            attached: vec!["cudaMemcpyAsync".into(), "cudaDeviceSynchronize".into()],
            missing: Vec::new(),
        },
        stack(5, &["main", "train_step", "cudaMemcpyAsync", "memcpy"]),
        call(
            feeder,
            START + 2 * MS,
            MS,
            "cuMemHostAlloc",
            CudaOp::Pin {
                addr: 0x7f00_0000_0000,
                bytes: 64 << 20,
            },
        ),
    ];
    let mut c = counters(feeder, feeder);
    for i in 0..20u64 {
        let t = START + i * tick;
        let copy_api = if i % 2 == 0 {
            "cuMemcpyHtoDAsync_v2"
        } else {
            "cudaMemcpyAsync"
        };
        out.push(call(
            feeder,
            t + 5 * MS,
            60 * MS,
            copy_api,
            CudaOp::Copy {
                dir: if i % 2 == 0 {
                    CopyDir::HostToDevice
                } else {
                    CopyDir::Unknown
                },
                dst: 0x5_0000_0000,
                src: 0x1000 + i * 4096,
                bytes: 256 << 20,
                stream: 7,
                asynchronous: true,
            },
        ));
        out.push(call_site(feeder, t + 66 * MS));
        out.push(call(
            feeder,
            t + 66 * MS,
            20 * MS,
            if i % 5 == 4 {
                "cudaDeviceSynchronize"
            } else {
                "cuStreamSynchronize"
            },
            CudaOp::Sync {
                scope: if i % 5 == 4 {
                    SyncScope::Context
                } else {
                    SyncScope::Stream
                },
                handle: 7,
            },
        ));
        out.push(Record::CpuSample {
            ts_ns: t + 30 * MS,
            tid: feeder,
            pid: feeder,
            stack: 5,
        });
        out.push(Record::Launches {
            ts_ns: t + tick,
            probed_ns: tick / 10,
            counts: vec![LaunchCount {
                tid: feeder,
                pid: feeder,
                launches: 40 + i,
                api: "cuLaunchKernel".into(),
            }],
        });
        advance(&mut c, tick, [70, 5, 0, 25]);
        out.push(Record::Tick {
            ts_ns: t + tick,
            threads: vec![c],
        });
        out.push(Record::GpuUtil {
            gpu: 0,
            ts_ns: START + (i + 1) * period,
            period_ns: period,
            util_pct: 25,
        });
        if i % 4 == 0 {
            out.push(gpu_state(0, t + tick, 3, false));
        }
    }
    out.extend([
        call(
            feeder,
            START + 2000 * MS,
            MS,
            "cuMemFreeHost",
            CudaOp::Unpin {
                addr: 0x7f00_0000_0000,
            },
        ),
        Record::ThreadExit {
            ts_ns: START + 2001 * MS,
            counters: c,
        },
        Record::End {
            ts_ns: START + 2002 * MS,
            reason: EndReason::Signal,
        },
    ]);
    out
}

/// One rank of a two-rank NCCL job that waits in all-reduce: rank variables in the
/// environment, the communicator's creation, collectives in groups and the syncs that wait on
/// them.
fn nccl_rank() -> Vec<Record> {
    let tick = 100 * MS;
    let rank = 400u32;
    let mut out = vec![
        meta(rank, tick),
        Record::Host { cpus: 32 },
        gpu(0, &[rank]),
        gpu(1, &[]),
        thread(rank, rank, "python"),
        Record::ProcessEnv {
            pid: rank,
            vars: vec![
                ("RANK".into(), "1".into()),
                ("WORLD_SIZE".into(), "2".into()),
                ("LOCAL_RANK".into(), "1".into()),
                ("MASTER_ADDR".into(), "10.0.0.1".into()),
            ],
        },
        Record::CudaLibrary {
            ts_ns: START,
            pid: rank,
            path: "/usr/lib/libcuda.so.1".into(),
        },
        Record::CudaProbes {
            ts_ns: START,
            pid: rank,
            path: "/opt/venv/lib/libnccl.so.2".into(),
            library: Library::Nccl,
            attached: vec![
                "ncclAllReduce".into(),
                "ncclBroadcast".into(),
                "ncclGroupEnd".into(),
                "ncclCommInitRank".into(),
            ],
            missing: vec![("ncclSend".into(), "symbol not found".into())],
        },
        Record::CudaProbes {
            ts_ns: START,
            pid: rank,
            path: "/usr/lib/libcuda.so.1".into(),
            library: Library::Driver,
            attached: vec!["cuStreamSynchronize".into()],
            missing: Vec::new(),
        },
        call(
            rank,
            START + MS,
            40 * MS,
            "ncclCommInitRank",
            CudaOp::CommInit {
                comm: 0xc0ffee,
                nranks: 2,
                rank: 1,
                id: 0x1234_5678_9abc_def0,
            },
        ),
        call(
            rank,
            START + 45 * MS,
            MS,
            "ncclBroadcast",
            CudaOp::Collective {
                op: profiler_core::cuda::Collective::Broadcast,
                bytes: 1 << 20,
                comm: 0xc0ffee,
                stream: 9,
                peer: Some(0),
            },
        ),
        stack(6, &["main", "backward", "ncclAllReduce"]),
    ];
    let mut c = counters(rank, rank);
    for i in 1..15u64 {
        let t = START + i * tick;
        out.push(call(
            rank,
            t,
            MS / 10,
            "ncclAllReduce",
            CudaOp::Collective {
                op: profiler_core::cuda::Collective::AllReduce,
                bytes: 100 << 20,
                comm: 0xc0ffee,
                stream: 9,
                peer: None,
            },
        ));
        out.push(call(
            rank,
            t + MS,
            MS / 20,
            "ncclGroupEnd",
            CudaOp::GroupEnd,
        ));
        out.push(call(
            rank,
            t + 2 * MS,
            70 * MS,
            "cuStreamSynchronize",
            CudaOp::Sync {
                scope: SyncScope::Stream,
                handle: 9,
            },
        ));
        out.push(Record::CpuSample {
            ts_ns: t + 80 * MS,
            tid: rank,
            pid: rank,
            stack: 6,
        });
        advance(&mut c, tick, [25, 0, 0, 75]);
        out.push(Record::Tick {
            ts_ns: t + tick,
            threads: vec![c],
        });
        out.push(Record::GpuUtil {
            gpu: 0,
            ts_ns: t + tick,
            period_ns: tick,
            util_pct: 20,
        });
        out.push(Record::GpuProcessUtil {
            gpu: 0,
            ts_ns: t + tick,
            pid: rank,
            sm_pct: 18,
            mem_pct: 5,
        });
    }
    out.push(Record::End {
        ts_ns: START + 1500 * MS,
        reason: EndReason::Duration,
    });
    out
}

/// A frame whose crc matches but whose payload is a record kind from a newer writer.
fn unknown_frame() -> Vec<u8> {
    let payload = [250u8, 1, 7, 7, 7];
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    frame.extend_from_slice(&payload);
    frame
}

fn header(version: u16) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&[0, 0]);
    h
}

/// Every seed, by file name.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let cpu = encode(&cpu_io());
    let offsets = frames(&cpu);
    let last = *offsets.last().expect("frames");
    let middle = offsets[offsets.len() / 2];

    let mut unknown = encode(&cpu_io()[..8]);
    unknown.extend(unknown_frame());
    unknown.extend_from_slice(&encode(&cpu_io()[8..])[HEADER_LEN..]);

    let mut bad_crc_middle = cpu.clone();
    bad_crc_middle[middle + 8] ^= 0x55;
    let mut bad_crc_last = cpu.clone();
    let end = bad_crc_last.len() - 1;
    bad_crc_last[end] ^= 0xff;
    let mut huge_len_middle = cpu.clone();
    huge_len_middle[middle..middle + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut huge_len_last = cpu.clone();
    huge_len_last[last..last + 4].copy_from_slice(&(128u32 << 20).to_le_bytes());

    let header_only = header(1);
    assert_eq!(header_only, encode(&[]));
    let short_header = header_only[..7].to_vec();
    let mut frame_header_cut = header_only.clone();
    frame_header_cut.extend_from_slice(&cpu[HEADER_LEN..HEADER_LEN + 5]);

    vec![
        ("cpu-io", cpu.clone()),
        ("gpu-phases", encode(&gpu_phases())),
        ("cuda-copies", encode(&cuda_copies())),
        ("nccl-rank", encode(&nccl_rank())),
        ("unknown-kind", unknown),
        ("edge-empty", Vec::new()),
        ("edge-header-only", header_only),
        ("edge-short-header", short_header),
        ("edge-future-version", header(2)),
        (
            "edge-not-a-recording",
            b"\x7fELF\x02\x01\x01\0not a recording".to_vec(),
        ),
        ("edge-frame-header-cut", frame_header_cut),
        ("edge-payload-cut", cpu[..last + 8 + 3].to_vec()),
        ("edge-bad-crc-middle", bad_crc_middle),
        ("edge-bad-crc-last", bad_crc_last),
        ("edge-huge-length-middle", huge_len_middle),
        ("edge-huge-length-last", huge_len_last),
    ]
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for target in ["decode", "report"] {
        let out: PathBuf = dir.join(target);
        std::fs::create_dir_all(&out).expect("creating the corpus directory");
        for (name, bytes) in seeds() {
            assert!(
                bytes.len() < MAX_SEED_BYTES,
                "{name} is {} bytes, over the {MAX_SEED_BYTES} byte budget for a seed",
                bytes.len()
            );
            std::fs::write(out.join(name), &bytes).expect("writing a seed");
        }
    }
    for (name, bytes) in seeds() {
        println!("{:>6} bytes  {name}", bytes.len());
    }
}
