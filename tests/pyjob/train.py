"""A real PyTorch DataLoader job on the simulated GPU, for stallscope's tests and benches.

A `torch.utils.data.DataLoader` with worker processes feeds a training loop that copies each
batch to the GPU, launches a kernel and waits for it, through the CUDA driver API (ctypes on
`libcuda.so.1`, see cudadrv.py: the simulated GPU on machines without one, a real driver
elsewhere, where the kernel is stallgen's PTX spin). One scenario injects one cause:

- `dataloader-cpu`: each sample costs the workers `augment` CPU time, more than the kernel
  takes, so the loop waits for batches;
- `host-compute`: the loop's own `host_preprocess` burns the CPU before each launch;
- `healthy`: neither.

The worker-side function (`augment`) and the loop-side one (`host_preprocess`) have
distinct names, for the tests to find in the flamegraphs. Ground truth, as stallgen writes
it: one JSON line `{"scenario", "cause", "start_ns", "end_ns", "steps", "gpu_busy_ns"}` on
CLOCK_MONOTONIC, covering the steps after `ready pid=N` was printed.

usage: train.py --scenario NAME --secs S [--truth FILE] [--workers N]
"""
import argparse
import ctypes
import json
import os
import sys
import time

import torch
import torch.utils.data

import cudadrv

# Per scenario: the kernel's time, the workers' CPU time per batch, the loop's CPU time per
# step (seconds). The loop is idle for what the workers or the loop take beyond the kernel.
SCENARIOS = {
    "healthy": (0.030, 0.002, 0.0),
    "dataloader-cpu": (0.015, 0.080, 0.0),
    "host-compute": (0.015, 0.002, 0.040),
}
CAUSES = {"healthy": None, "dataloader-cpu": "dataloader_cpu", "host-compute": "host_compute"}
BATCH_BYTES = 64 * 1024


def burn(seconds):
    """CPU time, in Python bytecode, so that the samples land in the caller's frame."""
    end = time.thread_time() + seconds
    s = 0
    while time.thread_time() < end:
        for i in range(500):
            s += i * i
    return s


def augment(index, seconds):
    burn(seconds)
    return bytes([index % 256]) * BATCH_BYTES


class Batches(torch.utils.data.Dataset):
    def __init__(self, seconds):
        self.seconds = seconds

    def __len__(self):
        return 1 << 30

    def __getitem__(self, index):
        return augment(index, self.seconds)


def host_preprocess(batch, seconds):
    burn(seconds)
    return batch


class Gpu(cudadrv.Driver):
    def __init__(self):
        super().__init__()
        self.spin = self.spin_kernel()
        self.dbuf = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(self.dbuf), BATCH_BYTES), "cuMemAlloc_v2")

    def copy_in(self, batch):
        self.check(
            self.lib.cuMemcpyHtoD_v2(self.dbuf, ctypes.c_char_p(batch), ctypes.c_size_t(len(batch))),
            "cuMemcpyHtoD_v2",
        )

    def launch(self, seconds):
        ns = ctypes.c_uint64(int(seconds * 1e9))
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(ns), ctypes.c_void_p))
        self.check(
            self.lib.cuLaunchKernel(self.spin, 1, 1, 1, 1, 1, 1, 0, None, params, None),
            "cuLaunchKernel",
        )

    def synchronize(self):
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")


def train_step(gpu, batch, kernel_s, host_s):
    batch = host_preprocess(batch, host_s) if host_s > 0 else batch
    gpu.copy_in(batch)
    gpu.launch(kernel_s)
    gpu.synchronize()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    p.add_argument("--secs", type=float, required=True)
    p.add_argument("--truth")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--gate",
        action="store_true",
        help="after `ready`, wait for a line on stdin before the timed steps (a benchmark "
        "attaches its tracer in between)",
    )
    a = p.parse_args()
    kernel_s, worker_s, host_s = SCENARIOS[a.scenario]
    gpu = Gpu()
    loader = torch.utils.data.DataLoader(
        Batches(worker_s),
        batch_size=None,
        num_workers=a.workers,
        prefetch_factor=2,
        persistent_workers=True,
    )
    batches = iter(loader)
    # Warm up: the workers are up and the first batches made before anyone attaches.
    for _ in range(a.workers):
        train_step(gpu, next(batches), kernel_s, host_s)
    print(f"ready pid={os.getpid()}", flush=True)
    if a.gate:
        sys.stdin.readline()
    start = time.monotonic_ns()
    end = start + int(a.secs * 1e9)
    steps = 0
    while time.monotonic_ns() < end:
        train_step(gpu, next(batches), kernel_s, host_s)
        steps += 1
    stop = time.monotonic_ns()
    if a.truth:
        with open(a.truth, "w") as f:
            f.write(
                json.dumps(
                    {
                        "scenario": a.scenario,
                        "cause": CAUSES[a.scenario],
                        "start_ns": start,
                        "end_ns": stop,
                        "steps": steps,
                        "gpu_busy_ns": int(steps * kernel_s * 1e9),
                    }
                )
                + "\n"
            )
    print(f"steps={steps} secs={(stop - start) / 1e9:.3f}", flush=True)
    # Persistent workers outlive the loop otherwise, holding the job's pipes open.
    batches._shutdown_workers()


if __name__ == "__main__":
    main()
