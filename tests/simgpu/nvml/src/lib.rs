//! Simulated NVML, built as `libnvidia_ml.so` and installed as `libnvidia-ml.so.1`.
//!
//! A test fixture: it exports the NVML functions that nvml-wrapper 0.13 calls for the readings
//! stallscope uses, and answers from what the simulated CUDA library recorded in the shared
//! state (utilization samples, processes, PCIe link and traffic, GPM's SM activity). Every other NVML symbol is
//! missing on purpose: nvml-wrapper then reports `FailedToLoadSymbol` for it, as with an old
//! driver. Every export runs under [`guarded`], so a panic becomes `NVML_ERROR_UNKNOWN`.
mod api_activity;
mod api_gpm;
mod api_health;
mod api_identity;
mod api_system;
mod gpm;
mod readings;
mod state;
mod types;

use std::ffi::{c_char, c_uint};

use state::NvResult;
use types::{
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_UNKNOWN, NVML_SUCCESS,
    nvmlReturn_t,
};

/// Runs an API body, mapping `Err(code)` and panics to an nvmlReturn_t.
fn guarded(body: impl FnOnce() -> NvResult<()>) -> nvmlReturn_t {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

/// Stores `value` through a caller's out-pointer; NULL is NVML_ERROR_INVALID_ARGUMENT.
///
/// # Safety
/// `out` must be NULL or valid for a write of `T` (the NVML contract for out-parameters).
unsafe fn write_out<T>(out: *mut T, value: T) -> NvResult<()> {
    if out.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and valid for writes per this function's contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// Copies `text` and a NUL into a caller's buffer of `len` bytes.
///
/// # Safety
/// `buf` must be NULL or valid for writes of `len` bytes.
unsafe fn write_str(buf: *mut c_char, len: c_uint, text: &str) -> NvResult<()> {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < text.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds `len` >= text.len() + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        buf.add(text.len()).write(0);
    }
    Ok(())
}

/// `text` as a fixed, NUL-padded C char array (truncated to leave a NUL).
fn c_array<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (dst, src) in out.iter_mut().zip(text.bytes().take(N - 1)) {
        *dst = src as c_char;
    }
    out
}
