//! A data-parallel step in the shape PyTorch's DistributedDataParallel gives it, so that the
//! profiler is tested against the calls a real job makes rather than one all-reduce the host
//! waits for:
//! - the forward kernels, then the backward kernels in gradient buckets, on the compute stream;
//! - as each bucket's gradients are ready (its backward kernels queued), ProcessGroupNCCL
//!   records an event on the compute stream, makes its NCCL stream wait for it and queues the
//!   bucket's all-reduce there, then records the work's end event on the NCCL stream;
//! - once the backward pass is queued, the reducer's `finalize_backward` waits for each
//!   bucket's work (`WorkNCCL::wait()`: the compute stream waits for its end event, the host
//!   does not), and the optimizer step follows on the compute stream;
//! - the host blocks only in `loss.item()`: a 4-byte device-to-host copy into pinned memory
//!   on the compute stream (PyTorch ≥ 2.1 pins it) and a sync of that stream.
//!
//! The compute stream waits for every end event, so its sync implies that the step's
//! all-reduces completed, which [`Ring::runs_step`] relies on.
use anyhow::{Result, bail};

use crate::{
    cuda::{Gpu, Handle},
    rank::{Control, GRAD_BYTES, Ring},
    scenario::Knobs,
};

/// Gradient buckets per step when `--buckets` is not given: what DDP's 25 MiB bucket cap
/// makes of a model a few times that size.
pub const DEFAULT_BUCKETS: usize = 4;
/// Most buckets `--buckets` takes.
pub const MAX_BUCKETS: usize = 64;
/// The optimizer step takes 1/OPTIMIZER_SHARE of the step's kernel time, in one kernel.
const OPTIMIZER_SHARE: u64 = 20;
/// What `loss.item()` reads back: one float.
pub const ITEM_BYTES: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The job's stream: copies, kernels, `.item()`.
    Compute,
    /// ProcessGroupNCCL's stream (non-blocking).
    Nccl,
}

/// The events of bucket `b`, reused every step (each wait takes the event's latest record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Recorded on the compute stream once the bucket's backward kernels are queued.
    Ready(usize),
    /// Recorded on the NCCL stream after the bucket's all-reduce.
    End(usize),
}

/// A bucket's share of the gradients: bytes `offset..offset + bytes` of the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub index: usize,
    pub offset: usize,
    pub bytes: usize,
}

/// One call of a step, in the order the feeder makes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// cuLaunchKernel of the spin kernel for this many ns on the compute stream.
    Kernel(u64),
    /// cuEventRecord(event, stream).
    Record(Event, Stream),
    /// cuStreamWaitEvent(stream, event).
    Wait(Stream, Event),
    /// ncclAllReduce of the bucket, in place, on the NCCL stream.
    AllReduce(Bucket),
}

/// What a step queues before `.item()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepPlan {
    pub ops: Vec<Op>,
}

/// `total` in `n` parts (n ≥ 1) that differ by at most one and add up to it exactly.
fn split(total: u64, n: u64) -> impl Iterator<Item = u64> {
    let n = n.max(1);
    (0..n).map(move |i| total / n + u64::from(i < total % n))
}

impl StepPlan {
    /// The step of `kernels` kernels of `kernel_ns` each, as DDP runs it with `buckets`
    /// buckets of `grad_bytes` (a multiple of 4: floats). The kernel time adds up to
    /// `kernels × kernel_ns` exactly, as in an unranked step, so steps/s and the scenarios'
    /// sizing compare; only the launches differ: half the kernels forward (at least one),
    /// the other half spread over the buckets (at least one each), one optimizer kernel.
    pub fn new(kernels: u32, kernel_ns: u64, buckets: usize, grad_bytes: usize) -> Self {
        let buckets = buckets.max(1);
        let total = u64::from(kernels) * kernel_ns;
        let optimizer = total / OPTIMIZER_SHARE;
        let forward = (total - optimizer) / 2;
        let backward = total - optimizer - forward;
        let forward_n = u64::from(kernels / 2).max(1);
        let per_bucket = (u64::from(kernels - kernels / 2) / buckets as u64).max(1);
        let mut ops: Vec<Op> = split(forward, forward_n).map(Op::Kernel).collect();
        let floats = split((grad_bytes / 4) as u64, buckets as u64);
        let mut offset = 0;
        for ((index, ns), floats) in split(backward, buckets as u64).enumerate().zip(floats) {
            ops.extend(split(ns, per_bucket).map(Op::Kernel));
            let bytes = floats as usize * 4;
            ops.extend([
                Op::Record(Event::Ready(index), Stream::Compute),
                Op::Wait(Stream::Nccl, Event::Ready(index)),
                Op::AllReduce(Bucket {
                    index,
                    offset,
                    bytes,
                }),
                Op::Record(Event::End(index), Stream::Nccl),
            ]);
            offset += bytes;
        }
        ops.extend((0..buckets).map(|b| Op::Wait(Stream::Compute, Event::End(b))));
        ops.push(Op::Kernel(optimizer));
        Self { ops }
    }

