"""Profiling workload: the BASELINE a16wi4 MoE layer, dequantize the routed experts' int4 weights
to bf16 and run two torch._grouped_mm GEMMs (what a PyTorch user without an int4 MoE kernel runs).

Run under the runner's profile step, e.g.
    python -m skillrun.profile_run --out moe_a16wi4.json.gz --steps 2:5 -- \
        python benchmarks/workloads/moe_a16wi4_workload.py
"""
from __future__ import annotations

import argparse

import torch

try:
    from skillrun import profiling
except ImportError:
    profiling = None

from skillrun_kernels.moe_a16wi4 import problem, references

SHAPES = [
    {"tokens": 16, "model_dim": 7168, "inter_dim": 2048, "experts": 64, "topk": 8, "group_size": 32},
    {"tokens": 1024, "model_dim": 7168, "inter_dim": 2048, "experts": 64, "topk": 8, "group_size": 32},
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=6)
    args = ap.parse_args()
    work = []
    for shape in SHAPES:
        inp = problem.make_inputs(shape, 0, "cuda")
        launch = references.build_dequant_grouped_bf16(shape, {}, "cuda")
        work.append((launch, launch.prepare(inp), problem.output_like(shape, "cuda")))
    for _ in range(args.iters):
        for launch, prepared, out in work:
            launch.run(prepared, out)
        torch.cuda.synchronize()
        if profiling is not None:
            profiling.step()
    print("ran", args.iters, "iterations of", [f"T{s['tokens']} E{s['experts']} I{s['inter_dim']}" for s in SHAPES])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
