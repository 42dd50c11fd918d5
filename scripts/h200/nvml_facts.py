"""What NVML says on this machine, as stallscope depends on it (scripts/h200/check.sh).

The utilization samples' spacing is measured from their own timestamps while the GPU works
(an idle GPU produces none), and their clock recognised against CLOCK_REALTIME, BOOTTIME and
MONOTONIC. Each query is tried on its own; a failure is written as the error.

usage: nvml_facts.py OUT.json
"""
import json
import statistics
import sys
import time

import pynvml as N

facts = {}


def q(name, fn):
    try:
        facts[name] = fn()
    except Exception as e:  # noqa: BLE001 - every NVML failure is a fact worth keeping
        facts[name] = f"error: {e}"


N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
dec = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
q("name", lambda: dec(N.nvmlDeviceGetName(h)))
q("driver", lambda: dec(N.nvmlSystemGetDriverVersion()))
q("cuda_driver_version", lambda: N.nvmlSystemGetCudaDriverVersion_v2())
q("nvml_version", lambda: dec(N.nvmlSystemGetNVMLVersion()))
q("pcie", lambda: {
    "gen": N.nvmlDeviceGetCurrPcieLinkGeneration(h),
    "max_gen": N.nvmlDeviceGetMaxPcieLinkGeneration(h),
    "width": N.nvmlDeviceGetCurrPcieLinkWidth(h),
    "max_width": N.nvmlDeviceGetMaxPcieLinkWidth(h),
})
q("gpm_supported", lambda: bool(N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice))
q("mig_mode", lambda: N.nvmlDeviceGetMigMode(h))
q("power_limit_w", lambda: N.nvmlDeviceGetEnforcedPowerLimit(h) / 1000)
q("max_sm_clock_mhz", lambda: N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_SM))


def reasons():
    f = getattr(N, "nvmlDeviceGetCurrentClocksEventReasons", None) or N.nvmlDeviceGetCurrentClocksThrottleReasons
    return hex(f(h))


q("clock_event_reasons_idle", reasons)
q("sm_clock_mhz_idle", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM))
try:
    N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, 0)
    facts["samples_when_idle"] = "some"
except N.NVMLError as e:
    facts["samples_when_idle"] = f"error: {e}"

import torch  # noqa: E402 - after the idle readings, which a CUDA context would disturb

x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
start = time.time()
for _ in range(2500):  # about 3.5 s of GPU work
    y = x @ x
torch.cuda.synchronize()
loaded_s = time.time() - start
q("sm_clock_mhz", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM))
q("clock_event_reasons", reasons)
q("temperature_c", lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU))
q("power_w", lambda: N.nvmlDeviceGetPowerUsage(h) / 1000)
try:
    vtype, samples = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, 0)
    ts = sorted(s.timeStamp for s in samples)
    gaps = [b - a for a, b in zip(ts, ts[1:]) if b > a]
    now = {
        "realtime": time.clock_gettime_ns(time.CLOCK_REALTIME) // 1000,
        "boottime": time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000,
        "monotonic": time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000,
    }
    facts["samples"] = len(ts)
    facts["sample_period_ms"] = round(statistics.median(gaps) / 1000, 2) if gaps else None
    facts["sample_gap_min_max_ms"] = [min(gaps) / 1000, max(gaps) / 1000] if gaps else None
    facts["sample_clock"] = min(now, key=lambda k: abs(now[k] - ts[-1])) if ts else None
    facts["sample_values_last"] = [s.sampleValue.uiVal for s in samples][-12:]
    facts["loaded_s"] = round(loaded_s, 2)
except Exception as e:  # noqa: BLE001
    facts["samples"] = f"error: {e}"
    facts["sample_period_ms"] = None
json.dump(facts, open(sys.argv[1], "w"), indent=1)
print(json.dumps(facts))
