"""Problem definition: a top-k routed MoE layer with fp8 e4m3 block-scaled experts (DeepSeek-V3 recipe).

    h[t, j]  = SiLU(x[t] . W1_gate[e_tj]) * (x[t] . W1_up[e_tj])              (stage 1, per (token, slot))
    hq[t, j] = fp8 1x128 quantization of h[t, j]                              (the recipe's stage-2 input)
    out[t]   = sum_j  weight[t, j] * (hq[t, j] @ W2[e_tj].T)                   (stage 2, weighted top-k sum)

Operands (facts/fp8_blockscale_moe.md):
    a        (tokens, D)        fp8 e4m3, x quantized once per token, before the routing gather
    a_scale  (tokens, D/128)    fp32, one per 1x128 block
    w1       (E, 2I, D)         fp8 e4m3, gate rows [0, I) then up rows [I, 2I)
    w1_scale (E, 2I/128, D/128) fp32, one per 128x128 block
    w2       (E, D, I)          fp8 e4m3
    w2_scale (E, D/128, I/128)  fp32
    topk_ids (tokens, topk) int32, topk_weights (tokens, topk) fp32 (softmax top-k, renormalized)

Scales are decode multipliers. D and I must be multiples of 128 (whole scale blocks; with I a
multiple of 128 no weight block straddles the gate and up halves).

The oracle is fp32 everywhere except where the recipe itself quantizes: h is re-quantized to fp8
per 1x128 block of each pair row (``quantize_rows_1x128``, amax / 448 scales) exactly as vLLM's
fused_moe, aiter and DeepGEMM pipelines do before the down GEMM. A port that computes h slightly
differently can flip the rounding of a few fp8 codes (one fp8 ulp each); the tolerance covers it.
Production pipelines also round gate/up to bf16 before SiLU: on the H200 (commit 0249008) the cuBLAS
per-expert path measured rel_fro 0.014-0.015 against this oracle with elements up to ~0.04 off, so
the family's ceiling is the dense GEMM's (below), not tighter.
"""
from __future__ import annotations

import torch

from skillrun_kernels._moe.routing import expert_rows
from skillrun_kernels.fp8_blockscale_gemm.problem import (
    BLOCK,
    FP8_DTYPE,
    FP8_MAX,
    quantize_1x128,
    quantize_128x128,
)

SHAPE_KEYS = ("tokens", "model_dim", "inter_dim", "experts", "topk")
# The loosest tolerance a card of this family may declare (lint; skillrun.kb.tolerance).
TOLERANCE_LIMITS = {"rtol": 0.05, "atol": 0.05, "max_rel_fro": 0.02, "min_cosine": 0.995}
# The expert weights: a port may pack them once in prepare() (untimed); the hidden states, their
# scales and the routing are activations, so prepare() never sees their content (skillrun.execute.operands).
WEIGHTS = ("w1", "w1_scale", "w2", "w2_scale")

# DeepSeek-V3/R1's routed experts (E=256, top-8, 7168 -> 2048) at decode, small-batch and prefill
# token counts, plus the 32-expert shard one rank holds under EP8.
SHAPES = [
    {"tokens": t, "model_dim": 7168, "inter_dim": 2048, "experts": e, "topk": 8}
    for e in (256, 32)
    for t in (1, 16, 64, 256, 1024, 4096)
]


def dims(shape: dict) -> tuple[int, int, int, int, int]:
    """(tokens, model_dim, inter_dim, experts, topk), or a ValueError naming what is wrong."""
    missing = [k for k in SHAPE_KEYS if k not in shape]
    if missing:
        raise ValueError(f"fp8_blockscale_moe shape is missing {missing}; needs {SHAPE_KEYS}")
    t, d, i, e, k = (int(shape[key]) for key in SHAPE_KEYS)
    if min(t, d, i, e, k) < 1 or k > e:
        raise ValueError(f"fp8_blockscale_moe shape is invalid (non-positive dimension or topk > experts): {shape}")
    if d % BLOCK or i % BLOCK:
        raise ValueError(f"fp8_blockscale_moe: model_dim ({d}) and inter_dim ({i}) must be multiples of {BLOCK}")
    return t, d, i, e, k


