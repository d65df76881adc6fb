"""The fp8 block-scale GEMM problem (DeepSeek recipe), torch-only and device-agnostic.

    C[M, N] (bf16) = A[M, K] (fp8 e4m3) x B[N, K]^T (fp8 e4m3)
    a_scale: (M, K/128)        fp32, one per 1x128 block of A
    b_scale: (ceil(N/128), K/128)  fp32, one per 128x128 block of B (the last may be partial)

Scales are *decode* multipliers: A[m, k] ~= a[m, k] * a_scale[m, k // 128]. The numeric recipe every
kernel of this family follows: an unscaled fp8 MMA over each 128-deep K block, then an fp32
promote ``acc += partial * (sa[:, None] * sb)`` per K block. Any M >= 1 and N >= 1 (ragged M and
N; DeepSeek's fused q_a/kv_a projection has N = 2112 = 16.5 x 128); K a multiple of 128.

This module is imported by more than one port (Triton on sm_90, FlyDSL on gfx9xx), so it uses
torch only and works on CPU tensors too.
"""
from __future__ import annotations

import torch

SHAPE_KEYS = ("M", "N", "K")
# The weight operands: a port may re-lay them out once in prepare() (untimed); a is an activation,
# new on every call, so prepare() never sees its content (skillrun.execute.operands).
WEIGHTS = ("b", "b_scale")
# a_scale is an activation, but its layout is the quantizer's choice (it writes M-major or TMA-padded
# scales as the kernel wants, at no cost): prepare() may re-lay it out. a itself stays hidden.
PREPARED_ACTIVATIONS = ("a_scale",)
# How loose a card's parity tolerance for this family may be (lint refuses a looser card; see
# skillrun.kb.tolerance). The honest error of these fp8/int4 recipes against the fp32 oracle is a
# few bf16 rounding steps; a port past these limits is wrong, whatever a card says.
TOLERANCE_LIMITS = {"rtol": 0.05, "atol": 0.05, "max_rel_fro": 0.02, "min_cosine": 0.995}
BLOCK = 128  # the scale block along K (and along N for B); fixed by the recipe
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value


def check_shape(shape: dict) -> tuple[int, int, int]:
    """(M, N, K) from a shape dict, or a ValueError naming the bad dimension."""
    try:
        M, N, K = (int(shape[k]) for k in SHAPE_KEYS)
    except KeyError as exc:
        raise ValueError(f"fp8_blockscale_gemm shape needs M, N, K; missing {exc.args[0]!r} in {shape}") from None
    if M < 1:
        raise ValueError(f"fp8_blockscale_gemm: M={M} must be >= 1")
    if N < 1:
        raise ValueError(f"fp8_blockscale_gemm: N={N} must be >= 1")
    if K < BLOCK or K % BLOCK:
        raise ValueError(f"fp8_blockscale_gemm: K={K} must be a positive multiple of {BLOCK}")
    return M, N, K


def expand_a_scale(a_scale: torch.Tensor, K: int) -> torch.Tensor:
    """(M, K/128) -> (M, K): each 1x128 scale repeated along its block."""
    return a_scale.float().repeat_interleave(BLOCK, dim=1)[:, :K]


def expand_b_scale(b_scale: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """(ceil(N/128), K/128) -> (N, K): each 128x128 scale repeated over its block."""
    s = b_scale.float().repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)
    return s[:N, :K]


def dequant_a(a: torch.Tensor, a_scale: torch.Tensor) -> torch.Tensor:
    return a.float() * expand_a_scale(a_scale, a.shape[1])


def dequant_b(b: torch.Tensor, b_scale: torch.Tensor) -> torch.Tensor:
    return b.float() * expand_b_scale(b_scale, b.shape[0], b.shape[1])


