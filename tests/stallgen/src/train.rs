//! The training loop on the main thread (the feeder): take a batch, copy it to the GPU,
//! launch the step's kernels (with ranks, in DDP's shape: see `ddp`), `loss.item()`, then
//! whatever host work the phase asks for.
use std::io::Write as _;

use anyhow::Result;

use crate::{
    cuda::Gpu,
    ddp::Ddp,
    feed::Feed,
    loader::Shared,
    scenario::{Knobs, Schedule},
    sys,
    truth::Truth,
    work,
};

/// What the benchmark line reports, and where the feeder's time went (a diagnostic for
/// stderr: wall time, CLOCK_MONOTONIC ns, summed over steps).
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub steps: u64,
    /// Kernels the steps launched.
    pub launches: u64,
    /// Their durations summed: the GPU time the steps asked for (times the throttle, on a
    /// throttled GPU: what it took).
    pub kernel_ns: u64,
    pub secs: f64,
    pub wait_ns: u64,
    pub copy_ns: u64,
    pub launch_ns: u64,
    /// In `loss.item()`: with ranks, that is where a rank waits for the others.
    pub sync_ns: u64,
    pub host_ns: u64,
}

impl Summary {
    /// One line: the share of the run the feeder spent in each part of the step.
    pub fn breakdown(&self) -> String {
        let total = (self.secs * 1e9).max(1.0);
        let pct = |ns: u64| 100.0 * ns as f64 / total;
        format!(
            "feeder: wait_batch={:.1}% copy={:.1}% launch={:.1}% sync={:.1}% host={:.1}%",
            pct(self.wait_ns),
            pct(self.copy_ns),
            pct(self.launch_ns),
            pct(self.sync_ns),
            pct(self.host_ns)
        )
    }

    pub fn steps_per_sec(&self) -> f64 {
        self.per_sec(self.steps)
    }

    fn per_sec(&self, n: u64) -> f64 {
        if self.secs > 0.0 {
            n as f64 / self.secs
        } else {
            0.0
        }
    }

    /// The totals line: `steps=<n> secs=<s> steps_per_sec=<r>`, plus `launches=<n>
    /// launches_per_sec=<r>` when the launch rate is what the run measures.
    pub fn totals(&self, launches: bool) -> String {
        let mut line = format!(
            "steps={} secs={:.3} steps_per_sec={:.3}",
            self.steps,
            self.secs,
            self.steps_per_sec()
        );
        if launches {
            line += &format!(
                " launches={} launches_per_sec={:.0}",
                self.launches,
                self.per_sec(self.launches)
            );
        }
        line
    }
}

/// One step as it ended: when (CLOCK_MONOTONIC ns), and its parts' durations, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepParts {
    pub end_ns: u64,
    /// The kernel time the step asked the GPU for.
    pub kernel_ns: u64,
    pub wait_ns: u64,
    pub copy_ns: u64,
    pub launch_ns: u64,
    pub sync_ns: u64,
    pub host_ns: u64,
}

impl StepParts {
    /// The `--steps-log` line: `{"end_ns", "kernel_ns", "wait_batch_ns", "copy_ns",
    /// "launch_ns", "sync_ns", "host_ns"}`, the truth file's names for the parts.
    pub fn line(&self) -> String {
        serde_json::json!({
            "end_ns": self.end_ns,
            "kernel_ns": self.kernel_ns,
            "wait_batch_ns": self.wait_ns,
            "copy_ns": self.copy_ns,
            "launch_ns": self.launch_ns,
            "sync_ns": self.sync_ns,
            "host_ns": self.host_ns,
        })
        .to_string()
    }
}

/// Where each step's [`StepParts`] go (`--steps-log`), or nowhere.
pub struct StepsLog(Option<std::io::BufWriter<std::fs::File>>);

impl StepsLog {
    pub fn create(path: Option<&std::path::Path>) -> std::io::Result<Self> {
        path.map(std::fs::File::create)
            .transpose()
            .map(|f| Self(f.map(std::io::BufWriter::new)))
    }

    pub fn nowhere() -> Self {
        Self(None)
    }

    pub fn step(&mut self, p: &StepParts) -> std::io::Result<()> {
        match &mut self.0 {
            Some(out) => writeln!(out, "{}", p.line()),
            None => Ok(()),
        }
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.0.as_mut().map_or(Ok(()), std::io::Write::flush)
    }
}

