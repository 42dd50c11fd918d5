//! Kernel-launch probes, switched on for a short on-period out of every period on a thread of
//! their own. Removing a uprobe waits for an RCU-tasks grace period (hundreds of
//! milliseconds on this kernel), which must not stall the session's tick.
//!
//! The perf events are opened here rather than through aya's attach, so that they can be
//! closed from this thread: a uprobe perf event and a BPF link of the loaded program to it,
//! with the entry point's index as the link's cookie, as aya itself attaches.
use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc::{Receiver, RecvTimeoutError, Sender, channel},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::capture::{
    clock::monotonic_ns,
    kernel::bpf_call::{self, bpf},
};

const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const BPF_PERF_EVENT: u32 = 41;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// `perf_event_attr` up to `config3` (PERF_ATTR_SIZE_VER8).
const ATTR_WORDS: usize = 17;

fn uprobe_pmu_type() -> std::io::Result<u32> {
    std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")?
        .trim()
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A live launch probe: the BPF link, then the perf event it links (dropped in that order).
type Probe = (OwnedFd, OwnedFd);

/// Opens a uprobe at `path`+`offset` for every process and links `prog` to it with `cookie`.
fn open_probe(
    pmu: u32,
    path: &std::ffi::CStr,
    offset: u64,
    cookie: u64,
    prog: &OwnedFd,
) -> std::io::Result<Probe> {
    let mut attr = [0u64; ATTR_WORDS];
    attr[0] = u64::from(pmu) | ((ATTR_WORDS as u64 * 8) << 32);
    // flags: disabled, so that nothing fires before the program is linked.
    attr[5] = 1;
    attr[7] = path.as_ptr() as u64;
    attr[8] = offset;
    // SAFETY: a valid perf_event_attr of the size it declares; `path` outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1 as libc::pid_t,
            0 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function owns.
    let perf = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // union bpf_attr for BPF_LINK_CREATE: prog_fd, target_fd, attach_type, flags, then
    // perf_event.bpf_cookie.
    let mut link_attr = [0u32; 16];
    link_attr[0] = prog.as_raw_fd() as u32;
    link_attr[1] = perf.as_raw_fd() as u32;
    link_attr[2] = BPF_PERF_EVENT;
    link_attr[4] = cookie as u32;
    link_attr[5] = (cookie >> 32) as u32;
    // SAFETY: a bpf_attr holding descriptors only; the kernel copies it in.
    let link = unsafe { bpf(bpf_call::LINK_CREATE, &mut link_attr) }?;
    // SAFETY: a fresh descriptor this function owns.
    let link = unsafe { OwnedFd::from_raw_fd(link as i32) };
    // SAFETY: an ioctl on a perf event fd with no argument.
    if unsafe { libc::ioctl(perf.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((link, perf))
}

/// Sets the eBPF `CONTROL` array's launch-counting switch (see `profiler_common::control`).
fn set_counting(control: &OwnedFd, on: bool) -> std::io::Result<()> {
    let key = profiler_common::control::LAUNCHES_COUNTED;
    let value = u32::from(on);
    // union bpf_attr for BPF_MAP_UPDATE_ELEM: map_fd (then padding), key, value, flags.
    let mut attr: [u64; 4] = [
        control.as_raw_fd() as u64,
        &raw const key as u64,
        &raw const value as u64,
        0,
    ];
    // SAFETY: a bpf_attr whose key and value outlive the call.
    unsafe { bpf(bpf_call::MAP_UPDATE_ELEM, &mut attr) }.map(drop)
}

enum Cmd {
    Add(PathBuf, u64, u64),
}

pub struct DutyCycle {
    tx: Option<Sender<Cmd>>,
    probed_ns: Arc<AtomicU64>,
    /// When the open on-period's uncredited time starts; 0 while off.
    on_since: Arc<AtomicU64>,
    ended: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl DutyCycle {
    /// `on` out of every `period` (all of it when `on >= period`). `control` is the eBPF
    /// `CONTROL` array, whose switch makes the launches count only while an on-period is
    /// credited.
    pub fn start(
        prog: OwnedFd,
        control: OwnedFd,
        on: Duration,
        period: Duration,
    ) -> std::io::Result<Self> {
        let pmu = uprobe_pmu_type()?;
        let (tx, rx) = channel();
        let shared = Shared {
            probed: Arc::new(AtomicU64::new(0)),
            on_since: Arc::new(AtomicU64::new(0)),
            ended: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        };
        let (probed_ns, on_since, ended) = (
            shared.probed.clone(),
            shared.on_since.clone(),
            shared.ended.clone(),
        );
        let handle = std::thread::Builder::new()
            .name("stallscope-launch".into())
            .spawn(move || run(pmu, prog, control, on, period, rx, shared))?;
        Ok(Self {
            tx: Some(tx),
            probed_ns,
            on_since,
            ended,
            handle: Some(handle),
        })
    }

    /// Probes `path`+`offset` in every on-period from now on; `cookie` names the entry point.
    pub fn add(&self, path: PathBuf, offset: u64, cookie: u64) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Cmd::Add(path, offset, cookie));
        }
    }

    /// Probe-on time not yet taken.
    pub fn take_probed_ns(&self) -> u64 {
        self.probed_ns.swap(0, Ordering::Relaxed)
    }

    /// Ends the accounting now (the probes are silenced by then) and returns the probe-on
    /// time not yet taken, without waiting for the worker, which may be closing probes.
    pub fn end(&self) -> u64 {
        self.ended.store(true, Ordering::SeqCst);
        let since = self.on_since.load(Ordering::SeqCst);
        let open = if since > 0 {
            monotonic_ns().saturating_sub(since)
        } else {
            0
        };
        self.take_probed_ns() + open
    }

    /// Ends the on-period and waits for the probes to be gone.
    pub fn stop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for DutyCycle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the worker shares with the session.
struct Shared {
    probed: Arc<AtomicU64>,
    /// When the probes were last switched on (or last credited, while on); 0 while off.
    on_since: Arc<AtomicU64>,
    /// The recording ended: no more on-periods, no more credit.
    ended: Arc<std::sync::atomic::AtomicBool>,
}

struct Worker {
    pmu: u32,
    prog: OwnedFd,
    control: OwnedFd,
    rx: Receiver<Cmd>,
    shared: Shared,
    targets: Vec<(CString, u64, u64)>,
    open: Vec<Probe>,
}

impl Worker {
    fn open_one(&mut self, i: usize) {
        let (path, offset, cookie) = &self.targets[i];
        match open_probe(self.pmu, path, *offset, *cookie, &self.prog) {
            Ok(fd) => self.open.push(fd),
            Err(e) => log::debug!("launch probe {path:?}+{offset:#x}: {e}"),
        }
    }

    fn ended(&self) -> bool {
        self.shared.ended.load(Ordering::SeqCst)
    }

    fn is_on(&self) -> bool {
        self.shared.on_since.load(Ordering::SeqCst) != 0
    }

    fn switch_on(&mut self) {
        if self.ended() {
            return;
        }
        for i in 0..self.targets.len() {
            self.open_one(i);
        }
        // Credited from here, once every probe is live: opening them takes a while.
        self.shared.on_since.store(monotonic_ns(), Ordering::SeqCst);
        self.count(true);
    }

    fn count(&self, on: bool) {
        if let Err(e) = set_counting(&self.control, on) {
            log::warn!(
                "switching the launch count {}: {e}",
                if on { "on" } else { "off" }
            );
        }
    }

    /// Credits the time on so far.
    fn account(&mut self) {
        if self.ended() {
            return;
        }
        let since = self.shared.on_since.load(Ordering::SeqCst);
        if since != 0 {
            let now = monotonic_ns();
            self.shared
                .probed
                .fetch_add(now.saturating_sub(since), Ordering::SeqCst);
            self.shared.on_since.store(now, Ordering::SeqCst);
        }
    }

    fn switch_off(&mut self) {
        // Uncredited from here: closing the probes one by one leaves the last ones live for
        // their predecessors' grace periods.
        self.count(false);
        self.account();
        self.shared.on_since.store(0, Ordering::SeqCst);
        self.open.clear();
    }

    /// Handles commands until `deadline`; false once the session hung up.
    fn wait_until(&mut self, deadline: Instant) -> bool {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            match self.rx.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(cmd) => self.handle(cmd),
                Err(RecvTimeoutError::Disconnected) => return false,
                Err(RecvTimeoutError::Timeout) => self.account(),
            }
        }
    }

    /// Waits for the next command and handles it; false once the session hung up.
    fn wait_for_command(&mut self) -> bool {
        match self.rx.recv() {
            Ok(cmd) => {
                self.handle(cmd);
                true
            }
            Err(_) => false,
        }
    }

    fn handle(&mut self, cmd: Cmd) {
        let Cmd::Add(path, offset, cookie) = cmd;
        use std::os::unix::ffi::OsStrExt;
        if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
            self.targets.push((c, offset, cookie));
            if self.is_on() {
                self.open_one(self.targets.len() - 1);
            }
        }
    }
}

