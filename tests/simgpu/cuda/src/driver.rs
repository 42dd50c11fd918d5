//! The process-wide driver: shared device state, handle tables, engines and the calling
//! thread's current context. Created by cuInit.
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use simgpu_state::SharedDevice;

use crate::engine::{Engines, Op, Work, locked};
use crate::result::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NOT_INITIALIZED, CuResult,
};
use crate::tables::{StreamKey, Tables};
use crate::wait::host_spin_until;

pub struct Driver {
    pub device: SharedDevice,
    /// The pid that initialized the driver; a forked child must not act for its parent.
    pub pid: u32,
    tables: Mutex<Tables>,
    engines: Engines,
}

static DRIVER: OnceLock<Driver> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());
/// Pid registered in the shared state by this process's contexts, 0 if none (for the exit hook).
static REGISTERED: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// The calling thread's current context handle, 0 for none.
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

/// cuInit: opens the shared state and starts the engines, once per process.
pub fn init() -> CuResult<&'static Driver> {
    let _g = locked(&INIT);
    if DRIVER.get().is_some() {
        return driver();
    }
    let device = SharedDevice::open_from_env().map_err(|e| {
        eprintln!("simgpu: cuInit: {e}");
        CUDA_ERROR_NO_DEVICE
    })?;
    let pid = std::process::id();
    let _ = DRIVER.set(Driver {
        device,
        pid,
        tables: Mutex::new(Tables::default()),
        engines: Engines::new(),
    });
    let driver = DRIVER.get().ok_or(CUDA_ERROR_NO_DEVICE)?;
    driver.engines.start(&driver.device, pid).map_err(|e| {
        eprintln!("simgpu: cuInit: starting engine threads: {e}");
        CUDA_ERROR_NO_DEVICE
    })?;
    // SAFETY: `forget_at_exit` is an extern "C" fn with no arguments that never unwinds.
    unsafe { libc::atexit(forget_at_exit) };
    Ok(driver)
}

/// The driver, or CUDA_ERROR_NOT_INITIALIZED before cuInit. A child forked after cuInit has
/// no engine threads (fork copies only the calling thread), so, as with the real driver, CUDA
/// is unusable there rather than hanging on work no thread will run.
pub fn driver() -> CuResult<&'static Driver> {
    DRIVER
        .get()
        .filter(|d| d.pid == std::process::id())
        .ok_or(CUDA_ERROR_NOT_INITIALIZED)
}

/// Exit hook: drop this process from the shared state so NVML stops listing it.
extern "C" fn forget_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let pid = REGISTERED.load(Ordering::Relaxed);
        if let Some(driver) = DRIVER.get()
            && pid != 0
            && pid == std::process::id()
        {
            driver.device.forget_process(pid);
        }
    });
}

pub fn current_ctx() -> u64 {
    CURRENT.with(Cell::get)
}

pub fn set_current_ctx(ctx: u64) {
    CURRENT.with(|c| c.set(ctx));
}

impl Driver {
    pub fn tables(&self) -> MutexGuard<'_, Tables> {
        locked(&self.tables)
    }

    /// The calling thread's current context, checked to be alive.
    pub fn require_ctx(&self, tables: &Tables) -> CuResult<u64> {
        let ctx = current_ctx();
        tables.context(ctx).map(|_| ctx)
    }

    /// Staging buffers for pageable copies.
    pub fn staging(&self) -> &crate::staging::StagingPool {
        self.engines.staging()
    }

    /// Records a new context of this process in the shared state.
    pub fn register(&self) -> CuResult<()> {
        self.device.register_process(self.pid).map_err(|e| {
            eprintln!("simgpu: {e}");
            CUDA_ERROR_INVALID_CONTEXT
        })?;
        REGISTERED.store(self.pid, Ordering::Relaxed);
        Ok(())
    }

    /// Records that a context of this process went away.
    pub fn unregister(&self) {
        self.device.unregister_process(self.pid);
    }

    /// Queues `work` on stream `key`, ordered after the stream's earlier work. Called with the
    /// tables locked, so queue order matches submission order across threads.
    pub fn submit(&self, tables: &mut Tables, key: StreamKey, work: Work) -> Arc<Op> {
        let deps = tables.pending_before(key);
        let op = self.engines.submit(work, deps);
        tables.set_tail(key, op.clone());
        op
    }
}

/// Waits, on-CPU like the real driver, until every op in `ops` is done.
pub fn wait_all(ops: &[Arc<Op>]) {
    for op in ops {
        host_spin_until(|| op.is_done());
    }
}
