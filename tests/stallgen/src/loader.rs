//! The DataLoader: worker processes that fill shared-memory slots, and the feeder's side of
//! the slot protocol.
//!
//! Each worker owns [`PREFETCH`] slots. A slot index travels down the worker's `free` pipe
//! when the slot may be (re)filled and back up its `ready` pipe when it holds a batch; the
//! index itself is the only message. Worker `w` produces batches `w, w + n, w + 2n, …` and
//! the feeder takes them round-robin, as PyTorch's DataLoader does, so batches arrive in
//! order and a slow worker stalls the feeder even when the others are ahead.
use std::{
    fs::File,
    io,
    os::fd::{AsRawFd as _, RawFd},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use anyhow::{Context as _, Result, bail};

use crate::{scenario::Schedule, sys};

/// Batches in flight per worker (PyTorch's default prefetch_factor).
pub const PREFETCH: usize = 2;
/// Bytes in front of the slots: the run's t0, then the feeder's step time.
const HEADER_BYTES: usize = 4096;
/// Each batch starts with its sequence number (native-endian u64) so the feeder can check
/// the order.
pub const SEQ_BYTES: usize = 8;

/// The shared-memory region: a header with t0, then one slot per batch in flight.
pub struct Shared {
    mem: sys::SharedMem,
    slot_stride: usize,
    pub batch_bytes: usize,
}

impl Shared {
    /// Maps `slots` slots of `batch_bytes` each (at least one page).
    pub fn new(slots: usize, batch_bytes: usize) -> io::Result<Arc<Self>> {
        let batch_bytes = batch_bytes.max(4096);
        let slot_stride = batch_bytes.next_multiple_of(4096);
        let mem = sys::SharedMem::new(HEADER_BYTES + slots * slot_stride)?;
        Ok(Arc::new(Self {
            mem,
            slot_stride,
            batch_bytes,
        }))
    }

    fn header(&self, i: usize) -> &AtomicU64 {
        assert!((i + 1) * 8 <= HEADER_BYTES);
        // SAFETY: the mapping is page-aligned, at least HEADER_BYTES long, zero-filled at
        // creation, and its header words are only ever accessed as these atomics.
        unsafe { &*self.mem.as_ptr().cast::<AtomicU64>().add(i) }
    }

    fn t0(&self) -> &AtomicU64 {
        self.header(0)
    }

    /// Publishes how long the feeder's last steps took without their wait for a batch (a
    /// moving average, ns): what the GPU side of the job needs per batch.
    pub fn set_feeder_step_ns(&self, ns: u64) {
        self.header(1).store(ns, Ordering::Release);
    }

    /// The feeder's step time as last published; 0 before its first step.
    pub fn feeder_step_ns(&self) -> u64 {
        self.header(1).load(Ordering::Acquire)
    }

    /// Publishes the run's start (CLOCK_MONOTONIC ns) to every process.
    pub fn set_t0(&self, t0_ns: u64) {
        self.t0().store(t0_ns, Ordering::Release);
    }

    /// The phase in force now; phase 0 until t0 is published.
    pub fn phase_now(&self, schedule: &Schedule) -> usize {
        match self.t0().load(Ordering::Acquire) {
            0 => 0,
            t0 => schedule.index_at(sys::monotonic_ns().saturating_sub(t0)),
        }
    }

    /// The start of slot `i`.
    pub fn slot_ptr(&self, i: usize) -> *mut u8 {
        let off = HEADER_BYTES + i * self.slot_stride;
        assert!(
            off + self.slot_stride <= self.mem.len(),
            "slot {i} out of range"
        );
        // SAFETY: in bounds of the mapping, checked above.
        unsafe { self.mem.as_ptr().add(off) }
    }

    /// Slot `i` as a byte slice for its current owner.
    ///
    /// # Safety
    /// The caller must own the slot under the slot protocol: nobody else touches it until the
    /// caller passes its index on.
    #[expect(
        clippy::mut_from_ref,
        reason = "ownership is handed over through the pipes"
    )]
    pub unsafe fn slot_mut(&self, i: usize) -> &mut [u8] {
        // SAFETY: the slot is batch_bytes long and exclusively ours (see above).
        unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(i), self.batch_bytes) }
    }
}

