//! Waiting, two ways: the host thread spins like the real driver's default sync schedule, and
//! the device threads sleep until a deadline with a short spin at the end for accuracy.
use std::time::Duration;

use simgpu_state::clock::monotonic_ns;

/// Spins between sched_yield calls, like the driver's `CU_CTX_SCHED_AUTO` spin-then-yield loop.
const SPINS_PER_YIELD: u32 = 100;
/// Below this, a device thread busy-waits instead of sleeping (sleep overshoots by ~50-100 µs).
const SPIN_BELOW_NS: u64 = 200_000;
/// Wake this much before the deadline and spin the rest.
const WAKE_EARLY_NS: u64 = 100_000;

/// Blocks the calling (host) thread until `done()` holds, staying on-CPU: the thread spins and
/// yields, it never sleeps, so off-CPU analysis does not see the wait (as with a real GPU).
pub fn host_spin_until(mut done: impl FnMut() -> bool) {
    let mut spins: u32 = 0;
    while !done() {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(SPINS_PER_YIELD) {
            // SAFETY: sched_yield takes no arguments and has no memory effects.
            unsafe { libc::sched_yield() };
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Blocks a device thread until CLOCK_MONOTONIC reaches `deadline_ns`.
pub fn device_wait_until(deadline_ns: u64) {
    loop {
        let now = monotonic_ns();
        if now >= deadline_ns {
            return;
        }
        let left = deadline_ns - now;
        if left > SPIN_BELOW_NS {
            std::thread::sleep(Duration::from_nanos(left - WAKE_EARLY_NS));
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_wait_is_accurate() {
        for ns in [50_000u64, 2_000_000] {
            let start = monotonic_ns();
            device_wait_until(start + ns);
            let took = monotonic_ns() - start;
            assert!(took >= ns && took < ns + 5_000_000, "{ns} ns took {took}");
        }
    }

    #[test]
    fn host_spin_returns_when_done() {
        let mut n = 0;
        host_spin_until(|| {
            n += 1;
            n > 250
        });
        assert_eq!(n, 251);
    }
}
