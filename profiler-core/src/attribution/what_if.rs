//! What if a cause were fixed: the step time with its part of each step removed, as a
//! critical-path estimate over the feeder's step, not a subtraction of its time.
//!
//! A step is the feeder's loop: wait for a batch, copy it, do its host work and launch the
//! kernels, wait in a sync for what the GPU has left, wait for collectives ([`StepSplit`]).
//! The kernels run while the feeder does its host work after launching them, so host work
//! hides kernel time and the sync waits only for the rest. Removing a part therefore exposes
//! whatever it hid:
//! - an input cause (`dataloader_cpu`, `disk`, `cpu_contention`): its share of the loader's
//!   time goes (a worker that both reads and decodes gives each its part, by the time each
//!   took from the GPU), so the loader makes a batch every `step × (1 − share)`, and the
//!   feeder waits only for what that leaves beyond the rest of its step;
//! - `host_compute`, `launch_overhead`: the feeder's host work goes;
//! - `pinned_memory_copy`: the batch's bytes move at the link's pace (no CPU staging);
//! - `pcie`: the copy runs at the link's full width and generation;
//! - `nccl_wait`: no wait for a straggler (fixing the straggler itself);
//! - `gpu_throttled`: the step's kernels run at the clock the GPU ran at unslowed (see
//!   [`super::throttle`]), so its feeder's waits for them shrink; a rank so fixed then waits
//!   for the other ranks as long as their own steps take ([`bound_by_other_ranks`]). It is
//!   given for a throttled GPU whatever time its windows lost, since a throttled GPU is busy,
//!   not idle: what it costs is the kernels' length.
//!
//! Whatever is removed, the step's kernels (the GPU's busy time per step) still run, and the
//! feeder waits for whatever part of them its remaining host work does not hide: without its
//! host work, a feeder that launched 100 ms of kernels waits 100 ms in its sync.
//!
//! "Fixed" means the cause's cost is gone, the upper bound of what a change can give; the
//! advice's own numbers (how many workers a host's free CPUs allow) are bounded further. The
//! interval is a bootstrap over the steps (the ratio of mean step times, resampled). `unknown`
//! gets no estimate.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Cause;
use super::steps::{StepParts, StepSplit};

/// The least share of a GPU's observed time a cause must have lost to get an estimate.
pub const MIN_SHARE: f64 = 0.02;
/// Bootstrap resamples for the interval.
const RESAMPLES: usize = 400;

/// One cause's estimate. Field names are part of the JSON report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhatIf {
    pub cause: Cause,
    /// The mean step now, ms.
    pub step_ms_now: f64,
    /// The mean step with the cause fixed, ms.
    pub step_ms_if_fixed: f64,
    /// `step_ms_now / step_ms_if_fixed`: how much faster the job would train.
    pub speedup: f64,
    /// A 90% interval of the speedup, from the steps' variance.
    pub speedup_low: f64,
    pub speedup_high: f64,
    /// What the fixed step would wait on most: a cause's name, or `gpu` (the kernels
    /// themselves: the GPU is the limit).
    pub limited_next_by: String,
}

impl WhatIf {
    /// `fixing dataloader_cpu: 212 ms → 131 ms per step (1.6×, 1.5–1.7×); host_compute
    /// limits next`.
    pub fn describe(&self) -> String {
        format!(
            "fixing {}: {} ms → {} ms per step ({:.1}×, {:.1}–{:.1}×); {} limits next",
            self.cause.name(),
            short_ms(self.step_ms_now),
            short_ms(self.step_ms_if_fixed),
            self.speedup,
            self.speedup_low,
            self.speedup_high,
            self.limited_next_by
        )
    }
}

fn short_ms(ms: f64) -> String {
    if ms >= 10.0 {
        format!("{ms:.0}")
    } else {
        format!("{ms:.1}")
    }
}

/// What the GPU and its link do, per step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pace {
    /// The GPU's busy time (not waiting in a collective) per step, ns.
    pub kernel_ns: f64,
    /// The link now and at its best, GB/s (bytes per ns).
    pub link_gbps: f64,
    pub max_link_gbps: f64,
    /// How the DataLoader's workers spent the steps: on a CPU, waiting for one, waiting on
    /// IO (ns, summed over the workers); `None` without workers.
    pub workers: Option<[f64; 3]>,
    /// The DataLoader's worker processes that did any work: how many batches it makes side
    /// by side.
    pub loaders: usize,
    /// How fast one host CPU copies memory, GB/s (bytes per ns), when the recording says.
    pub host_copy_gbps: Option<f64>,
    /// A throttled GPU's kernel time at its unslowed clock, per unit of its time now
    /// ([`super::throttle::SlowClock::kernel_scale`]); `None` when it was not throttled.
    pub kernel_scale: Option<f64>,
}

