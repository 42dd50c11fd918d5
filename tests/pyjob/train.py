"""A real PyTorch DataLoader job on the simulated GPU, for stallscope's tests and benches.

A `torch.utils.data.DataLoader` with worker processes feeds a training loop that copies each
batch to the GPU, launches a kernel and waits for it, through the CUDA driver API (ctypes on
`libcuda.so.1`, see cudadrv.py: the simulated GPU on machines without one, a real driver
elsewhere, where the kernel is stallgen's PTX spin). One scenario injects one cause (two for
`read-decode`):

- `dataloader-cpu`: each sample costs the workers `augment` CPU time, more than the kernel
  takes, so the loop waits for batches;
- `host-compute`: the loop's own `host_preprocess` burns the CPU before each launch;
- `host-overlap`: the loop launches the kernel first, then runs `host_preprocess` while the
  GPU computes, then waits: only the host work beyond the kernel is lost;
- `pageable-copy`: a large batch copied from pageable memory (the worker's shared-memory
  tensor), which the driver stages with a CPU memcpy in the call;
- `cold-reads`: the workers read each sample's files cold (`read_samples`, the page cache
  dropped before each read) from a disk this job may read `--disk-iops` times a second;
- `read-decode`: the workers both read cold files and `decode` with the CPU, the reads the
  larger part: more workers do not make a throttled disk faster;
- `healthy`: none.

Each cause can be removed by a flag, the rest of the job unchanged (what `cargo xtask bench
whatif` runs as "fixed"): `--worker-ms 0` (no CPU per sample), `--host-ms 0`, `--pin-memory`
(a pin-memory thread copies each batch into page-locked memory, as `DataLoader(pin_memory=True)`
does, and the copy to the GPU is asynchronous; the DataLoader's own option needs an accelerator
that this torch build does not see on the simulated GPU), `--warm` (the sample files stay in the
page cache).

The worker-side functions (`augment`, `decode`, `read_samples`) and the loop-side one
(`host_preprocess`) have distinct names, for the tests to find in the flamegraphs. Ground
truth, as stallgen writes it: one JSON line `{"scenario", "cause", "start_ns", "end_ns",
"steps", "gpu_busy_ns"}` on CLOCK_MONOTONIC, covering the steps after `ready pid=N` was
printed. `--steps-log FILE` writes one JSON line per step as stallgen's does: `{"end_ns",
"sync_end_ns", "kernel_ns", "wait_batch_ns", "copy_ns", "launch_ns", "host_ns", "sync_ns"}`
(the step ends when its sync returns, so `end_ns` and `sync_end_ns` are the same here). Each
second of the timed steps prints `second=N steps=K` on stdout, and the end `steps=N secs=S
steps_per_sec=R`.

usage: train.py --scenario NAME --secs S [--truth FILE] [--workers N] [--steps-log FILE]
                [--worker-ms MS] [--host-ms MS] [--pin-memory] [--warm] [--disk-iops N]
"""
import argparse
import ctypes
import json
import os
import queue
import sys
import threading
import time

import torch
import torch.utils.data

import cudadrv
import dataset


class Knobs:
    """What one scenario does per step. Times are seconds.

    kernel: the kernel's time; worker: the workers' CPU per sample (`augment`, or `decode`
    after cold reads); host: the loop's CPU per step; overlap: the host work runs after the
    launch, beside the kernel; batch_bytes: what each step copies to the GPU; cold_files: the
    sample files each batch reads (0: none)."""

    def __init__(self, kernel, worker, host, overlap=False, batch_bytes=64 * 1024, cold_files=0):
        self.kernel = kernel
        self.worker = worker
        self.host = host
        self.overlap = overlap
        self.batch_bytes = batch_bytes
        self.cold_files = cold_files


# The loop is idle for what the workers or the loop take beyond the kernel.
SCENARIOS = {
    "healthy": Knobs(0.030, 0.002, 0.0),
    "dataloader-cpu": Knobs(0.015, 0.080, 0.0),
    "host-compute": Knobs(0.015, 0.002, 0.040),
    # 50 ms of host work beside a 30 ms kernel: 20 ms of each step lost, not 50.
    "host-overlap": Knobs(0.030, 0.002, 0.050, overlap=True),
    # 32 MiB staged at the simulated host's memcpy rate (16.8 ms at its default 2 GB/s) and
    # then DMA'd, against 20 ms of kernel. The simulated copy engine moves the bytes with a
    # real memcpy on a CPU, which a GPU's DMA does not cost: beside a kernel much shorter
    # than that, the pinned job would measure the simulator's CPUs, not the fix.
    "pageable-copy": Knobs(0.020, 0.0, 0.0, batch_bytes=32 << 20),
    # 16 cold files a batch at 200 reads/s for the whole job: ~80 ms of disk per batch,
    # however many workers share it, against 15 ms of kernel.
    "cold-reads": Knobs(0.015, 0.002, 0.0, cold_files=16),
    # The same reads, and 40 ms of decoding per batch: with 2 workers the decoding alone
    # would feed a batch every 20 ms; the disk gives one every ~80 ms.
    "read-decode": Knobs(0.015, 0.040, 0.0, cold_files=16),
}
CAUSES = {
    "healthy": None,
    "dataloader-cpu": "dataloader_cpu",
    "host-compute": "host_compute",
    "host-overlap": "host_compute",
    "pageable-copy": "pinned_memory_copy",
    "cold-reads": "disk",
    "read-decode": "disk",
}


