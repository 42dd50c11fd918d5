//! Reads of another process's memory, through `/proc/PID/mem`: no ptrace stop, so the target
//! runs on while it is read (a value may change under the read, which is why callers check
//! what they read for plausibility).
use std::{fs::File, os::unix::fs::FileExt};

pub struct Memory {
    mem: File,
}

impl Memory {
    pub fn open(pid: u32) -> std::io::Result<Self> {
        Ok(Self {
            mem: File::open(format!("/proc/{pid}/mem"))?,
        })
    }

    /// `len` bytes at `addr`, or None if any of them cannot be read.
    pub fn bytes(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0; len];
        self.mem.read_exact_at(&mut buf, addr).ok()?;
        Some(buf)
    }

    pub fn u64(&self, addr: u64) -> Option<u64> {
        let mut buf = [0; 8];
        self.mem.read_exact_at(&mut buf, addr).ok()?;
        Some(u64::from_le_bytes(buf))
    }

    pub fn i32(&self, addr: u64) -> Option<i32> {
        let mut buf = [0; 4];
        self.mem.read_exact_at(&mut buf, addr).ok()?;
        Some(i32::from_le_bytes(buf))
    }

    pub fn u8(&self, addr: u64) -> Option<u8> {
        let mut buf = [0; 1];
        self.mem.read_exact_at(&mut buf, addr).ok()?;
        Some(buf[0])
    }
}
