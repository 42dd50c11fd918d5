"""Decodes a stallscope .pftrace with Perfetto's own schema (perfetto_trace_pb2 from the
`perfetto` package) and prints, as JSON, what the tests check: every track with its parent,
kind and names; per track the slices (count, time per name, time per `part`), counters and
checks that its timestamps never go back and its slices never overlap; the perf samples."""
import json
import sys
from collections import defaultdict

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

TYPE_SLICE_BEGIN, TYPE_SLICE_END, TYPE_INSTANT, TYPE_COUNTER = 1, 2, 3, 4


def annotations(ev):
    out = {}
    for a in ev.debug_annotations:
        kind = a.WhichOneof("value")
        out[a.name] = getattr(a, kind) if kind else None
    return out


def main(path):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    tracks = {}
    per_track = defaultdict(lambda: {
        "slices": 0, "by_name": defaultdict(int), "by_part": defaultdict(int),
        "counters": 0, "instants": 0, "monotonic": True, "overlaps": 0, "unclosed": 0,
        "last_ts": 0, "open": None,
    })
    samples = 0
    sample_pids = set()
    metadata = []
    names = {}
    for p in trace.packet:
        seq = p.trusted_packet_sequence_id
        # Interned ids are per packet sequence.
        for n in p.interned_data.event_names:
            names[(seq, n.iid)] = n.name
        kind = p.WhichOneof("data")
        if kind == "track_descriptor":
            d = p.track_descriptor
            t = {"uuid": d.uuid, "parent": d.parent_uuid if d.HasField("parent_uuid") else None,
                 "name": d.name, "kind": "plain"}
            if d.HasField("process"):
                t.update(kind="process", pid=d.process.pid, name=d.process.process_name)
            elif d.HasField("thread"):
                t.update(kind="thread", pid=d.thread.pid, tid=d.thread.tid, name=d.thread.thread_name)
            elif d.HasField("counter"):
                t.update(kind="counter", unit=d.counter.unit_name)
            tracks[d.uuid] = t
        elif kind == "track_event":
            ev = p.track_event
            s = per_track[ev.track_uuid]
            if p.timestamp < s["last_ts"]:
                s["monotonic"] = False
            s["last_ts"] = p.timestamp
            if ev.type == TYPE_SLICE_BEGIN:
                if s["open"] is not None:
                    s["overlaps"] += 1
                args = annotations(ev)
                name = ev.name if ev.HasField("name") else names.get((seq, ev.name_iid))
                s["open"] = (p.timestamp, name, args.get("part"))
            elif ev.type == TYPE_SLICE_END:
                if s["open"] is None:
                    s["overlaps"] += 1
                    continue
                start, name, part = s["open"]
                s["open"] = None
                s["slices"] += 1
                s["by_name"][name] += p.timestamp - start
                s["by_part"][part or "idle"] += p.timestamp - start
            elif ev.type == TYPE_COUNTER:
                s["counters"] += 1
            elif ev.type == TYPE_INSTANT:
                s["instants"] += 1
                metadata.append(annotations(ev))
        elif kind == "perf_sample":
            samples += 1
            sample_pids.add(p.perf_sample.pid)
    for s in per_track.values():
        s["unclosed"] = int(s.pop("open") is not None)
        s.pop("last_ts")
    json.dump({"tracks": list(tracks.values()), "events": {str(k): v for k, v in per_track.items()},
               "perf_samples": samples, "sample_pids": sorted(sample_pids), "metadata": metadata}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
