//! End to end: the simulated libcuda.so.1 runs work, and nvml-wrapper reads it back through the
//! simulated libnvidia-ml.so.1, as the profiler will.
//!
//! Needs the built libraries: run
//! `cargo build --release -p simgpu-cuda -p simgpu-nvml -p simgpu-nccl` first.
//! Each scenario runs in its own child process with its own state file (see `common`).
mod common;

use std::time::{Duration, Instant};

use common::cuda::{Cuda, Handle};
use common::{in_child, nvml, only_as_worker, realtime_us, spawn_worker, wait_for_line};
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, PcieUtilCounter, Sampling, TemperatureSensor};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use simgpu_state::PERIOD_NS;
use simgpu_state::clock::{boottime_ns, thread_cpu_ns};

const MS: u64 = 1_000_000;
const MIB: usize = 1 << 20;

fn value(sample: &nvml_wrapper::struct_wrappers::device::Sample) -> u32 {
    match sample.value {
        SampleValue::U32(v) => v,
        ref other => panic!("utilization samples are unsigned ints, got {other:?}"),
    }
}

/// Busy 400 ms (4 kernels of 100 ms), idle 400 ms, busy 400 ms; then NVML must show it.
/// (With 1/6 s sample periods a single 100 ms kernel can never fill a period, so each busy
/// phase is four back-to-back kernels: that guarantees fully busy and fully idle periods.)
#[test]
fn kernel_schedule_shows_in_nvml() {
    in_child("kernel_schedule_shows_in_nvml", &[], |paths| {
        let started_us = realtime_us();
        let cuda = Cuda::load(&paths.lib_dir);
        let ctx = cuda.ctx_create();
        let dptr = cuda.mem_alloc(8 * MIB);
        let pinned = cuda.host_alloc(MIB);
        // Data really moves: what goes in comes back.
        let pattern: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
        cuda.htod(dptr, &pattern);
        let mut back = vec![0u8; MIB];
        cuda.dtoh(&mut back, dptr);
        assert!(back == pattern, "DtoH returned other bytes than HtoD wrote");

        let spin = cuda.spin_function();
        let (e0, e1, e2, e3) = (
            cuda.event_create(),
            cuda.event_create(),
            cuda.event_create(),
            cuda.event_create(),
        );
        let stream = Handle::DEFAULT_STREAM;
        cuda.event_record(e0, stream);
        for _ in 0..4 {
            cuda.launch_spin(spin, 100 * MS, stream);
        }
        cuda.event_record(e1, stream);
        cuda.stream_sync(stream);
        let idle_from_us = realtime_us();
        std::thread::sleep(Duration::from_millis(400));
        let idle_to_us = realtime_us();
        cuda.event_record(e2, stream);
        for _ in 0..4 {
            cuda.launch_spin(spin, 100 * MS, stream);
        }
        cuda.event_record(e3, stream);
        cuda.ctx_sync();
        cuda.event_sync(e3);
        let busy_ms = cuda.elapsed_ms(e0, e1);
        assert!(
            (395.0..430.0).contains(&busy_ms),
            "4 x 100 ms kernels took {busy_ms} ms"
        );
        assert!(cuda.elapsed_ms(e1, e2) >= 395.0);
        assert!((395.0..430.0).contains(&cuda.elapsed_ms(e2, e3)));
        // Let the trailing idle sample period complete.
        std::thread::sleep(Duration::from_millis(400));

        let nvml = nvml(&paths.lib_dir);
        // A profiler finds the libraries by name in the maps: they must carry the real names.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            let path = paths.lib_dir.join(name);
            assert!(
                maps.contains(path.to_str().unwrap()),
                "{name} is not in the maps"
            );
        }
        assert_eq!(nvml.device_count().unwrap(), 1);
        assert_eq!(nvml.sys_driver_version().unwrap(), "580.65.06");
        let device = nvml.device_by_index(0).unwrap();
        assert_eq!(device.name().unwrap(), "stallscope simulated GPU");
        assert!(device.uuid().unwrap().starts_with("GPU-5eed"));
        assert_eq!(device.pci_info().unwrap().bus_id, "00000000:1B:00.0");

        let samples = device.samples(Sampling::GpuUtilization, None).unwrap();
        assert!(!samples.is_empty());
        let period_us = PERIOD_NS / 1000;
        for pair in samples.windows(2) {
            assert!(
                pair[1].timestamp > pair[0].timestamp,
                "samples are oldest first"
            );
            assert_eq!((pair[1].timestamp - pair[0].timestamp) % period_us, 0);
        }
        let stamps = started_us..realtime_us() + 1;
        assert!(
            samples.iter().all(|s| stamps.contains(&s.timestamp)),
            "realtime µs stamps"
        );
        assert!(
            samples.iter().any(|s| value(s) >= 99),
            "a fully busy period"
        );
        // The period after the one the first phase ended in is fully idle; it ends within the
        // 400 ms gap (2 periods are 333 ms).
        let idle_gap = idle_from_us + 1..idle_to_us + 1;
        assert!(
            samples
                .iter()
                .any(|s| idle_gap.contains(&s.timestamp) && value(s) == 0),
            "a fully idle period between the busy phases: {samples:?}"
        );
        let busy_ms: u64 = samples
            .iter()
            .map(|s| u64::from(value(s)) * period_us / 100_000)
            .sum();
        assert!(
            (760..=860).contains(&busy_ms),
            "samples add up to {busy_ms} ms busy"
        );

        // Idle now: nothing newer than the newest sample, which NVML reports as NotFound.
        let newest = samples.last().unwrap().timestamp;
        assert_eq!(
            value(samples.last().unwrap()),
            0,
            "activity ends with a 0% sample"
        );
        match device.samples(Sampling::GpuUtilization, newest) {
            Err(NvmlError::NotFound) => {}
            other => panic!("expected NotFound while idle, got {other:?}"),
        }
        // A cursor in the middle returns only the samples after it.
        let middle = samples[samples.len() / 2].timestamp;
        let after = device.samples(Sampling::GpuUtilization, middle).unwrap();
        assert_eq!(after.len(), samples.len() - samples.len() / 2 - 1);

        assert!(
            device
                .current_throttle_reasons()
                .unwrap()
                .contains(ThrottleReasons::GPU_IDLE)
        );
        assert_eq!(device.utilization_rates().unwrap().gpu, 0);
        assert_eq!(device.clock_info(Clock::SM).unwrap(), 345);
        assert_eq!(device.max_clock_info(Clock::SM).unwrap(), 1980);
        assert_eq!(device.clock_info(Clock::Memory).unwrap(), 2619);
        assert_eq!(device.power_usage().unwrap(), 100_000);
        assert_eq!(device.temperature(TemperatureSensor::Gpu).unwrap(), 35);
        assert_eq!(device.current_pcie_link_gen().unwrap(), 5);
        assert_eq!(device.current_pcie_link_width().unwrap(), 16);
        assert_eq!(device.max_pcie_link_gen().unwrap(), 5);
        assert_eq!(device.max_pcie_link_width().unwrap(), 16);

        let me = std::process::id();
        let procs = device.running_compute_processes().unwrap();
        let mine = procs
            .iter()
            .find(|p| p.pid == me)
            .expect("our pid is listed");
        assert_eq!(mine.used_gpu_memory, UsedGpuMemory::Used(8 * MIB as u64));
        let memory = device.memory_info().unwrap();
        assert_eq!((memory.total, memory.used), (80 << 30, 8 * MIB as u64));
        let per_process = device.process_utilization_stats(None).unwrap();
        assert!(per_process.iter().any(|s| s.pid == me && s.sm_util >= 99));
        assert!(per_process.iter().all(|s| s.pid == me));

        cuda.free_host(pinned);
        cuda.mem_free(dptr);
        cuda.ctx_destroy(ctx);
        assert!(device.running_compute_processes().unwrap().is_empty());
    });
}