impl Pace {
    /// The GPU's busy time per step with `cause` fixed: shorter only for a throttled GPU's.
    fn kernel_ns_fixed(&self, cause: Cause) -> f64 {
        match (cause, self.kernel_scale) {
            (Cause::GpuThrottled, Some(scale)) => self.kernel_ns * scale,
            _ => self.kernel_ns,
        }
    }
}

/// The step's parts with `cause` fixed, or `None` for a cause without a model.
fn fixed(cause: Cause, p: &StepParts, pace: &Pace, loader_share: f64) -> Option<StepSplit> {
    let mut s = p.split;
    match cause {
        Cause::DataloaderCpu | Cause::Disk | Cause::CpuContention => {
            // The loader makes a batch every step (the feeder waits for it): without the
            // cause's share of that time it makes one every `step × (1 − share)`, and the
            // feeder waits only for what that leaves beyond the rest of its step.
            let by_share = (s.input_wait - loader_share * s.total()).max(0.0);
            let rest = s.total() - s.input_wait;
            s.input_wait = match loader_period(cause, p, pace) {
                // Workers that also sat idle (blocked on a queue, a lock) made a batch a
                // step only because they had to wait: fixed, they make one as fast as their
                // work allows.
                Some(period) => by_share.min((period - rest).max(0.0)),
                None => by_share,
            };
            if cause != Cause::Disk {
                // The CPUs the workers (or the other work) kept busy are the ones the feeder
                // waited for too, preempted or woken and not run: fixed, its own work runs
                // when it is ready. Its waits for a CPU are taken to fall on its host work
                // as on the rest of the time it wanted a CPU.
                let [on_cpu, runqueue] = p.feeder;
                if on_cpu + runqueue > 0.0 {
                    s.host *= on_cpu / (on_cpu + runqueue);
                }
            }
        }
        Cause::HostCompute | Cause::LaunchOverhead => s.host = 0.0,
        Cause::PinnedMemoryCopy => {
            s.copy = s.copy.min(p.copy_bytes / pace.link_gbps.max(1e-3));
        }
        Cause::Pcie => {
            if pace.max_link_gbps > pace.link_gbps && pace.link_gbps > 0.0 {
                s.copy *= pace.link_gbps / pace.max_link_gbps;
            }
        }
        Cause::NcclWait => s.collective = 0.0,
        Cause::GpuThrottled => {
            // The feeder's waits for its kernels (in its sync first, then in a collective
            // holding them) shrink by what the kernels would take less beyond its host work.
            let scale = pace.kernel_scale?;
            let unhidden = |kernel: f64| (kernel - s.host).max(0.0);
            let mut less = unhidden(pace.kernel_ns) - unhidden(pace.kernel_ns * scale);
            let from_sync = less.min(s.gpu);
            s.gpu -= from_sync;
            less -= from_sync;
            s.collective -= less.min(s.collective);
        }
        Cause::GilContention => s.input_wait *= 1.0 - p.waits.gil.clamp(0.0, 1.0),
        Cause::LockWait => s.input_wait *= 1.0 - p.lock_share().clamp(0.0, 1.0),
        // Work that does not come is not the host's to fix.
        Cause::NoWork | Cause::Unknown => return None,
    }
    // The kernels still run: the feeder waits (in a sync or a collective) for at least what
    // its host work does not hide. A wait counted as a copy's or a collective's holds the
    // kernels queued behind it, so a fix that shortens it leaves them to wait for.
    let kernel_ns = pace.kernel_ns_fixed(cause);
    let unhidden = (kernel_ns - s.host).max(0.0);
    let waits = s.gpu + s.collective;
    if waits < unhidden {
        s.gpu += unhidden - waits;
    }
    if cause == Cause::PinnedMemoryCopy {
        // Pinned, the batch is still copied by the CPU once, into pinned memory, by the
        // pin-memory thread beside the loop (and the GPU): a step cannot be shorter than
        // that copy, which the loop then waits for as its input. It is a plain copy on one
        // CPU, far faster than the driver's staging of a pageable one; a recording that did
        // not measure the CPU's rate has only the staging's time to go by.
        let pinning = pace
            .host_copy_gbps
            .filter(|g| *g > 0.0)
            .map_or(p.staged_ns, |g| p.copy_bytes / g);
        let short = pinning - s.total();
        if short > 0.0 {
            s.input_wait += short;
        }
    }
    Some(s)
}

