"""Problem definition: a top-k routed MoE layer, bf16 activations x int4 group-quantized weights.

    h[t, j]  = SiLU(x[t] . W1_gate[e_tj]) * (x[t] . W1_up[e_tj])          (stage 1, per (token, slot))
    out[t]   = sum_j  weight[t, j] * (h[t, j] @ W2[e_tj].T)                  (stage 2, weighted sum)

with W = q * scale[group], q a signed int4 value stored one per int8, scale bf16 per
``group_size`` consecutive K elements. Routing is a real softmax top-k (renormalized) of random
router logits, so experts receive uneven token counts as they do in a model.
"""
from __future__ import annotations

import math

import torch

from . import packing

SHAPE_KEYS = ("tokens", "model_dim", "inter_dim", "experts", "topk", "group_size")
# The int4 expert weights and their scales: a port may pack them once in prepare() (untimed); the
# hidden states and the routing are activations, so prepare() never sees their content
# (skillrun.execute.operands).
WEIGHTS = ("w1_q", "w1_scale", "w2_q", "w2_scale")
# How loose a card's parity tolerance for this family may be (lint refuses a looser card; see
# skillrun.kb.tolerance). The honest error of these fp8/int4 recipes against the fp32 oracle is a
# few bf16 rounding steps; a port past these limits is wrong, whatever a card says.
TOLERANCE_LIMITS = {"rtol": 0.05, "atol": 0.05, "max_rel_fro": 0.02, "min_cosine": 0.995}

# The benchmark set: Kimi-K2-like hidden size, TP- and EP-sharded expert widths.
SHAPES = [
    {"tokens": t, "model_dim": 7168, "inter_dim": i, "experts": e, "topk": 8, "group_size": 32}
    for (e, i) in ((384, 512), (64, 2048), (384, 2048), (64, 512))
    for t in (1, 16, 64, 256, 1024, 4096)
]


def dims(shape: dict) -> tuple[int, int, int, int, int, int]:
    missing = [k for k in SHAPE_KEYS if k not in shape]
    if missing:
        raise ValueError(f"moe_a16wi4 shape is missing {missing}; needs {SHAPE_KEYS}")
    t, d, i, e, k, g = (int(shape[key]) for key in SHAPE_KEYS)
    if min(t, d, i, e, k, g) < 1 or k > e:
        raise ValueError(f"moe_a16wi4 shape is invalid (non-positive dimension or topk > experts): {shape}")
    if d % g or i % g or g % 2:
        raise ValueError(f"model_dim ({d}) and inter_dim ({i}) must be multiples of an even group_size ({g})")
    return t, d, i, e, k, g


