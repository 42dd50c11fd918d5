//! What to change, with numbers: for each cause whose fix would speed the step up by at least
//! [`MIN_GAIN`] (its what-if), the change a PyTorch user makes, the numbers that size it, and
//! the evidence behind them. Ordered by the gain expected.
//!
//! - `dataloader_cpu`: the `num_workers` that would feed the GPU, from the workers' CPU per
//!   batch and the step the GPU would run at, against the CPUs the job's other threads leave
//!   free; when those are too few, that more workers will not help, and the functions that
//!   cost the most per batch, to be made cheaper.
//! - `host_compute`: every blocking call of the loop (`.item()`, `.cpu()`, a synchronous
//!   copy) with its call site, calls and cost per step, and the loop's own hottest functions.
//! - `launch_overhead`: launches per step, and CUDA graphs or `torch.compile`.
//! - `pinned_memory_copy`: `pin_memory=True`, with the bytes per step and the rates.
//! - `disk`: the read rate the GPU needs against the rate achieved, the IO size, the files.
//! - `cpu_contention`, `pcie`, `nccl_wait`: what takes the CPUs, the link's state, the
//!   straggler.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::window::{HostWindow, TimelineIndex};
use super::{Cause, GpuAttribution, Roles, WhatIf};
use crate::analysis::model::Analysis;

/// The least speedup a change must promise to be advised: below it, the job is healthy enough.
pub const MIN_GAIN: f64 = 1.05;
/// Call sites and functions listed per advice, at most.
const LISTED: usize = 3;

/// One change. Field names are part of the JSON report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    pub cause: Cause,
    pub gpu: u32,
    /// What to change, in a sentence with its numbers.
    pub change: String,
    /// How much faster the step would be once changed (the what-if, or less where the host's
    /// CPUs bound it).
    pub expected_speedup: f64,
    /// The measurements behind it, one line each.
    pub evidence: Vec<String>,
    /// The settings the change names, for a script to apply: `num_workers`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, u64>,
}

/// What every advice reads of one GPU's job.
struct Job<'x> {
    a: &'x Analysis,
    roles: &'x Roles,
    g: &'x GpuAttribution,
    /// The steps analysed: first marker's end, last marker's end, steps between.
    span: (u64, u64),
    steps: f64,
    /// The host's activity over the steps.
    host: HostWindow,
}

impl Job<'_> {
    fn per_step_ms(&self, ns: f64) -> f64 {
        ns / self.steps / 1e6
    }

    fn span_ns(&self) -> f64 {
        (self.span.1 - self.span.0) as f64
    }

    /// The CPUs a group of threads used over the steps.
    fn cpus_used(&self, on_cpu_ns: f64) -> f64 {
        on_cpu_ns / self.span_ns().max(1.0)
    }
}

/// The advice for one GPU, most gain first.
pub fn advise(
    a: &Analysis,
    roles: &Roles,
    index: &TimelineIndex,
    g: &GpuAttribution,
) -> Vec<Advice> {
    let (Some(&first), Some(&last)) = (g.step_ends_ns.first(), g.step_ends_ns.last()) else {
        return Vec::new();
    };
    if last <= first {
        return Vec::new();
    }
    let job = Job {
        a,
        roles,
        g,
        span: (first, last),
        steps: (g.step_ends_ns.len() - 1) as f64,
        host: index.window(&a.timeline, roles, first, last),
    };
    let mut out: Vec<Advice> = g
        .what_if
        .iter()
        .filter(|w| w.speedup >= MIN_GAIN)
        .filter_map(|w| {
            let advised = match w.cause {
                Cause::DataloaderCpu => loader(&job, w),
                Cause::HostCompute => syncs(&job, w),
                Cause::LaunchOverhead => launches(&job, w),
                Cause::PinnedMemoryCopy => pinned(&job, w),
                Cause::Disk => disk(&job, w),
                Cause::CpuContention => contention(&job, w),
                Cause::Pcie => link(&job, w),
                Cause::NcclWait => straggler(w),
                Cause::GpuThrottled => throttled(g.slow_clock.as_ref()?, w),
                Cause::GilContention | Cause::LockWait => holder(&job, w),
                Cause::NoWork | Cause::Unknown => return None,
            };
            Some(Advice {
                cause: w.cause,
                gpu: g.gpu,
                change: advised.change,
                expected_speedup: (advised.expected * 1e3).round() / 1e3,
                evidence: advised.evidence,
                settings: advised.settings,
            })
        })
        .filter(|a| a.expected_speedup >= MIN_GAIN)
        .collect();
    out.sort_by(|x, y| y.expected_speedup.total_cmp(&x.expected_speedup));
    out
}

