//! The GPU side: an NVML sampler on its own thread (NVML calls can block for milliseconds),
//! sending utilization samples and device state to the session as recording records.
//!
//! NVML's utilization samples are the idle signal. While a GPU is idle NVML produces no new
//! samples (`NotFound` for a cursor at the newest one), so gaps between samples are recorded
//! as 0% samples: idle, not missing.
use std::{
    collections::BTreeSet,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, Sender, channel},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use nvml_wrapper::{
    Device, Nvml,
    enum_wrappers::device::{Clock, PcieUtilCounter, Sampling, TemperatureSensor},
    enums::{device::SampleValue, gpm::GpmMetricId},
    error::NvmlError,
    gpm::{GpmSample, gpm_metrics_get},
};
use profiler_core::{
    clock::{ClockReadings, NvmlClock},
    record::{GpuInfo, GpuState, Record},
};

pub const NVML_LIB_ENV: &str = "STALLSCOPE_NVML_LIB";
const DEFAULT_LIB: &str = "libnvidia-ml.so.1";
/// NVML's sample period on data-center GPUs; replaced by the measured spacing.
const DEFAULT_PERIOD_NS: u64 = 166_667_000;
const STATE_EVERY: Duration = Duration::from_millis(500);

pub fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn readings() -> ClockReadings {
    ClockReadings {
        realtime_ns: clock_ns(libc::CLOCK_REALTIME),
        boottime_ns: clock_ns(libc::CLOCK_BOOTTIME),
        monotonic_ns: clock_ns(libc::CLOCK_MONOTONIC),
    }
}

pub struct GpuSampler {
    rx: Receiver<Record>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

/// The NVML library to load: `lib`, else $STALLSCOPE_NVML_LIB, else libnvidia-ml.so.1.
fn nvml_path(lib: Option<PathBuf>) -> PathBuf {
    lib.or_else(|| std::env::var_os(NVML_LIB_ENV).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LIB))
}

/// Every process NVML lists as computing on any of this host's GPUs.
pub fn all_gpu_processes(lib: Option<PathBuf>) -> anyhow::Result<Vec<u32>> {
    let lib = nvml_path(lib);
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .map_err(|e| anyhow::anyhow!("--all-gpu-processes needs NVML ({}): {e}", lib.display()))?;
    let mut pids = Vec::new();
    for i in 0..nvml.device_count()? {
        let d = nvml.device_by_index(i)?;
        pids.extend(d.running_compute_processes()?.into_iter().map(|p| p.pid));
    }
    pids.sort_unstable();
    pids.dedup();
    if pids.is_empty() {
        anyhow::bail!("--all-gpu-processes: NVML lists no compute process on this host's GPUs");
    }
    Ok(pids)
}

impl GpuSampler {
    /// Starts sampling. `lib` overrides the library path (see [`nvml_path`]); `pids` is the
    /// traced tree, kept current by the session.
    pub fn start(lib: Option<PathBuf>, pids: Arc<Mutex<BTreeSet<u32>>>, start_ns: u64) -> Self {
        let lib = nvml_path(lib);
        let (tx, rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let handle = std::thread::Builder::new()
            .name("stallscope-nvml".into())
            .spawn(move || run(lib, pids, start_ns, tx, thread_stop))
            .ok();
        Self { rx, stop, handle }
    }

    /// Records produced since the last call.
    pub fn drain(&self) -> Vec<Record> {
        self.rx.try_iter().collect()
    }

    /// Stops the sampler and returns its last records.
    pub fn stop(mut self) -> Vec<Record> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.drain()
    }
}

/// Per-device sampling state.
struct Watched {
    index: u32,
    info: GpuInfo,
    clock: Option<NvmlClock>,
    /// NVML's cursor: the newest sample timestamp seen, on NVML's clock (µs).
    cursor_us: u64,
    /// End of the last sample written, CLOCK_MONOTONIC ns.
    last_ns: u64,
    period_ns: u64,
    proc_cursor_us: u64,
    use_rates: bool,
    period_known: bool,
}