def route(logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts, top-k, renormalized weights: (ids int32, weights fp32)."""
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(probs, topk, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    return ids.to(torch.int32).contiguous(), w.contiguous()


def make_inputs(shape: dict, seed: int, device: str) -> dict:
    t, d, i, e, k, g = dims(shape)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(t, d, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
    topk_ids, topk_weights = route(torch.randn(t, e, generator=gen, device=device), k)
    # Uniform int4 codes exercise the full range (including -8); scales are sized so that each
    # stage's outputs stay O(1) (the std of a uniform [-8, 7] code is about 4.6).
    w1_q = torch.randint(-8, 8, (e, 2 * i, d), generator=gen, device=device, dtype=torch.int8)
    w2_q = torch.randint(-8, 8, (e, d, i), generator=gen, device=device, dtype=torch.int8)
    s1 = (0.5 + torch.rand(e, 2 * i, d // g, generator=gen, device=device)) / (4.6 * math.sqrt(d))
    s2 = (0.5 + torch.rand(e, d, i // g, generator=gen, device=device)) / (4.6 * math.sqrt(i))
    return {
        "x": x,
        "w1_q": w1_q,
        "w1_scale": s1.to(torch.bfloat16),
        "w2_q": w2_q,
        "w2_scale": s2.to(torch.bfloat16),
        "topk_ids": topk_ids,
        "topk_weights": topk_weights,
    }


def group_size_of(inputs: dict) -> int:
    """The quantization group along K, read off the weight and scale shapes."""
    k, groups = inputs["w1_q"].shape[-1], inputs["w1_scale"].shape[-1]
    if groups < 1 or k % groups:
        raise ValueError(f"w1_scale's last dimension ({groups}) must divide model_dim ({k})")
    return k // groups


def _expert_rows(topk_ids: torch.Tensor):
    """Yield (expert, token indices, slot indices) for every expert that received tokens."""
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
    start = 0
    topk = topk_ids.shape[1]
    for e, c in zip(experts.tolist(), counts.tolist()):
        pairs = order[start:start + c]
        start += c
        yield e, pairs // topk, pairs % topk


def oracle_stage1(inputs: dict) -> torch.Tensor:
    """fp32 stage-1 intermediate h, shape (tokens, topk, inter_dim)."""
    x, ids = inputs["x"], inputs["topk_ids"]
    g = group_size_of(inputs)
    inter = inputs["w2_q"].shape[-1]
    h = torch.zeros(ids.shape[0], ids.shape[1], inter, dtype=torch.float32, device=x.device)
    for e, tok, slot in _expert_rows(ids):
        w1 = packing.dequantize(inputs["w1_q"][e], inputs["w1_scale"][e], g)
        gu = x[tok].float() @ w1.t()
        h[tok, slot] = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
    return h


def oracle(inputs: dict, h: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 layer output (tokens, model_dim); pass ``h`` to run stage 2 on a given intermediate."""
    ids, wts = inputs["topk_ids"], inputs["topk_weights"]
    g = inputs["w2_q"].shape[-1] // inputs["w2_scale"].shape[-1]
    if h is None:
        h = oracle_stage1(inputs)
    out = torch.zeros(ids.shape[0], inputs["w2_q"].shape[1], dtype=torch.float32, device=h.device)
    for e, tok, slot in _expert_rows(ids):
        w2 = packing.dequantize(inputs["w2_q"][e], inputs["w2_scale"][e], g)
        y = h[tok, slot].float() @ w2.t()
        out.index_add_(0, tok, y * wts[tok, slot].unsqueeze(-1))
    return out


def output_like(shape: dict, device: str) -> torch.Tensor:
    t, d, *_ = dims(shape)
    return torch.empty(t, d, dtype=torch.bfloat16, device=device)


def flops(shape: dict) -> float:
    t, d, i, _, k, _ = dims(shape)
    return 2.0 * t * k * (d * 2 * i + i * d)


def expected_active_experts(shape: dict) -> float:
    t, _, _, e, k, _ = dims(shape)
    return e * (1.0 - (1.0 - k / e) ** t)


def expert_bytes(shape: dict) -> float:
    """Bytes of one expert's packed int4 weights plus bf16 scales (what a kernel must read)."""
    _, d, i, _, _, g = dims(shape)
    return 3 * i * d / 2 + 2 * 3 * i * d / g


def min_bytes(shape: dict, active_experts: float | None = None) -> float:
    """Fewest bytes: each touched expert's int4 weights and scales once, x and out once.

    Without ``active_experts`` this uses the expected count under uniform routing.
    """
    t, d, _, _, k, _ = dims(shape)
    act = expected_active_experts(shape) if active_experts is None else float(active_experts)
    return act * expert_bytes(shape) + 2 * t * d * 2 + t * k * 8


# Small model dims: the unrolled large-token tiers compile quickly with them.
CI_DIMS = {"model_dim": 1024, "inter_dim": 256, "experts": 16, "topk": 4, "group_size": 32}


def ci_shape(shape: dict | None) -> dict:
    """The shape CI compiles a recipe at: the tier's token count (so it keeps its tile_m) with small model dims."""
    return {"tokens": min(shape["tokens"] if shape else 16, 4096), **CI_DIMS}