/// One advice per cause that several GPUs share alike (every rank waiting for one straggler):
/// the largest gain's, naming the other GPUs.
pub fn merge_alike(advice: &mut Vec<Advice>) {
    let mut kept: Vec<Advice> = Vec::with_capacity(advice.len());
    for a in advice.drain(..) {
        match kept
            .iter_mut()
            .find(|k| k.cause == Cause::NcclWait && a.cause == Cause::NcclWait)
        {
            Some(k) => {
                let line = match k.evidence.iter().position(|e| e.starts_with("also GPU")) {
                    Some(i) => i,
                    None => {
                        k.evidence.push("also GPU".to_owned());
                        k.evidence.len() - 1
                    }
                };
                let e = &mut k.evidence[line];
                e.push_str(if e == "also GPU" { " " } else { ", " });
                e.push_str(&format!("{} ({:.1}×)", a.gpu, a.expected_speedup));
            }
            None => kept.push(a),
        }
    }
    *advice = kept;
}

/// One cause's change, before it is placed.
struct Advised {
    change: String,
    expected: f64,
    evidence: Vec<String>,
    settings: BTreeMap<String, u64>,
}

impl Advised {
    fn new(change: String, expected: f64, evidence: Vec<String>) -> Self {
        Self {
            change,
            expected,
            evidence,
            settings: BTreeMap::new(),
        }
    }

    /// With a setting to change, e.g. `num_workers`, for scripts and tests to apply.
    fn set(mut self, name: &str, value: u64) -> Self {
        self.settings.insert(name.to_owned(), value);
        self
    }
}