def quantize_1x128(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row, per-128-column quantization: (M, K) float -> (fp8 (M, K), fp32 scales (M, K/128))."""
    M, K = x.shape
    blocks = x.float().reshape(M, K // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=2).clamp_min(1e-12)
    scale = amax / FP8_MAX  # decode multiplier; amax-derived, so not a power of two
    q = (blocks / scale[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).reshape(M, K)
    return q, scale.contiguous()


def quantize_128x128(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-128x128-block quantization: (N, K) float -> (fp8 (N, K), fp32 scales (ceil(N/128), K/128)).

    A partial last row-block (N % 128 != 0) is scaled by the amax of the rows it has."""
    N, K = w.shape
    nb = -(-N // BLOCK)
    padded = torch.zeros((nb * BLOCK, K), dtype=torch.float32, device=w.device)
    padded[:N] = w.float()
    blocks = padded.reshape(nb, BLOCK, K // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12)
    scale = amax / FP8_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).reshape(nb * BLOCK, K)
    return q[:N].contiguous(), scale.contiguous()


def make_inputs(shape: dict, seed: int, device: str | torch.device = "cpu") -> dict:
    """Fresh random operands, quantized per block so the scales are realistic.

    Each 1x128 (A) and 128x128 (B) block gets its own magnitude (a factor spread over ~2^-3..2^3),
    so the scales differ from block to block: a kernel that reads the wrong scale for a block gives
    a visibly wrong answer instead of a lucky match.
    """
    M, N, K = check_shape(shape)
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    kb, nb = K // BLOCK, -(-N // BLOCK)

    def randn(*size):
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32)

    def spread(*size):
        return torch.exp2(torch.rand(*size, generator=gen, device=device) * 6.0 - 3.0)

    x = randn(M, K) * spread(M, kb).repeat_interleave(BLOCK, dim=1)
    # Weights scaled like an initialised layer (~1/sqrt(K)) so the output is O(1) at every K: the
    # card's absolute tolerance (atol=1e-2) only means something at that scale. With O(10-100)
    # outputs, bf16 rounding of the result alone (half an ulp is 0.06-0.25 there) fails atol near
    # cancelling elements for every correct kernel, cuBLAS included (seen on the H200).
    w_std = 0.123 / K ** 0.5  # 0.123 ~ 1 / (rms of x * rms of the block spread): output std ~ 1
    w = randn(N, K) * w_std * spread(nb, kb).repeat_interleave(BLOCK, dim=0)[:N].repeat_interleave(BLOCK, dim=1)
    a, a_scale = quantize_1x128(x)
    del x
    b, b_scale = quantize_128x128(w)
    return {"a": a, "b": b, "a_scale": a_scale, "b_scale": b_scale}


def oracle(inputs: dict) -> torch.Tensor:
    """fp32 dequant -> fp32 matmul (true fp32: TF32 is switched off for the call). Returns fp32 (M, N)."""
    a = dequant_a(inputs["a"], inputs["a_scale"])
    b = dequant_b(inputs["b"], inputs["b_scale"])
    if a.is_cuda:
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            return a @ b.t()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
    return a @ b.t()


def output_like(shape: dict, device: str | torch.device = "cpu") -> torch.Tensor:
    M, N, _ = check_shape(shape)
    return torch.empty((M, N), dtype=torch.bfloat16, device=device)


def flops(shape: dict) -> float:
    M, N, K = check_shape(shape)
    return 2.0 * M * N * K


def min_bytes(shape: dict) -> float:
    """Each operand and scale read once, the bf16 output written once."""
    M, N, K = check_shape(shape)
    kb = K // BLOCK
    return float(M * K + N * K + 4 * (M * kb + -(-N // BLOCK) * kb) + 2 * M * N)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64; NaN/inf anywhere in ``out`` gives inf (never passes)."""
    o = out.double()
    if not torch.isfinite(o).all():
        return float("inf")
    r = ref.double()
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def ci_shape(shape: dict | None) -> dict:
    """The shape CI compiles a recipe at: the recipes' N class and config with a short K (K is unrolled)."""
    return {"M": 512, "N": 2048, "K": 512}
