#!/usr/bin/env bash
# Records the GPU-half golden recordings: a few seconds of each stallgen scenario on the
# simulated GPU, attached by PID as a user would, into profiler-core/tests/recordings/gpu/.
# Their reports are blessed with
#   STALLSCOPE_BLESS=1 cargo test -p profiler-core --test gpu_goldens
# Re-record only when the recording format or the recorder changes what it writes; the
# golden test then needs no root and no timing luck. Run as root from the repository root:
#   bash scripts/record-gpu-goldens.sh [SCENARIO...]
set -euo pipefail
rel=$PWD/target/release
out=$PWD/profiler-core/tests/recordings/gpu
for f in stallscope stallgen libcuda.so libnvidia_ml.so libnccl.so; do
  [ -e "$rel/$f" ] || { echo "$rel/$f is missing: run cargo xtask build" >&2; exit 2; }
done
lib=$(mktemp -d)
trap 'rm -rf "$lib"' EXIT
cp "$rel/libcuda.so" "$lib/libcuda.so.1"
cp "$rel/libnvidia_ml.so" "$lib/libnvidia-ml.so.1"
cp "$rel/libnccl.so" "$lib/libnccl.so.2"
mkdir -p "$out"
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(dataloader-cpu disk cpu-contention host-compute
  pageable-copy pcie-degraded launch-bound nccl-straggler nccl-straggler-ddp gpu-straggler)
for s in "${scenarios[@]}"; do
  state=/dev/shm/stallscope-golden-$s-$$
  scenario=$s
  extra=()
  env=()
  case $s in
    # Recorded before the simulated NCCL's waits were busy and before GPM: kept that way.
    nccl-straggler) extra=(--ranks 2) env=(STALLSCOPE_SIMGPU_NCCL_WAIT=idle STALLSCOPE_SIMGPU_GPM=0) ;;
    # DDP-form steps, waits busy as on hardware, GPM on.
    nccl-straggler-ddp) scenario=nccl-straggler extra=(--ranks 4) ;;
    gpu-straggler) extra=(--ranks 4) ;;
  esac
  env "${env[@]}" LD_LIBRARY_PATH=$lib STALLSCOPE_SIMGPU_STATE=$state \
    "$rel/stallgen" --scenario "$scenario" --secs 12 "${extra[@]}" > "$lib/$s.out" 2> "$lib/$s.err" &
  job=$!
  for _ in $(seq 600); do grep -q '^ready pid=' "$lib/$s.out" && break; sleep 0.1; done
  pid=$(sed -n 's/^ready pid=\([0-9]*\).*/\1/p' "$lib/$s.out" | head -1)
  [ -n "$pid" ] || { echo "$s: stallgen never became ready: $(cat "$lib/$s.err")" >&2; exit 1; }
  # Past the first steps (CUDA set-up, the first batches), as a user attaching to a job would.
  sleep 2
  env "${env[@]}" STALLSCOPE_SIMGPU_STATE=$state "$rel/stallscope" record -d 4s -o "$out/v1-$s.rec" \
    --pid "$pid" --nvml-lib "$lib/libnvidia-ml.so.1" --no-flamegraphs > /dev/null
  kill "$job" 2> /dev/null || true
  wait "$job" 2> /dev/null || true
  rm -f "$state"
  echo "$s: $(stat -c %s "$out/v1-$s.rec") bytes"
done
