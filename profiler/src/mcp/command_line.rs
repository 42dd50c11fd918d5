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

fn run_blocking(exe: &std::path::Path, args: &[String], limit: Duration) -> anyhow::Result<Ran> {
    use std::{io::Read as _, process::Stdio};
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let (done_to, done) = std::sync::mpsc::channel::<()>();
    let pid = child.id();
    // A record that outlives its duration by far is ended as Ctrl-C would end it, so that it
    // still removes its probes.
    let watchdog = std::thread::spawn(move || {
        if done.recv_timeout(limit).is_err() {
            // SAFETY: signalling our own child, which `wait` below has not reaped yet.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
        }
    });
    let mut stdout = String::new();
    let _ = out.read_to_string(&mut stdout);
    let status = child.wait()?;
    let _ = done_to.send(());
    let _ = watchdog.join();
    let stderr = reader.join().unwrap_or_default();
    Ok(Ran {
        code: status.code().unwrap_or(-1),
        stdout,
        stderr,
    })
}
