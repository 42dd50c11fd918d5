"""A Python job for stallscope's Python-frame tests, runnable by CPython 3.8 and later.

Three threads with known work: a worker that burns the CPU in `burn_worker`, a sleeper that
sleeps in `sleepy`, and the main thread, whose `Trainer.step` burns the CPU too and then
waits for the (simulated) GPU in `wait_for_gpu`. The lines the tests expect are marked at
their end: `# hot`, `# sleep`, `# sync`. The job writes its threads' TIDs to the truth file
and prints `ready pid=N` once they run.

usage: threads.py SECONDS TRUTH.json [--cuda]
"""
import json
import os
import sys
import threading
import time


def burn_worker(n):
    s = 0
    for i in range(n):  # hot
        s += i * i  # hot
    return s


def worker_loop(stop):
    while not stop.is_set():
        burn_worker(100000)


def sleepy(stop):
    while not stop.is_set():
        time.sleep(0.005)  # sleep


def wait_for_gpu(gpu):
    gpu.check(gpu.lib.cuCtxSynchronize(), "cuCtxSynchronize")  # sync


class Trainer:
    def __init__(self, gpu):
        self.gpu = gpu

    def step(self):
        burn_worker(30000)
        if self.gpu is not None:
            wait_for_gpu(self.gpu)

    def run(self, secs):
        end = time.monotonic() + secs
        while time.monotonic() < end:
            self.step()


def main():
    secs, truth = float(sys.argv[1]), sys.argv[2]
    gpu = None
    if "--cuda" in sys.argv[3:]:
        import cudadrv

        gpu = cudadrv.Driver()
    stop = threading.Event()
    tids = {}

    def started(name, target):
        def run():
            tids[name] = threading.get_native_id()
            target(stop)

        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        return t

    threads = [started("worker", worker_loop), started("sleepy", sleepy)]
    while len(tids) < 2:
        time.sleep(0.001)
    tids["main"] = threading.get_native_id()
    with open(truth, "w") as f:
        json.dump(
            {
                "pid": os.getpid(),
                "tids": tids,
                "version": "%d.%d" % sys.version_info[:2],
            },
            f,
        )
    print(f"ready pid={os.getpid()}", flush=True)
    Trainer(gpu).run(secs)
    stop.set()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