/// While a kernel runs the device reads busy, and a host sync waits on-CPU.
#[test]
fn busy_device_reads_busy_and_syncs_spin() {
    in_child("busy_device_reads_busy_and_syncs_spin", &[], |paths| {
        let cuda = Cuda::load(&paths.lib_dir);
        let _ctx = cuda.ctx_create();
        let spin = cuda.spin_function();
        let stream = cuda.stream_create();
        cuda.launch_spin(spin, 900 * MS, stream);
        std::thread::sleep(Duration::from_millis(400));

        let nvml = nvml(&paths.lib_dir);
        let device = nvml.device_by_index(0).unwrap();
        assert_eq!(device.utilization_rates().unwrap().gpu, 100);
        assert!(
            !device
                .current_throttle_reasons()
                .unwrap()
                .contains(ThrottleReasons::GPU_IDLE)
        );
        assert_eq!(device.clock_info(Clock::Graphics).unwrap(), 1980);
        assert_eq!(device.power_usage().unwrap(), 700_000);
        assert_eq!(device.temperature(TemperatureSensor::Gpu).unwrap(), 70);
        // A kernel still running shows in the samples already.
        let samples = device.samples(Sampling::GpuUtilization, None).unwrap();
        assert!(samples.iter().any(|s| value(s) == 100));

        let (wall, cpu) = (Instant::now(), thread_cpu_ns());
        cuda.stream_sync(stream);
        let (wall_ns, cpu_ns) = (wall.elapsed().as_nanos() as u64, thread_cpu_ns() - cpu);
        assert!(
            wall_ns > 300 * MS,
            "the sync waited for the kernel ({wall_ns} ns)"
        );
        // Spinning, not sleeping: most of the wait is CPU time (leave room for a busy CI box).
        assert!(
            cpu_ns * 4 > wall_ns,
            "sync used {cpu_ns} ns CPU in {wall_ns} ns"
        );
    });
}

