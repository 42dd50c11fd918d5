//! Where the ranks of one communicator meet: a small file shared by their processes, named after
//! the unique id, holding how far each rank's stream has got.
//!
//! Every counter only grows, so no lock is needed: a rank publishes that its stream reached its
//! k-th collective (or its k-th send to, or receive from, a peer), bumps `generation` and wakes
//! the waiters; a rank waits until every counter it depends on has reached k. Waits sleep on
//! `generation` (a futex in the shared mapping), so a rank waiting for a straggler costs no CPU.
//!
//! The file's name is only needed until every rank has mapped it: it is removed as soon as all
//! have joined, so ranks that are killed later leave nothing behind.
use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Most ranks a communicator may have.
pub const MAX_RANKS: usize = 64;
/// "SIMNCCL" plus the layout version.
const MAGIC: u64 = 0x5349_4d4e_4343_4c01;
/// How long a sleeping waiter waits before it checks that its peers still exist.
const POLL: Duration = Duration::from_millis(20);

#[repr(C)]
struct RankSlot {
    /// The rank's process, 0 until it joins.
    pid: AtomicU32,
    _pad: AtomicU32,
    /// Collectives this rank's stream has reached.
    arrived: AtomicU64,
}

#[repr(C)]
struct RdvFile {
    magic: AtomicU64,
    nranks: AtomicU32,
    /// Bumped on every arrival and join; waiters sleep on it.
    generation: AtomicU32,
    joined: AtomicU32,
    _pad: AtomicU32,
    ranks: [RankSlot; MAX_RANKS],
    /// `sent[from * MAX_RANKS + to]`: sends from `from` to `to` that `from`'s stream reached.
    sent: [AtomicU64; MAX_RANKS * MAX_RANKS],
    /// `recvd[to * MAX_RANKS + from]`: receives by `to` from `from` that `to`'s stream reached.
    recvd: [AtomicU64; MAX_RANKS * MAX_RANKS],
}

const FILE_BYTES: usize = std::mem::size_of::<RdvFile>();

/// One point of progress a rank publishes when its stream gets there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Its `seq`-th collective (1-based).
    Collective { seq: u64 },
    /// Its `seq`-th send to `peer`.
    Send { peer: usize, seq: u64 },
    /// Its `seq`-th receive from `peer`.
    Recv { peer: usize, seq: u64 },
}

/// A mapping of one communicator's file.
pub struct Rendezvous {
    map: NonNull<RdvFile>,
    path: PathBuf,
}

// SAFETY: the mapping is only accessed through atomics and stays mapped until drop.
unsafe impl Send for Rendezvous {}
// SAFETY: as above.
unsafe impl Sync for Rendezvous {}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        // SAFETY: `map` came from a successful mmap of FILE_BYTES; nothing borrowed outlives self.
        unsafe { libc::munmap(self.map.as_ptr().cast(), FILE_BYTES) };
    }
}

impl Rendezvous {
    /// Opens (creating it if first) the file at `path` for a communicator of `nranks`.
    pub fn open(path: &Path, nranks: usize) -> io::Result<Self> {
        if !(1..=MAX_RANKS).contains(&nranks) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{nranks} ranks is not in 1..={MAX_RANKS}"),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(path)?;
        if file.metadata()?.len() < FILE_BYTES as u64 {
            // Growing is idempotent, so ranks racing to create the file agree.
            file.set_len(FILE_BYTES as u64)?;
        }
        // SAFETY: a fresh shared mapping of a file at least FILE_BYTES long; it aliases nothing
        // else in this process.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        let rdv = Rendezvous {
            map,
            path: path.to_owned(),
        };
        let f = rdv.file();
        match f
            .magic
            .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) | Err(MAGIC) => {}
            Err(other) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not a rendezvous file ({other:#x})", path.display()),
                ));
            }
        }
        let n = nranks as u32;
        match f
            .nranks
            .compare_exchange(0, n, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {}
            Err(existing) if existing == n => {}
            Err(existing) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("the communicator has {existing} ranks, this rank says {nranks}"),
                ));
            }
        }
        Ok(rdv)
    }

    fn file(&self) -> &RdvFile {
        // SAFETY: the mapping is live, page-aligned and FILE_BYTES long; all fields are atomics,
        // for which any bit pattern is valid.
        unsafe { self.map.as_ref() }
    }

    pub fn nranks(&self) -> usize {
        self.file().nranks.load(Ordering::Acquire) as usize
    }

    /// Claims rank `rank` for process `pid`; fails if another live process holds it.
    pub fn join(&self, rank: usize, pid: u32) -> Result<(), String> {
        let slot = &self.file().ranks[rank];
        match slot
            .pid
            .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {}
            Err(holder) => return Err(format!("rank {rank} already joined (pid {holder})")),
        }
        self.file().joined.fetch_add(1, Ordering::AcqRel);
        self.wake();
        Ok(())
    }

    /// Waits until every rank has joined, up to `timeout`; then nobody needs the file's name.
    pub fn wait_all_joined(&self, timeout: Duration) -> Result<(), String> {
        let n = self.nranks() as u32;
        let deadline = Instant::now() + timeout;
        let joined = self.wait(
            || self.file().joined.load(Ordering::Acquire) >= n,
            || {
                if Instant::now() > deadline {
                    let joined = self.file().joined.load(Ordering::Acquire);
                    return Err(format!(
                        "only {joined} of {n} ranks joined within {timeout:?}"
                    ));
                }
                Ok(())
            },
        );
        if joined.is_ok() {
            // Every rank maps the file before it joins. Each removes it; all but one find it gone.
            let _ = std::fs::remove_file(&self.path);
        }
        joined
    }

    /// Publishes that the calling rank's stream reached `mark`.
    pub fn arrive(&self, rank: usize, mark: Mark) {
        let f = self.file();
        match mark {
            Mark::Collective { seq } => f.ranks[rank].arrived.fetch_max(seq, Ordering::AcqRel),
            Mark::Send { peer, seq } => {
                f.sent[rank * MAX_RANKS + peer].fetch_max(seq, Ordering::AcqRel)
            }
            Mark::Recv { peer, seq } => {
                f.recvd[rank * MAX_RANKS + peer].fetch_max(seq, Ordering::AcqRel)
            }
        };
        self.wake();
    }

    /// Whether what `mark` of `rank` waits for has happened: every rank reached the collective,
    /// or the peer reached the matching receive or send.
    pub fn ready(&self, rank: usize, mark: Mark) -> bool {
        let f = self.file();
        match mark {
            Mark::Collective { seq } => f.ranks[..self.nranks()]
                .iter()
                .all(|r| r.arrived.load(Ordering::Acquire) >= seq),
            Mark::Send { peer, seq } => {
                f.recvd[peer * MAX_RANKS + rank].load(Ordering::Acquire) >= seq
            }
            Mark::Recv { peer, seq } => {
                f.sent[peer * MAX_RANKS + rank].load(Ordering::Acquire) >= seq
            }
        }
    }

    /// Waits until all of `marks` of `rank` are ready. Fails when a rank they depend on has died
    /// (its process is gone), as NCCL reports a remote error instead of hanging forever.
    pub fn wait_ready(&self, rank: usize, marks: &[Mark]) -> Result<(), String> {
        self.wait(
            || marks.iter().all(|m| self.ready(rank, *m)),
            || {
                for m in marks {
                    let peers: Vec<usize> = match *m {
                        Mark::Collective { .. } => (0..self.nranks()).collect(),
                        Mark::Send { peer, .. } | Mark::Recv { peer, .. } => vec![peer],
                    };
                    for p in peers {
                        let pid = self.file().ranks[p].pid.load(Ordering::Acquire);
                        if pid != 0 && !alive(pid) && !self.ready(rank, *m) {
                            return Err(format!("rank {p} (pid {pid}) exited"));
                        }
                    }
                }
                Ok(())
            },
        )
    }

    /// Sleeps until `done` holds, calling `check` after each timed-out sleep.
    fn wait(
        &self,
        done: impl Fn() -> bool,
        check: impl Fn() -> Result<(), String>,
    ) -> Result<(), String> {
        let generation = &self.file().generation;
        loop {
            let seen = generation.load(Ordering::Acquire);
            if done() {
                return Ok(());
            }
            if !futex_wait(generation, seen, POLL) {
                check()?;
            }
        }
    }

    fn wake(&self) {
        let generation = &self.file().generation;
        generation.fetch_add(1, Ordering::AcqRel);
        futex_wake_all(generation);
    }
}