def route(logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts, top-k, renormalized weights: (ids int32, weights fp32)."""
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(probs, topk, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    return ids.to(torch.int32).contiguous(), w.contiguous()


def quantize_rows_1x128(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, I) float -> (fp8 (R, I), fp32 scales (R, I/128)): the stage-2 input quantization.

    Same rule as the activations (amax / 448 per 1x128 block); all-zero blocks (padding rows) get
    a tiny scale and zero codes rather than a division by zero.
    """
    return quantize_1x128(h)


def make_inputs(shape: dict, seed: int, device: str | torch.device = "cpu") -> dict:
    """Fresh random operands, quantized per block so the scales differ from block to block.

    Weight blocks get a magnitude spread (2^-2..2^2), so a kernel that reads the wrong expert's or
    the wrong block's scale gives a visibly wrong answer; sizes are chosen so both stages' outputs
    stay O(1) (the card's atol is meaningful only there).
    """
    t, d, i, e, k = dims(shape)
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(int(seed))

    def randn(*size):
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32)

    def spread(*size):
        return torch.exp2(torch.rand(*size, generator=gen, device=device) * 4.0 - 2.0)

    x = randn(t, d)
    topk_ids, topk_weights = route(randn(t, e), k)
    a, a_scale = quantize_1x128(x)
    w1 = torch.empty(e, 2 * i, d, dtype=FP8_DTYPE, device=device)
    w1_scale = torch.empty(e, 2 * i // BLOCK, d // BLOCK, dtype=torch.float32, device=device)
    w2 = torch.empty(e, d, i, dtype=FP8_DTYPE, device=device)
    w2_scale = torch.empty(e, d // BLOCK, i // BLOCK, dtype=torch.float32, device=device)
    for ex in range(e):  # one expert at a time: the fp32 temporaries stay one expert large
        s1 = spread(2 * i // BLOCK, d // BLOCK).repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        w1[ex], w1_scale[ex] = quantize_128x128(randn(2 * i, d) * s1 * (0.7 / d ** 0.5))
        s2 = spread(d // BLOCK, i // BLOCK).repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        w2[ex], w2_scale[ex] = quantize_128x128(randn(d, i) * s2 * (1.0 / i ** 0.5))
    return {
        "a": a, "a_scale": a_scale,
        "w1": w1, "w1_scale": w1_scale,
        "w2": w2, "w2_scale": w2_scale,
        "topk_ids": topk_ids, "topk_weights": topk_weights,
    }


def dequant_weight(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """One expert's (N, K) fp8 weight with (N/128, K/128) block scales -> fp32."""
    s = scale.float().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return w.float() * s[: w.shape[0], : w.shape[1]]


def dequant_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(R, K) fp8 with (R, K/128) scales -> fp32."""
    return q.float() * scale.float().repeat_interleave(BLOCK, 1)[:, : q.shape[1]]


def _fp32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T in true fp32 (TF32 switched off for the call on CUDA)."""
    if not a.is_cuda:
        return a @ b.t()
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return a @ b.t()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def oracle_stage1(inputs: dict) -> torch.Tensor:
    """fp32 stage-1 intermediate h (before its fp8 quantization), shape (tokens, topk, inter_dim)."""
    ids = inputs["topk_ids"]
    x = dequant_rows(inputs["a"], inputs["a_scale"])
    inter = inputs["w2"].shape[-1]
    h = torch.zeros(ids.shape[0], ids.shape[1], inter, dtype=torch.float32, device=x.device)
    for e, tok, slot in expert_rows(ids):
        gu = _fp32_matmul(x[tok], dequant_weight(inputs["w1"][e], inputs["w1_scale"][e]))
        h[tok, slot] = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
    return h


def oracle_stage2(inputs: dict, hq: torch.Tensor, h_scale: torch.Tensor) -> torch.Tensor:
    """fp32 layer output from a quantized intermediate: hq (tokens*topk, I) fp8, h_scale (tokens*topk, I/128)."""
    ids, wts = inputs["topk_ids"], inputs["topk_weights"]
    topk = ids.shape[1]
    hd = dequant_rows(hq, h_scale)
    out = torch.zeros(ids.shape[0], inputs["w2"].shape[1], dtype=torch.float32, device=hd.device)
    for e, tok, slot in expert_rows(ids):
        y = _fp32_matmul(hd[tok * topk + slot], dequant_weight(inputs["w2"][e], inputs["w2_scale"][e]))
        out.index_add_(0, tok, y * wts[tok, slot].unsqueeze(-1))
    return out


def oracle(inputs: dict) -> torch.Tensor:
    """fp32 layer output (tokens, model_dim): stage 1, fp8 1x128 re-quantization of h, stage 2."""
    h = oracle_stage1(inputs)
    hq, hs = quantize_rows_1x128(h.reshape(-1, h.shape[-1]))
    return oracle_stage2(inputs, hq, hs)


def output_like(shape: dict, device: str | torch.device = "cpu") -> torch.Tensor:
    t, d, *_ = dims(shape)
    return torch.empty(t, d, dtype=torch.bfloat16, device=device)


def flops(shape: dict) -> float:
    t, d, i, _, k = dims(shape)
    return 2.0 * t * k * (d * 2 * i + i * d)


def expected_active_experts(shape: dict) -> float:
    t, _, _, e, k = dims(shape)
    return e * (1.0 - (1.0 - k / e) ** t)


def expert_bytes(shape: dict) -> float:
    """One expert's fp8 weights plus fp32 128x128 scales (what a kernel must read per active expert)."""
    _, d, i, _, _ = dims(shape)
    return 3 * i * d + 4 * 3 * i * d / (BLOCK * BLOCK)


def min_bytes(shape: dict, active_experts: float | None = None) -> float:
    """Fewest bytes: each touched expert's weights and scales once, fp8 x + scales once, bf16 out once.

    Without ``active_experts`` this uses the expected count under uniform routing.
    """
    t, d, _, _, k = dims(shape)
    act = expected_active_experts(shape) if active_experts is None else float(active_experts)
    return act * expert_bytes(shape) + t * d * (1 + 4 / BLOCK) + 2 * t * d + t * k * 8


__all__ = ["SHAPE_KEYS", "SHAPES", "FP8_MAX", "dims", "make_inputs", "oracle", "oracle_stage1", "oracle_stage2",
           "quantize_rows_1x128", "output_like", "flops", "min_bytes", "expected_active_experts", "ci_shape"]


def ci_shape(shape: dict | None) -> dict:
    """The shape CI compiles a recipe at: its own regime (tokens, experts, topk pick the config) with
    model_dim and inter_dim rounded down to whole 128 blocks, so a representative shape the problem
    would refuse (model_dim 7000) still compiles at the nearest served one; a valid shape is returned
    unchanged. Without a shape, the first decode shape."""
    if not shape:
        return dict(SHAPES[0])
    return {**shape, **{k: max(BLOCK, int(shape[k]) // BLOCK * BLOCK) for k in ("model_dim", "inter_dim")}}
