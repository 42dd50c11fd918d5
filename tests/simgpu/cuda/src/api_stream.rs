//! Streams and events.
//!
//! A stream sync waits for the stream's last operation (which itself waited for everything
//! before it) and for the events the stream was told to wait for since. An event record is like
//! an operation on the stream: it is reached once all work it is ordered after is done, and its
//! time is when that happened (or the record call itself, if the stream was idle).
//! cuStreamWaitEvent makes a stream's later work wait for an event's work (see `tables`).
use std::ffi::{c_uint, c_void};

use simgpu_state::clock::monotonic_ns;

use crate::driver::{current_ctx, driver, wait_all};
use crate::result::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_READY, CUresult, CuResult,
};
use crate::tables::{EventInfo, Recorded, StreamInfo};
use crate::{guarded, handle, per_thread, to_handle, write_out};

type CUstream = *mut c_void;
type CUevent = *mut c_void;

const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// cuStreamWaitEvent's only flag (`CU_EVENT_WAIT_EXTERNAL`, for graphs): accepted, no effect.
const CU_EVENT_WAIT_EXTERNAL: c_uint = 0x1;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        if stream.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut tables = driver.tables();
        let ctx = driver.require_ctx(&tables)?;
        let h = tables.new_handle();
        let info = StreamInfo::new(ctx, flags & CU_STREAM_NON_BLOCKING != 0);
        tables.streams.insert(h, info);
        // SAFETY: `stream` is a non-null out-pointer, per the API contract.
        unsafe { write_out(stream, to_handle(h)) }
    })
}

/// Returns at once; queued work of the stream still runs, as with the real driver.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        let removed = driver.tables().streams.remove(&handle(stream));
        removed.map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    })
}

fn stream_sync(stream: u64) -> CuResult<()> {
    let driver = driver()?;
    let pending = {
        let tables = driver.tables();
        let key = tables.stream(stream, current_ctx())?;
        tables.own_pending(key)
    };
    wait_all(&pending);
    Ok(())
}

/// Blocks, spinning on-CPU, until the stream's work is done.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    guarded(|| stream_sync(handle(stream)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult {
    guarded(|| stream_sync(per_thread(handle(stream))))
}

/// CUDA_ERROR_NOT_READY while the stream's work, or an event it waits for, is pending.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(stream: CUstream) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        let tables = driver.tables();
        let key = tables.stream(handle(stream), current_ctx())?;
        if tables.own_pending(key).is_empty() {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    })
}

/// cuStreamWaitEvent's body: work queued on `stream` after this waits for the event's recorded
/// work (as of now: a later record of the same event does not count). A never-recorded event
/// is a no-op, as in CUDA.
fn stream_wait_event(stream: u64, event: CUevent, flags: c_uint) -> CuResult<()> {
    let driver = driver()?;
    if flags & !CU_EVENT_WAIT_EXTERNAL != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut tables = driver.tables();
    let key = tables.stream(stream, current_ctx())?;
    let after = tables
        .events
        .get(&handle(event))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .recorded
        .as_ref()
        .map_or_else(Vec::new, |r| r.after.clone());
    tables.add_waits(key, after);
    Ok(())
}

/// Makes later work of `stream` wait for `event`; returns at once.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint) -> CUresult {
    guarded(|| stream_wait_event(handle(stream), event, flags))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent_ptsz(
    stream: CUstream,
    event: CUevent,
    flags: c_uint,
) -> CUresult {
    guarded(|| stream_wait_event(per_thread(handle(stream)), event, flags))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        if event.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut tables = driver.tables();
        driver.require_ctx(&tables)?;
        let h = tables.new_handle();
        let info = EventInfo {
            timing: flags & CU_EVENT_DISABLE_TIMING == 0,
            recorded: None,
        };
        tables.events.insert(h, info);
        // SAFETY: `event` is a non-null out-pointer, per the API contract.
        unsafe { write_out(event, to_handle(h)) }
    })
}

fn event_record(event: CUevent, stream: u64) -> CuResult<()> {
    let driver = driver()?;
    let mut tables = driver.tables();
    let key = tables.stream(stream, current_ctx())?;
    let after = tables.pending_before(key);
    let info = tables
        .events
        .get_mut(&handle(event))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    info.recorded = Some(Recorded {
        after,
        recorded_ns: monotonic_ns(),
    });
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult {
    guarded(|| event_record(event, handle(stream)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord_ptsz(event: CUevent, stream: CUstream) -> CUresult {
    guarded(|| event_record(event, per_thread(handle(stream))))
}

/// The work an event waits for (empty if never recorded).
fn event_after(event: CUevent) -> CuResult<Vec<std::sync::Arc<crate::engine::Op>>> {
    let driver = driver()?;
    let tables = driver.tables();
    let info = tables
        .events
        .get(&handle(event))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(info
        .recorded
        .as_ref()
        .map_or_else(Vec::new, |r| r.after.clone()))
}

/// Blocks, spinning on-CPU, until the event is reached.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    guarded(|| {
        wait_all(&event_after(event)?);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(event: CUevent) -> CUresult {
    guarded(|| {
        if event_after(event)?.iter().all(|op| op.is_done()) {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    })
}

/// When a recorded event was reached (CLOCK_MONOTONIC ns), or why there is no such time.
fn event_time_ns(info: Option<&EventInfo>) -> CuResult<u64> {
    let info = info.ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let recorded = info
        .recorded
        .as_ref()
        .filter(|_| info.timing)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    recorded
        .after
        .iter()
        .try_fold(recorded.recorded_ns, |t, op| {
            op.done_ns().map(|d| t.max(d)).ok_or(CUDA_ERROR_NOT_READY)
        })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        if ms.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (t0, t1) = {
            let tables = driver.tables();
            let t0 = event_time_ns(tables.events.get(&handle(start)))?;
            let t1 = event_time_ns(tables.events.get(&handle(end)))?;
            (t0, t1)
        };
        let elapsed_ms = (t1 as f64 - t0 as f64) / 1e6;
        // SAFETY: `ms` is a non-null out-pointer, per the API contract.
        unsafe { write_out(ms, elapsed_ms as f32) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(event: CUevent) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        let removed = driver.tables().events.remove(&handle(event));
        removed.map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    })
}
