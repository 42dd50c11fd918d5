//! How fast one of the host's CPUs copies memory, measured once at the start: the what-if of
//! `pin_memory=True` needs what the pin-memory thread's copy of each batch into page-locked
//! memory will cost, and that is a plain memcpy on one CPU, not the driver's staged copy the
//! recording sees.

use std::time::Instant;

/// Large enough to leave the caches, small enough to cost a few ms a copy.
const BYTES: usize = 32 << 20;
const TRIES: usize = 3;

/// (bytes, ns) of the fastest of a few copies of [`BYTES`] between two buffers whose pages
/// are already faulted in.
pub fn measure() -> (u64, u64) {
    let src = vec![1u8; BYTES];
    let mut dst = vec![0u8; BYTES];
    // The first copy faults in `dst`'s pages: what the timed ones then measure is the copy.
    dst.copy_from_slice(&src);
    let best = (0..TRIES)
        .map(|_| {
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
    /// Any CPU copies 32 MiB in well under a second, and faster than 100 GB/s does no CPU.
    #[test]
    fn a_copy_takes_a_plausible_time() {
        let (bytes, ns) = super::measure();
        let gbps = bytes as f64 / ns as f64;
        assert!(ns < 1_000_000_000 && gbps < 100.0, "{bytes} B in {ns} ns");
    }
}