/// One training step; adds its parts' durations to `sum` and returns them.
pub fn step(
    gpu: &Gpu,
    feed: &mut Feed,
    knobs: &Knobs,
    batch_bytes: usize,
    ddp: Option<&Ddp>,
    sum: &mut Summary,
) -> Result<StepParts> {
    let t0 = sys::monotonic_ns();
    let (held, src) = feed.next()?;
    let t1 = sys::monotonic_ns();
    // SAFETY: `src` holds batch_bytes until `feed.copied` (pageable) or `feed.synced`
    // (pinned), and the sync below comes before `synced`.
    unsafe { gpu.copy_in(src, batch_bytes)? };
    feed.copied(&held)?;
    let t2 = sys::monotonic_ns();
    let (launches, kernel_ns) = match ddp {
        None => {
            for _ in 0..knobs.kernels {
                gpu.launch_spin(knobs.kernel_ns())?;
            }
            let n = u64::from(knobs.kernels);
            (n, n * knobs.kernel_ns())
        }
        Some(d) => {
            let plan = d.plan(knobs);
            d.launch(gpu, &plan)?;
            (plan.launches(), d.busy_ns(&plan))
        }
    };
    let t3 = sys::monotonic_ns();
    match ddp {
        None => gpu.sync_item()?,
        Some(d) => d.item(gpu)?,
    };
    feed.synced(held)?;
    let t4 = sys::monotonic_ns();
    log_metrics(knobs.host_ms);
    let t5 = sys::monotonic_ns();
    sum.wait_ns += t1 - t0;
    sum.copy_ns += t2 - t1;
    sum.launch_ns += t3 - t2;
    sum.sync_ns += t4 - t3;
    sum.host_ns += t5 - t4;
    sum.steps += 1;
    sum.launches += launches;
    sum.kernel_ns += kernel_ns;
    Ok(StepParts {
        end_ns: t5,
        kernel_ns,
        wait_ns: t1 - t0,
        copy_ns: t2 - t1,
        launch_ns: t3 - t2,
        sync_ns: t4 - t3,
        host_ns: t5 - t4,
    })
}

/// The host-side work between steps of the `host-compute` scenario: in a real job, logging,
/// metrics and checkpoint bookkeeping on the main thread while the GPU has nothing queued.
#[inline(never)]
fn log_metrics(ms: f64) {
    work::burn_cpu_ms(ms);
}

impl Summary {
    /// The feeder's time in its steps other than waiting for batches.
    fn busy_ns(&self) -> u64 {
        self.copy_ns + self.launch_ns + self.sync_ns + self.host_ns
    }

    fn add(&mut self, other: &Summary) {
        self.steps += other.steps;
        self.launches += other.launches;
        self.kernel_ns += other.kernel_ns;
        self.wait_ns += other.wait_ns;
        self.copy_ns += other.copy_ns;
        self.launch_ns += other.launch_ns;
        self.sync_ns += other.sync_ns;
        self.host_ns += other.host_ns;
    }
}

/// A wait for a batch this long means the loader has no batch in hand: whatever lead it had
/// built (its workers fill every prefetch slot while the feeder starts up) is spent.
const BEHIND_NS: u64 = 1_000_000;

/// Runs steps from now until the schedule ends, calling `behind` (with the step and its wait)
/// the first time the feeder waits [`BEHIND_NS`] or more for a batch, recording each phase in `truth` as it ends,
/// with what its steps measured. With ranks, rank 0's clock ends the run for every rank
/// (see [`crate::rank::Ring::runs_step`]).
pub fn train(
    gpu: &Gpu,
    feed: &mut Feed,
    shared: &Shared,
    schedule: &Schedule,
    truth: &mut Truth,
    ddp: Option<&Ddp>,
    behind: &mut dyn FnMut(u64, u64) -> Result<()>,
) -> Result<Summary> {
    let t0 = sys::monotonic_ns();
    let mut said_behind = false;
    shared.set_t0(t0);
    let end = t0 + schedule.total_ns;
    let mut recorded = 0;
    let mut phases = vec![Summary::default(); schedule.phases.len()];
    let mut steps = 0;
    // The feeder's step without its wait for a batch, a moving average over about 8 steps,
    // for a loader that lags behind it by a share of it (`--loader-lag`).
    let mut step_ns = 0u64;
    loop {
        let now = sys::monotonic_ns();
        let goes_on = match ddp {
            Some(d) => d.ring.runs_step(steps, now >= end),
            None => now < end,
        };
        if !goes_on {
            break;
        }
        let phase = schedule.index_at(now - t0);
        while recorded < phase {
            let (s, e) = schedule.bounds_ns(recorded);
            let scenario = schedule.phases[recorded].scenario;
            truth.record(recorded, scenario, t0 + s, t0 + e, &phases[recorded])?;
            recorded += 1;
        }
        let knobs = &schedule.phases[phase].knobs;
        let waited_before = phases[phase].wait_ns;
        let busy_before = phases[phase].busy_ns();
        let parts = step(
            gpu,
            feed,
            knobs,
            shared.batch_bytes,
            ddp,
            &mut phases[phase],
        )?;
        truth.steps.step(&parts)?;
        let busy = phases[phase].busy_ns() - busy_before;
        step_ns = if step_ns == 0 {
            busy
        } else {
            (step_ns * 7 + busy) / 8
        };
        shared.set_feeder_step_ns(step_ns);
        let waited = phases[phase].wait_ns - waited_before;
        if !said_behind && waited >= BEHIND_NS {
            said_behind = true;
            behind(steps, waited)?;
        }
        steps += 1;
    }
    let stop = sys::monotonic_ns();
    truth.steps.flush()?;
    let last = schedule.phases.len() - 1;
    for (i, (phase, measured)) in schedule
        .phases
        .iter()
        .zip(&phases)
        .enumerate()
        .skip(recorded)
    {
        let (s, e) = schedule.bounds_ns(i);
        let e = if i == last { stop } else { t0 + e };
        truth.record(i, phase.scenario, t0 + s, e, measured)?;
    }
    let mut sum = Summary::default();
    for p in &phases {
        sum.add(p);
    }
    sum.secs = (stop - t0) as f64 / 1e9;
    Ok(sum)
}