def burn(seconds):
    """CPU time, in Python bytecode, so that the samples land in the caller's frame."""
    end = time.thread_time() + seconds
    s = 0
    while time.thread_time() < end:
        for i in range(500):
            s += i * i
    return s


def augment(index, seconds, nbytes):
    burn(seconds)
    return bytes([index % 256]) * nbytes


def decode(data, seconds):
    burn(seconds)
    return data


class Batches(torch.utils.data.Dataset):
    def __init__(self, knobs, files):
        self.knobs = knobs
        self.files = files
        self.tensor = None

    def __len__(self):
        return 1 << 30

    def __getitem__(self, index):
        k = self.knobs
        if self.files is not None:
            data = self.files.read_samples(index, k.cold_files)
            return decode(data, k.worker)
        if k.batch_bytes >= 1 << 20:
            # A large batch as a framework hands it over: a tensor in shared memory. One per
            # worker, made once, so that the workers' CPU stays out of the step and only the
            # copy to the GPU is measured.
            if self.tensor is None:
                self.tensor = torch.full((k.batch_bytes,), index % 256, dtype=torch.uint8)
                self.tensor.share_memory_()
            burn(k.worker)
            return self.tensor
        return augment(index, k.worker, k.batch_bytes)


def host_preprocess(batch, seconds):
    burn(seconds)
    return batch


def address(batch):
    """The host address and length of a batch (bytes or a uint8 tensor)."""
    if isinstance(batch, torch.Tensor):
        return batch.data_ptr(), batch.numel()
    return ctypes.cast(ctypes.c_char_p(batch), ctypes.c_void_p).value, len(batch)


