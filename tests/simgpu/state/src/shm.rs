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
use crate::gpu::Gpu;
use crate::layout::{
    INIT_BUSY, INIT_EMPTY, INIT_READY, MAGIC, MAX_DEVICES, STATE_FILE_BYTES, StateFile,
    UNTHROTTLED_MILLI,
};
use crate::pcie::PcieLink;

/// Path of the state file; every process of one simulated machine must see the same value.
pub const STATE_ENV: &str = "STALLSCOPE_SIMGPU_STATE";
pub const DEFAULT_STATE_PATH: &str = "/dev/shm/stallscope-simgpu";
/// `"gen,width"`: the link the device trains to, read by whichever process creates the file.
pub const PCIE_ENV: &str = "STALLSCOPE_SIMGPU_PCIE";
/// Number of GPUs (1 to 8), read by whichever process creates the file.
pub const DEVICES_ENV: &str = "STALLSCOPE_SIMGPU_DEVICES";
/// `"gpu:factor"` (comma-separated for several GPUs): GPUs whose kernels run `factor` times
/// slower, as under a thermal slowdown; read by whichever process creates the file.
pub const THROTTLE_ENV: &str = "STALLSCOPE_SIMGPU_THROTTLE";

/// How long to wait for another process that is filling a new file.
const INIT_WAIT: Duration = Duration::from_secs(2);

/// What the creator of a new state file writes into it.
#[derive(Debug, Clone, Copy)]
pub struct InitConfig {
    /// The link every GPU trains to.
    pub pcie: PcieLink,
    /// How many GPUs the machine has, 1 to [`MAX_DEVICES`].
    pub devices: u32,
    /// Kernel slowdown factor of each GPU; 1.0 is full speed.
    pub throttle: [f64; MAX_DEVICES],
}

impl InitConfig {
    /// The config from the environment: `STALLSCOPE_SIMGPU_PCIE` (else gen5 x16),
    /// `STALLSCOPE_SIMGPU_DEVICES` (else 1) and `STALLSCOPE_SIMGPU_THROTTLE` (else none). A bad
    /// value is reported on stderr and ignored, as a driver ignores a bad module parameter.
    pub fn from_env() -> Self {
        let pcie = match std::env::var(PCIE_ENV) {
            Ok(text) => PcieLink::parse(&text).unwrap_or_else(|e| {
                eprintln!("simgpu: ignoring {PCIE_ENV}: {e}");
                PcieLink::MAX
            }),
            Err(_) => PcieLink::MAX,
        };
        let devices = match std::env::var(DEVICES_ENV) {
            Ok(text) => parse_devices(&text).unwrap_or_else(|e| {
                eprintln!("simgpu: ignoring {DEVICES_ENV}: {e}");
                1
            }),
            Err(_) => 1,
        };
        let mut throttle = [1.0; MAX_DEVICES];
        if let Ok(text) = std::env::var(THROTTLE_ENV) {
            match parse_throttle(&text) {
                Ok(list) => list.into_iter().for_each(|(i, f)| throttle[i as usize] = f),
                Err(e) => eprintln!("simgpu: ignoring {THROTTLE_ENV}: {e}"),
            }
        }
        InitConfig {
            pcie,
            devices,
            throttle,
        }
    }
}

impl Default for InitConfig {
    fn default() -> Self {
        InitConfig {
            pcie: PcieLink::MAX,
            devices: 1,
            throttle: [1.0; MAX_DEVICES],
        }
    }
}

/// A throttle setting from its text form: `"gpu:factor"` items, comma-separated, e.g. `"1:2.5"`;
/// a GPU index below [`MAX_DEVICES`] and a factor of at least 1.
pub fn parse_throttle(text: &str) -> Result<Vec<(u32, f64)>, String> {
    text.split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            let (gpu, factor) = item
                .split_once(':')
                .ok_or_else(|| format!("expected \"gpu:factor\", got {item:?}"))?;
            let gpu: u32 = gpu
                .trim()
                .parse()
                .map_err(|e| format!("bad GPU index in {item:?}: {e}"))?;
            let factor: f64 = factor
                .trim()
                .parse()
                .map_err(|e| format!("bad factor in {item:?}: {e}"))?;
            if gpu as usize >= MAX_DEVICES {
                return Err(format!("GPU {gpu} is not below {MAX_DEVICES}"));
            }
            if !(factor.is_finite() && factor >= 1.0) {
                return Err(format!("slowdown factor {factor} is not at least 1"));
            }
            Ok((gpu, factor))
        })
        .collect()
}

/// A device count from its text form, 1 to [`MAX_DEVICES`].
pub fn parse_devices(text: &str) -> Result<u32, String> {
    let n: u32 = text
        .trim()
        .parse()
        .map_err(|e| format!("bad device count {text:?}: {e}"))?;
    if (1..=MAX_DEVICES as u32).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n} GPUs is not in 1..={MAX_DEVICES}"))
    }
}

/// A mapping of the state file. Cheap to share between threads: all access is atomic.
pub struct SharedState {
    map: NonNull<StateFile>,
}