fn ms(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

/// The function a stack is about: its deepest Python frame (`name (file.py:line)`), else its
/// deepest frame outside the kernel.
fn function(frames: &[String]) -> Option<&str> {
    let user = |f: &&String| !f.ends_with("_[k]");
    frames
        .iter()
        .rev()
        .find(|f| f.contains(".py:"))
        .or_else(|| frames.iter().rev().find(user))
        .map(String::as_str)
}

/// The hottest functions of a cause's evidence, with their share of its samples.
fn hottest(g: &GpuAttribution, cause: Cause) -> Vec<(String, f64)> {
    let Some(e) = g.causes.iter().find(|c| c.cause == cause) else {
        return Vec::new();
    };
    let total: u64 = e.evidence.stacks.iter().map(|s| s.weight).sum();
    if total == 0 {
        return Vec::new();
    }
    let mut by_fn: Vec<(String, u64)> = Vec::new();
    for s in &e.evidence.stacks {
        let Some(f) = function(&s.frames) else {
            continue;
        };
        match by_fn.iter_mut().find(|(name, _)| name == f) {
            Some((_, w)) => *w += s.weight,
            None => by_fn.push((f.to_owned(), s.weight)),
        }
    }
    by_fn.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    by_fn
        .into_iter()
        .take(LISTED)
        .map(|(f, w)| (f, w as f64 / total as f64))
        .collect()
}

/// The loader where its CPU holds the GPU up, as mean ms per step: the workers' CPU per
/// batch, the step, and the step without the wait the workers' CPU time makes. Each step
/// weighs by that wait (its input wait times the workers' share on a CPU around it), so a
/// job that decodes for a while and reads or runs fed for a while after is sized by its
/// decoding steps, not by the whole run's mean. `None` when no step has the workers' states.
fn cpu_bound_loader(a: &Analysis, g: &GpuAttribution) -> Option<LoaderPace> {
    let (mut weight, mut cpu, mut now, mut fixed) = (0.0, 0.0, 0.0, 0.0);
    let (mut others_weight, mut others) = (0.0, 0.0);
    let ends = &g.step_ends_ns;
    for (i, p) in g.step_parts.iter().enumerate() {
        let busy: f64 = p.workers.iter().sum();
        if busy <= 0.0 {
            continue;
        }
        let total = p.split.total();
        let wait = p.split.input_wait.min(p.workers[0] / busy * total);
        weight += wait;
        cpu += wait * p.workers[0];
        now += wait * total;
        fixed += wait * (total - wait);
        // The host's other load over the same steps the workers' states were read around.
        let lo = i.saturating_sub(super::steps::NEIGHBOURS);
        let hi = (i + super::steps::NEIGHBOURS + 1).min(g.step_parts.len());
        if let (Some(&from), Some(&to)) = (ends.get(lo), ends.get(hi))
            && let Some(host) = a.host_busy_cpus(from, to)
        {
            let step_ns = (to - from) as f64 / (hi - lo) as f64;
            others += wait * (host - p.workers[0] / step_ns.max(1.0)).max(0.0);
            others_weight += wait;
        }
    }
    (weight > 0.0).then(|| LoaderPace {
        cpu_ms: cpu / weight / 1e6,
        step_ms: now / weight / 1e6,
        fixed_ms: fixed / weight / 1e6,
        host_others: (others_weight > 0.0).then(|| others / others_weight),
    })
}

/// See [`cpu_bound_loader`].
struct LoaderPace {
    cpu_ms: f64,
    step_ms: f64,
    fixed_ms: f64,
    /// The CPUs the host kept busy besides the workers over those steps, where the
    /// recording read the host's CPU time.
    host_others: Option<f64>,
}

fn loader(job: &Job<'_>, w: &WhatIf) -> Advised {
    let workers = &job.host.workers;
    // Sized where the loader's CPU holds the GPU up; the whole run's means otherwise.
    let pace = cpu_bound_loader(job.a, job.g).unwrap_or(LoaderPace {
        cpu_ms: job.per_step_ms(workers.on_cpu),
        step_ms: w.step_ms_now,
        fixed_ms: w.step_ms_if_fixed,
        host_others: None,
    });
    let cpu_per_batch = pace.cpu_ms;
    let now: std::collections::BTreeSet<u32> = job
        .roles
        .workers
        .iter()
        .filter_map(|t| job.a.threads.get(t).map(|t| t.pid))
        .collect();
    let traced_others = job.cpus_used(job.host.feeder.on_cpu + job.host.other.on_cpu);
    // What the workers cannot have: everything the host keeps busy but them, where the
    // recording read the host's CPU time; else the traced tree's other threads alone.
    let whole_run = job.a.host_busy_cpus(job.span.0, job.span.1);
    let (others, whose) = match (pace.host_others, whole_run) {
        // Over the steps the loader holds up: what else runs beside it then.
        (Some(others), _) => (others, "everything else on the host"),
        (None, Some(busy)) => (
            (busy - job.cpus_used(workers.on_cpu)).max(traced_others),
            "everything else on the host",
        ),
        (None, None) => (
            traced_others,
            "the job's other threads (the host's own load was not recorded)",
        ),
    };
    let cpus = f64::from(job.a.cpus.max(1));
    let free = (cpus - others).max(0.0);
    let target = pace.fixed_ms.max(1e-3);
    let mut evidence = vec![
        format!(
            "each batch costs {} of worker CPU ({} worker process(es) now); the step without \
             the wait takes {}",
            ms(cpu_per_batch),
            now.len(),
            ms(target)
        ),
        format!(
            "{cpus:.0} CPUs: {others:.1} used by {whose}, {free:.1} free for workers; the \
             workers waited {:.0}% of their time for a CPU",
            workers.fractions().runqueue * 100.0
        ),
    ];
    let hot = hottest(job.g, Cause::DataloaderCpu);
    for (f, share) in &hot {
        evidence.push(format!(
            "{f}: {} per batch ({:.0}% of the workers' sampled CPU)",
            ms(cpu_per_batch * share),
            share * 100.0
        ));
    }
    let cheaper = hot
        .first()
        .map(|(f, _)| format!("; start with {f}"))
        .unwrap_or_default();
    let now_workers = now.len() as u32;
    let sizing = match size_loader(cpu_per_batch, target, pace.step_ms, free, now_workers) {
        // The free CPUs give the steps the loader holds up part of what fixing it would:
        // the job gains that part of the whole fix's gain.
        Sizing::Bounded {
            workers,
            speedup,
            budget_ms,
        } => {
            let part = ((pace.step_ms - pace.step_ms / speedup)
                / (pace.step_ms - target).max(1e-9))
            .clamp(0.0, 1.0);
            Sizing::Bounded {
                workers,
                speedup: 1.0 / (1.0 - part * (1.0 - 1.0 / w.speedup)),
                budget_ms,
            }
        }
        s => s,
    };
    let change = match sizing {
        Sizing::Feeds { workers } if workers > now_workers => format!(
            "set DataLoader(num_workers={workers}) (now {now_workers}): each batch takes {} of \
             CPU and the GPU needs one every {}",
            ms(cpu_per_batch),
            ms(target)
        ),
        Sizing::Feeds { .. } => format!(
            "the {now_workers} workers can make a batch every {} ({} of CPU each) but the \
             loop still waits: raise DataLoader(prefetch_factor=...) and set \
             persistent_workers=True, so batches are ready ahead and workers are not restarted",
            ms(cpu_per_batch / f64::from(now_workers.max(1))),
            ms(cpu_per_batch)
        ),
        Sizing::Bounded {
            workers,
            speedup,
            budget_ms,
        } => {
            let change = format!(
                "set DataLoader(num_workers={workers}) (now {now_workers}), as many as the free \
                 CPUs allow ({speedup:.1}× faster); to feed the GPU fully, each batch must cost \
                 under {} of CPU, not {}{cheaper}",
                ms(budget_ms),
                ms(cpu_per_batch)
            );
            return Advised::new(change, speedup, evidence).set("num_workers", u64::from(workers));
        }
        Sizing::Saturated { budget_ms } => format!(
            "the CPUs are saturated ({free:.1} free for workers): more workers will not help; \
             make each batch cost under {} of CPU, not {}{cheaper}",
            ms(budget_ms),
            ms(cpu_per_batch)
        ),
    };
    let advised = Advised::new(change, w.speedup, evidence);
    match sizing {
        Sizing::Feeds { workers } if workers > now_workers => {
            advised.set("num_workers", u64::from(workers))
        }
        _ => advised,
    }
}

/// How a DataLoader can be made to feed the GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Sizing {
    /// This many workers make a batch as fast as the GPU takes one, on the free CPUs.
    Feeds { workers: u32 },
    /// The free CPUs allow this many, which gives `speedup`; feeding the GPU fully needs each
    /// batch to cost under `budget_ms` of CPU.
    Bounded {
        workers: u32,
        speedup: f64,
        budget_ms: f64,
    },
    /// More workers would not help: each batch must cost under `budget_ms` of CPU.
    Saturated { budget_ms: f64 },
}

