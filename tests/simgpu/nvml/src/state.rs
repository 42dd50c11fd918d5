//! Library state: the init reference count, the shared machine state, and the device handles
//! (one per simulated GPU).
use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use simgpu_state::samples::SAMPLE_CLOCK_ENV;
use simgpu_state::{Gpu, MAX_DEVICES, SampleClock, SharedState, Snapshot};

use crate::types::{
    NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_UNINITIALIZED,
    nvmlDevice_t, nvmlReturn_t,
};

/// The Rust-side form of a failing call.
pub type NvResult<T> = Result<T, nvmlReturn_t>;

/// nvmlInit calls minus nvmlShutdown calls, like NVML's own reference count.
static INITS: AtomicU32 = AtomicU32::new(0);
/// The shared state, opened by the first nvmlInit and kept for the life of the process.
static DEVICE: OnceLock<SharedState> = OnceLock::new();
/// Sample timestamp clock, read from the environment at the first nvmlInit.
static CLOCK: OnceLock<SampleClock> = OnceLock::new();
/// Env var: `0` makes the GPUs pre-Hopper boards without GPM. Read at the first nvmlInit.
pub const GPM_ENV: &str = "STALLSCOPE_SIMGPU_GPM";
/// Whether the GPUs have GPM, from the environment at the first nvmlInit.
static GPM: OnceLock<bool> = OnceLock::new();
/// What the device handles point at: the address of element i is GPU i's handle, and nothing
/// reads them.
static DEVICE_TOKENS: [u8; MAX_DEVICES] = [0; MAX_DEVICES];

/// nvmlInit_v2: opens the shared state on first use and counts the init.
pub fn init() -> NvResult<()> {
    if DEVICE.get().is_none() {
        let device = SharedState::open_from_env().map_err(|e| {
            eprintln!("simgpu: nvmlInit: {e}");
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
        // Two threads may race here; the loser's mapping is simply dropped.
        let _ = DEVICE.set(device);
    }
    CLOCK
        .get_or_init(|| SampleClock::from_setting(std::env::var(SAMPLE_CLOCK_ENV).ok().as_deref()));
    GPM.get_or_init(|| gpm_from_setting(std::env::var(GPM_ENV).ok().as_deref()));
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

/// The shared machine state, if NVML is initialized.
pub fn device() -> NvResult<&'static SharedState> {
    if INITS.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    DEVICE.get().ok_or(NVML_ERROR_UNINITIALIZED)
}

/// The sample timestamp clock.
pub fn sample_clock() -> SampleClock {
    CLOCK.get().copied().unwrap_or_default()
}

/// Whether the GPUs support GPM (Hopper and newer do; `STALLSCOPE_SIMGPU_GPM=0` says no).
pub fn gpm_supported() -> bool {
    GPM.get().copied().unwrap_or(true)
}

/// GPM support from `STALLSCOPE_SIMGPU_GPM`'s value: off for `0`, `off`, `false` or `no`.
fn gpm_from_setting(value: Option<&str>) -> bool {
    !matches!(
        value.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
        Some("0" | "off" | "false" | "no")
    )
}

/// The handle of GPU `index` (which the caller checked against the device count).
pub fn device_handle(index: u32) -> nvmlDevice_t {
    (&raw const DEVICE_TOKENS[index as usize % MAX_DEVICES])
        .cast::<c_void>()
        .cast_mut()
}

/// Checks a device handle argument and returns its GPU.
pub fn checked(device_arg: nvmlDevice_t) -> NvResult<Gpu<'static>> {
    let shared = device()?;
    let base = DEVICE_TOKENS.as_ptr() as usize;
    let index = (device_arg as usize)
        .checked_sub(base)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let index = u32::try_from(index).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
    shared.device(index).ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// A snapshot of device `device_arg`, after dropping processes that died without cleanup.
pub fn snapshot(device_arg: nvmlDevice_t) -> NvResult<Snapshot> {
    let gpu = checked(device_arg)?;
    gpu.reap_dead();
    Ok(gpu.snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpm_is_on_unless_switched_off() {
        assert!(gpm_from_setting(None));
        assert!(gpm_from_setting(Some("1")));
        assert!(!gpm_from_setting(Some("0")));
        assert!(!gpm_from_setting(Some(" OFF ")));
    }
}
