"""Ingestion speed on a >= 1 GB torch.profiler trace, against HolisticTraceAnalysis (HTA).

    .venv/bin/python benchmarks/bench_ingest.py [--size-gb 1.0] [--source FIXTURE] [--keep DIR] [--no-hta]

1. Builds the big trace from a real fixture (default: the H100 Qwen trace in ../shared/traces):
   the fixture's events are replicated N times as N profiler steps, with ts, correlation,
   External id, flow ids and Ev Idx shifted per step, and laid out the way Kineto writes one
   long capture: the CPU-side events of all steps first, then python_function events, then the
   GPU/runtime events. Written in Kineto's own JSON layout. N is printed.
2. Runs ``skillrun.ingest.ingest`` on it in a child process: wall time, peak RSS of that process
   and of its worker processes (``resource.getrusage``).
3. Runs HTA (``pip install holistictraceanalysis``; not a project dependency) on the same file
   in a child process: ``TraceAnalysis(trace_dir=…).get_gpu_kernel_breakdown()``; skipped with a
   message when HTA is not installed.
4. Prints both, the ratio, and compares kernel-time totals (ours vs a plain sum vs HTA's).

Speed goals live here, not in unit tests. The HTA import and run happen only in its child.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("SKILLRUN_TRACES", REPO.parent / "shared" / "traces"))
DEFAULT_SOURCE = TRACES / "pytorch_kineto" / "nvidia_h100_qwen1.5-0.5b_bf16.tracelens.json.gz"

_SHIFT_ARGS_CORR = ("correlation",)
_SHIFT_ARGS_EXT = ("External id",)


def _dumps(v) -> str:
    return json.dumps(v, separators=(", ", ": "))


def _emit(ev: dict) -> str:
    """One event in Kineto's layout (output_json.cpp): header fields on one line, args below."""
    head = ", ".join(f'"{k}": {_dumps(v)}' for k, v in ev.items() if k != "args")
    args = ev.get("args")
    if isinstance(args, dict) and args:
        body = ", ".join(f'"{k}": {_dumps(v)}' for k, v in args.items())
        return '  {\n    ' + head + ',\n    "args": {\n      ' + body + '\n    }\n  }'
    return '  {\n    ' + head + '\n  }'


def _phase(cat) -> int:
    if cat == "python_function":
        return 1
    if cat in ("cpu_op", "user_annotation", "cpu_instant_event", None):
        return 0
    return 2


def build_trace(source: Path, out: Path, size_gb: float) -> dict:
    """Write the replicated trace; returns facts about it (steps, bytes, plain kernel sum)."""
    with gzip.open(source, "rb") if source.suffix == ".gz" else open(source, "rb") as fh:
        doc = json.load(fh)
    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    meta_events = [e for e in events if e.get("ph") == "M"]
    events = [e for e in events if e.get("ph") != "M"]
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = (max(ts) - min(ts)) + 1000.0

    def mx(key):
        return max((e.get("args", {}).get(key, 0) for e in events
                    if isinstance(e.get("args"), dict) and isinstance(e["args"].get(key), int)), default=0) + 1

    corr_span, ext_span, idx_span = mx("correlation"), mx("External id"), mx("Ev Idx")
    flow_span = max((e.get("id", 0) for e in events if isinstance(e.get("id"), int)), default=0) + 1
    corr_span = flow_span = max(corr_span, flow_span)

    def shifted(e: dict, n: int) -> dict:
        e2 = dict(e)
        if isinstance(e2.get("ts"), (int, float)):
            e2["ts"] = round(e2["ts"] + n * span, 3)
        if isinstance(e2.get("id"), int):
            e2["id"] += n * flow_span
        if isinstance(e2.get("name"), str) and e2["name"].startswith("ProfilerStep#"):
            e2["name"] = f"ProfilerStep#{n}"
        a = e2.get("args")
        if isinstance(a, dict):
            a = dict(a)
            for k in _SHIFT_ARGS_CORR:
                if isinstance(a.get(k), int):
                    a[k] += n * corr_span
            for k in _SHIFT_ARGS_EXT:
                if isinstance(a.get(k), int):
                    a[k] += n * ext_span
            if isinstance(a.get("Ev Idx"), int):
                a["Ev Idx"] += n * idx_span
            e2["args"] = a
        return e2

    phases = [[e for e in events if _phase(e.get("cat")) == p] for p in range(3)]
    step_bytes = sum(len(_emit(e)) + 2 for e in events)
    steps = max(1, math.ceil(size_gb * 1e9 / step_bytes))
    kernel_sum_step = sum(e.get("dur", 0) for e in events if e.get("cat") == "kernel")
    header = {"schemaVersion": 1, "deviceProperties": doc.get("deviceProperties", [])}
    t0 = time.time()
    written = 0
    with open(out, "w") as fh:
        fh.write("{\n  " + ",\n  ".join(f'"{k}": {_dumps(v)}' for k, v in header.items()) + ',\n  "traceEvents": [\n')
        first = True
        for group in phases:
            for n in range(steps):
                text = ",\n".join(_emit(shifted(e, n)) for e in group)
                if not text:
                    continue
                if not first:
                    fh.write(",\n")
                fh.write(text)
                written += len(text)
                first = False
        for e in meta_events:
            fh.write(",\n" + _emit(e))
        fh.write('\n  ],\n  "traceName": "bench_ingest.json",\n  "displayTimeUnit": "ms"\n}\n')
    return {"steps": steps, "bytes": out.stat().st_size, "kernel_sum_us": kernel_sum_step * steps,
            "kernels": steps * sum(1 for e in events if e.get("cat") == "kernel"),
            "build_s": time.time() - t0}


