//! The gauges read at each scrape: each GPU's core metrics and health through NVML (named as
//! dcgm-exporter names them), per-process GPU memory, the host's CPU time, the agent's own
//! CPU and memory.
use std::path::Path;

use nvml_wrapper::Nvml;
use profiler_core::{
    doctor::gpu::Ecc,
    exposition::{Exposition, Kind},
};

use crate::nvml_reader;

/// NVML, opened once and again after it failed.
#[derive(Default)]
pub struct NvmlGauges {
    nvml: Option<Nvml>,
}

impl NvmlGauges {
    /// Reads every GPU into `e`; `stallscope_nvml_up` says whether NVML answered.
    pub fn read(&mut self, lib: &Path, e: &mut Exposition) {
        if self.nvml.is_none() {
            self.nvml = nvml_reader::open(lib).ok();
        }
        let up = match &self.nvml {
            Some(n) => read_gpus(n, e).is_ok(),
            None => false,
        };
        if !up {
            // A driver that went away comes back as a new library state: open it again next time.
            self.nvml = None;
        }
        e.set(
            "stallscope_nvml_up",
            Kind::Gauge,
            "1 when NVML answered this scrape; 0 means the driver is lost (nvidia-smi fails)",
            &[],
            f64::from(u8::from(up)),
        );
    }
}

fn read_gpus(n: &Nvml, e: &mut Exposition) -> Result<(), nvml_wrapper::error::NvmlError> {
    for i in 0..n.device_count()? {
        let d = n.device_by_index(i)?;
        let id = nvml_reader::identity(&d, i);
        let gpu = i.to_string();
        let l = [
            ("gpu", gpu.as_str()),
            ("UUID", id.uuid.as_str()),
            ("modelName", id.name.as_str()),
        ];
        let now = nvml_reader::now(&d);
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        let memory = now.memory.as_ref().ok();
        let ecc = nvml_reader::ecc(&d).ok().filter(|e| e.enabled);
        let ecc_count = |count: fn(&Ecc) -> u64| ecc.as_ref().map(|e| count(e) as f64);
        let readings = [
            (
                "DCGM_FI_DEV_GPU_UTIL",
                "GPU utilization (%)",
                nvml_reader::utilization_pct(&d).ok().map(f64::from),
            ),
            (
                "DCGM_FI_DEV_GPU_TEMP",
                "GPU temperature (°C)",
                now.temperature_c.ok().map(f64::from),
            ),
            (
                "DCGM_FI_DEV_POWER_USAGE",
                "Power draw (W)",
                now.power_mw.ok().map(|mw| f64::from(mw) / 1e3),
            ),
            (
                "DCGM_FI_DEV_FB_USED",
                "Framebuffer memory used (MiB)",
                memory.map(|m| mib(m.used)),
            ),
            (
                "DCGM_FI_DEV_FB_FREE",
                "Framebuffer memory free (MiB)",
                memory.map(|m| mib(m.free)),
            ),
            (
                "DCGM_FI_DEV_SM_CLOCK",
                "SM clock (MHz)",
                now.sm_clock_mhz.ok().map(f64::from),
            ),
            (
                "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                "Clock-event (throttle) reason bits, NVML's nvmlClocksEventReason*",
                now.clock_event_reasons.ok().map(|r| r as f64),
            ),
            (
                "DCGM_FI_DEV_PCIE_LINK_GEN",
                "PCIe link generation",
                now.pcie_gen.ok().map(f64::from),
            ),
            (
                "DCGM_FI_DEV_PCIE_LINK_WIDTH",
                "PCIe link width (lanes)",
                now.pcie_width.ok().map(f64::from),
            ),
            (
                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                "Single-bit (corrected) ECC errors since the driver loaded",
                ecc_count(|e| e.volatile_corrected),
            ),
            (
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                "Double-bit (uncorrectable) ECC errors since the driver loaded",
                ecc_count(|e| e.volatile_uncorrected),
            ),
            (
                "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
                "Single-bit (corrected) ECC errors over the GPU's life",
                ecc_count(|e| e.aggregate_corrected),
            ),
            (
                "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
                "Double-bit (uncorrectable) ECC errors over the GPU's life",
                ecc_count(|e| e.aggregate_uncorrected),
            ),
        ];
        for (name, help, value) in readings {
            if let Some(v) = value {
                e.set(name, Kind::Gauge, help, &l, v);
            }
        }
        for p in nvml_reader::processes(&d).unwrap_or_default() {
            let Some(bytes) = p.bytes else {
                continue;
            };
            let pid = p.pid.to_string();
            let comm = std::fs::read_to_string(format!("/proc/{}/comm", p.pid))
                .map(|c| c.trim().to_owned())
                .unwrap_or_default();
            e.set(
                "stallscope_process_gpu_memory_bytes",
                Kind::Gauge,
                "GPU memory each process holds (comm empty: not visible from here)",
                &[("gpu", &gpu), ("pid", &pid), ("comm", &comm)],
                bytes as f64,
            );
        }
    }
    Ok(())
}

