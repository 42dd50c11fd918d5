//! What one sampled off-CPU interval of a thread waited for, from what the recording says of
//! it: the stack it blocked with, the system call and its descriptor (`BlockedIn`), and who
//! woke it (`WokenBy`, with `record --wakers`). The rules read these per window to tell the
//! GIL, a lock, and work from outside the job from a wait the DataLoader explains.
//!
//! The stack speaks first: CPython's `take_gil` is the GIL whoever woke the thread, and a
//! wait inside a CUDA call is the GPU's, which the probes account for. Then the waker, when
//! the recording has one, for it names the other end exactly. Then the call: a TCP or UDP
//! socket, an epoll on nothing but such sockets, or a pipe no traced process holds is work
//! from outside; lock frames (`PyThread_acquire_lock`, `pthread_mutex_lock`, a semaphore)
//! a lock.

/// What a wait was for. `JobThread` is a traced thread's wake-up: the rules tell a DataLoader
/// worker (its batch) from another thread of the job (a lock it released) by the roles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WaitFor {
    /// The recording says nothing of it.
    #[default]
    Unsaid,
    /// Waiting to take the GIL back.
    Gil,
    /// Blocked in lock frames; who released it is not known.
    Lock,
    /// Woken by a traced thread; `lock`: blocked in lock frames or a futex.
    JobThread { tid: u32, lock: bool },
    /// Input from outside the job: a request on a socket, a pipe from an untraced process, a
    /// wake-up by the network or by a task that is not traced.
    Outside,
    /// A sleep or a timer.
    Sleep,
    /// Block IO.
    Io,
    /// Inside a CUDA or NCCL call: the GPU's wait.
    InCuda,
    /// Something else said (an interrupt, a file, a child process).
    Other,
}

/// What a stack's frames say of its wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StackWait {
    #[default]
    Nothing,
    Gil,
    InCuda,
    Lock,
}

/// Native frames that take a lock, or wait on a condition or semaphore (CPython's
/// `threading.Lock` and `Condition`, glibc's pthread and semaphore calls, Rust's std).
const LOCK_FRAMES: &[&str] = &[
    "PyThread_acquire_lock",
    "lock_PyThread_acquire_lock",
    "rlock_acquire",
    "acquire_timed",
    "pthread_mutex_lock",
    "pthread_mutex_timedlock",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "pthread_cond_clockwait",
    "pthread_rwlock_rdlock",
    "pthread_rwlock_wrlock",
    "sem_wait",
    "sem_timedwait",
    "sem_clockwait",
    "__new_sem_wait",
    "__lll_lock_wait",
    "futex::Mutex",
    "futex::Condvar",
];

/// A frame's function: without its `[k]` mark, DSO or offset.
fn function(frame: &str) -> &str {
    frame.split([' ', '+']).next().unwrap_or(frame)
}

/// A CUDA driver or runtime entry point (`cuCtxSynchronize`, `cudaStreamSynchronize`) or an
/// NCCL one.
fn is_cuda(f: &str) -> bool {
    let upper_after = |prefix: &str| {
        f.strip_prefix(prefix)
            .and_then(|rest| rest.chars().next())
            .is_some_and(|c| c.is_ascii_uppercase())
    };
    upper_after("cu") || upper_after("cuda") || upper_after("nccl")
}

/// What `frames` (root first) say the wait was.
pub fn stack_wait(frames: &[String]) -> StackWait {
    let mut found = StackWait::Nothing;
    for f in frames.iter().map(|f| function(f)) {
        if f.contains("take_gil") {
            return StackWait::Gil;
        }
        if is_cuda(f) {
            found = StackWait::InCuda;
        } else if found == StackWait::Nothing
            && LOCK_FRAMES.iter().any(|l| {
                f.trim_start_matches('_')
                    .contains(l.trim_start_matches('_'))
            })
        {
            found = StackWait::Lock;
        }
    }
    found
}

/// Who woke the thread, as the recording says (see `Record::WokenBy`), `traced` resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woken {
    /// A traced thread's own call, or a network receive it ran (a loopback send).
    JobThread(u32),
    /// A task outside the job, or the network.
    Outside,
    Timer,
    BlockIo,
    Interrupt,
}

