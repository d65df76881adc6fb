"""Layout arithmetic shared by the FlyDSL ports, written once for every kind of integer.

Each function here is plain ``+ - * >> & ^`` (and ``// %`` for non-powers of two) code, so the same
function runs on

* Python ints (documentation, unit tests),
* numpy / torch integer arrays (the host-side simulation of a workgroup's fetches), and
* ``fx.Int32`` values while a FlyDSL kernel is traced (the kernel's actual address math).

All operands are non-negative, so shifts and masks equal floor division and modulo; they are used
for powers of two because signed ``//``/``%`` on i32 make LLVM emit sign fix-ups.
"""
from __future__ import annotations

from typing import Any

XCDS = 8  # MI300X/MI355X: 8 XCDs, workgroup ids dispatched round-robin over them


def is_pow2(d: int) -> bool:
    return d > 0 and d & (d - 1) == 0


def fdiv(x: Any, d: int) -> Any:
    """``x // d`` for a non-negative ``x`` and a positive constant ``d``."""
    if isinstance(x, int):
        return x // d
    return x >> (d.bit_length() - 1) if is_pow2(d) else x // d


def fmod(x: Any, d: int) -> Any:
    """``x % d`` for a non-negative ``x`` and a positive constant ``d``."""
    if isinstance(x, int):
        return x % d
    return x & (d - 1) if is_pow2(d) else x % d


def vmin(a: Any, b: Any) -> Any:
    """Elementwise minimum for ints, numpy/torch arrays and FlyDSL integers."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    mod = type(a).__module__ + type(b).__module__
    if "torch" in mod:
        import torch

        return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))
    if "numpy" in mod:
        import numpy as np

        return np.minimum(a, b)
    import flydsl.expr as fx

    return fx.min(a, b)


def vdiv(x: Any, d: Any) -> Any:
    """``x // d`` where the divisor may itself be a runtime value (grid sizes)."""
    if isinstance(d, int):
        return fdiv(x, d)
    return x // d


def vmod(x: Any, d: Any) -> Any:
    if isinstance(d, int):
        return fmod(x, d)
    return x % d


# ---------------------------------------------------------------- 16x16 preshuffled weights
def preshuffle_offset(n: Any, k: Any, K: int) -> Any:
    """Byte offset of element ``(n, k)`` of an ``[N, K]`` byte matrix in the 16x16 preshuffle.

    Each 16-row block of N is stored as consecutive 256-byte tiles, one per 16-byte K chunk, with
    the 16 rows of a tile contiguous: ``(n//16)*16*K + (k//16)*256 + (n%16)*16 + (k%16)``. One wave
    reading 16 bytes per lane for 16 columns x 64 K bytes touches 1024 contiguous bytes.
    """
    return fdiv(n, 16) * (16 * K) + fdiv(k, 16) * 256 + fmod(n, 16) * 16 + fmod(k, 16)


def preshuffle_inverse(offset: Any, K: int) -> tuple[Any, Any]:
    """``(n, k)`` stored at ``offset`` (inverse of :func:`preshuffle_offset`)."""
    nb = fdiv(offset, 16 * K)
    rest = fmod(offset, 16 * K)
    kc = fdiv(rest, 256)
    inner = fmod(rest, 256)
    return nb * 16 + fdiv(inner, 16), kc * 16 + fmod(inner, 16)


# ---------------------------------------------------------------- MFMA lane mappings (wave64)
def acc_row(lane: Any, i: int) -> Any:
    """Row of accumulator element ``i`` (0..3) held by ``lane`` in a 16x16 f32 MFMA result."""
    return fdiv(lane, 16) * 4 + i


def acc_col(lane: Any) -> Any:
    """Column of every accumulator element held by ``lane`` in a 16x16 MFMA result."""
    return fmod(lane, 16)


def operand_row(lane: Any) -> Any:
    """Row of A (column of B) a lane supplies to a 16x16xK MFMA."""
    return fmod(lane, 16)


# ---------------------------------------------------------------- LDS tile with a 16-byte XOR swizzle
def lds_swizzle_offset(row: Any, kbyte: Any, row_bytes: int) -> Any:
    """Byte offset of ``(row, kbyte)`` in a row-major LDS tile whose 16-byte chunks are XOR-swizzled.

    The chunk index is XORed with ``row % chunks_per_row`` so the 16 rows one MFMA operand read
    touches start in different bank groups. It permutes chunks within a row, so it is a bijection.
    """
    chunks = row_bytes // 16
    chunk = fdiv(kbyte, 16) ^ fmod(row, chunks)
    return row * row_bytes + chunk * 16 + fmod(kbyte, 16)


def tile_copy_coords(thread: Any, step: int, row_bytes: int, nthreads: int) -> tuple[Any, Any]:
    """The 16-byte chunk ``(row, kbyte)`` a thread copies in copy step ``step`` of a row-major tile."""
    chunk = thread + step * nthreads
    per_row = row_bytes // 16
    return fdiv(chunk, per_row), fmod(chunk, per_row) * 16


# ---------------------------------------------------------------- grid rasterization
def xcd_remap(pid: Any, num_pids: Any, xcds: int = XCDS) -> Any:
    """Renumber workgroups so each XCD gets a contiguous run of tile ids.

    Hardware sends workgroup ``pid`` to XCD ``pid % xcds``; XCD ``x`` receives
    ``q + (x < r)`` workgroups (``q, r = divmod(num_pids, xcds)``). The ``j``-th of them
    (``j = pid // xcds``) becomes tile id ``x*q + min(x, r) + j``, so tiles that share operands run
    on the same L2. A bijection on ``[0, num_pids)`` for every size, remainders included.
    """
    x = vmod(pid, xcds)
    j = vdiv(pid, xcds)
    q = vdiv(num_pids, xcds)
    r = vmod(num_pids, xcds)
    return x * q + vmin(x, r) + j


def group_raster(pid: Any, grid_m: Any, grid_n: Any, group_m: int) -> tuple[Any, Any]:
    """Tile id -> ``(pid_m, pid_n)``, walking ``group_m`` M-tiles down each N column before moving on.

    The last group may be shorter (``grid_m % group_m`` rows); it is handled exactly, so the map is
    a bijection from ``[0, grid_m*grid_n)`` onto the grid.
    """
    per_group = grid_n * group_m
    group = vdiv(pid, per_group)
    first_m = group * group_m
    rows = vmin(grid_m - first_m, group_m)
    inner = vmod(pid, per_group)
    return first_m + vmod(inner, rows), vdiv(inner, rows)


def tile_of(pid: Any, grid_m: Any, grid_n: Any, xcd_swizzle: int, xcds: int = XCDS) -> tuple[Any, Any]:
    """Workgroup id -> output tile ``(pid_m, pid_n)``.

    ``xcd_swizzle == 0``: M fastest (as a 2-D launch with x over M would be). ``xcd_swizzle = g > 0``:
    :func:`xcd_remap` over 8 XCDs, then :func:`group_raster` with group height ``g``.
    """
    if xcd_swizzle <= 0:
        return vmod(pid, grid_m), vdiv(pid, grid_m)
    tid = xcd_remap(pid, grid_m * grid_n, xcds)
    return group_raster(tid, grid_m, grid_n, xcd_swizzle)
