//! Queuing operations on streams, and NCCL groups.
//!
//! An operation becomes one comm kernel on its stream (the busy wait, the default): it occupies
//! the GPU, publishes this rank's arrival, waits for the peers and then spins for the data
//! movement. With the idle wait it becomes two entries: a host function that publishes and
//! waits (the GPU idles meanwhile), then the stand-in kernel for the data movement (the GPU is
//! busy). The call itself returns at once, as NCCL's does. Operations between ncclGroupStart
//! and ncclGroupEnd are fused per (communicator, stream) into one such unit: all arrivals are
//! published before any wait, so a send and a receive in one group cannot deadlock.
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::comm::Comm;
use crate::cost::{self, Kind};
use crate::cuda::{Handle, cuda};
use crate::rendezvous::{Mark, Rendezvous};
use crate::types::{NCCL_INVALID_USAGE, NCCL_UNHANDLED_CUDA_ERROR, NcclResult};
use crate::wait::WaitMode;

/// One operation as called.
pub struct Queued {
    pub comm: Arc<Comm>,
    pub stream: usize,
    pub kind: Kind,
    /// The call's buffer size: count × element size.
    pub bytes: u64,
}

#[derive(Default)]
struct Group {
    depth: u32,
    pending: Vec<Queued>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::default();
}

pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Ends one level of grouping; the outermost end queues what the group collected.
pub fn end() -> NcclResult<()> {
    let ready = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(NCCL_INVALID_USAGE);
        }
        g.depth -= 1;
        Ok((g.depth == 0).then(|| std::mem::take(&mut g.pending)))
    })?;
    ready.map_or(Ok(()), submit)
}

/// Queues `op` now, or with its group.
pub fn enqueue(op: Queued) -> NcclResult<()> {
    let alone = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.pending.push(op);
            None
        } else {
            Some(op)
        }
    });
    alone.map_or(Ok(()), |op| submit(vec![op]))
}

/// What one wait on the stream does (a host function, or the comm kernel's wait): publish,
/// then wait for, these marks.
struct Step {
    comm: Arc<Comm>,
    rdv: Arc<Rendezvous>,
    rank: usize,
    marks: Vec<Mark>,
}

/// Queues `ops`, fused per (communicator, stream) in first-call order.
fn submit(ops: Vec<Queued>) -> NcclResult<()> {
    let mut batches: Vec<Vec<Queued>> = Vec::new();
    for op in ops {
        let key = (Arc::as_ptr(&op.comm), op.stream);
        match batches
            .iter_mut()
            .find(|b| (Arc::as_ptr(&b[0].comm), b[0].stream) == key)
        {
            Some(batch) => batch.push(op),
            None => batches.push(vec![op]),
        }
    }
    batches.into_iter().try_for_each(|b| submit_batch(&b))
}

fn submit_batch(batch: &[Queued]) -> NcclResult<()> {
    let comm = Arc::clone(&batch[0].comm);
    let stream = batch[0].stream as Handle;
    let cuda = cuda().map_err(|_| NCCL_UNHANDLED_CUDA_ERROR)?;
    let mut transfer_ns = 0;
    let marks: Vec<Mark> = {
        let mut c = comm.counters();
        batch
            .iter()
            .map(|op| {
                transfer_ns += cost::transfer_ns(
                    cost::bytes_moved(op.kind, op.bytes, comm.nranks),
                    comm.bytes_per_s,
                );
                match op.kind {
                    Kind::Send { peer } => {
                        c.sends[peer] += 1;
                        Mark::Send {
                            peer,
                            seq: c.sends[peer],
                        }
                    }
                    Kind::Recv { peer } => {
                        c.recvs[peer] += 1;
                        Mark::Recv {
                            peer,
                            seq: c.recvs[peer],
                        }
                    }
                    _ => {
                        c.collectives += 1;
                        Mark::Collective { seq: c.collectives }
                    }
                }
            })
            .collect()
    };
    let step = Box::new(Step {
        rdv: Arc::clone(&comm.rdv),
        rank: comm.rank,
        marks,
        comm: Arc::clone(&comm),
    });
    let data = Box::into_raw(step).cast::<c_void>();
    // Takes the box back when the driver refused the work: `run_step` will never run.
    let refused = |call: &str, rc| {
        // SAFETY: the driver did not queue `run_step`, so the box is still ours, once.
        drop(unsafe { Box::from_raw(data.cast::<Step>()) });
        eprintln!("simgpu: NCCL: {call} failed: {rc}");
        Err(NCCL_UNHANDLED_CUDA_ERROR)
    };
    match (comm.wait, cuda.launch_comm_kernel) {
        (WaitMode::Busy { sm_share_pct }, Some(launch)) => {
            // SAFETY: `run_step` takes back the box passed as `data`, exactly once, when the
            // stream reaches the kernel; the stream is the caller's.
            let rc = unsafe { launch(stream, Some(run_step), data, transfer_ns, sm_share_pct) };
            if rc != 0 {
                return refused("simgpuLaunchCommKernel", rc);
            }
        }
        _ => {
            // SAFETY: as above, when the stream reaches the host function.
            let rc = unsafe { (cuda.launch_host_func)(stream, run_step, data) };
            if rc != 0 {
                return refused("cuLaunchHostFunc", rc);
            }
            let rc = cuda.launch(comm.kernel(), transfer_ns, stream);
            if rc != 0 {
                eprintln!("simgpu: NCCL: cuLaunchKernel failed: {rc}");
                return Err(NCCL_UNHANDLED_CUDA_ERROR);
            }
        }
    }
    Ok(())
}

/// The wait: runs on the driver's engine thread once the stream gets here (the compute engine's
/// for a host function, the comm engine's inside a comm kernel).
unsafe extern "C" fn run_step(data: *mut c_void) {
    // SAFETY: `data` is the box `submit_batch` leaked for this call, handed back once.
    let step = unsafe { Box::from_raw(data.cast::<Step>()) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for m in &step.marks {
            step.rdv.arrive(step.rank, *m);
        }
        if let Err(e) = step.rdv.wait_ready(step.rank, &step.marks)
            && !step.comm.failed.swap(true, Ordering::AcqRel)
        {
            eprintln!("simgpu: NCCL rank {}: {e}; giving up on it", step.rank);
        }
    }));
}
