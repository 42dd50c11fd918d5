//! The cold reader: a file evicted from the page cache and read back with buffered reads, so
//! that almost every read waits for the disk.
use std::{
    fs::{File, OpenOptions},
    io::{self, Read as _, Seek as _, SeekFrom, Write as _},
    path::Path,
    time::{Duration, Instant},
};

use crate::{announce_ready, sys};

pub const MIB: u64 = 1024 * 1024;
/// The size of each buffered read, like a typical data loader's.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Makes `path` a `bytes`-long file on disk, reusing it when it already has that size.
pub fn ensure_file(path: &Path, bytes: u64) -> io::Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == bytes) {
        return Ok(());
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    // Not zeros: a filesystem could store those sparsely and reads would never reach the disk.
    let chunk: Vec<u8> = (0..MIB).map(|i| (i * 131 % 251) as u8 + 1).collect();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(MIB);
        f.write_all(&chunk[..n as usize])?;
        left -= n;
    }
    f.sync_all()
}

/// Evicts and re-reads `path` until `deadline`; returns the bytes read.
pub fn read_cold_until(path: &Path, deadline: Instant) -> io::Result<u64> {
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    let mut total = 0u64;
    while Instant::now() < deadline {
        sys::evict_from_page_cache(&file)?;
        file.seek(SeekFrom::Start(0))?;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 || Instant::now() >= deadline {
                break;
            }
            total += n as u64;
        }
    }
    Ok(total)
}

/// `cold-read`: creates the file if needed, then reads it cold in a loop.
pub fn cold_read(path: &Path, mb: u64, secs: Duration) -> io::Result<()> {
    ensure_file(path, mb * MIB)?;
    // The clock starts after the file exists: writing it is not part of the workload.
    let deadline = Instant::now() + secs;
    announce_ready()?;
    read_cold_until(path, deadline).map(drop)
}
