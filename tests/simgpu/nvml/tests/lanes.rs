//! Concurrent lanes through the C ABI: the comm engine's kernels beside the compute engine's,
//! cuStreamWaitEvent across them, GPM's SM activity through nvml-wrapper, and a throttled GPU.
//!
//! Needs the built libraries: run
//! `cargo build --release -p simgpu-cuda -p simgpu-nvml -p simgpu-nccl` first.
//! Each scenario runs in its own child process with its own state file (see `common`).
mod common;

use std::time::{Duration, Instant};

use common::cuda::{Cuda, Handle};
use common::{in_child, nvml};
use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;

const MS: u64 = 1_000_000;
const MIB: usize = 1 << 20;
/// CUresult CUDA_ERROR_NOT_READY.
const NOT_READY: u32 = 600;

/// K1 on the comm engine (stream A), an event E after it, B told to wait for E: B's next kernel
/// starts only when K1 ends, while C's kernel, queued before it, runs beside K1.
#[test]
fn stream_wait_event_orders_work_across_engines() {
    in_child(
        "stream_wait_event_orders_work_across_engines",
        &[],
        |paths| {
            let cuda = Cuda::load(&paths.lib_dir);
            let _ctx = cuda.ctx_create();
            let spin = cuda.spin_function();
            let (a, b, c) = (
                cuda.stream_create(),
                cuda.stream_create(),
                cuda.stream_create(),
            );
            let [start, e, k2_end, k3_end, k4_end] = [(); 5].map(|_| cuda.event_create());
            cuda.event_record(start, c);
            // K1: a comm-lane kernel of 300 ms.
            cuda.launch_comm(300 * MS, 15, a);
            cuda.event_record(e, a);
            cuda.stream_wait_event(b, e);
            assert_eq!(
                cuda.stream_query(b),
                NOT_READY,
                "B's only pending thing is the wait, and K1 still runs"
            );
            // K3 on C, queued before K2: the compute engine runs it at once, beside K1.
            cuda.launch_spin(spin, 100 * MS, c);
            cuda.event_record(k3_end, c);
            // K2 on B waits for K1.
            cuda.launch_spin(spin, 100 * MS, b);
            cuda.event_record(k2_end, b);
            // K4 on C, queued after K2: the process's kernels share one compute engine, in
            // submission order, so it runs after K2 (a real GPU would run it at once).
            cuda.launch_spin(spin, 50 * MS, c);
            cuda.event_record(k4_end, c);
            cuda.ctx_sync();
            let at = |event| cuda.elapsed_ms(start, event);
            let (k1, k2, k3, k4) = (at(e), at(k2_end), at(k3_end), at(k4_end));
            eprintln!("K1 ends {k1} ms, K3 {k3}, K2 {k2}, K4 {k4}");
            assert!((295.0..340.0).contains(&k1), "K1 ended at {k1} ms");
            assert!(
                (95.0..140.0).contains(&k3),
                "K3 ran beside K1, not delayed by B's wait: ended at {k3} ms"
            );
            assert!(
                (k1 + 95.0..k1 + 140.0).contains(&k2),
                "K2 started when K1 ended ({k1} ms): ended at {k2} ms"
            );
            assert!(k4 >= k2 + 45.0, "K4 queued behind K2: ended at {k4} ms");
            assert_eq!(cuda.stream_query(b), 0);

            // A sync of a stream whose only pending thing is a waited event waits for the event.
            let e2 = cuda.event_create();
            cuda.launch_comm(200 * MS, 15, a);
            cuda.event_record(e2, a);
            cuda.stream_wait_event(b, e2);
            let t = Instant::now();
            cuda.stream_sync(b);
            let waited = t.elapsed();
            assert!(
                waited >= Duration::from_millis(190),
                "synced after {waited:?}"
            );
            // An event never recorded is no work: waiting for it is a no-op, as in CUDA.
            let never = cuda.event_create();
            cuda.stream_wait_event(b, never);
            assert_eq!(cuda.stream_query(b), 0);
        },
    );
}

/// GPM samples around `work` that leave at least `window` between them: (graphics activity,
/// SM activity, SM occupancy) in percent, and the wall time between the samples in ms.
fn gpm_window(
    nvml: &Nvml,
    device: &Device<'_>,
    window: Duration,
    work: impl FnOnce(),
) -> (f64, f64, f64, f64) {
    let s1 = device.gpm_sample().expect("a GPM sample");
    let t = Instant::now();
    work();
    if let Some(left) = window.checked_sub(t.elapsed()) {
        std::thread::sleep(left);
    }
    let s2 = device.gpm_sample().expect("a GPM sample");
    let wall_ms = t.elapsed().as_secs_f64() * 1e3;
    let ids = [
        GpmMetricId::GraphicsUtil,
        GpmMetricId::SmUtil,
        GpmMetricId::SmOccupancy,
    ];
    let results = gpm_metrics_get(nvml, &s1, &s2, &ids).expect("GPM metrics");
    let values: Vec<f64> = results
        .into_iter()
        .map(|r| r.expect("a modelled metric").value)
        .collect();
    (values[0], values[1], values[2], wall_ms)
}

