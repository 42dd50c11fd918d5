//! NVML's clock-event (throttle) reason bits (`nvmlClocksEventReason*`), in one table: what
//! `doctor` calls each and how it judges it, and what the straggler rule names it and whether
//! it slows a GPU whatever its load.
pub const GPU_IDLE: u64 = 0x1;
pub const APPLICATIONS_CLOCKS: u64 = 0x2;
pub const SW_POWER_CAP: u64 = 0x4;
pub const HW_SLOWDOWN: u64 = 0x8;
pub const SYNC_BOOST: u64 = 0x10;
pub const SW_THERMAL: u64 = 0x20;
pub const HW_THERMAL: u64 = 0x40;
pub const HW_POWER_BRAKE: u64 = 0x80;
pub const DISPLAY_CLOCKS: u64 = 0x100;

/// How much a reason says about the GPU's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// A setting or an idle GPU.
    Benign,
    /// Normal under full load, a sign of cooling or power trouble when persistent (the
    /// software power cap, software thermal slowdown).
    Watch,
    /// The hardware slowed the GPU: it is not doing what it can.
    Slowdown,
}

/// One reason bit.
#[derive(Clone, Copy, Debug)]
pub struct Reason {
    pub bit: u64,
    /// As `doctor` says it.
    pub name: &'static str,
    /// As the JSON report names it.
    pub key: &'static str,
    pub severity: Severity,
    /// Whether it slows the GPU whatever its load, which the straggler rule holds against a
    /// rank (the power cap is judged by the clock it leaves instead).
    pub slows_any_load: bool,
}

pub const REASONS: [Reason; 9] = [
    reason(GPU_IDLE, "GPU idle", "gpu_idle", Severity::Benign, false),
    reason(
        APPLICATIONS_CLOCKS,
        "application clocks setting",
        "applications_clocks",
        Severity::Benign,
        false,
    ),
    reason(
        SYNC_BOOST,
        "sync boost",
        "sync_boost",
        Severity::Benign,
        false,
    ),
    reason(
        DISPLAY_CLOCKS,
        "display clock setting",
        "display_clocks",
        Severity::Benign,
        false,
    ),
    reason(
        SW_POWER_CAP,
        "software power cap",
        "sw_power_cap",
        Severity::Watch,
        false,
    ),
    reason(
        SW_THERMAL,
        "software thermal slowdown",
        "sw_thermal_slowdown",
        Severity::Watch,
        true,
    ),
    reason(
        HW_SLOWDOWN,
        "hardware slowdown",
        "hw_slowdown",
        Severity::Slowdown,
        true,
    ),
    reason(
        HW_THERMAL,
        "hardware thermal slowdown",
        "hw_thermal_slowdown",
        Severity::Slowdown,
        true,
    ),
    reason(
        HW_POWER_BRAKE,
        "hardware power brake",
        "hw_power_brake_slowdown",
        Severity::Slowdown,
        true,
    ),
];

const fn reason(
    bit: u64,
    name: &'static str,
    key: &'static str,
    severity: Severity,
    slows_any_load: bool,
) -> Reason {
    Reason {
        bit,
        name,
        key,
        severity,
        slows_any_load,
    }
}

/// The reasons set in `bits`, in the table's order.
pub fn set_in(bits: u64) -> impl Iterator<Item = &'static Reason> {
    REASONS.iter().filter(move |r| bits & r.bit != 0)
}

/// Whether `bits` holds a reason that slows a GPU whatever its load.
pub fn slows_any_load(bits: u64) -> bool {
    set_in(bits).any(|r| r.slows_any_load)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bit_is_in_the_table_once() {
        let mut seen = 0u64;
        for r in REASONS {
            assert_eq!(r.bit.count_ones(), 1, "{}", r.name);
            assert_eq!(seen & r.bit, 0, "{} twice", r.name);
            seen |= r.bit;
        }
        assert_eq!(seen, 0x1ff);
    }

    #[test]
    fn the_power_cap_alone_does_not_slow_any_load() {
        assert!(!slows_any_load(SW_POWER_CAP | GPU_IDLE));
        assert!(slows_any_load(SW_POWER_CAP | HW_SLOWDOWN));
        let names: Vec<_> = set_in(SW_THERMAL | GPU_IDLE).map(|r| r.key).collect();
        assert_eq!(names, ["gpu_idle", "sw_thermal_slowdown"]);
    }
}