impl Woken {
    /// From a `WokenBy` record's task and context.
    pub fn of(waker_tid: u32, context: &str, traced: impl Fn(u32) -> bool) -> Self {
        let job = waker_tid != 0 && traced(waker_tid);
        match context {
            "timer" => Woken::Timer,
            "block IO completion" => Woken::BlockIo,
            "task" | "network receive" if job => Woken::JobThread(waker_tid),
            "task" if waker_tid != 0 => Woken::Outside,
            "network receive" => Woken::Outside,
            _ => Woken::Interrupt,
        }
    }
}

/// What the blocking call says, with `traced` telling the job's processes (a pipe's other
/// end).
pub fn call_wait(kind: &str, detail: &str, traced_pid: impl Fn(u32) -> bool) -> WaitFor {
    match kind {
        "sleep" => WaitFor::Sleep,
        "socket" if is_network(detail) => WaitFor::Outside,
        "poll" if detail.starts_with("epoll on ") => {
            let watched: Vec<&str> = detail["epoll on ".len()..].split("; ").collect();
            if watched.iter().all(|w| is_network(w)) {
                WaitFor::Outside
            } else if watched.iter().any(|w| pipe_peers(w).any(&traced_pid)) {
                WaitFor::Other
            } else {
                WaitFor::Unsaid
            }
        }
        "pipe" => {
            let mut peers = pipe_peers(detail).peekable();
            if peers.peek().is_some() && !peers.any(traced_pid) {
                WaitFor::Outside
            } else {
                WaitFor::Other
            }
        }
        "futex" | "poll" => WaitFor::Unsaid,
        _ => WaitFor::Other,
    }
}

/// A TCP or UDP socket: its peer (or a listener's client) is a network address, which a
/// process of the job does not hold by the address alone.
fn is_network(detail: &str) -> bool {
    detail.starts_with("socket TCP") || detail.starts_with("socket UDP")
}

/// The PIDs a pipe's detail names at its other end (`pipe:[81] with PID 12 (python), ...`).
fn pipe_peers(detail: &str) -> impl Iterator<Item = u32> + '_ {
    detail
        .split("PID ")
        .skip(1)
        .filter_map(|s| s.split(' ').next()?.parse().ok())
}

