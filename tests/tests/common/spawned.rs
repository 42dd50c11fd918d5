//! A child process whose stdout and stderr are captured line by line while it runs, so a
//! test can wait for a line, and which is killed if the test fails before it ends.
use std::{
    io::{BufRead as _, BufReader, Read},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Condvar, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// Lines read so far from one stream, and whether it has closed.
#[derive(Default)]
struct Stream {
    lines: Mutex<(Vec<String>, bool)>,
    changed: Condvar,
}

impl Stream {
    fn pump(self: Arc<Self>, from: impl Read + Send + 'static) -> JoinHandle<()> {
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines() {
                let Ok(line) = line else { break };
                self.lines.lock().unwrap().0.push(line);
                self.changed.notify_all();
            }
            self.lines.lock().unwrap().1 = true;
            self.changed.notify_all();
        })
    }

    /// Waits for the first line satisfying `want`; `None` at the end of the stream or after
    /// `timeout`.
    fn wait_for(&self, timeout: Duration, want: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + timeout;
        let mut guard = self.lines.lock().unwrap();
        loop {
            if let Some(l) = guard.0.iter().find(|l| want(l)) {
                return Some(l.clone());
            }
            let now = Instant::now();
            if guard.1 || now >= deadline {
                return None;
            }
            guard = self.changed.wait_timeout(guard, deadline - now).unwrap().0;
        }
    }

    fn text(&self) -> String {
        let guard = self.lines.lock().unwrap();
        guard.0.iter().map(|l| format!("{l}\n")).collect()
    }
}

/// How a [`Spawned`] process ended.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// From spawn to exit.
    pub wall: Duration,
}

impl Finished {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// A failure message's tail: everything the process said.
    pub fn describe(&self) -> String {
        format!(
            "status {}\n--- stderr ---\n{}--- stdout (first 2000 bytes) ---\n{}",
            self.status,
            self.stderr,
            self.stdout.chars().take(2000).collect::<String>()
        )
    }
}

pub struct Spawned {
    child: Option<Child>,
    pub pid: u32,
    started: Instant,
    stdout: Arc<Stream>,
    stderr: Arc<Stream>,
    pumps: Vec<JoinHandle<()>>,
}

impl Spawned {
    pub fn start(cmd: &mut Command) -> Self {
        let started = Instant::now();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let stdout = Arc::new(Stream::default());
        let stderr = Arc::new(Stream::default());
        let pumps = vec![
            Arc::clone(&stdout).pump(child.stdout.take().unwrap()),
            Arc::clone(&stderr).pump(child.stderr.take().unwrap()),
        ];
        Self {
            pid: child.id(),
            child: Some(child),
            started,
            stdout,
            stderr,
            pumps,
        }
    }

    pub fn wait_stdout(&self, timeout: Duration, want: impl Fn(&str) -> bool) -> Option<String> {
        self.stdout.wait_for(timeout, want)
    }

    pub fn wait_stderr(&self, timeout: Duration, want: impl Fn(&str) -> bool) -> Option<String> {
        self.stderr.wait_for(timeout, want)
    }

    pub fn stderr_so_far(&self) -> String {
        self.stderr.text()
    }

    /// Whether the process is still running (not exited, not a zombie awaiting us).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Waits for the exit, killing the process and failing the test after `timeout`.
    pub fn finish(mut self, timeout: Duration) -> Finished {
        let mut child = self.child.take().unwrap();
        let deadline = self.started + timeout;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} did not finish within {timeout:?}; stderr:\n{}",
                    self.pid,
                    self.stderr.text()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let wall = self.started.elapsed();
        // The streams close when the last holder of the pipes exits; a forked grandchild
        // could keep them open, so the pumps are not waited for beyond a moment.
        let pumps_done = Instant::now() + Duration::from_secs(2);
        while self.pumps.iter().any(|p| !p.is_finished()) && Instant::now() < pumps_done {
            std::thread::sleep(Duration::from_millis(5));
        }
        Finished {
            status,
            stdout: self.stdout.text(),
            stderr: self.stderr.text(),
            wall,
        }
    }

    /// Sends a signal to the process.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        let r = unsafe { libc::kill(self.pid as libc::pid_t, sig) };
        assert_eq!(
            r,
            0,
            "kill({}, {sig}): {}",
            self.pid,
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
