//! Launch mode (`record -- CMD ARGS`): the command is forked, held before exec until the
//! programs are attached, then released, so nothing it does is missed.
use std::{ffi::CString, os::fd::RawFd};

pub struct Launched {
    pub pid: u32,
    release_fd: RawFd,
}

impl Launched {
    /// Lets the child exec.
    pub fn release(&mut self) {
        if self.release_fd >= 0 {
            // SAFETY: closing our own pipe end; the child's read returns 0 and it execs.
            unsafe { libc::close(self.release_fd) };
            self.release_fd = -1;
        }
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        self.release();
    }
}

/// Forks `argv`. The child waits for `release`, drops to the invoking user when run through
/// sudo, then execs; an exec failure exits it with status 127.
pub fn spawn(argv: &[String]) -> anyhow::Result<Launched> {
    anyhow::ensure!(!argv.is_empty(), "no command given after --");
    let c_args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let mut ptrs: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let invoking = crate::sudo::invoking_user();
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe writes.
    let piped = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    anyhow::ensure!(
        piped == 0,
        "pipe2 failed: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the child only calls async-signal-safe functions (close, read, setgid,
    // setuid, execvp, _exit) on data prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        anyhow::bail!("fork failed: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            libc::close(fds[1]);
            let mut b = 0u8;
            while libc::read(fds[0], (&raw mut b).cast(), 1) < 0 {}
            if let Some((uid, gid)) = invoking {
                libc::setgid(gid);
                libc::setuid(uid);
            }
            libc::execvp(ptrs[0], ptrs.as_ptr());
            libc::_exit(127);
        }
    }
    // SAFETY: closing the parent's copy of the read end.
    unsafe { libc::close(fds[0]) };
    Ok(Launched {
        pid: pid as u32,
        release_fd: fds[1],
    })
}

impl Launched {
    /// Reaps the child; its exit code, or 128 + signal.
    pub fn wait_exit_code(mut self) -> i32 {
        self.release();
        let mut status = 0;
        // SAFETY: waiting on our own child with a valid out-pointer.
        let r = unsafe { libc::waitpid(self.pid as i32, &mut status, 0) };
        if r < 0 {
            return 0;
        }
        if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            128 + libc::WTERMSIG(status)
        }
    }
}
