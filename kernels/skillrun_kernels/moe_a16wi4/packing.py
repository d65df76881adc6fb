"""int4 packing along K: two signed nibbles per byte, the low nibble holds the even k.

    packed[..., j] = (q[..., 2j] & 0xF) | ((q[..., 2j + 1] & 0xF) << 4)        (uint8)

Unpacking sign-extends each nibble back to [-8, 7]. The kernel reads the same bytes as int8 and
sign-extends with arithmetic shifts: ``lo = (b << 4) >> 4``, ``hi = b >> 4``.
"""
from __future__ import annotations

import torch

INT4_MIN, INT4_MAX = -8, 7


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Pack int8 values in [-8, 7] along the last dimension (even length) into uint8, half as long."""
    if q.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64):
        raise TypeError(f"pack_int4 expects an integer tensor, got {q.dtype}")
    if q.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even last dimension, got {tuple(q.shape)}")
    lo_bad = int(q.min()) < INT4_MIN if q.numel() else False
    hi_bad = int(q.max()) > INT4_MAX if q.numel() else False
    if lo_bad or hi_bad:
        raise ValueError(f"pack_int4 values must lie in [{INT4_MIN}, {INT4_MAX}], got [{int(q.min())}, {int(q.max())}]")
    q16 = q.to(torch.int16)
    lo = q16[..., 0::2] & 0xF
    hi = q16[..., 1::2] & 0xF
    return (lo | (hi << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: uint8 (or int8 bytes) (..., K/2) -> int8 (..., K) in [-8, 7]."""
    if packed.dtype not in (torch.uint8, torch.int8):
        raise TypeError(f"unpack_int4 expects uint8/int8 bytes, got {packed.dtype}")
    b = packed.view(torch.uint8).to(torch.int16)
    lo = b & 0xF
    hi = (b >> 4) & 0xF
    lo = torch.where(lo >= 8, lo - 16, lo)
    hi = torch.where(hi >= 8, hi - 16, hi)
    return torch.stack((lo, hi), dim=-1).flatten(-2).to(torch.int8)


def dequantize(q: torch.Tensor, scale: torch.Tensor, group_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Group dequantization along the last dimension: w[..., k] = q[..., k] * scale[..., k // group]."""
    k = q.shape[-1]
    if k % group_size or scale.shape[-1] != k // group_size:
        raise ValueError(
            f"scale's last dimension must be K/group = {k}/{group_size}, got scale {tuple(scale.shape)} for q {tuple(q.shape)}"
        )
    grouped = q.reshape(*q.shape[:-1], k // group_size, group_size).to(dtype)
    return (grouped * scale.to(dtype).unsqueeze(-1)).reshape(q.shape)