/// SM activity is each kernel's share times its busy time: 90% for compute kernels, 15% for
/// the comm kernel, their sum when both run; occupancy is half of it.
#[test]
fn gpm_sm_activity_follows_kernel_shares() {
    in_child("gpm_sm_activity_follows_kernel_shares", &[], |paths| {
        let cuda = Cuda::load(&paths.lib_dir);
        let _ctx = cuda.ctx_create();
        let spin = cuda.spin_function();
        let (compute, comm) = (cuda.stream_create(), cuda.stream_create());
        let nvml = nvml(&paths.lib_dir);
        let device = nvml.device_by_index(0).unwrap();
        assert!(device.gpm_support().unwrap());
        let window = Duration::from_millis(400);
        let check = |what: &str, share: f64, (gr, sm, occ, wall_ms): (f64, f64, f64, f64)| {
            eprintln!(
                "{what}: graphics {gr:.1}%, SM {sm:.1}%, occupancy {occ:.1}% of {wall_ms:.0} ms"
            );
            let expected_gr = 200.0 / wall_ms * 100.0;
            assert!(
                (gr - expected_gr).abs() < 5.0,
                "{what}: busy {gr}%, 200 ms of {wall_ms} ms is {expected_gr}%"
            );
            // Each kernel adds its share of its own 200 ms, however much the two overlapped (a
            // loaded machine may start the second launch late, which widens the busy union).
            assert!(
                (sm - share * expected_gr).abs() < 1.0,
                "{what}: SM activity {sm}% at a {share} share of 200 ms in {wall_ms} ms"
            );
            assert!((occ - sm * 0.5).abs() < 1e-9, "{what}: occupancy {occ}%");
        };
        let compute_only = gpm_window(&nvml, &device, window, || {
            cuda.launch_spin(spin, 200 * MS, compute);
            cuda.stream_sync(compute);
        });
        check("compute kernel", 0.90, compute_only);
        let comm_only = gpm_window(&nvml, &device, window, || {
            cuda.launch_comm(200 * MS, 15, comm);
            cuda.stream_sync(comm);
        });
        check("comm kernel", 0.15, comm_only);
        // Both lanes at once: busy counts once, SM activity adds up.
        let both = gpm_window(&nvml, &device, window, || {
            cuda.launch_comm(200 * MS, 15, comm);
            cuda.launch_spin(spin, 200 * MS, compute);
            cuda.ctx_sync();
        });
        check("both lanes", 1.05, both);

        // Names come with the values; what is not modelled fails on its own; samples under
        // 100 ms apart are refused.
        let s1 = device.gpm_sample().unwrap();
        let s2 = device.gpm_sample().unwrap();
        assert!(matches!(
            gpm_metrics_get(&nvml, &s1, &s2, &[GpmMetricId::SmUtil]),
            Err(NvmlError::InvalidArg)
        ));
        std::thread::sleep(Duration::from_millis(120));
        let s3 = device.gpm_sample().unwrap();
        let ids = [GpmMetricId::SmUtil, GpmMetricId::AnyTensorUtil];
        let results = gpm_metrics_get(&nvml, &s1, &s3, &ids).unwrap();
        let sm = results[0].as_ref().unwrap();
        assert_eq!(sm.metric_id, GpmMetricId::SmUtil);
        assert_eq!(sm.metric_info.short_name, "sm_util");
        assert_eq!(sm.metric_info.unit, "%");
        assert_eq!(sm.value, 0.0, "idle");
        assert!(matches!(results[1], Err(NvmlError::NotSupported)));
        s1.free().unwrap();
    });
}

/// PCIe bytes per second over the window, in MiB/s as NVML documents (RX is host to device).
#[test]
fn gpm_pcie_rates_count_copied_bytes() {
    in_child(
        "gpm_pcie_rates_count_copied_bytes",
        &[("STALLSCOPE_SIMGPU_PCIE", "3,4")],
        |paths| {
            let cuda = Cuda::load(&paths.lib_dir);
            let _ctx = cuda.ctx_create();
            let bytes = 64 * MIB;
            let dptr = cuda.mem_alloc(bytes);
            let pinned = cuda.host_alloc(bytes);
            let stream = cuda.stream_create();
            let nvml = nvml(&paths.lib_dir);
            let device = nvml.device_by_index(0).unwrap();
            let s1 = device.gpm_sample().unwrap();
            let t = Instant::now();
            // SAFETY: `pinned` stays allocated until after the sync.
            unsafe { cuda.htod_async(dptr, pinned, bytes, stream) };
            cuda.stream_sync(stream);
            std::thread::sleep(Duration::from_millis(300));
            let s2 = device.gpm_sample().unwrap();
            let wall_s = t.elapsed().as_secs_f64();
            let ids = [GpmMetricId::PcieRxPerSec, GpmMetricId::PcieTxPerSec];
            let r = gpm_metrics_get(&nvml, &s1, &s2, &ids).unwrap();
            let (rx, tx) = (r[0].as_ref().unwrap(), r[1].as_ref().unwrap());
            let expected = 64.0 / wall_s;
            assert!(
                (rx.value - expected).abs() < expected * 0.1,
                "RX {} MiB/s, 64 MiB in {wall_s} s is {expected}",
                rx.value
            );
            assert_eq!(rx.metric_info.unit, "MiB/sec");
            assert_eq!(tx.value, 0.0);
            cuda.free_host(pinned);
        },
    );
}

