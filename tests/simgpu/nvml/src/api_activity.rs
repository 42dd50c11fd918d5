//! What the device is doing: utilization samples and rates, processes, clocks, clock-event
//! reasons, power, temperature and PCIe traffic, all computed from a fresh snapshot.
use std::ffi::{c_uint, c_ulonglong};

use simgpu_state::Direction;
use simgpu_state::samples::{gpu_util_samples, process_util_samples};

use crate::readings;
use crate::state::{sample_clock, snapshot};
use crate::types::{
    NO_INSTANCE, NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED, NVML_GPU_UTILIZATION_SAMPLES, NVML_PCIE_UTIL_RX_BYTES,
    NVML_PCIE_UTIL_TX_BYTES, NVML_TEMPERATURE_GPU, NVML_VALUE_TYPE_UNSIGNED_INT, nvmlDevice_t,
    nvmlProcessInfo_t, nvmlProcessUtilizationSample_t, nvmlReturn_t, nvmlSample_t,
    nvmlUtilization_t, nvmlValue_t,
};
use crate::{guarded, write_out};

/// Writes `items` into a caller's array of `capacity` entries: the first `min(capacity, len)`.
///
/// # Safety
/// `array` must be valid for writes of `capacity` elements.
unsafe fn fill<T: Copy>(array: *mut T, capacity: usize, items: &[T]) -> usize {
    let n = capacity.min(items.len());
    // SAFETY: n <= capacity elements fit in the caller's array.
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), array, n) };
    n
}

/// GPU utilization samples newer than `last_seen`, oldest first. With `samples` NULL, only the
/// count; NOT_FOUND when there is none, as the driver answers while the GPU idles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSamples(
    dev: nvmlDevice_t,
    sample_type: c_uint,
    last_seen_us: c_ulonglong,
    value_type: *mut c_uint,
    count: *mut c_uint,
    samples: *mut nvmlSample_t,
) -> nvmlReturn_t {
    guarded(|| {
        let snap = snapshot(dev)?;
        if count.is_null() || value_type.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if sample_type != NVML_GPU_UTILIZATION_SAMPLES {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        let found: Vec<nvmlSample_t> = gpu_util_samples(&snap, sample_clock(), last_seen_us)
            .into_iter()
            .map(|s| {
                // Zero all 8 bytes of the union first so the unused high half is defined.
                let mut value = nvmlValue_t { ullVal: 0 };
                value.uiVal = s.percent;
                nvmlSample_t {
                    timeStamp: s.timestamp_us,
                    sampleValue: value,
                }
            })
            .collect();
        if found.is_empty() {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        // SAFETY: non-null out-pointers, per the API contract.
        unsafe { write_out(value_type, NVML_VALUE_TYPE_UNSIGNED_INT) }?;
        let n = if samples.is_null() {
            found.len()
        } else {
            // SAFETY: the caller's array holds *count entries, per the API contract.
            unsafe { fill(samples, count.read() as usize, &found) }
        };
        // SAFETY: as above.
        unsafe { write_out(count, n as c_uint) }
    })
}

/// `gpu`: percent of the last sample period with a kernel running. `memory`: copy traffic of
/// that period relative to what the current PCIe link can carry.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    dev: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    guarded(|| {
        let snap = snapshot(dev)?;
        let value = nvmlUtilization_t {
            gpu: snap.last_period_pct(),
            memory: snap.copy_load_pct(),
        };
        // SAFETY: `utilization` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(utilization, value) }
    })
}

