//! Simulated NCCL, built as `libnccl.so` and installed as `libnccl.so.2`.
//!
//! A test fixture: the ranks of a communicator are separate processes on simulated GPUs (the
//! simulated `libcuda.so.1`). A collective only queues work on the caller's stream and returns,
//! as NCCL does; when the stream gets there, the rank waits until every rank's stream has
//! reached the same collective (`rendezvous`: a small shared file named after the unique id)
//! and then moves the data for the transfer time (`cost`). By default both happen in one comm
//! kernel, so the GPU is busy while it waits, as with real NCCL; `STALLSCOPE_SIMGPU_NCCL_WAIT=idle`
//! waits with the GPU idle instead (`wait`). The host thread sees the wait in its next stream
//! sync. Every export runs under [`guarded`], so a panic becomes `ncclInternalError`.
mod api;
mod api_coll;
mod comm;
mod cost;
mod cuda;
mod group;
mod rendezvous;
mod types;
mod wait;

use types::{NCCL_INTERNAL_ERROR, NCCL_INVALID_ARGUMENT, NCCL_SUCCESS, NcclResult, ncclResult_t};

/// Runs an API body, mapping `Err(code)` and panics to an ncclResult_t.
fn guarded(body: impl FnOnce() -> NcclResult<()>) -> ncclResult_t {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => NCCL_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => NCCL_INTERNAL_ERROR,
    }
}

/// Stores `value` through a caller's out-pointer; NULL is ncclInvalidArgument.
///
/// # Safety
/// `out` must be NULL or valid for a write of `T`.
unsafe fn write_out<T>(out: *mut T, value: T) -> NcclResult<()> {
    if out.is_null() {
        return Err(NCCL_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and valid for writes per this function's contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}
