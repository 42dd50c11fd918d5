//! Reusable staging buffers for pageable copies, standing in for the driver's pool of pinned
//! bounce buffers: after the first copy of a size, staging costs the calling thread a memcpy
//! and no page faults, as on a real machine.
use std::sync::Mutex;

use crate::engine::locked;

/// Most bytes kept for reuse; beyond this, returned buffers are freed.
const MAX_POOLED_BYTES: usize = 512 << 20;

pub struct StagingPool {
    free: Mutex<Vec<Box<[u8]>>>,
}

impl StagingPool {
    pub const fn new() -> Self {
        StagingPool {
            free: Mutex::new(Vec::new()),
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
        let pool = StagingPool::new();
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
}
