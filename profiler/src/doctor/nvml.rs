//! The readings `doctor` judges, taken through the shared NVML reader (and the few only doctor
//! reads): one call per reading, each failure kept as the reason that reading is unavailable.
use std::ffi::c_uint;

use nvml_wrapper::{
    Device, Nvml,
    enum_wrappers::device::{Clock, RetirementCause, TemperatureThreshold},
    error::NvmlError,
};
use profiler_core::doctor::{
    Check, Reading,
    gpu::{Clocks, GpuReadings, Holder, Link, MemoryRepair, Mig, Thermal},
};

use crate::nvml_reader::{self, read};

/// NVML's own failure to start, spelled out as `nvidia-smi` users know it.
pub fn init_failure(lib: &std::path::Path, e: &NvmlError) -> Check {
    let (evidence, fix) = match e {
        NvmlError::DriverNotLoaded => (
            "NVML: the NVIDIA driver is not loaded (nvidia-smi: \"couldn't communicate with \
             the NVIDIA driver\")"
                .to_owned(),
            "lsmod | grep nvidia; dmesg | grep -i nvidia; common causes: Secure Boot blocking \
             the module, nouveau not blacklisted, headers missing when it was built",
        ),
        NvmlError::LibRmVersionMismatch => (
            "NVML: Driver/library version mismatch: the loaded kernel module and libnvidia-ml \
             are different versions"
                .to_owned(),
            "the driver was upgraded without a reboot: reboot, or reload the nvidia modules",
        ),
        NvmlError::LibloadingError(err) => (
            format!("NVML: cannot load {}: {err}", lib.display()),
            "install the driver's user-space libraries, or point --nvml-lib at libnvidia-ml.so.1",
        ),
        NvmlError::NoPermission => (
            "NVML: no permission to open the GPU device files (/dev/nvidia*)".to_owned(),
            "run as root, or add the user to the group owning /dev/nvidia*",
        ),
        NvmlError::GpuLost => (
            "NVML: a GPU is lost (it has fallen off the bus)".to_owned(),
            "dmesg | grep -i xid; check its power and seating, then reboot",
        ),
        other => (
            format!("NVML ({}) failed to initialise: {other}", lib.display()),
            "dmesg | grep -i nvrm; reinstall the driver",
        ),
    };
    Check::fail("NVML", evidence, fix)
}

/// Row remapping (Ampere and newer), else page retirement. nvml-wrapper 0.13 has no wrapper
/// for nvmlDeviceGetRemappedRows, so it is called through the loaded library's table.
fn repair(nvml: &Nvml, d: &Device<'_>) -> Reading<MemoryRepair> {
    let remapped = nvml.lib().nvmlDeviceGetRemappedRows.as_ref();
    if let Ok(f) = remapped {
        let (mut corr, mut unc, mut pending, mut failed): (c_uint, c_uint, c_uint, c_uint) =
            (0, 0, 0, 0);
        // SAFETY: a valid device handle and four out-pointers, per the NVML signature.
        let code = unsafe { f(d.handle(), &mut corr, &mut unc, &mut pending, &mut failed) };
        if code == 0 {
            return Ok(MemoryRepair::RemappedRows {
                corrected: corr,
                uncorrected: unc,
                pending: pending != 0,
                failed: failed != 0,
            });
        }
    }
    let single = read(
        "nvmlDeviceGetRetiredPages",
        d.retired_pages(RetirementCause::MultipleSingleBitEccErrors),
    )
    .map_err(|e| format!("no row remapping, and {e}"))?;
    let double = read(
        "nvmlDeviceGetRetiredPages",
        d.retired_pages(RetirementCause::DoubleBitEccError),
    )?;
    Ok(MemoryRepair::RetiredPages {
        single_bit: single.len(),
        double_bit: double.len(),
        pending: d.are_pages_pending_retired().unwrap_or(false),
    })
}

fn mig(d: &Device<'_>) -> Reading<Mig> {
    let mode = read("nvmlDeviceGetMigMode", d.mig_mode())?;
    let mut m = Mig {
        enabled: mode.current != 0,
        pending: mode.pending != mode.current,
        max_devices: 0,
        devices: Vec::new(),
    };
    if m.enabled {
        m.max_devices = read("nvmlDeviceGetMaxMigDeviceCount", d.mig_device_count())?;
        for i in 0..m.max_devices {
            // Slots without an instance answer NotFound.
            if let Ok(mig) = d.mig_device_by_index(i) {
                m.devices
                    .push(mig.memory_info().map(|mem| mem.total).unwrap_or(0));
            }
        }
    }
    Ok(m)
}

/// Everything doctor reads of GPU `index`. `holder` classifies a PID NVML lists.
pub fn readings(
    nvml: &Nvml,
    d: &Device<'_>,
    index: u32,
    holder: &dyn Fn(u32, u64) -> Holder,
) -> GpuReadings {
    let id = nvml_reader::identity(d, index);
    let now = nvml_reader::now(d);
    let thermal = now.temperature_c.map(|celsius| Thermal {
        celsius,
        slowdown_c: d.temperature_threshold(TemperatureThreshold::Slowdown).ok(),
    });
    let clocks = now.sm_clock_mhz.and_then(|sm_mhz| {
        Ok(Clocks {
            sm_mhz,
            max_sm_mhz: read("nvmlDeviceGetMaxClockInfo", d.max_clock_info(Clock::SM))?,
            reasons: now.clock_event_reasons?,
        })
    });
    let power = now.power_mw.and_then(|draw| {
        Ok((
            draw,
            read("nvmlDeviceGetEnforcedPowerLimit", d.enforced_power_limit())?,
        ))
    });
    let link = now.pcie_gen.and_then(|generation| {
        Ok(Link {
            generation,
            max_generation: read("nvmlDeviceGetMaxPcieLinkGeneration", d.max_pcie_link_gen())?,
            width: now.pcie_width?,
            max_width: read("nvmlDeviceGetMaxPcieLinkWidth", d.max_pcie_link_width())?,
        })
    });
    let holders = nvml_reader::processes(d).map(|ps| {
        ps.into_iter()
            .map(|p| holder(p.pid, p.bytes.unwrap_or(0)))
            .collect()
    });
    GpuReadings {
        index,
        name: id.name,
        uuid: id.uuid,
        bus_id: id.bus_id,
        utilization_pct: nvml_reader::utilization_pct(d),
        ecc: nvml_reader::ecc(d),
        repair: repair(nvml, d),
        link,
        replays: read("nvmlDeviceGetPcieReplayCounter", d.pcie_replay_counter()),
        clocks,
        thermal,
        power_mw: power,
        pstate: read("nvmlDeviceGetPerformanceState", d.performance_state()).map(|p| p.as_c()),
        persistence: read("nvmlDeviceGetPersistenceMode", d.is_in_persistent_mode()),
        mig: mig(d),
        memory: now.memory.map(|m| (m.used, m.total)),
        holders,
    }
}
