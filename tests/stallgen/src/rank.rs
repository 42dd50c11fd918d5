//! What the ranks of a data-parallel run share: a control block (the NCCL unique id travels
//! through it, and the step at which everyone stops), and each rank's gradient all-reduces
//! (see `ddp` for when a step makes them). The block is anonymous memory the parent maps
//! before it forks its ranks, or, when the job's ranks are spread over several stallgen
//! processes (one per simulated host, as torchrun runs one agent per node), a file they all
//! map: `--rendezvous`.
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

/// The control block, in shared memory mapped before the ranks fork.
pub struct Control {
    mem: sys::SharedMem,
}

/// Byte offsets in the control block.
const ID_AT: usize = 0;
const ID_READY_AT: usize = 128;
const STEP_LIMIT_AT: usize = 136;

impl Control {
    const BYTES: usize = 4096;

    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            mem: sys::SharedMem::new(Self::BYTES)?,
        })
    }

    /// The block in `path`, shared by the stallgen processes of one job. Zeros are a fresh
    /// block, so whichever process comes first makes it; the one holding rank 0 refuses a
    /// block that already carries an id, an earlier job's.
    pub fn open(path: &std::path::Path, holds_rank0: bool) -> Result<Self> {
        let c = Self {
            mem: sys::SharedMem::of_file(path, Self::BYTES).map_err(|e| {
                anyhow::anyhow!("mapping the rendezvous file {}: {e}", path.display())
            })?,
        };
        if holds_rank0 && c.id_ready().load(Ordering::Acquire) != 0 {
            bail!(
                "the rendezvous file {} holds an earlier job's NCCL id: remove it, or name a new one",
                path.display()
            );
        }
        Ok(c)
    }

    fn id_ready(&self) -> &AtomicU32 {
        // SAFETY: in bounds, aligned, zero-filled at creation, only accessed as this atomic.
        unsafe { &*self.mem.as_ptr().add(ID_READY_AT).cast::<AtomicU32>() }
    }

    /// One past the last training step every rank runs; 0 until rank 0 decides.
    fn step_limit(&self) -> &AtomicU64 {
        // SAFETY: as for `id_ready`.
        unsafe { &*self.mem.as_ptr().add(STEP_LIMIT_AT).cast::<AtomicU64>() }
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
        let limit = self.ctl.step_limit();
        if self.rank == 0 && time_is_up && limit.load(Ordering::Acquire) == 0 {
            limit.store(k + 1, Ordering::Release);
        }
        match limit.load(Ordering::Acquire) {
            0 => true,
            limit => k < limit,
        }
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
        assert_eq!(c.step_limit().load(Ordering::Acquire), 0);
    }

    #[test]
    fn launchers_share_the_block_through_the_rendezvous_file() {
        let path = std::env::temp_dir().join(format!("stallgen-rdv-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let other = Control::open(&path, false).unwrap();
        let first = Control::open(&path, true).unwrap();
        let mut id = UniqueId([0; 128]);
        id.0[5] = 42;
        first.publish_id(&id);
        assert_eq!(other.wait_id().unwrap().0[5], 42);
        let err = Control::open(&path, true)
            .err()
            .expect("a used block is refused");
        assert!(err.to_string().contains("earlier job"), "{err}");
        std::fs::remove_file(&path).unwrap();
    }
}