/// Reads a batch's sequence number from the start of its slot.
pub fn read_seq(batch: &[u8]) -> u64 {
    let mut b = [0u8; SEQ_BYTES];
    b.copy_from_slice(&batch[..SEQ_BYTES]);
    u64::from_ne_bytes(b)
}

/// The parent's ends of one worker's pipes.
struct Link {
    pid: libc::pid_t,
    ready: File,
    free: File,
}

/// A batch the feeder holds: which worker's slot, and where its bytes are.
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    pub worker: usize,
    pub slot: u32,
    pub ptr: *const u8,
}

/// The feeder's side: worker pipes, round-robin order and the expected next sequence number.
pub struct Loader {
    shared: Arc<Shared>,
    links: Vec<Link>,
    next_worker: usize,
    next_seq: u64,
}

// SAFETY: the raw pointers in flight point into the shared mapping, which `shared` keeps
// alive; moving the loader to the pin-memory thread moves the only user.
unsafe impl Send for Loader {}

/// What a forked worker runs, given its id and its ends of the pipes (ready: write, free: read).
pub type WorkerBody<'a> = dyn Fn(usize, &mut File, &mut File) -> io::Result<()> + 'a;

impl Loader {
    /// Forks `workers` worker processes named `pt_data_worker`. Call while single-threaded.
    pub fn spawn(shared: Arc<Shared>, workers: usize, body: &WorkerBody<'_>) -> Result<Self> {
        Self::start(shared, workers, |w, mut ready, mut free, parent_fds| {
            sys::fork_child("pt_data_worker", || {
                // Without this a worker would hold other workers' (and its own) parent ends
                // open, and never see end-of-file when the feeder goes away.
                sys::close_fds(parent_fds);
                body(w, &mut ready, &mut free)
            })
        })
    }

    /// Makes each worker's pipes, queues its free slots, and has `launch` start it with its
    /// ends (ready: write, free: read) and the parent's ends it must close.
    fn start(
        shared: Arc<Shared>,
        workers: usize,
        mut launch: impl FnMut(usize, File, File, &[RawFd]) -> io::Result<libc::pid_t>,
    ) -> Result<Self> {
        let mut links: Vec<Link> = Vec::with_capacity(workers);
        for w in 0..workers {
            let (ready_r, ready_w) = sys::pipe()?;
            let (free_r, mut free_w) = sys::pipe()?;
            for s in w * PREFETCH..(w + 1) * PREFETCH {
                sys::send_u32(&mut free_w, s as u32)?;
            }
            let mut parent_fds: Vec<RawFd> = links
                .iter()
                .flat_map(|l| [l.ready.as_raw_fd(), l.free.as_raw_fd()])
                .collect();
            parent_fds.extend([ready_r.as_raw_fd(), free_w.as_raw_fd()]);
            // The worker's ends close here once launched, so only the worker holds them.
            let pid = launch(w, ready_w, free_r, &parent_fds)
                .with_context(|| format!("starting DataLoader worker {w}"))?;
            links.push(Link {
                pid,
                ready: ready_r,
                free: free_w,
            });
        }
        Ok(Self {
            shared,
            links,
            next_worker: 0,
            next_seq: 0,
        })
    }

    pub fn pids(&self) -> Vec<libc::pid_t> {
        self.links.iter().map(|l| l.pid).collect()
    }

    /// The parent's pipe ends, which any later child must close.
    pub fn parent_fds(&self) -> Vec<RawFd> {
        self.links
            .iter()
            .flat_map(|l| [l.ready.as_raw_fd(), l.free.as_raw_fd()])
            .collect()
    }

