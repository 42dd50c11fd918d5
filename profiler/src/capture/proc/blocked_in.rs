//! What a blocked thread waits in, in words: the system call the kernel side read from its
//! saved registers at the switch-out, and what that call's file descriptor is (a TCP socket
//! with both addresses, a pipe and the processes holding it, a file), read from /proc while
//! the process lives. A serving loop blocked in `recvfrom` on a socket whose peer is outside
//! the job waits for work; a feeder blocked on a pipe its DataLoader workers write to waits
//! for a batch: the analysis tells these apart by what is said here.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// How long what a descriptor is stays known: a closed descriptor's number is soon reused.
const FD_TTL: Duration = Duration::from_secs(1);
/// The most processes named as a pipe's other end.
const PIPE_PEERS: usize = 3;
/// The most descriptors named of what an epoll watches.
const EPOLL_TARGETS: usize = 4;

/// A system call's name and whether its first argument is a file descriptor.
fn call(nr: u32) -> Option<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    let known: &[(u32, &str, bool)] = &[
        (0, "read", true),
        (1, "write", true),
        (7, "poll", false),
        (17, "pread64", true),
        (19, "readv", true),
        (23, "select", false),
        (24, "sched_yield", false),
        (34, "pause", false),
        (35, "nanosleep", false),
        (42, "connect", true),
        (43, "accept", true),
        (44, "sendto", true),
        (45, "recvfrom", true),
        (46, "sendmsg", true),
        (47, "recvmsg", true),
        (61, "wait4", false),
        (73, "flock", true),
        (74, "fsync", true),
        (128, "rt_sigtimedwait", false),
        (130, "rt_sigsuspend", false),
        (202, "futex", false),
        (208, "io_getevents", false),
        (230, "clock_nanosleep", false),
        (232, "epoll_wait", true),
        (247, "waitid", false),
        (257, "openat", false),
        (270, "pselect6", false),
        (271, "ppoll", false),
        (281, "epoll_pwait", true),
        (288, "accept4", true),
        (299, "recvmmsg", true),
        (426, "io_uring_enter", true),
        (441, "epoll_pwait2", true),
        (449, "futex_waitv", false),
    ];
    #[cfg(target_arch = "aarch64")]
    let known: &[(u32, &str, bool)] = &[
        (4, "io_getevents", false),
        (22, "epoll_pwait", true),
        (32, "flock", true),
        (56, "openat", false),
        (63, "read", true),
        (64, "write", true),
        (65, "readv", true),
        (67, "pread64", true),
        (72, "pselect6", false),
        (73, "ppoll", false),
        (82, "fsync", true),
        (95, "waitid", false),
        (98, "futex", false),
        (101, "nanosleep", false),
        (115, "clock_nanosleep", false),
        (124, "sched_yield", false),
        (133, "rt_sigsuspend", false),
        (137, "rt_sigtimedwait", false),
        (202, "accept", true),
        (203, "connect", true),
        (206, "sendto", true),
        (207, "recvfrom", true),
        (211, "sendmsg", true),
        (212, "recvmsg", true),
        (242, "accept4", true),
        (243, "recvmmsg", true),
        (260, "wait4", false),
        (426, "io_uring_enter", true),
        (441, "epoll_pwait2", true),
        (449, "futex_waitv", false),
    ];
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let known: &[(u32, &str, bool)] = &[];
    known
        .iter()
        .find(|(n, ..)| *n == nr)
        .map(|&(_, name, fd)| (name, fd))
}

/// Names what blocked threads wait in, remembering what each descriptor was for a while.
#[derive(Default)]
pub struct BlockedIn {
    fds: HashMap<(u32, u64), (Instant, String)>,
    pipes: HashMap<u64, (Instant, String)>,
}

