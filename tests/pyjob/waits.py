"""Jobs whose GPU idles while the feeder thread waits on something other than the GPU: the
GIL, a lock, a socket (issue 38). Plain CPython 3.8 or later, no PyTorch: the simulated GPU
(or a real one) through the CUDA driver API, see cudadrv.py. Each scenario injects one cause
and says in its truth line what a profiler has to find to name it.

Scenarios (the cause is the name the profiler should give, `null`: none):

- `gil-busy` (gil_contention): a training loop (launch a `--kernel-ms` kernel, synchronize)
  and, in the same process, a `tokenizer` thread running pure-Python `tokenize` without
  pause. Every ctypes call releases the GIL, so each time the loop returns from the driver it
  waits for the tokenizer to give the GIL back, which CPython asks for only after the switch
  interval (`sys.getswitchinterval()`, 5 ms): the wait after the synchronize leaves the GPU
  idle for about one interval a step. `--no-thread` runs the same loop alone, for the steps/s
  a test compares against.
- `gil-asleep` (null): the same, with the helper thread asleep in `sleepy_metrics`
  (`time.sleep` of 5 ms, then a few bytecodes), as a metrics thread is: it takes the GIL for
  microseconds, so the loop runs at the pace of `--no-thread` and no GIL cause is expected.
- `lock` (lock_wait): a `producer` thread fills a one-batch slot guarded by a
  `threading.Condition`, and does its work (`prepare_batch`: SHA-256 over a buffer, which
  releases the GIL, so that the GIL is not a second cause) while holding the condition's
  lock. The loop runs its kernel, then blocks acquiring that lock until the producer
  releases it: the producer is the thread that ends each wait. `lock_wait_ns` is what the
  loop measured itself blocked there.
- `sparse-server` (no_work): a server on 127.0.0.1 over TCP: each request costs `--host-ms`
  of parsing and a `--kernel-ms` kernel (24 ms). The client sends one every 150 to 250 ms
  (uniform, `--gap-ms`), so the GPU idles about 85% of the time waiting for work, which is no
  stall: a profiler should name the socket and give no verdict.
- `busy-server` (host_compute): the same server and client, with the client keeping two
  requests outstanding, so a request is always queued in the socket when the server looks
  for one; each request needs `--host-ms` of pure-Python `preprocess_request` (30 ms)
  before its 10 ms kernel. The server never waits for work; the GPU waits for the server.
  Only on CPUs the job has to itself, though: where other processes take them, the work
  waits in the run queue as well and cpu_contention is the right label; `host_cpu_ns`
  against `host_ns` in the truth tells which (a test expecting host_compute should first
  see the server got most of the CPU it asked for).

The servers' client is outside the job, by design: it is started by the server (so a test
only runs one command) through a double fork and `setsid`, so that its parent is init (or
the nearest subreaper), never the server. A profiler attached to the server's PID walks the
server's descendants and does not trace the client: by the issue's rule (the other end is
traced: a host cause; outside the job: no_work) the sparse server's waits are `no_work`.
The client is this file run as `waits.py client ...`, its comm set to `waits-client`; it exits
when the server closes the connection (or dies), or 60 s after its deadline at the latest.
`--io epoll` makes the server wait in `epoll_wait` (selectors, as an asyncio server does)
before each `recv`; the default blocks in `recv` itself.

Every job prints `ready pid=N` once its steady state runs (helper thread started, client
connected, warm-up steps or requests served; a server prints `client pid=N port=P` just
before), then runs `--secs` seconds, and writes one JSON line to `--truth` on exit, on
CLOCK_MONOTONIC like stallgen's and train.py's (so the tests' `truth_idle` and
`in_doubt_allowance_ns` read it as is). The GPU's idle time by the job's own account is
`end_ns - start_ns - gpu_busy_ns`; the fields a profiler's test checks it against:

  every job: scenario, cause, pid, feeder_tid (the thread that drives the GPU), start_ns,
    end_ns, steps (steps or requests served in the window), steps_per_sec, kernel_ns (per
    step), gpu_busy_ns (steps x kernel_ns);
  gil-busy, gil-asleep: thread (false with --no-thread), switch_interval_ns, and `holder`
    {tid, name, function}: the helper thread's native TID, its thread name and the Python
    function it spends its time in (`tokenize`, or `sleepy_metrics` when asleep);
  lock: holder {tid, name, function: "prepare_batch"}, hold_ns (the producer's work per batch
    under the lock), lock_wait_ns (the loop's own measure of its time blocked on the lock);
  sparse-server, busy-server: requests (= steps), requests_per_sec, socket {protocol: "tcp",
    local_addr, local_port, peer_addr, peer_port}, client {pid, comm, outside_job: true},
    io ("recv" or "epoll"), gap_ms [lo, hi] (sparse) or outstanding (busy), host_ns (the
    server's host work over all requests, from the request read to the launch; host_cpu_ns:
    the CPU time it got meanwhile, less where other processes took the CPU), wait_ns (the
    server's own measure of its time blocked waiting for a request), latency_p50_ns (from
    the client's send, stamped in the request, to the reply sent: queueing included),
    service_p50_ns (from the request read to the reply sent).

usage: waits.py SCENARIO --secs S [--truth FILE] [--kernel-ms MS] [--host-ms MS]
                [--no-thread] [--io recv|epoll] [--gap-ms LO HI] [--seed N]
       waits.py client --port P --mode sparse|busy --deadline-ns NS [--gap-ms LO HI] [--seed N]
"""
import argparse
import ctypes
import hashlib
import json
import os
import random
import selectors
import socket
import struct
import sys
import threading
import time

