"""Real PyTorch jobs for the H200 acceptance check (scripts/h200/check.sh), one injected cause
each. Unlike tests/pyjob/train.py (the driver API through ctypes, for the simulated GPU), these
go through torch.cuda: the CUDA 13 runtime, cuBLAS and the caching allocator, as users' jobs do.

Each step's end is appended, as CLOCK_MONOTONIC nanoseconds, to --steps (written at exit), so
the check can count steps inside and outside a recording (the overhead) and compare a job
against its fixed variant (the measured speedup). `ready pid=N` is printed after warm-up.

usage: job.py --scenario NAME --secs S --steps FILE [--fixed]

Scenarios and what a fix means (--fixed):
- healthy: bf16 matmuls on data already on the GPU, a sync per step;
- dataloader_cpu: a DataLoader with 2 workers whose `augment` costs 10 ms of Python CPU per
  sample, 8 samples a batch; fixed: 12 workers;
- pageable_copy: a 256 MiB pageable batch copied to the GPU each step, then the matmuls;
- pinned_copy: the same batch pinned, copied non_blocking on a side stream one step ahead;
- launch_overhead: 2,000 tiny element-wise kernels a step;
- host_compute: `.item()` and a print each step, then `log_metrics`, 25 ms of Python CPU;
  fixed: the loss read every 100 steps, no per-step host work.
"""
import argparse
import os
import sys
import time

import torch
import torch.utils.data

DIM = 8192


def burn(seconds):
    """CPU time in Python bytecode, so that samples land in the caller's frame."""
    end = time.thread_time() + seconds
    s = 0
    while time.thread_time() < end:
        for i in range(500):
            s += i * i
    return s


def augment(index):
    burn(0.010)
    return torch.full((3, 64, 64), float(index % 7))


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, index):
        return augment(index)


def log_metrics(step, loss):
    burn(0.025)
    return f"step {step} loss {loss:.4f}"


def matmuls(x, w, n):
    for _ in range(n):
        x = x @ w
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--secs", type=float, required=True)
    ap.add_argument("--steps", required=True)
    ap.add_argument("--fixed", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    w = torch.randn(DIM, DIM, device=dev, dtype=torch.bfloat16) / DIM**0.5
    x0 = torch.randn(DIM, DIM, device=dev, dtype=torch.bfloat16)
    matmuls(x0, w, 3)
    torch.cuda.synchronize()
    steps = []
    s = args.scenario

    if s == "healthy":
        def step(i):
            matmuls(x0, w, 10)
            torch.cuda.synchronize()
    elif s == "dataloader_cpu":
        workers = 12 if args.fixed else 2
        loader = iter(torch.utils.data.DataLoader(Samples(), batch_size=8, num_workers=workers))
        next(loader)

        def step(i):
            batch = next(loader).to(dev)
            y = matmuls(x0, w, 5)
            (y[0, 0] + batch.sum()).item()
    elif s in ("pageable_copy", "pinned_copy"):
        host = torch.ones(64 << 20, dtype=torch.float32)
        if s == "pinned_copy":
            host = host.pin_memory()
            side = torch.cuda.Stream()
            ready = {"next": None}

            def prefetch():
                with torch.cuda.stream(side):
                    ready["next"] = host.to(dev, non_blocking=True)
                    ready["event"] = torch.cuda.Event()
                    ready["event"].record(side)
            prefetch()

            def step(i):
                torch.cuda.current_stream().wait_event(ready["event"])
                batch = ready["next"]
                batch.record_stream(torch.cuda.current_stream())
                prefetch()
                y = matmuls(x0, w, 15)
                (y[0, 0] + batch[0]).item()
        else:
            def step(i):
                batch = host.to(dev)
                y = matmuls(x0, w, 15)
                (y[0, 0] + batch[0]).item()
    elif s == "launch_overhead":
        small = torch.zeros(256, device=dev)

        def step(i):
            for _ in range(2000):
                small.add_(1.0)
            torch.cuda.synchronize()
    elif s == "host_compute":
        def step(i):
            y = matmuls(x0, w, 7)
            loss = y[0].float().mean()
            if args.fixed:
                if i % 100 == 0:
                    print(f"step {i} loss {loss.item():.4f}", flush=True)
            else:
                print(log_metrics(i, loss.item()), flush=True)
    else:
        sys.exit(f"job.py: unknown scenario {s!r}")

    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    print(f"ready pid={os.getpid()}", flush=True)
    end = time.monotonic() + args.secs
    i = 0
    while time.monotonic() < end:
        step(i)
        i += 1
        steps.append(time.monotonic_ns())
    with open(args.steps, "w") as f:
        f.write("\n".join(map(str, steps)) + "\n")


if __name__ == "__main__":
    main()
