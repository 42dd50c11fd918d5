#!/usr/bin/env bash
# The acceptance check on a real NVIDIA GPU (issue 36), for a machine that cannot build:
# binaries built elsewhere (scripts/h200/prepare.sh) are taken from $BIN. Each step has its own
# timeout; a failed step says why and the check goes on. Everything lands in $OUT: summary.txt
# (the verdicts, short), check.log (every step's output) and results.tar.gz (per scenario the
# JSON and text reports, flamegraphs, the job's steps; the facts, doctor). No recordings.
#
#   BIN=.h200/bin OUT=/tmp/h200-out bash scripts/h200/check.sh
# ONLY="healthy launch_overhead" runs just those scenarios (no NVML facts, doctor, fixed
# variants or stallgen); RECORD_ARGS adds arguments to every `stallscope record`.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$(cd "${BIN:-.h200/bin}" && pwd)
OUT=${OUT:-$PWD/h200-out}
SECS=${SECS:-15}
ONLY=${ONLY:-}
RECORD_ARGS=${RECORD_ARGS:-}
wanted() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }
R=$OUT/results
mkdir -p "$R"
exec 3>>"$OUT/summary.txt"
say() { printf '%s\n' "$*" | tee -a "$OUT/check.log" >&3; }
log() { printf '%s\n' "$*" >>"$OUT/check.log"; }
step() { # step NAME SECONDS CMD...: runs CMD under a timeout, its output to the log
  local name=$1 secs=$2; shift 2
  log "=== $name: $*"
  timeout -k 5 "$secs" "$@" >>"$OUT/check.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || say "step $name: rc $rc$([ $rc -eq 124 ] && echo ' (timed out)')"
  return $rc
}
T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0))s; }

