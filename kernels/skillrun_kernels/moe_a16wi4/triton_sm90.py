"""Triton port (sm_90) of the a16wi4 MoE layer: bf16 activations x packed int4 weights.

Five launches, none of which waits on the host, so the whole layer can be captured in a CUDA graph:

1. ``_moe_a16wi4_align_kernel`` (one program): per-expert token counts (``tl.histogram``), each
   expert's padded start (counts rounded up to BLOCK_M, prefix-summed), valid-row end, total rows.
2. ``_moe_a16wi4_scatter_kernel``: every (token, slot) pair takes a row in its expert's range with
   an atomic cursor, and tags its BLOCK_M block with the expert id. Order inside an expert does
   not matter: every row is computed independently.
3. ``_moe_a16wi4_gate_up_kernel``: per (expert block, N tile): gate and up tiles of W1 unpacked from
   int4 in registers, scaled per group, two accumulators, SiLU(gate) * up stored as bf16 h. It
   also zeroes the fp32 output accumulator that stage 2 adds into (saves a fill launch).
4. ``_moe_a16wi4_down_kernel``: h @ W2^T per expert block, times the routing weight, atomically
   added into the fp32 (tokens, model_dim) accumulator: the top-k sum needs no extra pass.
5. ``_moe_a16wi4_cast_kernel``: fp32 accumulator -> bf16 output.

Two decode levers, off by default (the measured recipes predate them; ``skill-run tune`` sweeps them):
- ``split_k1`` > 1: stage 1 at decode runs one program per (expert block, N tile) over the whole
  7168-deep K, 128 programs at T=1 (one wave on 132 SMs, one CTA's loads in flight per SM: the
  0.55 TB/s row of NOTES.md). Splitting K multiplies the programs; the gate and up partials meet
  by fp32 atomics in a (pairs, 2*I) workspace (L2-resident at decode) and
  ``_moe_a16wi4_silu_kernel`` applies SiLU(gate) * up, writes h and re-zeroes the workspace (six
  launches instead of five; SiLU is not linear, so it cannot run before the K sum).
- ``int4_cvt: magic``: nibble -> bf16 without integer-to-float conversion instructions: the
  offset nibble (s + 8, 0..15) ORed into the mantissa of bf16 128.0 (0x4300) is 128 + s + 8
  exactly (the bf16 ulp at 128 is 1), and one bf16 subtraction of 136 leaves s. Two logic ops and a
  packed bf16 subtract per pair of weights instead of sign-extending shifts and I2F converts, which
  NOTES.md's bottleneck section names as the issue limit at decode.

Int4 layout (packing.py): two nibbles per byte along K, low nibble = even k. With ``split`` the
kernel never interleaves nibbles: it de-interleaves the (contiguously loaded) activation tile into
even-k and odd-k halves in registers and multiplies them by the low and high nibbles (two half-K
dots). Without it, the nibbles are interleaved back into a (BLOCK_N, BLOCK_K) weight tile.
Blocks past the last valid row exit at once; their count is bounded on the host without a sync.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from skillrun_kernels.protocol import KernelLaunch

from . import packing

KERNEL_PREFIX = "_moe_a16wi4_"
EXPECT_KERNELS = r"^_moe_a16wi4_(align|scatter|gate_up|silu|down|cast)_kernel$"


# Token-count-dependent integers are not specialized: one compiled kernel serves every batch size.
@triton.jit(do_not_specialize=["P"])
def _moe_a16wi4_align_kernel(
    ids_ptr, start_ptr, valid_end_ptr, cursor_ptr, num_rows_ptr, P,
    E: tl.constexpr, NBINS: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
):
    counts = tl.zeros((NBINS,), dtype=tl.int32)
    for c in range(0, tl.cdiv(P, CHUNK)):
        offs = c * CHUNK + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < P, other=E)  # bin E collects the tail
        counts += tl.histogram(ids, NBINS)
    bins = tl.arange(0, NBINS)
    real = bins < E
    counts = tl.where(real, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    tl.store(start_ptr + bins, starts, mask=real)
    tl.store(valid_end_ptr + bins, starts + counts, mask=real)
    tl.store(cursor_ptr + bins, tl.zeros((NBINS,), dtype=tl.int32), mask=real)
    tl.store(num_rows_ptr, tl.sum(padded, 0))


@triton.jit(do_not_specialize=["P"])
def _moe_a16wi4_scatter_kernel(
    ids_ptr, sorted_ptr, block_expert_ptr, start_ptr, cursor_ptr, P,
    BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
):
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    ok = offs < P
    e = tl.load(ids_ptr + offs, mask=ok, other=0)
    slot = tl.atomic_add(cursor_ptr + e, 1, mask=ok)
    dest = tl.load(start_ptr + e, mask=ok, other=0) + slot
    tl.store(sorted_ptr + dest, offs, mask=ok)
    # Every pair of a block carries the same expert id; the duplicate writes agree.
    tl.store(block_expert_ptr + dest // BLOCK_M, e, mask=ok)


@triton.jit
def _expand_groups(s, BN: tl.constexpr, NG: tl.constexpr, REP: tl.constexpr):
    # (BN, NG) group scales -> (BN, NG * REP): each scale repeated over its group's columns.
    return tl.reshape(tl.broadcast_to(s[:, :, None], (BN, NG, REP)), (BN, NG * REP))


@triton.jit
def _nibble_bf16_magic(nib):
    # nib: int16 lanes holding a two's-complement nibble in bits 0..3 (upper bits arbitrary).
    # (nib ^ 8) & 15 = s + 8 in 0..15; OR into bf16 128.0's mantissa, subtract 136 (both exact).
    bits = ((nib ^ 8) & 15) | 0x4300
    return bits.to(tl.bfloat16, bitcast=True) - 136.0


@triton.jit
def _int4_tile(packed, s, BN: tl.constexpr, KH: tl.constexpr, GROUP: tl.constexpr,
               SPLIT: tl.constexpr, SCALE_ACC: tl.constexpr, MAGIC: tl.constexpr = False):
    """Unpack a (BN, KH) byte tile into bf16 weights: (lo, hi) halves, or one interleaved tile."""
    # Arithmetic shifts on int8 sign-extend the nibbles; int4 values are exact in bf16, and the
    # bf16 multiply by the bf16 scale rounds the exact product once (same as an fp32 multiply
    # rounded to bf16) while keeping two values per register.
    if MAGIC:
        p16 = packed.to(tl.int16)
        lo = _nibble_bf16_magic(p16)
        hi = _nibble_bf16_magic(p16 >> 4)
    else:
        lo = ((packed << 4) >> 4).to(tl.bfloat16)
        hi = (packed >> 4).to(tl.bfloat16)
    if SPLIT:
        if not SCALE_ACC:
            sx = _expand_groups(s, BN, (2 * KH) // GROUP, GROUP // 2)
            lo = lo * sx
            hi = hi * sx
        return lo, hi
    else:
        w = tl.reshape(tl.join(lo, hi), (BN, 2 * KH))
        if not SCALE_ACC:
            w = w * _expand_groups(s, BN, (2 * KH) // GROUP, GROUP)
        return w, w


@triton.jit(do_not_specialize=["zero_numel", "zero_per_prog", "k_steps_per_split"])
def _moe_a16wi4_gate_up_kernel(
    x_ptr, w_ptr, s_ptr, h_ptr, zero_ptr, part_ptr,
    sorted_ptr, block_expert_ptr, valid_end_ptr, num_rows_ptr,
    D, I, zero_numel, zero_per_prog, k_steps_per_split,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_ht,
    TOPK: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NG: tl.constexpr,
    SPLIT: tl.constexpr, SCALE_ACC: tl.constexpr, SPLIT_K: tl.constexpr = 1, MAGIC: tl.constexpr = False,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    # Clear this program's share of the stage-2 fp32 accumulator (stage 2 runs after this launch).
    prog = (split * tl.num_programs(1) + pid_n) * tl.num_programs(0) + pid_m
    zoffs = tl.arange(0, 1024)
    for z in range(0, zero_per_prog, 1024):
        idx = prog.to(tl.int64) * zero_per_prog + z + zoffs
        tl.store(zero_ptr + idx, tl.zeros((1024,), dtype=tl.float32),
                 mask=(z + zoffs < zero_per_prog) & (idx < zero_numel))

    if pid_m * BLOCK_M >= tl.load(num_rows_ptr):
        return
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rvalid = rows < tl.load(valid_end_ptr + e)
    pair = tl.load(sorted_ptr + rows, mask=rvalid, other=0).to(tl.int64)
    tok = pair // TOPK

    KH: tl.constexpr = BLOCK_K // 2
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kh = tl.arange(0, KH)
    # This program's K slice: all of K, or k_steps_per_split BLOCK_K steps of it (split-K).
    k_first = split * k_steps_per_split if SPLIT_K > 1 else 0
    k_last = tl.minimum(k_first + k_steps_per_split, D // BLOCK_K) if SPLIT_K > 1 else D // BLOCK_K
    wg_ptrs = w_ptr + e * stride_we + offs_n[:, None] * stride_wn + (k_first * KH + offs_kh)[None, :]
    wu_ptrs = wg_ptrs + I * stride_wn
    sg_ptrs = s_ptr + e * stride_se + offs_n[:, None] * stride_sn + (k_first * NG + tl.arange(0, NG))[None, :]
    su_ptrs = sg_ptrs + I * stride_sn
    xa_ptrs = x_ptr + tok[:, None] * stride_xt + (k_first * BLOCK_K + tl.arange(0, BLOCK_K))[None, :]

    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(k_first, k_last):
        bg = tl.load(wg_ptrs)
        bu = tl.load(wu_ptrs)
        if SCALE_ACC:
            # One group spans this whole K step: scale the partial product, not the weights.
            grp = (kt * BLOCK_K) // GROUP
            sg = tl.load(s_ptr + e * stride_se + offs_n * stride_sn + grp)
            su = tl.load(s_ptr + e * stride_se + (offs_n + I) * stride_sn + grp)
        else:
            sg = tl.load(sg_ptrs)
            su = tl.load(su_ptrs)
        gl, gh = _int4_tile(bg, sg, BLOCK_N, KH, GROUP, SPLIT, SCALE_ACC, MAGIC)
        ul, uh = _int4_tile(bu, su, BLOCK_N, KH, GROUP, SPLIT, SCALE_ACC, MAGIC)
        a = tl.load(xa_ptrs, mask=rvalid[:, None], other=0.0)
        if SPLIT:
            # contiguous load, de-interleaved in registers: even k meets the low nibbles
            a_even, a_odd = tl.split(tl.reshape(a, (BLOCK_M, KH, 2)))
            if SCALE_ACC:
                pg = tl.dot(a_even, tl.trans(gl))
                pg = tl.dot(a_odd, tl.trans(gh), pg)
                pu = tl.dot(a_even, tl.trans(ul))
                pu = tl.dot(a_odd, tl.trans(uh), pu)
                acc_g += pg * sg.to(tl.float32)[None, :]
                acc_u += pu * su.to(tl.float32)[None, :]
            else:
                acc_g = tl.dot(a_even, tl.trans(gl), acc_g)
                acc_g = tl.dot(a_odd, tl.trans(gh), acc_g)
                acc_u = tl.dot(a_even, tl.trans(ul), acc_u)
                acc_u = tl.dot(a_odd, tl.trans(uh), acc_u)
        else:
            if SCALE_ACC:
                acc_g += tl.dot(a, tl.trans(gl)) * sg.to(tl.float32)[None, :]
                acc_u += tl.dot(a, tl.trans(ul)) * su.to(tl.float32)[None, :]
            else:
                acc_g = tl.dot(a, tl.trans(gl), acc_g)
                acc_u = tl.dot(a, tl.trans(ul), acc_u)
        wg_ptrs += KH
        wu_ptrs += KH
        sg_ptrs += NG
        su_ptrs += NG
        xa_ptrs += BLOCK_K

    if SPLIT_K > 1:
        # Partial gate and up sums of this K slice; the SiLU kernel finishes h once all have landed.
        g_ptrs = part_ptr + pair[:, None] * (2 * I) + offs_n[None, :]
        tl.atomic_add(g_ptrs, acc_g, mask=rvalid[:, None], sem="relaxed")
        tl.atomic_add(g_ptrs + I, acc_u, mask=rvalid[:, None], sem="relaxed")
    else:
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        h_ptrs = h_ptr + pair[:, None] * stride_ht + offs_n[None, :]
        tl.store(h_ptrs, h.to(tl.bfloat16), mask=rvalid[:, None])


@triton.jit(do_not_specialize=["pairs"])
def _moe_a16wi4_silu_kernel(part_ptr, h_ptr, pairs, I, stride_ht, BLOCK: tl.constexpr):
    """h = SiLU(gate) * up from the split-K partials (pairs, 2*I), then re-zero them for the next call.

    Rows of padding pairs are never written by stage 1 and stay zero: SiLU(0) * 0 = 0 lands in h
    rows nobody reads.
    """
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < I
    g = tl.load(part_ptr + row * (2 * I) + offs, mask=ok, other=0.0)
    u = tl.load(part_ptr + row * (2 * I) + I + offs, mask=ok, other=0.0)
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(h_ptr + row * stride_ht + offs, h.to(tl.bfloat16), mask=ok)
    zero = tl.zeros((BLOCK,), dtype=tl.float32)
    tl.store(part_ptr + row * (2 * I) + offs, zero, mask=ok)
    tl.store(part_ptr + row * (2 * I) + I + offs, zero, mask=ok)


@triton.jit
def _moe_a16wi4_down_kernel(
    h_ptr, w_ptr, s_ptr, acc_ptr, tw_ptr,
    sorted_ptr, block_expert_ptr, valid_end_ptr, num_rows_ptr,
    I, stride_ht, stride_we, stride_wn, stride_se, stride_sn, stride_at,
    TOPK: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NG: tl.constexpr,
    SPLIT: tl.constexpr, SCALE_ACC: tl.constexpr, MAGIC: tl.constexpr = False,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_rows_ptr):
        return
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rvalid = rows < tl.load(valid_end_ptr + e)
    pair = tl.load(sorted_ptr + rows, mask=rvalid, other=0).to(tl.int64)

    KH: tl.constexpr = BLOCK_K // 2
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kh = tl.arange(0, KH)
    w_ptrs = w_ptr + e * stride_we + offs_n[:, None] * stride_wn + offs_kh[None, :]
    s_ptrs = s_ptr + e * stride_se + offs_n[:, None] * stride_sn + tl.arange(0, NG)[None, :]
    ha_ptrs = h_ptr + pair[:, None] * stride_ht + tl.arange(0, BLOCK_K)[None, :]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, I // BLOCK_K):
        b = tl.load(w_ptrs)
        if SCALE_ACC:
            s = tl.load(s_ptr + e * stride_se + offs_n * stride_sn + (kt * BLOCK_K) // GROUP)
        else:
            s = tl.load(s_ptrs)
        wl, wh = _int4_tile(b, s, BLOCK_N, KH, GROUP, SPLIT, SCALE_ACC, MAGIC)
        a = tl.load(ha_ptrs, mask=rvalid[:, None], other=0.0)
        if SPLIT:
            a_even, a_odd = tl.split(tl.reshape(a, (BLOCK_M, KH, 2)))
            if SCALE_ACC:
                p = tl.dot(a_even, tl.trans(wl))
                p = tl.dot(a_odd, tl.trans(wh), p)
                acc += p * s.to(tl.float32)[None, :]
            else:
                acc = tl.dot(a_even, tl.trans(wl), acc)
                acc = tl.dot(a_odd, tl.trans(wh), acc)
        else:
            if SCALE_ACC:
                acc += tl.dot(a, tl.trans(wl)) * s.to(tl.float32)[None, :]
            else:
                acc = tl.dot(a, tl.trans(wl), acc)
        w_ptrs += KH
        s_ptrs += NG
        ha_ptrs += BLOCK_K

    wt = tl.load(tw_ptr + pair, mask=rvalid, other=0.0)
    tok = pair // TOPK
    o_ptrs = acc_ptr + tok[:, None] * stride_at + offs_n[None, :]
    tl.atomic_add(o_ptrs, acc * wt[:, None], mask=rvalid[:, None], sem="relaxed")


@triton.jit(do_not_specialize=["n"])
def _moe_a16wi4_cast_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=ok).to(tl.bfloat16), mask=ok)


@dataclass(frozen=True)
class PackedExperts:
    """One expert weight stack after the caller's explicit packing step."""

    packed: torch.Tensor  # (E, rows, K/2) int8 bytes, two int4 per byte, low nibble = even k
    scale: torch.Tensor  # (E, rows, K/group) bf16
    group_size: int

    @property
    def k(self) -> int:
        return self.packed.shape[-1] * 2


