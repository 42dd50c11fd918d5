//! The raw system calls stallgen needs (fork, prctl, clocks, pipes, shared memory, fadvise),
//! wrapped so that the other modules stay almost free of `unsafe`.
/// Forks a child process that runs `body` and exits without returning to the caller. Call it
/// only while the process has a single thread: before any CUDA call and before the
/// pin-memory thread.
pub use stallscope_tests::sys::{fork_child, set_name};
use std::{
    ffi::CString,
    fs::File,
    io::{self, Read as _, Write as _},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    panic::{AssertUnwindSafe, catch_unwind},
    ptr::NonNull,
    time::Duration,
};

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The test harness's one clock: CLOCK_MONOTONIC, the clock of the ground-truth file and of
/// stallscope's recordings.
pub use simgpu_state::clock::{monotonic_ns, thread_cpu_ns};

/// Sleeps on the calling thread (off-CPU).
pub fn sleep(d: Duration) {
    std::thread::sleep(d);
}

/// How many CPUs this process may run on (its affinity mask), at least 1.
pub fn allowed_cpus() -> usize {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the caller; `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    if r < 0 {
        return std::thread::available_parallelism().map_or(1, |n| n.get());
    }
    // SAFETY: `set` was filled in by sched_getaffinity.
    (unsafe { libc::CPU_COUNT(&set) } as usize).max(1)
}

/// Starts `body` in a process that is *not* a descendant of this one: it forks twice and the
/// middle process exits, so the grandchild is adopted by init. A profiler attached to this
/// process's tree therefore does not trace it, as it would not trace another job on the
/// host. It exits when `lifeline`'s write end (kept by the caller) closes, i.e. when this
/// process dies, since a death signal would follow the middle process instead. Returns its
/// PID. Same single-thread rule as [`fork_child`].
pub fn spawn_detached(
    name: &str,
    lifeline: (OwnedFd, OwnedFd),
    body: impl FnOnce() -> io::Result<()>,
) -> io::Result<libc::pid_t> {
    let (watch, keep) = lifeline;
    let mut report = [0; 2];
    // SAFETY: `report` has room for the two descriptors.
    check(unsafe { libc::pipe(report.as_mut_ptr()) })?;
    io::stdout().flush()?;
    // SAFETY: single-threaded caller, as for fork_child.
    let middle = unsafe { libc::fork() };
    if middle < 0 {
        return Err(io::Error::last_os_error());
    }
    if middle == 0 {
        drop(keep);
        // No setsid: a new session would get its own scheduler autogroup, and the hog would
        // then share the CPUs with the job group against group, not thread against thread,
        // as another job in the same session does.
        // SAFETY: fork takes no pointers; the child is single-threaded.
        let pid = unsafe { libc::fork() };
        if pid != 0 {
            // SAFETY: writing our own pipe, then leaving without running the parent's code.
            unsafe {
                libc::write(report[1], (&raw const pid).cast(), size_of::<libc::pid_t>());
                libc::_exit(0);
            }
        }
        let watch_fd = watch.as_raw_fd();
        std::thread::spawn(move || {
            let mut b = [0u8; 1];
            // SAFETY: reading into a local buffer from a descriptor this process owns; any
            // return (EOF when the job is gone, or an error) ends the process.
            unsafe {
                libc::read(watch_fd, b.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        });
        let code = match catch_unwind(AssertUnwindSafe(|| set_name(name).and_then(|()| body()))) {
            Ok(Ok(())) => 0,
            _ => 1,
        };
        // SAFETY: as in fork_child.
        unsafe { libc::_exit(code) }
    }
    drop(watch);
    let mut pid: libc::pid_t = 0;
    // SAFETY: reading one pid_t into a local from our own pipe; reaping our own child.
    unsafe {
        libc::close(report[1]);
        libc::read(report[0], (&raw mut pid).cast(), size_of::<libc::pid_t>());
        libc::close(report[0]);
        libc::waitpid(middle, std::ptr::null_mut(), 0);
    }
    // The write end stays open for the rest of this process's life: its closing, at our
    // exit, is the detached process's signal to end.
    std::mem::forget(keep);
    if pid <= 0 {
        return Err(io::Error::other("the detached process did not start"));
    }
    Ok(pid)
}

/// Kills a child with SIGKILL and reaps it; a child that is already gone is no error.
pub fn kill_and_reap(pid: libc::pid_t) {
    // SAFETY: kill and waitpid take plain integers; `pid` is our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

/// Waits up to `timeout` for child `pid` to exit and reaps it: its exit code (128 + the signal
/// if a signal ended it), or `None` if it is still running.
pub fn wait_exit(pid: libc::pid_t, timeout: Duration) -> Option<i32> {
    let start = std::time::Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; `pid` is our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
        }
        if r < 0 {
            // Not our child (any more): nothing to wait for.
            return Some(-1);
        }
        if start.elapsed() > timeout {
            return None;
        }
        sleep(Duration::from_millis(10));
    }
}

/// Closes descriptors this process inherited but must not hold.
pub fn close_fds(fds: &[std::os::fd::RawFd]) {
    for &fd in fds {
        // SAFETY: called in a freshly forked child, where these descriptors are copies that
        // no Rust object of the child will use again (the child leaves through _exit).
        unsafe { libc::close(fd) };
    }
}

/// A pipe as (read end, write end), both close-on-exec.
pub fn pipe() -> io::Result<(File, File)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((File::from(r), File::from(w)))
}

/// A pipe whose read end a detached process watches: (read end, write end).
pub fn lifeline() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = pipe()?;
    Ok((OwnedFd::from(r), OwnedFd::from(w)))
}

/// Sends one slot index down a pipe; 4 bytes are below PIPE_BUF, so the write is atomic.
pub fn send_u32(pipe: &mut File, v: u32) -> io::Result<()> {
    pipe.write_all(&v.to_ne_bytes())
}

/// Receives one slot index; `None` when the other end has closed the pipe.
pub fn recv_u32(pipe: &mut File) -> io::Result<Option<u32>> {
    let mut b = [0u8; 4];
    match pipe.read_exact(&mut b) {
        Ok(()) => Ok(Some(u32::from_ne_bytes(b))),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Anonymous shared memory (MAP_SHARED | MAP_ANONYMOUS): mapped before fork, it is the same
/// memory in the parent and every worker, like PyTorch's shared-memory batch tensors.
pub struct SharedMem {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; the users synchronise access through pipes and atomics.
unsafe impl Send for SharedMem {}
// SAFETY: as above.
unsafe impl Sync for SharedMem {}

impl SharedMem {
    pub fn new(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping aliases nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Self { ptr, len })
    }

    /// `len` bytes of `path`, shared with every process that maps the same file (made, and
    /// grown to `len` with zeros, if need be).
    pub fn of_file(path: &std::path::Path, len: usize) -> io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        if file.metadata()?.len() < len as u64 {
            file.set_len(len as u64)?;
        }
        // SAFETY: a new mapping of a file of at least `len` bytes; the mapping keeps no
        // reference to the descriptor, which may close after.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Self { ptr, len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: ptr and len are exactly the mapping created in `new`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Drops the file's (clean) pages from the page cache, so the next read goes to the disk,
/// and turns readahead off for this descriptor, so every small read waits for its own
/// request: on a VM whose disk is cached by the host, a large readahead costs the reader more
/// CPU (copying) than waiting, and the scenario would stop being disk-bound.
pub fn evict_from_page_cache(file: &File) -> io::Result<()> {
    for advice in [libc::POSIX_FADV_DONTNEED, libc::POSIX_FADV_RANDOM] {
        // SAFETY: a valid open descriptor; offset 0 and length 0 mean the whole file.
        let err = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, advice) };
        if err != 0 {
            return Err(io::Error::from_raw_os_error(err));
        }
    }
    Ok(())
}

/// Whether `path` lives on tmpfs, where the page cache is the only copy and cannot be evicted.
pub fn is_tmpfs(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: an all-zero statfs is a valid out-buffer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` a valid out-pointer.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type == libc::TMPFS_MAGIC
}

/// The path of the shared object that holds `addr`, as the dynamic loader recorded it.
pub fn object_path(addr: *const libc::c_void) -> Option<String> {
    // SAFETY: an all-zero Dl_info is a valid out-buffer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only inspects `addr`; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader, alive while the
    // object stays loaded (we copy it at once).
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}
