//! The GPU side: an NVML sampler on its own thread (NVML calls can block for milliseconds),
//! sending utilization samples and device state to the session as recording records.
//!
//! NVML's utilization samples are the idle signal; what to make of them (their period, the
//! idle gaps between them, their clock) is decided in [`profiler_core::nvml::samples`].
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

use crate::nvml_reader;
use nvml_wrapper::gpm::GpmSample;
use profiler_core::{
    nvml::samples::UtilSamples,
    record::{GpuState, Record},
};

const STATE_EVERY: Duration = Duration::from_millis(500);
/// GPM SM activity is read on its own, more often: it is what tells a waiting collective from
/// work (see `profiler_core::attribution::waiting`), and NVML wants its samples ≥ 100 ms
/// apart.
const GPM_EVERY: Duration = Duration::from_millis(200);

mod device;

use device::{Watched, describe, process_util, refresh_users, sm_activity, state, utilization};

pub struct GpuSampler {
    rx: Receiver<Record>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl GpuSampler {
    /// Starts sampling. `lib` overrides the library path (see [`nvml_reader::library`]); `pids` is the
    /// traced tree, kept current by the session.
    pub fn start(lib: Option<PathBuf>, pids: Arc<Mutex<BTreeSet<u32>>>, start_ns: u64) -> Self {
        let lib = nvml_reader::library(lib);
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

fn run(
    lib: PathBuf,
    pids: Arc<Mutex<BTreeSet<u32>>>,
    start_ns: u64,
    tx: Sender<Record>,
    stop: Arc<AtomicBool>,
) {
    let nvml = match nvml_reader::open(&lib) {
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
                util: UtilSamples::new(i, start_ns),
                proc_cursor_us: 0,
                use_rates: false,
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
    let mut last_gpm = Instant::now() - GPM_EVERY;
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
            for w in watched.iter_mut() {
                if let Ok(d) = nvml.device_by_index(w.index) {
                    let _ = tx.send(Record::GpuState(Box::new(state(&d, w.index))));
                    process_util(&d, w, &traced, &tx);
                }
            }
        }
        if last_gpm.elapsed() >= GPM_EVERY {
            last_gpm = Instant::now();
            for (w, gpm) in watched.iter().zip(gpm.iter_mut()) {
                let Some(prev) = gpm.as_mut() else { continue };
                if let Ok(d) = nvml.device_by_index(w.index) {
                    let (active, occupancy) = sm_activity(&nvml, &d, prev);
                    if active.is_some() {
                        // A state holding only GPM: readers take each field where it is set.
                        let _ = tx.send(Record::GpuState(Box::new(GpuState {
                            gpu: w.index,
                            ts_ns: crate::capture::clock::monotonic_ns(),
                            sm_active_pct: active,
                            sm_occupancy_pct: occupancy,
                            ..GpuState::default()
                        })));
                    }
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

fn announce(watched: &[Watched], tx: &Sender<Record>, announced: &mut bool) {
    if !*announced && watched.iter().all(|w| w.info.target_pids.is_empty()) {
        eprintln!(
            "stallscope: note: NVML lists no traced process on any GPU yet; watching all {} GPU(s)",
            watched.len()
        );
    }
    *announced = true;
    for w in watched {
        let _ = tx.send(Record::Gpu(Box::new(w.info.clone())));
    }
}