fn run(
    pmu: u32,
    prog: OwnedFd,
    control: OwnedFd,
    on: Duration,
    period: Duration,
    rx: Receiver<Cmd>,
    shared: Shared,
) {
    let mut w = Worker {
        pmu,
        prog,
        control,
        rx,
        shared,
        targets: Vec::new(),
        open: Vec::new(),
    };
    let mut cycle = Instant::now();
    loop {
        if w.targets.is_empty() {
            // Nothing to probe yet: the first on-period starts as soon as a library comes.
            // Asleep until then, not polling: a job without CUDA never has one, and a wake-up
            // every few milliseconds lands on the job's CPUs.
            if !w.wait_for_command() {
                break;
            }
            cycle = Instant::now();
            continue;
        }
        if w.ended() {
            // Wait for the session to hang up, then close what is open.
            while w.wait_until(Instant::now() + Duration::from_secs(1)) {}
            break;
        }
        if !w.targets.is_empty() {
            w.switch_on();
        }
        if on >= period {
            // Always on: an on-period per period would pay a grace period for nothing.
            while w.wait_until(Instant::now() + period) {
                if !w.is_on() && !w.targets.is_empty() {
                    w.switch_on();
                }
            }
            break;
        }
        // The on-period is credited from when every probe is open (opening takes a while on a
        // real library), and lasts `on` from there.
        let live = w.wait_until(Instant::now() + on);
        w.switch_off();
        if !live || !w.wait_until(cycle + period) {
            break;
        }
        cycle += period;
        // Behind after a slow close: start the next on-period from now.
        if cycle + period < Instant::now() {
            cycle = Instant::now();
        }
    }
    w.switch_off();
}