/// The workers a loader needs for a batch every `target_ms`, each costing `cpu_ms`, with
/// `free` CPUs for them (those the workers use now included: 1.8 free beside one busy
/// worker has room for a second) and `now` running; `step_ms` is the step now.
fn size_loader(cpu_ms: f64, target_ms: f64, step_ms: f64, free: f64, now: u32) -> Sizing {
    let fits = free.round().max(1.0);
    let needed = (cpu_ms / target_ms.max(1e-3)).ceil().max(1.0);
    if needed <= fits {
        return Sizing::Feeds {
            workers: needed as u32,
        };
    }
    let budget_ms = target_ms * fits;
    // As many workers as CPUs are free make a batch every `cpu_ms / free` at best; a CPU
    // free only in part still takes a worker (1.4 free CPUs run two workers 1.4 times as
    // fast as one).
    let speedup = step_ms / target_ms.max(cpu_ms / free.max(1e-3));
    let share = free.ceil().max(1.0);
    if speedup >= MIN_GAIN && share > f64::from(now) {
        Sizing::Bounded {
            workers: share as u32,
            speedup,
            budget_ms,
        }
    } else {
        Sizing::Saturated { budget_ms }
    }
}

fn syncs(job: &Job<'_>, w: &WhatIf) -> Advised {
    let feeder = |t: u32| job.roles.feeders.contains(&t);
    let mut sites: Vec<(String, String, u64, u64)> = Vec::new();
    for c in &job.a.cuda.calls {
        if !feeder(c.tid)
            || !super::steps::blocks(c)
            || c.end_ns <= job.span.0
            || c.start_ns >= job.span.1
        {
            continue;
        }
        let ns = c.end_ns.saturating_sub(c.start_ns);
        match sites.iter_mut().find(|s| s.0 == c.api && s.1 == c.caller) {
            Some(s) => {
                s.2 += 1;
                s.3 += ns;
            }
            None => sites.push((c.api.clone(), c.caller.clone(), 1, ns)),
        }
    }
    sites.sort_by_key(|s| std::cmp::Reverse(s.3));
    let step = w.step_ms_now.max(1e-3);
    let mut evidence: Vec<String> = sites
        .iter()
        .map(|(api, caller, calls, ns)| {
            let per_step = job.per_step_ms(*ns as f64);
            format!(
                "{api} at {}: {:.1} per step, {} per step ({:.0}% of the step)",
                if caller.is_empty() { "?" } else { caller },
                *calls as f64 / job.steps,
                ms(per_step),
                per_step / step * 100.0
            )
        })
        .collect();
    let host_ms = job
        .g
        .steps
        .as_ref()
        .and_then(|s| s.split_ms)
        .map_or(0.0, |s| s.host);
    evidence.push(format!(
        "the loop's own host work: {} per step ({:.0}% of the step)",
        ms(host_ms),
        host_ms / step * 100.0
    ));
    for (f, share) in hottest(job.g, Cause::HostCompute) {
        evidence.push(format!(
            "{f}: {:.0}% of the loop's sampled CPU",
            share * 100.0
        ));
    }
    let first = sites
        .first()
        .map(|(api, caller, ..)| {
            format!(
                "; its blocking calls stop it each step ({api} at {})",
                if caller.is_empty() { "?" } else { caller }
            )
        })
        .unwrap_or_default();
    let change = format!(
        "move host work off the training loop's path (log every N steps, keep tensors on the \
         GPU instead of .item()/.cpu()/.tolist() each step){first}: {} of host work per step",
        ms(host_ms)
    );
    Advised::new(change, w.speedup, evidence)
}

