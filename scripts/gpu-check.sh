#!/usr/bin/env bash
# The real-GPU check, for a machine with an NVIDIA GPU and driver (not part of CI).
# Builds stallscope, prints the NVML and CUDA facts the design depends on, runs stallgen's
# scenarios on the real GPU under `stallscope record --pid`, and, where PyTorch is installed,
# a real training loop with a slow DataLoader transform then a healthy phase. Asserts the
# labels. Keeps its output short; logs go to $OUT (default ./gpu-check-out).
# Run as root from the repository root:  bash scripts/gpu-check.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
fail=0
say() { printf '%s\n' "$*"; }
check() { # check NAME CONDITION-COMMAND...
  local name=$1; shift
  if "$@"; then say "PASS $name"; else say "FAIL $name"; fail=1; fi
}

[ -e /proc/driver/nvidia/version ] || { say "no NVIDIA driver here (/proc/driver/nvidia/version)"; exit 2; }
say "driver: $(head -1 /proc/driver/nvidia/version | cut -c1-100)"

cargo xtask build > "$OUT/build.log" 2>&1 || { say "FAIL build (see $OUT/build.log)"; exit 1; }
BIN=$PWD/target/release

# 1. NVML facts: sample spacing and the timestamp clock, through a short stallscope run
# against an idle process (the recording holds the rebased samples and the detected clock).
python3 - "$OUT" <<'PY' > "$OUT/nvml-facts.txt" 2>&1
import ctypes, sys, time
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
class Sample(ctypes.Structure):
    _fields_ = [("ts", ctypes.c_ulonglong), ("val", ctypes.c_ulonglong)]
vt = ctypes.c_int(); n = ctypes.c_uint(0)
nvml.nvmlDeviceGetSamples(dev, 1, ctypes.c_ulonglong(0), ctypes.byref(vt), ctypes.byref(n), None)
buf = (Sample * max(n.value, 1))()
r = nvml.nvmlDeviceGetSamples(dev, 1, ctypes.c_ulonglong(0), ctypes.byref(vt), ctypes.byref(n), buf)
ts = sorted(buf[i].ts for i in range(n.value))
gaps = [b - a for a, b in zip(ts, ts[1:]) if b > a]
real = time.clock_gettime_ns(time.CLOCK_REALTIME) // 1000
boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000
clock = "none" if not ts else ("realtime" if abs(ts[-1] - real) < abs(ts[-1] - boot) else "boottime")
print(f"samples={n.value} ret={r} min_spacing_us={min(gaps) if gaps else 0} clock={clock}")
PY
say "nvml: $(tail -1 "$OUT/nvml-facts.txt")"
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
nm -D --defined-only "$LIBCUDA" 2>/dev/null | awk '{print $3}' \
  | grep -E '^cu(LaunchKernel|StreamSynchronize|EventSynchronize|CtxSynchronize|MemcpyHtoDAsync|MemcpyDtoHAsync|MemcpyAsync|MemHostAlloc|MemHostRegister|MemAllocHost)' \
  | sort > "$OUT/libcuda-symbols.txt"
say "libcuda: $LIBCUDA, $(wc -l < "$OUT/libcuda-symbols.txt") probed entry points exported (list in $OUT/libcuda-symbols.txt)"
"$BIN/stallgen" --check-gpu > "$OUT/check-gpu.txt" 2>&1
say "stallgen: $(tr '\n' ' ' < "$OUT/check-gpu.txt" | cut -c1-160)"

