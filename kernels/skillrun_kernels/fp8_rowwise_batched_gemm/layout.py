"""Layout math of the FlyDSL batched row-wise fp8 GEMM port, shared by the kernel and the host tests.

Operands (per batch ``b``; each batch is its own buffer-descriptor window, so offsets stay 32-bit
and a row past ``M`` reads 0 inside its own batch):

* ``xq``      fp8 ``[B, M, K]``: batch window ``b*M*K``, bytes ``m*K + k``.
* ``wq_shuf`` fp8 ``[B, N16, K]``: batch window ``b*N16*K``, the 16x16 preshuffle of each batch's
  ``[N, K]`` (:func:`preshuffle_offset`).
* ``x_scale`` f32 ``[B, M]`` and ``w_scale`` f32 ``[B, N]``: one multiplier per row / column, applied
  once in the epilogue (``out = acc * x_scale[m] * w_scale[n]``), never inside the K loop.

MFMA operand fragments and accumulator lanes are the block-scale port's (see
``fp8_blockscale_gemm/layout.py``): lane ``l`` supplies row ``l % 16`` with K bytes
``[16*(l//16), +16)`` and ``[64 + 16*(l//16), +16)`` of each 128-deep step; its results are rows
``4*(l//16) + i`` at column ``l % 16``.
"""
from __future__ import annotations

from typing import Any

from skillrun_kernels._flydsl.layoutmath import (  # noqa: F401  (re-exported: the kernel's single import)
    XCDS,
    acc_col,
    acc_row,
    fdiv,
    fmod,
    lds_swizzle_offset,
    operand_row,
    preshuffle_inverse,
    preshuffle_offset,
    tile_copy_coords,
    tile_of,
    xcd_remap,
)

K_STEP = 128  # K bytes per 16x16x128 MFMA


def frag_chunk_k(lane: Any, half: int) -> Any:
    """First K byte (within a 128-K step) of 16-byte half ``half`` of a lane's operand fragment."""
    return fdiv(lane, 16) * 16 + half * 64


def b_frag_offset(col: Any, kstep: Any, lane: Any, half: int, K: int) -> Any:
    """Byte offset (within a batch's window of ``wq_shuf``) of a lane's 16-byte B load."""
    return preshuffle_offset(col, kstep * K_STEP + frag_chunk_k(lane, half), K)


def wave_columns(wave: Any, tile_n: int, waves_n: int) -> Any:
    return wave * (tile_n // waves_n)


# ---------------------------------------------------------------- host-side preparation (torch)
def preshuffle_batched(wq) -> Any:
    """fp8 ``[B, N, K]`` -> flat uint8 ``[B*N16*K]``, each batch 16x16-preshuffled (N padded to 16)."""
    import torch

    B, N, K = wq.shape
    if K % 16:
        raise ValueError(f"preshuffle needs K % 16 == 0, got K={K}")
    w = wq.contiguous().view(torch.uint8)
    pad = (-N) % 16
    if pad:
        w = torch.cat([w, torch.zeros((B, pad, K), dtype=torch.uint8, device=w.device)], dim=1)
    n16 = N + pad
    return w.view(B, n16 // 16, 16, K // 16, 16).permute(0, 1, 3, 2, 4).contiguous().view(-1)


def prepare(inputs: dict) -> dict:
    """Problem inputs -> kernel operands (untimed): flat bytes, per-batch preshuffled W, f32 scales."""
    import torch

    xq, wq = inputs["xq"], inputs["wq"]
    B, M, K = xq.shape
    N = wq.shape[1]
    return {
        "xq": xq.contiguous().view(torch.uint8).view(-1),
        "wq_shuf": preshuffle_batched(wq),
        "x_scale": inputs["x_scale"].float().contiguous().view(-1),
        "w_scale": inputs["w_scale"].float().contiguous().view(-1),
        "B": B,
        "M": M,
        "N": N,
        "K": K,
    }
