//! A device: queued operations and the three engine threads (compute, copy, comm) that run them
//! with real timing. Each GPU a process uses has its own set.
//!
//! The compute engine runs kernels and host functions, the copy engine copies, and the comm
//! engine the NCCL stand-in's kernels (`simgpuLaunchCommKernel`): so a collective on its own
//! stream runs while compute kernels run, on its own lane of the GPU (`simgpu_state::Lane`), as
//! NCCL's kernel runs beside the compute kernels of a data-parallel job.
//!
//! Each operation carries the operations it must wait for: its stream predecessors and the
//! events the stream was told to wait for (cuStreamWaitEvent), see `tables`. Every dependency
//! was submitted earlier (submission is serialized by the handle tables' lock, and an event's
//! work is queued before anything can wait for it), and each engine runs its queue in
//! submission order. So the earliest-submitted pending operation of the whole process has all
//! its dependencies done and heads its engine's queue: it can always run, and no engine ever
//! waits on itself or in a cycle with the others. (What a host function or a comm kernel's
//! rendezvous waits for in another process is outside this argument, as on a real GPU.)
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use simgpu_state::clock::monotonic_ns;
use simgpu_state::{Direction, Gpu, Lane};

use crate::staging::StagingPool;
use crate::wait::device_wait_until;

/// A kernel's duration is clamped to this: a launch whose first parameter is a pointer rather
/// than a duration would otherwise occupy the device for hours.
pub const MAX_KERNEL_NS: u64 = 60_000_000_000;
/// Device-to-device copy rate (HBM read plus write), bytes per second.
const DEVICE_COPY_BYTES_PER_S: f64 = 1.5e12;

/// Where a copy reads from.
pub enum Source {
    /// Memory the caller keeps alive until the copy completes (pinned host or device backing).
    Addr(usize),
    /// Pageable host data the calling thread already staged (a pool buffer, maybe longer).
    Staged(Box<[u8]>),
}

/// What a copy moves between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
    HostToHost,
}

/// A host function queued with cuLaunchHostFunc (`CUhostFn`).
pub type HostFn = unsafe extern "C" fn(*mut std::ffi::c_void);

/// The work of one operation.
pub enum Work {
    Kernel {
        duration_ns: u64,
        /// Percent of the SMs the kernel keeps active (GPM's SM activity).
        sm_share_pct: u32,
    },
    /// A kernel on the comm lane (the NCCL stand-in's): it starts, so the GPU counts as busy,
    /// then calls `wait(data)` (the rendezvous with the other ranks) and spins for
    /// `transfer_ns`, as NCCL's kernel spins until its peers arrive and then moves the data.
    CommKernel {
        wait: Option<HostFn>,
        /// The pointer passed to `wait`, as given.
        data: usize,
        transfer_ns: u64,
        sm_share_pct: u32,
    },
    /// Runs on the compute engine, in stream order, while the GPU counts as idle (no kernel
    /// runs); later work of the stream waits for it to return.
    Host {
        func: HostFn,
        /// The `userData` pointer, passed back to `func` as given.
        data: usize,
    },
    Copy {
        kind: CopyKind,
        source: Source,
        /// Destination address (device backing or host memory), valid for `bytes`.
        dest: usize,
        bytes: usize,
    },
}

