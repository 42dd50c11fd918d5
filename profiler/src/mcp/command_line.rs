//! Each tool runs as the stallscope command line the user could type, as this process's user:
//! the same privileges, the same checks, the same messages. A refusal (no root to record, a
//! PID the user may not trace, a file that is not there) comes back as the tool's error.
use std::{path::PathBuf, process::Command, time::Duration};

/// What one stallscope command did.
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// The command's own messages, its `stallscope: error:` line last, for a tool error.
    pub fn said(&self) -> String {
        let said = self.stderr.trim();
        if said.is_empty() {
            format!("exited with status {}", self.code)
        } else {
            said.to_string()
        }
    }
}

/// This binary, to run its subcommands.
pub struct Stallscope {
    exe: PathBuf,
}

impl Stallscope {
    pub fn this() -> anyhow::Result<Self> {
        let exe = std::env::current_exe()
            .map_err(|e| anyhow::anyhow!("cannot find this program's own path: {e}"))?;
        Ok(Self { exe })
    }

    /// Runs `stallscope ARGS`, its output kept off the server's stdout (the protocol's), and
    /// kills it past `limit`.
    pub async fn run(&self, args: Vec<String>, limit: Duration) -> anyhow::Result<Ran> {
        let exe = self.exe.clone();
        let shown = format!("stallscope {}", args.join(" "));
        tokio::task::spawn_blocking(move || run_blocking(&exe, &args, limit))
            .await
            .map_err(|e| anyhow::anyhow!("{shown}: {e}"))?
            .map_err(|e| anyhow::anyhow!("{shown}: {e:#}"))
    }
}

/// How long a command has, past its limit and a SIGINT, to end before it is killed.
const KILL_AFTER: Duration = Duration::from_secs(60);

fn run_blocking(exe: &std::path::Path, args: &[String], limit: Duration) -> anyhow::Result<Ran> {
    use std::{io::Read as _, process::Stdio};
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("piped")));
    let stderr = read(Box::new(child.stderr.take().expect("piped")));
    let started = std::time::Instant::now();
    let mut interrupted = false;
    // Polled, so that a signal only ever goes to the child while it is unreaped: its PID is
    // still its own. Past the limit it is ended as Ctrl-C would end it (a recorder still
    // removes its probes), and killed if that does not end it.
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        let ran = started.elapsed();
        if ran > limit + KILL_AFTER {
            let _ = child.kill();
            break child.wait()?;
        }
        if ran > limit && !interrupted {
            // SAFETY: a signal to our own child, not yet reaped (try_wait said so above).
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
            interrupted = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok(Ran {
        code: status.code().unwrap_or(-1),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}