/// A degraded link (gen3 x4) shows in NVML and makes copies take bytes / bandwidth.
#[test]
fn degraded_link_slows_copies() {
    in_child(
        "degraded_link_slows_copies",
        &[("STALLSCOPE_SIMGPU_PCIE", "3,4")],
        |paths| {
            let cuda = Cuda::load(&paths.lib_dir);
            let _ctx = cuda.ctx_create();
            let nvml = nvml(&paths.lib_dir);
            let device = nvml.device_by_index(0).unwrap();
            assert_eq!(device.current_pcie_link_gen().unwrap(), 3);
            assert_eq!(device.current_pcie_link_width().unwrap(), 4);
            assert_eq!(device.max_pcie_link_gen().unwrap(), 5);
            assert_eq!(device.max_pcie_link_width().unwrap(), 16);

            let bytes = 64 * MIB;
            let dptr = cuda.mem_alloc(bytes);
            let pinned = cuda.host_alloc(bytes);
            let stream = cuda.stream_create();
            let expected_ms = bytes as f64 / (0.985e9 * 4.0 * 0.8) * 1e3;
            let mut readings = Vec::new();
            let mut took_ms = Vec::new();
            for _ in 0..3 {
                let start = Instant::now();
                // SAFETY: `pinned` stays allocated until after the sync below.
                unsafe { cuda.htod_async(dptr, pinned, bytes, stream) };
                cuda.stream_sync(stream);
                took_ms.push(start.elapsed().as_secs_f64() * 1e3);
                readings.push(device.pcie_throughput(PcieUtilCounter::Receive).unwrap());
            }
            // The first copy also faults in the device backing: judge the best of three.
            let best = took_ms.iter().copied().fold(f64::MAX, f64::min);
            assert!(
                (expected_ms * 0.8..expected_ms * 1.2).contains(&best),
                "64 MiB over gen3 x4 took {took_ms:?} ms, expected {expected_ms:.1}"
            );
            // KB/s over the last 20 ms: at most the link's rate, and seen by at least one reading.
            let link_kib_s = 0.985e9 * 4.0 * 0.8 / 1024.0;
            assert!(
                readings.iter().all(|r| f64::from(*r) <= link_kib_s * 1.05),
                "{readings:?}"
            );
            assert!(
                readings.iter().any(|r| f64::from(*r) > link_kib_s * 0.3),
                "{readings:?}"
            );

            // Retraining the link through the state crate is seen by NVML and by the next copy.
            // (Retrain down, not up: a copy never beats the host memcpy that moves its bytes,
            // so on a fast link a 64 MiB copy is bound by memory bandwidth, not by the link.)
            let shared = simgpu_state::SharedState::open(&paths.state, Default::default()).unwrap();
            let gpu = shared.device(0).unwrap();
            gpu.set_pcie_link(simgpu_state::PcieLink::new(1, 4).unwrap());
            assert_eq!(device.current_pcie_link_gen().unwrap(), 1);
            assert_eq!(device.current_pcie_link_width().unwrap(), 4);
            let start = Instant::now();
            // SAFETY: as above.
            unsafe { cuda.htod_async(dptr, pinned, bytes, stream) };
            cuda.stream_sync(stream);
            let gen1_ms = start.elapsed().as_secs_f64() * 1e3;
            let expected_gen1_ms = bytes as f64 / (0.25e9 * 4.0 * 0.8) * 1e3;
            assert!(
                (expected_gen1_ms * 0.8..expected_gen1_ms * 1.2).contains(&gen1_ms),
                "64 MiB over gen1 x4 took {gen1_ms:.1} ms, expected {expected_gen1_ms:.1}"
            );
            cuda.free_host(pinned);
        },
    );
}