/// The host's CPU time by mode, summed over CPUs, from /proc/stat (node_exporter's
/// `node_cpu_seconds_total` without the per-CPU label).
pub fn host_cpu(e: &mut Exposition) {
    use crate::capture::proc::host_cpu;
    let Some(seconds) = host_cpu::seconds() else {
        return;
    };
    for (mode, secs) in host_cpu::MODES.iter().zip(seconds) {
        e.set(
            "stallscope_host_cpu_seconds",
            Kind::Counter,
            "The host's CPU time by mode, all CPUs together",
            &[("mode", mode)],
            secs,
        );
    }
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1);
    e.set(
        "stallscope_host_cpus",
        Kind::Gauge,
        "CPUs online",
        &[],
        cpus as f64,
    );
}

fn rusage(who: libc::c_int) -> (f64, f64) {
    // SAFETY: an all-zero rusage is valid, and getrusage fills it.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    unsafe { libc::getrusage(who, &mut r) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        secs(r.ru_utime) + secs(r.ru_stime),
        r.ru_maxrss as f64 * 1024.0,
    )
}

/// A live process's CPU seconds (user and system), and its resident and peak resident bytes.
fn live(pid: u32) -> Option<(f64, f64, f64)> {
    let p = procfs::process::Process::new(pid as i32).ok()?;
    let stat = p.stat().ok()?;
    let status = p.status().ok()?;
    let ticks = (stat.utime + stat.stime) as f64;
    let kib = |v: Option<u64>| v.unwrap_or(0) as f64 * 1024.0;
    Some((
        ticks / procfs::ticks_per_second() as f64,
        kib(status.vmrss),
        kib(status.vmhwm),
    ))
}

/// The recorders' CPU seconds exported last: a recorder's time moves from the live count to
/// the reaped children's when it is reaped, and in between it is in neither, so the counter
/// never goes back below what it said.
static RECORDER_CPU: std::sync::Mutex<f64> = std::sync::Mutex::new(0.0);

/// The agent's own CPU and memory, and its recorders' apart; `recorder` is the PID of the one
/// running now (0: none).
pub fn own(e: &mut Exposition, recorder: u32) {
    let (cpu, _) = rusage(libc::RUSAGE_SELF);
    let (children_cpu, children_rss) = rusage(libc::RUSAGE_CHILDREN);
    let (live_cpu, live_rss, live_hwm) = (recorder != 0)
        .then(|| live(recorder))
        .flatten()
        .unwrap_or_default();
    let recorders_cpu = {
        let mut last = RECORDER_CPU.lock().unwrap_or_else(|p| p.into_inner());
        *last = last.max(children_cpu + live_cpu);
        *last
    };
    let help = "CPU time of the agent (process=agent) and of its recorders (process=recorder)";
    e.set(
        "stallscope_agent_cpu_seconds",
        Kind::Counter,
        help,
        &[("process", "agent")],
        cpu,
    );
    e.set(
        "stallscope_agent_cpu_seconds",
        Kind::Counter,
        help,
        &[("process", "recorder")],
        recorders_cpu,
    );
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        * 1024.0;
    e.set(
        "stallscope_agent_rss_bytes",
        Kind::Gauge,
        "Resident memory of the agent process",
        &[],
        rss,
    );
    e.set(
        "stallscope_agent_recorder_rss_bytes",
        Kind::Gauge,
        "Resident memory of the recorder running now (0: none)",
        &[],
        live_rss,
    );
    e.set(
        "stallscope_agent_recorder_max_rss_bytes",
        Kind::Gauge,
        "The largest resident memory any of its recorders reached",
        &[],
        children_rss.max(live_hwm),
    );
}