    /// The kernel time the step asks for.
    pub fn kernel_ns(&self) -> u64 {
        self.kernels().sum()
    }

    /// Kernels the step launches.
    pub fn launches(&self) -> u64 {
        self.kernels().count() as u64
    }

    fn kernels(&self) -> impl Iterator<Item = u64> + '_ {
        self.ops.iter().filter_map(|op| match op {
            Op::Kernel(ns) => Some(*ns),
            _ => None,
        })
    }
}

/// A rank's place in a data-parallel run.
#[derive(Clone, Copy)]
pub struct Seat<'a> {
    pub ctl: &'a Control,
    /// Its rank in the job, of `ranks`.
    pub rank: usize,
    pub ranks: usize,
    /// This host's GPU it runs on.
    pub gpu: usize,
    pub buckets: usize,
    /// How many times longer than asked the rank's GPU runs kernels (throttled), so that the
    /// busy time it reports is what NVML sees.
    pub busy_scale: f64,
}

/// One rank's DDP machinery: the communicator, the NCCL stream, the buckets' events, and the
/// pinned word `.item()` lands in.
pub struct Ddp<'a> {
    pub ring: Ring<'a>,
    buckets: usize,
    busy_scale: f64,
    nccl_stream: Handle,
    ready: Vec<Handle>,
    end: Vec<Handle>,
    item: *mut u8,
}

impl<'a> Ddp<'a> {
    /// Sets up the rank's streams and events and joins the communicator (see [`Ring::join`]);
    /// needs the rank's context current.
    pub fn join(gpu: &Gpu, seat: &Seat<'a>) -> Result<Self> {
        if !(1..=MAX_BUCKETS).contains(&seat.buckets) {
            bail!("{} gradient buckets: want 1..={MAX_BUCKETS}", seat.buckets);
        }
        // Before joining: every rank fails alike here, none waits for the others.
        gpu.require_stream_wait_event()?;
        let nccl_stream = gpu.stream_create_nonblocking()?;
        let events = || {
            (0..seat.buckets)
                .map(|_| gpu.event_create())
                .collect::<Result<Vec<_>>>()
        };
        let (ready, end) = (events()?, events()?);
        let item = gpu.host_alloc(ITEM_BYTES)?;
        let ring = Ring::join(gpu, seat.ctl, seat.rank, seat.ranks)?;
        Ok(Self {
            ring,
            buckets: seat.buckets,
            busy_scale: seat.busy_scale,
            nccl_stream,
            ready,
            end,
            item,
        })
    }

    /// The step a phase with `knobs` runs.
    pub fn plan(&self, knobs: &Knobs) -> StepPlan {
        StepPlan::new(knobs.kernels, knobs.kernel_ns(), self.buckets, GRAD_BYTES)
    }

    /// The GPU's busy time for `plan`'s kernels, as NVML counts it.
    pub fn busy_ns(&self, plan: &StepPlan) -> u64 {
        (plan.kernel_ns() as f64 * self.busy_scale) as u64
    }

    /// Queues `plan`; returns without waiting for the GPU or the other ranks.
    pub fn launch(&self, gpu: &Gpu, plan: &StepPlan) -> Result<()> {
        let stream = |s: Stream| match s {
            Stream::Compute => gpu.stream(),
            Stream::Nccl => self.nccl_stream,
        };
        let event = |e: Event| match e {
            Event::Ready(b) => self.ready[b],
            Event::End(b) => self.end[b],
        };
        for op in &plan.ops {
            match *op {
                Op::Kernel(ns) => gpu.launch_spin(ns)?,
                Op::Record(e, s) => gpu.event_record(event(e), stream(s))?,
                Op::Wait(s, e) => gpu.stream_wait_event(stream(s), event(e))?,
                Op::AllReduce(b) => self.ring.all_reduce(&b, self.nccl_stream)?,
            }
        }
        Ok(())
    }

    /// `loss.item()`: copy 4 bytes back on the compute stream, then wait for that stream:
    /// after the optimizer, which waited for every bucket's all-reduce.
    pub fn item(&self, gpu: &Gpu) -> Result<u32> {
        // SAFETY: the gradients hold GRAD_BYTES ≥ ITEM_BYTES on the device; `item` is pinned,
        // ITEM_BYTES long, and read only after the sync below.
        unsafe { gpu.copy_out_async(self.item, self.ring.grads(), ITEM_BYTES)? };
        gpu.sync()?;
        // SAFETY: the copy is complete (its stream synchronised) and `item` holds 4 bytes.
        Ok(unsafe { self.item.cast::<u32>().read_unaligned() })
    }

