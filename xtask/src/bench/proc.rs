//! Child processes for the benchmark: captured output lines, a start gate, and reaping with
//! wait4 so that each tracer's CPU time and peak RSS come from the kernel's own rusage.
use std::{
    io::{BufRead as _, BufReader, Read, Write as _},
    process::{Child, Command, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError, Sender},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Context as _;

/// How a reaped process ended and what it cost, from wait4's rusage.
#[derive(Clone, Copy, Debug)]
pub struct Exit {
    /// Raw wait status.
    pub status: i32,
    /// User plus system CPU time of the process (and any children it reaped).
    pub cpu_s: f64,
    /// Peak resident set size; Linux reports ru_maxrss in KiB.
    pub maxrss_kib: u64,
}

impl Exit {
    pub fn success(&self) -> bool {
        libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == 0
    }

    pub fn describe(&self) -> String {
        if libc::WIFEXITED(self.status) {
            format!("exit {}", libc::WEXITSTATUS(self.status))
        } else if libc::WIFSIGNALED(self.status) {
            format!("signal {}", libc::WTERMSIG(self.status))
        } else {
            format!("status {:#x}", self.status)
        }
    }
}

/// A spawned process whose stdout and stderr are read line by line on two threads. The lines
/// arrive on a channel (to wait for "ready" markers) and are also kept whole for the end.
pub struct Proc {
    child: Child,
    lines: Receiver<String>,
    readers: Vec<JoinHandle<String>>,
    exit: Option<Exit>,
}

impl Proc {
    /// Spawns `cmd` with piped stdout and stderr; stdin is whatever the caller set.
    pub fn spawn(cmd: &mut Command) -> anyhow::Result<Self> {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        let (tx, lines) = mpsc::channel();
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(reader(out, tx.clone()));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(reader(err, tx));
        }
        Ok(Self {
            child,
            lines,
            readers,
            exit: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for an output line (either stream) that satisfies `pred`. None when the process
    /// closed both streams first, or on timeout.
    pub fn wait_line(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(line) if pred(&line) => return Some(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Opens the start gate of a process started by [`gated`].
    pub fn release(&mut self) -> anyhow::Result<()> {
        let mut stdin = self.child.stdin.take().context("the process has no gate")?;
        stdin.write_all(b"go\n").context("opening the start gate")?;
        Ok(())
    }

    pub fn signal(&self, sig: libc::c_int) {
        if self.exit.is_none() {
            // SAFETY: kill has no memory effects; the PID is our unreaped child, so it cannot
            // have been reused by another process.
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        }
    }

    /// Reaps the process if it exits within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<Exit> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_reap() {
                return Some(e);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn try_reap(&mut self) -> Option<Exit> {
        if self.exit.is_some() {
            return self.exit;
        }
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are to live locals of the right types for this call.
        let r = unsafe {
            libc::wait4(
                self.child.id() as libc::pid_t,
                &mut status,
                libc::WNOHANG,
                &mut ru,
            )
        };
        if r <= 0 {
            return None;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        self.exit = Some(Exit {
            status,
            cpu_s: tv(ru.ru_utime) + tv(ru.ru_stime),
            maxrss_kib: ru.ru_maxrss.max(0) as u64,
        });
        self.exit
    }

    /// Interrupts (SIGINT) the process unless it ends by itself within `grace`, then kills it
    /// if it has not ended `patience` later. Returns its exit and everything it printed on
    /// stdout and stderr.
    pub fn stop(mut self, grace: Duration, patience: Duration) -> (Option<Exit>, String, String) {
        let mut exit = self.wait_exit(grace);
        if exit.is_none() {
            self.signal(libc::SIGINT);
            exit = self.wait_exit(patience);
        }
        if exit.is_none() {
            self.signal(libc::SIGKILL);
            self.wait_exit(Duration::from_secs(5));
        }
        let mut texts = std::mem::take(&mut self.readers)
            .into_iter()
            .map(|h| h.join().unwrap_or_default());
        let out = texts.next().unwrap_or_default();
        let err = texts.next().unwrap_or_default();
        (exit, out, err)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.try_reap().is_none() {
            self.signal(libc::SIGKILL);
            self.wait_exit(Duration::from_secs(5));
        }
    }
}

fn reader(stream: impl Read + Send + 'static, tx: Sender<String>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            all.push_str(&line);
            all.push('\n');
            // The receiver may be gone once nobody waits for lines any more.
            let _ = tx.send(line);
        }
        all
    })
}

/// A command that exists as a process (so a tracer can attach to its PID) but waits at a
/// gate until [`Proc::release`], then execs `program args` under the same PID. That way the
/// tracer is attached before the workload's first instruction and the whole run is traced.
pub fn gated(program: &std::path::Path, args: &[String]) -> Command {
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", "read gate && exec \"$@\"", "sh"])
        .arg(program)
        .args(args)
        .stdin(Stdio::piped());
    cmd
}

/// Whether `pid` holds at least one BPF link or perf-event file: the sign that a libbpf
/// tool has attached its programs.
pub fn bpf_attachments(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|t| {
            let t = t.to_string_lossy();
            t.contains("bpf_link") || t.contains("perf_event") || t.contains("bpf-raw-tracepoint")
        })
        .count()
}

/// The last few lines of a tool's output, on one line, for an error message.
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(3);
    let joined = lines[start..].join(" | ");
    if joined.is_empty() {
        "(no output)".into()
    } else {
        joined
    }
}

/// The live children of `pid`. Each thread lists the children it started, so all its
/// threads are read (the agent's recorders are its segment thread's).
pub fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}