# 0. The machine: kernel, BTF, tracing, the driver, the CUDA stack.
{
  echo "date: $(date -u +%FT%TZ)"
  echo "uname: $(uname -a)"
  grep -E '^(PRETTY_NAME)=' /etc/os-release
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "cpus: $(nproc), mem: $(awk '/MemTotal/{print $2" kB"}' /proc/meminfo)"
  echo "btf: $(ls -l /sys/kernel/btf/vmlinux 2>&1)"
  echo "tracefs: $(ls /sys/kernel/tracing/events/sched/sched_switch 2>&1 | tr '\n' ' ')"
  echo "perf_event_paranoid: $(cat /proc/sys/kernel/perf_event_paranoid 2>&1)"
  echo "unprivileged_bpf_disabled: $(cat /proc/sys/kernel/unprivileged_bpf_disabled 2>&1)"
  echo "lockdown: $(cat /sys/kernel/security/lockdown 2>&1)"
  echo "mounts: $(grep -E 'tracefs|debugfs|bpf|cgroup2' /proc/mounts | awk '{print $2":"$3}' | tr '\n' ' ')"
  echo "driver: $(head -1 /proc/driver/nvidia/version 2>&1)"
  nvidia-smi --query-gpu=name,driver_version,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv 2>&1
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1
  echo "libcuda: $(ldconfig -p | awk '/libcuda.so.1 /{print $NF}' | tr '\n' ' ')"
  echo "libnvidia-ml: $(ldconfig -p | awk '/libnvidia-ml.so.1 /{print $NF}' | tr '\n' ' ')"
  echo "stallscope binary needs: $(objdump -T "$BIN/stallscope" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
} >"$R/machine.txt" 2>&1
nvidia-smi -q >"$R/nvidia-smi-q.txt" 2>&1
# aya reads tracepoint ids from tracefs; mount it (and debugfs) where the image did not.
if [ ! -d /sys/kernel/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing >>"$R/machine.txt" 2>&1 && echo "mounted tracefs" >>"$R/machine.txt"
fi
if ! grep -q debugfs /proc/mounts; then
  mount -t debugfs nodev /sys/kernel/debug >>"$R/machine.txt" 2>&1 && echo "mounted debugfs" >>"$R/machine.txt"
fi
say "machine: $(grep -E '^(uname|driver|btf|python)' "$R/machine.txt" | cut -c1-140 | tr '\n' '|')"
say "$(sed -n '/^name,/{n;p}' "$R/machine.txt")"

# 1. Does the recorder run on this kernel at all? On a sleep, then feature by feature.
sleep 60 &
SLEEPER=$!
if step record-sleep 40 "$BIN/stallscope" record --pid $SLEEPER -d 3s --json -o /tmp/sleep.rec --flamegraph-dir "$R" --no-flamegraphs; then
  say "PASS record on a sleep ($(elapsed))"
  RECORD_OK=1
else
  say "FAIL record on a sleep: $(grep -iE 'error|fail' "$OUT/check.log" | tail -3 | tr '\n' '|')"
  RECORD_OK=0
  for variant in "--switch-hook tracepoint" "--switch-hook per-thread" "--unwind fp --no-python" "--rate 0" "--no-cuda-probes --no-gpu"; do
    # shellcheck disable=SC2086
    if step "record-sleep $variant" 40 "$BIN/stallscope" record --pid $SLEEPER -d 2s -o /tmp/sleep.rec $variant; then
      say "  but it runs with $variant"
    fi
  done
fi
kill $SLEEPER 2>/dev/null

if [ -z "$ONLY" ]; then
# 2. NVML as stallscope depends on it: the utilization samples' spacing (under load), GPM,
#    the link, clocks and throttle reasons.
step nvml-facts 60 python3 "$HERE/nvml_facts.py" "$R/nvml.json"
[ -s "$R/nvml.json" ] && say "nvml: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(", ".join(f"{k}={d[k]}" for k in ("name","driver","sample_period_ms","samples","gpm_supported","pcie","sm_clock_mhz","clock_event_reasons")))' "$R/nvml.json")"

# 3. doctor.
# doctor exits 1 on a warning and 2 on a failure: its verdict, not a failed step.
timeout 60 "$BIN/stallscope" doctor >"$R/doctor.txt" 2>&1
say "doctor exit status: $?"
timeout 60 "$BIN/stallscope" doctor --format json >"$R/doctor.json" 2>>"$OUT/check.log"
say "doctor: $(grep -ciE 'warn|fail|crit' "$R/doctor.txt") lines warn/fail; first: $(head -3 "$R/doctor.txt" | tr '\n' '|' | cut -c1-200)"
fi

# 4. The scenarios: a real PyTorch job each, recorded by PID for $SECS s.
#    scenario NAME [PRE POST]: PRE/POST seconds of the job run unrecorded around the recording.
scenario() {
  local s=$1 pre=${2:-0} post=${3:-0} d=$R/$1
  wanted "$s" || return 0
  mkdir -p "$d"
  python3 "$HERE/job.py" --scenario "$s" --secs $((pre + SECS + post + 3)) --steps "$d/steps.txt" >"$d/job.out" 2>&1 &
  local job=$! pid=""
  for _ in $(seq 300); do
    pid=$(sed -n 's/^ready pid=\([0-9]*\).*/\1/p' "$d/job.out")
    [ -n "$pid" ] && break
    kill -0 $job 2>/dev/null || break
    sleep 0.2
  done
  if [ -z "$pid" ]; then
    say "FAIL $s: the job did not start: $(tail -3 "$d/job.out" | tr '\n' '|')"
    kill $job 2>/dev/null
    wait $job 2>/dev/null
    return
  fi
  sleep "$pre"
  if [ $RECORD_OK = 1 ]; then
    step "record $s" $((SECS + 60)) sh -c "'$BIN/stallscope' record --pid $pid -d ${SECS}s $RECORD_ARGS --format json,html -o /tmp/$s.rec --flamegraph-dir '$d' > '$d/report.json' 2> '$d/record.log'"
    step "report $s" 120 sh -c "'$BIN/stallscope' report /tmp/$s.rec --no-flamegraphs > '$d/report.txt' 2>> '$d/record.log'"
  fi
  wait $job
  say "$s ($(elapsed)): $(python3 "$HERE/verdict.py" "$s" "$d" 2>&1 | tr '\n' ' ')"
  rm -f "/tmp/$s.rec"*
}
fixed() { # fixed NAME: the job with its cause removed, unrecorded, for the measured speedup
  local s=$1 d=$R/$1.fixed
  [ -z "$ONLY" ] || return 0
  mkdir -p "$d"
  step "fixed $s" $((SECS + 60)) python3 "$HERE/job.py" --scenario "$s" --secs "$SECS" --fixed --steps "$d/steps.txt" >"$d/job.out" 2>&1
  say "$s fixed: $(python3 "$HERE/verdict.py" --rate "$d/steps.txt")"
}
scenario healthy 5 5
scenario dataloader_cpu
fixed dataloader_cpu
scenario pageable_copy
scenario pinned_copy
scenario launch_overhead
scenario host_compute
fixed host_compute

# 5. stallgen's own scenario on the real GPU (the driver API and its PTX spin kernel).
if [ -z "$ONLY" ] && [ -x "$BIN/stallgen" ] && [ $RECORD_OK = 1 ]; then
  d=$R/stallgen-dataloader-cpu
  mkdir -p "$d"
  "$BIN/stallgen" --scenario dataloader-cpu --secs 12 --truth "$d/truth.json" >"$d/stallgen.out" 2>&1 &
  for _ in $(seq 100); do grep -q '^ready' "$d/stallgen.out" && break; sleep 0.2; done
  pid=$(sed -n 's/^ready pid=\([0-9]*\).*/\1/p' "$d/stallgen.out")
  [ -n "$pid" ] && step "record stallgen" 60 sh -c "'$BIN/stallscope' record --pid $pid -d 8s --json -o /tmp/stallgen.rec --no-flamegraphs > '$d/report.json' 2> '$d/record.log'"
  wait
  say "stallgen dataloader-cpu: $(python3 "$HERE/verdict.py" stallgen "$d" 2>&1 | tr '\n' ' ')"
  rm -f /tmp/stallgen.rec*
fi

say "done in $(elapsed)"
cp "$OUT/summary.txt" "$R/"
tar -C "$OUT" -czf "$OUT/results.tar.gz" results && rm -rf "$R"
ls -l "$OUT" >>"$OUT/check.log"
