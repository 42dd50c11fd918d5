//! Contexts: created and primary contexts, the current context, cuCtxSynchronize.
//!
//! Each live context counts once in the process's slot of the shared state, which is what NVML's
//! running-process list shows; the slot goes away with the last context.
use std::ffi::{c_int, c_uint, c_void};

use crate::driver::{Driver, current_ctx, driver, set_current_ctx, wait_all};
use crate::memory::unmap;
use crate::result::{CUDA_ERROR_INVALID_CONTEXT, CUresult, CuResult};
use crate::tables::{Context, Tables};
use crate::{guarded, handle, to_handle, write_out};

type CUcontext = *mut c_void;

/// Adds a context on GPU `dev` to the tables and the shared state; returns its handle.
fn create_context(
    driver: &'static Driver,
    tables: &mut Tables,
    dev: c_int,
    primary: bool,
) -> CuResult<u64> {
    let device = driver.gpu(dev)?.index();
    driver.register(device)?;
    let ctx = tables.new_handle();
    tables.contexts.insert(ctx, Context::new(device, primary));
    Ok(ctx)
}

/// Waits for the context's work, frees what was created in it, and unregisters it.
fn destroy_context(driver: &Driver, ctx: u64) -> CuResult<()> {
    let pending = driver.tables().pending_in_ctx(ctx);
    wait_all(&pending);
    let (device, allocs) = {
        let mut tables = driver.tables();
        let device = tables.context(ctx)?.device;
        (device, tables.remove_context(ctx))
    };
    let gpu = driver.gpu(device as c_int)?;
    for (backing, reservation, len) in allocs {
        unmap(backing, len);
        unmap(reservation as usize, len);
        gpu.free_mem(driver.pid, len as u64);
    }
    driver.unregister(device);
    if current_ctx() == ctx {
        set_current_ctx(0);
    }
    Ok(())
}

/// Creates a context and makes it current on the calling thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    _flags: c_uint,
    dev: c_int,
) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        driver.gpu(dev)?;
        if pctx.is_null() {
            return Err(crate::result::CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = create_context(driver, &mut driver.tables(), dev, false)?;
        set_current_ctx(ctx);
        // SAFETY: `pctx` is a non-null out-pointer, per the API contract.
        unsafe { write_out(pctx, to_handle(ctx)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        let ctx = handle(ctx);
        if driver.tables().context(ctx)?.primary {
            // The primary context goes with its last cuDevicePrimaryCtxRelease.
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        destroy_context(driver, ctx)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        let ctx = handle(ctx);
        if ctx != 0 {
            driver.tables().context(ctx)?;
        }
        set_current_ctx(ctx);
        Ok(())
    })
}

/// NULL when the thread has no (live) current context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        let ctx = current_ctx();
        let live = driver.tables().context(ctx).is_ok();
        let value = if live {
            to_handle(ctx)
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: `pctx` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(pctx, value) }
    })
}

/// The GPU of the calling thread's current context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut c_int) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        let ordinal = {
            let tables = driver.tables();
            let ctx = driver.require_ctx(&tables)?;
            tables.context(ctx)?.device as c_int
        };
        // SAFETY: `device` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(device, ordinal) }
    })
}

/// Returns the primary context, creating it on the first retain; does not make it current.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: c_int) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        let device = driver.gpu(dev)?.index();
        if pctx.is_null() {
            return Err(crate::result::CUDA_ERROR_INVALID_VALUE);
        }
        let mut tables = driver.tables();
        let (ctx, refs) = match tables.primary.get(&device).copied() {
            Some((ctx, refs)) => (ctx, refs + 1),
            None => (create_context(driver, &mut tables, dev, true)?, 1),
        };
        tables.primary.insert(device, (ctx, refs));
        drop(tables);
        // SAFETY: `pctx` is a non-null out-pointer, per the API contract.
        unsafe { write_out(pctx, to_handle(ctx)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        let device = driver.gpu(dev)?.index();
        let ctx = {
            let mut tables = driver.tables();
            let (ctx, refs) = tables
                .primary
                .remove(&device)
                .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
            if refs > 1 {
                tables.primary.insert(device, (ctx, refs - 1));
                return Ok(());
            }
            ctx
        };
        destroy_context(driver, ctx)
    })
}

/// Blocks, spinning on-CPU, until all work of the current context is done.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    guarded(|| {
        let driver = driver()?;
        let pending = {
            let tables = driver.tables();
            let ctx = driver.require_ctx(&tables)?;
            tables.pending_in_ctx(ctx)
        };
        wait_all(&pending);
        Ok(())
    })
}
