//! The on-disk data set of the `disk` scenario: many small sample files (like JPEGs), each
//! evicted from the page cache right before a worker reads it, so the read waits for the disk.
use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read as _, Write as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::sys;

/// Samples in the data set.
pub const SAMPLES: usize = 256;
/// Bytes per sample file: one readahead window, so a cold read is one disk request.
pub const SAMPLE_BYTES: usize = 128 * 1024;
const READ_CHUNK_BYTES: usize = SAMPLE_BYTES;
const ALIGN: usize = 4096;

/// Opens a sample so that reading it goes to the disk every time: O_DIRECT, where the
/// filesystem has it. Buffered cold reads, even evicted first, cost the reader about as much
/// CPU (copying, page-cache work) as waiting on a VM whose disk the host caches, which made
/// the scenario's cause depend on the host's cache. Falls back to a buffered open.
fn open_uncached(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .or_else(|_| File::open(path))
}

#[derive(Clone)]
pub struct Dataset {
    files: Vec<PathBuf>,
}

/// The default data directory, under the system's temporary directory.
pub fn default_dir() -> PathBuf {
    std::env::temp_dir().join("stallgen-data")
}

impl Dataset {
    /// Creates the sample files under `dir` (reusing those of the right size) and syncs them,
    /// so that their pages are clean and eviction works.
    pub fn prepare(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        if sys::is_tmpfs(dir) {
            eprintln!(
                "stallgen: warning: {} is on tmpfs, whose pages cannot be evicted: the disk \
                 scenario will not wait for a disk (pass --data-dir on a real disk)",
                dir.display()
            );
        }
        let mut files = Vec::with_capacity(SAMPLES);
        for i in 0..SAMPLES {
            let path = dir.join(format!("sample-{i:04}.bin"));
            if !fs::metadata(&path).is_ok_and(|m| m.len() == SAMPLE_BYTES as u64) {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&path)?;
                // Not zeros: a filesystem could store those sparsely, and never read the disk.
                let data: Vec<u8> = (0..SAMPLE_BYTES)
                    .map(|j| ((i * 7 + j * 131) % 251) as u8 + 1)
                    .collect();
                f.write_all(&data)?;
                f.sync_all()?;
            }
            files.push(path);
        }
        Ok(Self { files })
    }

    /// Reads whole cold samples, in a pseudo-random order driven by `cursor`, into `out`
    /// (wrapping around) until `budget` of wall time has passed; at least one sample.
    /// Returns the samples read.
    pub fn read_cold_for(
        &self,
        budget: Duration,
        out: &mut [u8],
        cursor: &mut u64,
    ) -> io::Result<usize> {
        let start = Instant::now();
        // O_DIRECT wants an aligned buffer: over-allocate and start at a page boundary.
        let mut raw = vec![0u8; READ_CHUNK_BYTES + ALIGN];
        let offset = raw.as_ptr().align_offset(ALIGN);
        let buf = &mut raw[offset..offset + READ_CHUNK_BYTES];
        let mut at = 0usize;
        let mut samples = 0;
        loop {
            *cursor = cursor
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let path = &self.files[(*cursor >> 33) as usize % self.files.len()];
            let mut f = open_uncached(path)?;
            sys::evict_from_page_cache(&f)?;
            loop {
                let n = f.read(buf)?;
                if n == 0 {
                    break;
                }
                let mut src = &buf[..n];
                while !src.is_empty() {
                    let k = src.len().min(out.len() - at);
                    out[at..at + k].copy_from_slice(&src[..k]);
                    src = &src[k..];
                    at = (at + k) % out.len();
                }
            }
            samples += 1;
            if start.elapsed() >= budget {
                return Ok(samples);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepares_and_reads_samples() {
        let dir = std::env::temp_dir().join(format!("stallgen-ds-test-{}", std::process::id()));
        let ds = Dataset::prepare(&dir).unwrap();
        assert_eq!(ds.files.len(), SAMPLES);
        let mut out = vec![0u8; 4096];
        let mut cursor = 1;
        let n = ds
            .read_cold_for(Duration::ZERO, &mut out, &mut cursor)
            .unwrap();
        assert_eq!(n, 1, "a zero budget still reads one sample");
        assert!(out.iter().all(|&b| b != 0));
        fs::remove_dir_all(&dir).unwrap();
    }
}
