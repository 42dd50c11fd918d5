//! What the ranks of a data-parallel run share: a control block the parent maps before it
//! forks them (the NCCL unique id travels through it, and the step at which everyone stops),
//! and each rank's gradient all-reduces (see `ddp` for when a step makes them).
use std::{
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

use crate::{
    cuda::{DevicePtr, Gpu, Handle},
    ddp::Bucket,
    nccl::{Comm, Nccl, UniqueId},
    sys,
};

/// Gradients all-reduced every step, in buckets: 32 MiB of floats (~0.3 ms over the simulated
/// link).
pub const GRAD_BYTES: usize = 32 << 20;
/// How long a rank waits for rank 0's unique id.
const ID_WAIT: Duration = Duration::from_secs(60);

/// The control block, in anonymous shared memory mapped before the ranks fork.
pub struct Control {
    mem: sys::SharedMem,
}

/// Byte offsets in the control block.
const ID_AT: usize = 0;
const ID_READY_AT: usize = 128;
const LAST_STEP_AT: usize = 136;

impl Control {
    pub fn new() -> std::io::Result<Self> {
        let c = Self {
            mem: sys::SharedMem::new(4096)?,
        };
        c.last_step().store(u64::MAX, Ordering::Release);
        Ok(c)
    }

    fn id_ready(&self) -> &AtomicU32 {
        // SAFETY: in bounds, aligned, zero-filled at creation, only accessed as this atomic.
        unsafe { &*self.mem.as_ptr().add(ID_READY_AT).cast::<AtomicU32>() }
    }

    /// The last training step every rank runs; `u64::MAX` until rank 0 decides.
    fn last_step(&self) -> &AtomicU64 {
        // SAFETY: as for `id_ready`.
        unsafe { &*self.mem.as_ptr().add(LAST_STEP_AT).cast::<AtomicU64>() }
    }

    /// Rank 0 publishes the communicator's id.
    pub fn publish_id(&self, id: &UniqueId) {
        // SAFETY: the id's 128 bytes are in bounds and nobody reads them before `id_ready`.
        unsafe { std::ptr::copy_nonoverlapping(id.0.as_ptr(), self.mem.as_ptr().add(ID_AT), 128) };
        self.id_ready().store(1, Ordering::Release);
    }

    /// The other ranks wait for it.
    pub fn wait_id(&self) -> Result<UniqueId> {
        let start = Instant::now();
        while self.id_ready().load(Ordering::Acquire) == 0 {
            if start.elapsed() > ID_WAIT {
                bail!("rank 0 published no NCCL unique id within {ID_WAIT:?}");
            }
            sys::sleep(Duration::from_millis(1));
        }
        let mut id = UniqueId([0; 128]);
        // SAFETY: in bounds; published before `id_ready`, never written again.
        unsafe {
            std::ptr::copy_nonoverlapping(self.mem.as_ptr().add(ID_AT), id.0.as_mut_ptr(), 128)
        };
        Ok(id)
    }
}

/// One rank's side of the gradient all-reduce.
pub struct Ring<'a> {
    pub rank: usize,
    nccl: Nccl,
    comm: Option<Comm>,
    grads: DevicePtr,
    ctl: &'a Control,
}

impl<'a> Ring<'a> {
    /// Loads NCCL and joins the communicator of `ranks` (rank 0 makes its id); needs the
    /// rank's CUDA context current. Returns once every rank has joined.
    pub fn join(gpu: &Gpu, ctl: &'a Control, rank: usize, ranks: usize) -> Result<Self> {
        let nccl = Nccl::load()?;
        let id = if rank == 0 {
            let id = nccl.unique_id()?;
            ctl.publish_id(&id);
            id
        } else {
            ctl.wait_id()?
        };
        let grads = gpu.alloc(GRAD_BYTES)?;
        let comm = nccl.init_rank(ranks, id, rank)?;
        Ok(Self {
            rank,
            nccl,
            comm: Some(comm),
            grads,
            ctl,
        })
    }

    /// The gradients on the device (also what `.item()` reads back).
    pub fn grads(&self) -> DevicePtr {
        self.grads
    }

    /// Queues the in-place all-reduce of one bucket of the gradients on `stream`.
    pub fn all_reduce(&self, bucket: &Bucket, stream: Handle) -> Result<()> {
        let Some(comm) = &self.comm else {
            bail!("the communicator is gone");
        };
        if bucket.offset + bucket.bytes > GRAD_BYTES {
            bail!("bucket {bucket:?} is past the {GRAD_BYTES}-byte gradients");
        }
        let at = self.grads + bucket.offset as DevicePtr;
        self.nccl.all_reduce(comm, at, bucket.bytes / 4, stream)
    }

    /// Whether training step `k` (0-based) runs. Every rank must run the same steps, hence
    /// the same all-reduces, or one would wait forever in an all-reduce the others never
    /// join: rank 0 alone decides, from its clock, and publishes the last step at the top of
    /// the step, before it queues any of that step's all-reduces. A rank can start step k + 1
    /// only after its `.item()` sync of step k returned, and that sync is on the compute
    /// stream, which waited for the end event of each of step k's all-reduces: so all of them
    /// completed, the first included, and that one could not complete before rank 0 reached
    /// it, after its decision at step k. A rank therefore always sees a decision rank 0 took
    /// at step k (or earlier) when it asks about step k + 1.
    pub fn runs_step(&self, k: u64, time_is_up: bool) -> bool {
        let last = self.ctl.last_step();
        if self.rank == 0 && time_is_up {
            last.fetch_min(k, Ordering::AcqRel);
        }
        k <= last.load(Ordering::Acquire)
    }

    /// Leaves the communicator.
    pub fn leave(mut self) -> Result<()> {
        match self.comm.take() {
            Some(c) => self.nccl.destroy(c),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_travels_through_the_control_block() {
        let c = Control::new().unwrap();
        let mut id = UniqueId([0; 128]);
        id.0[0] = 7;
        id.0[127] = 9;
        c.publish_id(&id);
        let got = c.wait_id().unwrap();
        assert_eq!((got.0[0], got.0[127]), (7, 9));
        assert_eq!(c.last_step().load(Ordering::Acquire), u64::MAX);
    }
}
