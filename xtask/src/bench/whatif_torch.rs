//! `bench whatif`'s real-PyTorch arm: `tests/pyjob/train.py`, a `torch.utils.data.DataLoader`
//! with worker processes feeding a loop on the simulated GPU, one scenario per cause, and what
//! "fixed" means for each as train.py flags. Each fix removes the cause's cost and keeps the
//! rest of the job (its kernel, its workers, its batch) as it was.
use super::whatif::{Fix, Job, Scenario};

const fn fix(flags: &'static [&'static str]) -> Fix {
    Fix {
        cause: None,
        flags,
        env: &[],
    }
}

pub const TORCH: [Scenario; 6] = [
    // Each sample costs the workers 80 ms of CPU (`augment`) against a 15 ms kernel; fixed,
    // the transform costs nothing (cheaper, or moved to the GPU).
    Scenario {
        name: "torch-worker-cpu",
        job: Job::Torch("dataloader-cpu"),
        fixes: &[fix(&["--worker-ms", "0"])],
        loader_bound: true,
    },
    // The loop launches a 30 ms kernel, then does 50 ms of its own work, then waits: only
    // the 20 ms beyond the kernel is lost. Fixed, the loop's work costs nothing, and the step
    // waits for the kernel.
    Scenario {
        name: "torch-host-overlap",
        job: Job::Torch("host-overlap"),
        fixes: &[fix(&["--host-ms", "0"])],
        loader_bound: false,
    },
    // 32 MiB a step from the worker's shared-memory tensor, pageable: the driver stages it
    // with a CPU memcpy in the call. Fixed: pin_memory=True, a pin-memory thread copies each
    // batch into page-locked buffers beside the loop and the copy to the GPU is asynchronous.
    Scenario {
        name: "torch-pageable-copy",
        job: Job::Torch("pageable-copy"),
        fixes: &[fix(&["--pin-memory"])],
        loader_bound: false,
    },
    // 16 cold sample files a batch from a disk that serves the job 200 reads a second. Fixed:
    // the files stay in the page cache (a cached or local copy of the data set).
    Scenario {
        name: "torch-cold-reads",
        job: Job::Torch("cold-reads"),
        fixes: &[fix(&["--warm"])],
        loader_bound: true,
    },
    // The workers both read cold files and decode them with 40 ms of CPU, the reads the
    // larger part: each fix is measured on its own, and each cause's prediction against it.
    Scenario {
        name: "torch-mix",
        job: Job::Torch("read-decode"),
        fixes: &[
            Fix {
                cause: Some("disk"),
                flags: &["--warm"],
                env: &[],
            },
            Fix {
                cause: Some("dataloader_cpu"),
                flags: &["--worker-ms", "0"],
                env: &[],
            },
        ],
        loader_bound: true,
    },
    // Nothing to fix: no advice, and no what-if should promise anything.
    Scenario {
        name: "torch-healthy",
        job: Job::Torch("healthy"),
        fixes: &[],
        loader_bound: false,
    },
];
