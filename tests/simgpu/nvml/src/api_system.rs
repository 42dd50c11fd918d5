//! Library lifetime and system queries: init, shutdown, driver version, device enumeration.
use std::ffi::{c_char, c_uint};

use simgpu_state::device::{DRIVER_VERSION, OLD_DRIVER_VERSION};

use crate::state::{self, device_handle};
use crate::types::{NVML_ERROR_INVALID_ARGUMENT, nvmlDevice_t, nvmlReturn_t};
use crate::{guarded, write_out, write_str};

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guarded(state::init)
}

/// Exported because nvml-wrapper's `Drop for Nvml` calls it unconditionally.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guarded(state::shutdown)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        state::device()?;
        let v = if state::faults().old_driver {
            OLD_DRIVER_VERSION
        } else {
            DRIVER_VERSION
        };
        // SAFETY: `version` is NULL or a buffer of `length` bytes, per the API contract.
        unsafe { write_str(version, length, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    guarded(|| {
        let machine = state::device()?;
        // SAFETY: `count` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(count, machine.device_count()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guarded(|| {
        let machine = state::device()?;
        if machine.device(index).is_none() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: `device` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(device, device_handle(index)) }
    })
}

/// The index a handle was obtained with.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    guarded(|| {
        let gpu = state::checked(dev)?;
        // SAFETY: `index` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(index, gpu.index()) }
    })
}
