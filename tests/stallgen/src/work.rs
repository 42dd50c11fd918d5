//! What the processes do with their time: the DataLoader worker's loop, CPU work measured
//! in CPU time, and the `cpu_hog` process.
use std::{fs::File, hint::black_box, io, sync::Arc, time::Duration};

use crate::{
    dataset::Dataset,
    loader::{SEQ_BYTES, Shared},
    scenario::Schedule,
    sys,
};

/// Burns `ms` of the calling thread's CPU time. Measured in CPU time, not wall time, so the
/// work is fixed: when other threads take the CPU, it takes longer to finish.
#[inline(never)]
pub fn burn_cpu_ms(ms: f64) {
    if ms <= 0.0 {
        return;
    }
    let target = sys::thread_cpu_ns() + (ms * 1e6) as u64;
    let mut x = 1u64;
    while sys::thread_cpu_ns() < target {
        // Enough work between clock reads (a system call) that the reads are noise.
        for _ in 0..5_000 {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
    }
}

/// What a worker needs besides its pipes; inherited through fork.
pub struct WorkerEnv {
    pub shared: Arc<Shared>,
    pub schedule: Schedule,
    pub workers: usize,
    pub dataset: Option<Dataset>,
    /// `--loader-lag`: how much longer than the feeder's step each batch takes, as a
    /// fraction, whatever the host's speed.
    pub loader_lag: Option<f64>,
}

/// With `--loader-lag`: a worker's time for one batch, so that the workers together deliver
/// a batch every `(1 + lag)` feeder steps. `None` until the feeder has published its step.
fn lagged_batch(env: &WorkerEnv) -> Option<Duration> {
    let lag = env.loader_lag?;
    let step = env.shared.feeder_step_ns();
    (step > 0).then(|| {
        Duration::from_nanos((step as f64 * (1.0 + lag) * env.workers.max(1) as f64) as u64)
    })
}

/// A DataLoader worker: takes a free slot, reads samples (disk phases), transforms them
/// (CPU), collates them into the slot and reports it ready. Ends when the feeder closes the
/// pipes.
pub fn run_worker(env: &WorkerEnv, id: usize, ready: &mut File, free: &mut File) -> io::Result<()> {
    let mut cursor = id as u64 + 1;
    let mut k = 0u64;
    // What the last batch took besides its reads (transform, collate, handing it over).
    let mut rest = Duration::ZERO;
    while let Some(slot) = sys::recv_u32(free)? {
        let started = std::time::Instant::now();
        let mut knobs = env.schedule.phases[env.shared.phase_now(&env.schedule)].knobs;
        // A lagging loader spends the batch's time on its phase's cause: reading in a disk
        // phase, transforming otherwise.
        if let Some(batch) = lagged_batch(env) {
            let ms = batch.saturating_sub(rest).as_secs_f64() * 1e3;
            if knobs.disk_ms > 0.0 {
                knobs.disk_ms = ms;
            } else {
                knobs.transform_ms = ms;
            }
        }
        let seq = id as u64 + k * env.workers as u64;
        // SAFETY: the feeder handed the slot over through `free`; it is ours until we send
        // its index back.
        let batch = unsafe { env.shared.slot_mut(slot as usize) };
        let mut filled = 0;
        let mut reading = Duration::ZERO;
        if let (Some(ds), true) = (&env.dataset, knobs.disk_ms > 0.0) {
            let budget = Duration::from_secs_f64(knobs.disk_ms / 1e3);
            let t = std::time::Instant::now();
            ds.read_cold_for(budget, batch, &mut cursor)?;
            reading = t.elapsed();
            filled = batch.len().min(crate::dataset::SAMPLE_BYTES);
        }
        let t = std::time::Instant::now();
        transform(knobs.transform_ms);
        let transforming = t.elapsed();
        collate(&mut batch[filled..], seq);
        batch[..SEQ_BYTES].copy_from_slice(&seq.to_ne_bytes());
        let reads_or_transform = if knobs.disk_ms > 0.0 {
            reading
        } else {
            transforming
        };
        rest = started.elapsed().saturating_sub(reads_or_transform);
        match sys::send_u32(ready, slot) {
            Ok(()) => {}
            // The feeder is gone: the run is over.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(e),
        }
        k += 1;
    }
    Ok(())
}

/// The per-batch CPU transform (augmentation, decoding).
#[inline(never)]
fn transform(ms: f64) {
    burn_cpu_ms(ms);
}

/// Writes the batch, as collating samples into a tensor does.
#[inline(never)]
fn collate(out: &mut [u8], seq: u64) {
    out.fill(seq as u8 | 1);
}

/// The `cpu_hog` process: as many spinning threads as the current phase asks for; the
/// others sleep. It never ends on its own; the parent kills it (or dies, and so kills it).
pub fn run_hog(shared: &Shared, schedule: &Schedule) -> io::Result<()> {
    std::thread::scope(|s| {
        for j in 0..schedule.max_hog_threads() {
            let spawned = std::thread::Builder::new()
                .name("cpu_hog".to_owned())
                .spawn_scoped(s, move || hog_thread(shared, schedule, j));
            // The scope waits for the threads already started, which never end: say why
            // the hog is short of threads rather than return.
            if let Err(e) = spawned {
                eprintln!("stallgen: cpu_hog: starting thread {j}: {e}");
                break;
            }
        }
    });
    Ok(())
}

fn hog_thread(shared: &Shared, schedule: &Schedule, j: u32) {
    let mut x = 1u64;
    loop {
        let want = schedule.phases[shared.phase_now(schedule)]
            .knobs
            .hog_threads;
        if j >= want {
            sys::sleep(Duration::from_millis(10));
            continue;
        }
        // About a millisecond of spinning between looks at the phase.
        for _ in 0..500_000 {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burn_takes_cpu_time() {
        let t = sys::thread_cpu_ns();
        burn_cpu_ms(5.0);
        let used = sys::thread_cpu_ns() - t;
        assert!((5_000_000..50_000_000).contains(&used), "{used} ns");
    }
}