impl BlockedIn {
    /// The call and what it waits on, for a thread of `pid` blocked in system call `nr`
    /// (the number itself, not plus one) with first argument `arg0`.
    pub fn describe(&mut self, pid: u32, nr: u32, arg0: u64) -> (String, String) {
        let Some((name, takes_fd)) = call(nr) else {
            return (format!("syscall {nr}"), String::new());
        };
        let detail = match name {
            _ if takes_fd => self.fd(pid, arg0),
            "futex" | "futex_waitv" => format!("{arg0:#x}"),
            "wait4" | "waitid" => format!("PID {}", arg0 as i32),
            _ => String::new(),
        };
        (name.to_owned(), detail)
    }

    fn fd(&mut self, pid: u32, fd: u64) -> String {
        let now = Instant::now();
        if let Some((at, d)) = self.fds.get(&(pid, fd))
            && now.duration_since(*at) < FD_TTL
        {
            return d.clone();
        }
        let d = self.read_fd(pid, fd, now);
        self.fds.insert((pid, fd), (now, d.clone()));
        d
    }

    fn read_fd(&mut self, pid: u32, fd: u64, now: Instant) -> String {
        let Ok(link) = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")) else {
            return format!("fd {fd}");
        };
        let link = link.to_string_lossy().into_owned();
        let inode = |prefix: &str| {
            link.strip_prefix(prefix)
                .and_then(|r| r.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok())
        };
        if let Some(ino) = inode("socket:[") {
            return socket(pid, ino).unwrap_or_else(|| format!("socket fd {fd}"));
        }
        if let Some(ino) = inode("pipe:[") {
            if let Some((at, d)) = self.pipes.get(&ino)
                && now.duration_since(*at) < FD_TTL * 10
            {
                return d.clone();
            }
            let d = pipe(pid, ino, &link);
            self.pipes.insert(ino, (now, d.clone()));
            return d;
        }
        if link == "anon_inode:[eventpoll]" {
            return self.epoll(pid, fd, now);
        }
        link
    }

    /// An epoll instance by what it watches: `epoll on socket TCP ...; pipe:[9] with ...`
    /// (its fdinfo's `tfd:` lines). A server's loop waits in one on its sockets, whose other
    /// end says whether the work comes from outside the job.
    fn epoll(&mut self, pid: u32, fd: u64, now: Instant) -> String {
        let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) else {
            return "epoll".into();
        };
        let watched: Vec<String> = info
            .lines()
            .filter_map(|l| {
                l.strip_prefix("tfd:")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .filter(|&t: &u64| t != fd)
            .take(EPOLL_TARGETS)
            .map(|t| {
                let d = self.read_fd(pid, t, now);
                // An epoll inside an epoll is named, not opened again.
                if d.starts_with("epoll") {
                    "epoll".into()
                } else {
                    d
                }
            })
            .collect();
        if watched.is_empty() {
            "epoll".into()
        } else {
            format!("epoll on {}", watched.join("; "))
        }
    }
}

/// A socket of `pid`'s network namespace by inode: `socket TCP 127.0.0.1:5000 <-
/// 127.0.0.1:40412` (local, then peer), `socket UDP ...`, `socket unix /path`.
fn socket(pid: u32, ino: u64) -> Option<String> {
    let p = procfs::process::Process::new(pid as i32).ok()?;
    let tcp = |v: procfs::ProcResult<Vec<procfs::net::TcpNetEntry>>| {
        v.ok()?.into_iter().find(|e| e.inode == ino).map(|e| {
            if e.remote_address.port() == 0 {
                format!("socket TCP listening on {}", e.local_address)
            } else {
                format!("socket TCP {} <- {}", e.local_address, e.remote_address)
            }
        })
    };
    let udp = |v: procfs::ProcResult<Vec<procfs::net::UdpNetEntry>>| {
        v.ok()?
            .into_iter()
            .find(|e| e.inode == ino)
            .map(|e| format!("socket UDP {}", e.local_address))
    };
    tcp(p.tcp())
        .or_else(|| tcp(p.tcp6()))
        .or_else(|| udp(p.udp()))
        .or_else(|| udp(p.udp6()))
        .or_else(|| {
            p.unix()
                .ok()?
                .into_iter()
                .find(|e| e.inode == ino)
                .map(|e| {
                    let path = e.path.map(|p| p.display().to_string());
                    format!("socket unix {}", path.as_deref().unwrap_or("(unnamed)"))
                })
        })
}

