//! Initialization, device queries and error strings.
use std::ffi::{c_char, c_int, c_uint};

use simgpu_state::device;

use crate::driver::{driver, init};
use crate::result::{self, CUDA_ERROR_INVALID_VALUE, CUresult, CuResult};
use crate::{guarded, write_out};

/// `CUdevice` is an int ordinal, 0 to the machine's GPU count minus one.
type CUdevice = c_int;

/// Checks that GPU `dev` exists; returns its index.
fn check_device(dev: CUdevice) -> CuResult<u32> {
    Ok(driver()?.gpu(dev)?.index())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guarded(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        init().map(|_| ())
    })
}

/// Works before cuInit, as the real one does.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: `version` is NULL or an out-pointer, per the API contract.
    guarded(|| unsafe { write_out(version, device::CUDA_DRIVER_VERSION) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guarded(|| {
        let n = driver()?.device_count();
        // SAFETY: `count` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(count, n) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    guarded(|| {
        check_device(ordinal)?;
        // SAFETY: `dev` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(dev, ordinal) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guarded(|| {
        check_device(dev)?;
        let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if name.is_null() || len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let text = device::NAME.as_bytes();
        let n = text.len().min(len - 1);
        // SAFETY: the caller's buffer holds `len` bytes (API contract); we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guarded(|| {
        check_device(dev)?;
        let total =
            usize::try_from(device::MEMORY_TOTAL_BYTES).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `bytes` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(bytes, total) }
    })
}

/// The attribute values we answer for GPU `index` (CUdevice_attribute numbers from cuda.h).
fn attribute(attrib: c_int, index: u32) -> Option<c_int> {
    Some(match attrib {
        1 => 1024,                                       // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                                   // MAX_BLOCK_DIM_X, _Y
        4 => 64,                                         // MAX_BLOCK_DIM_Z
        5 => i32::MAX,                                   // MAX_GRID_DIM_X
        6 | 7 => 65_535,                                 // MAX_GRID_DIM_Y, _Z
        8 => 49_152,                                     // MAX_SHARED_MEMORY_PER_BLOCK
        10 => 32,                                        // WARP_SIZE
        13 => device::SM_CLOCK_BUSY_MHZ as c_int * 1000, // CLOCK_RATE (kHz)
        16 => device::SM_COUNT,                          // MULTIPROCESSOR_COUNT
        19 => 1,                                         // CAN_MAP_HOST_MEMORY
        31 => 1,                                         // CONCURRENT_KERNELS
        33 => device::pci_bus(index) as c_int,           // PCI_BUS_ID
        34 => device::PCI_DEVICE as c_int,               // PCI_DEVICE_ID
        36 => device::MEM_CLOCK_MHZ as c_int * 1000,     // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,                                      // GLOBAL_MEMORY_BUS_WIDTH
        39 => 2048,                                      // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 2,                            // ASYNC_ENGINE_COUNT: one copy engine each way
        41 => 1,                            // UNIFIED_ADDRESSING
        50 => device::PCI_DOMAIN as c_int,  // PCI_DOMAIN_ID
        75 => device::COMPUTE_CAPABILITY.0, // COMPUTE_CAPABILITY_MAJOR
        76 => device::COMPUTE_CAPABILITY.1, // COMPUTE_CAPABILITY_MINOR
        _ => return None,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attrib: c_int,
    dev: CUdevice,
) -> CUresult {
    guarded(|| {
        let index = check_device(dev)?;
        let v = attribute(attrib, index).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `value` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(value, v) }
    })
}

/// Works before cuInit. Unknown codes give NULL and CUDA_ERROR_INVALID_VALUE, as the real one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, text: *mut *const c_char) -> CUresult {
    guarded(|| {
        let found = result::description(error);
        // SAFETY: `text` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(text, found.map_or(std::ptr::null(), |s| s.as_ptr())) }?;
        found.map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    })
}

/// Works before cuInit. Unknown codes give NULL and CUDA_ERROR_INVALID_VALUE, as the real one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, text: *mut *const c_char) -> CUresult {
    guarded(|| {
        let found = result::name(error);
        // SAFETY: `text` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(text, found.map_or(std::ptr::null(), |s| s.as_ptr())) }?;
        found.map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_answered_or_rejected() {
        assert_eq!(attribute(75, 0), Some(9));
        assert_eq!(attribute(16, 0), Some(132));
        assert_eq!(attribute(33, 0), Some(0x1b));
        assert_eq!(attribute(33, 1), Some(0x43));
        assert_eq!(attribute(9999, 0), None);
    }

    #[test]
    fn error_strings_work_without_init() {
        let mut p = std::ptr::null();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { cuGetErrorName(600, &mut p) }, 0);
        // SAFETY: the driver returned a static NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr(p) };
        assert_eq!(name, c"CUDA_ERROR_NOT_READY");
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { cuGetErrorString(4242, &mut p) }, 1);
        assert!(p.is_null());
    }
}
