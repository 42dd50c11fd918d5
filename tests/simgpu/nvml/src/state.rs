//! Library state: the init reference count, the shared device, and the one device handle.
use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use simgpu_state::samples::SAMPLE_CLOCK_ENV;
use simgpu_state::{SampleClock, SharedDevice, Snapshot};

use crate::types::{
    NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_UNINITIALIZED,
    nvmlDevice_t, nvmlReturn_t,
};

/// The Rust-side form of a failing call.
pub type NvResult<T> = Result<T, nvmlReturn_t>;

/// nvmlInit calls minus nvmlShutdown calls, like NVML's own reference count.
static INITS: AtomicU32 = AtomicU32::new(0);
/// The shared state, opened by the first nvmlInit and kept for the life of the process.
static DEVICE: OnceLock<SharedDevice> = OnceLock::new();
/// Sample timestamp clock, read from the environment at the first nvmlInit.
static CLOCK: OnceLock<SampleClock> = OnceLock::new();
/// What the device handle points at: its address is the handle, and nothing reads it.
static DEVICE_TOKEN: u8 = 0;

/// nvmlInit_v2: opens the shared state on first use and counts the init.
pub fn init() -> NvResult<()> {
    if DEVICE.get().is_none() {
        let device = SharedDevice::open_from_env().map_err(|e| {
            eprintln!("simgpu: nvmlInit: {e}");
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
        // Two threads may race here; the loser's mapping is simply dropped.
        let _ = DEVICE.set(device);
    }
    CLOCK
        .get_or_init(|| SampleClock::from_setting(std::env::var(SAMPLE_CLOCK_ENV).ok().as_deref()));
    INITS.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// nvmlShutdown: one init fewer; an extra shutdown is NVML_ERROR_UNINITIALIZED.
pub fn shutdown() -> NvResult<()> {
    INITS
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .map(|_| ())
        .map_err(|_| NVML_ERROR_UNINITIALIZED)
}

/// The shared device, if NVML is initialized.
pub fn device() -> NvResult<&'static SharedDevice> {
    if INITS.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    DEVICE.get().ok_or(NVML_ERROR_UNINITIALIZED)
}

/// The sample timestamp clock.
pub fn sample_clock() -> SampleClock {
    CLOCK.get().copied().unwrap_or_default()
}

/// The handle of device 0.
pub fn device_handle() -> nvmlDevice_t {
    (&raw const DEVICE_TOKEN).cast::<c_void>().cast_mut()
}

/// Checks a device handle argument and returns the shared device.
pub fn checked(device_arg: nvmlDevice_t) -> NvResult<&'static SharedDevice> {
    let shared = device()?;
    if device_arg == device_handle() {
        Ok(shared)
    } else {
        Err(NVML_ERROR_INVALID_ARGUMENT)
    }
}

/// A snapshot of device `device_arg`, after dropping processes that died without cleanup.
pub fn snapshot(device_arg: nvmlDevice_t) -> NvResult<Snapshot> {
    let shared = checked(device_arg)?;
    shared.reap_dead();
    Ok(shared.snapshot())
}
