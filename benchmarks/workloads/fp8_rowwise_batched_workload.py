"""Profiling workload: the BASELINE batched fp8 rowwise GEMM, one torch._scaled_mm per batch.

Run under the runner's profile step, e.g.
    python -m skillrun.profiling.run --out fp8_rowwise_batched.json.gz --steps 2:5 -- \
        python benchmarks/workloads/fp8_rowwise_batched_workload.py
so the trace shows the kernels (and aten::_scaled_mm calls with their scale shapes) a user's
per-batch loop really launches. Each iteration runs every shape once, then marks a step.
"""
from __future__ import annotations

from workload_loop import run_baseline

from skillrun_kernels.fp8_rowwise_batched_gemm import problem, references

SHAPES = [
    {"batch": 16, "M": 1, "N": 1280, "K": 8192},
    {"batch": 16, "M": 128, "N": 1280, "K": 8192},
    {"batch": 16, "M": 4096, "N": 8192, "K": 1024},
]


def main() -> int:
    return run_baseline(__doc__.splitlines()[0], SHAPES, problem, references.build_scaled_mm_loop,
                        lambda s: f"{s['batch']}x{s['M']}x{s['N']}x{s['K']}")


if __name__ == "__main__":
    raise SystemExit(main())