impl Work {
    fn engine(&self) -> EngineKind {
        match self {
            Work::Kernel { .. } | Work::Host { .. } => EngineKind::Compute,
            Work::Copy { .. } => EngineKind::Copy,
            Work::CommKernel { .. } => EngineKind::Comm,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EngineKind {
    Compute,
    Copy,
    Comm,
}

/// One queued operation.
pub struct Op {
    work: Mutex<Option<Work>>,
    /// Cleared once satisfied, so a long stream does not keep its whole history alive.
    deps: Mutex<Vec<Arc<Op>>>,
    /// CLOCK_MONOTONIC ns at completion; 0 while pending.
    done_ns: AtomicU64,
}

impl Op {
    /// Whether the device has finished this operation.
    pub fn is_done(&self) -> bool {
        self.done_ns.load(Ordering::Acquire) != 0
    }

    /// When it finished (CLOCK_MONOTONIC ns), once it has.
    pub fn done_ns(&self) -> Option<u64> {
        match self.done_ns.load(Ordering::Acquire) {
            0 => None,
            ns => Some(ns),
        }
    }

    fn finish(&self) {
        self.done_ns.store(monotonic_ns().max(1), Ordering::Release);
    }
}

/// Locks `m`, ignoring poisoning: a panic elsewhere must not wedge the device.
pub fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Queue {
    ops: Mutex<VecDeque<Arc<Op>>>,
    more: Condvar,
    /// Operations queued and not yet taken, readable without the lock.
    queued: AtomicU64,
    /// Whether the engine sleeps on `more`: only then does a submission wake it.
    parked: AtomicBool,
}

/// How long an engine with nothing to do looks for more before it sleeps. A GPU's front end
/// takes the next launch without any host thread waking; an engine that slept at every gap
/// made a launch-bound loop cost two context switches and a futex call per kernel, which a
/// real driver's launch does not.
const LOOK_FOR_WORK_NS: u64 = 100_000;

impl Queue {
    const fn new() -> Self {
        Queue {
            ops: Mutex::new(VecDeque::new()),
            more: Condvar::new(),
            queued: AtomicU64::new(0),
            parked: AtomicBool::new(false),
        }
    }

    fn push(&self, op: Arc<Op>) {
        let mut ops = locked(&self.ops);
        ops.push_back(op);
        self.queued.fetch_add(1, Ordering::Release);
        // Read under the lock, which the engine holds from its last look until it sleeps.
        let wake = self.parked.load(Ordering::Acquire);
        drop(ops);
        if wake {
            self.more.notify_one();
        }
    }

    fn pop(&self) -> Arc<Op> {
        let until = monotonic_ns() + LOOK_FOR_WORK_NS;
        while self.queued.load(Ordering::Acquire) == 0 && monotonic_ns() < until {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        }
        let mut ops = locked(&self.ops);
        loop {
            if let Some(op) = ops.pop_front() {
                self.queued.fetch_sub(1, Ordering::Release);
                self.parked.store(false, Ordering::Release);
                return op;
            }
            self.parked.store(true, Ordering::Release);
            ops = self.more.wait(ops).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The compute, copy and comm engines of this process's view of one GPU.
pub struct Engines {
    compute: Queue,
    copy: Queue,
    comm: Queue,
    /// Signalled on every completion, for an engine waiting on another engine's work.
    completed: (Mutex<()>, Condvar),
}

impl Engines {
    pub const fn new() -> Self {
        Engines {
            compute: Queue::new(),
            copy: Queue::new(),
            comm: Queue::new(),
            completed: (Mutex::new(()), Condvar::new()),
        }
    }

    /// Starts the engine threads. They run for the life of the process, recording what they do
    /// on `gpu` under `pid`, and hand the staging buffers of pageable copies back to `staging`.
    /// Named so that tests and profilers can tell them from the workload's own threads.
    pub fn start(
        &'static self,
        gpu: Gpu<'static>,
        pid: u32,
        staging: &'static StagingPool,
    ) -> std::io::Result<()> {
        for (kind, name) in [
            (EngineKind::Compute, "simgpu-compute"),
            (EngineKind::Copy, "simgpu-copy"),
            (EngineKind::Comm, "simgpu-comm"),
        ] {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || self.run(kind, gpu, pid, staging))?;
        }
        Ok(())
    }

    fn queue(&self, kind: EngineKind) -> &Queue {
        match kind {
            EngineKind::Compute => &self.compute,
            EngineKind::Copy => &self.copy,
            EngineKind::Comm => &self.comm,
        }
    }

    /// Queues `work` after `deps`; returns the operation to wait on.
    pub fn submit(&self, work: Work, deps: Vec<Arc<Op>>) -> Arc<Op> {
        let queue = self.queue(work.engine());
        let op = Arc::new(Op {
            work: Mutex::new(Some(work)),
            deps: Mutex::new(deps),
            done_ns: AtomicU64::new(0),
        });
        queue.push(op.clone());
        op
    }

    fn run(&self, kind: EngineKind, gpu: Gpu<'_>, pid: u32, staging: &StagingPool) {
        let queue = self.queue(kind);
        loop {
            let op = queue.pop();
            self.wait_for_deps(&op);
            let work = locked(&op.work).take();
            // A panic here would kill the engine and hang every later sync; execute() has no
            // panicking paths, but make sure the op completes regardless.
            if let Some(work) = work {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if let Some(staged) = execute(work, gpu, pid) {
                        staging.give(staged);
                    }
                }));
            }
            op.finish();
            let _g = locked(&self.completed.0);
            self.completed.1.notify_all();
        }
    }

    fn wait_for_deps(&self, op: &Op) {
        let deps = std::mem::take(&mut *locked(&op.deps));
        for dep in deps {
            let mut guard = locked(&self.completed.0);
            while !dep.is_done() {
                // The timeout covers a completion signalled between the check and the wait.
                guard = self
                    .completed
                    .1
                    .wait_timeout(guard, Duration::from_millis(1))
                    .map_or_else(|e| e.into_inner().0, |r| r.0);
            }
        }
    }
}

/// How long a kernel asked to run `ns` takes on `gpu`: longer while it is throttled, and never
/// more than [`MAX_KERNEL_NS`].
fn throttled(gpu: Gpu<'_>, ns: u64) -> u64 {
    ((ns.min(MAX_KERNEL_NS) as f64 * gpu.throttle_factor()).round() as u64).min(MAX_KERNEL_NS)
}

/// Runs one operation on the calling engine thread; hands back a staging buffer it consumed.
fn execute(work: Work, gpu: Gpu<'_>, pid: u32) -> Option<Box<[u8]>> {
    match work {
        Work::Kernel {
            duration_ns,
            sm_share_pct,
        } => {
            let start = monotonic_ns();
            gpu.kernel_begin(pid, Lane::Compute, sm_share_pct, start);
            device_wait_until(start + throttled(gpu, duration_ns));
            gpu.kernel_end(pid, Lane::Compute, monotonic_ns());
            None
        }
        Work::CommKernel {
            wait,
            data,
            transfer_ns,
            sm_share_pct,
        } => {
            gpu.kernel_begin(pid, Lane::Comm, sm_share_pct, monotonic_ns());
            if let Some(wait) = wait {
                // SAFETY: simgpuLaunchCommKernel's caller vouches that `wait` may be called
                // with `data` from another thread once the stream reaches it.
                unsafe { wait(data as *mut std::ffi::c_void) };
            }
            device_wait_until(monotonic_ns() + throttled(gpu, transfer_ns));
            gpu.kernel_end(pid, Lane::Comm, monotonic_ns());
            None
        }
        Work::Host { func, data } => {
            // SAFETY: cuLaunchHostFunc's caller vouches that `func` may be called with `data`
            // from another thread once the stream reaches it.
            unsafe { func(data as *mut std::ffi::c_void) };
            None
        }
        Work::Copy {
            kind,
            source,
            dest,
            bytes,
        } => {
            let start = monotonic_ns();
            let src = match &source {
                Source::Addr(addr) => *addr as *const u8,
                Source::Staged(data) => data.as_ptr(),
            };
            // SAFETY: the submitter checked that `dest` and the source span `bytes` bytes of
            // mapped memory, and keeps them alive until this op completes (the CUDA contract:
            // buffers of an async copy stay valid until it finishes; frees synchronize first).
            // ptr::copy, not copy_nonoverlapping: a device-to-device copy may overlap.
            unsafe { std::ptr::copy(src, dest as *mut u8, bytes) };
            let duration_ns = match kind {
                CopyKind::HostToDevice | CopyKind::DeviceToHost => {
                    gpu.pcie_link().copy_ns(bytes as u64)
                }
                CopyKind::DeviceToDevice => {
                    (bytes as f64 * 1e9 / DEVICE_COPY_BYTES_PER_S).round() as u64
                }
                CopyKind::HostToHost => 0,
            };
            device_wait_until(start + duration_ns);
            let direction = match kind {
                CopyKind::HostToDevice => Some(Direction::HostToDevice),
                CopyKind::DeviceToHost => Some(Direction::DeviceToHost),
                _ => None,
            };
            if let Some(direction) = direction {
                gpu.copy_done(direction, bytes as u64, start, monotonic_ns());
            }
            match source {
                Source::Staged(buffer) => Some(buffer),
                Source::Addr(_) => None,
            }
        }
    }
}