/// A pageable source is staged by a CPU memcpy on the calling thread; a pinned one is not. The
/// staging also makes a pageable copy take longer from call to completion.
#[test]
fn pageable_copies_cost_the_calling_thread() {
    in_child("pageable_copies_cost_the_calling_thread", &[], |paths| {
        let cuda = Cuda::load(&paths.lib_dir);
        let _ctx = cuda.ctx_create();
        let bytes = 64 * MIB;
        let dptr = cuda.mem_alloc(bytes);
        let stream = cuda.stream_create();
        let pageable: Vec<u8> = (0..bytes).map(|i| (i % 241) as u8).collect();
        let pinned = cuda.host_alloc(bytes);
        // SAFETY: `pinned` holds `bytes` bytes and nothing else uses it yet.
        unsafe { std::ptr::copy_nonoverlapping(pageable.as_ptr(), pinned, bytes) };
        // (CPU ns of the call, wall ns from the call to the end of the sync)
        let cost_of = |src: *const u8| {
            let (cpu, wall) = (thread_cpu_ns(), Instant::now());
            // SAFETY: both sources outlive the stream sync that follows.
            unsafe { cuda.htod_async(dptr, src, bytes, stream) };
            let used = thread_cpu_ns() - cpu;
            cuda.stream_sync(stream);
            (used, wall.elapsed().as_nanos() as u64)
        };
        let best = |src: *const u8| {
            let (a, b, c) = (cost_of(src), cost_of(src), cost_of(src));
            (a.0.min(b.0).min(c.0), a.1.min(b.1).min(c.1))
        };
        // Warm up the device backing, then measure each kind three times and keep the minimum.
        cost_of(pinned);
        let (pageable_ns, pageable_wall) = best(pageable.as_ptr());
        let (pinned_ns, pinned_wall) = best(pinned);
        let gb_s = |ns: u64| bytes as f64 / ns as f64;
        eprintln!(
            "64 MiB HtoD: pageable {:.2} GB/s, pinned {:.2} GB/s (gen5 x16)",
            gb_s(pageable_wall),
            gb_s(pinned_wall)
        );
        assert!(
            pageable_ns > 2 * MS && pageable_ns > 20 * pinned_ns,
            "pageable HtoD cost {pageable_ns} ns CPU, pinned {pinned_ns} ns"
        );
        assert!(
            pageable_wall * 10 > pinned_wall * 14,
            "pageable HtoD took {pageable_wall} ns, pinned {pinned_wall} ns"
        );
        let mut back = vec![0u8; bytes];
        cuda.dtoh(&mut back, dptr);
        assert!(back == pageable);
        cuda.free_host(pinned);
    });
}

