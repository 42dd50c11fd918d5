//! The recorder's clock: CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns` and of every
//! record, and the readings that rebase NVML's timestamps onto it.
use profiler_core::nvml::clock::ClockReadings;

fn read_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// CLOCK_MONOTONIC in ns.
pub fn monotonic_ns() -> u64 {
    read_ns(libc::CLOCK_MONOTONIC)
}

/// The three clocks NVML's timestamps may be on, read back to back.
pub fn readings() -> ClockReadings {
    ClockReadings {
        realtime_ns: read_ns(libc::CLOCK_REALTIME),
        boottime_ns: read_ns(libc::CLOCK_BOOTTIME),
        monotonic_ns: monotonic_ns(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_are_taken_together() {
        let before = monotonic_ns();
        let r = readings();
        assert!(r.monotonic_ns >= before && before > 0);
        assert!(r.realtime_ns > 1_600_000_000_000_000_000);
    }
}
