"""N shapes of one card in one measurement session against N separate runs, on the CPU backend.

    python3 benchmarks/bench_sessions.py --shapes 10 --out benchmarks/results/sessions_cpu_<commit>.json

What a GPU call pays per shape beyond the measurement itself is process start-up: before sessions
(execute/sessions.py) every task of a shape (the port's and each reference's parity gate and their
judges, the probe, the timed session) was a fresh interpreter importing torch. This benchmark runs
the same shapes of a toy card (tests/defects: a torch fp16 GEMM port, its baseline, a wall-clock
timer, 3 seeds, the referee's checks) three ways, with spawned children as on a GPU:

* ``separate``: one ``run_skill`` per shape, a process per task (what a device call did before);
* ``session``: one ``run_skill`` over all shapes, the card's three task servers serving every shape;
* ``fork`` (context only): one ``run_skill`` per shape, tasks forked from the CPU's zygote.

Per shape it reports the wall time and the overhead = wall - the measurement's own work (the
artifact's ``cost``: compile, reference setup, inputs, warm-up, rounds, checks), i.e. process start,
imports and the parent's waiting; and the ratio of the session's mean overhead per shape to the
separate runs'. CPU wall clock on a shared machine: the ratios are the point, not the seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the toy card's kernels (tests/defects)

WORK = ("compile", "reference_setup", "inputs", "warmup", "rounds", "checks")


def _rows(recs: list[dict], wall: list[float] | None = None) -> list[dict]:
    out = []
    for i, r in enumerate(recs):
        c = r.get("cost") or {}
        dev = c.get("device_seconds") or {}
        total = float(c.get("total_s") or 0.0) if wall is None else wall[i]
        work = sum(float(dev.get(k) or 0.0) for k in WORK)
        out.append({"shape": r.get("shape"), "verdict": r.get("verdict"), "wall_s": round(total, 3), "work_s": round(work, 3),
                    "overhead_s": round(max(0.0, total - work), 3), "processes_started": c.get("processes_started"),
                    "device_seconds": dev})
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--modes", default="separate,session,fork")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    from defects.kb import K, card, make_defect_kb
    from skillrun.execute import run_skill
    from skillrun.kb.index import SkillIndex

    root = make_defect_kb(Path(tempfile.mkdtemp(prefix="bench-sessions-")) / "kb", [card("bench_sessions", f"{K}:build_port_ok")])
    index = SkillIndex.load(root)
    shapes = [{"M": 16 + 8 * i, "N": 32, "K": 64} for i in range(a.shapes)]
    kw = dict(backend="cpu", write=False, timer="wall", rounds=a.rounds, warmup=2, seeds=3, timeout_s=300)
    result: dict = {"what": __doc__.split("\n\n")[0], "shapes": a.shapes, "rounds": a.rounds, "modes": {},
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "load_avg_start": list(os.getloadavg())}}
    for mode in a.modes.split(","):
        t0 = time.perf_counter()
        if mode == "session":
            recs = run_skill(index, "bench_sessions", shapes, isolation="spawn", processes="per-card", **kw)
            rows = _rows(recs)
        else:
            recs, walls = [], []
            for s in shapes:
                ts = time.perf_counter()
                recs += run_skill(index, "bench_sessions", [s], isolation="spawn" if mode == "separate" else "fork",
                                  processes="per-task", **kw)
                walls.append(time.perf_counter() - ts)
            rows = _rows(recs, walls)
        wall = time.perf_counter() - t0
        result["modes"][mode] = {"wall_s": round(wall, 2), "per_shape_wall_s": round(_mean([r["wall_s"] for r in rows]), 3),
                                 "per_shape_overhead_s": round(_mean([r["overhead_s"] for r in rows]), 3),
                                 "per_shape_work_s": round(_mean([r["work_s"] for r in rows]), 3),
                                 "processes_started": sum(int(r["processes_started"] or 0) for r in rows),
                                 "verdicts": sorted({str(r["verdict"]) for r in rows}), "rows": rows}
        m = result["modes"][mode]
        print(f"{mode:9s} {a.shapes} shapes in {wall:6.1f} s: per shape {m['per_shape_wall_s']:.2f} s wall, "
              f"{m['per_shape_overhead_s']:.2f} s overhead, {m['per_shape_work_s']:.2f} s work; "
              f"{m['processes_started']} processes; verdicts {m['verdicts']}", flush=True)
    modes = result["modes"]
    if "separate" in modes and "session" in modes:
        ratio = modes["session"]["per_shape_overhead_s"] / modes["separate"]["per_shape_overhead_s"]
        result["session_over_separate_overhead"] = round(ratio, 4)
        result["session_over_separate_wall"] = round(modes["session"]["per_shape_wall_s"] / modes["separate"]["per_shape_wall_s"], 4)
        result["goal"] = "per-shape overhead in one session <= 1/5 of separate runs (issue 35)"
        result["goal_met"] = ratio <= 0.2
        print(f"session / separate, per shape: overhead {ratio:.3f}, wall {result['session_over_separate_wall']:.3f} "
              f"(goal: overhead <= 0.2: {'met' if ratio <= 0.2 else 'NOT met'})")
    result["machine"]["load_avg_end"] = list(os.getloadavg())
    try:
        result["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                                          timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        result["commit"] = None
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
