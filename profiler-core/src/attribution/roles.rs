//! Who feeds the GPU and who prepares its input. Until CUDA probes say which thread calls
//! the driver, the feeder is the main thread of each process that uses the GPU, as in a
//! PyTorch training loop: the processes NVML lists on the GPU, else those that mapped the CUDA
//! driver library, else the target processes. The DataLoader workers are the threads of every
//! other traced process.
use std::collections::BTreeSet;

use serde::Serialize;

use crate::analysis::model::{Analysis, GpuTimeline};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Roles {
    pub feeders: BTreeSet<u32>,
    pub workers: BTreeSet<u32>,
}

impl Roles {
    /// Since when the probes watch the feeders: the earliest of their first calls seen (see
    /// [`crate::cuda::CudaView::watched_since`]); `None` when no feeder's process was probed.
    pub fn feeders_watched_since(&self, a: &Analysis) -> Option<u64> {
        self.feeders
            .iter()
            .filter_map(|t| a.threads.get(t))
            .filter_map(|t| a.cuda.watched_since(t.pid, t.tid))
            .min()
    }

    pub fn from_analysis(a: &Analysis) -> Self {
        let mut gpu_pids: BTreeSet<u32> = a
            .gpus
            .values()
            .flat_map(|g| g.info.target_pids.iter().copied())
            .filter(|pid| a.processes.contains_key(pid))
            .collect();
        if gpu_pids.is_empty() {
            gpu_pids = a.cuda_processes.keys().copied().collect();
        }
        if gpu_pids.is_empty() {
            gpu_pids = a.target_pids().iter().copied().collect();
        }
        let feeders: BTreeSet<u32> = gpu_pids
            .iter()
            .copied()
            .filter(|pid| a.threads.contains_key(pid))
            .collect();
        let workers = a
            .threads
            .values()
            .filter(|t| !gpu_pids.contains(&t.pid))
            .map(|t| t.tid)
            .collect();
        Self { feeders, workers }
    }

    /// The roles for one GPU: its own processes' main threads feed it, and the workers are
    /// the threads of the non-GPU processes descended from them (each rank's own
    /// DataLoader workers), or of every non-GPU process when none descends from them.
    pub fn for_gpu(a: &Analysis, g: &GpuTimeline) -> Self {
        let all = Self::from_analysis(a);
        let own: BTreeSet<u32> = g
            .info
            .target_pids
            .iter()
            .copied()
            .filter(|pid| a.threads.contains_key(pid))
            .collect();
        if own.is_empty() {
            return all;
        }
        let gpu_pids: BTreeSet<u32> = a
            .gpus
            .values()
            .flat_map(|g| g.info.target_pids.iter().copied())
            .collect();
        let descends = |mut pid: u32| {
            for _ in 0..64 {
                match a.processes.get(&pid).and_then(|p| p.ppid) {
                    Some(pp) if own.contains(&pp) => return true,
                    Some(pp) if pp > 1 => pid = pp,
                    _ => return false,
                }
            }
            false
        };
        let workers: BTreeSet<u32> = a
            .threads
            .values()
            .filter(|t| !gpu_pids.contains(&t.pid) && descends(t.pid))
            .map(|t| t.tid)
            .collect();
        // With one GPU job, workers that are not its descendants (attached by PID on their
        // own) are still its workers; with several (ranks), another rank's are not.
        let several = a
            .gpus
            .values()
            .filter(|g| g.info.target_pids.iter().any(|p| a.threads.contains_key(p)))
            .count()
            > 1;
        Self {
            feeders: own,
            workers: if workers.is_empty() && !several {
                all.workers
            } else {
                workers
            },
        }
    }

    pub fn role(&self, tid: u32) -> Role {
        if self.feeders.contains(&tid) {
            Role::Feeder
        } else if self.workers.contains(&tid) {
            Role::Worker
        } else {
            Role::Other
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Feeder,
    Worker,
    /// Other threads of the feeder's process (pin-memory, NCCL, Python helper threads).
    Other,
}
