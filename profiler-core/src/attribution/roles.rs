//! Who feeds the GPU and who prepares its input. Until CUDA probes say which thread calls
//! the driver, the feeder is the main thread of each process that uses the GPU, as in a
//! PyTorch training loop: the processes NVML lists on the GPU, else those that mapped the CUDA
//! driver library, else the target processes. The DataLoader workers are the threads of every
//! other traced process.
use std::collections::BTreeSet;

use serde::Serialize;

use crate::model::Analysis;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Roles {
    pub feeders: BTreeSet<u32>,
    pub workers: BTreeSet<u32>,
}

impl Roles {
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
