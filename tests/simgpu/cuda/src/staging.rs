//! Reusable staging buffers for pageable copies, standing in for the driver's pool of pinned
//! bounce buffers: after the first copy of a size, staging costs the calling thread a memcpy
//! and no page faults, as on a real machine. The memcpy takes the simulated host's time
//! (`STALLSCOPE_SIMGPU_HOST_GBPS`), not this machine's, or at least its own if that is longer.
use std::sync::Mutex;

use simgpu_state::clock::monotonic_ns;
use simgpu_state::host_copy_ns;

use crate::engine::locked;

/// Most bytes kept for reuse; beyond this, returned buffers are freed.
const MAX_POOLED_BYTES: usize = 512 << 20;

pub struct StagingPool {
    free: Mutex<Vec<Box<[u8]>>>,
    /// The simulated host's memcpy rate.
    host_bytes_per_s: f64,
}

impl StagingPool {
    pub const fn new(host_bytes_per_s: f64) -> Self {
        StagingPool {
            free: Mutex::new(Vec::new()),
            host_bytes_per_s,
        }
    }

    /// Copies pageable `data` into a staging buffer on the calling thread, as the driver does
    /// before a host-to-device DMA.
    pub fn stage(&self, data: &[u8]) -> Box<[u8]> {
        let start = monotonic_ns();
        let mut staged = self.take(data.len());
        staged[..data.len()].copy_from_slice(data);
        self.spin_out_copy(start, data.len());
        staged
    }

    /// Copies a device-to-host DMA's staging buffer into pageable `dst` on the calling thread,
    /// and takes the buffer back.
    pub fn unstage(&self, buffer: Box<[u8]>, dst: &mut [u8]) {
        let start = monotonic_ns();
        dst.copy_from_slice(&buffer[..dst.len()]);
        self.spin_out_copy(start, dst.len());
        self.give(buffer);
    }

    /// Stays on-CPU, as a memcpy does, until a copy of `bytes` begun at `start_ns` has taken
    /// the simulated host's time.
    fn spin_out_copy(&self, start_ns: u64, bytes: usize) {
        let until = start_ns + host_copy_ns(bytes as u64, self.host_bytes_per_s);
        while monotonic_ns() < until {
            std::hint::spin_loop();
        }
    }

    /// A buffer of at least `len` bytes (at most twice that, so big buffers are not wasted on
    /// small copies).
    pub fn take(&self, len: usize) -> Box<[u8]> {
        let mut free = locked(&self.free);
        let fit = free
            .iter()
            .position(|b| b.len() >= len && b.len() <= len.saturating_mul(2));
        match fit {
            Some(i) => free.swap_remove(i),
            None => vec![0u8; len].into_boxed_slice(),
        }
    }

    /// Returns a buffer for reuse.
    pub fn give(&self, buffer: Box<[u8]>) {
        let mut free = locked(&self.free);
        let pooled: usize = free.iter().map(|b| b.len()).sum();
        if pooled + buffer.len() <= MAX_POOLED_BYTES {
            free.push(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_by_size() {
        let pool = StagingPool::new(1e12);
        let a = pool.take(1000);
        let addr = a.as_ptr();
        pool.give(a);
        let b = pool.take(600);
        assert_eq!(b.as_ptr(), addr, "fits: at most twice the size");
        pool.give(b);
        let c = pool.take(400);
        assert_ne!(c.as_ptr(), addr, "too big to waste on 400 bytes");
        assert!(pool.take(2000).len() >= 2000);
    }

    #[test]
    fn staging_takes_the_simulated_hosts_time() {
        // 8 MB at 1 GB/s: 8 ms, however fast this machine copies.
        let pool = StagingPool::new(1e9);
        let data = vec![7u8; 8_000_000];
        let start = monotonic_ns();
        let staged = pool.stage(&data);
        let took = monotonic_ns() - start;
        assert!(took >= 8_000_000, "staging took {took} ns");
        assert_eq!(&staged[..data.len()], &data[..]);
        let mut back = vec![0u8; data.len()];
        let start = monotonic_ns();
        pool.unstage(staged, &mut back);
        assert!(monotonic_ns() - start >= 8_000_000);
        assert_eq!(back, data);
    }
}