# The defaults of each scenario: kernel and host time per step or request, in ms.
DEFAULTS = {
    "gil-busy": {"kernel_ms": 10.0, "host_ms": 0.0},
    "gil-asleep": {"kernel_ms": 10.0, "host_ms": 0.0},
    # 40 ms of the producer's work a batch against a 15 ms kernel: ~25 ms of lock wait a step.
    "lock": {"kernel_ms": 15.0, "host_ms": 40.0},
    # The field case: 24 ms of GPU a request; a little parsing, as a real server has.
    "sparse-server": {"kernel_ms": 24.0, "host_ms": 2.0},
    "busy-server": {"kernel_ms": 10.0, "host_ms": 30.0},
}
CAUSES = {
    "gil-busy": "gil_contention",
    "gil-asleep": None,
    "lock": "lock_wait",
    "sparse-server": "no_work",
    "busy-server": "host_compute",
}
WARMUP_STEPS = 5
WARMUP_REQUESTS = 2
# request: id, the client's send time (CLOCK_MONOTONIC ns), payload; reply: id, done time.
REQUEST = struct.Struct("<QQ")
REQUEST_BYTES = 256
REPLY = struct.Struct("<QQ")
CLIENT_COMM = b"waits-client"


def burn(seconds):
    """CPU time in Python bytecode (holding the GIL), so that samples land in the caller."""
    end = time.thread_time() + seconds
    s = 0
    while time.thread_time() < end:
        for i in range(500):
            s += i * i
    return s


class Gpu:
    def __init__(self):
        # Imported here: the client process must not need the driver.
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import cudadrv

        self.drv = cudadrv.Driver()
        self.lib = self.drv.lib
        self.spin = self.drv.spin_kernel()

    def launch(self, seconds):
        ns = ctypes.c_uint64(int(seconds * 1e9))
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(ns), ctypes.c_void_p))
        self.drv.check(
            self.lib.cuLaunchKernel(self.spin, 1, 1, 1, 1, 1, 1, 0, None, params, None),
            "cuLaunchKernel",
        )

    def synchronize(self):
        self.drv.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def run(self, seconds):
        self.launch(seconds)
        self.synchronize()