fn run(
    lib: PathBuf,
    pids: Arc<Mutex<BTreeSet<u32>>>,
    start_ns: u64,
    tx: Sender<Record>,
    stop: Arc<AtomicBool>,
) {
    let nvml = match Nvml::builder().lib_path(lib.as_os_str()).init() {
        Ok(n) => n,
        Err(e) => {
            let reason = format!(
                "NVML could not be loaded from {} ({e}); host-side report only",
                lib.display()
            );
            eprintln!("stallscope: note: {reason}");
            let _ = tx.send(Record::Unavailable {
                signal: "gpu".into(),
                reason,
            });
            return;
        }
    };
    let driver = nvml.sys_driver_version().unwrap_or_default();
    let count = nvml.device_count().unwrap_or(0);
    let mut watched: Vec<Watched> = (0..count)
        .filter_map(|i| {
            let d = nvml.device_by_index(i).ok()?;
            Some(Watched {
                index: i,
                info: describe(&d, i, &driver),
                clock: None,
                cursor_us: 0,
                last_ns: start_ns,
                period_ns: DEFAULT_PERIOD_NS,
                proc_cursor_us: 0,
                use_rates: false,
                period_known: false,
            })
        })
        .collect();
    if watched.is_empty() {
        let _ = tx.send(Record::Unavailable {
            signal: "gpu".into(),
            reason: "NVML found no GPU".into(),
        });
        return;
    }
    let mut announced = false;
    let mut last_state = Instant::now() - STATE_EVERY;
    // GPM needs two samples at least 100 ms apart; keep the last one per device, or None
    // where the device (or the library) has no GPM.
    let mut gpm: Vec<Option<Option<GpmSample<'_>>>> = watched
        .iter()
        .map(|w| {
            let supported = nvml
                .device_by_index(w.index)
                .and_then(|d| d.gpm_support())
                .unwrap_or(false);
            supported.then_some(None)
        })
        .collect();
    while !stop.load(Ordering::Relaxed) {
        if last_state.elapsed() >= STATE_EVERY {
            last_state = Instant::now();
            let traced = pids.lock().map(|p| p.clone()).unwrap_or_default();
            let changed = refresh_users(&nvml, &mut watched, &traced);
            if changed || !announced {
                announce(&watched, &tx, &mut announced);
            }
            for (w, gpm) in watched.iter_mut().zip(gpm.iter_mut()) {
                if let Ok(d) = nvml.device_by_index(w.index) {
                    let mut st = state(&d, w.index);
                    if let Some(prev) = gpm.as_mut() {
                        (st.sm_active_pct, st.sm_occupancy_pct) = sm_activity(&nvml, &d, prev);
                    }
                    let _ = tx.send(Record::GpuState(st));
                    process_util(&d, w, &traced, &tx);
                }
            }
        }
        for w in &mut watched {
            if let Ok(d) = nvml.device_by_index(w.index) {
                utilization(&d, w, &tx);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for w in &mut watched {
        if let Ok(d) = nvml.device_by_index(w.index) {
            utilization(&d, w, &tx);
        }
    }
}

fn describe(d: &Device<'_>, index: u32, driver: &str) -> GpuInfo {
    GpuInfo {
        index,
        name: d.name().unwrap_or_default(),
        uuid: d.uuid().unwrap_or_default(),
        pci_bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
        driver_version: driver.to_string(),
        pcie_max_gen: d.max_pcie_link_gen().unwrap_or(0),
        pcie_max_width: d.max_pcie_link_width().unwrap_or(0),
        memory_total_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
        target_pids: Vec::new(),
    }
}

/// Updates which traced PIDs run on each GPU; true when that changed.
fn refresh_users(nvml: &Nvml, watched: &mut [Watched], traced: &BTreeSet<u32>) -> bool {
    let mut changed = false;
    for w in watched {
        let Ok(d) = nvml.device_by_index(w.index) else {
            continue;
        };
        // A failed query says nothing about who left: keep the last answer.
        let Ok(running) = d.running_compute_processes() else {
            log::debug!("GPU {}: listing compute processes failed", w.index);
            continue;
        };
        // Every traced process seen on the GPU during the recording: one that exits before
        // the end still ran on it.
        let mut users: Vec<u32> = running
            .into_iter()
            .map(|p| p.pid)
            .filter(|pid| traced.contains(pid))
            .chain(w.info.target_pids.iter().copied())
            .collect();
        users.sort_unstable();
        users.dedup();
        if users != w.info.target_pids {
            w.info.target_pids = users;
            changed = true;
        }
    }
    changed
}

fn announce(watched: &[Watched], tx: &Sender<Record>, announced: &mut bool) {
    if !*announced && watched.iter().all(|w| w.info.target_pids.is_empty()) {
        eprintln!(
            "stallscope: note: NVML lists no traced process on any GPU yet; watching all {} GPU(s)",
            watched.len()
        );
    }
    *announced = true;
    for w in watched {
        let _ = tx.send(Record::Gpu(w.info.clone()));
    }
}

fn idle_until(w: &mut Watched, end_ns: u64, tx: &Sender<Record>) {
    while end_ns.saturating_sub(w.last_ns) >= w.period_ns {
        let ts_ns = w.last_ns + w.period_ns;
        let _ = tx.send(Record::GpuUtil {
            gpu: w.index,
            ts_ns,
            period_ns: w.period_ns,
            util_pct: 0,
        });
        w.last_ns = ts_ns;
    }
}

fn utilization(d: &Device<'_>, w: &mut Watched, tx: &Sender<Record>) {
    let now = readings();
    if w.use_rates {
        if let Ok(u) = d.utilization_rates() {
            let period = now.monotonic_ns.saturating_sub(w.last_ns).max(1);
            let _ = tx.send(Record::GpuUtil {
                gpu: w.index,
                ts_ns: now.monotonic_ns,
                period_ns: period,
                util_pct: u.gpu,
            });
            w.last_ns = now.monotonic_ns;
        }
        return;
    }
    match d.samples(Sampling::GpuUtilization, w.cursor_us) {
        Ok(mut samples) => {
            samples.sort_by_key(|s| s.timestamp);
            // NVML's period differs by product (1/6 s to 1 s): learn it from the spacing of
            // the first samples seen together.
            if !w.period_known && samples.len() >= 2 {
                let spacing_us = samples
                    .windows(2)
                    .map(|p| p[1].timestamp.saturating_sub(p[0].timestamp))
                    .filter(|&d| d > 0)
                    .min();
                if let Some(us) = spacing_us {
                    w.period_ns = (us * 1000).clamp(10_000_000, 2_000_000_000);
                    w.period_known = true;
                }
            }
            for s in samples {
                w.cursor_us = w.cursor_us.max(s.timestamp);
                let clock = *w.clock.get_or_insert_with(|| {
                    NvmlClock::detect(s.timestamp, now).unwrap_or(NvmlClock::Realtime)
                });
                let ts_ns = clock.to_monotonic_ns(s.timestamp, now);
                let util = match s.value {
                    SampleValue::U32(v) => v,
                    SampleValue::U64(v) => v.min(100) as u32,
                    SampleValue::F64(v) => v.clamp(0.0, 100.0) as u32,
                    SampleValue::I64(v) => v.clamp(0, 100) as u32,
                };
                if ts_ns <= w.last_ns {
                    // Before the recording, or already covered: only learn the spacing.
                    continue;
                }
                // No samples between two samples: the GPU was idle in the gap.
                idle_until(w, ts_ns.saturating_sub(w.period_ns), tx);
                let period = (ts_ns - w.last_ns).clamp(10_000_000, w.period_ns.max(10_000_000));
                let _ = tx.send(Record::GpuUtil {
                    gpu: w.index,
                    ts_ns,
                    period_ns: period,
                    util_pct: util.min(100),
                });
                w.last_ns = ts_ns;
            }
        }
        // Idle: NVML made no sample newer than the cursor. Leave a period of slack for a
        // sample NVML has not published yet.
        Err(NvmlError::NotFound) => idle_until(w, now.monotonic_ns.saturating_sub(w.period_ns), tx),
        Err(NvmlError::NotSupported) | Err(NvmlError::FailedToLoadSymbol(_)) => w.use_rates = true,
        Err(e) => log::debug!("nvmlDeviceGetSamples on GPU {}: {e}", w.index),
    }
}

fn state(d: &Device<'_>, gpu: u32) -> GpuState {
    GpuState {
        gpu,
        ts_ns: clock_ns(libc::CLOCK_MONOTONIC),
        sm_clock_mhz: d.clock_info(Clock::SM).ok(),
        mem_clock_mhz: d.clock_info(Clock::Memory).ok(),
        throttle_reasons: d.current_throttle_reasons().ok().map(|r| r.bits()),
        pcie_gen: d.current_pcie_link_gen().ok(),
        pcie_width: d.current_pcie_link_width().ok(),
        pcie_tx_kbps: d.pcie_throughput(PcieUtilCounter::Send).ok(),
        pcie_rx_kbps: d.pcie_throughput(PcieUtilCounter::Receive).ok(),
        power_mw: d.power_usage().ok(),
        temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
        memory_used_bytes: d.memory_info().ok().map(|m| m.used),
        sm_active_pct: None,
        sm_occupancy_pct: None,
    }
}

/// SM activity and occupancy between the previous GPM sample and a new one, which replaces
/// it. `None`s on the first call or when GPM fails.
fn sm_activity<'n>(
    nvml: &'n Nvml,
    d: &Device<'n>,
    prev: &mut Option<GpmSample<'n>>,
) -> (Option<u32>, Option<u32>) {
    let Ok(now) = d.gpm_sample() else {
        return (None, None);
    };
    let out = match prev.as_ref() {
        Some(before) => gpm_metrics_get(
            nvml,
            before,
            &now,
            &[GpmMetricId::SmUtil, GpmMetricId::SmOccupancy],
        )
        .map(|r| {
            let v = |i: usize| {
                r.get(i)
                    .and_then(|m| m.as_ref().ok())
                    .map(|m| m.value.clamp(0.0, 100.0).round() as u32)
            };
            (v(0), v(1))
        })
        .unwrap_or((None, None)),
        None => (None, None),
    };
    *prev = Some(now);
    out
}

fn process_util(d: &Device<'_>, w: &mut Watched, traced: &BTreeSet<u32>, tx: &Sender<Record>) {
    let Ok(samples) = d.process_utilization_stats(w.proc_cursor_us) else {
        return;
    };
    let now = readings();
    for s in samples {
        w.proc_cursor_us = w.proc_cursor_us.max(s.timestamp);
        if !traced.contains(&s.pid) {
            continue;
        }
        let clock = w.clock.unwrap_or(NvmlClock::Realtime);
        let _ = tx.send(Record::GpuProcessUtil {
            gpu: w.index,
            ts_ns: clock.to_monotonic_ns(s.timestamp, now),
            pid: s.pid,
            sm_pct: s.sm_util,
            mem_pct: s.mem_util,
        });
    }
}
