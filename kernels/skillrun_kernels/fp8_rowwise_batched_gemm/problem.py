"""Problem definition: batched fp8 rowwise-scaled GEMM (the `f8f8bf16_rowwise_batched` contract).

    out[b, m, n] = x_scale[b, m] * w_scale[b, n] * sum_k xq[b, m, k] * wq[b, n, k]     (bf16)

Scales are *decode* multipliers (x ~= xq * x_scale), produced here by real per-row quantization of
random data, so the operands carry the value distribution a quantized model produces.
"""
from __future__ import annotations

import torch

SHAPE_KEYS = ("batch", "M", "N", "K")
# The weight operands: a port may re-lay them out once in prepare() (untimed); xq and x_scale are
# activations, new on every call, so prepare() never sees their content (skillrun.execute.operands).
WEIGHTS = ("wq", "w_scale")
# How loose a card's parity tolerance for this family may be (lint refuses a looser card; see
# skillrun.kb.tolerance). The honest error of these fp8/int4 recipes against the fp32 oracle is a
# few bf16 rounding steps; a port past these limits is wrong, whatever a card says.
TOLERANCE_LIMITS = {"rtol": 0.05, "atol": 0.05, "max_rel_fro": 0.02, "min_cosine": 0.995}
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0

# The benchmark set (B=16 as in the MSLK batched rowwise PR).
SHAPES = [
    {"batch": 16, "M": m, "N": n, "K": k}
    for (n, k) in ((1280, 8192), (8192, 1024))
    for m in (1, 32, 128, 512, 1024, 4096)
]


def _dims(shape: dict) -> tuple[int, int, int, int]:
    missing = [k for k in SHAPE_KEYS if k not in shape]
    if missing:
        raise ValueError(f"fp8_rowwise_batched_gemm shape is missing {missing}; needs {SHAPE_KEYS}")
    b, m, n, k = (int(shape[key]) for key in SHAPE_KEYS)
    if min(b, m, n, k) < 1:
        raise ValueError(f"fp8_rowwise_batched_gemm shape has a non-positive dimension: {shape}")
    return b, m, n, k


def quantize_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize the last dimension of ``x`` to e4m3, one fp32 scale per row (amax / 448)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1).clamp_min(1e-12)
    scale = amax / FP8_MAX
    q = (xf / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale.contiguous()


def make_inputs(shape: dict, seed: int, device: str) -> dict:
    b, m, n, k = _dims(shape)
    if k % 16 or n % 16:
        raise ValueError(f"K and N must be multiples of 16 (fp8 row alignment), got N={n} K={k}")
    gen = torch.Generator(device=device).manual_seed(seed)
    # Activations have a few large channels, weights are near-Gaussian: both quantize to
    # non-trivial scales per row.
    x = torch.randn(b, m, k, generator=gen, device=device, dtype=torch.float32)
    x = x * (1.0 + 4.0 * torch.rand(b, 1, k, generator=gen, device=device))
    # ~1/sqrt(K) weights (an initialised layer) keep the output O(1) at every K, the scale at which
    # the card's absolute tolerance (atol=1e-2) is meaningful; 0.31 ~ 1 / rms(x).
    w = torch.randn(b, n, k, generator=gen, device=device, dtype=torch.float32) * (0.31 / k ** 0.5)
    xq, x_scale = quantize_rowwise(x)
    del x
    wq, w_scale = quantize_rowwise(w)
    return {"xq": xq, "wq": wq, "x_scale": x_scale, "w_scale": w_scale}


def oracle(inputs: dict) -> torch.Tensor:
    """fp32 dequant reference: exact fp8 products accumulated in fp32, then both scales."""
    xq, wq = inputs["xq"], inputs["wq"]
    acc = torch.empty(xq.shape[0], xq.shape[1], wq.shape[1], dtype=torch.float32, device=xq.device)
    for b in range(xq.shape[0]):  # one batch at a time bounds the fp32 temporaries
        acc[b] = xq[b].float() @ wq[b].float().t()
    return acc * inputs["x_scale"].unsqueeze(-1) * inputs["w_scale"].unsqueeze(-2)


def output_like(shape: dict, device: str) -> torch.Tensor:
    b, m, n, _ = _dims(shape)
    return torch.empty(b, m, n, dtype=torch.bfloat16, device=device)


def flops(shape: dict) -> float:
    b, m, n, k = _dims(shape)
    return 2.0 * b * m * n * k


def min_bytes(shape: dict) -> float:
    b, m, n, k = _dims(shape)
    return float(b * (m * k + n * k) + 4 * b * (m + n) + 2 * b * m * n)


def ci_shape(shape: dict | None) -> dict:
    """The shape CI compiles a recipe at: its own (the K loop is rolled, so the real N and K cost
    nothing and keep the override table in play), else a small decode shape."""
    return dict(shape) if shape else {"batch": 4, "M": 128, "N": 1280, "K": 8192}
