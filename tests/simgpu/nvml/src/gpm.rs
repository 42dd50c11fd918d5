//! GPM (GPU Performance Monitoring, Hopper and newer): samples and the metrics computed from
//! two of them. The sample store and the arithmetic; the exports are in `api_gpm`.
//!
//! A sample is an opaque handle this library hands out (never a pointer it dereferences, so a
//! stale or forged handle is an error, not a crash). Filling it records the GPU and its
//! cumulative counters at that instant (`simgpu_state::Totals`: CLOCK_MONOTONIC ns, busy ns,
//! SM-active ns, PCIe bytes each way); a metric is the difference of two samples over the time
//! between them.
use std::collections::HashMap;
use std::ffi::{CStr, c_uint};
use std::sync::{Mutex, MutexGuard};

use simgpu_state::Totals;

use crate::types::{
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NVML_GPM_METRIC_GRAPHICS_UTIL,
    NVML_GPM_METRIC_MAX, NVML_GPM_METRIC_PCIE_RX_PER_SEC, NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    NVML_GPM_METRIC_SM_OCCUPANCY, NVML_GPM_METRIC_SM_UTIL, nvmlReturn_t,
};

/// The driver's counters refresh every 100 ms, and nvml.h asks for samples at least that far
/// apart; it documents no particular error for closer ones, so they get
/// NVML_ERROR_INVALID_ARGUMENT here.
pub const MIN_INTERVAL_NS: u64 = 100_000_000;
/// SM occupancy (resident warps over the maximum) as a fixed share of SM activity: the fixture
/// does not model warps, and a busy training kernel's occupancy is about half its activity.
pub const OCCUPANCY_PER_ACTIVITY: f64 = 0.5;

/// What a filled sample holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// The GPU's index.
    pub device: u32,
    pub totals: Totals,
}

/// First sample handle, then every 16 bytes, like heap pointers.
const HANDLE_BASE: usize = 0x6b0d_0000_0000;

#[derive(Default)]
struct Store {
    last: usize,
    /// Live samples: `None` until filled by nvmlGpmSampleGet.
    samples: HashMap<usize, Option<Reading>>,
}

static STORE: Mutex<Option<Store>> = Mutex::new(None);

fn store() -> MutexGuard<'static, Option<Store>> {
    STORE.lock().unwrap_or_else(|e| e.into_inner())
}

/// nvmlGpmSampleAlloc: a new, empty sample.
pub fn alloc() -> usize {
    let mut guard = store();
    let s = guard.get_or_insert_with(Store::default);
    s.last += 1;
    let handle = HANDLE_BASE + s.last * 16;
    s.samples.insert(handle, None);
    handle
}

/// nvmlGpmSampleFree: false for a handle that is not a live sample.
pub fn free(handle: usize) -> bool {
    store()
        .as_mut()
        .is_some_and(|s| s.samples.remove(&handle).is_some())
}

/// nvmlGpmSampleGet: stores `reading` in a live sample; false for any other handle.
pub fn fill(handle: usize, reading: Reading) -> bool {
    match store().as_mut().and_then(|s| s.samples.get_mut(&handle)) {
        Some(slot) => {
            *slot = Some(reading);
            true
        }
        None => false,
    }
}

/// The reading of a filled sample.
pub fn reading(handle: usize) -> Option<Reading> {
    store().as_ref()?.samples.get(&handle).copied().flatten()
}

