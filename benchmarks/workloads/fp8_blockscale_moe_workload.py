"""Profiling workload: the BASELINE fp8 block-scale MoE layer on sm_90 with torch alone, cuBLAS
block-wise ``_scaled_mm`` per active expert with torch routing, SiLU, fp8 1x128 re-quantization of h
and the weighted top-k sum (references.build_cublas_per_expert: a named fallback, not a production
MoE kernel; DeepGEMM does not load on the lent image). DeepSeek-V3 experts (E=256, top-8,
7168 -> 2048) at a decode and a prefill batch.

Run under the runner's profile step, e.g.
    python -m skillrun.profiling.run --out fp8_blockscale_moe.json.gz --steps 2:5 -- \
        python benchmarks/workloads/fp8_blockscale_moe_workload.py
"""
from __future__ import annotations

from workload_loop import run_baseline

from skillrun_kernels.fp8_blockscale_moe import problem, references

SHAPES = [
    {"tokens": 16, "model_dim": 7168, "inter_dim": 2048, "experts": 256, "topk": 8},
    {"tokens": 4096, "model_dim": 7168, "inter_dim": 2048, "experts": 256, "topk": 8},
]


def main() -> int:
    return run_baseline(__doc__.splitlines()[0], SHAPES, problem, references.build_cublas_per_expert,
                        lambda s: f"T{s['tokens']} E{s['experts']} I{s['inter_dim']}")


if __name__ == "__main__":
    raise SystemExit(main())