/// The cause a fixed step would wait on most, among those that lost time (`lost`), by the
/// part of the step it takes. A collective's wait holds the step's own kernels first: only
/// what is beyond them waits for other ranks.
fn next_limit(s: &StepSplit, pace: &Pace, lost: &BTreeMap<Cause, u64>, fixed: Cause) -> String {
    let kernel_ns = pace.kernel_ns_fixed(fixed);
    let own = (kernel_ns - s.host - s.gpu).clamp(0.0, s.collective);
    let still = |causes: &[Cause]| {
        causes
            .iter()
            .filter(|c| **c != fixed)
            .max_by_key(|c| lost.get(c).copied().unwrap_or(0))
            .filter(|c| lost.get(c).is_some_and(|ns| *ns > 0))
            .map(|c| c.name().to_owned())
    };
    let input = [
        Cause::DataloaderCpu,
        Cause::Disk,
        Cause::CpuContention,
        Cause::GilContention,
        Cause::LockWait,
        Cause::NoWork,
    ];
    let parts = [
        (
            s.input_wait,
            still(&input).unwrap_or_else(|| "input".into()),
        ),
        (
            s.copy,
            still(&[Cause::PinnedMemoryCopy, Cause::Pcie]).unwrap_or_else(|| "copy".into()),
        ),
        (
            s.host,
            still(&[Cause::HostCompute, Cause::LaunchOverhead])
                .unwrap_or_else(|| "host_compute".into()),
        ),
        (s.gpu + own, "gpu".into()),
        (s.collective - own, "nccl_wait".into()),
    ];
    parts
        .into_iter()
        .fold((f64::MIN, String::new()), |best, p| {
            if p.0 > best.0 { p } else { best }
        })
        .1
}

/// The causes a DataLoader's batches wait on: a worker that both reads and computes spends
/// its time between them.
const LOADER_CAUSES: [Cause; 3] = [Cause::DataloaderCpu, Cause::Disk, Cause::CpuContention];

/// An input cause's share of the loader's time: the workers' share of their busy time in the
/// state the cause is about (on a CPU: `dataloader_cpu`; waiting for one: `cpu_contention`;
/// on IO: `disk`), else its share of the time the input causes took from the GPU; 0 for other
/// causes.
fn loader_share(cause: Cause, lost: &BTreeMap<Cause, u64>, workers: Option<[f64; 3]>) -> f64 {
    if !LOADER_CAUSES.contains(&cause) {
        return 0.0;
    }
    if let Some([on_cpu, runqueue, io]) = workers.filter(|w| w.iter().sum::<f64>() > 0.0) {
        let part = match cause {
            Cause::DataloaderCpu => on_cpu,
            Cause::CpuContention => runqueue,
            _ => io,
        };
        return part / (on_cpu + runqueue + io);
    }
    let all: u64 = LOADER_CAUSES.iter().filter_map(|c| lost.get(c)).sum();
    lost.get(&cause)
        .map_or(0.0, |ns| *ns as f64 / all.max(1) as f64)
}

/// How often the loader would make a batch with `cause` fixed, ns, from the workers' time
/// around step `p` (one batch's worth): they work side by side, so each batch takes what is
/// left of their time per step over their number; `None` where the workers' time around the
/// step is unknown.
fn loader_period(cause: Cause, p: &StepParts, pace: &Pace) -> Option<f64> {
    let [on_cpu, runqueue, io] = p.workers;
    let busy = on_cpu + runqueue + io;
    if pace.loaders == 0 || busy <= 0.0 {
        return None;
    }
    let part = match cause {
        Cause::DataloaderCpu => on_cpu,
        Cause::CpuContention => runqueue,
        _ => io,
    };
    Some((busy - part) / pace.loaders as f64)
}

/// The workers' states around step `p`, else over all the steps (a recording whose ticks
/// missed the workers there).
fn workers_of(p: &StepParts, pace: &Pace) -> Option<[f64; 3]> {
    Some(p.workers)
        .filter(|w| w.iter().sum::<f64>() > 0.0)
        .or(pace.workers)
}

/// Each step's parts with `cause` fixed, or `None` for a cause without a model. An input
/// cause's share of the loader's time is each step's own (the workers' states around it), so
/// a job whose loader decodes for a while and reads for a while after gives each phase its
/// cause.
pub fn fixed_steps(
    cause: Cause,
    parts: &[StepParts],
    pace: &Pace,
    lost: &BTreeMap<Cause, u64>,
) -> Option<Vec<StepSplit>> {
    parts
        .iter()
        .map(|p| {
            fixed(
                cause,
                p,
                pace,
                loader_share(cause, lost, workers_of(p, pace)),
            )
        })
        .collect()
}