    /// Waits for the next batch in order (blocking off-CPU in a pipe read).
    pub fn next_batch(&mut self) -> Result<Batch> {
        let w = self.next_worker;
        let n = self.links.len();
        let slot = sys::recv_u32(&mut self.links[w].ready)
            .with_context(|| format!("reading DataLoader worker {w}'s pipe"))?;
        let Some(slot) = slot else {
            bail!("DataLoader worker {w} (pid {}) exited", self.links[w].pid);
        };
        let owned = w * PREFETCH..(w + 1) * PREFETCH;
        if !owned.contains(&(slot as usize)) {
            bail!("DataLoader worker {w} sent slot {slot}, which is not one of its own");
        }
        // SAFETY: the worker handed the slot over; it is ours until `release`.
        let seq = read_seq(unsafe { self.shared.slot_mut(slot as usize) });
        if seq != self.next_seq {
            bail!("batch out of order: expected {}, got {seq}", self.next_seq);
        }
        self.next_worker = (w + 1) % n;
        self.next_seq += 1;
        Ok(Batch {
            worker: w,
            slot,
            ptr: self.shared.slot_ptr(slot as usize),
        })
    }

    /// Hands the batch's slot back to its worker for refilling.
    pub fn release(&mut self, b: Batch) -> Result<()> {
        sys::send_u32(&mut self.links[b.worker].free, b.slot)
            .with_context(|| format!("returning slot {} to worker {}", b.slot, b.worker))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::thread;

    use super::*;
    use crate::{
        scenario::{Overrides, Scenario},
        work::{WorkerEnv, run_worker},
    };

    /// Runs the real worker loop on threads instead of processes.
    pub(crate) fn loader_on_threads(
        workers: usize,
    ) -> (Loader, Vec<thread::JoinHandle<io::Result<()>>>) {
        let shared = Shared::new(workers * PREFETCH, 8192).unwrap();
        let quick = Overrides {
            transform_ms: Some(0.0),
            ..Overrides::default()
        };
        let env = Arc::new(WorkerEnv {
            shared: Arc::clone(&shared),
            schedule: Schedule::new(Scenario::Healthy, &[], 1.0, 1, 1, &quick),
            workers,
            dataset: None,
            loader_lag: None,
        });
        let mut handles = Vec::new();
        let loader = Loader::start(shared, workers, |w, mut ready, mut free, _| {
            let env = Arc::clone(&env);
            handles.push(thread::spawn(move || {
                run_worker(&env, w, &mut ready, &mut free)
            }));
            Ok(0)
        })
        .unwrap();
        (loader, handles)
    }

    #[test]
    fn batches_arrive_in_order_from_each_workers_own_slots() {
        let (mut loader, handles) = loader_on_threads(3);
        for seq in 0..40u64 {
            let b = loader.next_batch().unwrap();
            assert_eq!(b.worker, (seq % 3) as usize, "round-robin");
            assert_eq!(b.slot as usize / PREFETCH, b.worker);
            // SAFETY: the batch is ours until released.
            let bytes = unsafe { std::slice::from_raw_parts(b.ptr, 8192) };
            assert_eq!(read_seq(bytes), seq);
            assert!(bytes[SEQ_BYTES..].iter().all(|&x| x == seq as u8 | 1));
            loader.release(b).unwrap();
        }
        drop(loader);
        for h in handles {
            h.join().unwrap().unwrap();
        }
    }

    #[test]
    fn a_worker_cannot_hand_over_another_workers_slot() {
        let shared = Shared::new(2 * PREFETCH, 4096).unwrap();
        let mut keep = Vec::new();
        let mut loader = Loader::start(shared, 2, |w, mut ready, free, _| {
            if w == 0 {
                sys::send_u32(&mut ready, 3)?;
            }
            keep.push((ready, free));
            Ok(0)
        })
        .unwrap();
        let e = loader.next_batch().unwrap_err().to_string();
        assert!(e.contains("not one of its own"), "{e}");
    }
}