fn launches(job: &Job<'_>, w: &WhatIf) -> Advised {
    let rate: f64 = job
        .roles
        .feeders
        .iter()
        .filter_map(|t| job.a.threads.get(t))
        .map(|t| t.pid)
        .collect::<std::collections::BTreeSet<u32>>()
        .iter()
        .filter_map(|p| job.a.cuda.launches.get(p))
        .map(|l| l.per_sec)
        .sum();
    let per_step = rate * job.span_ns() / 1e9 / job.steps;
    let change = format!(
        "{per_step:.0} kernel launches per step: capture the step in a CUDA graph \
         (torch.cuda.graphs) or compile it with torch.compile(mode=\"reduce-overhead\")"
    );
    let evidence = vec![format!(
        "{rate:.0} launches/s; the step takes {} of which the GPU computes {}",
        ms(w.step_ms_now),
        ms(w.step_ms_if_fixed)
    )];
    Advised::new(change, w.speedup, evidence)
}

fn pinned(job: &Job<'_>, w: &WhatIf) -> Advised {
    let bytes: f64 =
        job.g.step_parts.iter().map(|p| p.copy_bytes).sum::<f64>() / job.steps.max(1.0);
    let copy_ms = job
        .g
        .steps
        .as_ref()
        .and_then(|s| s.split_ms)
        .map_or(0.0, |s| s.copy);
    let achieved = bytes / (copy_ms * 1e6).max(1.0);
    let mib = bytes / f64::from(1u32 << 20);
    let change = format!(
        "DataLoader(pin_memory=True) and .to(device, non_blocking=True): {mib:.0} MiB a step \
         are copied from pageable memory, which the driver stages through the CPU"
    );
    let evidence = vec![
        format!(
            "{mib:.0} MiB per step copied in {}: {achieved:.1} GB/s",
            ms(copy_ms)
        ),
        format!(
            "pinned, the copy runs at the link's pace: the step {} → {}",
            ms(w.step_ms_now),
            ms(w.step_ms_if_fixed)
        ),
    ];
    Advised::new(change, w.speedup, evidence)
}