/// A small deterministic generator: the same steps give the same interval.
struct SplitMix(u64);

impl SplitMix {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z % n as u64) as usize
    }
}

fn round3(v: f64) -> f64 {
    (v * 1e3).round() / 1e3
}

/// The estimate for each cause that lost at least [`MIN_SHARE`] of `observed_ns`, largest
/// speedup first. `parts` are the steps' (see [`super::steps::Found::parts`]).
pub fn estimate(
    parts: &[StepParts],
    pace: &Pace,
    lost: &BTreeMap<Cause, u64>,
    observed_ns: u64,
) -> Vec<WhatIf> {
    if parts.is_empty() || observed_ns == 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let throttled = pace.kernel_scale.map(|_| Cause::GpuThrottled);
    let large = lost
        .iter()
        .filter(|(_, ns)| **ns as f64 >= MIN_SHARE * observed_ns as f64)
        .map(|(c, _)| *c);
    for cause in large.chain(throttled) {
        let Some(fixed_steps) = fixed_steps(cause, parts, pace, lost) else {
            continue;
        };
        let now: Vec<f64> = parts.iter().map(|p| p.split.total()).collect();
        let after: Vec<f64> = fixed_steps.iter().map(StepSplit::total).collect();
        let (now_sum, after_sum) = (now.iter().sum::<f64>(), after.iter().sum::<f64>());
        if after_sum <= 0.0 {
            continue;
        }
        let n = parts.len();
        let mut rng = SplitMix(n as u64 ^ (cause as u64).rotate_left(32));
        let mut ratios: Vec<f64> = (0..RESAMPLES)
            .map(|_| {
                let (mut a, mut b) = (0.0, 0.0);
                for _ in 0..n {
                    let i = rng.below(n);
                    a += now[i];
                    b += after[i];
                }
                if b > 0.0 { a / b } else { f64::INFINITY }
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        let at = |q: f64| ratios[((RESAMPLES - 1) as f64 * q).round() as usize];
        let k = 1.0 / n as f64;
        let mean_fixed = fixed_steps
            .iter()
            .fold(StepSplit::default(), |s, p| StepSplit {
                input_wait: s.input_wait + p.input_wait * k,
                copy: s.copy + p.copy * k,
                host: s.host + p.host * k,
                gpu: s.gpu + p.gpu * k,
                collective: s.collective + p.collective * k,
            });
        out.push(WhatIf {
            cause,
            step_ms_now: round3(now_sum / n as f64 / 1e6),
            step_ms_if_fixed: round3(after_sum / n as f64 / 1e6),
            speedup: round3(now_sum / after_sum),
            speedup_low: round3(at(0.05)),
            speedup_high: round3(at(0.95)),
            limited_next_by: next_limit(&mean_fixed, pace, lost, cause),
        });
    }
    out.sort_by(|x, y| y.speedup.total_cmp(&x.speedup));
    out
}

/// A rank is as fast as the slowest: a throttled rank's fixed step is at least each other
/// rank's step with its wait for the straggler gone (its `nccl_wait` estimate, else its step
/// now), and the rank so fixed waits in collectives for them. GPUs whose feeders never wait in
/// a collective are separate jobs and bound nothing.
pub fn bound_by_other_ranks(gpus: &mut [super::GpuAttribution]) {
    let ranks: Vec<(u32, f64)> = gpus
        .iter()
        .filter(|g| g.step_parts.iter().any(|p| p.split.collective > 0.0))
        .map(|g| {
            let n = g.step_parts.len() as f64;
            let now = g.step_parts.iter().map(|p| p.split.total()).sum::<f64>() / n / 1e6;
            let unwaited = g
                .what_if
                .iter()
                .find(|w| w.cause == Cause::NcclWait)
                .map_or(now, |w| w.step_ms_if_fixed);
            (g.gpu, unwaited)
        })
        .collect();
    for g in gpus.iter_mut() {
        if !ranks.iter().any(|(i, _)| *i == g.gpu) {
            continue;
        }
        let Some(floor) = ranks
            .iter()
            .filter(|(i, _)| *i != g.gpu)
            .map(|(_, ms)| *ms)
            .max_by(f64::total_cmp)
        else {
            continue;
        };
        for w in &mut g.what_if {
            if w.cause != Cause::GpuThrottled || w.step_ms_if_fixed >= floor {
                continue;
            }
            let k = w.step_ms_if_fixed / floor;
            w.step_ms_if_fixed = round3(floor);
            w.speedup = round3(w.step_ms_now / floor);
            w.speedup_low = round3((w.speedup_low * k).min(w.speedup));
            w.speedup_high = round3((w.speedup_high * k).max(w.speedup));
            w.limited_next_by = Cause::NcclWait.name().to_owned();
        }
        g.what_if.sort_by(|x, y| y.speedup.total_cmp(&x.speedup));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: f64 = 1e6;

    fn step(input_wait: f64, copy: f64, host: f64, gpu: f64) -> StepParts {
        StepParts {
            split: StepSplit {
                input_wait: input_wait * MS,
                copy: copy * MS,
                host: host * MS,
                gpu: gpu * MS,
                collective: 0.0,
            },
            copy_bytes: 64.0 * 1024.0 * 1024.0,
            staged_ns: 0.0,
            workers: [0.0; 3],
            feeder: [0.0; 2],
            waits: Default::default(),
        }
    }

    fn pace(kernel_ms: f64) -> Pace {
        Pace {
            kernel_ns: kernel_ms * MS,
            link_gbps: 16.0,
            max_link_gbps: 16.0,
            workers: None,
            loaders: 0,
            host_copy_gbps: None,
            kernel_scale: None,
        }
    }

    fn lost(causes: &[(Cause, u64)]) -> BTreeMap<Cause, u64> {
        causes.iter().copied().collect()
    }

    #[test]
    fn removing_the_input_wait_leaves_the_rest_of_the_step() {
        let parts: Vec<_> = (0..20)
            .map(|i| step(300.0 + f64::from(i % 3), 1.0, 2.0, 100.0))
            .collect();
        let w = estimate(
            &parts,
            &pace(100.0),
            &lost(&[(Cause::DataloaderCpu, 700)]),
            1000,
        );
        assert_eq!(w.len(), 1);
        let w = &w[0];
        assert_eq!(w.cause, Cause::DataloaderCpu);
        assert!((w.step_ms_if_fixed - 103.0).abs() < 1e-6, "{w:?}");
        assert!((w.step_ms_now - 404.0).abs() < 1.0, "{w:?}");
        assert!(
            w.speedup_low <= w.speedup && w.speedup <= w.speedup_high,
            "{w:?}"
        );
        assert!(w.speedup_high - w.speedup_low < 0.1, "steady steps: {w:?}");
        assert_eq!(w.limited_next_by, "gpu");
        assert_eq!(
            w.describe(),
            "fixing dataloader_cpu: 404 ms → 103 ms per step (3.9×, 3.9–3.9×); gpu limits next"
        );
    }

    /// Host work that ran while the kernels did hid them: without it the sync waits for all
    /// of the kernel time, so the step falls to the GPU's time, not by the host work.
    #[test]
    fn host_work_hidden_behind_the_gpu_gives_back_only_its_excess() {
        // 200 ms of host work after launching 100 ms of kernels: the sync waits for none.
        let parts = vec![step(0.0, 1.0, 200.0, 0.0); 10];
        let w = estimate(
            &parts,
            &pace(100.0),
            &lost(&[(Cause::HostCompute, 500)]),
            1000,
        );
        assert!((w[0].step_ms_if_fixed - 101.0).abs() < 1e-6, "{w:?}");
        assert!((w[0].speedup - 201.0 / 101.0).abs() < 1e-3, "{w:?}");
        assert_eq!(w[0].limited_next_by, "gpu");
    }

    /// A wait counted as a copy's (or a collective's) held the kernels queued behind it: the
    /// fixed step still waits for them.
    #[test]
    fn the_kernels_behind_a_removed_wait_are_still_waited_for() {
        let parts = vec![step(0.0, 53.0, 0.1, 0.0); 10];
        let w = estimate(
            &parts,
            &pace(10.0),
            &lost(&[(Cause::PinnedMemoryCopy, 800)]),
            1000,
        );
        let copy_ms = 64.0 * 1024.0 * 1024.0 / 16.0 / MS;
        assert!(
            (w[0].step_ms_if_fixed - (copy_ms + 10.0)).abs() < 1e-3,
            "{w:?}"
        );
        assert_eq!(w[0].limited_next_by, "gpu");
        let mut waiting = step(0.0, 1.0, 0.2, 0.0);
        waiting.split.collective = 300.0 * MS;
        let w = estimate(
            &vec![waiting; 10],
            &pace(100.0),
            &lost(&[(Cause::NcclWait, 700)]),
            1000,
        );
        assert!((w[0].step_ms_if_fixed - 101.0).abs() < 1e-3, "{w:?}");
    }

    #[test]
    fn a_pinned_copy_moves_at_the_links_pace_and_the_next_limit_is_named() {
        // 64 MiB staged by the CPU in 34 ms; pinned, at 16 GB/s, it takes 4.2 ms.
        let parts = vec![step(0.0, 34.0, 40.0, 10.0); 10];
        let l = lost(&[(Cause::PinnedMemoryCopy, 300), (Cause::HostCompute, 100)]);
        let w = estimate(&parts, &pace(10.0), &l, 1000);
        let pinned = w
            .iter()
            .find(|w| w.cause == Cause::PinnedMemoryCopy)
            .unwrap();
        let copy_ms = 64.0 * 1024.0 * 1024.0 / 16.0 / MS;
        assert!(
            (pinned.step_ms_if_fixed - (copy_ms + 50.0)).abs() < 1e-3,
            "{pinned:?}"
        );
        assert_eq!(pinned.limited_next_by, "host_compute");
    }

    #[test]
    fn small_causes_and_causes_without_a_model_get_no_estimate() {
        let parts = vec![step(10.0, 1.0, 2.0, 100.0); 10];
        let l = lost(&[
            (Cause::DataloaderCpu, 10),
            (Cause::Unknown, 500),
            (Cause::GpuThrottled, 500),
        ]);
        assert!(estimate(&parts, &pace(100.0), &l, 1000).is_empty());
        assert!(estimate(&[], &pace(100.0), &lost(&[(Cause::Disk, 900)]), 1000).is_empty());
    }

    /// Workers that both read and decode: fixing either leaves the other's part of the
    /// loader's time, so neither alone gives the whole wait back.
    #[test]
    fn a_loader_with_two_causes_gives_each_its_part() {
        // 400 ms steps: 300 ms waiting for the loader, 100 ms of the rest.
        let parts = vec![step(300.0, 1.0, 2.0, 97.0); 10];
        let l = lost(&[(Cause::Disk, 450), (Cause::DataloaderCpu, 150)]);
        let w = estimate(&parts, &pace(97.0), &l, 1000);
        let of = |c| w.iter().find(|w| w.cause == c).unwrap();
        // Disk is 3/4 of the loader: without it a batch takes 100 ms, as the rest does.
        assert!(
            (of(Cause::Disk).step_ms_if_fixed - 100.0).abs() < 1e-6,
            "{w:?}"
        );
        // Decoding is 1/4: without it a batch takes 300 ms, 200 ms past the rest.
        assert!(
            (of(Cause::DataloaderCpu).step_ms_if_fixed - 300.0).abs() < 1e-6,
            "{w:?}"
        );
        assert_eq!(of(Cause::DataloaderCpu).limited_next_by, "disk");
        assert_eq!(w[0].cause, Cause::Disk, "the larger gain first");
    }

    /// A job whose loader decodes for a while, then reads for a while (the demo's phases):
    /// each step's wait goes to the cause its workers were in around it, where the whole
    /// run's mix would split every step's wait between both.
    #[test]
    fn each_phase_of_the_loader_gives_its_wait_to_its_own_cause() {
        let mut parts = Vec::new();
        for i in 0..20 {
            // 400 ms steps, 300 ms of them waiting for a batch; 100 ms of the rest.
            let mut p = step(300.0, 1.0, 2.0, 97.0);
            p.workers = if i < 10 {
                [400.0 * MS, 0.0, 0.0]
            } else {
                [0.0, 0.0, 400.0 * MS]
            };
            parts.push(p);
        }
        let l = lost(&[(Cause::Disk, 300), (Cause::DataloaderCpu, 300)]);
        // Over the whole run the workers were half on a CPU, half on IO.
        let p = Pace {
            workers: Some([4000.0 * MS, 0.0, 4000.0 * MS]),
            ..pace(97.0)
        };
        let w = estimate(&parts, &p, &l, 1000);
        let of = |c| w.iter().find(|w| w.cause == c).unwrap();
        // Fixing either cause gives back its phase's whole wait: 10 steps of 400 ms become
        // 100 ms, the other 10 stay (250 ms on average).
        for c in [Cause::Disk, Cause::DataloaderCpu] {
            assert!((of(c).step_ms_if_fixed - 250.0).abs() < 1e-6, "{w:?}");
        }
        // A step whose ticks missed the workers takes the whole run's mix: half its wait
        // (200 ms), so (200 + 9 × 100 + 10 × 400) / 20.
        parts[0].workers = [0.0; 3];
        let w = estimate(&parts, &p, &l, 1000);
        assert!((of_cause(&w, Cause::DataloaderCpu).step_ms_if_fixed - 255.0).abs() < 1e-6);
    }

    /// Two workers that read and decode, each busy half the time (an in-order loader keeps
    /// the one ahead waiting for the one behind): the batch comes every 100 ms now, but
    /// without the reads the two decode one every 40 / 2 ms, not every 100 × (1 − 0.6).
    #[test]
    fn workers_side_by_side_make_batches_at_their_own_rate_once_fixed() {
        let mut p = step(80.0, 1.0, 2.0, 17.0);
        p.workers = [40.0 * MS, 0.0, 60.0 * MS];
        let l = lost(&[(Cause::Disk, 400), (Cause::DataloaderCpu, 300)]);
        let fixed_ms = |loaders, cause| {
            let pace = Pace {
                loaders,
                ..pace(17.0)
            };
            of_cause(&estimate(&vec![p; 10], &pace, &l, 1000), cause).step_ms_if_fixed
        };
        assert!(
            (fixed_ms(0, Cause::Disk) - 40.0).abs() < 1e-6,
            "by the share alone"
        );
        assert!((fixed_ms(1, Cause::Disk) - 40.0).abs() < 1e-6);
        assert!((fixed_ms(2, Cause::Disk) - 20.0).abs() < 1e-6);
        // Without the decoding: 60 / 2 = 30 ms a batch, 10 of it beyond the rest of the step.
        assert!((fixed_ms(2, Cause::DataloaderCpu) - 30.0).abs() < 1e-6);
    }

    /// Workers that burn the CPUs keep the feeder waiting for one too (the bench's real
    /// PyTorch job: 3 ms of its 42 ms steps outside its calls, 0.4 ms once the workers'
    /// work went): fixing them gives back the host time it spent waiting for a CPU, which
    /// fixing the disk does not.
    #[test]
    fn a_loader_that_burns_the_cpus_gives_back_the_feeders_wait_for_one() {
        let mut p = step(20.0, 1.0, 4.0, 15.0);
        p.feeder = [1.0 * MS, 3.0 * MS];
        let l = lost(&[(Cause::DataloaderCpu, 400), (Cause::Disk, 100)]);
        let w = estimate(&vec![p; 10], &pace(15.0), &l, 1000);
        // Its 4 ms of host work was a quarter on a CPU: 1 + 1 + 15.
        assert!((of_cause(&w, Cause::DataloaderCpu).step_ms_if_fixed - 17.0).abs() < 1e-6);
        let disk = of_cause(&w, Cause::Disk);
        assert!(disk.step_ms_if_fixed > 20.0, "{disk:?}");
    }

    fn of_cause(w: &[WhatIf], c: Cause) -> &WhatIf {
        w.iter().find(|w| w.cause == c).unwrap()
    }

    /// Workers waiting for a CPU a third of their busy time: without the contention they
    /// make a batch in two thirds of the time, no faster.
    #[test]
    fn contention_gives_back_only_the_workers_wait_for_a_cpu() {
        let parts = vec![step(300.0, 1.0, 2.0, 97.0); 10];
        let l = lost(&[(Cause::CpuContention, 600)]);
        let p = Pace {
            workers: Some([200.0 * MS, 100.0 * MS, 0.0]),
            ..pace(97.0)
        };
        let w = estimate(&parts, &p, &l, 1000);
        // 400 ms steps, a third of them the wait for a CPU: a batch every 267 ms.
        assert!((w[0].step_ms_if_fixed - 800.0 / 3.0).abs() < 1e-3, "{w:?}");
        assert_eq!(w[0].limited_next_by, "input");
    }

    /// pin_memory moves the CPU's copy into pinned memory to its own thread: the step is
    /// at least that copy.
    #[test]
    fn a_pinned_batch_still_costs_its_copy_into_pinned_memory() {
        let mut p_step = step(0.0, 53.0, 0.1, 0.0);
        p_step.staged_ns = 34.0 * MS;
        let w = estimate(
            &vec![p_step; 10],
            &pace(10.0),
            &lost(&[(Cause::PinnedMemoryCopy, 800)]),
            1000,
        );
        assert!((w[0].step_ms_if_fixed - 34.0).abs() < 1e-3, "{w:?}");
        // A CPU that copies 10 GB/s pins the 64 MiB in 6.7 ms: the step is the copy to the
        // GPU at the link's 16 GB/s, the host work and the kernels left to wait for.
        let p = Pace {
            host_copy_gbps: Some(10.0),
            ..pace(10.0)
        };
        let w = estimate(
            &vec![p_step; 10],
            &p,
            &lost(&[(Cause::PinnedMemoryCopy, 800)]),
            1000,
        );
        let link_ms = 64.0 * 1024.0 * 1024.0 / 16.0 / MS;
        assert!(
            (w[0].step_ms_if_fixed - (link_ms + 10.0)).abs() < 1e-3,
            "{w:?}"
        );
    }

    #[test]
    fn jittery_steps_widen_the_interval() {
        let parts: Vec<_> = (0..30)
            .map(|i| step(if i % 2 == 0 { 10.0 } else { 400.0 }, 1.0, 2.0, 100.0))
            .collect();
        let w = estimate(&parts, &pace(100.0), &lost(&[(Cause::Disk, 500)]), 1000);
        assert!(w[0].speedup_high - w[0].speedup_low > 0.2, "{w:?}");
        // The same steps give the same interval.
        assert_eq!(
            w,
            estimate(&parts, &pace(100.0), &lost(&[(Cause::Disk, 500)]), 1000)
        );
    }

    #[test]
    fn a_throttled_gpu_runs_its_kernels_at_the_unslowed_clock_and_the_waits_shrink_with_them() {
        let throttled = Pace {
            kernel_scale: Some(1.0 / 3.0),
            ..pace(300.0)
        };
        // Waiting in its sync: 10 ms of host work hides part of 100 ms of kernels.
        let parts = vec![step(0.0, 0.0, 10.0, 290.0); 10];
        let w = estimate(&parts, &throttled, &lost(&[]), 1000);
        assert_eq!(w.len(), 1, "given though no window lost time to it: {w:?}");
        assert_eq!(w[0].cause, Cause::GpuThrottled);
        assert!((w[0].step_ms_if_fixed - 100.0).abs() < 1e-6, "{w:?}");
        assert_eq!(w[0].limited_next_by, "gpu");
        // Waiting in a collective that holds its kernels: the wait shrinks the same way.
        let mut p = step(0.0, 0.0, 1.0, 0.0);
        p.split.collective = 299.0 * MS;
        let w = estimate(&vec![p; 10], &throttled, &lost(&[]), 1000);
        assert!((w[0].step_ms_if_fixed - 100.0).abs() < 1e-6, "{w:?}");
        // Not throttled: no estimate.
        assert!(estimate(&parts, &pace(300.0), &lost(&[]), 1000).is_empty());
    }

    #[test]
    fn a_throttled_rank_fixed_then_waits_for_the_other_ranks_and_separate_jobs_bind_nothing() {
        let mut rank = step(0.0, 0.0, 1.0, 0.0);
        rank.split.collective = 299.0 * MS;
        let what_if = |cause, fixed_ms: f64| WhatIf {
            cause,
            step_ms_now: 300.0,
            step_ms_if_fixed: fixed_ms,
            speedup: 300.0 / fixed_ms,
            speedup_low: 300.0 / fixed_ms * 0.9,
            speedup_high: 300.0 / fixed_ms * 1.1,
            limited_next_by: "gpu".into(),
        };
        let gpu = |index, parts: &StepParts, w: WhatIf| super::super::GpuAttribution {
            gpu: index,
            step_parts: vec![*parts; 4],
            what_if: vec![w],
            ..Default::default()
        };
        let mut gpus = vec![
            gpu(0, &rank, what_if(Cause::NcclWait, 120.0)),
            gpu(1, &rank, what_if(Cause::GpuThrottled, 100.0)),
        ];
        bound_by_other_ranks(&mut gpus);
        let w = &gpus[1].what_if[0];
        assert!((w.step_ms_if_fixed - 120.0).abs() < 1e-9, "{w:?}");
        assert!((w.speedup - 2.5).abs() < 1e-9, "{w:?}");
        assert!(
            w.speedup_low <= w.speedup && w.speedup <= w.speedup_high,
            "{w:?}"
        );
        assert_eq!(w.limited_next_by, "nccl_wait");
        assert_eq!(
            gpus[0].what_if[0].step_ms_if_fixed, 120.0,
            "the others are kept"
        );
        // Two separate jobs (no collectives): each is its own.
        let alone = step(0.0, 0.0, 1.0, 299.0);
        let mut gpus = vec![
            gpu(0, &alone, what_if(Cause::HostCompute, 250.0)),
            gpu(1, &alone, what_if(Cause::GpuThrottled, 100.0)),
        ];
        bound_by_other_ranks(&mut gpus);
        assert_eq!(gpus[1].what_if[0].step_ms_if_fixed, 100.0);
    }
}
