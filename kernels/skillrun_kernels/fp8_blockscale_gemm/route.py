"""How `skill-run e2e` sees a block-scaled ``aten::_scaled_mm`` call as this family's problem.

    torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
        a (M, K) fp8 e4m3, b (K, N) fp8 e4m3 (the (N, K) weight transposed),
        scale_a (M, K/128) fp32: 1x128 activation blocks,
        scale_b (K/128, N/128) fp32: the (N/128, K/128) 128x128 weight-block scales transposed
    -> problem inputs a = a, b = b.T (N, K), a_scale = scale_a, b_scale = scale_b.T

Only that recipe is this problem: tensor-wise and row-wise scales, a bias, a result scale, fp32 or
fp16 outputs are passed through (and counted with the reason). Inputs are views of the call's
arguments, nothing is copied.
"""
from __future__ import annotations

import torch

from skillrun_kernels.fp8_blockscale_gemm import problem
from skillrun_kernels.protocol import RoutedCall

ATEN_OPS = ("aten::_scaled_mm",)
BLOCK = problem.BLOCK


def plan_key(shape: dict) -> tuple:
    return tuple(int(shape[k]) for k in problem.SHAPE_KEYS)


def problem_call(op: str, args: dict) -> RoutedCall | str:
    a, b, sa, sb = args["self"], args["mat2"], args["scale_a"], args["scale_b"]
    if a.dim() != 2 or b.dim() != 2:
        return "not a 2-D GEMM"
    if a.dtype != problem.FP8_DTYPE or b.dtype != problem.FP8_DTYPE:
        return f"operands {a.dtype}/{b.dtype}, not float8_e4m3fn"
    M, K = a.shape
    N = b.shape[1]
    if K % BLOCK or b.shape[0] != K:
        return f"K={K} is not a multiple of {BLOCK}"
    kb, nb = K // BLOCK, -(-N // BLOCK)
    if tuple(sa.shape) != (M, kb) or tuple(sb.shape) != (kb, nb) or sa.dtype != torch.float32 or sb.dtype != torch.float32:
        return "scales are not block-wise 1x128 x 128x128 fp32"
    if M == kb and nb == 1 and M != 1:
        # (M, L) and (L, 1) is also how a row-wise call would look only if M == L; keep the ambiguity out.
        return "ambiguous scale shapes (row-wise or block-wise)"
    if args.get("bias") is not None:
        return "has a bias (the port has no bias epilogue)"
    if args.get("scale_result") is not None:
        return "has a result scale"
    if args.get("out_dtype") not in (torch.bfloat16,):
        return f"out_dtype {args.get('out_dtype')} (the port writes bf16)"
    out = args.get("out")
    if out is None:
        out = torch.empty((M, N), dtype=torch.bfloat16, device=a.device)
    elif tuple(out.shape) != (M, N) or out.dtype != torch.bfloat16 or out.stride(1) != 1:
        return "out= is not a row-major (M, N) bf16 tensor"
    inputs = {"a": a, "b": b.t(), "a_scale": sa, "b_scale": sb.t()}
    return RoutedCall(shape={"M": M, "N": N, "K": K}, inputs=inputs, out=out)