class Gpu(cudadrv.Driver):
    def __init__(self, batch_bytes):
        super().__init__()
        self.spin = self.spin_kernel()
        self.dbuf = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(self.dbuf), batch_bytes), "cuMemAlloc_v2")

    def pinned(self, nbytes):
        p = ctypes.c_void_p()
        self.check(self.lib.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(nbytes), 0), "cuMemHostAlloc")
        return p.value

    def copy_in(self, batch):
        """A synchronous copy: from pageable memory, the driver stages it in the call."""
        ptr, n = address(batch)
        self.check(
            self.lib.cuMemcpyHtoD_v2(self.dbuf, ctypes.c_void_p(ptr), ctypes.c_size_t(n)),
            "cuMemcpyHtoD_v2",
        )

    def copy_in_async(self, ptr, n):
        """From page-locked memory: queued on the stream, the call returns at once."""
        self.check(
            self.lib.cuMemcpyHtoDAsync_v2(self.dbuf, ctypes.c_void_p(ptr), ctypes.c_size_t(n), None),
            "cuMemcpyHtoDAsync_v2",
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


# Page-locked buffers the pin-memory thread rotates through, as stallgen's does.
PIN_BUFFERS = 2


class PinnedFeed:
    """`DataLoader(pin_memory=True)`'s pin-memory thread: takes each batch from the loader and
    copies it into a page-locked buffer, beside the loop; the loop gives a buffer back once
    the step's sync has seen its copy complete."""

    def __init__(self, gpu, batches, nbytes):
        self.bufs = [gpu.pinned(nbytes) for _ in range(PIN_BUFFERS)]
        self.ready = queue.Queue()
        self.free = queue.Queue()
        for i in range(PIN_BUFFERS):
            self.free.put(i)
        self.batches = batches
        self.thread = threading.Thread(target=self.loop, name="pin_memory", daemon=True)
        self.thread.start()

    def loop(self):
        while True:
            i = self.free.get()
            if i is None:
                return
            try:
                batch = next(self.batches)
                ptr, n = address(batch)
                # ctypes releases the GIL for the copy, as torch's pinning does.
                ctypes.memmove(self.bufs[i], ptr, n)
                del batch
                self.ready.put((i, n))
            except Exception as e:  # the loop reports it
                self.ready.put(e)
                return

    def next(self):
        got = self.ready.get()
        if isinstance(got, Exception):
            raise got
        return got

    def stop(self):
        self.free.put(None)


class Loop:
    """The training loop: one step per batch, its parts timed for the steps log."""

    def __init__(self, gpu, batches, knobs, pin_memory):
        self.gpu = gpu
        self.batches = batches
        self.k = knobs
        self.pinned = PinnedFeed(gpu, batches, knobs.batch_bytes) if pin_memory else None

    def step(self):
        k = self.k
        t0 = time.monotonic_ns()
        batch = None
        if self.pinned is not None:
            buf, n = self.pinned.next()
        else:
            batch = next(self.batches)
        t1 = time.monotonic_ns()
        host_ns = 0
        if not k.overlap and k.host > 0:
            batch = host_preprocess(batch, k.host)
            host_ns = time.monotonic_ns() - t1
        t2 = time.monotonic_ns()
        if self.pinned is not None:
            self.gpu.copy_in_async(self.pinned.bufs[buf], n)
        else:
            self.gpu.copy_in(batch)
        t3 = time.monotonic_ns()
        self.gpu.launch(k.kernel)
        t4 = time.monotonic_ns()
        if k.overlap and k.host > 0:
            host_preprocess(None, k.host)
        t5 = time.monotonic_ns()
        self.gpu.synchronize()
        t6 = time.monotonic_ns()
        if self.pinned is not None:
            self.pinned.free.put(buf)
        return {
            "end_ns": t6,
            "sync_end_ns": t6,
            "kernel_ns": int(k.kernel * 1e9),
            "wait_batch_ns": t1 - t0,
            "copy_ns": t3 - t2,
            "launch_ns": t4 - t3,
            "host_ns": host_ns + (t5 - t4),
            "sync_ns": t6 - t5,
        }

    def stop(self):
        if self.pinned is not None:
            self.pinned.stop()


def seconds(ms):
    return ms / 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    p.add_argument("--secs", type=float, required=True)
    p.add_argument("--truth")
    p.add_argument("--steps-log")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-ms", type=float, help="the workers' CPU per sample (the preset's by default)")
    p.add_argument("--host-ms", type=float, help="the loop's CPU per step (the preset's by default)")
    p.add_argument("--pin-memory", action="store_true", help="copy batches through page-locked buffers")
    p.add_argument("--warm", action="store_true", help="read the sample files from the page cache")
    p.add_argument(
        "--disk-iops",
        type=int,
        default=200,
        help="reads a second the disk serves this job (block-IO throttling in a cgroup of its own; "
        "needs root), as a busy disk or a network filesystem would; 0: the disk's own speed",
    )
    p.add_argument("--data-dir", help="where the cold-read scenarios keep their sample files")
    p.add_argument(
        "--gate",
        action="store_true",
        help="after `ready`, wait for a line on stdin before the timed steps (a benchmark "
        "attaches its tracer in between)",
    )
    a = p.parse_args()
    preset = SCENARIOS[a.scenario]
    k = Knobs(
        preset.kernel,
        preset.worker if a.worker_ms is None else seconds(a.worker_ms),
        preset.host if a.host_ms is None else seconds(a.host_ms),
        preset.overlap,
        preset.batch_bytes,
        preset.cold_files,
    )
    files = None
    slow_disk = None
    if k.cold_files > 0:
        files = dataset.Samples(a.data_dir or dataset.default_dir(), cold=not a.warm)
        if a.disk_iops > 0:
            # Before the workers start: they inherit the cgroup.
            slow_disk = dataset.SlowDisk(files.dir, a.disk_iops)
    gpu = Gpu(k.batch_bytes)
    loader = torch.utils.data.DataLoader(
        Batches(k, files),
        batch_size=None,
        num_workers=a.workers,
        prefetch_factor=2,
        persistent_workers=True,
    )
    batches = iter(loader)
    loop = Loop(gpu, batches, k, a.pin_memory)
    # Warm up: the workers are up, and the batches they made ahead while the loop started (up
    # to prefetch_factor each) are spent, so that the timed steps run at the job's own pace.
    for _ in range(a.workers * 3):
        loop.step()
    print(f"ready pid={os.getpid()}", flush=True)
    if a.gate:
        sys.stdin.readline()
    log = open(a.steps_log, "w") if a.steps_log else None
    start = time.monotonic_ns()
    end = start + int(a.secs * 1e9)
    steps = 0
    second, in_second = 1, 0
    while time.monotonic_ns() < end:
        parts = loop.step()
        steps += 1
        in_second += 1
        if log:
            log.write(json.dumps(parts) + "\n")
        if parts["end_ns"] >= start + second * 1_000_000_000:
            print(f"second={second} steps={in_second}", flush=True)
            second, in_second = second + 1, 0
    stop = time.monotonic_ns()
    if log:
        log.close()
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
                        "gpu_busy_ns": int(steps * k.kernel * 1e9),
                    }
                )
                + "\n"
            )
    secs = (stop - start) / 1e9
    print(f"steps={steps} secs={secs:.3f} steps_per_sec={steps / secs:.3f}", flush=True)
    loop.stop()
    # Persistent workers outlive the loop otherwise, holding the job's pipes open.
    batches._shutdown_workers()
    if slow_disk is not None:
        slow_disk.leave()


if __name__ == "__main__":
    main()