def prepare_weights(w_q: torch.Tensor, w_scale: torch.Tensor) -> PackedExperts:
    """Pack int4-in-int8 expert weights two per byte (explicit, once per weight; never cached)."""
    if w_q.dim() != 3 or w_scale.dim() != 3:
        raise ValueError(f"expert weights must be (E, rows, K) with scales (E, rows, K/group); got {tuple(w_q.shape)}, {tuple(w_scale.shape)}")
    if w_q.dtype != torch.int8:
        raise TypeError(f"w_q must be int8 holding int4 values, got {w_q.dtype}")
    k, groups = w_q.shape[-1], w_scale.shape[-1]
    if groups < 1 or k % groups or w_scale.shape[:2] != w_q.shape[:2]:
        raise ValueError(f"w_scale {tuple(w_scale.shape)} does not match w_q {tuple(w_q.shape)} (need (E, rows, K/group))")
    packed = torch.empty(*w_q.shape[:2], k // 2, dtype=torch.int8, device=w_q.device)
    for e in range(w_q.shape[0]):  # one expert at a time: the int16 temporaries stay small
        packed[e] = packing.pack_int4(w_q[e]).view(torch.int8)
    return PackedExperts(packed, w_scale.to(torch.bfloat16).contiguous(), k // groups)


# Rows per expert r = tokens * topk / experts sets the regime: r <= 8 streams weights (every
# block is mostly padding), r > 64 is tensor-core work on dequantized tiles.
DEFAULT_DECODE = {
    "BLOCK_M": 16, "BLOCK_N1": 32, "BLOCK_K1": 256, "warps1": 4, "stages1": 4, "split1": True,
    "BLOCK_N2": 64, "BLOCK_K2": 256, "warps2": 4, "stages2": 4, "split2": True, "scale_acc": False,
}
DEFAULT_MID = {
    "BLOCK_M": 32, "BLOCK_N1": 64, "BLOCK_K1": 128, "warps1": 4, "stages1": 4, "split1": True,
    "BLOCK_N2": 64, "BLOCK_K2": 128, "warps2": 4, "stages2": 4, "split2": True, "scale_acc": False,
}
DEFAULT_PREFILL = {
    "BLOCK_M": 64, "BLOCK_N1": 64, "BLOCK_K1": 64, "warps1": 4, "stages1": 4, "split1": True,
    "BLOCK_N2": 128, "BLOCK_K2": 64, "warps2": 4, "stages2": 4, "split2": True, "scale_acc": False,
}
def _cfg(bm: int, s1: tuple, s2: tuple) -> dict:
    (n1, k1, w1, st1, sp1), (n2, k2, w2, st2, sp2) = s1, s2
    return {"BLOCK_M": bm, "BLOCK_N1": n1, "BLOCK_K1": k1, "warps1": w1, "stages1": st1, "split1": sp1,
            "BLOCK_N2": n2, "BLOCK_K2": k2, "warps2": w2, "stages2": st2, "split2": sp2, "scale_acc": False}


# Per-stage sweep winners on the H200 (benchmarks/bench_moe_a16wi4_sm90.py --sweep, model_dim 7168,
# top-8, group 32, commit f95b066; NOTES.md lists every candidate). inter_dim -> [(rows per expert
# r at which the entry was measured, config)]; a shape takes the entry of its regime whose r is
# nearest on a log scale (what the benchmark table used).
TUNED_GROUP = 32
TUNED: dict[int, list[tuple[float, dict]]] = {
    512: [  # measured at E=384
        (8 / 384, _cfg(16, (32, 256, 4, 4, True), (64, 128, 4, 4, True))),         # T=1: 45.3 + 26.5 us
        (64 * 8 / 384, _cfg(16, (64, 128, 4, 4, True), (128, 128, 4, 4, True))),   # T=64
        (256 * 8 / 384, _cfg(16, (64, 128, 4, 4, True), (128, 128, 4, 4, True))),  # T=256
        (1024 * 8 / 384, _cfg(32, (64, 128, 4, 4, True), (128, 128, 4, 4, False))),  # T=1024
        (4096 * 8 / 384, _cfg(128, (64, 64, 4, 4, True), (128, 64, 4, 4, True))),  # T=4096
    ],
    2048: [  # measured at E=64
        (8 / 64, _cfg(16, (64, 128, 4, 4, True), (64, 256, 4, 4, False))),         # T=1
        (64 * 8 / 64, _cfg(16, (64, 128, 4, 4, True), (128, 128, 4, 4, True))),    # T=64
        (256 * 8 / 64, _cfg(64, (64, 128, 4, 4, True), (128, 128, 4, 4, True))),   # T=256
        (1024 * 8 / 64, _cfg(128, (64, 64, 4, 4, True), (128, 64, 4, 4, True))),   # T=1024
        (4096 * 8 / 64, _cfg(128, (64, 64, 4, 4, True), (128, 64, 4, 4, True))),   # T=4096
    ],
}


def rows_per_expert(tokens: int, topk: int, experts: int) -> float:
    return tokens * topk / experts


def regime(r: float) -> str:
    return "decode" if r <= 8 else "mid" if r <= 64 else "prefill"


def pick_config(tokens: int, topk: int, experts: int, inter_dim: int, group_size: int) -> tuple[dict, bool]:
    """The config for a shape and whether it came from a measured entry (else a regime default)."""
    r = rows_per_expert(tokens, topk, experts)
    table = TUNED.get(inter_dim, []) if group_size == TUNED_GROUP else []  # measured at group 32 only
    same = [(abs(math.log(mr / r)), cfg) for mr, cfg in table if regime(mr) == regime(r)]
    if same:
        return dict(min(same, key=lambda x: x[0])[1]), True
    base = {"decode": DEFAULT_DECODE, "mid": DEFAULT_MID, "prefill": DEFAULT_PREFILL}[regime(r)]
    cfg = dict(base)
    for s in (1, 2):
        cfg[f"BLOCK_K{s}"] = max(cfg[f"BLOCK_K{s}"], group_size)
    return cfg, False


# int4 -> bf16 conversion: "i2f" sign-extending shifts and converts (the measured recipes), "magic"
# the exponent-pattern trick (module docstring).
INT4_CVT = {"i2f": False, "magic": True}


def split_k_steps(model_dim: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(BLOCK_K steps per split, splits actually launched): whole steps, no empty split."""
    steps = model_dim // block_k
    per = triton.cdiv(steps, min(split_k, steps))
    return per, triton.cdiv(steps, per)


def check_config(cfg: dict, model_dim: int, inter_dim: int, group_size: int) -> None:
    """Reject tile choices the kernels do not handle (they carry no K/N tail masks)."""
    problems = []
    for stage, n_dim, k_dim in ((1, inter_dim, model_dim), (2, model_dim, inter_dim)):
        bn, bk = cfg[f"BLOCK_N{stage}"], cfg[f"BLOCK_K{stage}"]
        if n_dim % bn:
            problems.append(f"BLOCK_N{stage}={bn} must divide {n_dim}")
        if k_dim % bk:
            problems.append(f"BLOCK_K{stage}={bk} must divide {k_dim}")
        if cfg.get("scale_acc") and group_size % bk:
            problems.append(f"scale_acc needs BLOCK_K{stage}={bk} to divide group_size={group_size}")
        if not cfg.get("scale_acc") and bk % group_size:
            problems.append(f"BLOCK_K{stage}={bk} must be a multiple of group_size={group_size}")
        if bk < 32:
            problems.append(f"BLOCK_K{stage}={bk} must be at least 32")
    if cfg["BLOCK_M"] < 16:
        problems.append("BLOCK_M must be at least 16")
    sk = cfg.get("split_k1", 1)
    if isinstance(sk, bool) or not isinstance(sk, int) or sk < 1:
        problems.append(f"split_k1 must be a positive int, got {sk!r}")
    elif sk > model_dim // cfg["BLOCK_K1"]:
        problems.append(f"split_k1={sk} exceeds the {model_dim // cfg['BLOCK_K1']} BLOCK_K1 steps of model_dim={model_dim}")
    if cfg.get("int4_cvt", "i2f") not in INT4_CVT:
        problems.append(f"int4_cvt must be one of {sorted(INT4_CVT)}, got {cfg.get('int4_cvt')!r}")
    if problems:
        raise ValueError("moe_a16wi4 config rejected: " + "; ".join(problems))


@dataclass
class Routing:
    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    valid_end: torch.Tensor
    num_rows: torch.Tensor
    max_blocks: int


def align_by_expert(topk_ids: torch.Tensor, experts: int, block_m: int) -> Routing:
    """Group (token, slot) pairs by expert in BLOCK_M-padded blocks, on the device, no host sync."""
    ids = topk_ids.reshape(-1)
    if ids.dtype != torch.int32:
        ids = ids.to(torch.int32)
    pairs = ids.numel()
    dev = ids.device
    # Every active expert wastes at most BLOCK_M - 1 rows, and at most min(E, P) are active.
    max_rows = pairs + min(experts, pairs) * (block_m - 1)
    max_blocks = triton.cdiv(max_rows, block_m)
    sorted_ids = torch.empty(max_blocks * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    meta = torch.empty(3 * experts + 1, dtype=torch.int32, device=dev)
    start, valid_end, cursor = meta[:experts], meta[experts:2 * experts], meta[2 * experts:3 * experts]
    num_rows = meta[3 * experts:]
    nbins = triton.next_power_of_2(experts + 1)
    _moe_a16wi4_align_kernel[(1,)](ids, start, valid_end, cursor, num_rows, pairs,
                                   E=experts, NBINS=nbins, BLOCK_M=block_m, CHUNK=1024, num_warps=4)
    _moe_a16wi4_scatter_kernel[(triton.cdiv(pairs, 1024),)](ids, sorted_ids, block_expert, start, cursor, pairs,
                                                            BLOCK_M=block_m, CHUNK=1024, num_warps=4)
    return Routing(sorted_ids, block_expert, valid_end, num_rows, max_blocks)


def split_workspace(tokens: int, topk: int, inter_dim: int, device) -> torch.Tensor:
    """The zeroed fp32 (pairs, 2*I) gate/up partials buffer of split-K stage 1 (the SiLU kernel re-zeroes it)."""
    return torch.zeros(tokens * topk, 2 * inter_dim, dtype=torch.float32, device=device)


def moe_a16wi4_stage1(x: torch.Tensor, w1: PackedExperts, routing: Routing, topk: int, cfg: dict,
                      zero: torch.Tensor | None = None, part: torch.Tensor | None = None) -> torch.Tensor:
    """h (tokens * topk, inter_dim) bf16 = SiLU(x W1_gate^T) * (x W1_up^T) for each routed pair.

    With ``cfg["split_k1"] > 1`` the K loop is split over a third grid axis and ``part`` (from
    :func:`split_workspace`, zero on entry, zero again on return) collects the partial sums.
    """
    t, d = x.shape
    inter = w1.packed.shape[1] // 2
    h = torch.empty(t * topk, inter, dtype=torch.bfloat16, device=x.device)
    per_split, splits = split_k_steps(d, cfg["BLOCK_K1"], cfg.get("split_k1", 1))
    if splits > 1:
        if part is None or tuple(part.shape) != (t * topk, 2 * inter) or part.dtype != torch.float32:
            raise ValueError(f"split_k1 needs a zeroed fp32 ({t * topk}, {2 * inter}) workspace (split_workspace)")
    else:
        part = torch.empty(1, dtype=torch.float32, device=x.device)  # unused; same pointer type
    grid = (routing.max_blocks, inter // cfg["BLOCK_N1"], splits)
    zero_numel = 0 if zero is None else zero.numel()
    if zero is None:  # same pointer type either way, so both uses share one compiled kernel
        zero = torch.empty(1, dtype=torch.float32, device=x.device)
    per_prog = triton.cdiv(zero_numel, grid[0] * grid[1] * grid[2]) if zero_numel else 0
    _moe_a16wi4_gate_up_kernel[grid](
        x, w1.packed, w1.scale, h, zero, part,
        routing.sorted_ids, routing.block_expert, routing.valid_end, routing.num_rows,
        d, inter, zero_numel, per_prog, per_split,
        x.stride(0), w1.packed.stride(0), w1.packed.stride(1), w1.scale.stride(0), w1.scale.stride(1), h.stride(0),
        TOPK=topk, GROUP=w1.group_size,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N1"], BLOCK_K=cfg["BLOCK_K1"],
        NG=max(cfg["BLOCK_K1"] // w1.group_size, 1),
        SPLIT=bool(cfg["split1"]), SCALE_ACC=bool(cfg["scale_acc"]),
        SPLIT_K=splits, MAGIC=INT4_CVT[cfg.get("int4_cvt", "i2f")],
        num_warps=cfg["warps1"], num_stages=cfg["stages1"],
    )
    if splits > 1:
        blk = min(1024, triton.next_power_of_2(inter))
        _moe_a16wi4_silu_kernel[(t * topk, triton.cdiv(inter, blk))](part, h, t * topk, inter, h.stride(0),
                                                                     BLOCK=blk, num_warps=4)
    return h


def moe_a16wi4_stage2(h: torch.Tensor, w2: PackedExperts, routing: Routing, topk_weights: torch.Tensor,
                      acc: torch.Tensor, cfg: dict) -> torch.Tensor:
    """acc (tokens, model_dim) fp32 += sum over slots of weight * (h @ W2^T); acc must start at zero."""
    inter = h.shape[1]
    d = w2.packed.shape[1]
    grid = (routing.max_blocks, d // cfg["BLOCK_N2"])
    _moe_a16wi4_down_kernel[grid](
        h, w2.packed, w2.scale, acc, topk_weights.reshape(-1),
        routing.sorted_ids, routing.block_expert, routing.valid_end, routing.num_rows,
        inter, h.stride(0), w2.packed.stride(0), w2.packed.stride(1), w2.scale.stride(0), w2.scale.stride(1), acc.stride(0),
        TOPK=topk_weights.shape[1], GROUP=w2.group_size,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N2"], BLOCK_K=cfg["BLOCK_K2"],
        NG=max(cfg["BLOCK_K2"] // w2.group_size, 1),
        SPLIT=bool(cfg["split2"]), SCALE_ACC=bool(cfg["scale_acc"]), MAGIC=INT4_CVT[cfg.get("int4_cvt", "i2f")],
        num_warps=cfg["warps2"], num_stages=cfg["stages2"],
    )
    return acc


def moe_a16wi4(
    x: torch.Tensor,
    w1: PackedExperts,
    w2: PackedExperts,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    out: torch.Tensor | None = None,
    config: dict | None = None,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """The full layer: (tokens, model_dim) bf16 = sum_j w_tj * FFN_{e_tj}(x_t), int4 expert weights.

    ``workspace``: the split-K stage-1 buffer (:func:`split_workspace`) when ``split_k1`` > 1;
    allocated here (one extra fill launch) when the caller passes none.
    """
    t, d = x.shape
    experts, two_i, k1 = w1.packed.shape
    inter = two_i // 2
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x must be bf16, got {x.dtype}")
    if w1.k != d or w2.packed.shape[1] != d or w2.k != inter or w2.packed.shape[0] != experts:
        raise ValueError(
            f"weight shapes do not fit x (tokens={t}, model_dim={d}): w1 packed {tuple(w1.packed.shape)}, "
            f"w2 packed {tuple(w2.packed.shape)} (expected (E, 2*I, D/2) and (E, D, I/2))"
        )
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != t:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must both be (tokens, topk)")
    if w1.group_size != w2.group_size:
        raise ValueError(f"w1 and w2 group sizes differ ({w1.group_size} vs {w2.group_size})")
    topk = topk_ids.shape[1]
    cfg = dict(config) if config else pick_config(t, topk, experts, inter, w1.group_size)[0]
    check_config(cfg, d, inter, w1.group_size)
    x = x.contiguous()
    routing = align_by_expert(topk_ids, experts, cfg["BLOCK_M"])
    acc = torch.empty(t, d, dtype=torch.float32, device=x.device)
    if cfg.get("split_k1", 1) > 1 and workspace is None:
        workspace = split_workspace(t, topk, inter, x.device)
    h = moe_a16wi4_stage1(x, w1, routing, topk, cfg, zero=acc, part=workspace)
    moe_a16wi4_stage2(h, w2, routing, topk_weights.to(torch.float32).contiguous(), acc, cfg)
    if out is None:
        out = torch.empty(t, d, dtype=torch.bfloat16, device=x.device)
    n = acc.numel()
    _moe_a16wi4_cast_kernel[(triton.cdiv(n, 2048),)](acc, out, n, BLOCK=2048, num_warps=4)
    return out


def build(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Builder (kernels/protocol.py): int4 packing in ``prepare`` (untimed), five launches in ``run``."""
    t, d, i, e, k, g = (int(shape[key]) for key in ("tokens", "model_dim", "inter_dim", "experts", "topk", "group_size"))
    cfg, tuned = pick_config(t, k, e, i, g)
    if config:
        cfg.update(config)
        tuned = True
    check_config(cfg, d, i, g)

    splits = split_k_steps(d, cfg["BLOCK_K1"], cfg.get("split_k1", 1))[1]

    def prepare(inputs: dict) -> dict:
        return {
            "x": inputs["x"],
            "w1": prepare_weights(inputs["w1_q"], inputs["w1_scale"]),
            "w2": prepare_weights(inputs["w2_q"], inputs["w2_scale"]),
            "topk_ids": inputs["topk_ids"],
            "topk_weights": inputs["topk_weights"],
            # one split-K workspace per prepared input set (sets are timed interleaved)
            "ws": split_workspace(t, k, i, inputs["x"].device) if splits > 1 else None,
        }

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        return moe_a16wi4(p["x"], p["w1"], p["w2"], p["topk_ids"], p["topk_weights"], out=out, config=cfg,
                          workspace=p["ws"])

    return KernelLaunch(
        name="triton_sm90_moe_a16wi4",
        run=run,
        prepare=prepare,
        expect_kernels=EXPECT_KERNELS,
        describe={"backend": "triton", "config": cfg, "tuned": tuned, "launches": 6 if splits > 1 else 5},
    )


def compile_only(shape: dict, config: dict | None = None, arch: str = "sm_90a") -> dict:
    """Compile the two GEMM kernels ``build(shape, config)`` would launch for ``arch`` (no GPU) and
    return their static facts (kernels/protocol.py); the routing, SiLU and cast kernels are not GEMMs
    and are left out."""
    from skillrun_kernels._triton.compile import compile_facts

    t, d, i, e, k, g = (int(shape[key]) for key in ("tokens", "model_dim", "inter_dim", "experts", "topk", "group_size"))
    cfg = pick_config(t, k, e, i, g)[0]
    cfg.update(config or {})
    check_config(cfg, d, i, g)
    splits = split_k_steps(d, cfg["BLOCK_K1"], cfg.get("split_k1", 1))[1]
    ptrs = {"x_ptr": "*bf16", "w_ptr": "*i8", "s_ptr": "*bf16", "h_ptr": "*bf16", "zero_ptr": "*fp32", "part_ptr": "*fp32",
            "acc_ptr": "*fp32", "tw_ptr": "*fp32", "sorted_ptr": "*i32", "block_expert_ptr": "*i32", "valid_end_ptr": "*i32",
            "num_rows_ptr": "*i32"}
    # zero_numel and zero_per_prog are 64-bit (do_not_specialize: never marked divisible)
    s1_types = {**{a: ptrs[a] for a in ("x_ptr", "w_ptr", "s_ptr", "h_ptr", "zero_ptr", "part_ptr", "sorted_ptr",
                                        "block_expert_ptr", "valid_end_ptr", "num_rows_ptr")},
                "zero_numel": "i64", "zero_per_prog": "i64"}
    s2_types = {a: ptrs[a] for a in ("h_ptr", "w_ptr", "s_ptr", "acc_ptr", "tw_ptr", "sorted_ptr", "block_expert_ptr",
                                     "valid_end_ptr", "num_rows_ptr")}
    # contiguous operands: packed int4 weights (E, 2I, D/2) and (E, D, I/2), scales (E, rows, K/group)
    s1_vals = {"D": d, "I": i, "stride_xt": d, "stride_we": 2 * i * d // 2, "stride_wn": d // 2,
               "stride_se": 2 * i * (d // g), "stride_sn": d // g, "stride_ht": i}
    s2_vals = {"I": i, "stride_ht": i, "stride_we": d * i // 2, "stride_wn": i // 2, "stride_se": d * (i // g),
               "stride_sn": i // g, "stride_at": d}
    magic = INT4_CVT[cfg.get("int4_cvt", "i2f")]
    kernels = []
    for fn, types, vals, n, bk, split, warps, stages, extra in (
        (_moe_a16wi4_gate_up_kernel, s1_types, s1_vals, "N1", "K1", "split1", "warps1", "stages1", {"SPLIT_K": splits}),
        (_moe_a16wi4_down_kernel, s2_types, s2_vals, "N2", "K2", "split2", "warps2", "stages2", {}),
    ):
        consts = {"TOPK": k, "GROUP": g, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg[f"BLOCK_{n}"], "BLOCK_K": cfg[f"BLOCK_{bk}"],
                  "NG": max(cfg[f"BLOCK_{bk}"] // g, 1), "SPLIT": bool(cfg[split]), "SCALE_ACC": bool(cfg["scale_acc"]),
                  "MAGIC": magic, **extra}
        kernels.append(compile_facts(fn, types=types, constexprs=consts, divisible=[a for a in types if a in ptrs],
                                     values=vals, num_warps=cfg[warps], num_stages=cfg[stages], arch=arch))
    return {"arch": arch, "config": cfg, "kernels": kernels}
