//! Copies between host and device.
//!
//! What the real driver does, and so what a profiler must be able to see:
//! - Host to device from pageable memory (not from cuMemHostAlloc/cuMemAllocHost/
//!   cuMemHostRegister): the calling thread first memcpys the data into a pinned staging buffer,
//!   then the DMA is queued. That CPU time lands on the caller.
//! - Device to host into pageable memory: the DMA goes to a staging buffer, the calling thread
//!   waits for it even for an `Async` call, then memcpys into the destination.
//! - Pinned memory: the copy engine reads or writes it directly; `Async` calls return at once.
use std::ffi::c_void;

use crate::driver::{current_ctx, driver, wait_all};
use crate::engine::{CopyKind, Source, Work};
use crate::result::{CUDA_ERROR_INVALID_VALUE, CUresult, CuResult};
use crate::{guarded, handle, per_thread};

type CUdeviceptr = u64;
type CUstream = *mut c_void;

/// Host to device on `stream`; `wait` for the synchronous variant.
///
/// # Safety
/// `src` must be valid for reads of `bytes` bytes (and, if pinned, until the copy completes).
unsafe fn host_to_device(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: u64,
    wait: bool,
) -> CuResult<()> {
    let driver = driver()?;
    let pinned = {
        let tables = driver.tables();
        tables.stream(stream, current_ctx())?;
        tables.memory.device_span(dst, bytes)?;
        tables.memory.is_pinned(src as usize, bytes)
    };
    if bytes == 0 {
        return Ok(());
    }
    if src.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let source = if pinned {
        Source::Addr(src as usize)
    } else {
        // SAFETY: the caller's source is readable for `bytes` bytes (API contract).
        let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), bytes) };
        Source::Staged(driver.staging().stage(data))
    };
    let op = {
        let mut tables = driver.tables();
        let key = tables.stream(stream, current_ctx())?;
        let dest = tables.memory.device_span(dst, bytes)?;
        let work = Work::Copy {
            kind: CopyKind::HostToDevice,
            source,
            dest,
            bytes,
        };
        driver.submit(&mut tables, key, work)
    };
    if wait {
        wait_all(&[op]);
    }
    Ok(())
}

/// Device to host on `stream`; `wait` for the synchronous variant.
///
/// # Safety
/// `dst` must be valid for writes of `bytes` bytes (and, if pinned, until the copy completes).
unsafe fn device_to_host(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: u64,
    wait: bool,
) -> CuResult<()> {
    let driver = driver()?;
    if bytes == 0 {
        return Ok(());
    }
    if dst.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut staging: Option<Box<[u8]>> = None;
    let op = {
        let mut tables = driver.tables();
        let key = tables.stream(stream, current_ctx())?;
        let backing = tables.memory.device_span(src, bytes)?;
        let pinned = tables.memory.is_pinned(dst as usize, bytes);
        let dest = if pinned {
            dst as usize
        } else {
            staging.insert(driver.staging().take(bytes)).as_mut_ptr() as usize
        };
        let work = Work::Copy {
            kind: CopyKind::DeviceToHost,
            source: Source::Addr(backing),
            dest,
            bytes,
        };
        driver.submit(&mut tables, key, work)
    };
    if wait || staging.is_some() {
        wait_all(&[op]);
    }
    if let Some(buffer) = staging {
        // SAFETY: the copy engine filled `bytes` bytes of the buffer and has finished (waited
        // above); `dst` is writable for `bytes` bytes (API contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), bytes) };
        driver.staging().unstage(buffer, dst);
    }
    Ok(())
}

/// cuMemcpyAsync and cuMemcpy (`wait`): the direction follows from the addresses (unified
/// addressing).
///
/// # Safety
/// Host-side addresses must be valid for `bytes` bytes until the copy completes.
unsafe fn copy_unified(dst: u64, src: u64, bytes: usize, stream: u64, wait: bool) -> CuResult<()> {
    let driver = driver()?;
    let (dst_on_device, src_on_device) = {
        let tables = driver.tables();
        (tables.memory.is_device(dst), tables.memory.is_device(src))
    };
    match (dst_on_device, src_on_device) {
        // SAFETY: forwarded caller contract.
        (true, false) => unsafe {
            host_to_device(dst, src as usize as *const c_void, bytes, stream, wait)
        },
        // SAFETY: forwarded caller contract.
        (false, true) => unsafe {
            device_to_host(dst as usize as *mut c_void, src, bytes, stream, wait)
        },
        (true, true) | (false, false) => {
            if bytes == 0 {
                return Ok(());
            }
            let op = {
                let mut tables = driver.tables();
                let key = tables.stream(stream, current_ctx())?;
                let (kind, source, dest) = if dst_on_device {
                    let source = tables.memory.device_span(src, bytes)?;
                    let dest = tables.memory.device_span(dst, bytes)?;
                    (CopyKind::DeviceToDevice, source, dest)
                } else {
                    if dst == 0 || src == 0 {
                        return Err(CUDA_ERROR_INVALID_VALUE);
                    }
                    (CopyKind::HostToHost, src as usize, dst as usize)
                };
                let work = Work::Copy {
                    kind,
                    source: Source::Addr(source),
                    dest,
                    bytes,
                };
                driver.submit(&mut tables, key, work)
            };
            if wait {
                wait_all(&[op]);
            }
            Ok(())
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
) -> CUresult {
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { host_to_device(dst, src, bytes, 0, true) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { host_to_device(dst, src, bytes, handle(stream), false) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    let stream = per_thread(handle(stream));
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { host_to_device(dst, src, bytes, stream, false) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { device_to_host(dst, src, bytes, 0, true) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { device_to_host(dst, src, bytes, handle(stream), false) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    let stream = per_thread(handle(stream));
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { device_to_host(dst, src, bytes, stream, false) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { copy_unified(dst, src, bytes, handle(stream), false) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAsync_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    let stream = per_thread(handle(stream));
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { copy_unified(dst, src, bytes, stream, false) })
}

/// Synchronous copy in whichever direction the addresses say, on the legacy default stream.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult {
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { copy_unified(dst, src, bytes, 0, true) })
}
