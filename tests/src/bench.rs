//! Benchmark workloads that switch a lot: a pipe ping-pong and a realistic mix. Each prints
//! its throughput, so the profiler's overhead shows as a drop in it.
use std::{
    fs::{File, OpenOptions},
    io::{self, Read as _, Write as _},
    os::unix::fs::FileExt as _,
    sync::{Arc, Barrier},
    thread,
    time::{Duration, Instant},
};

use crate::{announce_ready, cpu, sys};

/// Rounds between clock reads in the ping-pong: a clock read per round would be measurable.
const ROUNDS_PER_CHECK: u64 = 256;

/// A quiet ping-pong's pinger computes for this, then sleeps for [`QUIET_NAP`], checking
/// for its go file between: a few switches a second, with time on a CPU to account.
const QUIET_BURST: Duration = Duration::from_millis(30);
const QUIET_NAP: Duration = Duration::from_millis(20);

/// Quiet bursts and naps until `until`, or until `go` exists if given.
fn quiet(until: Instant, go: Option<&std::path::Path>) {
    while Instant::now() < until && !go.is_some_and(|g| g.exists()) {
        cpu::burn_until(Instant::now() + QUIET_BURST);
        thread::sleep(QUIET_NAP);
    }
}

/// `pingpong`: two threads on one CPU bounce a byte over two pipes; every round is two
/// context switches. Prints `rounds=<n> secs=<s>`. With `phases` (a go file and a busy
/// time), the threads stay quiet (the pinger computes in bursts between naps, the ponger
/// blocks) until the file exists, bounce for the busy time, and stay quiet again until
/// `secs` from the start: a job that turns busy, then idle, while it is traced.
pub fn pingpong(
    cpu: usize,
    secs: Duration,
    phases: Option<(std::path::PathBuf, Duration)>,
) -> io::Result<()> {
    let (mut ping_rx, mut ping_tx) = sys::pipe()?;
    let (mut pong_rx, mut pong_tx) = sys::pipe()?;
    let pinned = Arc::new(Barrier::new(3));
    let ponger = {
        let pinned = Arc::clone(&pinned);
        cpu::spawn_named("pong", move || {
            let result = sys::pin_to_cpu(cpu);
            pinned.wait();
            result?;
            let mut b = [0u8; 1];
            // Ends when the pinger drops its write end.
            while ping_rx.read(&mut b)? == 1 {
                pong_tx.write_all(&b)?;
            }
            Ok(())
        })?
    };
    let pinger = {
        let pinned = Arc::clone(&pinned);
        thread::Builder::new().name("ping".to_owned()).spawn(
            move || -> io::Result<(u64, Duration)> {
                let result = sys::pin_to_cpu(cpu);
                pinned.wait();
                result?;
                let mut start = Instant::now();
                let end = start + secs;
                let mut deadline = end;
                if let Some((go, busy)) = &phases {
                    quiet(end, Some(go));
                    start = Instant::now();
                    deadline = (start + *busy).min(end);
                }
                let mut rounds = 0u64;
                let mut b = [0u8; 1];
                while Instant::now() < deadline {
                    for _ in 0..ROUNDS_PER_CHECK {
                        ping_tx.write_all(&b)?;
                        pong_rx.read_exact(&mut b)?;
                    }
                    rounds += ROUNDS_PER_CHECK;
                }
                let elapsed = start.elapsed();
                if phases.is_some() {
                    quiet(end, None);
                }
                Ok((rounds, elapsed))
            },
        )?
    };
    pinned.wait();
    announce_ready()?;
    let (rounds, elapsed) = pinger
        .join()
        .map_err(|_| io::Error::other("the ping thread panicked"))??;
    cpu::join_all(vec![ponger])?;
    println!("rounds={rounds} secs={:.6}", elapsed.as_secs_f64());
    Ok(())
}

/// How long each mix thread computes, naps, and how much it reads and writes per operation.
const BURST: Duration = Duration::from_micros(50);
const NAP: Duration = Duration::from_micros(50);
const IO_BYTES: usize = 4096;
/// Each thread cycles over this many blocks of its own file.
const IO_BLOCKS: u64 = 256;

/// One mix thread: burst, nap, small write, small read; returns the operations done.
fn mix_thread(file: File, deadline: Instant) -> io::Result<u64> {
    let mut block = vec![0x5au8; IO_BYTES];
    let mut ops = 0u64;
    while Instant::now() < deadline {
        cpu::burn_until(Instant::now() + BURST);
        thread::sleep(NAP);
        let offset = (ops % IO_BLOCKS) * IO_BYTES as u64;
        file.write_all_at(&block, offset)?;
        file.read_exact_at(&mut block, offset)?;
        ops += 1;
    }
    Ok(ops)
}

/// `mix`: `threads` threads of short CPU bursts, naps and small file IO, a few tens of
/// thousands of switches a second in all. Prints `ops=<n> secs=<s>`.
pub fn mix(threads: usize, secs: Duration) -> io::Result<()> {
    let start = Instant::now();
    let deadline = start + secs;
    let dir = std::env::temp_dir();
    let mut paths = Vec::new();
    let mut handles = Vec::new();
    for i in 0..threads {
        let path = dir.join(format!("stallwork-mix-{}-{i}.dat", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        // Written once up front so every read finds data.
        file.set_len(IO_BLOCKS * IO_BYTES as u64)?;
        paths.push(path);
        handles.push(
            thread::Builder::new()
                .name(format!("mix-{i}"))
                .spawn(move || mix_thread(file, deadline))?,
        );
    }
    announce_ready()?;
    let mut ops = 0u64;
    let mut failure = None;
    for h in handles {
        match h.join() {
            Ok(Ok(n)) => ops += n,
            Ok(Err(e)) => failure = Some(e),
            Err(_) => failure = Some(io::Error::other("a mix thread panicked")),
        }
    }
    for p in &paths {
        // Best effort: a leftover scratch file in the temp directory is harmless.
        let _ = std::fs::remove_file(p);
    }
    if let Some(e) = failure {
        return Err(e);
    }
    println!("ops={ops} secs={:.6}", start.elapsed().as_secs_f64());
    Ok(())
}