    /// Leaves the communicator and frees the streams and events (their work is done: the
    /// last `.item()` waited for it).
    pub fn leave(self, gpu: &Gpu) -> Result<()> {
        self.ring.leave()?;
        for e in self.ready.iter().chain(&self.end) {
            gpu.event_destroy(*e)?;
        }
        gpu.stream_destroy(self.nccl_stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn buckets(p: &StepPlan) -> Vec<Bucket> {
        p.ops
            .iter()
            .filter_map(|op| match op {
                Op::AllReduce(b) => Some(*b),
                _ => None,
            })
            .collect()
    }

    fn position(p: &StepPlan, want: Op) -> usize {
        let at = p.ops.iter().position(|op| *op == want);
        at.unwrap_or_else(|| panic!("{want:?} is not in {:?}", p.ops))
    }

    #[test]
    fn the_step_keeps_its_kernel_time_and_gradients() {
        for (kernels, ns, n) in [
            (4, 25 * MS, 4),
            (4, 25 * MS, 1),
            (4, 25 * MS, 3),
            (4000, 2_000, 4),
            (1, 7, 5),
            (0, 25 * MS, 4),
            (7, 1_234_567, 64),
        ] {
            let p = StepPlan::new(kernels, ns, n, GRAD_BYTES);
            assert_eq!(
                p.kernel_ns(),
                u64::from(kernels) * ns,
                "{kernels}×{ns} in {n}"
            );
            let b = buckets(&p);
            assert_eq!(b.len(), n);
            assert_eq!(b.iter().map(|b| b.bytes).sum::<usize>(), GRAD_BYTES);
            let mut offset = 0;
            for (i, b) in b.iter().enumerate() {
                assert_eq!((b.index, b.offset), (i, offset), "contiguous, in order");
                assert!(b.bytes % 4 == 0 && b.bytes > 0, "whole floats: {b:?}");
                offset += b.bytes;
            }
        }
    }

    #[test]
    fn the_default_step_is_forward_backward_in_buckets_then_optimizer() {
        let p = StepPlan::new(4, 25 * MS, 4, GRAD_BYTES);
        let kernels: Vec<u64> = p.kernels().collect();
        // 5 ms optimizer; 47.5 ms forward in two kernels, 47.5 ms backward in four buckets.
        assert_eq!(kernels.len(), 7);
        assert_eq!(&kernels[..2], [23_750_000, 23_750_000]);
        assert_eq!(&kernels[2..6], [11_875_000; 4]);
        assert_eq!(kernels[6], 5 * MS);
        assert!(buckets(&p).iter().all(|b| b.bytes == 8 << 20));
        assert_eq!(p.launches(), 7);
    }

    #[test]
    fn each_all_reduce_waits_for_its_gradients_and_the_optimizer_for_every_all_reduce() {
        let n = 4;
        let p = StepPlan::new(8, MS, n, GRAD_BYTES);
        let last_kernel = p.ops.len() - 1;
        assert!(
            matches!(p.ops[last_kernel], Op::Kernel(_)),
            "the optimizer ends it"
        );
        let mut kernels_before = Vec::new();
        for b in 0..n {
            let ready = position(&p, Op::Record(Event::Ready(b), Stream::Compute));
            let wait = position(&p, Op::Wait(Stream::Nccl, Event::Ready(b)));
            let reduce = p
                .ops
                .iter()
                .position(|op| matches!(op, Op::AllReduce(x) if x.index == b))
                .unwrap();
            let end = position(&p, Op::Record(Event::End(b), Stream::Nccl));
            let joined = position(&p, Op::Wait(Stream::Compute, Event::End(b)));
            // The calls of one bucket come back to back, in this order.
            assert_eq!(
                [wait, reduce, end],
                [ready + 1, ready + 2, ready + 3],
                "{:?}",
                p.ops
            );
            // Its gradients' kernels come right before; the compute stream waits for the end
            // after the whole backward pass was queued, before the optimizer.
            assert!(matches!(p.ops[ready - 1], Op::Kernel(_)));
            assert!(joined > position(&p, Op::Record(Event::End(n - 1), Stream::Nccl)));
            assert!(joined < last_kernel);
            kernels_before.push(
                p.ops[..ready]
                    .iter()
                    .filter(|o| matches!(o, Op::Kernel(_)))
                    .count(),
            );
        }
        // Forward (4 kernels), then one bucket's backward (1 kernel) per bucket.
        assert_eq!(kernels_before, [5, 6, 7, 8]);
    }
}