/// A pipe and the other processes that hold it open: `pipe:[812] with PID 4121 (python)`.
/// Each end shows the same inode, so the holders are every process but `pid` with a
/// descriptor on it (one scan of /proc, remembered per pipe).
fn pipe(pid: u32, ino: u64, link: &str) -> String {
    let mut peers = Vec::new();
    let Ok(all) = procfs::process::all_processes() else {
        return link.to_owned();
    };
    for p in all.flatten() {
        if p.pid as u32 == pid || peers.len() == PIPE_PEERS {
            continue;
        }
        let holds = p.fd().is_ok_and(|fds| {
            fds.flatten()
                .any(|f| matches!(f.target, procfs::process::FDTarget::Pipe(i) if i == ino))
        });
        if holds {
            let comm = p.stat().map(|s| s.comm).unwrap_or_default();
            peers.push(format!("PID {} ({comm})", p.pid));
        }
    }
    if peers.is_empty() {
        link.to_owned()
    } else {
        format!("{link} with {}", peers.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    fn nr_of(name: &str) -> u32 {
        (0..1000)
            .find(|&n| call(n).is_some_and(|(c, _)| c == name))
            .unwrap()
    }

    #[test]
    fn names_a_tcp_socket_by_both_addresses() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut b = BlockedIn::default();
        let pid = std::process::id();
        let fd = server.as_raw_fd() as u64;
        let (call, detail) = b.describe(pid, nr_of("recvfrom"), fd);
        assert_eq!(call, "recvfrom");
        assert_eq!(
            detail,
            format!("socket TCP {addr} <- {}", client.local_addr().unwrap())
        );
        let (_, detail) = b.describe(pid, nr_of("accept4"), listener.as_raw_fd() as u64);
        assert_eq!(detail, format!("socket TCP listening on {addr}"));
    }

    #[test]
    fn names_a_pipe_by_the_process_at_its_other_end() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let mut b = BlockedIn::default();
        let (call, detail) = b.describe(std::process::id(), nr_of("read"), out.as_raw_fd() as u64);
        let _ = child.kill();
        let _ = child.wait();
        drop(out);
        assert_eq!(call, "read");
        assert!(detail.starts_with("pipe:["), "{detail}");
        assert!(
            detail.contains(&format!("PID {} (sleep)", child.id())),
            "{detail}"
        );
    }

    #[test]
    fn names_an_epoll_by_what_it_watches() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // SAFETY: plain system calls on descriptors this test owns; each result is checked.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        // SAFETY: `ep` and the listener are open; `ev` outlives the call.
        let added =
            unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, listener.as_raw_fd(), &mut ev) };
        assert_eq!(added, 0);
        let mut b = BlockedIn::default();
        let (call, detail) = b.describe(std::process::id(), nr_of("epoll_wait"), ep as u64);
        // SAFETY: `ep` is this test's own descriptor, closed once.
        unsafe { libc::close(ep) };
        assert_eq!(call, "epoll_wait");
        assert_eq!(detail, format!("epoll on socket TCP listening on {addr}"));
    }

    #[test]
    fn other_calls_give_their_address_or_nothing() {
        let mut b = BlockedIn::default();
        assert_eq!(
            b.describe(1, nr_of("futex"), 0x7f00),
            ("futex".to_owned(), "0x7f00".to_owned())
        );
        assert_eq!(
            b.describe(1, nr_of("clock_nanosleep"), 1),
            ("clock_nanosleep".to_owned(), String::new())
        );
        assert_eq!(b.describe(1, 99_999, 0).0, "syscall 99999");
    }
}