/// `STALLSCOPE_SIMGPU_DEVICES=3`: three GPUs, each with its own identity, timeline, processes
/// and memory; the PCIe setting applies to all of them.
#[test]
fn several_gpus_enumerate_and_keep_apart() {
    in_child(
        "several_gpus_enumerate_and_keep_apart",
        &[
            ("STALLSCOPE_SIMGPU_DEVICES", "3"),
            ("STALLSCOPE_SIMGPU_PCIE", "4,8"),
        ],
        |paths| {
            let cuda = Cuda::load(&paths.lib_dir);
            assert_eq!(cuda.device_count(), 3);
            assert_eq!(cuda.device_get_code(3), 101, "CUDA_ERROR_INVALID_DEVICE");
            let _ctx = cuda.ctx_create_on(1);
            assert_eq!(cuda.ctx_device(), 1);
            let _dptr = cuda.mem_alloc(2 * MIB);
            let spin = cuda.spin_function();
            cuda.launch_spin(spin, 400 * MS, Handle::DEFAULT_STREAM);
            cuda.ctx_sync();
            std::thread::sleep(Duration::from_millis(200));

            let nvml = nvml(&paths.lib_dir);
            assert_eq!(nvml.device_count().unwrap(), 3);
            let devices: Vec<_> = (0..3).map(|i| nvml.device_by_index(i).unwrap()).collect();
            assert!(matches!(
                nvml.device_by_index(3),
                Err(NvmlError::InvalidArg)
            ));
            let uuids: std::collections::HashSet<String> =
                devices.iter().map(|d| d.uuid().unwrap()).collect();
            assert_eq!(uuids.len(), 3, "{uuids:?}");
            let buses: Vec<String> = devices
                .iter()
                .map(|d| d.pci_info().unwrap().bus_id)
                .collect();
            assert_eq!(buses[0], "00000000:1B:00.0");
            assert_eq!(buses[1], "00000000:43:00.0");
            assert_ne!(buses[1], buses[2]);
            for (i, d) in devices.iter().enumerate() {
                assert_eq!(d.index().unwrap(), i as u32);
                assert_eq!(d.name().unwrap(), "stallscope simulated GPU");
                assert_eq!(d.current_pcie_link_gen().unwrap(), 4);
                assert_eq!(d.current_pcie_link_width().unwrap(), 8);
                assert_eq!(d.max_pcie_link_gen().unwrap(), 5);
            }

            let me = std::process::id();
            let on = |i: usize| {
                let procs = devices[i].running_compute_processes().unwrap();
                procs.iter().any(|p| p.pid == me)
            };
            assert!(on(1) && !on(0) && !on(2), "our context is on GPU 1 only");
            assert_eq!(devices[1].memory_info().unwrap().used, 2 * MIB as u64);
            assert_eq!(devices[0].memory_info().unwrap().used, 0);
            let busy = devices[1].samples(Sampling::GpuUtilization, None).unwrap();
            assert!(busy.iter().any(|s| value(s) >= 99), "{busy:?}");
            assert!(matches!(
                devices[0].samples(Sampling::GpuUtilization, None),
                Err(NvmlError::NotFound)
            ));
            let per_process = devices[1].process_utilization_stats(None).unwrap();
            assert!(per_process.iter().any(|s| s.pid == me && s.sm_util >= 99));

            // A link retrained on one GPU leaves the others alone.
            let shared = simgpu_state::SharedState::open(&paths.state, Default::default()).unwrap();
            let gpu2 = shared.device(2).unwrap();
            gpu2.set_pcie_link(simgpu_state::PcieLink::new(1, 1).unwrap());
            assert_eq!(devices[2].current_pcie_link_gen().unwrap(), 1);
            assert_eq!(devices[1].current_pcie_link_gen().unwrap(), 4);
        },
    );
}

/// Missing symbols and a missing library fail the way nvml-wrapper reports them.
#[test]
fn missing_pieces_fail_as_nvml_wrapper_expects() {
    let missing = std::env::temp_dir().join("simgpu-nowhere/libnvidia-ml.so.1");
    match Nvml::builder().lib_path(missing.as_os_str()).init() {
        Err(NvmlError::LibloadingError(_)) => {}
        other => panic!("expected LibloadingError, got {:?}", other.map(|_| ())),
    }
    in_child(
        "missing_pieces_fail_as_nvml_wrapper_expects",
        &[],
        |paths| {
            let nvml = nvml(&paths.lib_dir);
            let device = nvml.device_by_index(0).unwrap();
            match device.fan_speed(0) {
                Err(NvmlError::FailedToLoadSymbol(symbol)) => {
                    assert!(symbol.contains("nvmlDeviceGetFanSpeed_v2"), "{symbol}");
                }
                other => panic!("expected FailedToLoadSymbol, got {other:?}"),
            }
            assert!(matches!(
                nvml.device_by_index(1),
                Err(NvmlError::InvalidArg)
            ));
            // An idle device has no samples at all.
            assert!(matches!(
                device.samples(Sampling::GpuUtilization, None),
                Err(NvmlError::NotFound)
            ));
            assert!(matches!(
                device.process_utilization_stats(None),
                Err(NvmlError::NotFound)
            ));
            assert!(device.running_compute_processes().unwrap().is_empty());
            // Shutdown through Drop must not panic, and an explicit one works too.
            nvml.shutdown().unwrap();
        },
    );
}

