//! The GPM entry points nvml-wrapper 0.13 calls: device support, sample alloc/free/get, and
//! metrics from two samples (see `gpm`). `STALLSCOPE_SIMGPU_GPM=0` makes the GPUs pre-Hopper:
//! no support, and sampling or computing metrics is NVML_ERROR_NOT_SUPPORTED (allocating and
//! freeing sample buffers still works, as it needs no device).
use std::ffi::c_uint;

use crate::gpm::{self, Reading};
use crate::state::{self, checked, gpm_supported};
use crate::types::{
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED,
    NVML_GPM_METRIC_MAX, NVML_GPM_METRICS_GET_VERSION, NVML_GPM_SUPPORT_VERSION, NVML_SUCCESS,
    nvmlDevice_t, nvmlGpmMetric_t, nvmlGpmMetricInfo_t, nvmlGpmMetricsGet_t,
    nvmlGpmMetricsGetHead_t, nvmlGpmSample_t, nvmlGpmSupport_t, nvmlReturn_t,
};
use crate::{guarded, write_out};

/// Whether GPU `dev` supports GPM. The caller sets `version` to NVML_GPM_SUPPORT_VERSION.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    dev: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    guarded(|| {
        checked(dev)?;
        if support.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null and pointing to an nvmlGpmSupport_t, per the API contract.
        let version = unsafe { (&raw const (*support).version).read_unaligned() };
        if version != NVML_GPM_SUPPORT_VERSION {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let answer = nvmlGpmSupport_t {
            version,
            isSupportedDevice: c_uint::from(gpm_supported()),
        };
        // SAFETY: as above.
        unsafe { write_out(support, answer) }
    })
}

/// A new sample buffer (an opaque handle), empty until nvmlGpmSampleGet fills it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    guarded(|| {
        state::device()?;
        if sample.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let handle = gpm::alloc();
        // SAFETY: `sample` is a non-null out-pointer, per the API contract.
        unsafe { write_out(sample, handle as nvmlGpmSample_t) }
    })
}

/// Frees a sample buffer; one this library did not hand out (or freed already) is
/// NVML_ERROR_INVALID_ARGUMENT, as nvml.h says for an invalid pointer.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    guarded(|| {
        if gpm::free(sample as usize) {
            Ok(())
        } else {
            Err(NVML_ERROR_INVALID_ARGUMENT)
        }
    })
}

/// Reads GPU `dev`'s counters into `sample`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpmSampleGet(dev: nvmlDevice_t, sample: nvmlGpmSample_t) -> nvmlReturn_t {
    guarded(|| {
        let gpu = checked(dev)?;
        if !gpm_supported() {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        gpu.reap_dead();
        let reading = Reading {
            device: gpu.index(),
            totals: gpu.totals(),
        };
        if gpm::fill(sample as usize, reading) {
            Ok(())
        } else {
            Err(NVML_ERROR_INVALID_ARGUMENT)
        }
    })
}

/// Computes `numMetrics` metrics between `sample1` and `sample2` into `metrics[..numMetrics]`:
/// each entry gets its own return code (NVML_ERROR_NOT_SUPPORTED for what the simulation does
/// not model), value and names. The call itself fails for a bad version, bad or unfilled
/// samples, samples of two GPUs, or samples under 100 ms apart (NVML_ERROR_INVALID_ARGUMENT:
/// nvml.h asks for 100 ms but names no error).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    guarded(|| {
        state::device()?;
        if request.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null and pointing to an nvmlGpmMetricsGet_t, per the API contract. Only
        // the head and the first `numMetrics` entries are touched, so a caller built against an
        // older nvml.h (a shorter `metrics` array) is served as well.
        let head = unsafe { request.cast::<nvmlGpmMetricsGetHead_t>().read_unaligned() };
        if head.version != NVML_GPM_METRICS_GET_VERSION {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        if !gpm_supported() {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        let count = head.numMetrics as usize;
        if count > NVML_GPM_METRIC_MAX {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let sample =
            |s: nvmlGpmSample_t| gpm::reading(s as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT);
        let (old, new) = gpm::interval(sample(head.sample1)?, sample(head.sample2)?)?;
        // SAFETY: `metrics` lies at this offset inside the caller's struct.
        let metrics = unsafe {
            request
                .cast::<u8>()
                .add(std::mem::offset_of!(nvmlGpmMetricsGet_t, metrics))
                .cast::<nvmlGpmMetric_t>()
        };
        for i in 0..count {
            // SAFETY: entry i < numMetrics of the caller's array (API contract: the array holds
            // at least numMetrics entries).
            let entry = unsafe { metrics.add(i) };
            // SAFETY: as above; the caller set metricId.
            let id = unsafe { (&raw const (*entry).metricId).read_unaligned() };
            let (code, value) = match gpm::metric(id, &old, &new) {
                Ok(v) => (NVML_SUCCESS, v),
                Err(code) => (code, 0.0),
            };
            let null = std::ptr::null_mut();
            let names = gpm::info(id).map_or(
                nvmlGpmMetricInfo_t {
                    shortName: null,
                    longName: null,
                    unit: null,
                },
                |(short, long, unit)| nvmlGpmMetricInfo_t {
                    shortName: short.as_ptr().cast_mut(),
                    longName: long.as_ptr().cast_mut(),
                    unit: unit.as_ptr().cast_mut(),
                },
            );
            let result = nvmlGpmMetric_t {
                metricId: id,
                nvmlReturn: code,
                value,
                metricInfo: names,
            };
            // SAFETY: as above; the entry is writable (IN/OUT struct).
            unsafe { entry.write_unaligned(result) };
        }
        Ok(())
    })
}
