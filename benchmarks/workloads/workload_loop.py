"""The loop the baseline profiling workloads share: build each shape's reference launch once, then
run every shape once per iteration and mark a profiler step, so a trace window holds whole steps.

Imported by the workload scripts in this folder (run as ``python benchmarks/workloads/<name>.py``,
which puts this folder on ``sys.path``).
"""
from __future__ import annotations

import argparse
from typing import Any, Callable, Sequence

import torch

try:
    from skillrun import profiling
except ImportError:  # standalone run: markers become no-ops
    profiling = None


def run_baseline(
    description: str,
    shapes: Sequence[dict],
    problem: Any,
    build: Callable[[dict, dict, str], Any],
    label: Callable[[dict], str],
) -> int:
    """Parse ``--iters``, run ``build(shape, {}, "cuda")`` on ``problem``'s inputs for every shape."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--iters", type=int, default=6)
    args = ap.parse_args()
    work = []
    for shape in shapes:
        inp = problem.make_inputs(shape, 0, "cuda")
        launch = build(shape, {}, "cuda")
        work.append((launch, launch.prepare(inp), problem.output_like(shape, "cuda")))
    for _ in range(args.iters):
        for launch, prepared, out in work:
            launch.run(prepared, out)
        torch.cuda.synchronize()
        if profiling is not None:
            profiling.step()
    if profiling is not None and hasattr(profiling, "save_output"):
        for shape, (_launch, _prepared, out) in zip(shapes, work):
            profiling.save_output(label(shape), out)  # compared between arms by `skill-run e2e`; a no-op otherwise
    print("ran", args.iters, "iterations of", [label(s) for s in shapes])
    return 0