/// The wait, from the stack, the waker (when recorded) and the call (when recorded, with
/// `futex`: whether it was one).
pub fn classify(
    stack: StackWait,
    woken: Option<Woken>,
    call: Option<WaitFor>,
    futex: bool,
) -> WaitFor {
    match stack {
        StackWait::Gil => return WaitFor::Gil,
        StackWait::InCuda => return WaitFor::InCuda,
        _ => {}
    }
    let lock = stack == StackWait::Lock;
    match woken {
        Some(Woken::JobThread(tid)) => {
            return WaitFor::JobThread {
                tid,
                lock: lock || futex,
            };
        }
        Some(Woken::Outside) => return WaitFor::Outside,
        Some(Woken::Timer) => return WaitFor::Sleep,
        Some(Woken::BlockIo) => return WaitFor::Io,
        Some(Woken::Interrupt) | None => {}
    }
    if lock {
        return WaitFor::Lock;
    }
    match (call, woken) {
        (Some(c), _) if c != WaitFor::Unsaid => c,
        (_, Some(Woken::Interrupt)) => WaitFor::Other,
        _ => WaitFor::Unsaid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(s: &str) -> Vec<String> {
        s.split(';').map(String::from).collect()
    }

    #[test]
    fn the_gil_wins_over_the_locks_it_is_built_on_and_cuda_over_locks() {
        let gil = frames(
            "_start;Gpu.synchronize (waits.py:143);_ctypes_callproc;PyEval_RestoreThread;take_gil;___pthread_cond_timedwait64;__futex_abstimed_wait_common;schedule_[k]",
        );
        assert_eq!(stack_wait(&gil), StackWait::Gil);
        let lock = frames(
            "_start;Slot.take (waits.py:281);lock_PyThread_acquire_lock;acquire_timed;PyThread_acquire_lock_timed;__new_sem_wait_slow64;schedule_[k]",
        );
        assert_eq!(stack_wait(&lock), StackWait::Lock);
        let sync = frames(
            "_start;Gpu.synchronize (waits.py:143);cuCtxSynchronize;<std::sys::sync::condvar::futex::Condvar>::wait;syscall",
        );
        assert_eq!(stack_wait(&sync), StackWait::InCuda);
        let recv = frames("_start;serve_one (waits.py:400);sock_recv;__libc_recv;schedule_[k]");
        assert_eq!(stack_wait(&recv), StackWait::Nothing);
        assert!(!is_cuda("cudnn") && !is_cuda("curl_easy_perform") && is_cuda("ncclAllReduce"));
    }

    #[test]
    fn a_socket_or_an_untraced_pipe_is_outside_and_a_workers_pipe_is_not() {
        let traced = |pid: u32| pid == 12;
        assert_eq!(
            call_wait(
                "socket",
                "socket TCP 127.0.0.1:5000 <- 127.0.0.1:40412",
                traced
            ),
            WaitFor::Outside
        );
        assert_eq!(
            call_wait("socket", "socket unix (unnamed)", traced),
            WaitFor::Other
        );
        assert_eq!(
            call_wait("pipe", "pipe:[81] with PID 40 (curl)", traced),
            WaitFor::Outside
        );
        assert_eq!(
            call_wait(
                "pipe",
                "pipe:[81] with PID 40 (curl), PID 12 (python)",
                traced
            ),
            WaitFor::Other
        );
        assert_eq!(call_wait("pipe", "pipe:[81]", traced), WaitFor::Other);
        assert_eq!(
            call_wait(
                "poll",
                "epoll on socket TCP listening on 0.0.0.0:80; socket TCP 1.2.3.4:80 <- 5.6.7.8:9",
                traced
            ),
            WaitFor::Outside
        );
        assert_eq!(
            call_wait("poll", "epoll on pipe:[9] with PID 12 (python)", traced),
            WaitFor::Other
        );
        assert_eq!(call_wait("futex", "0x7f00", traced), WaitFor::Unsaid);
        assert_eq!(call_wait("sleep", "", traced), WaitFor::Sleep);
    }

    #[test]
    fn the_waker_names_the_other_end_before_the_call_does() {
        let traced = |tid: u32| tid == 7;
        assert_eq!(Woken::of(7, "task", traced), Woken::JobThread(7));
        assert_eq!(Woken::of(9, "task", traced), Woken::Outside);
        assert_eq!(Woken::of(0, "task", traced), Woken::Interrupt);
        assert_eq!(Woken::of(7, "network receive", traced), Woken::JobThread(7));
        assert_eq!(Woken::of(9, "network receive", traced), Woken::Outside);
        assert_eq!(Woken::of(9, "timer", traced), Woken::Timer);
        let futex = Some(WaitFor::Unsaid);
        assert_eq!(
            classify(StackWait::Nothing, Some(Woken::JobThread(7)), futex, true),
            WaitFor::JobThread { tid: 7, lock: true }
        );
        assert_eq!(
            classify(StackWait::Nothing, Some(Woken::JobThread(7)), futex, false),
            WaitFor::JobThread {
                tid: 7,
                lock: false
            }
        );
        assert_eq!(
            classify(StackWait::Lock, Some(Woken::Outside), futex, true),
            WaitFor::Outside
        );
        assert_eq!(classify(StackWait::Lock, None, futex, true), WaitFor::Lock);
        assert_eq!(
            classify(StackWait::Gil, Some(Woken::Outside), None, false),
            WaitFor::Gil
        );
        assert_eq!(
            classify(StackWait::Nothing, None, Some(WaitFor::Outside), false),
            WaitFor::Outside
        );
        assert_eq!(
            classify(StackWait::Nothing, None, None, false),
            WaitFor::Unsaid
        );
        assert_eq!(
            classify(StackWait::Nothing, Some(Woken::Interrupt), futex, true),
            WaitFor::Other
        );
    }
}