_OURS = r"""
import json, resource, sys, time
t0 = time.time()
from skillrun.ingest import ingest, torch_trace
p = ingest(sys.argv[1])
wall = time.time() - t0
top = p.kernels[0]
workers = torch_trace.LAST_STATS.get("workers", [])
ru, rc = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "self_rss_mb": ru.ru_maxrss / 1024, "workers_rss_mb": rc.ru_maxrss / 1024,
                  "workers_rss_sum_mb": sum(w["rss_mb"] or 0 for w in workers), "n_workers": len(workers),
                  "unattributed_us": p.unattributed_us,
                  "cpu_s": ru.ru_utime + ru.ru_stime + rc.ru_utime + rc.ru_stime,
                  "total_us": p.total_kernel_us, "calls": p.kernel_calls, "linked": p.linked_calls,
                  "kernels": len(p.kernels), "top": top.name[:90], "top_pct": top.pct_gpu}))
"""

_HTA = r"""
import json, logging, resource, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
t0 = time.time()
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
# No "other" grouping (duration_ratio=1, many kernels) and no memcpy/memset rows, so that the
# per-kernel sums are comparable with ours.
kernel_type_df, kernel_df = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=False,
                                                        duration_ratio=1.0, num_kernels=1_000_000)
wall = time.time() - t0
col = "sum (us)" if "sum (us)" in kernel_df else "sum"
total = float(kernel_df[col].sum())
top = kernel_df.sort_values(col, ascending=False).iloc[0]
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": wall, "self_rss_mb": ru.ru_maxrss / 1024, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "total_us": total, "rows": int(len(kernel_df)), "top": str(top["name"])[:90],
                  "top_pct": 100.0 * float(top[col]) / total if total else float("nan")}))
"""


