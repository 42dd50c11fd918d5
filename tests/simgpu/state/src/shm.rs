//! Opening the state file: create it on first use, map it `MAP_SHARED`, and fill the config once.
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::clock;
use crate::device::MEMORY_TOTAL_BYTES;
use crate::layout::{INIT_BUSY, INIT_EMPTY, INIT_READY, MAGIC, STATE_FILE_BYTES, StateFile};
use crate::pcie::PcieLink;

/// Path of the state file; every process of one simulated machine must see the same value.
pub const STATE_ENV: &str = "STALLSCOPE_SIMGPU_STATE";
pub const DEFAULT_STATE_PATH: &str = "/dev/shm/stallscope-simgpu";
/// `"gen,width"`: the link the device trains to, read by whichever process creates the file.
pub const PCIE_ENV: &str = "STALLSCOPE_SIMGPU_PCIE";

/// How long to wait for another process that is filling a new file.
const INIT_WAIT: Duration = Duration::from_secs(2);

/// What the creator of a new state file writes into it.
#[derive(Debug, Clone, Copy)]
pub struct InitConfig {
    pub pcie: PcieLink,
}

impl InitConfig {
    /// The config from the environment: `STALLSCOPE_SIMGPU_PCIE`, else gen5 x16. A bad value is
    /// reported on stderr and ignored, as a driver ignores a bad module parameter.
    pub fn from_env() -> Self {
        let pcie = match std::env::var(PCIE_ENV) {
            Ok(text) => PcieLink::parse(&text).unwrap_or_else(|e| {
                eprintln!("simgpu: ignoring {PCIE_ENV}: {e}");
                PcieLink::MAX
            }),
            Err(_) => PcieLink::MAX,
        };
        InitConfig { pcie }
    }
}

impl Default for InitConfig {
    fn default() -> Self {
        InitConfig {
            pcie: PcieLink::MAX,
        }
    }
}

/// A mapping of the state file. Cheap to share between threads: all access is atomic.
pub struct SharedDevice {
    map: NonNull<StateFile>,
}

// SAFETY: the mapping is only accessed through atomics (and the spin lock built on them), and it
// stays mapped until the SharedDevice is dropped.
unsafe impl Send for SharedDevice {}
// SAFETY: as above; `&SharedDevice` only hands out `&StateFile`, whose fields are all atomics.
unsafe impl Sync for SharedDevice {}

impl Drop for SharedDevice {
    fn drop(&mut self) {
        // SAFETY: `map` came from a successful mmap of STATE_FILE_BYTES and nothing borrowed from
        // it outlives `self`.
        unsafe { libc::munmap(self.map.as_ptr().cast(), STATE_FILE_BYTES) };
    }
}

impl std::ops::Deref for SharedDevice {
    type Target = StateFile;

    fn deref(&self) -> &StateFile {
        // SAFETY: the mapping is live, suitably aligned (page-aligned) and STATE_FILE_BYTES long;
        // every bit pattern is a valid StateFile because all fields are integers or atomics.
        unsafe { self.map.as_ref() }
    }
}

/// The state path from `STALLSCOPE_SIMGPU_STATE`, else the default.
pub fn state_path_from_env() -> PathBuf {
    std::env::var_os(STATE_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_STATE_PATH), PathBuf::from)
}

impl SharedDevice {
    /// Opens the file named by the environment, creating it with the environment's config.
    pub fn open_from_env() -> io::Result<Self> {
        Self::open(&state_path_from_env(), InitConfig::from_env())
    }

    /// Opens (or creates and fills with `config`) the state file at `path`.
    pub fn open(path: &Path, config: InitConfig) -> io::Result<Self> {
        let file = open_or_create(path)?;
        if file.metadata()?.len() < STATE_FILE_BYTES as u64 {
            // Growing is idempotent, so two processes racing to create the file agree.
            file.set_len(STATE_FILE_BYTES as u64)?;
        }
        let device = Self::map(Some(&file))?;
        device.initialize(config).map_err(|e| {
            io::Error::new(e.kind(), format!("simgpu state {}: {e}", path.display()))
        })?;
        Ok(device)
    }

