"""Layout math of the FlyDSL fp8 block-scale GEMM ports (4-wave and 8-wave), shared by kernel and tests.

The kernels compute their addresses with exactly these functions (traced on ``fx.Int32``), and
``tests/test_flydsl_layout.py`` runs them on integers/arrays to simulate a workgroup's fetches from
the prepared buffers and check the result against the fp32 oracle.

Operands as the kernels read them (all byte offsets unless said otherwise):

* ``a``        fp8 ``[M, K]`` row-major, bytes ``m*K + k``.
* ``b_shuf``   fp8 ``[N16, K]`` (N padded with zero rows to a multiple of 16) in the 16x16
  preshuffle: :func:`preshuffle_offset`.
* ``a_scale_t`` f32 ``[K/128, M]`` (the transpose of the problem's ``[M, K/128]``): element
  ``kb*M + m``, so the 4 rows one accumulator lane holds are one 16-byte load.
* ``b_scale``  f32 ``[ceil(N/128), K/128]`` row-major: element ``(n//128)*(K/128) + kb``, one value
  per wave and 16-column group (wave-uniform, an SMEM load).

MFMA ``v_mfma_*_16x16x128_f8f6f4`` operands (wave64): lane ``l`` supplies row ``l % 16`` of A (column
of B) with 32 fp8 bytes, K bytes ``[16*(l//16), +16)`` and ``[64 + 16*(l//16), +16)`` of the 128-deep
block. Which K a byte position stands for is a convention that only has to agree between A and B
(the MFMA sums over all 128 products), and this one makes each B half a single 16-byte load of
the preshuffled buffer. The 4 f32 results of lane ``l`` are rows ``4*(l//16) + i`` at column ``l % 16``.

On gfx942 the same 32-byte fragments feed four ``v_mfma_f32_16x16x32_fp8_fp8`` (8 bytes each).
"""
from __future__ import annotations

from typing import Any

from skillrun_kernels._flydsl.layoutmath import (  # noqa: F401  (re-exported: the kernels' single import)
    XCDS,
    acc_col,
    acc_row,
    fdiv,
    fmod,
    group_raster,
    lds_swizzle_offset,
    operand_row,
    preshuffle_inverse,
    preshuffle_offset,
    tile_copy_coords,
    tile_of,
    xcd_remap,
)

BLOCK_K = 128  # the scale block along K (and along N for B); one MFMA's K
FRAG_BYTES = 32  # fp8 bytes per lane per 16x16x128 MFMA operand


def frag_chunk_k(lane: Any, half: int) -> Any:
    """First K byte (within a 128-K block) of 16-byte half ``half`` (0/1) of a lane's fragment."""
    return fdiv(lane, 16) * 16 + half * 64


def frag_kbyte(lane: Any, j: int) -> Any:
    """K byte (within a 128-K block) that byte ``j`` (0..31) of a lane's operand fragment holds."""
    return frag_chunk_k(lane, j // 16) + (j % 16)


def b_frag_offset(col: Any, kb: Any, lane: Any, half: int, K: int) -> Any:
    """Byte offset in ``b_shuf`` of the 16 bytes a lane loads for column ``col`` and K block ``kb``."""
    return preshuffle_offset(col, kb * BLOCK_K + frag_chunk_k(lane, half), K)


def a_scale_index(row: Any, kb: Any, M: Any) -> Any:
    """Element index of ``a_scale_t[kb, row]`` (transposed A scales)."""
    return kb * M + row


def b_scale_index(col: Any, kb: Any, K: int) -> Any:
    """Element index of ``b_scale[col // 128, kb]``."""
    return fdiv(col, BLOCK_K) * (K // BLOCK_K) + kb


def wave_columns(wave: Any, tile_n: int, waves_n: int) -> Any:
    """First column (within the tile) of the strip a wave owns when ``waves_n`` waves split N."""
    return wave * (tile_n // waves_n)


# ---------------------------------------------------------------- host-side preparation (torch)
def pad_rows(w, multiple: int):
    import torch

    n = w.shape[0]
    pad = (-n) % multiple
    if pad == 0:
        return w
    return torch.cat([w, torch.zeros((pad,) + tuple(w.shape[1:]), dtype=w.dtype, device=w.device)], dim=0)


def preshuffle_b(b) -> "Any":
    """fp8/int8 ``[N, K]`` -> flat uint8 ``[N16*K]`` in the 16x16 preshuffle (zero rows pad N to 16)."""
    import torch

    w = pad_rows(b.contiguous().view(torch.uint8), 16)
    n16, k = w.shape
    if k % 16:
        raise ValueError(f"preshuffle needs K % 16 == 0, got K={k}")
    return w.view(n16 // 16, 16, k // 16, 16).permute(0, 2, 1, 3).contiguous().view(-1)


def unshuffle_b(flat, n16: int, k: int):
    """Inverse of :func:`preshuffle_b` (without the padding rows removed)."""
    import torch

    return flat.view(torch.uint8).view(n16 // 16, k // 16, 16, 16).permute(0, 2, 1, 3).contiguous().view(n16, k)


def prepare(inputs: dict) -> dict:
    """Problem inputs -> kernel operands (untimed): flat fp8 bytes, preshuffled B, transposed A scales."""
    import torch

    a, b = inputs["a"], inputs["b"]
    M, K = a.shape
    N = b.shape[0]
    return {
        "a": a.contiguous().view(torch.uint8).view(-1),
        "b_shuf": preshuffle_b(b),
        "a_scale_t": inputs["a_scale"].float().t().contiguous().view(-1),
        "b_scale": inputs["b_scale"].float().contiguous().view(-1),
        "M": M,
        "N": N,
        "K": K,
    }