def _run(code: str, arg: str, timeout: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=str(REPO))
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"rc={proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _hta_available() -> bool:
    return subprocess.run([sys.executable, "-c", "import hta.trace_analysis"], capture_output=True).returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--keep", type=Path, default=None,
                    help="write the trace here and keep it (a kept trace is reused by the next run)")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="runs of our ingest (best and all are printed)")
    args = ap.parse_args()
    if not args.source.exists():
        print(f"source trace not found: {args.source} (set SKILLRUN_TRACES)")
        return 2
    tmp = None
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        workdir = args.keep
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench_ingest_")
        workdir = Path(tmp.name)
    trace = workdir / "rank0.bench.pt.trace.json"
    try:
        sidecar = workdir / "facts.txt"  # not *.json: HTA reads every JSON file in the folder
        if args.keep and trace.exists() and sidecar.exists():
            facts = json.loads(sidecar.read_text())
            print(f"reusing {trace}", flush=True)
        else:
            print(f"building a {args.size_gb:g} GB trace from {args.source.name} …", flush=True)
            facts = build_trace(args.source, trace, args.size_gb)
            sidecar.write_text(json.dumps(facts))
        print(f"trace: {trace} — {facts['bytes'] / 1e9:.3f} GB ({facts['bytes']:,} bytes), "
              f"{facts['steps']} profiler steps, {facts['kernels']:,} kernel events, "
              f"built in {facts['build_s']:.0f} s", flush=True)
        subprocess.run(["cat", str(trace)], stdout=subprocess.DEVNULL)  # same page-cache state for both tools
        ours_runs = [_run(_OURS, str(trace), 600) for _ in range(max(1, args.repeat))]
        ours = min(ours_runs, key=lambda r: r["wall_s"])
        runs = ", ".join("%.2f" % r["wall_s"] for r in ours_runs)
        print(f"skillrun.ingest: {ours['wall_s']:.2f} s wall, {ours['cpu_s']:.2f} s CPU all processes (runs: {runs}), "
              f"peak RSS {ours['self_rss_mb']:.0f} MB main + {ours['workers_rss_sum_mb']:.0f} MB in {ours['n_workers']} workers "
              f"(= {ours['self_rss_mb'] + ours['workers_rss_sum_mb']:.0f} MB at most); "
              f"{ours['calls']:,} kernel calls, {ours['linked']:,} linked to shapes, {ours['kernels']} kernel names; "
              f"top {ours['top_pct']:.2f}% {ours['top']}", flush=True)
        print(f"kernel time: ours {ours['total_us']:,.3f} us; plain sum of 'dur' {facts['kernel_sum_us']:,.3f} us; "
              f"difference {ours['total_us'] - facts['kernel_sum_us']:+.3f} us", flush=True)
        if args.no_hta:
            return 0
        if not _hta_available():
            print("HTA not installed (pip install holistictraceanalysis): skipping the comparison")
            return 0
        hta = _run(_HTA, str(workdir), 3600)  # HTA reads every trace file in the folder: ours is alone there
        print(f"HTA get_gpu_kernel_breakdown: {hta['wall_s']:.2f} s wall, {hta['cpu_s']:.2f} s CPU, peak RSS {hta['self_rss_mb']:.0f} MB; "
              f"{hta['rows']} kernel rows; top {hta['top_pct']:.2f}% {hta['top']}", flush=True)
        ratio = hta["wall_s"] / ours["wall_s"]
        print(f"load average during the run: {os.getloadavg()[0]:.2f} (2-core machine shared with other jobs)")
        print(f"speed-up: {ratio:.1f}x wall, {hta['cpu_s'] / ours['cpu_s']:.1f}x CPU; memory: "
              f"{hta['self_rss_mb'] / max(1.0, ours['self_rss_mb'] + ours['workers_rss_sum_mb']):.1f}x less",
              flush=True)
        diff = facts["kernel_sum_us"] - hta["total_us"]
        steps = facts["steps"]
        launched = (ours["total_us"] - ours["unattributed_us"]) * (steps - 1) / steps
        print(f"kernel time: HTA {hta['total_us']:,.0f} us vs plain sum {facts['kernel_sum_us']:,.0f} us "
              f"(HTA lower by {diff:,.0f} us = {100 * diff / facts['kernel_sum_us']:.2f}%). Why: HTA drops the last of "
              f"the {steps} profiler steps and every kernel whose CPU-side launch is not in the trace; here that "
              f"leaves {launched:,.0f} us (our unattributed time is exactly those kernels in this trace). The "
              f"remaining {launched - hta['total_us']:,.0f} us is HTA rounding ns timestamps to whole us "
              f"(ceil start, floor end) over ~{ours['linked'] * (steps - 1) / steps:,.0f} kernels. We sum every "
              f"kernel event's dur as written.")
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
