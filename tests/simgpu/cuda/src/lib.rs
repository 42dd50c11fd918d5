//! Simulated CUDA driver API, built as `libcuda.so` and installed as `libcuda.so.1`.
//!
//! A test fixture for CI machines without a GPU: it exports the driver functions a training
//! job's host side calls (same C names and ABIs as cuda.h), runs the queued work on three device
//! threads per GPU and process (compute, copy, comm) with real timing, and records what the
//! "device" did in the shared state that the simulated NVML reports from. One export is not
//! CUDA's: `simgpuLaunchCommKernel`, the simulated NCCL's kernel (see `api_launch`). See `engine`
//! for timing, `tables` for stream order.
//!
//! Every exported function runs its body under [`guarded`]: a panic becomes
//! `CUDA_ERROR_UNKNOWN` instead of unwinding into C.
mod api_copy;
mod api_ctx;
mod api_init;
mod api_launch;
mod api_mem;
mod api_stream;
mod driver;
mod engine;
mod memory;
mod ptx;
mod result;
mod staging;
mod tables;
mod wait;

use result::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, CUresult, CuResult};

/// Runs an API body, mapping `Err(code)` and panics to a CUresult.
fn guarded(body: impl FnOnce() -> CuResult<()>) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// Stores `value` through a caller-supplied out-pointer; NULL is CUDA_ERROR_INVALID_VALUE.
///
/// # Safety
/// `out` must be NULL or valid for a write of `T` (the CUDA API contract for out-parameters).
unsafe fn write_out<T>(out: *mut T, value: T) -> CuResult<()> {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for writes per this function's contract; unaligned writes
    // are allowed since C callers may pack structures.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// A handle argument (a pointer-typed opaque value) as our table key.
fn handle<T>(ptr: *mut T) -> u64 {
    ptr as usize as u64
}

/// The stream a `_ptsz` entry point means: NULL there is the per-thread default stream
/// (`CU_STREAM_PER_THREAD`), not the legacy one. Also keeps each `_ptsz` body different from its
/// plain twin, so the linker cannot fold the two into one address (a uprobe on each must see
/// only its own calls).
fn per_thread(stream: u64) -> u64 {
    if stream == 0 {
        tables::CU_STREAM_PER_THREAD
    } else {
        stream
    }
}

/// A table key as the pointer-typed handle C expects.
fn to_handle<T>(key: u64) -> *mut T {
    key as usize as *mut T
}
