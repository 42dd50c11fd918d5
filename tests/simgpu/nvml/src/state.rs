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
/// Env var: NVML-level faults, comma-separated, read at the first nvmlInit: `ecc`
/// (uncorrectable ECC errors and a pending row remapping), `mig` (MIG on, one 20 GiB slice of
/// 7), `dead-holder` (a PID that does not exist holds 6 GiB), `old-driver` (driver 535.104.05,
/// CUDA 12.2), `no-persistence` (persistence mode off).
pub const FAULTS_ENV: &str = "STALLSCOPE_SIMGPU_FAULTS";
static FAULTS: OnceLock<Faults> = OnceLock::new();

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    pub ecc: bool,
    pub mig: bool,
    pub dead_holder: bool,
    pub old_driver: bool,
    pub no_persistence: bool,
}

impl Faults {
    /// Faults from `STALLSCOPE_SIMGPU_FAULTS`'s value; an unknown name is said on stderr and
    /// skipped, as for the other settings.
    pub fn parse(value: Option<&str>) -> Self {
        let mut f = Faults::default();
        for name in value
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
        {
            match name {
                "ecc" => f.ecc = true,
                "mig" => f.mig = true,
                "dead-holder" => f.dead_holder = true,
                "old-driver" => f.old_driver = true,
                "no-persistence" => f.no_persistence = true,
                other => eprintln!("simgpu: ignoring unknown fault {other:?} in {FAULTS_ENV}"),
            }
        }
        f
    }
}

/// The faults this process's NVML reports.
pub fn faults() -> Faults {
    FAULTS.get().copied().unwrap_or_default()
}

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
    FAULTS.get_or_init(|| Faults::parse(std::env::var(FAULTS_ENV).ok().as_deref()));
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

/// What MIG device handles point at: slot 0 of GPU i is element i (the simulation makes at most
/// one slice per GPU).
static MIG_TOKENS: [u8; MAX_DEVICES] = [0; MAX_DEVICES];

/// The handle of the MIG slice on GPU `index`.
pub fn mig_handle(index: u32) -> nvmlDevice_t {
    (&raw const MIG_TOKENS[index as usize % MAX_DEVICES])
        .cast::<c_void>()
        .cast_mut()
}

/// The GPU whose MIG slice `device_arg` is, if it is a MIG handle.
pub fn mig_parent(device_arg: nvmlDevice_t) -> Option<u32> {
    let offset = (device_arg as usize).checked_sub(MIG_TOKENS.as_ptr() as usize)?;
    (offset < MAX_DEVICES).then_some(offset as u32)
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
    fn faults_parse_by_name() {
        assert_eq!(Faults::parse(None), Faults::default());
        let f = Faults::parse(Some("ecc, mig,bogus,old-driver"));
        assert!(f.ecc && f.mig && f.old_driver && !f.dead_holder && !f.no_persistence);
    }

    #[test]
    fn gpm_is_on_unless_switched_off() {
        assert!(gpm_from_setting(None));
        assert!(gpm_from_setting(Some("1")));
        assert!(!gpm_from_setting(Some("0")));
        assert!(!gpm_from_setting(Some(" OFF ")));
    }
}
