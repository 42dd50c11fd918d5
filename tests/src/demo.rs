//! The README demo: one process tree with each kind of stall stallscope tells apart.
use std::{
    io,
    time::{Duration, Instant},
};

use crate::{announce_ready, cpu, io as cold, sys};

const DEMO_FILE_MIB: u64 = 64;

/// `demo`: a CPU-bound worker process, a worker process reading a cold file, and two threads
/// of the main process contending for `cpu`.
pub fn demo(cpu: usize, secs: Duration) -> io::Result<()> {
    let deadline = Instant::now() + secs;
    let file = std::env::temp_dir().join("stallwork-demo.dat");
    // Forks first, while this process still has one thread (see sys::fork_child).
    let cpu_worker = sys::fork_child("cpu-worker", move || {
        cpu::burn_until(deadline);
        Ok(())
    })?;
    let io_worker = sys::fork_child("io-worker", move || {
        cold::ensure_file(&file, DEMO_FILE_MIB * cold::MIB)?;
        cold::read_cold_until(&file, deadline).map(drop)
    })?;
    let contenders = cpu::spawn_contenders("contender", cpu, deadline)?;
    announce_ready()?;
    cpu::join_all(contenders)?;
    sys::wait_child(cpu_worker)?;
    sys::wait_child(io_worker)
}
