"""Profiling workload: the BASELINE a16wi4 MoE layer, dequantize the routed experts' int4 weights
to bf16 and run two torch._grouped_mm GEMMs (what a PyTorch user without an int4 MoE kernel runs).

Run under the runner's profile step, e.g.
    python -m skillrun.profiling.run --out moe_a16wi4.json.gz --steps 2:5 -- \
        python benchmarks/workloads/moe_a16wi4_workload.py
"""
from __future__ import annotations

from workload_loop import run_baseline

from skillrun_kernels.moe_a16wi4 import problem, references

SHAPES = [
    {"tokens": 16, "model_dim": 7168, "inter_dim": 2048, "experts": 64, "topk": 8, "group_size": 32},
    {"tokens": 1024, "model_dim": 7168, "inter_dim": 2048, "experts": 64, "topk": 8, "group_size": 32},
]


def main() -> int:
    return run_baseline(__doc__.splitlines()[0], SHAPES, problem, references.build_dequant_grouped_bf16,
                        lambda s: f"T{s['tokens']} E{s['experts']} I{s['inter_dim']}")


if __name__ == "__main__":
    raise SystemExit(main())
