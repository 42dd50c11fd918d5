//! NVML's C types and return codes, as nvml.h (and nvml-wrapper-sys 0.10) define them.
#![allow(non_camel_case_types, non_snake_case, reason = "names as in nvml.h")]
use std::ffi::{c_char, c_uint, c_ulonglong, c_void};

pub type nvmlReturn_t = c_uint;
pub type nvmlDevice_t = *mut c_void;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// nvmlSamplingType_t: the only type we sample.
pub const NVML_GPU_UTILIZATION_SAMPLES: c_uint = 1;
/// nvmlValueType_t of our samples.
pub const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
/// nvmlPcieUtilCounter_t.
pub const NVML_PCIE_UTIL_TX_BYTES: c_uint = 0;
pub const NVML_PCIE_UTIL_RX_BYTES: c_uint = 1;
/// nvmlClockType_t.
pub const NVML_CLOCK_GRAPHICS: c_uint = 0;
pub const NVML_CLOCK_SM: c_uint = 1;
pub const NVML_CLOCK_MEM: c_uint = 2;
pub const NVML_CLOCK_VIDEO: c_uint = 3;
/// nvmlTemperatureSensors_t.
pub const NVML_TEMPERATURE_GPU: c_uint = 0;
/// nvmlClocksEventReasonGpuIdle (formerly ...ThrottleReason...).
pub const CLOCKS_EVENT_REASON_GPU_IDLE: c_ulonglong = 0x1;
/// nvmlClocksEventReasonHwSlowdown: the hardware slows the clocks (thermal or power brake).
pub const CLOCKS_EVENT_REASON_HW_SLOWDOWN: c_ulonglong = 0x8;
/// nvmlClocksEventReasonSwThermalSlowdown: the driver holds clocks down to cool the GPU.
pub const CLOCKS_EVENT_REASON_SW_THERMAL_SLOWDOWN: c_ulonglong = 0x20;
/// gpuInstanceId / computeInstanceId when the GPU is not partitioned (MIG off).
pub const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// nvmlValue_t: an 8-byte union; we only ever fill `uiVal`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union nvmlValue_t {
    pub dVal: f64,
    pub uiVal: c_uint,
    pub ullVal: c_ulonglong,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlSample_t {
    /// CPU timestamp in µs.
    pub timeStamp: c_ulonglong,
    pub sampleValue: nvmlValue_t,
}