/// `STALLSCOPE_SIMGPU_SM_SHARE=50`: compute kernels keep half the SMs active.
#[test]
fn sm_share_setting_scales_compute_kernels() {
    in_child(
        "sm_share_setting_scales_compute_kernels",
        &[("STALLSCOPE_SIMGPU_SM_SHARE", "50")],
        |paths| {
            let cuda = Cuda::load(&paths.lib_dir);
            let _ctx = cuda.ctx_create();
            let spin = cuda.spin_function();
            let nvml = nvml(&paths.lib_dir);
            let device = nvml.device_by_index(0).unwrap();
            let (gr, sm, _, _) = gpm_window(&nvml, &device, Duration::from_millis(300), || {
                cuda.launch_spin(spin, 150 * MS, Handle::DEFAULT_STREAM);
                cuda.ctx_sync();
            });
            assert!(gr > 30.0, "busy {gr}%");
            assert!((sm - gr * 0.5).abs() < 1.0, "SM {sm}% of {gr}% busy");
        },
    );
}

/// `STALLSCOPE_SIMGPU_GPM=0`: a pre-Hopper card, without GPM.
#[test]
fn gpm_off_is_a_pre_hopper_card() {
    in_child(
        "gpm_off_is_a_pre_hopper_card",
        &[("STALLSCOPE_SIMGPU_GPM", "0")],
        |paths| {
            let nvml = nvml(&paths.lib_dir);
            let device = nvml.device_by_index(0).unwrap();
            assert!(!device.gpm_support().unwrap());
            assert!(matches!(device.gpm_sample(), Err(NvmlError::NotSupported)));
            // The rest of NVML is unaffected.
            assert_eq!(device.utilization_rates().unwrap().gpu, 0);
        },
    );
}

/// `STALLSCOPE_SIMGPU_THROTTLE=0:2`: kernels take twice as long, NVML shows half the SM clock
/// and the slowdown reasons; lifting the throttle through `simgpu-state` ends all of it.
#[test]
fn a_throttled_gpu_runs_kernels_slower() {
    in_child(
        "a_throttled_gpu_runs_kernels_slower",
        &[("STALLSCOPE_SIMGPU_THROTTLE", "0:2")],
        |paths| {
            let cuda = Cuda::load(&paths.lib_dir);
            let _ctx = cuda.ctx_create();
            let spin = cuda.spin_function();
            let stream = cuda.stream_create();
            let nvml = nvml(&paths.lib_dir);
            let device = nvml.device_by_index(0).unwrap();
            let slowdown = ThrottleReasons::SW_THERMAL_SLOWDOWN | ThrottleReasons::HW_SLOWDOWN;
            let timed = |ns: u64| {
                let (e0, e1) = (cuda.event_create(), cuda.event_create());
                cuda.event_record(e0, stream);
                cuda.launch_spin(spin, ns, stream);
                cuda.event_record(e1, stream);
                std::thread::sleep(Duration::from_millis(50));
                let reading = (
                    device.clock_info(Clock::SM).unwrap(),
                    device.current_throttle_reasons().unwrap(),
                );
                cuda.stream_sync(stream);
                (cuda.elapsed_ms(e0, e1), reading)
            };
            let (slow_ms, (mhz, reasons)) = timed(100 * MS);
            assert!(
                (195.0..240.0).contains(&slow_ms),
                "a 100 ms kernel took {slow_ms} ms at factor 2"
            );
            assert_eq!(mhz, 990);
            assert!(reasons.contains(slowdown), "{reasons:?}");
            assert!(!reasons.contains(ThrottleReasons::GPU_IDLE));

            let shared = simgpu_state::SharedState::open(&paths.state, Default::default()).unwrap();
            shared.device(0).unwrap().set_throttle(1.0);
            let (ms, (mhz, reasons)) = timed(100 * MS);
            assert!((95.0..140.0).contains(&ms), "unthrottled: {ms} ms");
            assert_eq!(mhz, 1980);
            assert!(!reasons.intersects(slowdown), "{reasons:?}");
        },
    );
}
