//! The one NVML reader: which library is opened, and the readings of a device that the
//! recorder's sampler, `doctor` and the agent's gauges all take, each failure kept as the
//! reason that reading is missing (doctor says it; the others skip the reading).
use std::path::{Path, PathBuf};

use nvml_wrapper::{
    Device, Nvml,
    enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor},
    enums::device::UsedGpuMemory,
    error::NvmlError,
    struct_wrappers::device::MemoryInfo,
};
use profiler_core::doctor::{Reading, gpu::Ecc, target::Physical};

/// Where the NVML library's path may be given instead of `--nvml-lib`.
pub const LIB_ENV: &str = "STALLSCOPE_NVML_LIB";
const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// The NVML library to load: `lib`, else $STALLSCOPE_NVML_LIB, else libnvidia-ml.so.1.
pub fn library(lib: Option<PathBuf>) -> PathBuf {
    lib.or_else(|| std::env::var_os(LIB_ENV).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LIB))
}

pub fn open(lib: &Path) -> Result<Nvml, NvmlError> {
    Nvml::builder().lib_path(lib.as_os_str()).init()
}

/// Why a reading is missing, in words: an old driver or board lacks the call, or NVML said no.
pub fn why(call: &str, e: NvmlError) -> String {
    match e {
        NvmlError::NotSupported => format!("{call}: not supported by this GPU or driver"),
        NvmlError::FailedToLoadSymbol(_) => format!("{call}: this NVML library does not have it"),
        NvmlError::NoPermission => format!("{call}: no permission (run as root)"),
        NvmlError::GpuLost => format!("{call}: the GPU is lost (fallen off the bus?)"),
        other => format!("{call}: {other}"),
    }
}

pub fn read<T>(call: &str, r: Result<T, NvmlError>) -> Reading<T> {
    r.map_err(|e| why(call, e))
}

/// Which GPU a device is, as the other tools name it.
pub fn identity(d: &Device<'_>, index: u32) -> Physical {
    Physical {
        index,
        uuid: d.uuid().unwrap_or_default(),
        bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
        name: d.name().unwrap_or_default(),
    }
}

/// What a device is doing now.
pub struct Now {
    pub sm_clock_mhz: Reading<u32>,
    pub mem_clock_mhz: Reading<u32>,
    /// NVML's clock-event ("throttle") reason bits.
    pub clock_event_reasons: Reading<u64>,
    pub pcie_gen: Reading<u32>,
    pub pcie_width: Reading<u32>,
    pub power_mw: Reading<u32>,
    pub temperature_c: Reading<u32>,
    pub memory: Reading<MemoryInfo>,
}

pub fn now(d: &Device<'_>) -> Now {
    Now {
        sm_clock_mhz: read("nvmlDeviceGetClockInfo", d.clock_info(Clock::SM)),
        mem_clock_mhz: read("nvmlDeviceGetClockInfo", d.clock_info(Clock::Memory)),
        clock_event_reasons: read(
            "nvmlDeviceGetCurrentClocksEventReasons",
            d.current_throttle_reasons().map(|r| r.bits()),
        ),
        pcie_gen: read(
            "nvmlDeviceGetCurrPcieLinkGeneration",
            d.current_pcie_link_gen(),
        ),
        pcie_width: read(
            "nvmlDeviceGetCurrPcieLinkWidth",
            d.current_pcie_link_width(),
        ),
        power_mw: read("nvmlDeviceGetPowerUsage", d.power_usage()),
        temperature_c: read(
            "nvmlDeviceGetTemperature",
            d.temperature(TemperatureSensor::Gpu),
        ),
        memory: read("nvmlDeviceGetMemoryInfo", d.memory_info()),
    }
}

/// The utilization NVML averages over its last sample period, in percent.
pub fn utilization_pct(d: &Device<'_>) -> Reading<u32> {
    read("nvmlDeviceGetUtilizationRates", d.utilization_rates()).map(|u| u.gpu)
}

/// ECC mode and error counts (the counts only when ECC is on).
pub fn ecc(d: &Device<'_>) -> Reading<Ecc> {
    let mode = read("nvmlDeviceGetEccMode", d.is_ecc_enabled())?;
    let mut e = Ecc {
        enabled: mode.currently_enabled,
        pending_enabled: mode.pending_enabled,
        ..Ecc::default()
    };
    if e.enabled {
        let count = |kind, counter| {
            read(
                "nvmlDeviceGetTotalEccErrors",
                d.total_ecc_errors(kind, counter),
            )
        };
        e.volatile_corrected = count(MemoryError::Corrected, EccCounter::Volatile)?;
        e.volatile_uncorrected = count(MemoryError::Uncorrected, EccCounter::Volatile)?;
        e.aggregate_corrected = count(MemoryError::Corrected, EccCounter::Aggregate)?;
        e.aggregate_uncorrected = count(MemoryError::Uncorrected, EccCounter::Aggregate)?;
    }
    Ok(e)
}

/// A process computing on a device, with the GPU memory it holds when NVML says.
pub struct Holding {
    pub pid: u32,
    pub bytes: Option<u64>,
}

/// The processes computing on a device.
pub fn processes(d: &Device<'_>) -> Reading<Vec<Holding>> {
    read(
        "nvmlDeviceGetComputeRunningProcesses",
        d.running_compute_processes(),
    )
    .map(|ps| {
        ps.into_iter()
            .map(|p| Holding {
                pid: p.pid,
                bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect()
    })
}

/// Every process NVML lists as computing on any of this host's GPUs.
pub fn all_gpu_processes(lib: Option<PathBuf>) -> anyhow::Result<Vec<u32>> {
    let lib = library(lib);
    let nvml = open(&lib)
        .map_err(|e| anyhow::anyhow!("--all-gpu-processes needs NVML ({}): {e}", lib.display()))?;
    let mut pids = Vec::new();
    for i in 0..nvml.device_count()? {
        let d = nvml.device_by_index(i)?;
        let listed = processes(&d).map_err(anyhow::Error::msg)?;
        pids.extend(listed.into_iter().map(|p| p.pid));
    }
    pids.sort_unstable();
    pids.dedup();
    if pids.is_empty() {
        anyhow::bail!("--all-gpu-processes: NVML lists no compute process on this host's GPUs");
    }
    Ok(pids)
}

/// The GPU memory `pid` holds across all GPUs, and on which.
pub fn memory_of(nvml: &Nvml, pid: u32) -> (u64, Vec<u32>) {
    let mut total = 0;
    let mut on = Vec::new();
    for i in 0..nvml.device_count().unwrap_or(0) {
        let Ok(d) = nvml.device_by_index(i) else {
            continue;
        };
        for p in processes(&d).unwrap_or_default() {
            if p.pid == pid {
                total += p.bytes.unwrap_or(0);
                on.push(i);
            }
        }
    }
    (total, on)
}