/// Checks two samples for nvmlGpmMetricsGet: the same GPU, at least [`MIN_INTERVAL_NS`] apart.
/// Returns them oldest first.
pub fn interval(a: Reading, b: Reading) -> Result<(Totals, Totals), nvmlReturn_t> {
    if a.device != b.device {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let (old, new) = if a.totals.now_ns <= b.totals.now_ns {
        (a.totals, b.totals)
    } else {
        (b.totals, a.totals)
    };
    if new.now_ns - old.now_ns < MIN_INTERVAL_NS {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((old, new))
}

/// Percent of `len` that `part` is, at most 100.
fn percent(part: u64, len: u64) -> f64 {
    (part as f64 * 100.0 / len.max(1) as f64).min(100.0)
}

/// MiB per second for `bytes` in `ns`.
fn mib_per_s(bytes: u64, ns: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20) / (ns.max(1) as f64 / 1e9)
}

/// Metric `id` between `old` and `new`: the value, or the per-metric error (NOT_SUPPORTED for
/// the metrics the simulation does not model, INVALID_ARGUMENT for ids nvml.h does not have).
pub fn metric(id: c_uint, old: &Totals, new: &Totals) -> Result<f64, nvmlReturn_t> {
    let dt = new.now_ns - old.now_ns;
    let sm_util = || percent(new.sm_active_ns.saturating_sub(old.sm_active_ns), dt);
    match id {
        NVML_GPM_METRIC_GRAPHICS_UTIL => Ok(percent(new.busy_ns.saturating_sub(old.busy_ns), dt)),
        NVML_GPM_METRIC_SM_UTIL => Ok(sm_util()),
        NVML_GPM_METRIC_SM_OCCUPANCY => Ok(sm_util() * OCCUPANCY_PER_ACTIVITY),
        NVML_GPM_METRIC_PCIE_TX_PER_SEC => {
            Ok(mib_per_s(new.tx_bytes.saturating_sub(old.tx_bytes), dt))
        }
        NVML_GPM_METRIC_PCIE_RX_PER_SEC => {
            Ok(mib_per_s(new.rx_bytes.saturating_sub(old.rx_bytes), dt))
        }
        0 => Err(NVML_ERROR_INVALID_ARGUMENT),
        id if id as usize >= NVML_GPM_METRIC_MAX => Err(NVML_ERROR_INVALID_ARGUMENT),
        _ => Err(NVML_ERROR_NOT_SUPPORTED),
    }
}

/// (short name, long name, unit) of a metric this library computes.
pub fn info(id: c_uint) -> Option<(&'static CStr, &'static CStr, &'static CStr)> {
    Some(match id {
        NVML_GPM_METRIC_GRAPHICS_UTIL => (c"gr_util", c"Graphics engine activity", c"%"),
        NVML_GPM_METRIC_SM_UTIL => (c"sm_util", c"SM activity", c"%"),
        NVML_GPM_METRIC_SM_OCCUPANCY => (c"sm_occupancy", c"SM occupancy", c"%"),
        NVML_GPM_METRIC_PCIE_TX_PER_SEC => (c"pcie_tx", c"PCIe traffic from this GPU", c"MiB/sec"),
        NVML_GPM_METRIC_PCIE_RX_PER_SEC => (c"pcie_rx", c"PCIe traffic to this GPU", c"MiB/sec"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn totals(now_ns: u64, busy_ns: u64, sm_active_ns: u64, tx: u64, rx: u64) -> Totals {
        Totals {
            now_ns,
            busy_ns,
            sm_active_ns,
            tx_bytes: tx,
            rx_bytes: rx,
        }
    }

    #[test]
    fn metrics_are_rates_over_the_interval() {
        let old = totals(1_000 * MS, 50 * MS, 40 * MS, 0, 1 << 20);
        // 400 ms later: 200 ms busy at 90% of the SMs, 4 MiB out, 2 MiB in.
        let new = totals(1_400 * MS, 250 * MS, 220 * MS, 4 << 20, 3 << 20);
        let m = |id| metric(id, &old, &new).unwrap();
        assert_eq!(m(NVML_GPM_METRIC_GRAPHICS_UTIL), 50.0);
        assert_eq!(m(NVML_GPM_METRIC_SM_UTIL), 45.0);
        assert_eq!(m(NVML_GPM_METRIC_SM_OCCUPANCY), 22.5);
        assert_eq!(m(NVML_GPM_METRIC_PCIE_TX_PER_SEC), 10.0);
        assert_eq!(m(NVML_GPM_METRIC_PCIE_RX_PER_SEC), 5.0);
        // SM activity of overlapping kernels can sum past the interval: capped.
        let over = totals(1_400 * MS, 450 * MS, 460 * MS, 0, 0);
        assert_eq!(metric(NVML_GPM_METRIC_SM_UTIL, &old, &over), Ok(100.0));
    }

    #[test]
    fn unmodelled_and_unknown_metrics_fail_alone() {
        let (old, new) = (totals(0, 0, 0, 0, 0), totals(MIN_INTERVAL_NS, 0, 0, 0, 0));
        assert_eq!(metric(5, &old, &new), Err(NVML_ERROR_NOT_SUPPORTED));
        assert_eq!(metric(60, &old, &new), Err(NVML_ERROR_NOT_SUPPORTED));
        assert_eq!(metric(0, &old, &new), Err(NVML_ERROR_INVALID_ARGUMENT));
        assert_eq!(metric(210, &old, &new), Err(NVML_ERROR_INVALID_ARGUMENT));
        assert!(info(NVML_GPM_METRIC_SM_UTIL).is_some());
        assert!(info(5).is_none());
    }

    #[test]
    fn samples_must_be_one_gpu_and_100ms_apart() {
        let at = |device, ms| Reading {
            device,
            totals: totals(ms * MS, 0, 0, 0, 0),
        };
        assert!(interval(at(0, 1000), at(0, 1100)).is_ok());
        let (old, new) = interval(at(0, 1200), at(0, 1000)).unwrap();
        assert!(old.now_ns < new.now_ns, "either order");
        assert_eq!(
            interval(at(0, 1000), at(0, 1099)),
            Err(NVML_ERROR_INVALID_ARGUMENT)
        );
        assert_eq!(
            interval(at(0, 1000), at(1, 1200)),
            Err(NVML_ERROR_INVALID_ARGUMENT)
        );
    }

    #[test]
    fn the_store_knows_its_samples() {
        let (a, b) = (alloc(), alloc());
        assert_ne!(a, b);
        assert_eq!(reading(a), None, "not filled yet");
        let r = Reading {
            device: 0,
            totals: totals(5, 0, 0, 0, 0),
        };
        assert!(fill(a, r));
        assert_eq!(reading(a), Some(r));
        assert!(free(a));
        assert!(!free(a), "freed twice");
        assert!(!fill(a, r));
        assert!(!free(12345));
        assert!(free(b));
    }
}