/// Per-process SM utilization samples newer than `last_seen_us`. With `utilization` NULL,
/// NVML_ERROR_INSUFFICIENT_SIZE and the count.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    dev: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen_us: c_ulonglong,
) -> nvmlReturn_t {
    guarded(|| {
        let snap = snapshot(dev)?;
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let found: Vec<nvmlProcessUtilizationSample_t> =
            process_util_samples(&snap, sample_clock(), last_seen_us)
                .into_iter()
                .map(|s| nvmlProcessUtilizationSample_t {
                    pid: s.pid,
                    timeStamp: s.timestamp_us,
                    smUtil: s.sm_percent,
                    memUtil: 0,
                    encUtil: 0,
                    decUtil: 0,
                })
                .collect();
        if found.is_empty() {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        if utilization.is_null() {
            // SAFETY: `count` is a non-null out-pointer, per the API contract.
            unsafe { write_out(count, found.len() as c_uint) }?;
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        // A sample period may have ended since the caller sized its buffer: fill what fits,
        // oldest first, so the caller's cursor picks up the rest next time.
        // SAFETY: `count` is an in/out pointer and the caller's array holds *count entries.
        unsafe {
            let n = fill(utilization, count.read() as usize, &found);
            write_out(count, n as c_uint)
        }
    })
}

/// Processes holding a context, with the device memory they allocated. A NULL or short
/// array gets NVML_ERROR_INSUFFICIENT_SIZE and the count (nvml-wrapper relies on this).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guarded(|| {
        let snap = snapshot(dev)?;
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let mut found: Vec<nvmlProcessInfo_t> = snap
            .procs
            .iter()
            .map(|p| nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.mem_used_bytes,
                gpuInstanceId: NO_INSTANCE,
                computeInstanceId: NO_INSTANCE,
            })
            .collect();
        if crate::state::faults().dead_holder {
            found.push(nvmlProcessInfo_t {
                pid: simgpu_state::device::DEAD_HOLDER_PID,
                usedGpuMemory: simgpu_state::device::DEAD_HOLDER_BYTES,
                gpuInstanceId: NO_INSTANCE,
                computeInstanceId: NO_INSTANCE,
            });
        }
        // SAFETY: `count` is a non-null in/out pointer, per the API contract.
        let capacity = unsafe { count.read() } as usize;
        // SAFETY: as above.
        unsafe { write_out(count, found.len() as c_uint) }?;
        if found.is_empty() {
            return Ok(());
        }
        if infos.is_null() || capacity < found.len() {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        // SAFETY: the caller's array holds `capacity` entries, per the API contract.
        unsafe { fill(infos, capacity, &found) };
        Ok(())
    })
}

/// Shared body of the two names of the clock-event-reasons query.
///
/// # Safety
/// `reasons` must be NULL or an out-pointer.
unsafe fn clock_event_reasons(dev: nvmlDevice_t, reasons: *mut c_ulonglong) -> nvmlReturn_t {
    guarded(|| {
        let snap = snapshot(dev)?;
        // SAFETY: forwarded caller contract.
        unsafe { write_out(reasons, readings::clock_event_reasons(&snap)) }
    })
}

/// The name nvml-wrapper 0.13 calls (deprecated in NVML 12.x, still exported by drivers).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    dev: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    unsafe { clock_event_reasons(dev, reasons) }
}

/// The current name of the same query.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    dev: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    unsafe { clock_event_reasons(dev, reasons) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    dev: nvmlDevice_t,
    clock: c_uint,
    mhz: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        let snap = snapshot(dev)?;
        let value = readings::clock_mhz(&snap, clock).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        // SAFETY: `mhz` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(mhz, value) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    dev: nvmlDevice_t,
    clock: c_uint,
    mhz: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        crate::state::checked(dev)?;
        let value = readings::max_clock_mhz(clock).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        // SAFETY: `mhz` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(mhz, value) }
    })
}

/// Board power in milliwatts.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    dev: nvmlDevice_t,
    mw: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        let snap = snapshot(dev)?;
        // SAFETY: `mw` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(mw, readings::power_mw(&snap)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    dev: nvmlDevice_t,
    sensor: c_uint,
    celsius: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        let snap = snapshot(dev)?;
        if sensor != NVML_TEMPERATURE_GPU {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: `celsius` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(celsius, readings::temperature_c(&snap)) }
    })
}

/// PCIe traffic in KB/s over the last 20 ms; TX is device to host, as NVML counts.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    dev: nvmlDevice_t,
    counter: c_uint,
    kib_per_s: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        let snap = snapshot(dev)?;
        let direction = match counter {
            NVML_PCIE_UTIL_TX_BYTES => Direction::DeviceToHost,
            NVML_PCIE_UTIL_RX_BYTES => Direction::HostToDevice,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        // SAFETY: `kib_per_s` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(kib_per_s, snap.pcie_kib_per_s(direction)) }
    })
}
