//! Device readings derived from a snapshot: clocks, power, temperature, clock-event reasons.
//! Pure, so the rules are unit-tested without the shared file.
use std::ffi::{c_uint, c_ulonglong};

use simgpu_state::Snapshot;
use simgpu_state::device::{
    MEM_CLOCK_MHZ, POWER_BUSY_MW, POWER_IDLE_MW, SM_CLOCK_BUSY_MHZ, SM_CLOCK_IDLE_MHZ, TEMP_BUSY_C,
    TEMP_IDLE_C, TEMP_THROTTLED_C, VIDEO_CLOCK_MHZ,
};

use crate::types::{
    CLOCKS_EVENT_REASON_GPU_IDLE, CLOCKS_EVENT_REASON_HW_SLOWDOWN,
    CLOCKS_EVENT_REASON_SW_THERMAL_SLOWDOWN, NVML_CLOCK_GRAPHICS, NVML_CLOCK_MEM, NVML_CLOCK_SM,
    NVML_CLOCK_VIDEO,
};

/// Linear between `idle` and `busy` by `percent`.
fn between(idle: u32, busy: u32, percent: u32) -> u32 {
    let span = u64::from(busy.saturating_sub(idle)) * u64::from(percent.min(100)) / 100;
    idle + span as u32
}

/// Current clock in MHz: SM and graphics boost while a kernel ran in the last sample period; a
/// throttled GPU's boost clock is divided by its slowdown factor (which is why its kernels take
/// that much longer), and its idle clock is at most that.
pub fn clock_mhz(snap: &Snapshot, clock: c_uint) -> Option<u32> {
    let busy = snap.busy_recently();
    let boost = (f64::from(SM_CLOCK_BUSY_MHZ) / snap.throttle_factor()).round() as u32;
    match clock {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM if busy => Some(boost),
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => Some(SM_CLOCK_IDLE_MHZ.min(boost)),
        NVML_CLOCK_MEM => Some(MEM_CLOCK_MHZ),
        NVML_CLOCK_VIDEO => Some(VIDEO_CLOCK_MHZ),
        _ => None,
    }
}

/// Maximum clock in MHz.
pub fn max_clock_mhz(clock: c_uint) -> Option<u32> {
    match clock {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => Some(SM_CLOCK_BUSY_MHZ),
        NVML_CLOCK_MEM => Some(MEM_CLOCK_MHZ),
        NVML_CLOCK_VIDEO => Some(VIDEO_CLOCK_MHZ),
        _ => None,
    }
}

/// Board power in mW, linear in the last period's utilization.
pub fn power_mw(snap: &Snapshot) -> u32 {
    between(POWER_IDLE_MW, POWER_BUSY_MW, snap.last_period_pct())
}

/// GPU temperature in °C, linear in the last period's utilization; a throttled GPU is past its
/// slowdown threshold, which is why it is throttled.
pub fn temperature_c(snap: &Snapshot) -> u32 {
    if snap.throttled() {
        return TEMP_THROTTLED_C;
    }
    between(TEMP_IDLE_C, TEMP_BUSY_C, snap.last_period_pct())
}

/// Clock-event ("throttle") reasons: GPU idle when no kernel ran in the last sample period;
/// software thermal and hardware slowdown while the GPU is throttled, busy or not.
pub fn clock_event_reasons(snap: &Snapshot) -> c_ulonglong {
    let idle = if snap.busy_recently() {
        0
    } else {
        CLOCKS_EVENT_REASON_GPU_IDLE
    };
    let slowdown = if snap.throttled() {
        CLOCKS_EVENT_REASON_SW_THERMAL_SLOWDOWN | CLOCKS_EVENT_REASON_HW_SLOWDOWN
    } else {
        0
    };
    idle | slowdown
}

#[cfg(test)]
mod tests {
    use super::*;
    use simgpu_state::PERIOD_NS;

    fn snapshot(busy_fraction_of_last_period: f64) -> Snapshot {
        let now = 100 * PERIOD_NS;
        let mut snap = Snapshot::empty(now, 200);
        let busy = (PERIOD_NS as f64 * busy_fraction_of_last_period) as u64;
        snap.credit_busy(now - PERIOD_NS, now - PERIOD_NS + busy);
        snap
    }

    #[test]
    fn idle_device_reads_idle() {
        let snap = snapshot(0.0);
        assert_eq!(clock_mhz(&snap, NVML_CLOCK_SM), Some(345));
        assert_eq!(clock_event_reasons(&snap), CLOCKS_EVENT_REASON_GPU_IDLE);
        assert_eq!(power_mw(&snap), 100_000);
        assert_eq!(temperature_c(&snap), 35);
    }

    #[test]
    fn busy_device_boosts_and_heats() {
        let snap = snapshot(1.0);
        assert_eq!(clock_mhz(&snap, NVML_CLOCK_GRAPHICS), Some(1980));
        assert_eq!(clock_event_reasons(&snap), 0);
        assert_eq!(power_mw(&snap), 700_000);
        assert_eq!(temperature_c(&snap), 70);
        let half = snapshot(0.5);
        assert_eq!(power_mw(&half), 400_000);
        assert_eq!(temperature_c(&half), 52);
    }

    #[test]
    fn a_throttled_device_slows_its_clock_and_says_why() {
        let mut busy = snapshot(1.0);
        busy.throttle_milli = 2000;
        assert_eq!(clock_mhz(&busy, NVML_CLOCK_SM), Some(990));
        let slowdown = CLOCKS_EVENT_REASON_SW_THERMAL_SLOWDOWN | CLOCKS_EVENT_REASON_HW_SLOWDOWN;
        assert_eq!(clock_event_reasons(&busy), slowdown);
        let mut idle = snapshot(0.0);
        idle.throttle_milli = 8000;
        assert_eq!(clock_mhz(&idle, NVML_CLOCK_SM), Some(248));
        assert_eq!(
            clock_event_reasons(&idle),
            slowdown | CLOCKS_EVENT_REASON_GPU_IDLE
        );
        assert_eq!(
            clock_mhz(&idle, NVML_CLOCK_MEM),
            Some(2619),
            "memory keeps its clock"
        );
    }

    #[test]
    fn clock_types_are_checked() {
        let snap = snapshot(0.0);
        assert_eq!(clock_mhz(&snap, NVML_CLOCK_MEM), Some(2619));
        assert_eq!(clock_mhz(&snap, 4), None);
        assert_eq!(max_clock_mhz(NVML_CLOCK_SM), Some(1980));
        assert_eq!(max_clock_mhz(9), None);
    }
}
