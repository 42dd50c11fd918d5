"""One line per scenario of the H200 check: the label against what was injected, from the
report's JSON and the job's own steps.

usage: verdict.py SCENARIO DIR     (DIR holds report.json and steps.txt)
       verdict.py --rate STEPS     (steps per second over a steps file)
"""
import json
import os
import sys

INJECTED = {
    "healthy": None,
    "dataloader_cpu": "dataloader_cpu",
    "pageable_copy": "pinned_memory_copy",
    "pinned_copy": None,
    "launch_overhead": "launch_overhead",
    "host_compute": "host_compute",
    "stallgen": "dataloader_cpu",
}


def steps(path):
    try:
        return [int(x) for x in open(path).read().split()]
    except OSError:
        return []


def rate(ts, lo=None, hi=None):
    ts = [t for t in ts if (lo is None or t >= lo) and (hi is None or t < hi)]
    if len(ts) < 2 or ts[-1] == ts[0]:
        return None
    return (len(ts) - 1) / ((ts[-1] - ts[0]) / 1e9)


def main():
    if sys.argv[1] == "--rate":
        r = rate(steps(sys.argv[2]))
        print(f"{r:.2f} steps/s" if r else "no steps")
        return
    name, d = sys.argv[1], sys.argv[2]
    try:
        rep = json.load(open(os.path.join(d, "report.json")))
    except (OSError, ValueError) as e:
        print(f"FAIL no report ({e})")
        return
    if not rep.get("gpus"):
        print(f"FAIL no GPU in the report; unavailable: {rep.get('unavailable')}")
        return
    g = rep["gpus"][0]
    obs = max(g["observed_ns"], 1)
    shares = {c: v / obs for c, v in g["idle_by_cause"].items()}
    top = max(shares, key=shares.get) if shares else None
    verdict = rep["verdict"]["cause"]
    want = INJECTED.get(name)
    if want is None:
        ok = verdict is None
    else:
        ok = verdict == want
    out = [
        "PASS" if ok else "FAIL",
        f"injected={want} verdict={verdict}/{rep['verdict'].get('severity')}",
        f"busy={g['busy_ns'] / obs:.0%} idle={g['idle_ns'] / obs:.0%} waiting={g.get('waiting_ns', 0) / obs:.0%}",
        "causes=" + ",".join(f"{c}:{s:.0%}" for c, s in sorted(shares.items(), key=lambda x: -x[1])),
        f"samples={g['samples']} sm_active={g.get('sm_active_pct')} lost_events={rep.get('lost_events')}",
    ]
    cuda = rep.get("cuda") or {}
    libs = cuda.get("libraries") or []
    out.append("probes=" + ";".join(
        f"{l['library']}:{os.path.basename(l['path'])}:{l['attached']}att/{len(l.get('missing') or [])}miss" for l in libs))
    launches = {}
    calls = 0
    apis = {}
    for p in cuda.get("processes") or []:
        for api, n in (p.get("launches_by_api") or {}).items():
            launches[api] = launches.get(api, 0) + n
        calls += sum(c.get("calls", 0) for c in p.get("calls") or [])
        for c in p.get("calls") or []:
            apis[c["api"]] = apis.get(c["api"], 0) + c.get("calls", 0)
        if p.get("pageable_copy_bytes") or p.get("pinned_copy_bytes"):
            out.append(f"copies pid {p['pid']}: pageable={p['pageable_copy_bytes'] >> 20}MiB pinned={p['pinned_copy_bytes'] >> 20}MiB")
    per_sec = sum((p.get("launches") or {}).get("per_sec", 0) for p in cuda.get("processes") or [])
    out.append(f"cuda_calls={calls} launches={launches or 'none'} launches_per_s={per_sec:.0f} apis={apis}")
    ts = steps(os.path.join(d, "steps.txt"))
    lo = rep["start_ns"]
    hi = lo + rep["duration_ns"]
    inside, outside = rate(ts, lo, hi), None
    before, after = [t for t in ts if t < lo], [t for t in ts if t >= hi]
    spread = (before[-1] - before[0] if before else 0) + (after[-1] - after[0] if after else 0)
    if len(before) > 1 and len(after) > 1 and spread > 0:
        outside = (len(before) - 1 + len(after) - 1) / (spread / 1e9)
    out.append(f"steps_in_recording={sum(lo <= t < hi for t in ts)} rate_in={inside and round(inside, 2)}/s")
    if name == "launch_overhead" and inside:
        # job.py's launch_overhead step is 2,000 element-wise kernels and a sync.
        out.append(f"job_launches_per_s={2000 * inside:.0f}")
    if outside and inside:
        out.append(f"rate_outside={outside:.2f}/s ratio={inside / outside:.3f}")
    print(" ".join(out))


main()
