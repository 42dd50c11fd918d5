//! The process-wide driver: shared machine state, handle tables, engines and the calling
//! thread's current context. Created by cuInit.
use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use simgpu_state::{Gpu, MAX_DEVICES, SharedState, lane};

use crate::engine::{Engines, Op, Work, locked};
use crate::result::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_NOT_INITIALIZED, CuResult,
};
use crate::staging::StagingPool;
use crate::tables::{StreamKey, Tables};
use crate::wait::host_spin_until;

pub struct Driver {
    pub state: SharedState,
    /// The pid that initialized the driver; a forked child must not act for its parent.
    pub pid: u32,
    tables: Mutex<Tables>,
    /// One set of engine threads per GPU, started with the process's first context on it.
    engines: [Engines; MAX_DEVICES],
    started: Mutex<[bool; MAX_DEVICES]>,
    staging: StagingPool,
    /// SM share of compute kernels in percent (`STALLSCOPE_SIMGPU_SM_SHARE` at cuInit).
    pub compute_sm_share: u32,
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
    let state = SharedState::open_from_env().map_err(|e| {
        eprintln!("simgpu: cuInit: {e}");
        CUDA_ERROR_NO_DEVICE
    })?;
    let _ = DRIVER.set(Driver {
        state,
        pid: std::process::id(),
        tables: Mutex::new(Tables::default()),
        engines: [const { Engines::new() }; MAX_DEVICES],
        started: Mutex::new([false; MAX_DEVICES]),
        staging: StagingPool::new(simgpu_state::host::host_rate_from_setting(
            std::env::var(simgpu_state::HOST_GBPS_ENV).ok().as_deref(),
        )),
        compute_sm_share: lane::share_from_setting(
            lane::SM_SHARE_ENV,
            std::env::var(lane::SM_SHARE_ENV).ok().as_deref(),
            lane::DEFAULT_COMPUTE_SM_SHARE,
        ),
    });
    let driver = DRIVER.get().ok_or(CUDA_ERROR_NO_DEVICE)?;
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
            driver.state.forget_process(pid);
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
    pub fn staging(&self) -> &StagingPool {
        &self.staging
    }

    /// How many GPUs the machine has.
    pub fn device_count(&self) -> c_int {
        self.state.device_count() as c_int
    }

    /// GPU `ordinal` (a `CUdevice`), or CUDA_ERROR_INVALID_DEVICE.
    pub fn gpu(&self, ordinal: c_int) -> CuResult<Gpu<'_>> {
        u32::try_from(ordinal)
            .ok()
            .and_then(|i| self.state.device(i))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// Records a new context of this process on GPU `device` in the shared state, and starts
    /// that GPU's engine threads with the first one.
    pub fn register(&'static self, device: u32) -> CuResult<()> {
        let gpu = self.gpu(device as c_int)?;
        gpu.register_process(self.pid).map_err(|e| {
            eprintln!("simgpu: {e}");
            CUDA_ERROR_INVALID_CONTEXT
        })?;
        REGISTERED.store(self.pid, Ordering::Relaxed);
        let mut started = locked(&self.started);
        if !started[device as usize] {
            self.engines[device as usize]
                .start(gpu, self.pid, &self.staging)
                .map_err(|e| {
                    eprintln!("simgpu: starting engine threads of GPU {device}: {e}");
                    gpu.unregister_process(self.pid);
                    CUDA_ERROR_INVALID_CONTEXT
                })?;
            started[device as usize] = true;
        }
        Ok(())
    }

    /// Records that a context of this process on GPU `device` went away.
    pub fn unregister(&self, device: u32) {
        if let Ok(gpu) = self.gpu(device as c_int) {
            gpu.unregister_process(self.pid);
        }
    }

    /// Queues `work` on stream `key`, ordered after the stream's earlier work, on the engines of
    /// the stream's GPU. Called with the tables locked, so queue order matches submission order
    /// across threads.
    pub fn submit(&self, tables: &mut Tables, key: StreamKey, work: Work) -> Arc<Op> {
        let deps = tables.pending_before(key);
        let device = tables.device_of(key).unwrap_or(0) as usize;
        let op = self.engines[device % MAX_DEVICES].submit(work, deps);
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