/// `STALLSCOPE_SIMGPU_SAMPLE_CLOCK=boot` stamps samples with CLOCK_BOOTTIME µs.
#[test]
fn boot_clock_sample_stamps() {
    in_child(
        "boot_clock_sample_stamps",
        &[("STALLSCOPE_SIMGPU_SAMPLE_CLOCK", "boot")],
        |paths| {
            let cuda = Cuda::load(&paths.lib_dir);
            let _ctx = cuda.ctx_create();
            let spin = cuda.spin_function();
            let before_us = boottime_ns() / 1000;
            cuda.launch_spin(spin, 200 * MS, Handle::DEFAULT_STREAM);
            cuda.ctx_sync();
            std::thread::sleep(Duration::from_millis(400));
            let nvml = nvml(&paths.lib_dir);
            let device = nvml.device_by_index(0).unwrap();
            let samples = device.samples(Sampling::GpuUtilization, None).unwrap();
            let now_us = boottime_ns() / 1000;
            assert!(
                samples
                    .iter()
                    .all(|s| (before_us..=now_us).contains(&s.timestamp)),
                "boot-clock stamps in [{before_us}, {now_us}]: {samples:?}"
            );
            let per_process = device.process_utilization_stats(None).unwrap();
            assert!(
                per_process
                    .iter()
                    .all(|s| (before_us..=now_us).contains(&s.timestamp))
            );
        },
    );
}

/// Another process's context, memory and kernels show in NVML; its slot goes when it exits
/// normally, and when it is killed.
#[test]
fn other_processes_show_and_leave() {
    in_child("other_processes_show_and_leave", &[], |paths| {
        let nvml = nvml(&paths.lib_dir);
        let device = nvml.device_by_index(0).unwrap();
        let listed = |pid: u32| {
            let procs = device.running_compute_processes().unwrap();
            procs.into_iter().find(|p| p.pid == pid)
        };

        let mut worker = spawn_worker("worker_holds_a_context");
        wait_for_line(&mut worker, WORKER_READY);
        let pid = worker.id();
        let info = listed(pid).expect("the worker is listed");
        assert_eq!(info.used_gpu_memory, UsedGpuMemory::Used(4 * MIB as u64));
        let samples = device.samples(Sampling::GpuUtilization, None).unwrap();
        assert!(samples.iter().any(|s| value(s) == 100), "{samples:?}");
        let per_process = device.process_utilization_stats(None).unwrap();
        assert!(per_process.iter().any(|s| s.pid == pid && s.sm_util == 100));
        drop(worker.stdin.take());
        assert!(worker.wait().unwrap().success());
        assert!(listed(pid).is_none(), "a worker that exited is gone");

        let mut worker = spawn_worker("worker_holds_a_context");
        wait_for_line(&mut worker, WORKER_READY);
        let pid = worker.id();
        assert!(listed(pid).is_some());
        worker.kill().unwrap();
        worker.wait().unwrap();
        assert!(listed(pid).is_none(), "a killed worker is reaped");
    });
}

const WORKER_READY: &str = "simgpu-worker-ready";

/// Worker for `other_processes_show_and_leave`: a context, 4 MiB and a 400 ms kernel, then it
/// waits for stdin to close.
#[test]
fn worker_holds_a_context() {
    only_as_worker("worker_holds_a_context", |paths| {
        let cuda = Cuda::load(&paths.lib_dir);
        let _ctx = cuda.ctx_create();
        let _dptr = cuda.mem_alloc(4 * MIB);
        let spin = cuda.spin_function();
        cuda.launch_spin(spin, 400 * MS, Handle::DEFAULT_STREAM);
        cuda.ctx_sync();
        // The kernel's sample period has to end before the observer looks.
        std::thread::sleep(Duration::from_millis(200));
        println!("{WORKER_READY}");
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut rest);
    });
}
