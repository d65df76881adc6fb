"""Wall time of `skill-run --profile` on the bundled example, as a user runs it (a fresh process).

    .venv/bin/python benchmarks/bench_profile_speed.py [--runs 5] [--trace FILE] [--out results/x.json]

Three conditions, each a fresh ``python -m skillrun --profile TRACE`` with stdout to a pipe:

- ``no_cache``: ``SKILLRUN_NO_CACHE=1``, every validation artifact parsed (the behaviour before the
  evidence cache);
- ``cold_cache``: an empty cache folder (the first run after a change: it parses and writes the cache);
- ``warm_cache``: the cache written by the run before (every later run).

Prints the median, min and max of each and, with ``--out``, writes them as JSON. The goal
(issue 38) is a warm run of at most 1.5 s on a 2-core machine. Timings on a shared machine are
noisy: the machine's load average is recorded beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "runner" / "skillrun" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz"


def _run(trace: Path, env: dict[str, str]) -> float:
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "skillrun", "--profile", str(trace)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    dt = time.perf_counter() - t
    if res.returncode not in (0, 4):
        raise SystemExit(f"skill-run failed ({res.returncode}): {res.stderr.decode()[-400:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--trace", type=Path, default=EXAMPLE)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    base = dict(os.environ, COLUMNS="120")
    base.pop("SKILLRUN_NO_CACHE", None)
    out: dict = {"trace": str(a.trace.relative_to(REPO) if a.trace.is_relative_to(REPO) else a.trace),
                 "runs": a.runs, "cpus": os.cpu_count(), "python": platform.python_version(),
                 "loadavg_before": list(os.getloadavg()), "seconds": {}}
    with tempfile.TemporaryDirectory() as tmp:
        conds = {"no_cache": [], "cold_cache": [], "warm_cache": []}
        for i in range(a.runs):
            conds["no_cache"].append(_run(a.trace, dict(base, SKILLRUN_NO_CACHE="1")))
            folder = Path(tmp) / f"cache{i}"
            conds["cold_cache"].append(_run(a.trace, dict(base, SKILLRUN_CACHE_DIR=str(folder))))
            conds["warm_cache"].append(_run(a.trace, dict(base, SKILLRUN_CACHE_DIR=str(folder))))
    out["loadavg_after"] = list(os.getloadavg())
    for name, ts in conds.items():
        out["seconds"][name] = {"median": round(statistics.median(ts), 3), "min": round(min(ts), 3),
                                "max": round(max(ts), 3), "all": [round(t, 3) for t in ts]}
        print(f"{name:11s} median {statistics.median(ts):6.2f} s  min {min(ts):6.2f}  max {max(ts):6.2f}  ({len(ts)} runs)")
    print(f"load average before/after: {out['loadavg_before'][0]:.2f} / {out['loadavg_after'][0]:.2f} on {out['cpus']} CPUs")
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
