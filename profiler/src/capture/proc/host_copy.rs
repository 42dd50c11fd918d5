//! How fast one of the host's CPUs copies memory, measured once at the start: the what-if of
//! `pin_memory=True` needs what the pin-memory thread's copy of each batch into page-locked
//! memory will cost, and that is a plain memcpy on one CPU, not the driver's staged copy the
//! recording sees.
//!
//! A batch is copied from memory to memory, not from cache to cache: the buffers are flushed
//! from the caches before each timed copy, so they can be small (a recorder's own peak memory
//! is a target: two 32 MiB buffers, large enough to leave a server's caches on their own, cost
//! 64 MiB of it).

use std::time::Instant;

const BYTES: usize = 8 << 20;
const TRIES: usize = 3;

/// Writes `buf`'s cache lines back and drops them from every cache, where the CPU can.
fn flush(buf: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_clflush, _mm_mfence};
        for line in buf.chunks(64) {
            // SAFETY: the address is inside `buf`; clflush only writes back and invalidates.
            unsafe { _mm_clflush(line.as_ptr()) };
        }
        // SAFETY: a fence has no preconditions.
        unsafe { _mm_mfence() };
    }
    #[cfg(target_arch = "aarch64")]
    {
        // 64 bytes is the smallest data cache line of arm64 servers (Neoverse's are 64); a
        // larger line is flushed more than once, which costs nothing in the timed copy.
        for line in buf.chunks(64) {
            // SAFETY: the address is inside `buf`; `dc civac` only cleans and invalidates.
            unsafe { std::arch::asm!("dc civac, {}", in(reg) line.as_ptr()) };
        }
        // SAFETY: a barrier has no preconditions.
        unsafe { std::arch::asm!("dsb sy") };
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = buf;
}

/// (bytes, ns) of the fastest of a few copies of [`BYTES`] between two buffers whose pages
/// are already faulted in, each from and to memory.
pub fn measure() -> (u64, u64) {
    let src = vec![1u8; BYTES];
    let mut dst = vec![0u8; BYTES];
    // The first copy faults in `dst`'s pages: what the timed ones then measure is the copy.
    dst.copy_from_slice(&src);
    let best = (0..TRIES)
        .map(|_| {
            flush(&src);
            flush(&dst);
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            t.elapsed().as_nanos() as u64
        })
        .min()
        .unwrap_or(0);
    (BYTES as u64, best.max(1))
}

#[cfg(test)]
mod tests {
    /// Any CPU copies 8 MiB in well under a second, and faster than 100 GB/s does no CPU.
    #[test]
    fn a_copy_takes_a_plausible_time() {
        let (bytes, ns) = super::measure();
        let gbps = bytes as f64 / ns as f64;
        assert!(ns < 1_000_000_000 && gbps < 100.0, "{bytes} B in {ns} ns");
    }
}