    /// A private, anonymous state shared only with this process's threads (unit tests).
    pub fn anonymous(config: InitConfig) -> io::Result<Self> {
        let device = Self::map(None)?;
        device.initialize(config)?;
        Ok(device)
    }

    fn map(file: Option<&File>) -> io::Result<Self> {
        let (flags, fd) = match file {
            Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
            None => (libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a fresh mapping at an address of the kernel's choosing; it aliases nothing in
        // this process. The file (if any) is at least STATE_FILE_BYTES long.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STATE_FILE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(SharedDevice { map })
    }

    /// Fills the config if this process is first; otherwise waits for the creator and checks
    /// that the file has this build's layout.
    fn initialize(&self, config: InitConfig) -> io::Result<()> {
        let started = Instant::now();
        loop {
            match self.init.compare_exchange(
                INIT_EMPTY,
                INIT_BUSY,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.fill(config);
                    return Ok(());
                }
                Err(INIT_READY) => break,
                Err(_) if started.elapsed() > INIT_WAIT => {
                    // The creator died half-way: the config fields are idempotent, so refill.
                    self.fill(config);
                    return Ok(());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        let magic = self.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("layout {magic:#x}, this build expects {MAGIC:#x}: delete the file"),
            ));
        }
        Ok(())
    }

    fn fill(&self, config: InitConfig) {
        let mono = clock::monotonic_ns();
        let real = clock::realtime_ns();
        let boot = clock::boottime_ns();
        let offset = |other| clock::offset_ns(other, mono);
        self.pcie_gen
            .store(config.pcie.generation, Ordering::Relaxed);
        self.pcie_width.store(config.pcie.width, Ordering::Relaxed);
        self.pcie_max_gen
            .store(PcieLink::MAX.generation, Ordering::Relaxed);
        self.pcie_max_width
            .store(PcieLink::MAX.width, Ordering::Relaxed);
        self.mem_total_bytes
            .store(MEMORY_TOTAL_BYTES, Ordering::Relaxed);
        self.realtime_offset_ns
            .store(offset(real), Ordering::Relaxed);
        self.boottime_offset_ns
            .store(offset(boot), Ordering::Relaxed);
        self.magic.store(MAGIC, Ordering::Relaxed);
        self.init.store(INIT_READY, Ordering::Release);
    }
}

/// Opens `path` read-write, creating it world-writable so that a workload which dropped to an
/// unprivileged user can still attach to a file root created.
fn open_or_create(path: &Path) -> io::Result<File> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o666)
        .open(path)
    {
        Ok(file) => {
            // The umask may have removed bits from `mode`.
            file.set_permissions(std::fs::Permissions::from_mode(0o666))?;
            Ok(file)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            OpenOptions::new().read(true).write(true).open(path)
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("creating simgpu state {}: {e}", path.display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_is_created_once_and_shared() {
        let dir = std::env::temp_dir().join(format!("simgpu-shm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state");
        let _ = std::fs::remove_file(&path);
        let slow = InitConfig {
            pcie: PcieLink::new(3, 4).unwrap(),
        };
        let a = SharedDevice::open(&path, slow).unwrap();
        // The second opener's config is ignored: the file already exists.
        let b = SharedDevice::open(&path, InitConfig::default()).unwrap();
        assert_eq!(b.pcie_link(), PcieLink::new(3, 4).unwrap());
        a.set_pcie_link(PcieLink::new(4, 8).unwrap());
        assert_eq!(b.pcie_link(), PcieLink::new(4, 8).unwrap());
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            STATE_FILE_BYTES as u64
        );
        drop((a, b));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_foreign_layout_is_refused() {
        let dir = std::env::temp_dir().join(format!("simgpu-shm2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state");
        let _ = std::fs::remove_file(&path);
        let a = SharedDevice::open(&path, InitConfig::default()).unwrap();
        a.magic.store(7, Ordering::Relaxed);
        let err = SharedDevice::open(&path, InitConfig::default())
            .err()
            .unwrap();
        assert!(err.to_string().contains("delete the file"), "{err}");
        drop(a);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
