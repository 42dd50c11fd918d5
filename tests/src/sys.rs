//! The few raw system calls the workloads need (affinity, names, fork, fadvise), wrapped so
//! that the workload modules stay free of `unsafe`.
use std::{
    ffi::CString,
    fs::File,
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    os::unix::process::CommandExt as _,
    panic::{AssertUnwindSafe, catch_unwind},
    process::Command,
};

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The CPUs the calling thread may run on.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; `set` is a valid out-pointer of the size passed.
    check(unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) })?;
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Pins the calling thread (not the whole process) to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    pin_to_cpus(&[cpu])
}

/// Keeps the calling thread (and threads it starts later) on `cpus`.
pub fn pin_to_cpus(cpus: &[usize]) -> io::Result<()> {
    let set = cpu_set(cpus)?;
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size passed.
    check(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) })
}

/// Makes the program `cmd` starts run on `cpus` only, from its first instruction.
pub fn spawn_on_cpus(cmd: &mut Command, cpus: &[usize]) -> io::Result<()> {
    let set = cpu_set(cpus)?;
    // SAFETY: the hook makes one system call on a set built beforehand: async-signal-safe,
    // as code between fork and exec must be.
    unsafe {
        cmd.pre_exec(move || {
            check(libc::sched_setaffinity(
                0,
                size_of::<libc::cpu_set_t>(),
                &set,
            ))
        });
    }
    Ok(())
}

fn cpu_set(cpus: &[usize]) -> io::Result<libc::cpu_set_t> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {cpu} is out of range"),
            ));
        }
        // SAFETY: `cpu` is below CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    Ok(set)
}

/// Names the calling thread, as `ps` and stallscope's `comm` show it (at most 15 bytes).
pub fn set_name(name: &str) -> io::Result<()> {
    let short: String = name.chars().take(15).collect();
    let c = CString::new(short).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    check(unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr() as libc::c_ulong, 0, 0, 0) })
}

/// Forks a child process that runs `body` and exits without returning to the caller.
///
/// Call it only while the process has a single thread: the child gets a copy of the
/// address space with nobody to release locks held by other threads. The child is killed
/// when the parent dies, so a test that kills the workload leaves no orphans spinning.
pub fn fork_child(name: &str, body: impl FnOnce() -> io::Result<()>) -> io::Result<libc::pid_t> {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // Whatever sits in stdout's buffer would otherwise be printed once per child.
    io::Write::flush(&mut io::stdout())?;
    // SAFETY: the caller is single-threaded (see above), so the child may run ordinary code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid > 0 {
        return Ok(pid);
    }
    // SAFETY: PR_SET_PDEATHSIG takes a signal number.
    let death = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    // The parent may have died before the death signal was armed: then nobody would kill us.
    // SAFETY: getppid has no preconditions.
    let orphaned = unsafe { libc::getppid() } != parent;
    if death < 0 || orphaned {
        // SAFETY: _exit skips the parent's atexit handlers and stdio buffers, as a child must.
        unsafe { libc::_exit(1) };
    }
    let code = match catch_unwind(AssertUnwindSafe(|| set_name(name).and_then(|()| body()))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            eprintln!("{}: {name}: {e}", program_name());
            1
        }
        // The panic message is already on stderr; unwinding further would run the parent's
        // code in the child.
        Err(_) => 101,
    };
    // SAFETY: as above.
    unsafe { libc::_exit(code) }
}

/// This program's file name, for messages.
fn program_name() -> String {
    std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "child".into())
}

/// Waits for a child from [`fork_child`]; an error if it failed.
pub fn wait_child(pid: libc::pid_t) -> io::Result<()> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r >= 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "child {pid} failed (wait status {status:#x})"
        )))
    }
}

/// Drops the file's clean pages from the page cache, so the next read goes to the disk.
pub fn evict_from_page_cache(file: &File) -> io::Result<()> {
    // Dirty pages survive DONTNEED; after a sync every page is clean.
    file.sync_all()?;
    // SAFETY: a valid open descriptor; offset 0 and length 0 mean the whole file.
    let err = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if err != 0 {
        return Err(io::Error::from_raw_os_error(err));
    }
    Ok(())
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

/// The calling thread's TID.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// The calling thread's on-CPU time so far, up to now: the kernel's `task_sched_runtime`,
/// the clock of schedstat's first field, with the slice in progress included, where a
/// schedstat read lags by up to a scheduler tick.
pub fn thread_on_cpu_ns() -> io::Result<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}
