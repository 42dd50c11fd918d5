//! CPU-bound and sleeping workloads: a lone spinner, pinned contenders, a sleeper and a tree
//! that grows processes and threads after the profiler has attached.
use std::{
    hint::black_box,
    io,
    sync::{Arc, Barrier},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::{announce_ready, sys};

/// Burns CPU until `deadline` without a single voluntary switch.
pub fn burn_until(deadline: Instant) {
    let mut x = 1u64;
    while Instant::now() < deadline {
        // Enough work between clock reads that the vDSO call is noise.
        for _ in 0..10_000 {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
    }
}

/// Starts a named thread; its name is what stallscope reports as `comm`.
pub fn spawn_named<F>(name: &str, f: F) -> io::Result<JoinHandle<io::Result<()>>>
where
    F: FnOnce() -> io::Result<()> + Send + 'static,
{
    thread::Builder::new().name(name.to_owned()).spawn(f)
}

/// Joins workload threads, turning a panic into an error.
pub fn join_all(handles: Vec<JoinHandle<io::Result<()>>>) -> io::Result<()> {
    for h in handles {
        h.join()
            .map_err(|_| io::Error::other("a workload thread panicked"))??;
    }
    Ok(())
}

/// `spin`: the main thread burns CPU, on `cpu` alone if given.
pub fn spin(cpu: Option<usize>, secs: Duration) -> io::Result<()> {
    let deadline = Instant::now() + secs;
    if let Some(cpu) = cpu {
        sys::pin_to_cpu(cpu)?;
    }
    announce_ready()?;
    burn_until(deadline);
    Ok(())
}

/// Starts two threads named `{prefix}-a` and `{prefix}-b` that pin themselves to `cpu` and
/// spin; returns once both are pinned.
pub fn spawn_contenders(
    prefix: &str,
    cpu: usize,
    deadline: Instant,
) -> io::Result<Vec<JoinHandle<io::Result<()>>>> {
    let pinned = Arc::new(Barrier::new(3));
    let mut handles = Vec::new();
    for suffix in ["a", "b"] {
        let pinned = Arc::clone(&pinned);
        handles.push(spawn_named(&format!("{prefix}-{suffix}"), move || {
            let result = sys::pin_to_cpu(cpu);
            // Wait even on failure, or the main thread would wait forever.
            pinned.wait();
            result?;
            burn_until(deadline);
            Ok(())
        })?);
    }
    pinned.wait();
    Ok(handles)
}

/// `pinned`: two threads share one CPU, so each should get about half of it and wait in the
/// run queue for the other half.
pub fn pinned(cpu: usize, secs: Duration) -> io::Result<()> {
    let deadline = Instant::now() + secs;
    let handles = spawn_contenders("pinned", cpu, deadline)?;
    announce_ready()?;
    join_all(handles)
}

/// `sleep`: the main thread naps 10 ms at a time, so it is almost always blocked.
pub fn sleep(secs: Duration) -> io::Result<()> {
    let deadline = Instant::now() + secs;
    announce_ready()?;
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// A process body that spins on two threads: its main thread and one more.
fn spinning_process(deadline: Instant) -> io::Result<()> {
    let helper = spawn_named("tree-child-t", move || {
        burn_until(deadline);
        Ok(())
    })?;
    burn_until(deadline);
    join_all(vec![helper])
}

/// `fork-tree`: ready at once, then after `delay` forks two spinning processes and starts two
/// spinning threads, so that a profiler attached in between must follow them.
pub fn fork_tree(delay: Duration, secs: Duration) -> io::Result<()> {
    let deadline = Instant::now() + secs;
    announce_ready()?;
    thread::sleep(delay);
    // Forks first, while this process still has one thread (see sys::fork_child).
    let mut children = Vec::new();
    for i in 1..=2 {
        children.push(sys::fork_child(&format!("tree-child-{i}"), move || {
            spinning_process(deadline)
        })?);
    }
    let mut handles = Vec::new();
    for name in ["tree-thread-a", "tree-thread-b"] {
        handles.push(spawn_named(name, move || {
            burn_until(deadline);
            Ok(())
        })?);
    }
    join_all(handles)?;
    children.into_iter().try_for_each(sys::wait_child)
}

/// What `churn` prints per thread: its TID and its on-CPU time by the kernel's count, read
/// by the thread itself just before it returns.
pub const CHURNED: &str = "churned";

/// `churn`: ready at once; after `delay`, runs `threads` short-lived threads, `batch` at a
/// time, each burning CPU for `burn` of wall time. A profiler that recycles per-thread state
/// must give each thread its own account. Prints one `churned tid=T on_cpu_ns=N` line per
/// thread.
pub fn churn(
    delay: Duration,
    threads: usize,
    batch: usize,
    burn: Duration,
    pause: Duration,
    secs: Duration,
) -> io::Result<()> {
    let deadline = Instant::now() + secs;
    announce_ready()?;
    thread::sleep(delay);
    let mut lines = Vec::with_capacity(threads);
    for first in (0..threads).step_by(batch.max(1)) {
        let handles: Vec<_> = (first..threads.min(first + batch.max(1)))
            .map(|i| {
                thread::Builder::new()
                    .name(format!("churn-{i}"))
                    .spawn(move || {
                        burn_until(Instant::now() + burn);
                        let on_cpu = sys::thread_on_cpu_ns()?;
                        Ok::<_, io::Error>(format!(
                            "{CHURNED} tid={} on_cpu_ns={on_cpu}",
                            sys::gettid()
                        ))
                    })
            })
            .collect::<io::Result<_>>()?;
        for h in handles {
            lines.push(
                h.join()
                    .map_err(|_| io::Error::other("a churned thread panicked"))??,
            );
        }
        thread::sleep(pause);
    }
    {
        use std::io::Write as _;
        let mut out = io::stdout().lock();
        for l in &lines {
            writeln!(out, "{l}")?;
        }
        out.flush()?;
    }
    thread::sleep(deadline.saturating_duration_since(Instant::now()));
    Ok(())
}