/// The v2 layout, which nvmlDeviceGetComputeRunningProcesses_v3 fills.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    /// CPU timestamp in µs.
    pub timeStamp: c_ulonglong,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2`: the struct size with version 2 in the top byte, as NVML_STRUCT_VERSION makes.
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

/// `NVML_GPM_SUPPORT_VERSION` and `NVML_GPM_METRICS_GET_VERSION` (nvml.h: both 1).
pub const NVML_GPM_SUPPORT_VERSION: c_uint = 1;
pub const NVML_GPM_METRICS_GET_VERSION: c_uint = 1;
/// `NVML_GPM_METRIC_MAX`: the length of `nvmlGpmMetricsGet_t.metrics` (12.8 headers; older
/// headers had fewer entries, and only `numMetrics` of them are ever touched).
pub const NVML_GPM_METRIC_MAX: usize = 210;
/// The `nvmlGpmMetricId_t` values this library computes.
pub const NVML_GPM_METRIC_GRAPHICS_UTIL: c_uint = 1;
pub const NVML_GPM_METRIC_SM_UTIL: c_uint = 2;
pub const NVML_GPM_METRIC_SM_OCCUPANCY: c_uint = 3;
pub const NVML_GPM_METRIC_PCIE_TX_PER_SEC: c_uint = 20;
pub const NVML_GPM_METRIC_PCIE_RX_PER_SEC: c_uint = 21;

/// `nvmlGpmSample_t`: an opaque pointer the library hands out; ours is never dereferenced.
pub type nvmlGpmSample_t = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlGpmSupport_t {
    pub version: c_uint,
    pub isSupportedDevice: c_uint,
}

/// The anonymous `metricInfo` struct of `nvmlGpmMetric_t`: static strings the library owns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlGpmMetricInfo_t {
    pub shortName: *mut c_char,
    pub longName: *mut c_char,
    pub unit: *mut c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlGpmMetric_t {
    /// IN: the metric to compute.
    pub metricId: c_uint,
    /// OUT: this metric's own result.
    pub nvmlReturn: nvmlReturn_t,
    pub value: f64,
    pub metricInfo: nvmlGpmMetricInfo_t,
}

/// The head of `nvmlGpmMetricsGet_t`; `metrics` (`NVML_GPM_METRIC_MAX` entries) follows it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlGpmMetricsGetHead_t {
    pub version: c_uint,
    pub numMetrics: c_uint,
    pub sample1: nvmlGpmSample_t,
    pub sample2: nvmlGpmSample_t,
}

/// `nvmlGpmMetricsGet_t` as nvml.h has it (used for layout checks and offsets).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlGpmMetricsGet_t {
    pub head: nvmlGpmMetricsGetHead_t,
    pub metrics: [nvmlGpmMetric_t; NVML_GPM_METRIC_MAX],
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper_sys::bindings as sys;
    use std::mem::{align_of, size_of};

    /// Our structs must be laid out exactly as the bindings nvml-wrapper reads them with.
    #[test]
    fn layouts_match_nvml_wrapper_sys() {
        macro_rules! same {
            ($ours:ty, $theirs:ty) => {
                assert_eq!(size_of::<$ours>(), size_of::<$theirs>(), stringify!($ours));
                assert_eq!(
                    align_of::<$ours>(),
                    align_of::<$theirs>(),
                    stringify!($ours)
                );
            };
        }
        same!(nvmlUtilization_t, sys::nvmlUtilization_t);
        same!(nvmlSample_t, sys::nvmlSample_t);
        same!(nvmlValue_t, sys::nvmlValue_t);
        same!(nvmlProcessInfo_t, sys::nvmlProcessInfo_t);
        same!(
            nvmlProcessUtilizationSample_t,
            sys::nvmlProcessUtilizationSample_t
        );
        same!(nvmlMemory_v2_t, sys::nvmlMemory_v2_t);
        same!(nvmlPciInfo_t, sys::nvmlPciInfo_t);
        assert_eq!(size_of::<nvmlSample_t>(), 16);
        assert_eq!(std::mem::offset_of!(nvmlProcessInfo_t, usedGpuMemory), 8);
        assert_eq!(std::mem::offset_of!(nvmlPciInfo_t, busId), 36);
        assert_eq!(
            NVML_MEMORY_V2,
            (size_of::<sys::nvmlMemory_v2_t>() | (2 << 24)) as c_uint
        );
        assert_eq!(
            NVML_ERROR_NOT_FOUND,
            sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND
        );
        assert_eq!(
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
            sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        assert_eq!(
            CLOCKS_EVENT_REASON_GPU_IDLE,
            u64::from(sys::nvmlClocksThrottleReasonGpuIdle)
        );
        assert_eq!(
            CLOCKS_EVENT_REASON_HW_SLOWDOWN,
            u64::from(sys::nvmlClocksThrottleReasonHwSlowdown)
        );
        assert_eq!(
            CLOCKS_EVENT_REASON_SW_THERMAL_SLOWDOWN,
            u64::from(sys::nvmlClocksThrottleReasonSwThermalSlowdown)
        );
        same!(nvmlGpmSupport_t, sys::nvmlGpmSupport_t);
        same!(nvmlGpmMetric_t, sys::nvmlGpmMetric_t);
        same!(nvmlGpmMetricInfo_t, sys::nvmlGpmMetric_t__bindgen_ty_1);
        same!(nvmlGpmMetricsGet_t, sys::nvmlGpmMetricsGet_t);
        assert_eq!(
            std::mem::offset_of!(nvmlGpmMetricsGet_t, metrics),
            std::mem::offset_of!(sys::nvmlGpmMetricsGet_t, metrics)
        );
        assert_eq!(std::mem::offset_of!(nvmlGpmMetric_t, metricInfo), 16);
        assert_eq!(NVML_GPM_SUPPORT_VERSION, sys::NVML_GPM_SUPPORT_VERSION);
        assert_eq!(
            NVML_GPM_METRICS_GET_VERSION,
            sys::NVML_GPM_METRICS_GET_VERSION
        );
        assert_eq!(
            NVML_GPM_METRIC_MAX,
            sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_MAX as usize
        );
        assert_eq!(
            (
                NVML_GPM_METRIC_GRAPHICS_UTIL,
                NVML_GPM_METRIC_SM_UTIL,
                NVML_GPM_METRIC_SM_OCCUPANCY,
                NVML_GPM_METRIC_PCIE_TX_PER_SEC,
                NVML_GPM_METRIC_PCIE_RX_PER_SEC
            ),
            (
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC
            )
        );
    }
}
