//! Device allocations and page-locked host ranges.
//!
//! A device pointer is the address of a `PROT_NONE` reservation: like a real UVA device pointer
//! it lives in the process's address space (so no host pointer can collide with it) but the host
//! cannot dereference it. The bytes live in a separate read-write mapping, the "backing", which
//! the copy engine reads and writes, so a DtoH copy returns what an HtoD copy wrote.
use std::collections::BTreeMap;

use crate::result::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CuResult};

/// One cuMemAlloc allocation.
pub struct DeviceAlloc {
    pub len: usize,
    /// Address of the host-side bytes.
    pub backing: usize,
    /// The context it belongs to (freed with it).
    pub ctx: u64,
    /// The GPU whose memory it takes.
    pub device: u32,
}

/// One page-locked host range.
pub struct PinnedRange {
    pub len: usize,
    /// Allocated by cuMemHostAlloc/cuMemAllocHost (we unmap it) rather than registered.
    pub owned: bool,
}

/// All allocations of this process, keyed by start address.
#[derive(Default)]
pub struct Memory {
    pub device: BTreeMap<u64, DeviceAlloc>,
    pub pinned: BTreeMap<usize, PinnedRange>,
}

impl Memory {
    /// The backing address for `len` bytes at device pointer `dptr`, if they lie in one
    /// allocation.
    pub fn device_span(&self, dptr: u64, len: usize) -> CuResult<usize> {
        let (base, alloc) = self
            .device
            .range(..=dptr)
            .next_back()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let offset = usize::try_from(dptr - base).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if offset.checked_add(len).is_none_or(|end| end > alloc.len) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(alloc.backing + offset)
    }

    /// Whether `addr` lies inside a device allocation (unified addressing).
    pub fn is_device(&self, addr: u64) -> bool {
        self.device_span(addr, 1).is_ok()
    }

    /// Whether `[ptr, ptr + len)` lies inside one page-locked range. Anything else is pageable
    /// and must be staged by the CPU.
    pub fn is_pinned(&self, ptr: usize, len: usize) -> bool {
        self.pinned
            .range(..=ptr)
            .next_back()
            .is_some_and(|(base, r)| ptr - base + len <= r.len)
    }

    /// Whether any part of `[ptr, ptr + len)` is already page-locked.
    pub fn overlaps_pinned(&self, ptr: usize, len: usize) -> bool {
        let end = ptr.saturating_add(len);
        self.pinned
            .range(..end)
            .next_back()
            .is_some_and(|(base, r)| base + r.len > ptr)
    }
}

/// Maps `len` bytes of anonymous memory; `PROT_NONE` for an address reservation.
pub fn map(len: usize, writable: bool, populate: bool) -> CuResult<usize> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_NONE
    };
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    if populate {
        flags |= libc::MAP_POPULATE;
    }
    // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing aliases nothing.
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len.max(1), prot, flags, -1, 0) };
    if ptr == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(ptr as usize)
}

/// Unmaps a mapping made by [`map`].
pub fn unmap(addr: usize, len: usize) {
    // SAFETY: `addr`/`len` describe a mapping this module made and removed from its tables, and
    // every copy that could touch it has completed (callers synchronize first).
    unsafe { libc::munmap(addr as *mut libc::c_void, len.max(1)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_must_lie_inside_one_allocation() {
        let mut mem = Memory::default();
        mem.device.insert(
            0x1000,
            DeviceAlloc {
                len: 0x100,
                backing: 0x9000,
                ctx: 1,
                device: 0,
            },
        );
        assert_eq!(mem.device_span(0x1010, 0x10), Ok(0x9010));
        assert_eq!(mem.device_span(0x1000, 0x100), Ok(0x9000));
        assert!(mem.device_span(0x1080, 0x81).is_err());
        assert!(mem.device_span(0xfff, 1).is_err());
        assert!(mem.is_device(0x10ff));
        assert!(!mem.is_device(0x1100));
    }

    #[test]
    fn pinned_ranges_classify_host_pointers() {
        let mut mem = Memory::default();
        mem.pinned.insert(
            0x5000,
            PinnedRange {
                len: 0x1000,
                owned: true,
            },
        );
        assert!(mem.is_pinned(0x5000, 0x1000));
        assert!(mem.is_pinned(0x5800, 0x10));
        assert!(!mem.is_pinned(0x5800, 0x1000), "runs past the range");
        assert!(!mem.is_pinned(0x4fff, 1));
        assert!(mem.overlaps_pinned(0x4000, 0x1001));
        assert!(!mem.overlaps_pinned(0x4000, 0x1000));
        assert!(!mem.overlaps_pinned(0x6000, 0x10));
    }

    #[test]
    fn mappings_round_trip() {
        let addr = map(4096, true, true).unwrap();
        // SAFETY: a fresh 4 KiB read-write mapping.
        unsafe { (addr as *mut u8).write(7) };
        unmap(addr, 4096);
    }
}
