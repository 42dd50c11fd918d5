//! `stallscope top`: the live screen in a real terminal (tmux, read with `capture-pane`), `q`
//! leaving nothing attached, and the one-line-a-second mode through a pipe, on stallgen's
//! dataloader scenario on the simulated GPU.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    collections::BTreeSet,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use common::{
    Scratch, find_tool, procfs, require_root, serial,
    simgpu::{Sim, dataloader_job},
    spawned::Spawned,
    stallscope::{RECORD_TIMEOUT, bin, command},
};

/// The workers' own functions, as their stacks name them.
const WORKER_FRAMES: [&str; 2] = ["run_worker", "burn_cpu_ms"];

struct Tmux {
    tmux: std::path::PathBuf,
    session: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new(&self.tmux).args(args).output().unwrap();
        assert!(out.status.success(), "tmux {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", &self.session])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new(&self.tmux)
            .args(["kill-session", "-t", &self.session])
            .output();
    }
}

/// Each thread of `pid`: its name, where it sleeps and its kernel stack, for a hang's report.
fn threads(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("PID {pid} is gone");
    };
    let mut out = String::new();
    for t in tasks.flatten() {
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
        out += &format!(
            "{} {} {} wchan={}\n{}",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            read("status")
                .lines()
                .find(|l| l.starts_with("State:"))
                .unwrap_or_default(),
            read("wchan"),
            read("stack")
        );
    }
    out
}

/// Every loaded eBPF program's ID and every link's program ID, from bpftool.
fn loaded(bpftool: &Path) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let ids = |what: &str, key: &str| -> BTreeSet<u32> {
        let out = Command::new(bpftool)
            .args(["-j", what, "list"])
            .output()
            .unwrap();
        assert!(out.status.success(), "bpftool {what} list: {out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p[key].as_u64().map(|i| i as u32))
                    .collect()
            })
            .unwrap_or_default()
    };
    (ids("prog", "id"), ids("link", "prog_id"))
}

