//! Workload fixtures for stallscope's root-only end-to-end tests: the `stallwork` binary's
//! subcommands, each a process tree whose time split is known in advance.
pub mod args;
pub mod bench;
pub mod cpu;
pub mod cuda;
pub mod demo;
pub mod gate_runs;
pub mod glibc;
pub mod io;
pub mod reruns;
pub mod sys;

use std::io::Write as _;

use args::Command;

/// Runs one parsed subcommand to completion.
pub fn run(command: Command) -> std::io::Result<()> {
    match command {
        Command::Spin { cpu, secs } => cpu::spin(cpu, secs),
        Command::Pinned { cpu, secs } => cpu::pinned(cpu, secs),
        Command::ColdRead { file, mb, secs } => io::cold_read(&file, mb, secs),
        Command::Sleep { secs } => cpu::sleep(secs),
        Command::ForkTree { delay, secs } => cpu::fork_tree(delay, secs),
        Command::Churn {
            delay,
            threads,
            batch,
            burn,
            pause,
            secs,
        } => cpu::churn(delay, threads, batch, burn, pause, secs),
        Command::Demo { cpu, secs } => demo::demo(cpu, secs),
        Command::PingPong { cpu, secs, phases } => bench::pingpong(cpu, secs, phases),
        Command::Mix { threads, secs } => bench::mix(threads, secs),
        Command::CudaLate {
            lib,
            preload,
            delay,
            secs,
        } => cuda::cuda_late(&lib, preload.as_deref(), delay, secs),
        Command::CudaEvents { lib, per_sec, secs } => cuda::cuda_events(&lib, per_sec, secs),
    }
}

/// Tells the test harness that every thread and process of the workload exists, so that an
/// attach from now on sees the whole tree.
pub fn announce_ready() -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready pid={}", std::process::id())?;
    // Flushed at once: the harness blocks on this line, and a forked child must not inherit
    // it unflushed and print it twice.
    out.flush()
}