fn disk(job: &Job<'_>, w: &WhatIf) -> Advised {
    let io = job
        .g
        .causes
        .iter()
        .find(|c| c.cause == Cause::Disk)
        .and_then(|c| c.evidence.block_io);
    let mut evidence = Vec::new();
    let mut change = "read the dataset from faster storage or the page cache (warm it, or \
                      cache it in memory), and read ahead with more DataLoader workers"
        .to_owned();
    if let Some(io) = io.filter(|io| io.requests > 0) {
        let size_kib = io.read_bytes as f64 / io.requests as f64 / 1024.0;
        evidence.push(format!(
            "{} reads of {size_kib:.0} KiB on average in the stalls, p50 {} p99 {}",
            io.requests,
            io.p50_ns.map_or("?".into(), |n| ms(n as f64 / 1e6)),
            io.p99_ns.map_or("?".into(), |n| ms(n as f64 / 1e6))
        ));
        if size_kib < 64.0 {
            change.push_str(
                "; the reads are small: pack the samples into shards (WebDataset, tar or \
                 LMDB) read sequentially",
            );
        }
    }
    let read: u64 = job
        .a
        .threads
        .values()
        .filter(|t| job.roles.workers.contains(&t.tid) || job.roles.feeders.contains(&t.tid))
        .map(|t| t.block_io.read_bytes)
        .sum();
    if read > 0 && job.a.duration_ns > 0 {
        let per_batch = read as f64 / (job.a.duration_ns as f64 / 1e9) * w.step_ms_now / 1e3;
        let need = per_batch / (w.step_ms_if_fixed / 1e3) / 1e6;
        let got = read as f64 / (job.a.duration_ns as f64 / 1e9) / 1e6;
        evidence.push(format!(
            "the GPU needs {need:.0} MB/s of reads to run unstalled; the job read {got:.0} MB/s"
        ));
    }
    let mut files: Vec<_> = job
        .a
        .page_cache_files
        .iter()
        .filter_map(|f| f.path.as_deref().map(|p| (p, f.bytes)))
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.1));
    files.dedup_by(|x, y| x.0 == y.0);
    for (path, bytes) in files.into_iter().take(LISTED) {
        evidence.push(format!(
            "{path}: {:.1} MiB read from disk",
            bytes as f64 / f64::from(1u32 << 20)
        ));
    }
    Advised::new(change, w.speedup, evidence)
}

fn contention(job: &Job<'_>, w: &WhatIf) -> Advised {
    let change = "give the job CPUs of its own: other processes take the CPUs its DataLoader \
                  workers and training loop wait for (a cpuset or taskset for the job, fewer \
                  co-located jobs)"
        .to_owned();
    let evidence = vec![format!(
        "the workers waited {:.0}% of their time for a CPU, the training loop {:.0}%",
        job.host.workers.fractions().runqueue * 100.0,
        job.host.feeder.fractions().runqueue * 100.0
    )];
    Advised::new(change, w.speedup, evidence)
}

fn link(job: &Job<'_>, w: &WhatIf) -> Advised {
    let info = job.a.gpus.get(&job.g.gpu).map(|t| &t.info);
    let state = job
        .a
        .gpus
        .get(&job.g.gpu)
        .and_then(|t| t.states.iter().rev().find(|s| s.pcie_gen.is_some()));
    let change = format!(
        "the GPU's PCIe link runs at gen{} x{} of gen{} x{}: reseat the card or move it to a \
         full slot, and check the BIOS's link settings",
        state.and_then(|s| s.pcie_gen).unwrap_or(0),
        state.and_then(|s| s.pcie_width).unwrap_or(0),
        info.map_or(0, |i| i.pcie_max_gen),
        info.map_or(0, |i| i.pcie_max_width)
    );
    let evidence = vec![format!(
        "at full width the step {} → {}",
        ms(w.step_ms_now),
        ms(w.step_ms_if_fixed)
    )];
    Advised::new(change, w.speedup, evidence)
}

/// The innermost Python frame of a stack (`tokenize (waits.py:176)`), else its innermost
/// frame.
fn python_function(frames: &[String]) -> Option<&str> {
    frames
        .iter()
        .rev()
        .find(|f| f.ends_with(')') && f.contains(".py:"))
        .or_else(|| frames.last())
        .map(String::as_str)
}

