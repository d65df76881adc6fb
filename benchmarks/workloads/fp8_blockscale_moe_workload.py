"""Profiling workload: the BASELINE fp8 block-scale MoE layer on sm_90 with torch alone, cuBLAS
block-wise ``_scaled_mm`` per active expert with torch routing, SiLU, fp8 1x128 re-quantization of h
and the weighted top-k sum (references.build_cublas_per_expert: a named fallback, not a production
MoE kernel; DeepGEMM does not load on the lent image). DeepSeek-V3 experts (E=256, top-8,
7168 -> 2048) at a decode and a prefill batch.

The layer runs as one torch custom op, ``skillrun::fused_moe_fp8_blockscale(a, w1, w2, topk_weights,
topk_ids, a_scale, w1_scale, w2_scale, out)``, the way vLLM and SGLang register theirs
(``vllm::outplace_fused_experts``): the profiler then records the layer with its operands' shapes,
and the runner links every kernel launched inside it to the layer (tokens, model_dim, inter_dim,
experts, top-k and the 128x128 weight-scale grid read off those shapes) instead of to the inner
``aten::_scaled_mm`` calls, which alone look like dense GEMMs.

Run under the runner's profile step, e.g.
    python -m skillrun profile --out fp8_blockscale_moe.json.gz --steps 2:5 -- \
        python benchmarks/workloads/fp8_blockscale_moe_workload.py
"""
from __future__ import annotations

import torch
from workload_loop import run_baseline

from skillrun_kernels.fp8_blockscale_moe import problem, references

SHAPES = [
    {"tokens": 16, "model_dim": 7168, "inter_dim": 2048, "experts": 256, "topk": 8},
    {"tokens": 4096, "model_dim": 7168, "inter_dim": 2048, "experts": 256, "topk": 8},
]
OPERANDS = ("a", "w1", "w2", "topk_weights", "topk_ids", "a_scale", "w1_scale", "w2_scale")
_RUNS: dict = {}  # (tokens, model_dim, inter_dim, experts, topk) -> the baseline launch's run


def _key(a: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor) -> tuple:
    return (a.shape[0], a.shape[1], w2.shape[2], w2.shape[0], topk_ids.shape[1])


@torch.library.custom_op("skillrun::fused_moe_fp8_blockscale", mutates_args=("out",))
def fused_moe_fp8_blockscale(a: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                             topk_ids: torch.Tensor, a_scale: torch.Tensor, w1_scale: torch.Tensor,
                             w2_scale: torch.Tensor, out: torch.Tensor) -> None:
    p = dict(zip(OPERANDS, (a, w1, w2, topk_weights, topk_ids, a_scale, w1_scale, w2_scale)))
    _RUNS[_key(a, w2, topk_ids)](p, out)


def build_layer(shape: dict, config: dict, device: str):
    """The baseline launch (looked up at call time, so `skill-run e2e` can route it), run through the op."""
    launch = references.build_cublas_per_expert(shape, config, device)
    t, d, i, e, k = problem.dims(shape)
    _RUNS[(t, d, i, e, k)] = launch.run

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        fused_moe_fp8_blockscale(*(p[name] for name in OPERANDS), out)
        return out

    launch.run = run
    return launch


def main() -> int:
    return run_baseline(__doc__.splitlines()[0], SHAPES, problem, build_layer,
                        lambda s: f"T{s['tokens']} E{s['experts']} I{s['inter_dim']}")


if __name__ == "__main__":
    raise SystemExit(main())
