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

/// `pingpong`: two threads on one CPU bounce a byte over two pipes; every round is two
/// context switches. Prints `rounds=<n> secs=<s>`.
pub fn pingpong(cpu: usize, secs: Duration) -> io::Result<()> {
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
                let start = Instant::now();
                let deadline = start + secs;
                let mut rounds = 0u64;
                let mut b = [0u8; 1];
                while Instant::now() < deadline {
                    for _ in 0..ROUNDS_PER_CHECK {
                        ping_tx.write_all(&b)?;
                        pong_rx.read_exact(&mut b)?;
                    }
                    rounds += ROUNDS_PER_CHECK;
                }
                Ok((rounds, start.elapsed()))
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