/// The GIL or a lock of the job: who held it (the other thread of the feeder's process that
/// ran meanwhile, from the cause's evidence) and what it ran.
fn holder(job: &Job<'_>, w: &WhatIf) -> Advised {
    let evidence = job
        .g
        .causes
        .iter()
        .find(|c| c.cause == w.cause)
        .map(|c| &c.evidence);
    let who = evidence
        .and_then(|e| e.threads.first())
        .map(|t| format!("thread {} ({})", t.tid, t.comm));
    let running = evidence
        .and_then(|e| e.stacks.first())
        .and_then(|s| python_function(&s.frames));
    let held = match (&who, running) {
        (Some(who), Some(f)) => format!("{who} running {f}"),
        (Some(who), None) => who.clone(),
        _ => "another thread of the process".to_owned(),
    };
    let per_step: f64 = job
        .g
        .step_parts
        .iter()
        .map(|p| {
            let share = if w.cause == Cause::GilContention {
                p.waits.gil
            } else {
                p.lock_share()
            };
            p.split.input_wait * share
        })
        .sum::<f64>()
        / job.g.step_parts.len().max(1) as f64
        / 1e6;
    let change = if w.cause == Cause::GilContention {
        format!(
            "the loop waits for the GIL, held by {held}: move that work into a \
             DataLoader worker or another process, release the GIL in its native code, or run \
             it less often"
        )
    } else {
        format!(
            "the loop waits on a lock held or signalled by {held}: do less while holding it, \
             or have the batch ready ahead of the step (a queue filled one step ahead)"
        )
    };
    let evidence = vec![
        format!(
            "waiting {} {} a step",
            if w.cause == Cause::GilContention {
                "for the GIL"
            } else {
                "on the lock"
            },
            ms(per_step)
        ),
        format!(
            "without the wait the step {} → {}",
            ms(w.step_ms_now),
            ms(w.step_ms_if_fixed)
        ),
    ];
    Advised::new(change, w.speedup, evidence)
}

fn straggler(w: &WhatIf) -> Advised {
    let change = "this rank waits in collectives for a slower one: fix the straggler (the \
                  job's report names it, with its own cause and advice)"
        .to_owned();
    let evidence = vec![format!(
        "without the wait the step {} → {}",
        ms(w.step_ms_now),
        ms(w.step_ms_if_fixed)
    )];
    Advised::new(change, w.speedup, evidence)
}

