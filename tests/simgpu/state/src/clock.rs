//! Clock reads. Device time is CLOCK_MONOTONIC nanoseconds everywhere in the state file.

/// Reads `clock` in nanoseconds.
fn read_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime only writes it.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// CLOCK_MONOTONIC in ns: the device clock of the state file.
pub fn monotonic_ns() -> u64 {
    read_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in ns since the Unix epoch.
pub fn realtime_ns() -> u64 {
    read_ns(libc::CLOCK_REALTIME)
}

/// CLOCK_BOOTTIME in ns (monotonic plus time spent suspended).
pub fn boottime_ns() -> u64 {
    read_ns(libc::CLOCK_BOOTTIME)
}

/// CPU time consumed by the calling thread, in ns.
pub fn thread_cpu_ns() -> u64 {
    read_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// `a - b` as a signed offset; used to convert monotonic stamps to another clock.
pub fn offset_ns(a: u64, b: u64) -> i64 {
    (i128::from(a) - i128::from(b)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_advance_and_offsets_are_signed() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(b >= a && a > 0);
        assert!(realtime_ns() > 1_600_000_000_000_000_000);
        assert!(boottime_ns() >= a);
        assert_eq!(offset_ns(5, 7), -2);
        assert_eq!(offset_ns(7, 5), 2);
    }
}
