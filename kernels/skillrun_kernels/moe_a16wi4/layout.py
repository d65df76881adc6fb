"""Layout math of the FlyDSL a16wi4 MoE port (bf16 activations x int4 weights, bf16 group scales).

Shared by the kernels (traced on ``fx.Int32``), the host preparation (``flydsl_prep.py``) and the
host simulation test.

Weights (``w1`` ``[E, 2I, D]`` for stage 1 with gate rows ``[0, I)`` and up rows ``[I, 2I)``; ``w2``
``[E, D, I]`` for stage 2), per expert an ``[N, K]`` matrix of signed int4 codes:

* **packing**: two codes per byte along K, the *low nibble holds the even k* (``byte j`` =
  ``q[2j] & 0xF | (q[2j+1] & 0xF) << 4``), giving ``[N, K/2]`` bytes;
* **kpack 16**: those bytes in the 16x16 preshuffle (:func:`preshuffle_offset` with ``K/2``), so a
  16-byte chunk is 32 consecutive codes of one row (one ``buffer_load_dwordx4`` per lane) and a
  wave reading 16 rows x 64 bytes touches 1024 contiguous bytes;
* experts are consecutive windows of ``N*K/2`` bytes.

Scales: f32 ``[E, K/g, N]`` (group-major, converted exactly from the problem's bf16
``[E, N, K/g]``) so 16 lanes with consecutive ``n`` read 16 consecutive words.

K split (``k_wave``): a ``tile_k`` K tile is split into ``k_wave`` slices of ``k_slice`` codes, one
per wave group; inside a slice lane group ``g = lane // 16`` owns the contiguous quarter
``[g*k_slice/4, +k_slice/4)`` of column ``lane % 16`` (``k_slice/8`` bytes). MFMA step ``j`` of the
slice (``v_mfma_f32_16x16x32_bf16``, 8 values per lane) uses the lane's codes ``[8j, 8j+8)``, so the
A operand of lane ``l`` for step ``j`` is row ``l % 16``'s bf16 at
``k = slice_base + g*k_slice/4 + 8j + i``: 16 contiguous bytes. The MFMA sums over lanes and slots,
so this K assignment only has to agree between A and B, which it does by construction.

Routing: (token, slot) pairs ``pair = token*topk + slot`` are sorted by expert, each expert's run is
padded to a multiple of ``tile_m`` with the sentinel ``tokens*topk``, and every ``tile_m``-row block
has one expert (``-1`` for blocks past the end).
"""
from __future__ import annotations

from typing import Any

from skillrun_kernels._flydsl.layoutmath import (  # noqa: F401  (re-exported)
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
)

KPACK_BYTES = 16  # bytes of packed int4 per lane per chunk (32 codes)
MFMA_K = 32  # K of v_mfma_f32_16x16x32_bf16
LANE_VALUES = 8  # bf16 values per lane per MFMA


# ---------------------------------------------------------------- int4 packing (low nibble = even k)
def nibble_of(k: Any) -> Any:
    """Which nibble of its byte holds code ``k``: 0 = low (even k), 1 = high (odd k)."""
    return fmod(k, 2)


def packed_byte(k: Any) -> Any:
    return fdiv(k, 2)


def code_bit_shift(i: int) -> int:
    """Left shift that puts code ``i`` (0..7) of a little-endian dword into bits [31:28].

    Code ``i`` sits in bits ``[4i, 4i+4)`` (byte ``i//2``, low nibble for even ``i``); shifting left by
    ``28 - 4i`` and then arithmetically right by 28 sign-extends it.
    """
    return 28 - 4 * i


def weight_offset(n: Any, k: Any, K: int) -> Any:
    """Byte offset (within one expert's window) of the byte holding code ``(n, k)`` of an ``[N, K]`` matrix."""
    return preshuffle_offset(n, packed_byte(k), K // 2)


# ---------------------------------------------------------------- K split and lane ownership
def slice_base(kt: Any, kw: Any, tile_k: int, k_slice: int) -> Any:
    """First K code of wave group ``kw``'s slice of K tile ``kt``."""
    return kt * tile_k + kw * k_slice


def lane_k0(base: Any, lane: Any, k_slice: int) -> Any:
    """First K code a lane owns inside a slice starting at ``base``."""
    return base + fdiv(lane, 16) * (k_slice // 4)


def step_k0(base: Any, lane: Any, k_slice: int, j: int) -> Any:
    """First of the 8 K codes lane ``lane`` feeds to MFMA step ``j`` of the slice."""
    return lane_k0(base, lane, k_slice) + j * LANE_VALUES


def scale_index(e: Any, group: Any, n: Any, G: int, N: int) -> Any:
    """Element index of the f32 scale of expert ``e``, K group ``group``, row ``n`` (``[E, G, N]``)."""
    return (e * G + group) * N + n


# ---------------------------------------------------------------- routing
def pair_token(pair: Any, topk: int) -> Any:
    return fdiv(pair, topk)


def sentinel(tokens: int, topk: int) -> int:
    return tokens * topk


def blocks_bound(tokens: int, topk: int, experts: int, tile_m: int) -> int:
    """Upper bound on padded row blocks, known without reading the routing (no device sync)."""
    pairs = tokens * topk
    return -(-pairs // tile_m) + min(experts, pairs)


# ---------------------------------------------------------------- host-side packing (torch)
def pack_int4(q) -> Any:
    """int8 codes ``[..., K]`` in [-8, 7] -> uint8 ``[..., K/2]``, low nibble = even k."""
    import torch

    if q.shape[-1] % 2:
        raise ValueError(f"int4 packing needs an even K, got {tuple(q.shape)}")
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError("int4 codes must lie in [-8, 7]")
    u = q.to(torch.int16) & 0xF
    return (u[..., 0::2] | (u[..., 1::2] << 4)).to(torch.uint8)


def unpack_int4(p) -> Any:
    """Inverse of :func:`pack_int4` (sign-extends each nibble)."""
    import torch

    b = p.to(torch.int16)
    lo, hi = b & 0xF, (b >> 4) & 0xF
    both = torch.stack((lo, hi), dim=-1).flatten(-2)
    return torch.where(both >= 8, both - 16, both).to(torch.int8)


def preshuffle_experts(packed) -> Any:
    """uint8 ``[E, N, K/2]`` -> flat ``[E*N*K/2]``, each expert 16x16-preshuffled (N % 16 == 0)."""
    E, N, KB = packed.shape
    if N % 16 or KB % 16:
        raise ValueError(f"kpack-16 preshuffle needs N % 16 == 0 and K/2 % 16 == 0, got N={N}, K/2={KB}")
    return packed.contiguous().view(E, N // 16, 16, KB // 16, 16).permute(0, 1, 3, 2, 4).contiguous().view(-1)


def scales_group_major(scale) -> Any:
    """bf16 ``[E, N, G]`` -> f32 ``[E, G, N]`` flat (bf16 -> f32 is exact)."""
    return scale.float().permute(0, 2, 1).contiguous().view(-1)