fn throttled(c: &super::throttle::SlowClock, w: &WhatIf) -> Advised {
    let change = format!(
        "this GPU ran its kernels at {} MHz instead of {} MHz ({}): check its cooling and \
         power (nvidia-smi -q -d TEMPERATURE,PERFORMANCE,POWER,CLOCK), clean the heatsink, \
         fix the airflow, check the power supply",
        c.mhz,
        c.reference_mhz,
        c.reasons.join(", ")
    );
    let evidence = vec![
        format!(
            "slowed in {:.0}% of its busy samples, SM clock {} MHz (median) against {} MHz, {}",
            c.share * 100.0,
            c.mhz,
            c.reference_mhz,
            c.describe_reference()
        ),
        format!(
            "at {} MHz the step {} → {}{}",
            c.reference_mhz,
            ms(w.step_ms_now),
            ms(w.step_ms_if_fixed),
            if w.limited_next_by == Cause::NcclWait.name() {
                ", then waiting for the other ranks"
            } else {
                ""
            }
        ),
    ];
    Advised::new(change, w.speedup, evidence)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::model::HostCpuReading;
    use crate::attribution::steps::{StepParts, StepSplit};

    /// A job that decodes for 10 steps (400 ms each, 300 of them waiting for a batch, the
    /// worker on a CPU throughout), then runs fed for 10 (100 ms, the worker idling): the
    /// loader is sized by its decoding steps, and the host's other load by those steps too.
    #[test]
    fn a_phased_loader_is_sized_by_the_steps_it_holds_up() {
        const MS: f64 = 1e6;
        let phase = |i: usize| {
            if i < 10 {
                (300.0, 400.0, 400.0)
            } else {
                (0.0, 100.0, 5.0)
            }
        };
        let mut g = GpuAttribution::default();
        let mut t = 0u64;
        g.step_ends_ns.push(t);
        for i in 0..20 {
            let (wait, len, _) = phase(i);
            // The worker's states as the steps give them: around each step, per step.
            let (lo, hi) = (i.saturating_sub(4), (i + 5).min(20));
            let cpu = (lo..hi).map(|j| phase(j).2).sum::<f64>() / (hi - lo) as f64;
            g.step_parts.push(StepParts {
                split: StepSplit {
                    input_wait: wait * MS,
                    host: 2.0 * MS,
                    gpu: (len - wait - 2.0) * MS,
                    ..StepSplit::default()
                },
                workers: [cpu * MS, 0.0, 0.0],
                ..StepParts::default()
            });
            t += (len * MS) as u64;
            g.step_ends_ns.push(t);
        }
        let mut a = Analysis::default();
        let p = cpu_bound_loader(&a, &g).unwrap();
        // The whole run's mean would be 202 ms a batch, 250 ms a step; the steps next to the
        // change see a mix of both phases around them (here 4 of the 10).
        assert!((p.cpu_ms - 400.0).abs() < 60.0, "{}", p.cpu_ms);
        assert!((p.step_ms - 400.0).abs() < 1e-9);
        assert!((p.fixed_ms - 100.0).abs() < 1e-9);
        assert_eq!(p.host_others, None);
        // Besides the worker, the host kept half a CPU busy throughout: 1.5 CPUs while the
        // worker decoded, 0.55 after.
        let decoding = 4_000_000_000u64;
        a.host_cpu = (0..=t / 50_000_000)
            .map(|k| {
                let ts = k * 50_000_000;
                let busy =
                    ts.min(decoding) as f64 * 1.5 + ts.saturating_sub(decoding) as f64 * 0.55;
                HostCpuReading {
                    ts_ns: ts,
                    busy_ns: busy as u64,
                    total_ns: 2 * ts,
                }
            })
            .collect();
        let others = cpu_bound_loader(&a, &g).unwrap().host_others.unwrap();
        assert!((others - 0.5).abs() < 0.05, "{others}");
        // Without the workers' states per step there is nothing to weigh.
        for p in &mut g.step_parts {
            p.workers = [0.0; 3];
        }
        assert!(cpu_bound_loader(&a, &g).is_none());
    }

    #[test]
    fn enough_free_cpus_give_the_workers_that_feed_the_gpu() {
        // 400 ms of CPU a batch, a batch every 100 ms: 4 workers, on 6 free CPUs.
        assert_eq!(
            size_loader(400.0, 100.0, 400.0, 6.0, 1),
            Sizing::Feeds { workers: 4 }
        );
    }

    #[test]
    fn too_few_cpus_bound_the_workers_and_name_a_cpu_budget() {
        // 1.8 free beside the one worker: room for 2, a batch every 222 ms, not 400.
        let s = size_loader(400.0, 100.0, 400.0, 1.8, 1);
        let Sizing::Bounded {
            workers,
            speedup,
            budget_ms,
        } = s
        else {
            panic!("{s:?}")
        };
        assert_eq!(workers, 2);
        assert!((speedup - 1.8).abs() < 1e-9, "{s:?}");
        assert!((budget_ms - 200.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn a_cpu_free_in_part_still_takes_a_worker() {
        // 1.4 free beside the one worker: two workers make a batch every 286 ms, not 400.
        let s = size_loader(400.0, 100.0, 400.0, 1.4, 1);
        let Sizing::Bounded {
            workers, speedup, ..
        } = s
        else {
            panic!("{s:?}")
        };
        assert_eq!(workers, 2);
        assert!((speedup - 1.4).abs() < 1e-9, "{s:?}");
        // 1.02 free: the second worker would gain 2%, below the least gain advised.
        assert!(matches!(
            size_loader(400.0, 100.0, 400.0, 1.02, 1),
            Sizing::Saturated { .. }
        ));
    }

    #[test]
    fn saturated_cpus_say_more_workers_will_not_help() {
        // Two workers on two CPUs already: only a cheaper batch helps.
        assert_eq!(
            size_loader(400.0, 100.0, 200.0, 2.0, 2),
            Sizing::Saturated { budget_ms: 200.0 }
        );
    }

    #[test]
    fn a_function_is_the_deepest_python_frame_else_the_deepest_outside_the_kernel() {
        let frames = |f: &[&str]| f.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            function(&frames(&[
                "main",
                "step (train.py:10)",
                "memcpy",
                "do_syscall_64_[k]"
            ])),
            Some("step (train.py:10)")
        );
        assert_eq!(
            function(&frames(&["main", "burn", "do_syscall_64_[k]"])),
            Some("burn")
        );
    }

    #[test]
    fn ranks_waiting_alike_get_one_advice_naming_the_others() {
        let wait = |gpu, speedup| Advice {
            cause: Cause::NcclWait,
            gpu,
            change: "fix the straggler".into(),
            expected_speedup: speedup,
            evidence: vec!["without the wait".into()],
            settings: BTreeMap::new(),
        };
        let disk = Advice {
            cause: Cause::Disk,
            ..wait(3, 3.9)
        };
        let mut advice = vec![disk.clone(), wait(0, 3.8), wait(1, 3.7), wait(2, 1.1)];
        merge_alike(&mut advice);
        assert_eq!(advice.len(), 2);
        assert_eq!(advice[0], disk);
        assert_eq!(
            advice[1].evidence,
            ["without the wait", "also GPU 1 (3.7×), 2 (1.1×)"]
        );
    }
}
