//! Health queries `stallscope doctor` reads: ECC, row remapping, PCIe replays, thresholds,
//! power limit, P-state, persistence, MIG, and the CUDA version the driver supports. Healthy
//! unless `STALLSCOPE_SIMGPU_FAULTS` names a fault (see [`crate::state::Faults`]).
use std::ffi::{c_int, c_uint, c_ulonglong};

use simgpu_state::device::{
    CUDA_DRIVER_VERSION, MIG_MAX_DEVICES, OLD_CUDA_DRIVER_VERSION, POWER_LIMIT_MW, TEMP_SLOWDOWN_C,
};

use crate::state::{self, checked, faults, mig_handle, snapshot};
use crate::types::{NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND, nvmlDevice_t, nvmlReturn_t};
use crate::{guarded, write_out};

/// nvmlMemoryErrorType_t and nvmlEccCounterType_t.
const CORRECTED: c_uint = 0;
const UNCORRECTED: c_uint = 1;
const VOLATILE: c_uint = 0;
const AGGREGATE: c_uint = 1;
/// nvmlTemperatureThresholds_t.
const THRESHOLD_SHUTDOWN: c_uint = 0;
const THRESHOLD_SLOWDOWN: c_uint = 1;
const THRESHOLD_GPU_MAX: c_uint = 3;
/// nvmlPstates_t: P0 busy, P8 idle, as a real board shifts.
const P0: c_uint = 0;
const P8: c_uint = 8;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    guarded(|| {
        state::device()?;
        let v = if faults().old_driver {
            OLD_CUDA_DRIVER_VERSION
        } else {
            CUDA_DRIVER_VERSION
        };
        // SAFETY: `version` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(version, v) }
    })
}

/// The current and pending halves of a mode query (ECC, MIG), for a valid device.
///
/// # Safety
/// `current` and `pending` must be NULL or out-pointers.
unsafe fn mode(
    dev: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
    on: bool,
) -> nvmlReturn_t {
    guarded(|| {
        checked(dev)?;
        // SAFETY: forwarded caller contract.
        unsafe {
            write_out(current, c_uint::from(on))?;
            write_out(pending, c_uint::from(on))
        }
    })
}

/// ECC is on; `current` and `pending` are nvmlEnableState_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    dev: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointers, per the API contract.
    unsafe { mode(dev, current, pending, true) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    dev: nvmlDevice_t,
    error_type: c_uint,
    counter_type: c_uint,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    guarded(|| {
        checked(dev)?;
        if !matches!(error_type, CORRECTED | UNCORRECTED)
            || !matches!(counter_type, VOLATILE | AGGREGATE)
        {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // [corrected, uncorrected] × [volatile, aggregate]
        let counts: [[c_ulonglong; 2]; 2] = if faults().ecc {
            [[12, 130], [2, 5]]
        } else {
            [[0, 0], [0, 0]]
        };
        let n = counts[error_type as usize][counter_type as usize];
        // SAFETY: `count` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(count, n) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    dev: nvmlDevice_t,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        checked(dev)?;
        let (corr, unc, pending) = if faults().ecc { (1, 2, 1) } else { (0, 0, 0) };
        // SAFETY: out-pointers, per the API contract.
        unsafe {
            write_out(corr_rows, corr)?;
            write_out(unc_rows, unc)?;
            write_out(is_pending, pending)?;
            write_out(failure_occurred, 0)
        }
    })
}

/// Replays happen on a link that trained below its width (a bad seat), not on a good one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    dev: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        let gpu = checked(dev)?;
        use std::sync::atomic::Ordering::Relaxed;
        let narrow = gpu.pcie_width.load(Relaxed) < gpu.pcie_max_width.load(Relaxed);
        // SAFETY: `value` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(value, if narrow { 37 } else { 0 }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    dev: nvmlDevice_t,
    threshold: c_uint,
    celsius: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        checked(dev)?;
        let v = match threshold {
            THRESHOLD_SHUTDOWN => 95,
            THRESHOLD_SLOWDOWN => TEMP_SLOWDOWN_C,
            THRESHOLD_GPU_MAX => TEMP_SLOWDOWN_C,
            _ => return Err(crate::types::NVML_ERROR_NOT_SUPPORTED),
        };
        // SAFETY: `celsius` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(celsius, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    dev: nvmlDevice_t,
    mw: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        checked(dev)?;
        // SAFETY: `mw` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(mw, POWER_LIMIT_MW) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    dev: nvmlDevice_t,
    pstate: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        let snap = snapshot(dev)?;
        let p = if snap.busy_recently() { P0 } else { P8 };
        // SAFETY: `pstate` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(pstate, p) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    dev: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        checked(dev)?;
        // SAFETY: `mode` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(mode, c_uint::from(!faults().no_persistence)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    dev: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointers, per the API contract.
    unsafe { mode(dev, current, pending, faults().mig) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    dev: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        checked(dev)?;
        // SAFETY: `count` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(count, MIG_MAX_DEVICES) }
    })
}

/// Under the `mig` fault each GPU has one slice, in slot 0; the other slots are empty.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    dev: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guarded(|| {
        let gpu = checked(dev)?;
        if !faults().mig || index != 0 {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        // SAFETY: `mig` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(mig, mig_handle(gpu.index())) }
    })
}
