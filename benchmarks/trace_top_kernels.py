"""Print the hottest GPU kernels of a torch.profiler Chrome trace (.json or .json.gz), with the
aten op that launched each (matched through the trace's correlation / External id links).

    python benchmarks/trace_top_kernels.py trace.json.gz [--top 15]

Standard library only, so it runs on the bare GPU image right after profiling.
"""
from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def top_kernels(trace: dict, top: int = 15) -> list[tuple[str, int, float, list[str]]]:
    events = trace.get("traceEvents", [])
    ops_by_ext: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for ev in events:
        if ev.get("cat") == "cpu_op":
            ext = ev.get("args", {}).get("External id")
            if ext is not None:
                dims = ev.get("args", {}).get("Input Dims")
                ops_by_ext[ext].append((ev.get("name", ""), json.dumps(dims)[:120] if dims else ""))
    stats: dict[str, list] = {}
    for ev in events:
        if ev.get("cat") != "kernel":
            continue
        name = ev.get("name", "")
        st = stats.setdefault(name, [0, 0.0, set()])
        st[0] += 1
        st[1] += float(ev.get("dur", 0.0))
        ext = ev.get("args", {}).get("External id")
        for op, dims in ops_by_ext.get(ext, [])[:2]:
            st[2].add(f"{op} {dims}".strip())
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][1])[:top]
    return [(name, st[0], st[1], sorted(st[2])[:3]) for name, st in ranked]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    for path in args.traces:
        rows = top_kernels(load(path), args.top)
        total = sum(r[2] for r in rows) or 1.0
        print(f"\n== {path}: top {len(rows)} kernels by device time")
        for name, calls, us, ops in rows:
            print(f"{us:10.1f} us {100 * us / total:5.1f}% {calls:5d}x  {name[:200]}")
            for op in ops:
                print(f"{'':30}<- {op}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