/// Whether process `pid` exists (EPERM: it exists but is someone else's).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; it only checks that the pid exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Sleeps while `word` holds `expected`, at most `timeout`; false when the timeout expired.
/// A shared (not process-private) futex, since the word lives in a file mapped by several
/// processes.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 at `word` (live for the call) and the timespec.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &raw const ts,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    !(rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT))
}

fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address of the aligned u32 at `word` as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("simgpu-rdv-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn a_collective_waits_for_the_last_rank() {
        let p = path("coll");
        let (a, b) = (
            Rendezvous::open(&p, 2).unwrap(),
            Rendezvous::open(&p, 2).unwrap(),
        );
        a.join(0, 1).unwrap();
        b.join(1, std::process::id()).unwrap();
        a.wait_all_joined(Duration::from_secs(1)).unwrap();
        assert!(!p.exists(), "the file goes once every rank has joined");
        b.wait_all_joined(Duration::from_secs(1)).unwrap();
        let mark = Mark::Collective { seq: 1 };
        a.arrive(0, mark);
        assert!(!a.ready(0, mark));
        let start = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                b.arrive(1, mark);
            });
            a.wait_ready(0, &[mark]).unwrap();
        });
        assert!(start.elapsed() >= Duration::from_millis(100));
        assert!(b.ready(1, mark));
    }

    #[test]
    fn sends_match_receives_pairwise() {
        let p = path("p2p");
        let a = Rendezvous::open(&p, 2).unwrap();
        let send = Mark::Send { peer: 1, seq: 1 };
        let recv = Mark::Recv { peer: 0, seq: 1 };
        a.arrive(0, send);
        assert!(!a.ready(0, send), "the receiver has not posted yet");
        assert!(a.ready(1, recv), "the sender has");
        a.arrive(1, recv);
        assert!(a.ready(0, send));
        assert!(!a.ready(0, Mark::Send { peer: 1, seq: 2 }));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_dead_peer_ends_the_wait_and_sizes_must_agree() {
        let p = path("dead");
        let a = Rendezvous::open(&p, 2).unwrap();
        assert!(Rendezvous::open(&p, 3).is_err(), "3 ranks against 2");
        a.join(0, std::process::id()).unwrap();
        // Pids above pid_max (at most 2^22) never exist.
        a.join(1, 0x7fff_fff0).unwrap();
        assert!(a.join(1, 5).is_err(), "rank 1 is taken");
        let mark = Mark::Collective { seq: 1 };
        a.arrive(0, mark);
        let err = a.wait_ready(0, &[mark]).unwrap_err();
        assert!(err.contains("rank 1"), "{err}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn joining_times_out_when_a_rank_never_comes() {
        let p = path("join");
        let a = Rendezvous::open(&p, 2).unwrap();
        a.join(0, std::process::id()).unwrap();
        assert!(a.wait_all_joined(Duration::from_millis(50)).is_err());
        std::fs::remove_file(&p).unwrap();
    }
}
