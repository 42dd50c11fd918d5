//! One GPU's health, as `nvidia-smi -q -d ECC,PCI,PERFORMANCE,TEMPERATURE,POWER` users read it:
//! readings in, checks out.
use super::{Check, Reading, Status, gib};

#[derive(Debug, Clone, Default)]
pub struct Ecc {
    pub enabled: bool,
    pub pending_enabled: bool,
    pub volatile_corrected: u64,
    pub volatile_uncorrected: u64,
    pub aggregate_corrected: u64,
    pub aggregate_uncorrected: u64,
}

/// Ampere and newer repair bad memory by remapping rows; older boards retire pages.
#[derive(Debug, Clone)]
pub enum MemoryRepair {
    RemappedRows {
        corrected: u32,
        uncorrected: u32,
        pending: bool,
        failed: bool,
    },
    RetiredPages {
        single_bit: usize,
        double_bit: usize,
        pending: bool,
    },
}

#[derive(Debug, Clone, Copy)]
pub struct Link {
    pub generation: u32,
    pub max_generation: u32,
    pub width: u32,
    pub max_width: u32,
}

#[derive(Debug, Clone, Copy)]
pub struct Clocks {
    pub sm_mhz: u32,
    pub max_sm_mhz: u32,
    /// NVML's clock-event ("throttle") reason bits.
    pub reasons: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct Thermal {
    pub celsius: u32,
    /// Where the GPU starts slowing itself down (NVML's slowdown threshold).
    pub slowdown_c: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct Mig {
    pub enabled: bool,
    pub pending: bool,
    /// The most MIG devices this GPU can be split into.
    pub max_devices: u32,
    /// Memory of each MIG device that exists, in bytes.
    pub devices: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderState {
    /// The process stallscope was pointed at (`--pid`), or one of its tree.
    Target,
    /// Alive, and run by the user who ran doctor.
    Yours,
    /// Alive, run by another user.
    OtherUser(String),
    /// A zombie: exited, its parent has not reaped it, and the driver still holds its memory.
    Zombie,
    /// No such PID here: the process is gone, or lives in a PID namespace (container) that
    /// this one cannot see.
    NotVisible,
}

#[derive(Debug, Clone)]
pub struct Holder {
    pub pid: u32,
    pub bytes: u64,
    pub name: String,
    pub state: HolderState,
}

#[derive(Debug, Clone)]
pub struct GpuReadings {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub bus_id: String,
    pub utilization_pct: Reading<u32>,
    pub ecc: Reading<Ecc>,
    pub repair: Reading<MemoryRepair>,
    pub link: Reading<Link>,
    pub replays: Reading<u32>,
    pub clocks: Reading<Clocks>,
    pub thermal: Reading<Thermal>,
    /// Draw and enforced limit, milliwatts.
    pub power_mw: Reading<(u32, u32)>,
    /// 0 (P0, most performance) to 15; NVML's 32 is unknown.
    pub pstate: Reading<u32>,
    pub persistence: Reading<bool>,
    pub mig: Reading<Mig>,
    /// Used and total bytes.
    pub memory: Reading<(u64, u64)>,
    pub holders: Reading<Vec<Holder>>,
}

/// NVML's clock-event reason bits, as the straggler rule reads them too.
pub use crate::nvml::clock_events as reasons;

/// The reasons set in `bits`, named, and the worst status among them.
pub fn decode_reasons(bits: u64) -> (Vec<&'static str>, Status) {
    use crate::nvml::clock_events::{Severity, set_in};
    let status = |s: Severity| match s {
        Severity::Benign => Status::Pass,
        Severity::Watch => Status::Warn,
        Severity::Slowdown => Status::Fail,
    };
    let set: Vec<_> = set_in(bits).collect();
    let worst = set
        .iter()
        .map(|r| status(r.severity))
        .max()
        .unwrap_or(Status::Pass);
    (set.into_iter().map(|r| r.name).collect(), worst)
}

/// The guides' alert threshold for GPU temperature.
pub const HOT_C: u32 = 85;
/// Free GPU memory below this is the guides' alert.
pub const LOW_FREE_BYTES: u64 = 1 << 30;

fn reading<T>(
    name: &'static str,
    gpu: u32,
    r: &Reading<T>,
    judge: impl FnOnce(&T) -> Check,
) -> Check {
    match r {
        Ok(v) => judge(v),
        Err(why) => Check::unavailable(name, why.clone()),
    }
    .on_gpu(gpu)
}

pub fn checks(g: &GpuReadings) -> Vec<Check> {
    let i = g.index;
    let mut out = vec![
        reading("ECC", i, &g.ecc, ecc),
        reading("memory repair", i, &g.repair, repair),
        reading("PCIe link", i, &g.link, |l| link(l, &g.utilization_pct)),
        reading("PCIe replays", i, &g.replays, |&n| replays(n)),
        reading("clocks", i, &g.clocks, clocks),
        reading("temperature", i, &g.thermal, temperature),
        reading("power", i, &g.power_mw, |&(draw, limit)| {
            let capped = g
                .clocks
                .as_ref()
                .is_ok_and(|c| c.reasons & reasons::SW_POWER_CAP != 0);
            power(draw, limit, capped)
        }),
        reading("P-state", i, &g.pstate, |&p| pstate(p, &g.utilization_pct)),
        reading("persistence mode", i, &g.persistence, |&on| persistence(on)),
        reading("MIG", i, &g.mig, |m| mig(m, &g.memory)),
        reading("memory", i, &g.memory, |&(used, total)| memory(used, total)),
    ];
    out.push(reading("memory holders", i, &g.holders, |h| holders(h)));
    out
}

const ECC_FIX: &str = "uncorrectable errors mean this card should not run important jobs: drain \
                       it, back up, and have it replaced (nvidia-smi -q -d ECC)";

pub fn ecc(e: &Ecc) -> Check {
    let counts = format!(
        "volatile {} corrected / {} uncorrected, aggregate {} corrected / {} uncorrected",
        e.volatile_corrected,
        e.volatile_uncorrected,
        e.aggregate_corrected,
        e.aggregate_uncorrected
    );
    if !e.enabled {
        let pending = if e.pending_enabled {
            " (enabled after the next reset)"
        } else {
            ""
        };
        return Check::warn(
            "ECC",
            format!("ECC is off{pending}: memory errors go undetected"),
            "nvidia-smi -e 1 and reset the GPU, unless the memory is knowingly traded for it",
        );
    }
    if e.volatile_uncorrected > 0 || e.aggregate_uncorrected > 0 {
        return Check::fail("ECC", format!("ECC on; {counts}"), ECC_FIX);
    }
    if e.volatile_corrected > 1000 {
        return Check::warn(
            "ECC",
            format!("ECC on; {counts}: many corrected errors since the driver loaded"),
            "corrected errors growing fast mean the memory is wearing: prepare a spare",
        );
    }
    Check::pass("ECC", format!("ECC on; {counts}"))
}

pub fn repair(r: &MemoryRepair) -> Check {
    match *r {
        MemoryRepair::RemappedRows {
            corrected,
            uncorrected,
            pending,
            failed,
        } => {
            let what = format!(
                "{corrected} row(s) remapped for corrected and {uncorrected} for uncorrected errors"
            );
            if failed {
                Check::fail(
                    "memory repair",
                    format!("{what}; a remapping FAILED (no spare rows left)"),
                    "the memory cannot be repaired any more: have the GPU replaced",
                )
            } else if pending {
                Check::warn(
                    "memory repair",
                    format!("{what}; a remapping is pending"),
                    "reset the GPU (nvidia-smi -r, with no process on it) to apply the remapping",
                )
            } else {
                Check::pass("memory repair", what)
            }
        }
        MemoryRepair::RetiredPages {
            single_bit,
            double_bit,
            pending,
        } => {
            let what = format!(
                "{single_bit} page(s) retired for single-bit and {double_bit} for double-bit errors"
            );
            if pending {
                Check::warn(
                    "memory repair",
                    format!("{what}; a retirement is pending"),
                    "reboot or reset the GPU to retire the pages",
                )
            } else {
                Check::pass("memory repair", what)
            }
        }
    }
}

pub fn link(l: &Link, utilization: &Reading<u32>) -> Check {
    let shown = format!(
        "gen {} x{} (the GPU can do gen {} x{})",
        l.generation, l.width, l.max_generation, l.max_width
    );
    if l.width < l.max_width {
        return Check::fail(
            "PCIe link",
            format!("trained down to x{} of x{}: {shown}", l.width, l.max_width),
            "host-device copies get a fraction of the bandwidth: reseat the card, check the \
             slot is x16 (BIOS, risers, extenders), then nvidia-smi -q -d PCI",
        );
    }
    if l.generation < l.max_generation {
        // An idle GPU drops its link generation to save power; only a busy one should be at
        // its best.
        return match utilization {
            Ok(u) if *u >= 50 => Check::warn(
                "PCIe link",
                format!("below its generation while {u}% busy: {shown}"),
                "check the slot and BIOS PCIe speed setting; dmesg for PCIe bus errors",
            ),
            _ => Check::pass(
                "PCIe link",
                format!("{shown}; an idle GPU lowers its link generation, check it under load"),
            ),
        };
    }
    Check::pass("PCIe link", shown)
}

pub fn replays(n: u32) -> Check {
    if n > 0 {
        Check::warn(
            "PCIe replays",
            format!("{n} PCIe replay(s): packets were resent over the link"),
            "a noisy link (slot, riser, card edge): reseat; watch whether the count grows",
        )
    } else {
        Check::pass("PCIe replays", "no PCIe replays")
    }
}

pub fn clocks(c: &Clocks) -> Check {
    let (names, worst) = decode_reasons(c.reasons);
    let why = if names.is_empty() {
        "no clock-event reason".to_owned()
    } else {
        format!("reasons: {}", names.join(", "))
    };
    let evidence = format!("SM {} of {} MHz; {why}", c.sm_mhz, c.max_sm_mhz);
    match worst {
        Status::Fail => Check::fail(
            "clocks",
            evidence,
            "the hardware is slowing the GPU (heat or power): check the fans, airflow, heat \
             sink and power supply (nvidia-smi -q -d PERFORMANCE)",
        ),
        Status::Warn => Check::warn(
            "clocks",
            evidence,
            "the GPU is held below its clocks by its power or thermal limit: check cooling \
             and nvidia-smi -q -d POWER",
        ),
        _ => Check::pass("clocks", evidence),
    }
}

pub fn temperature(t: &Thermal) -> Check {
    let limit = t
        .slowdown_c
        .map(|s| format!(" (slows down at {s} °C)"))
        .unwrap_or_default();
    let evidence = format!("{} °C{limit}", t.celsius);
    const FIX: &str = "check airflow, fans and the heat sink; 85 °C held for 5 minutes is the \
                       guides' alert";
    match t.slowdown_c {
        Some(s) if t.celsius >= s => Check::fail(
            "temperature",
            format!("{evidence}: at its slowdown threshold"),
            FIX,
        ),
        _ if t.celsius >= HOT_C => Check::warn(
            "temperature",
            format!("{evidence}: {HOT_C} °C or hotter"),
            FIX,
        ),
        _ => Check::pass("temperature", evidence),
    }
}

/// Power draw against the limit; `capped` is NVML's software-power-cap clock reason, the sign
/// that the limit, not the work, sets the clocks.
pub fn power(draw_mw: u32, limit_mw: u32, capped: bool) -> Check {
    let evidence = format!(
        "{:.0} W of a {:.0} W limit",
        draw_mw as f64 / 1e3,
        limit_mw as f64 / 1e3
    );
    if capped && limit_mw > 0 && u64::from(draw_mw) * 100 >= u64::from(limit_mw) * 95 {
        Check::warn(
            "power",
            format!("{evidence}: at its cap"),
            "the GPU is power-limited: check nvidia-smi -q -d POWER (a lowered limit, a weak \
             supply) and its temperature",
        )
    } else {
        Check::pass("power", evidence)
    }
}

pub fn pstate(p: u32, utilization: &Reading<u32>) -> Check {
    if p > 15 {
        return Check::unavailable("P-state", "NVML reports the P-state as unknown");
    }
    match utilization {
        Ok(u) if *u >= 50 && p > 2 => Check::warn(
            "P-state",
            format!("P{p} while {u}% busy: held below its performance states"),
            "a busy GPU runs at P0: check application clocks, power and thermal limits",
        ),
        Ok(u) => Check::pass("P-state", format!("P{p} at {u}% utilization")),
        Err(_) => Check::pass("P-state", format!("P{p}")),
    }
}

pub fn persistence(on: bool) -> Check {
    if on {
        Check::pass("persistence mode", "on")
    } else {
        Check::warn(
            "persistence mode",
            "off: the driver tears the GPU down when its last process exits, and each new job \
             waits for it to initialise again",
            "sudo nvidia-smi -pm 1, or run nvidia-persistenced",
        )
    }
}

pub fn mig(m: &Mig, memory: &Reading<(u64, u64)>) -> Check {
    if !m.enabled {
        return if m.pending {
            Check::warn(
                "MIG",
                "MIG is off, and turns on at the next GPU reset",
                "reset the GPU, or nvidia-smi -mig 0 to cancel",
            )
        } else {
            Check::pass("MIG", "off: the whole GPU")
        };
    }
    let whole = memory
        .as_ref()
        .map(|&(_, total)| format!(" of the GPU's {}", gib(total)))
        .unwrap_or_default();
    let slices = match m.devices.as_slice() {
        [] => format!(
            "no MIG device is visible here (of at most {})",
            m.max_devices
        ),
        [one] => format!(
            "you have 1 of {} slices, {}{whole}",
            m.max_devices,
            gib(*one)
        ),
        many => format!(
            "you have {} of {} slices ({}){whole}",
            many.len(),
            m.max_devices,
            many.iter().map(|b| gib(*b)).collect::<Vec<_>>().join(", ")
        ),
    };
    Check::warn(
        "MIG",
        format!("MIG is on: this is not a full GPU; {slices}"),
        "a job sized for the whole GPU gets only its slice's memory and SMs: ask for a full \
         GPU, or size the job to the slice (torch.cuda.get_device_properties(0))",
    )
}

pub fn memory(used: u64, total: u64) -> Check {
    let free = total.saturating_sub(used);
    let evidence = format!("{} used of {}, {} free", gib(used), gib(total), gib(free));
    if free < LOW_FREE_BYTES {
        Check::warn(
            "memory",
            format!("{evidence}: under 1 GiB free"),
            "the next allocation may hit CUDA out of memory: see who holds it (below), lower \
             the batch size, or set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 against \
             fragmentation",
        )
    } else {
        Check::pass("memory", evidence)
    }
}

pub fn holders(h: &[Holder]) -> Check {
    if h.is_empty() {
        return Check::pass("memory holders", "no process holds GPU memory");
    }
    let describe = |x: &Holder| {
        let who = match &x.state {
            HolderState::Target => "the target".to_owned(),
            HolderState::Yours => "yours".to_owned(),
            HolderState::OtherUser(u) => format!("user {u}'s"),
            HolderState::Zombie => "a ZOMBIE (exited, not reaped)".to_owned(),
            HolderState::NotVisible => {
                "NOT VISIBLE (dead, or in a container this one cannot see)".to_owned()
            }
        };
        let name = if x.name.is_empty() {
            String::new()
        } else {
            format!(" {}", x.name)
        };
        format!("pid {}{name} ({who}) holds {}", x.pid, gib(x.bytes))
    };
    let listed = h.iter().map(describe).collect::<Vec<_>>().join("; ");
    let stuck = h
        .iter()
        .filter(|x| matches!(x.state, HolderState::Zombie | HolderState::NotVisible))
        .count();
    if stuck > 0 {
        Check::warn(
            "memory holders",
            listed,
            "memory held by a process that is not running: kill its parent (zombie) or the \
             container holding it; nvidia-smi --query-compute-apps=pid,used_memory --format=csv",
        )
    } else {
        Check::pass("memory holders", listed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncorrectable_ecc_fails_and_corrected_passes() {
        let mut e = Ecc {
            enabled: true,
            pending_enabled: true,
            volatile_corrected: 3,
            ..Ecc::default()
        };
        assert_eq!(ecc(&e).status, Status::Pass);
        e.aggregate_uncorrected = 1;
        let c = ecc(&e);
        assert_eq!(c.status, Status::Fail);
        assert!(c.evidence.contains("1 uncorrected"), "{}", c.evidence);
        e.enabled = false;
        assert_eq!(ecc(&e).status, Status::Warn);
    }

    #[test]
    fn a_narrow_link_fails_and_an_idle_slow_one_passes() {
        let full = Link {
            generation: 5,
            max_generation: 5,
            width: 16,
            max_width: 16,
        };
        assert_eq!(link(&full, &Ok(0)).status, Status::Pass);
        let narrow = Link { width: 8, ..full };
        let c = link(&narrow, &Ok(0));
        assert_eq!(c.status, Status::Fail);
        assert!(c.evidence.contains("x8 of x16"));
        let slow = Link {
            generation: 1,
            ..full
        };
        assert_eq!(link(&slow, &Ok(0)).status, Status::Pass);
        assert_eq!(link(&slow, &Ok(90)).status, Status::Warn);
    }

    #[test]
    fn throttle_reasons_are_named_and_ranked() {
        let (names, worst) = decode_reasons(reasons::GPU_IDLE);
        assert_eq!((names, worst), (vec!["GPU idle"], Status::Pass));
        let (names, worst) = decode_reasons(reasons::SW_THERMAL | reasons::HW_SLOWDOWN);
        assert_eq!(
            names,
            vec!["software thermal slowdown", "hardware slowdown"]
        );
        assert_eq!(worst, Status::Fail);
        let c = clocks(&Clocks {
            sm_mhz: 990,
            max_sm_mhz: 1980,
            reasons: reasons::SW_POWER_CAP,
        });
        assert_eq!(c.status, Status::Warn);
        assert!(c.evidence.contains("SM 990 of 1980 MHz"));
    }

    #[test]
    fn temperature_fails_at_the_slowdown_threshold_and_warns_at_85() {
        let t = |celsius, slowdown_c| {
            temperature(&Thermal {
                celsius,
                slowdown_c,
            })
            .status
        };
        assert_eq!(t(70, Some(87)), Status::Pass);
        assert_eq!(t(86, Some(90)), Status::Warn);
        assert_eq!(t(88, Some(87)), Status::Fail);
        assert_eq!(t(84, None), Status::Pass);
    }

    #[test]
    fn a_mig_slice_is_said_plainly() {
        let m = Mig {
            enabled: true,
            pending: true,
            max_devices: 7,
            devices: vec![20 << 30],
        };
        let c = mig(&m, &Ok((0, 80 << 30)));
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.evidence
                .contains("you have 1 of 7 slices, 20.0 GiB of the GPU's 80.0 GiB"),
            "{}",
            c.evidence
        );
    }

    #[test]
    fn dead_holders_are_named() {
        let h = vec![
            Holder {
                pid: 10,
                bytes: 1 << 30,
                name: "python".into(),
                state: HolderState::Target,
            },
            Holder {
                pid: 99999,
                bytes: 6 << 30,
                name: String::new(),
                state: HolderState::NotVisible,
            },
        ];
        let c = holders(&h);
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.evidence.contains("pid 99999 (NOT VISIBLE"),
            "{}",
            c.evidence
        );
        assert_eq!(holders(&h[..1]).status, Status::Pass);
    }

    #[test]
    fn little_free_memory_and_a_power_cap_warn() {
        assert_eq!(memory(79 << 30, 80 << 30).status, Status::Pass);
        assert_eq!(
            memory((80 << 30) - (512 << 20), 80 << 30).status,
            Status::Warn
        );
        assert_eq!(power(690_000, 700_000, true).status, Status::Warn);
        assert_eq!(power(700_000, 700_000, false).status, Status::Pass);
        assert_eq!(power(300_000, 700_000, true).status, Status::Pass);
        assert_eq!(pstate(8, &Ok(95)).status, Status::Warn);
        assert_eq!(pstate(0, &Ok(95)).status, Status::Pass);
    }
}
