//! stallscope's developer commands: set-up, demo, tests and benchmarks.
mod bench;
mod setup;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the eBPF build needs (nightly rust-src, bpf-linker); idempotent.
    Setup,
    /// Set up and build the release binaries.
    Build,
    /// Build, start the bundled workload and attach stallscope to it by PID.
    Demo {
        /// How long to record.
        #[arg(long, default_value = "6s")]
        duration: String,
    },
    /// Set up, build and run every test, including the root-only eBPF tests.
    Test {
        /// Extra arguments for `cargo test` (after --).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Benchmarks: `overhead` (tracer cost against peers).
    Bench(bench::BenchArgs),
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

pub fn release_bin(name: &str) -> PathBuf {
    root().join("target/release").join(name)
}

pub fn build() -> anyhow::Result<()> {
    setup::setup()?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "profiler",
        "-p",
        "stallscope-tests",
        "-p",
        "stallgen",
        "-p",
        "simgpu-cuda",
        "-p",
        "simgpu-nvml",
    ]))
}

fn demo(duration: &str) -> anyhow::Result<()> {
    build()?;
    let mut workload = Command::new(release_bin("stallwork"))
        .args(["demo", "--secs", "60"])
        .spawn()
        .context("starting the demo workload")?;
    // Let the workload start its workers so that the attach finds a running tree.
    std::thread::sleep(std::time::Duration::from_millis(800));
    eprintln!(
        "xtask: demo workload is PID {}; attaching: stallscope record --pid {} --duration {duration}",
        workload.id(),
        workload.id()
    );
    let out_dir = root().join("stallscope-out");
    std::fs::create_dir_all(&out_dir)?;
    let result = run(Command::new(release_bin("stallscope")).args([
        "record",
        "--pid",
        &workload.id().to_string(),
        "--duration",
        duration,
        "-o",
        &out_dir.join("demo.rec").display().to_string(),
    ]));
    let _ = workload.kill();
    let _ = workload.wait();
    result
}

fn test(extra: &[String]) -> anyhow::Result<()> {
    build()?;
    // bpftool is the independent oracle for "nothing left attached".
    setup::ensure_debian(&[("bpftool", "bpftool")])?;
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--release",
        "--workspace",
        "--exclude",
        "profiler-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--release",
        "--workspace",
        "--exclude",
        "profiler-ebpf",
    ])
    .env("STALLSCOPE_BIN", release_bin("stallscope"))
    .args(extra);
    run(&mut cmd)
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Setup => setup::setup(),
        Cmd::Build => build(),
        Cmd::Demo { duration } => demo(&duration),
        Cmd::Test { args } => test(&args),
        Cmd::Bench(args) => bench::run(args),
    }
}