// SAFETY: the mapping is only accessed through atomics (and the spin lock built on them), and it
// stays mapped until the SharedState is dropped.
unsafe impl Send for SharedState {}
// SAFETY: as above; `&SharedState` only hands out `&StateFile`, whose fields are all atomics.
unsafe impl Sync for SharedState {}

impl Drop for SharedState {
    fn drop(&mut self) {
        // SAFETY: `map` came from a successful mmap of STATE_FILE_BYTES and nothing borrowed from
        // it outlives `self`.
        unsafe { libc::munmap(self.map.as_ptr().cast(), STATE_FILE_BYTES) };
    }
}

impl std::ops::Deref for SharedState {
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

impl SharedState {
    /// Number of GPUs this machine has.
    pub fn device_count(&self) -> u32 {
        self.device_count
            .load(Ordering::Acquire)
            .min(MAX_DEVICES as u32)
    }

    /// GPU `index`, if the machine has it.
    pub fn device(&self, index: u32) -> Option<Gpu<'_>> {
        (index < self.device_count()).then(|| Gpu::new(self, index))
    }

    /// Every GPU of the machine, in index order.
    pub fn devices(&self) -> impl Iterator<Item = Gpu<'_>> {
        (0..self.device_count()).map(|i| Gpu::new(self, i))
    }

    /// Forgets `pid` on every GPU (process exit).
    pub fn forget_process(&self, pid: u32) {
        for gpu in self.devices() {
            gpu.forget_process(pid);
        }
    }

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
        Ok(SharedState { map })
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
        let count = config.devices.clamp(1, MAX_DEVICES as u32);
        for (dev, factor) in self.devices[..count as usize].iter().zip(config.throttle) {
            let milli = (factor.max(1.0) * f64::from(UNTHROTTLED_MILLI)).round() as u32;
            dev.throttle_milli.store(milli, Ordering::Relaxed);
            dev.pcie_gen
                .store(config.pcie.generation, Ordering::Relaxed);
            dev.pcie_width.store(config.pcie.width, Ordering::Relaxed);
            dev.pcie_max_gen
                .store(PcieLink::MAX.generation, Ordering::Relaxed);
            dev.pcie_max_width
                .store(PcieLink::MAX.width, Ordering::Relaxed);
            dev.mem_total_bytes
                .store(MEMORY_TOTAL_BYTES, Ordering::Relaxed);
        }
        self.device_count.store(count, Ordering::Relaxed);
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
        let mut throttle = [1.0; MAX_DEVICES];
        throttle[1] = 3.0;
        let slow = InitConfig {
            pcie: PcieLink::new(3, 4).unwrap(),
            devices: 2,
            throttle,
        };
        let a = SharedState::open(&path, slow).unwrap();
        // The second opener's config is ignored: the file already exists.
        let b = SharedState::open(&path, InitConfig::default()).unwrap();
        assert_eq!(b.device_count(), 2);
        assert!(b.device(2).is_none());
        let gpu = |s: &SharedState, i| s.device(i).unwrap().pcie_link();
        assert_eq!(gpu(&b, 0), PcieLink::new(3, 4).unwrap());
        assert_eq!(gpu(&b, 1), PcieLink::new(3, 4).unwrap());
        a.device(1)
            .unwrap()
            .set_pcie_link(PcieLink::new(4, 8).unwrap());
        assert_eq!(gpu(&b, 1), PcieLink::new(4, 8).unwrap());
        assert_eq!(
            gpu(&b, 0),
            PcieLink::new(3, 4).unwrap(),
            "links are per GPU"
        );
        assert_eq!(b.device(1).unwrap().throttle_factor(), 3.0);
        assert_eq!(b.device(0).unwrap().throttle_factor(), 1.0);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            STATE_FILE_BYTES as u64
        );
        drop((a, b));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn device_counts_parse_within_range() {
        assert_eq!(parse_devices(" 4 "), Ok(4));
        assert_eq!(parse_devices("1"), Ok(1));
        assert!(parse_devices("0").is_err());
        assert!(parse_devices("9").is_err());
        assert!(parse_devices("two").is_err());
    }

    #[test]
    fn throttle_settings_parse() {
        assert_eq!(parse_throttle("1:2.5"), Ok(vec![(1, 2.5)]));
        assert_eq!(parse_throttle(" 0:2 , 3:1 "), Ok(vec![(0, 2.0), (3, 1.0)]));
        assert_eq!(parse_throttle(""), Ok(vec![]));
        assert!(parse_throttle("8:2").is_err());
        assert!(parse_throttle("0:0.5").is_err());
        assert!(parse_throttle("0:inf").is_err());
        assert!(parse_throttle("2").is_err());
        assert!(parse_throttle("x:2").is_err());
    }

    #[test]
    fn a_foreign_layout_is_refused() {
        let dir = std::env::temp_dir().join(format!("simgpu-shm2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state");
        let _ = std::fs::remove_file(&path);
        let a = SharedState::open(&path, InitConfig::default()).unwrap();
        a.magic.store(7, Ordering::Relaxed);
        let err = SharedState::open(&path, InitConfig::default())
            .err()
            .unwrap();
        assert!(err.to_string().contains("delete the file"), "{err}");
        drop(a);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
