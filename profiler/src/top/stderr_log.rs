//! Standard error sent to a file while the live screen is up, and said when it is gone.
use std::{os::fd::AsRawFd as _, path::PathBuf};

pub struct StderrLog {
    saved: libc::c_int,
    file: PathBuf,
}

impl StderrLog {
    pub fn capture(file: &std::path::Path) -> anyhow::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(file)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", file.display()))?;
        // SAFETY: dup and dup2 on descriptors this process owns; fd 2 is replaced atomically.
        let saved = unsafe { libc::dup(libc::STDERR_FILENO) };
        anyhow::ensure!(saved >= 0, "dup(2): {}", std::io::Error::last_os_error());
        // SAFETY: as above.
        unsafe { libc::dup2(f.as_raw_fd(), libc::STDERR_FILENO) };
        Ok(Self {
            saved,
            file: file.to_path_buf(),
        })
    }
}

impl Drop for StderrLog {
    fn drop(&mut self) {
        // SAFETY: `saved` is the descriptor dup'ed at capture, put back on fd 2 and closed.
        unsafe {
            libc::dup2(self.saved, libc::STDERR_FILENO);
            libc::close(self.saved);
        }
        if let Ok(said) = std::fs::read_to_string(&self.file) {
            eprint!("{said}");
        }
        let _ = std::fs::remove_file(&self.file);
    }
}