def p50(values):
    if not values:
        return 0
    s = sorted(values)
    return s[len(s) // 2]


def write_truth(path, line):
    if path:
        with open(path, "w") as f:
            f.write(json.dumps(line) + "\n")


# --- gil-busy, gil-asleep ---------------------------------------------------------------

TEXT = (
    "the quick brown fox jumps over the lazy dog while a tokenizer splits every word "
    "into pieces of three characters and looks each piece up in its vocabulary "
) * 40


def tokenize(text, vocab):
    ids = []
    for word in text.split():
        for i in range(0, len(word), 3):
            piece = word[i : i + 3]
            ids.append(vocab.setdefault(piece, len(vocab)))
    return ids


def tokenizer_loop(stop):
    vocab = {}
    while not stop.is_set():
        tokenize(TEXT, vocab)


def sleepy_metrics(stop):
    count = 0
    while not stop.is_set():
        time.sleep(0.005)
        count += 1


class Helper:
    """A thread of the job's own, started before `ready`; its native TID for the truth."""

    def __init__(self, name, target, function):
        self.stop = threading.Event()
        self.name = name
        self.function = function
        self.tid = None
        started = threading.Event()

        def run():
            self.tid = threading.get_native_id()
            started.set()
            target(self.stop)

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()
        started.wait()

    def truth(self):
        return {"tid": self.tid, "name": self.name, "function": self.function}

    def join(self):
        self.stop.set()
        self.thread.join()


def gil_job(a, gpu, kernel):
    helper = None
    if not a.no_thread:
        if a.scenario == "gil-busy":
            helper = Helper("tokenizer", tokenizer_loop, "tokenize")
        else:
            helper = Helper("metrics", sleepy_metrics, "sleepy_metrics")
    for _ in range(WARMUP_STEPS):
        gpu.run(kernel)
    print(f"ready pid={os.getpid()}", flush=True)
    start = time.monotonic_ns()
    end = start + int(a.secs * 1e9)
    steps = 0
    now = start
    while now < end:
        gpu.run(kernel)
        steps += 1
        now = time.monotonic_ns()
    if helper is not None:
        helper.join()
    return start, now, steps, {
        "thread": helper is not None,
        "switch_interval_ns": int(sys.getswitchinterval() * 1e9),
        "holder": helper.truth() if helper is not None else None,
    }


# --- lock --------------------------------------------------------------------------------


def prepare_batch(buf, seconds):
    """The producer's work, under the lock: hashlib releases the GIL for large buffers, so
    the loop waits on the lock alone, not on the GIL as well."""
    end = time.thread_time() + seconds
    digest = b""
    while time.thread_time() < end:
        digest = hashlib.sha256(buf).digest()
    return digest


class Slot:
    """One batch between the producer and the loop, guarded by a Condition whose lock the
    producer holds while it prepares the next batch."""

    def __init__(self, hold):
        self.cond = threading.Condition(threading.Lock())
        self.batch = None
        self.hold = hold
        self.buf = os.urandom(256 << 10)

    def produce(self, stop):
        while not stop.is_set():
            with self.cond:
                while self.batch is not None and not stop.is_set():
                    self.cond.wait(0.5)
                if stop.is_set():
                    return
                self.batch = prepare_batch(self.buf, self.hold)
                self.cond.notify()

    def take(self):
        with self.cond:
            while self.batch is None:
                self.cond.wait()
            batch, self.batch = self.batch, None
            self.cond.notify()
            return batch


def lock_job(a, gpu, kernel, hold):
    slot = Slot(hold)
    helper = Helper("producer", slot.produce, "prepare_batch")
    for _ in range(WARMUP_STEPS):
        slot.take()
        gpu.run(kernel)
    print(f"ready pid={os.getpid()}", flush=True)
    start = time.monotonic_ns()
    end = start + int(a.secs * 1e9)
    steps, waited = 0, 0
    now = start
    while now < end:
        t0 = time.monotonic_ns()
        slot.take()
        waited += time.monotonic_ns() - t0
        gpu.run(kernel)
        steps += 1
        now = time.monotonic_ns()
    helper.stop.set()
    with slot.cond:
        slot.cond.notify_all()
    helper.thread.join()
    return start, now, steps, {
        "holder": helper.truth(),
        "hold_ns": int(hold * 1e9),
        "lock_wait_ns": waited,
    }


# --- sparse-server, busy-server ------------------------------------------------------------


def start_client(port, mode, deadline_ns, gap_ms, seed):
    """The client, outside the job: double-forked and in a session of its own, so that its
    parent is not the server (see the module's docstring). Returns its PID."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(r)
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                argv = [sys.executable, os.path.abspath(__file__), "client", "--port", str(port)]
                argv += ["--mode", mode, "--deadline-ns", str(deadline_ns), "--seed", str(seed)]
                argv += ["--gap-ms", str(gap_ms[0]), str(gap_ms[1])]
                os.execv(sys.executable, argv)
            os.write(w, str(grandchild).encode())
        finally:
            os._exit(0)
    os.close(w)
    pid = int(os.read(r, 32) or b"0")
    os.close(r)
    os.waitpid(child, 0)
    if pid == 0:
        raise RuntimeError("the client did not start")
    return pid


def recv_exact(conn, n, sel):
    """One request's bytes; blocks in recv, or in epoll_wait first when `sel` is given.
    Returns None when the client is gone."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if sel is not None:
            sel.select()
        k = conn.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def preprocess_request(payload, seconds):
    burn(seconds)
    return payload


class Server:
    def __init__(self, a, kernel, host):
        self.gpu = None
        self.kernel = kernel
        self.host = host
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.port = self.listener.getsockname()[1]
        mode = "sparse" if a.scenario == "sparse-server" else "busy"
        # The client's own deadline, well past the server's: it normally ends at the
        # server's close; this only bounds a client whose server hung.
        deadline = time.monotonic_ns() + int((a.secs + 60) * 1e9)
        self.client_pid = start_client(self.port, mode, deadline, a.gap_ms, a.seed)
        self.listener.settimeout(30)
        self.conn, _ = self.listener.accept()
        # Blocking, no timeout: a timeout would make Python poll() before every recv.
        self.conn.settimeout(None)
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sel = None
        if a.io == "epoll":
            self.sel = selectors.EpollSelector()
            self.sel.register(self.conn, selectors.EVENT_READ)

    def serve_one(self):
        """Waits for a request and serves it: (waited ns, host ns, latency ns, service ns,
        host CPU ns), or None when the client is gone."""
        t0 = time.monotonic_ns()
        req = recv_exact(self.conn, REQUEST_BYTES, self.sel)
        if req is None:
            return None
        t1 = time.monotonic_ns()
        c1 = time.thread_time_ns()
        rid, sent_ns = REQUEST.unpack_from(req)
        preprocess_request(req[REQUEST.size :], self.host)
        t2 = time.monotonic_ns()
        c2 = time.thread_time_ns()
        self.gpu.run(self.kernel)
        done = time.monotonic_ns()
        self.conn.sendall(REPLY.pack(rid, done))
        return t1 - t0, t2 - t1, done - sent_ns, done - t1, c2 - c1

    def socket_truth(self):
        local, peer = self.conn.getsockname(), self.conn.getpeername()
        return {
            "protocol": "tcp",
            "local_addr": local[0],
            "local_port": local[1],
            "peer_addr": peer[0],
            "peer_port": peer[1],
        }

    def close(self):
        if self.sel is not None:
            self.sel.close()
        self.conn.close()
        self.listener.close()


def server_job(a, kernel, host):
    # The client is forked before the driver starts: a fork after cuInit would copy a
    # process without the driver's device threads.
    server = Server(a, kernel, host)
    server.gpu = Gpu()
    for _ in range(WARMUP_REQUESTS):
        if server.serve_one() is None:
            raise RuntimeError("the client left during the warm-up")
    sock = server.socket_truth()
    print(f"client pid={server.client_pid} port={server.port}", flush=True)
    print(f"ready pid={os.getpid()}", flush=True)
    start = time.monotonic_ns()
    end = start + int(a.secs * 1e9)
    waited, host_ns, host_cpu_ns, latencies, services = 0, 0, 0, [], []
    now = start
    while now < end:
        served = server.serve_one()
        if served is None:
            raise RuntimeError("the client left before the end")
        waited += served[0]
        host_ns += served[1]
        host_cpu_ns += served[4]
        latencies.append(served[2])
        services.append(served[3])
        now = time.monotonic_ns()
    server.close()
    requests = len(latencies)
    extra = {
        "requests": requests,
        "requests_per_sec": requests / ((now - start) / 1e9),
        "socket": sock,
        "client": {"pid": server.client_pid, "comm": CLIENT_COMM.decode(), "outside_job": True},
        "io": a.io,
        "host_ns": host_ns,
        "host_cpu_ns": host_cpu_ns,
        "wait_ns": waited,
        "latency_p50_ns": p50(latencies),
        "service_p50_ns": p50(services),
    }
    if a.scenario == "sparse-server":
        extra["gap_ms"] = list(a.gap_ms)
    else:
        extra["outstanding"] = 2
    return start, now, requests, extra


def client_main(argv):
    p = argparse.ArgumentParser(prog="waits.py client")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", choices=["sparse", "busy"], required=True)
    p.add_argument("--deadline-ns", type=int, required=True)
    p.add_argument("--gap-ms", type=float, nargs=2, default=[150.0, 250.0])
    p.add_argument("--seed", type=int, default=38)
    a = p.parse_args(argv)
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, ctypes.c_char_p(CLIENT_COMM), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass
    rng = random.Random(a.seed)
    conn = socket.create_connection(("127.0.0.1", a.port), timeout=30)
    conn.settimeout(None)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = bytes(REQUEST_BYTES - REQUEST.size)
    rid = 0

    def send():
        nonlocal rid
        rid += 1
        conn.sendall(REQUEST.pack(rid, time.monotonic_ns()) + payload)

    def reply():
        got = b""
        while len(got) < REPLY.size:
            k = conn.recv(REPLY.size - len(got))
            if not k:
                return False
            got += k
        return True

    try:
        if a.mode == "busy":
            # Two outstanding: while the server works on one, the next waits in its socket.
            send()
            send()
            while time.monotonic_ns() < a.deadline_ns and reply():
                send()
        else:
            # Open loop on a schedule of random gaps, as independent users send; the service
            # (~26 ms) is far shorter than the shortest gap, so no request waits for another.
            next_send = time.monotonic()
            while time.monotonic_ns() < a.deadline_ns:
                send()
                if not reply():
                    break
                next_send += rng.uniform(a.gap_ms[0], a.gap_ms[1]) / 1e3
                time.sleep(max(0.0, next_send - time.monotonic()))
    except OSError:
        pass  # the server closed the connection: the job is over
    conn.close()


def main():
    if sys.argv[1:2] == ["client"]:
        client_main(sys.argv[2:])
        return
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(DEFAULTS))
    p.add_argument("--secs", type=float, required=True)
    p.add_argument("--truth")
    p.add_argument("--kernel-ms", type=float, help="the kernel's time a step or request")
    p.add_argument(
        "--host-ms", type=float, help="lock: the producer's work a batch; servers: the host work a request"
    )
    p.add_argument("--no-thread", action="store_true", help="gil-*: run the loop without the helper thread")
    p.add_argument("--io", choices=["recv", "epoll"], default="recv", help="servers: how the server waits")
    p.add_argument(
        "--gap-ms", type=float, nargs=2, default=[150.0, 250.0], help="sparse-server: the client's gaps"
    )
    p.add_argument("--seed", type=int, default=38, help="servers: the client's random gaps")
    a = p.parse_args()
    d = DEFAULTS[a.scenario]
    kernel = (d["kernel_ms"] if a.kernel_ms is None else a.kernel_ms) / 1e3
    host = (d["host_ms"] if a.host_ms is None else a.host_ms) / 1e3
    if a.scenario.startswith("gil-"):
        start, end, steps, extra = gil_job(a, Gpu(), kernel)
    elif a.scenario == "lock":
        start, end, steps, extra = lock_job(a, Gpu(), kernel, host)
    else:
        start, end, steps, extra = server_job(a, kernel, host)
    truth = {
        "scenario": a.scenario,
        "cause": CAUSES[a.scenario],
        "pid": os.getpid(),
        "feeder_tid": threading.get_native_id(),
        "start_ns": start,
        "end_ns": end,
        "steps": steps,
        "steps_per_sec": steps / max((end - start) / 1e9, 1e-9),
        "kernel_ns": int(kernel * 1e9),
        "gpu_busy_ns": steps * int(kernel * 1e9),
    }
    truth.update(extra)
    write_truth(a.truth, truth)
    print(f"steps={steps} secs={(end - start) / 1e9:.3f} steps_per_sec={truth['steps_per_sec']:.3f}", flush=True)


if __name__ == "__main__":
    main()
