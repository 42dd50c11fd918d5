//! What the sampler asks each device: its description, who runs on it, utilization samples,
//! clocks, PCIe, power and SM activity, each turned into records.
use std::{collections::BTreeSet, sync::mpsc::Sender};

use nvml_wrapper::{
    Device, Nvml,
    enum_wrappers::device::{PcieUtilCounter, Sampling},
    enums::{device::SampleValue, gpm::GpmMetricId},
    error::NvmlError,
    gpm::{GpmSample, gpm_metrics_get},
};
use profiler_core::{
    nvml::clock::NvmlClock,
    nvml::samples::{RawSample, UtilSamples},
    record::{GpuInfo, GpuState, Record},
};

use crate::{
    capture::clock::{monotonic_ns, readings},
    nvml_reader,
};

/// Per-device sampling state.
pub(super) struct Watched {
    pub index: u32,
    pub info: GpuInfo,
    pub util: UtilSamples,
    pub proc_cursor_us: u64,
    pub use_rates: bool,
}

pub(super) fn describe(d: &Device<'_>, index: u32, driver: &str) -> GpuInfo {
    let id = nvml_reader::identity(d, index);
    GpuInfo {
        index,
        name: id.name,
        uuid: id.uuid,
        pci_bus_id: id.bus_id,
        driver_version: driver.to_string(),
        pcie_max_gen: d.max_pcie_link_gen().unwrap_or(0),
        pcie_max_width: d.max_pcie_link_width().unwrap_or(0),
        memory_total_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
        target_pids: Vec::new(),
    }
}

/// Updates which traced PIDs run on each GPU; true when that changed.
pub(super) fn refresh_users(nvml: &Nvml, watched: &mut [Watched], traced: &BTreeSet<u32>) -> bool {
    let mut changed = false;
    for w in watched {
        let Ok(d) = nvml.device_by_index(w.index) else {
            continue;
        };
        // A failed query says nothing about who left: keep the last answer.
        let Ok(running) = nvml_reader::processes(&d) else {
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

pub(super) fn utilization(d: &Device<'_>, w: &mut Watched, tx: &Sender<Record>) {
    let now = readings();
    let mut out = Vec::new();
    if w.use_rates {
        if let Ok(u) = d.utilization_rates() {
            w.util.rate(u.gpu, now.monotonic_ns, &mut out);
        }
    } else {
        match d.samples(Sampling::GpuUtilization, w.util.cursor_us()) {
            Ok(samples) => {
                let raw = samples
                    .into_iter()
                    .map(|s| RawSample {
                        timestamp_us: s.timestamp,
                        util_pct: match s.value {
                            SampleValue::U32(v) => v,
                            SampleValue::U64(v) => v.min(100) as u32,
                            SampleValue::F64(v) => v.clamp(0.0, 100.0) as u32,
                            SampleValue::I64(v) => v.clamp(0, 100) as u32,
                        },
                    })
                    .collect();
                w.util.add(raw, now, &mut out);
            }
            Err(NvmlError::NotFound) => w.util.none_newer(now.monotonic_ns, &mut out),
            Err(NvmlError::NotSupported) | Err(NvmlError::FailedToLoadSymbol(_)) => {
                w.use_rates = true
            }
            Err(e) => log::debug!("nvmlDeviceGetSamples on GPU {}: {e}", w.index),
        }
    }
    for r in out {
        let _ = tx.send(r);
    }
}

pub(super) fn state(d: &Device<'_>, gpu: u32) -> GpuState {
    let now = nvml_reader::now(d);
    GpuState {
        gpu,
        ts_ns: monotonic_ns(),
        sm_clock_mhz: now.sm_clock_mhz.ok(),
        mem_clock_mhz: now.mem_clock_mhz.ok(),
        throttle_reasons: now.clock_event_reasons.ok(),
        pcie_gen: now.pcie_gen.ok(),
        pcie_width: now.pcie_width.ok(),
        pcie_tx_kbps: d.pcie_throughput(PcieUtilCounter::Send).ok(),
        pcie_rx_kbps: d.pcie_throughput(PcieUtilCounter::Receive).ok(),
        power_mw: now.power_mw.ok(),
        temperature_c: now.temperature_c.ok(),
        memory_used_bytes: now.memory.ok().map(|m| m.used),
        sm_active_pct: None,
        sm_occupancy_pct: None,
    }
}

/// SM activity and occupancy between the previous GPM sample and a new one, which replaces
/// it. `None`s on the first call or when GPM fails.
pub(super) fn sm_activity<'n>(
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

pub(super) fn process_util(
    d: &Device<'_>,
    w: &mut Watched,
    traced: &BTreeSet<u32>,
    tx: &Sender<Record>,
) {
    let Ok(samples) = d.process_utilization_stats(w.proc_cursor_us) else {
        return;
    };
    let now = readings();
    for s in samples {
        w.proc_cursor_us = w.proc_cursor_us.max(s.timestamp);
        if !traced.contains(&s.pid) {
            continue;
        }
        let clock = w.util.clock().unwrap_or(NvmlClock::Realtime);
        let _ = tx.send(Record::GpuProcessUtil {
            gpu: w.index,
            ts_ns: clock.to_monotonic_ns(s.timestamp, now),
            pid: s.pid,
            sm_pct: s.sm_util,
            mem_pct: s.mem_util,
        });
    }
}