# 2. stallgen's scenarios on the real GPU, attached by PID.
share() { # share JSON CAUSE -> percent of idle labelled CAUSE
  python3 -c "import json,sys; g=json.load(open(sys.argv[1]))['gpus'][0]; print(int(100*g['idle_by_cause'].get(sys.argv[2],0)/max(g['idle_ns'],1)))" "$1" "$2"
}
for pair in healthy:none dataloader-cpu:dataloader_cpu disk:disk cpu-contention:cpu_contention host-compute:host_compute; do
  s=${pair%%:*}; want=${pair##*:}
  "$BIN/stallgen" --scenario "$s" --secs 14 --truth "$OUT/$s.truth" > "$OUT/$s.stallgen" 2>&1 &
  for _ in $(seq 100); do grep -q '^ready' "$OUT/$s.stallgen" && break; sleep 0.2; done
  pid=$(sed -n 's/^ready pid=\([0-9]*\).*/\1/p' "$OUT/$s.stallgen")
  "$BIN/stallscope" record --pid "$pid" -d 10s --json -o "$OUT/$s.rec" > "$OUT/$s.json" 2> "$OUT/$s.log"
  wait
  if [ "$want" = none ]; then
    check "$s: GPU idle under 10%, no verdict" python3 -c "import json,sys; d=json.load(open(sys.argv[1])); g=d['gpus'][0]; sys.exit(not (g['idle_ns'] < 0.1*g['observed_ns'] and d['verdict']['cause'] is None))" "$OUT/$s.json"
  else
    p=$(share "$OUT/$s.json" "$want")
    check "$s: ${p}% of idle labelled $want (want >= 90)" test "$p" -ge 90
  fi
done

# 3. A real PyTorch loop, where one is installed: a slow transform, then a healthy phase.
if python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  cat > "$OUT/torch_loop.py" <<'PY'
import time, torch
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __init__(self, slow): self.slow = slow
    def __len__(self): return 10**9
    def __getitem__(self, i):
        end = time.process_time() + (0.05 if self.slow else 0.0)
        while time.process_time() < end: pass
        return torch.randn(3, 64, 64)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
print("ready", flush=True)
for slow, secs in ((True, 12), (False, 12)):
    loader = iter(DataLoader(Slow(slow), batch_size=64, num_workers=2))
    t = time.time()
    while time.time() - t < secs:
        x = next(loader).cuda().view(64, -1)[:, :4096]
        for _ in range(20): x = model(x)
        x.sum().item()
PY
  python3 "$OUT/torch_loop.py" > "$OUT/torch.out" 2>&1 &
  for _ in $(seq 300); do grep -q ready "$OUT/torch.out" && break; sleep 0.2; done
  "$BIN/stallscope" record --pid $! -d 22s --json -o "$OUT/torch.rec" > "$OUT/torch.json" 2> "$OUT/torch.log"
  wait
  check "pytorch: slow-transform phase labelled dataloader_cpu" python3 -c "
import json,sys
d=json.load(open(sys.argv[1])); secs=d['gpus'][0]['seconds']
slow=[s['cause'] for s in secs[1:9]]
sys.exit(not sum(c=='dataloader_cpu' for c in slow) >= 6)" "$OUT/torch.json"
else
  say "skip pytorch: torch with CUDA is not installed"
fi
# 4. What real jobs reach, for the CUDA and NCCL probes.
if python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  # a. Which launch entry points a real PyTorch loop hits: probes on every launch, counted
  #    per entry point (libcuda cuLaunchKernel vs _ptsz vs cudart cudaLaunchKernel).
  cat > "$OUT/torch_launch.py" <<'PY'
import time, torch
x = torch.randn(1024, 1024, device="cuda")
print("ready", flush=True)
t = time.time()
while time.time() - t < 8:
    for _ in range(100): x = torch.relu(x * 0.5 + 0.1)
    torch.cuda.synchronize()
PY
  python3 "$OUT/torch_launch.py" > "$OUT/torch_launch.out" 2>&1 &
  for _ in $(seq 300); do grep -q ready "$OUT/torch_launch.out" && break; sleep 0.2; done
  "$BIN/stallscope" record --pid $! -d 5s --launch-duty 100 --json -o "$OUT/launch.rec" > "$OUT/launch.json" 2> "$OUT/launch.log"
  wait
  say "launch entry points hit (per API, probes always on): $(python3 -c "
import json,sys
d=json.load(open(sys.argv[1])); out={}
for p in d['cuda']['processes']:
    for api,n in (p.get('launches_by_api') or {}).items(): out[api]=out.get(api,0)+n
print(out or 'none')" "$OUT/launch.json")"
  say "libraries probed: $(python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
print('; '.join(f\"{l['library']} {l['path']} ({l['attached']} probes, missing {[m[0] for m in l['missing']]})\" for l in d['cuda']['libraries']))" "$OUT/launch.json")"

  # b. A pageable and a pinned host-to-device copy, timed by PyTorch and classed by the probes.
  cat > "$OUT/torch_copy.py" <<'PY'
import time, torch
pageable = torch.empty(256 << 20, dtype=torch.uint8)
pinned = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
dev = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
print("ready", flush=True)
time.sleep(1)
for name, src in (("pageable", pageable), ("pinned", pinned)):
    torch.cuda.synchronize(); t = time.time()
    for _ in range(10): dev.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    print(f"{name}: {10 * 256 / 1024 / (time.time() - t):.1f} GB/s", flush=True)
time.sleep(1)
PY
  python3 "$OUT/torch_copy.py" > "$OUT/torch_copy.out" 2>&1 &
  for _ in $(seq 300); do grep -q ready "$OUT/torch_copy.out" && break; sleep 0.2; done
  "$BIN/stallscope" record --pid $! -d 6s --json -o "$OUT/copy.rec" > "$OUT/copy.json" 2> "$OUT/copy.log"
  wait
  say "copies timed by PyTorch: $(grep GB/s "$OUT/torch_copy.out" | tr '\n' ' ')"
  check "copies classed pinned and pageable by the probes" python3 -c "
import json,sys
d=json.load(open(sys.argv[1])); p=[x for x in d['cuda']['processes'] if x['pinned_copy_bytes'] or x['pageable_copy_bytes']]
print('  pinned', sum(x['pinned_copy_bytes'] for x in p) >> 20, 'MiB, pageable', sum(x['pageable_copy_bytes'] for x in p) >> 20, 'MiB')
sys.exit(not p or not all(x['pinned_copy_bytes'] >= (1 << 30) and x['pageable_copy_bytes'] >= (1 << 30) for x in p))" "$OUT/copy.json"

  # c. Two-process NCCL all-reduce with one slow rank (needs two GPUs: NCCL refuses two ranks
  #    on one device).
  gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  if [ "$gpus" -ge 2 ] && python3 -c 'import torch.distributed as d, sys; sys.exit(not d.is_nccl_available())'; then
    cat > "$OUT/torch_nccl.py" <<'PY'
import os, sys, time, torch, torch.distributed as dist
rank = int(sys.argv[1]); os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK=str(rank), WORLD_SIZE="2")
torch.cuda.set_device(rank); dist.init_process_group("nccl", rank=rank, world_size=2)
x = torch.randn(8 << 20, device="cuda")
print("ready", flush=True)
t = time.time()
while time.time() - t < 12:
    if rank == 1: time.sleep(0.05)          # the straggler: host work before each step
    for _ in range(5): y = x * 2
    dist.all_reduce(x); torch.cuda.synchronize()
dist.destroy_process_group()
PY
    for r in 0 1; do RANK=$r WORLD_SIZE=2 python3 "$OUT/torch_nccl.py" $r > "$OUT/nccl$r.out" 2>&1 & done
    for _ in $(seq 300); do grep -q ready "$OUT/nccl0.out" && grep -q ready "$OUT/nccl1.out" && break; sleep 0.2; done
    pids=$(pgrep -f "$OUT/torch_nccl.py" | sed 's/^/--pid /' | tr '\n' ' ')
    "$BIN/stallscope" record $pids -d 8s --json -o "$OUT/nccl.rec" > "$OUT/nccl.json" 2> "$OUT/nccl.log"
    wait
    check "nccl: the slow rank (1) is named the straggler" python3 -c "
import json,sys
d=json.load(open(sys.argv[1])); print('  ', d['ranks'].get('straggler', {}).get('text', d['ranks']))
sys.exit(d['ranks'].get('straggler', {}).get('rank') != 1)" "$OUT/nccl.json"
  else
    say "skip nccl: needs two GPUs and torch with NCCL ($gpus GPU(s) here)"
  fi
else
  say "skip CUDA probe checks: torch with CUDA is not installed"
fi
say "logs in $OUT"
exit $fail
