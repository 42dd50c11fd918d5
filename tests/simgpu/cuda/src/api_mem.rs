//! Device memory and page-locked host memory.
//!
//! Frees synchronize first, as the real cuMemFree / cuMemFreeHost do, so the engines never touch
//! unmapped memory.
use std::ffi::{c_int, c_uint, c_void};

use crate::driver::{driver, wait_all};
use crate::memory::{DeviceAlloc, PinnedRange, map, unmap};
use crate::result::{
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult, CuResult,
};
use crate::{guarded, write_out};

/// `CUdeviceptr` (v2): a 64-bit device address.
type CUdeviceptr = u64;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        if dptr.is_null() || bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut tables = driver.tables();
        let ctx = driver.require_ctx(&tables)?;
        let device = tables.context(ctx)?.device;
        let gpu = driver.gpu(device as c_int)?;
        if !gpu.try_alloc_mem(driver.pid, bytes as u64) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let mapped = map(bytes, false, false).and_then(|reservation| {
            map(bytes, true, false)
                .map(|backing| (reservation, backing))
                .inspect_err(|_| unmap(reservation, bytes))
        });
        let (reservation, backing) = mapped.inspect_err(|_| {
            gpu.free_mem(driver.pid, bytes as u64);
        })?;
        tables.memory.device.insert(
            reservation as u64,
            DeviceAlloc {
                len: bytes,
                backing,
                ctx,
                device,
            },
        );
        // SAFETY: `dptr` is a non-null out-pointer, per the API contract.
        unsafe { write_out(dptr, reservation as u64) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        let pending = {
            let tables = driver.tables();
            let alloc = tables
                .memory
                .device
                .get(&dptr)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            tables.pending_in_ctx(alloc.ctx)
        };
        wait_all(&pending);
        let alloc = driver
            .tables()
            .memory
            .device
            .remove(&dptr)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        unmap(alloc.backing, alloc.len);
        unmap(dptr as usize, alloc.len);
        driver
            .gpu(alloc.device as c_int)?
            .free_mem(driver.pid, alloc.len as u64);
        Ok(())
    })
}

/// Allocates page-locked memory: mapped and populated up front, like the real driver's pinned
/// allocations (which is also why they are slow to make).
///
/// # Safety
/// `pp` must be NULL or valid for a pointer-sized write.
unsafe fn host_alloc(pp: *mut *mut c_void, bytes: usize) -> CuResult<()> {
    let driver = driver()?;
    if pp.is_null() || bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut tables = driver.tables();
    driver.require_ctx(&tables)?;
    let addr = map(bytes, true, true)?;
    tables.memory.pinned.insert(
        addr,
        PinnedRange {
            len: bytes,
            owned: true,
        },
    );
    // SAFETY: `pp` is a non-null out-pointer, per the API contract.
    unsafe { write_out(pp, addr as *mut c_void) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytes: usize,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: `pp` is NULL or an out-pointer, per the API contract.
    guarded(|| unsafe { host_alloc(pp, bytes) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) -> CUresult {
    // SAFETY: `pp` is NULL or an out-pointer, per the API contract.
    guarded(|| unsafe { host_alloc(pp, bytes) })
}

/// Removes the pinned range starting at `p` if `owned` matches, after all queued work is done.
fn remove_pinned(p: *mut c_void, owned: bool, not_found: CUresult) -> CuResult<usize> {
    let driver = driver()?;
    let addr = p as usize;
    let pending = {
        let tables = driver.tables();
        match tables.memory.pinned.get(&addr) {
            Some(r) if r.owned == owned => tables.pending_anywhere(),
            _ => return Err(not_found),
        }
    };
    wait_all(&pending);
    let range = driver
        .tables()
        .memory
        .pinned
        .remove(&addr)
        .ok_or(not_found)?;
    Ok(range.len)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guarded(|| {
        let len = remove_pinned(p, true, CUDA_ERROR_INVALID_VALUE)?;
        unmap(p as usize, len);
        Ok(())
    })
}

/// Page-locks an existing range. The pages are really locked (mlock; a failure, e.g. from
/// RLIMIT_MEMLOCK, is ignored), so the call costs what it costs on a real machine.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, _flags: c_uint) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        if p.is_null() || bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut tables = driver.tables();
        driver.require_ctx(&tables)?;
        let addr = p as usize;
        if tables.memory.overlaps_pinned(addr, bytes) {
            return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        // SAFETY: mlock only changes the residency of the caller's pages; an invalid range
        // fails with ENOMEM, which we ignore.
        unsafe { libc::mlock(p, bytes) };
        tables.memory.pinned.insert(
            addr,
            PinnedRange {
                len: bytes,
                owned: false,
            },
        );
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    guarded(|| {
        let len = remove_pinned(p, false, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)?;
        // SAFETY: undoes our own mlock of the same range; has no effect on memory contents.
        unsafe { libc::munlock(p, len) };
        Ok(())
    })
}