#[test]
fn the_screen_names_the_cause_and_the_workers_function_and_q_leaves_nothing_attached() {
    require_root();
    let _serial = serial();
    let tmux = find_tool("tmux").expect("tmux is needed: `cargo xtask setup` installs it");
    let bpftool = find_tool("bpftool").expect("bpftool is needed: `cargo xtask setup` installs it");
    let sim = Sim::new("top");
    let (job, pid) = dataloader_job(&sim, 60);
    let dir = Scratch::new("top");
    let shell_pid_file = dir.join("shell.pid");
    let status_file = dir.join("top.status");
    // The shell, not tmux, waits for top and writes its status: tmux 3.3a was seen leaving the
    // exited top an unreaped zombie for a minute, its pane not marked dead.
    let exited = || {
        std::fs::read_to_string(&status_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
    };
    let t = Tmux {
        tmux,
        session: format!("stallscope-top-{}", std::process::id()),
    };
    let shell = format!(
        "echo $$ > {}; env STALLSCOPE_SIMGPU_STATE={} {} top --pid {pid} --nvml-lib {}; \
         echo $? > {}",
        shell_pid_file.display(),
        sim.state.display(),
        bin().display(),
        sim.libs.join("libnvidia-ml.so.1").display(),
        status_file.display()
    );
    t.run(&[
        "new-session",
        "-d",
        "-s",
        &t.session,
        "-x",
        "80",
        "-y",
        "24",
        "sh",
        "-c",
        &shell,
    ]);
    t.run(&["set-option", "-t", &t.session, "remain-on-exit", "on"]);
    let started = Instant::now();
    let (named, screen) = loop {
        if let Some(code) = exited() {
            panic!(
                "top exited ({code}) before naming the cause:\n{}",
                t.screen()
            );
        }
        let screen = t.screen();
        let cause = screen.contains("top cause: dataloader_cpu");
        if cause && WORKER_FRAMES.iter().any(|f| screen.contains(f)) {
            break (started.elapsed(), screen);
        }
        if started.elapsed() > Duration::from_secs(10) {
            panic!(
                "within 10 s the screen did not name dataloader_cpu and the workers' function:\n{screen}"
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    eprintln!("named in {named:?}:\n{screen}");
    for line in screen.lines() {
        assert!(
            line.chars().count() <= 80,
            "a line wider than 80 columns: {line:?}"
        );
    }
    let shell_pid = std::fs::read_to_string(&shell_pid_file).unwrap();
    let shell_pid = shell_pid.trim();
    let top_pid: u32 =
        std::fs::read_to_string(format!("/proc/{shell_pid}/task/{shell_pid}/children"))
            .unwrap()
            .trim()
            .parse()
            .expect("the shell runs top as its one child");
    let held = procfs::bpf_prog_ids_held(top_pid);
    assert!(
        !held.is_empty(),
        "top holds no eBPF program while it shows the job"
    );

    t.run(&["send-keys", "-t", &t.session, "q"]);
    let deadline = Instant::now() + RECORD_TIMEOUT;
    let code = loop {
        if let Some(code) = exited() {
            break code;
        }
        assert!(
            Instant::now() < deadline,
            "top did not quit on q:\n{}\nits threads:\n{}",
            t.screen(),
            threads(top_pid)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(code, 0, "top's exit status after q:\n{}", t.screen());
    // The kernel frees programs after a grace period once their last reference is gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (progs, links) = loaded(&bpftool);
        let progs_left: Vec<_> = held.intersection(&progs).collect();
        let links_left: Vec<_> = held.intersection(&links).collect();
        if progs_left.is_empty() && links_left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after q, programs {progs_left:?} and links to {links_left:?} are still loaded"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(job);
}

#[test]
fn without_a_terminal_it_prints_one_line_a_second_and_says_where_it_kept_them() {
    require_root();
    let _serial = serial();
    let sim = Sim::new("top-pipe");
    let (job, pid) = dataloader_job(&sim, 30);
    let dir = Scratch::new("top-pipe");
    let secs = 6;
    let f = Spawned::start(
        command()
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
            .args(["top", "--pid", &pid.to_string(), "-d", &format!("{secs}s")])
            .arg("--nvml-lib")
            .arg(sim.libs.join("libnvidia-ml.so.1"))
            .arg("-o")
            .arg(dir.join("live.rec")),
    )
    .finish(RECORD_TIMEOUT + Duration::from_secs(secs));
    assert!(f.status.success(), "top through a pipe: {}", f.describe());
    let lines: Vec<&str> = f.stdout.lines().collect();
    // One line per second recorded: the last, partial second too.
    assert!(
        (secs as usize - 1..=secs as usize + 1).contains(&lines.len()),
        "{} lines for {secs} s:\n{}",
        lines.len(),
        f.stdout
    );
    for (n, line) in lines.iter().enumerate() {
        assert!(
            line.starts_with(&format!("t={}s | gpu0 busy ", n + 1)),
            "line {n}: {line}"
        );
        assert!(
            !line.contains('\x1b'),
            "escape codes through a pipe: {line:?}"
        );
    }
    assert!(
        lines.iter().skip(1).any(
            |l| l.contains("top dataloader_cpu") && WORKER_FRAMES.iter().any(|w| l.contains(w))
        ),
        "no line names dataloader_cpu and the workers' function:\n{}",
        f.stdout
    );
    drop(job);
    // -o: a file per second shown, each a recording `report` reads, and their names said.
    let kept: Vec<_> = (1..=lines.len())
        .map(|n| dir.join(&format!("live.{n}.rec")))
        .collect();
    for file in &kept {
        assert!(file.is_file(), "{} was not kept", file.display());
    }
    let said = format!(
        "recording saved to {} … {}",
        kept[0].display(),
        kept[kept.len() - 1].display()
    );
    assert!(
        f.stderr.contains(&said),
        "top does not say where it kept the seconds ({said}):\n{}",
        f.stderr
    );
    let report = Command::new(bin())
        .args(["report", "--format", "json", "--no-flamegraphs"])
        .arg(&kept[1])
        .output()
        .unwrap();
    assert!(
        report.status.success(),
        "report of a kept second: {report:?}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    assert!(
        doc["duration_ns"].as_u64().unwrap() > 0,
        "a kept second: {doc}"
    );
}
