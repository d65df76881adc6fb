"""Decode variants of the a16wi4 MoE layer on sm_90 (issue 41): levers toward the memory roof.

At 1-64 tokens the layer's time should be the int4 weights of the touched experts streamed once
(traffic.py models those bytes). The measured port (``triton_sm90``, 701 us at 16 tokens, E64,
I2048, group 128: 42.8 % of the copy roof) is issue-bound, not bandwidth-bound (NOTES.md). This
module keeps that kernel untouched (its H200 artifacts name its bytes) and carries the levers as
config knobs of new kernels, each off unless a config turns it on, so `skill-run tune` can time
each one against the incumbent recipe:

- ``wide_load``: the packed weights read as int32 words (8 nibbles, k = 8j + i at bits 4i) instead
  of bytes; unpacked with one broadcast shift, the magic bf16 trick (nibble ^ 8 OR-ed into 128.0's
  mantissa, minus 136) and a reshape into natural k order, so the activations are never split into
  even/odd halves. ``int4_cvt: lop3`` reads the same words (whatever wide_load says), repacked once,
  and converts each with inline PTX instead: one XOR, then per
  two weights one LOP3 (mask two nibbles, OR in bf16 128.0) and one bf16x2 FMA (minus 136), about
  1.6 instructions per weight where the magic path spends several per weight on int16 lanes.
- ``swap_ab``: the MMA computes W . X^T: the weight tile's BLOCK_N rows fill the MMA's M side (64
  rows with 4 warps: wgmma, the dequantized weights as the register operand) and the 16 padded
  token rows its N side, instead of 16 token rows on mma.sync with the weights as the B operand.
- ``scale_acc``: where one group spans a whole K step (group 128, BLOCK_K <= 128) the exact int4
  values go into the MMA and the scale multiplies the fp32 partial, once per row per K step: no
  bf16 multiply per weight and no group broadcast in registers. ``bias_acc`` (with scale_acc) goes
  one step further: the codes enter the MMA as s + 136 (no subtraction per weight) and 136 x the
  activation row sum comes off the partial.
- ``split_k1`` (> 1): stage 1's K loop split over more programs so that at 1 token every SM streams
  (8 experts x I/BLOCK_N1 tiles is fewer programs than SMs at I=512). Partials are plain stores into
  a (splits, pairs, 2I) fp32 workspace and ``_moe_a16wi4d_splitk_silu_kernel`` sums them in a fixed
  order: no atomics, no zeroing (the split-K of ``triton_sm90``, which used fp32 atomics, failed
  the oracle on the H200 for a reason not found; this one shares none of that code).
- ``persistent`` + ``ctas_per_sm``: a grid of SMs x ctas_per_sm programs looping over the live
  (expert block, N tile, K split) items read from the device routing, instead of a grid bounded by
  the host's worst case whose surplus programs exit at once.
- ``tile_order``: ``expert_major`` (the N tiles of one expert block are consecutive items) or
  ``n_major`` (one N tile across all expert blocks first): which rows are streamed side by side.
- ``route``: ``two`` (the incumbent's histogram + scatter launches) or ``one`` (one program: the
  histogram, the prefix sum and each pair's rank among its expert's pairs from a P x P comparison,
  where P = tokens x topk <= 256; above that the two launches): one launch fewer.
- ``down``: ``atomic`` (expert blocks, fp32 atomic top-k sum, then a cast launch) or ``token`` (one
  program per (token, N2 tile) loops over the token's top-k experts on the CUDA cores and writes
  bf16 at once: no accumulator, no zeroing, no cast launch; each expert's W2 rows are re-read by
  every token routed to it, so it suits tokens x topk close to the active experts, e.g. 1 token).
- ``fuse_down``: gate/up, SiLU and the down projection in one launch: each (expert block, N1 tile)
  program multiplies its own h tile (bf16, as the two-stage path rounds it) by W2's matching
  BLOCK_N1 columns and adds its share into the fp32 accumulator atomically (the down GEMM split
  over K = inter_dim by tile). No h round trip, no second GEMM launch (the accumulator is zeroed by
  a small launch before it instead of by stage 1); D x rows atomics per program.

Every variant computes the layer the oracle defines (problem.py); tests/test_moe_a16wi4_decode_cpu.py
runs each in Triton's interpreter against the fp32 oracle. Nothing here is measured yet.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from skillrun_kernels.protocol import KernelLaunch

from skillrun_kernels._moe.triton_decode import (ROUTING_TYPES, acc_tile, add_rows, cast_bf16, choice_problems,
                                                 describe, device_sms, expert_items, fp32_buffer, grid_constexprs,
                                                 grid_size, item_range, item_rows, kernel_facts, launch_cast,
                                                 launch_zero, launches, layout_levers, route, route_one, silu_mul,
                                                 split_k_steps, store_partials, tile_index, zero_fill, zero_share)

from .triton_sm90 import PackedExperts, prepare_weights

KERNEL_PREFIX = "_moe_a16wi4d_"
# The incumbent's two routing kernels serve route "two".
EXPECT_KERNELS = (r"^(_moe_a16wi4d_(gate_up|fused|splitk_silu|down|down_token|zero|cast)_kernel"
                  r"|_moe_route_one_kernel|_moe_a16wi4_(align|scatter)_kernel)$")


# --------------------------------------------------------------------------------------------- int4 tiles


@triton.jit
def _magic_bf16(nib, BIASED: tl.constexpr):
    # nib: integer lanes whose low 4 bits hold a two's-complement int4 (upper bits ignored).
    # (nib ^ 8) & 15 = s + 8 in 0..15, OR-ed into bf16 128.0's mantissa: s + 136 exactly; minus 136
    # unless BIASED (bias_acc: the 136 comes off the fp32 partial instead, once per row and K step).
    bits = (((nib ^ 8) & 15) | 0x4300).to(tl.int16)
    v = bits.to(tl.bfloat16, bitcast=True)
    if BIASED:
        return v
    else:
        return v - 136.0


# The lop3 conversion (int4_cvt "lop3", Marlin's idea in Triton): the weights are repacked once in
# prepare (:func:`pack_lop3`) so that nibble j of each int32 word holds code 2j and nibble j + 4 code
# 2j + 1 of its 8 consecutive k. Per word one XOR turns the two's-complement codes into offset binary
# (s + 8); for each shift 0/4/8/12 one LOP3 keeps the nibbles at bits 0 and 16 and ORs bf16 128.0
# (0x4300) into both halves (immLut 0xEA = (a & b) | c) and one bf16x2 FMA subtracts 136 from both:
# the result is the bf16 pair (k 2j, k 2j + 1), the register pair the MMA reads, about 1.6
# instructions per weight. PTX only: Triton's CPU interpreter cannot run it (the tests check the
# same bit arithmetic with a numpy model; the GPU run checks the kernel against the fp32 oracle).
_LOP3_ASM = tl.constexpr("""{
.reg .b32 q, t, r, one, bias;
mov.b32 one, 0x3F803F80;
mov.b32 bias, 0xC308C308;
xor.b32 q, $8, 0x88888888;
lop3.b32 r, q, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 r, r, one, bias;
mov.b32 {$0, $1}, r;
shr.u32 t, q, 4;
lop3.b32 r, t, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 r, r, one, bias;
mov.b32 {$2, $3}, r;
shr.u32 t, q, 8;
lop3.b32 r, t, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 r, r, one, bias;
mov.b32 {$4, $5}, r;
shr.u32 t, q, 12;
lop3.b32 r, t, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 r, r, one, bias;
mov.b32 {$6, $7}, r;
}""")
# bias_acc: the same without the FMAs: each half holds s + 136 (exact in bf16), the 136 is taken off the
# fp32 partial (136 x the activation row sum) once per row and K step.
_LOP3_ASM_BIASED = tl.constexpr("""{
.reg .b32 q, t;
xor.b32 q, $8, 0x88888888;
lop3.b32 t, q, 0x000F000F, 0x43004300, 0xEA;
mov.b32 {$0, $1}, t;
shr.u32 q, q, 4;
lop3.b32 t, q, 0x000F000F, 0x43004300, 0xEA;
mov.b32 {$2, $3}, t;
shr.u32 q, q, 4;
lop3.b32 t, q, 0x000F000F, 0x43004300, 0xEA;
mov.b32 {$4, $5}, t;
shr.u32 q, q, 4;
lop3.b32 t, q, 0x000F000F, 0x43004300, 0xEA;
mov.b32 {$6, $7}, t;
}""")
LOP3_NIBBLE_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # code (k mod 8) stored at nibble position i of a word


def pack_lop3(w_q: torch.Tensor) -> torch.Tensor:
    """int4 codes (E, N, K) in int8 -> int32 words (E, N, K/8) in the lop3 order (LOP3_NIBBLE_ORDER).
    One expert at a time so the temporaries stay small; K must be a multiple of 8."""
    from . import packing

    e, n, k = w_q.shape
    if k % 8:
        raise ValueError(f"the lop3 packing needs K % 8 == 0, got K={k}")
    order = torch.tensor(LOP3_NIBBLE_ORDER, device=w_q.device)
    out = torch.empty(e, n, k // 2, dtype=torch.int8, device=w_q.device)
    for i in range(e):
        q = w_q[i].reshape(n, k // 8, 8).index_select(2, order).reshape(n, k)
        out[i] = packing.pack_int4(q).view(torch.int8)
    return out.view(torch.int32)


@triton.jit
def _lop3_codes(words, BIASED: tl.constexpr):
    """int32 words in the lop3 order -> (.., 8) bf16: the 8 codes of each word in natural k order
    (each + 136 when BIASED)."""
    k0, k1, k2, k3, k4, k5, k6, k7 = tl.inline_asm_elementwise(
        _LOP3_ASM_BIASED if BIASED else _LOP3_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r", [words],
        dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16),
        is_pure=True, pack=1)
    # a join adds a last axis of 2; nested this way the flat index of kN is N (outermost join = bit 0)
    return tl.join(tl.join(tl.join(k0, k4), tl.join(k2, k6)), tl.join(tl.join(k1, k5), tl.join(k3, k7)))


@triton.jit
def _int4_rows(w_ptr, row_off, col0, BN: tl.constexpr, BK: tl.constexpr, WIDE: tl.constexpr,
               BIASED: tl.constexpr = False):
    """A (BN, BK) tile of int4 codes as exact bf16 in natural k order.

    ``row_off`` (BN,) element offsets of the rows, ``col0`` the first k. WIDE 0: bytes (low nibble
    = even k) converted by the magic trick and joined back; 1: int32 words (8 codes each, code i of
    word j at bits 4i = k 8j + i), one broadcast shift and the magic trick; 2: int32 words in the
    lop3 order (pack_lop3) through the lop3 PTX conversion. BIASED: every value + 136 (bias_acc).
    """
    if WIDE == 0:
        KH: tl.constexpr = BK // 2
        b = tl.load(w_ptr + row_off[:, None] + (col0 // 2 + tl.arange(0, KH))[None, :]).to(tl.int16)
        return tl.reshape(tl.join(_magic_bf16(b, BIASED), _magic_bf16(b >> 4, BIASED)), (BN, BK))
    else:
        KW: tl.constexpr = BK // 8
        words = tl.load(w_ptr + row_off[:, None] + (col0 // 8 + tl.arange(0, KW))[None, :])
        if WIDE == 2:
            return tl.reshape(_lop3_codes(words, BIASED), (BN, BK))
        else:
            shifts = tl.arange(0, 8) * 4
            nib = words[:, :, None] >> shifts[None, None, :]
            return tl.reshape(_magic_bf16(nib, BIASED), (BN, BK))


@triton.jit
def _group_scales(s_ptr, srow_off, col0, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                  SCALE_ACC: tl.constexpr):
    """SCALE_ACC: the (BN,) fp32 scales of the one group spanning this K step. Else the (BN, BK)
    bf16 scales, each group's scale repeated over its columns."""
    if SCALE_ACC:
        return tl.load(s_ptr + srow_off + col0 // GROUP).to(tl.float32)
    else:
        NG: tl.constexpr = BK // GROUP
        s = tl.load(s_ptr + srow_off[:, None] + (col0 // GROUP + tl.arange(0, NG))[None, :])
        return tl.reshape(tl.broadcast_to(s[:, :, None], (BN, NG, GROUP)), (BN, BK))


@triton.jit
def _mma_step(acc, w, s, a, SWAP: tl.constexpr, SCALE_ACC: tl.constexpr, BIASED: tl.constexpr = False):
    """acc += (w scaled) against the activation tile a (BM, BK): acc is (BN, BM) when SWAP, else (BM, BN).
    BIASED (with SCALE_ACC): w holds code + 136; the partial loses 136 x the row sum of a."""
    if SCALE_ACC:
        if SWAP:
            p = tl.dot(w, tl.trans(a))
            if BIASED:
                p -= 136.0 * tl.sum(a.to(tl.float32), axis=1)[None, :]
            acc += p * s[:, None]
        else:
            p = tl.dot(a, tl.trans(w))
            if BIASED:
                p -= 136.0 * tl.sum(a.to(tl.float32), axis=1)[:, None]
            acc += p * s[None, :]
    else:
        w = w * s
        if SWAP:
            acc = tl.dot(w, tl.trans(a), acc)
        else:
            acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.jit
def _gate_up_tile(x_ptr, w_ptr, s_ptr, e, tok, rvalid, offs_n, k_first, k_last, I,
                  stride_xt, stride_we, stride_wn, stride_se, stride_sn,
                  GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  WIDE: tl.constexpr, SWAP: tl.constexpr, SCALE_ACC: tl.constexpr, BIASED: tl.constexpr):
    """The gate and up fp32 accumulators of one (expert block, N tile) over K steps [k_first, k_last)."""
    acc_g = acc_tile(BLOCK_M, BLOCK_N, SWAP)
    acc_u = acc_tile(BLOCK_M, BLOCK_N, SWAP)
    wg_off = e * stride_we + offs_n.to(tl.int64) * stride_wn
    wu_off = wg_off + I * stride_wn
    sg_off = e * stride_se + offs_n.to(tl.int64) * stride_sn
    su_off = sg_off + I * stride_sn
    x_off = tok * stride_xt
    for kt in range(k_first, k_last):
        k0 = kt * BLOCK_K
        gq = _int4_rows(w_ptr, wg_off, k0, BLOCK_N, BLOCK_K, WIDE, BIASED)
        uq = _int4_rows(w_ptr, wu_off, k0, BLOCK_N, BLOCK_K, WIDE, BIASED)
        sg = _group_scales(s_ptr, sg_off, k0, BLOCK_N, BLOCK_K, GROUP, SCALE_ACC)
        su = _group_scales(s_ptr, su_off, k0, BLOCK_N, BLOCK_K, GROUP, SCALE_ACC)
        a = tl.load(x_ptr + x_off[:, None] + (k0 + tl.arange(0, BLOCK_K))[None, :], mask=rvalid[:, None], other=0.0)
        acc_g = _mma_step(acc_g, gq, sg, a, SWAP, SCALE_ACC, BIASED)
        acc_u = _mma_step(acc_u, uq, su, a, SWAP, SCALE_ACC, BIASED)
    return acc_g, acc_u


# --------------------------------------------------------------------------------------------- stage 1


@triton.jit(do_not_specialize=["zero_numel", "zero_per_prog", "k_per_split"])
def _moe_a16wi4d_gate_up_kernel(
    x_ptr, w_ptr, s_ptr, h_ptr, part_ptr, zero_ptr,
    sorted_ptr, block_expert_ptr, valid_end_ptr, num_rows_ptr,
    D, I, zero_numel, zero_per_prog, k_per_split,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_ht, stride_ps,
    TOPK: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    WIDE: tl.constexpr, SWAP: tl.constexpr, SCALE_ACC: tl.constexpr, SPLIT_K: tl.constexpr,
    PERSISTENT: tl.constexpr, N_MAJOR: tl.constexpr, BIASED: tl.constexpr = False,
):
    zero_share(zero_ptr, zero_numel, zero_per_prog)
    blocks, n_tiles, n_items = expert_items(num_rows_ptr, I, BLOCK_N, SPLIT_K, BLOCK_M)
    k_steps = D // BLOCK_K
    first, last, step = item_range(n_items, PERSISTENT)
    for it in range(first, last, step):
        item = it if PERSISTENT else tl.program_id(0)
        if item < n_items:
            e, rvalid, pair, n, s = item_rows(item, n_tiles, blocks, sorted_ptr, block_expert_ptr, valid_end_ptr,
                                              BLOCK_M, SPLIT_K, N_MAJOR)
            offs_n = n * BLOCK_N + tl.arange(0, BLOCK_N)
            k_first = s * k_per_split
            k_last = tl.minimum(k_first + k_per_split, k_steps)
            acc_g, acc_u = _gate_up_tile(x_ptr, w_ptr, s_ptr, e, pair // TOPK, rvalid, offs_n, k_first, k_last, I,
                                         stride_xt, stride_we, stride_wn, stride_se, stride_sn,
                                         GROUP, BLOCK_M, BLOCK_N, BLOCK_K, WIDE, SWAP, SCALE_ACC, BIASED)
            cols, prow, pmask = tile_index(offs_n, pair, rvalid, SWAP)
            if SPLIT_K > 1:
                # partial sums of this K slice, summed in a fixed order by the SiLU kernel
                store_partials(part_ptr, s, stride_ps, prow, cols, pmask, I, acc_g, acc_u)
            else:
                h = silu_mul(acc_g, acc_u)
                tl.store(h_ptr + prow * stride_ht + cols, h.to(tl.bfloat16), mask=pmask)


@triton.jit(do_not_specialize=["pairs"])
def _moe_a16wi4d_splitk_silu_kernel(part_ptr, h_ptr, pairs, I, stride_ht, stride_ps,
                                    SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """h = SiLU(gate) * up from the split-K partials (splits, pairs, 2I), summed in split order."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < I
    g = tl.zeros((BLOCK,), dtype=tl.float32)
    u = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):
        base = part_ptr + s * stride_ps + row * (2 * I) + offs
        g += tl.load(base, mask=ok, other=0.0)
        u += tl.load(base + I, mask=ok, other=0.0)
    h = silu_mul(g, u)
    tl.store(h_ptr + row * stride_ht + offs, h.to(tl.bfloat16), mask=ok)


# --------------------------------------------------------------------------------------------- stage 2


@triton.jit
def _moe_a16wi4d_down_kernel(
    h_ptr, w_ptr, s_ptr, acc_ptr, tw_ptr,
    sorted_ptr, block_expert_ptr, valid_end_ptr, num_rows_ptr,
    D, I, stride_ht, stride_we, stride_wn, stride_se, stride_sn, stride_at,
    TOPK: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    WIDE: tl.constexpr, SWAP: tl.constexpr, SCALE_ACC: tl.constexpr, PERSISTENT: tl.constexpr, N_MAJOR: tl.constexpr,
    BIASED: tl.constexpr = False,
):
    blocks, n_tiles, n_items = expert_items(num_rows_ptr, D, BLOCK_N, 1, BLOCK_M)
    first, last, step = item_range(n_items, PERSISTENT)
    for it in range(first, last, step):
        item = it if PERSISTENT else tl.program_id(0)
        if item < n_items:
            e, rvalid, pair, n, _s = item_rows(item, n_tiles, blocks, sorted_ptr, block_expert_ptr, valid_end_ptr,
                                               BLOCK_M, 1, N_MAJOR)
            offs_n = n * BLOCK_N + tl.arange(0, BLOCK_N)
            w_off = e * stride_we + offs_n.to(tl.int64) * stride_wn
            s_off = e * stride_se + offs_n.to(tl.int64) * stride_sn
            acc = acc_tile(BLOCK_M, BLOCK_N, SWAP)
            for kt in range(0, I // BLOCK_K):
                k0 = kt * BLOCK_K
                w = _int4_rows(w_ptr, w_off, k0, BLOCK_N, BLOCK_K, WIDE, BIASED)
                sc = _group_scales(s_ptr, s_off, k0, BLOCK_N, BLOCK_K, GROUP, SCALE_ACC)
                a = tl.load(h_ptr + pair[:, None] * stride_ht + (k0 + tl.arange(0, BLOCK_K))[None, :],
                            mask=rvalid[:, None], other=0.0)
                acc = _mma_step(acc, w, sc, a, SWAP, SCALE_ACC, BIASED)
            wt = tl.load(tw_ptr + pair, mask=rvalid, other=0.0)
            add_rows(acc_ptr, stride_at, pair // TOPK, offs_n, acc, wt, rvalid, SWAP)


@triton.jit
def _moe_a16wi4d_down_token_kernel(
    h_ptr, w_ptr, s_ptr, out_ptr, ids_ptr, tw_ptr,
    D, I, stride_ht, stride_we, stride_wn, stride_se, stride_sn, stride_ot,
    TOPK: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    WIDE: tl.constexpr, SCALE_ACC: tl.constexpr,
):
    """out[t, n tile] = sum_j w_tj * (h[t, j] . W2[e_tj][n tile]^T) on the CUDA cores, bf16 out:
    one program per (token, N tile), no accumulator buffer, no atomics, no cast launch."""
    t = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    out = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(TOPK):
        pair = t * TOPK + j
        e = tl.load(ids_ptr + pair).to(tl.int64)
        w_off = e * stride_we + offs_n.to(tl.int64) * stride_wn
        s_off = e * stride_se + offs_n.to(tl.int64) * stride_sn
        y = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for kt in range(0, I // BLOCK_K):
            k0 = kt * BLOCK_K
            w = _int4_rows(w_ptr, w_off, k0, BLOCK_N, BLOCK_K, WIDE)
            sc = _group_scales(s_ptr, s_off, k0, BLOCK_N, BLOCK_K, GROUP, SCALE_ACC)
            hv = tl.load(h_ptr + pair * stride_ht + k0 + tl.arange(0, BLOCK_K)).to(tl.float32)
            if SCALE_ACC:
                y += tl.sum(w.to(tl.float32) * hv[None, :], axis=1) * sc
            else:
                y += tl.sum((w * sc).to(tl.float32) * hv[None, :], axis=1)
        out += y * tl.load(tw_ptr + pair)
    tl.store(out_ptr + t * stride_ot + offs_n, out.to(tl.bfloat16))


# --------------------------------------------------------------------------------------------- fused


@triton.jit
def _moe_a16wi4d_fused_kernel(
    x_ptr, w1_ptr, s1_ptr, w2_ptr, s2_ptr, acc_ptr, tw_ptr,
    sorted_ptr, block_expert_ptr, valid_end_ptr, num_rows_ptr,
    D, I,
    stride_xt, stride_w1e, stride_w1n, stride_s1e, stride_s1n,
    stride_w2e, stride_w2n, stride_s2e, stride_s2n, stride_at,
    TOPK: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_K1: tl.constexpr,
    BLOCK_N2: tl.constexpr, WIDE: tl.constexpr, SWAP: tl.constexpr, SCALE_ACC: tl.constexpr, SCALE_ACC2: tl.constexpr,
    PERSISTENT: tl.constexpr, N_MAJOR: tl.constexpr, BIASED: tl.constexpr = False,
):
    """Gate/up + SiLU + down for one (expert block, N1 tile): h tile kept in registers (rounded to
    bf16 as the two-stage path stores it), times W2[:, N1 tile] over all of D, added atomically
    into acc (zeroed by ``_moe_a16wi4d_zero_kernel`` before this launch)."""
    blocks, n_tiles, n_items = expert_items(num_rows_ptr, I, BLOCK_N1, 1, BLOCK_M)
    first, last, step = item_range(n_items, PERSISTENT)
    for it in range(first, last, step):
        item = it if PERSISTENT else tl.program_id(0)
        if item < n_items:
            e, rvalid, pair, n, _s = item_rows(item, n_tiles, blocks, sorted_ptr, block_expert_ptr, valid_end_ptr,
                                               BLOCK_M, 1, N_MAJOR)
            offs_n = n * BLOCK_N1 + tl.arange(0, BLOCK_N1)
            acc_g, acc_u = _gate_up_tile(x_ptr, w1_ptr, s1_ptr, e, pair // TOPK, rvalid, offs_n, 0, D // BLOCK_K1, I,
                                         stride_xt, stride_w1e, stride_w1n, stride_s1e, stride_s1n,
                                         GROUP, BLOCK_M, BLOCK_N1, BLOCK_K1, WIDE, SWAP, SCALE_ACC, BIASED)
            h = silu_mul(acc_g, acc_u).to(tl.bfloat16)  # (BN1, BM) when SWAP
            wt = tl.load(tw_ptr + pair, mask=rvalid, other=0.0)
            tok = pair // TOPK
            k0 = n * BLOCK_N1  # this tile's slice of the down GEMM's K (= inter_dim)
            for d0 in range(0, D, BLOCK_N2):
                offs_d = d0 + tl.arange(0, BLOCK_N2)
                w_off = e * stride_w2e + offs_d.to(tl.int64) * stride_w2n
                w = _int4_rows(w2_ptr, w_off, k0, BLOCK_N2, BLOCK_N1, WIDE)
                sc = _group_scales(s2_ptr, e * stride_s2e + offs_d.to(tl.int64) * stride_s2n, k0, BLOCK_N2, BLOCK_N1,
                                   GROUP, SCALE_ACC2)
                y = _mma_step(acc_tile(BLOCK_M, BLOCK_N2, SWAP), w, sc, tl.trans(h) if SWAP else h, SWAP, SCALE_ACC2)
                add_rows(acc_ptr, stride_at, tok, offs_d, y, wt, rvalid, SWAP)


# the family's names for the shared zero and cast kernels (EXPECT_KERNELS)
@triton.jit(do_not_specialize=["n"])
def _moe_a16wi4d_zero_kernel(dst_ptr, n, BLOCK: tl.constexpr):
    zero_fill(dst_ptr, n, BLOCK)


@triton.jit(do_not_specialize=["n"])
def _moe_a16wi4d_cast_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    cast_bf16(src_ptr, dst_ptr, n, BLOCK)


# --------------------------------------------------------------------------------------------- configs
# A starting point per lever (every knob at the incumbent's value unless named): the decode recipe
# tiles of the card (BLOCK_M 16, stage 1 64x128, stage 2 128x128, 4 warps, 4 stages).
BASE = {
    "BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_K1": 128, "warps1": 4, "stages1": 4,
    "BLOCK_N2": 128, "BLOCK_K2": 128, "warps2": 4, "stages2": 4,
    "wide_load": False, "swap_ab": False, "scale_acc": False, "split_k1": 1, "persistent": False,
    "ctas_per_sm": 4, "tile_order": "expert_major", "route": "two", "down": "atomic", "fuse_down": False,
    "int4_cvt": "magic", "bias_acc": False,
}
# One lever at a time (ablation candidates; compile facts: compile_sm90_decode.json), then the
# levers that cut the hot loop's instructions together ("lean": lop3 words, scales on the accumulator,
# swap-AB; 0.088 warp-instructions per weight against the base's 0.175 at 16 tokens, E64, I2048,
# group 128; bias_acc adds instructions there, 0.102: the per-step row sum is not amortised over a
# 64-row tile), and three launch layouts around it chosen by reasoning, not by timing: at 1 token
# (8 experts: split-K so every SM streams, or the fused layer; one-launch routing) and at 16
# (persistent grid).
# Levers with scale_acc need group_size % BLOCK_K == 0 (group 128 at BLOCK_K 128).
_LEAN = {"int4_cvt": "lop3", "scale_acc": True, "swap_ab": True}
ABLATIONS = {
    "base": dict(BASE),
    "wide_load": {**BASE, "wide_load": True},
    "lop3": {**BASE, "int4_cvt": "lop3"},
    "swap_ab": {**BASE, "swap_ab": True},
    "scale_acc": {**BASE, "scale_acc": True},
    "bias_acc": {**BASE, "scale_acc": True, "bias_acc": True},
    **layout_levers(BASE),  # split_k4, persistent, n_major, route_one, down_token, fuse_down
    "lean": {**BASE, **_LEAN},
    "lean_bias": {**BASE, **_LEAN, "bias_acc": True},
    "lean_t1": {**BASE, **_LEAN, "split_k1": 4, "route": "one"},
    "lean_t1_fused": {**BASE, **_LEAN, "fuse_down": True, "BLOCK_N2": 64, "route": "one"},
    "lean_t16": {**BASE, **_LEAN, "persistent": True, "ctas_per_sm": 3, "route": "one"},
}
INT4_CVTS = ("magic", "lop3")


def check_config(cfg: dict, shape: dict) -> None:
    """Reject configs the kernels do not handle, naming the rule (no K/N tail masks anywhere)."""
    t, d, i, _e, k, g = (int(shape[key]) for key in ("tokens", "model_dim", "inter_dim", "experts", "topk", "group_size"))
    missing = sorted(set(BASE) - set(cfg))
    if missing:
        raise ValueError(f"moe_a16wi4 decode config is missing {missing}")
    p = []
    for key in ("BLOCK_M", "BLOCK_N1", "BLOCK_K1", "BLOCK_N2", "BLOCK_K2"):
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 16 or v & (v - 1):
            p.append(f"{key}={v!r} must be a power of two >= 16")
    if p:
        raise ValueError("moe_a16wi4 decode config rejected: " + "; ".join(p))
    bk2 = cfg["BLOCK_N1"] if cfg["fuse_down"] else cfg["BLOCK_K2"]  # the fused down GEMM's K step is the N1 tile
    for name, n_dim, bn, k_dim, bk in (("stage 1", i, cfg["BLOCK_N1"], d, cfg["BLOCK_K1"]),
                                       ("stage 2", d, cfg["BLOCK_N2"], i, bk2)):
        if n_dim % bn:
            p.append(f"{name}: BLOCK_N={bn} must divide {n_dim}")
        if k_dim % bk:
            p.append(f"{name}: BLOCK_K={bk} must divide {k_dim}")
        if bk % g and g % bk:
            p.append(f"{name}: BLOCK_K={bk} and group_size={g} must divide one another")
        if bk < g and not (cfg["scale_acc"] or (cfg["fuse_down"] and name == "stage 2")):
            p.append(f"{name}: BLOCK_K={bk} below group_size={g} needs scale_acc")
        if cfg["scale_acc"] and g % bk:
            p.append(f"{name}: scale_acc needs BLOCK_K={bk} to divide group_size={g} (one scale per K step)")
        if (cfg["wide_load"] or cfg["int4_cvt"] == "lop3") and bk % 8:
            p.append(f"{name}: wide_load needs BLOCK_K={bk} to be a multiple of 8")
    sk = cfg["split_k1"]
    if isinstance(sk, bool) or not isinstance(sk, int) or sk < 1:
        p.append(f"split_k1 must be a positive int, got {sk!r}")
    elif sk > d // cfg["BLOCK_K1"]:
        p.append(f"split_k1={sk} exceeds the {d // cfg['BLOCK_K1']} BLOCK_K1 steps of model_dim={d}")
    if cfg["fuse_down"] and sk != 1:
        p.append("fuse_down needs split_k1 = 1 (SiLU needs the whole K sum inside the program)")
    if cfg["fuse_down"] and cfg["down"] != "atomic":
        p.append("fuse_down adds into the fp32 accumulator: down must be 'atomic'")
    p += choice_problems(cfg, "tile_order", "route")
    if cfg["int4_cvt"] not in INT4_CVTS:
        p.append(f"int4_cvt must be one of {INT4_CVTS}, got {cfg['int4_cvt']!r}")
    if cfg["bias_acc"] and not cfg["scale_acc"]:
        p.append("bias_acc takes the +136 off the fp32 partial before its scale: it needs scale_acc")
    p += choice_problems(cfg, "down")
    cps = cfg["ctas_per_sm"]
    if isinstance(cps, bool) or not isinstance(cps, int) or not 1 <= cps <= 16:
        p.append(f"ctas_per_sm must be an int in 1..16, got {cps!r}")
    if (cfg["wide_load"] or cfg["int4_cvt"] == "lop3") and (d % 8 or i % 8):
        p.append("wide_load needs model_dim and inter_dim to be multiples of 8 (whole int32 words)")
    if p:
        raise ValueError("moe_a16wi4 decode config rejected: " + "; ".join(p))


def resolve_config(shape: dict, config: dict | None) -> dict:
    """BASE with the given knobs; the group decides nothing silently (check_config says why not)."""
    cfg = {**BASE, **(config or {})}
    check_config(cfg, shape)
    return cfg


def wide_mode(cfg: dict) -> int:
    """The kernels' WIDE constexpr: 0 bytes + magic, 1 int32 words + magic, 2 int32 words + lop3 (the
    lop3 conversion reads words whatever wide_load says)."""
    if cfg["int4_cvt"] == "lop3":
        return 2
    return 1 if cfg["wide_load"] else 0


def pack_experts(w_q: torch.Tensor, w_scale: torch.Tensor, cfg: dict) -> PackedExperts:
    """The expert stack packed as ``cfg``'s kernels read it (explicit, once per weight; never cached):
    bytes two codes each (triton_sm90.prepare_weights), or int32 words in the lop3 order."""
    packed = prepare_weights(w_q, w_scale)
    if wide_mode(cfg) == 2:
        packed = PackedExperts(pack_lop3(w_q).view(torch.int8), packed.scale, packed.group_size)
    return packed


def _words(packed: torch.Tensor, wide: bool) -> torch.Tensor:
    """The packed int4 bytes as the kernels read them: int32 words (wide) or the bytes themselves."""
    return packed.view(torch.int32) if wide else packed


def moe_a16wi4_decode(x: torch.Tensor, w1: PackedExperts, w2: PackedExperts, topk_ids: torch.Tensor,
                      topk_weights: torch.Tensor, out: torch.Tensor, cfg: dict, num_sms: int | None = None) -> torch.Tensor:
    """The layer with the knobs of ``cfg`` (resolve_config); writes ``out`` (tokens, model_dim) bf16."""
    t, d = x.shape
    experts, two_i, _ = w1.packed.shape
    inter = two_i // 2
    topk = topk_ids.shape[1]
    g = w1.group_size
    dev = x.device
    sms = num_sms or device_sms(dev)
    x = x.contiguous()
    wts = topk_weights.to(torch.float32).contiguous()
    bm = cfg["BLOCK_M"]
    routing = route(topk_ids, experts, bm, cfg)
    grid_knobs = grid_constexprs(cfg)
    wide = wide_mode(cfg)
    w1k, w2k = _words(w1.packed, wide > 0), _words(w2.packed, wide > 0)
    atomic = cfg["down"] == "atomic"
    acc = fp32_buffer((t, d), atomic, dev)
    zero_numel = acc.numel() if atomic else 0
    if cfg["fuse_down"]:
        # the fused programs add into acc from their first tile on: it is zeroed by a launch before
        # theirs, not by the programs themselves (their shares would race the others' adds)
        launch_zero(_moe_a16wi4d_zero_kernel, acc)
        bound = routing.max_blocks * (inter // cfg["BLOCK_N1"])
        grid = grid_size(bound, cfg, sms)
        _moe_a16wi4d_fused_kernel[(grid,)](
            x, w1k, w1.scale, w2k, w2.scale, acc, wts,
            routing.sorted_ids, routing.block_expert, routing.valid_end, routing.num_rows,
            d, inter,
            x.stride(0), w1k.stride(0), w1k.stride(1), w1.scale.stride(0), w1.scale.stride(1),
            w2k.stride(0), w2k.stride(1), w2.scale.stride(0), w2.scale.stride(1), acc.stride(0),
            TOPK=topk, GROUP=g, BLOCK_M=bm, BLOCK_N1=cfg["BLOCK_N1"], BLOCK_K1=cfg["BLOCK_K1"], BLOCK_N2=cfg["BLOCK_N2"],
            WIDE=wide, SWAP=cfg["swap_ab"], SCALE_ACC=cfg["scale_acc"], SCALE_ACC2=g >= cfg["BLOCK_N1"],
            **grid_knobs, BIASED=cfg["bias_acc"],
            num_warps=cfg["warps1"], num_stages=cfg["stages1"])
    else:
        h = torch.empty(t * topk, inter, dtype=torch.bfloat16, device=dev)
        per, splits = split_k_steps(d, cfg["BLOCK_K1"], cfg["split_k1"])
        part = fp32_buffer((splits, t * topk, 2 * inter), splits > 1, dev)
        bound = routing.max_blocks * (inter // cfg["BLOCK_N1"]) * splits
        grid = grid_size(bound, cfg, sms)
        _moe_a16wi4d_gate_up_kernel[(grid,)](
            x, w1k, w1.scale, h, part, acc,
            routing.sorted_ids, routing.block_expert, routing.valid_end, routing.num_rows,
            d, inter, zero_numel, triton.cdiv(zero_numel, grid), per,
            x.stride(0), w1k.stride(0), w1k.stride(1), w1.scale.stride(0), w1.scale.stride(1), h.stride(0),
            t * topk * 2 * inter,
            TOPK=topk, GROUP=g, BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N1"], BLOCK_K=cfg["BLOCK_K1"],
            WIDE=wide, SWAP=cfg["swap_ab"], SCALE_ACC=cfg["scale_acc"], SPLIT_K=splits,
            **grid_knobs, BIASED=cfg["bias_acc"],
            num_warps=cfg["warps1"], num_stages=cfg["stages1"])
        if splits > 1:
            blk = min(1024, triton.next_power_of_2(inter))
            _moe_a16wi4d_splitk_silu_kernel[(t * topk, triton.cdiv(inter, blk))](
                part, h, t * topk, inter, h.stride(0), t * topk * 2 * inter, SPLIT_K=splits, BLOCK=blk, num_warps=4)
        if atomic:
            bound2 = routing.max_blocks * (d // cfg["BLOCK_N2"])
            grid2 = grid_size(bound2, cfg, sms)
            _moe_a16wi4d_down_kernel[(grid2,)](
                h, w2k, w2.scale, acc, wts,
                routing.sorted_ids, routing.block_expert, routing.valid_end, routing.num_rows,
                d, inter, h.stride(0), w2k.stride(0), w2k.stride(1), w2.scale.stride(0), w2.scale.stride(1), acc.stride(0),
                TOPK=topk, GROUP=g, BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N2"], BLOCK_K=cfg["BLOCK_K2"],
                WIDE=wide, SWAP=cfg["swap_ab"], SCALE_ACC=cfg["scale_acc"],
                **grid_knobs, BIASED=cfg["bias_acc"],
                num_warps=cfg["warps2"], num_stages=cfg["stages2"])
        else:
            ids = topk_ids.reshape(-1).to(torch.int32)
            _moe_a16wi4d_down_token_kernel[(t, d // cfg["BLOCK_N2"])](
                h, w2k, w2.scale, out, ids, wts,
                d, inter, h.stride(0), w2k.stride(0), w2k.stride(1), w2.scale.stride(0), w2.scale.stride(1), out.stride(0),
                TOPK=topk, GROUP=g, BLOCK_N=cfg["BLOCK_N2"], BLOCK_K=cfg["BLOCK_K2"],
                WIDE=wide, SCALE_ACC=cfg["scale_acc"], num_warps=cfg["warps2"], num_stages=cfg["stages2"])
            return out
    return launch_cast(_moe_a16wi4d_cast_kernel, acc, out)


def _dims(shape: dict) -> tuple[int, ...]:
    return tuple(int(shape[k]) for k in ("tokens", "model_dim", "inter_dim", "experts", "topk", "group_size"))


def build(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Builder (kernels/protocol.py): int4 packing in ``prepare`` (untimed), the knobs' launches in ``run``."""
    cfg = resolve_config(shape, config)

    def prepare(inputs: dict) -> dict:
        return {"x": inputs["x"], "w1": pack_experts(inputs["w1_q"], inputs["w1_scale"], cfg),
                "w2": pack_experts(inputs["w2_q"], inputs["w2_scale"], cfg),
                "topk_ids": inputs["topk_ids"], "topk_weights": inputs["topk_weights"]}

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        return moe_a16wi4_decode(p["x"], p["w1"], p["w2"], p["topk_ids"], p["topk_weights"], out, cfg)

    from . import traffic

    return KernelLaunch(name="triton_sm90_moe_a16wi4_decode", run=run, prepare=prepare, expect_kernels=EXPECT_KERNELS,
                        describe=describe(cfg, shape, traffic))


def compile_only(shape: dict, config: dict | None = None, arch: str = "sm_90a") -> dict:
    """Compile the GEMM/GEMV kernels ``build(shape, config)`` launches for ``arch`` (no GPU) and return
    their static facts (kernels/protocol.py); routing, SiLU-reduce and cast kernels are left out."""
    t, d, i, e, k, g = _dims(shape)
    cfg = resolve_config(shape, config)
    wide = wide_mode(cfg)
    u = 8 if wide else 2
    wty = "*i32" if wide else "*i8"
    routing = ROUTING_TYPES
    flags = {"WIDE": wide, "SCALE_ACC": cfg["scale_acc"]}
    grid_knobs = {**grid_constexprs(cfg), "BIASED": cfg["bias_acc"]}
    # contiguous operands: packed (E, 2I, D/u) and (E, D, I/u) elements of u codes, scales (E, rows, K/group)
    w1 = {"stride_we": 2 * i * d // u, "stride_wn": d // u}  # in stored elements (words or bytes)
    w2 = {"stride_we": d * i // u, "stride_wn": i // u}
    s1 = {"stride_se": 2 * i * (d // g), "stride_sn": d // g}
    s2 = {"stride_se": d * (i // g), "stride_sn": i // g}
    kernels = []
    if cfg["fuse_down"]:
        types = {"x_ptr": "*bf16", "w1_ptr": wty, "s1_ptr": "*bf16", "w2_ptr": wty, "s2_ptr": "*bf16", "acc_ptr": "*fp32",
                 "tw_ptr": "*fp32", **routing}
        vals = {"D": d, "I": i, "stride_xt": d, "stride_w1e": w1["stride_we"], "stride_w1n": w1["stride_wn"],
                "stride_s1e": s1["stride_se"], "stride_s1n": s1["stride_sn"], "stride_w2e": w2["stride_we"],
                "stride_w2n": w2["stride_wn"], "stride_s2e": s2["stride_se"], "stride_s2n": s2["stride_sn"], "stride_at": d}
        consts = {"TOPK": k, "GROUP": g, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N1": cfg["BLOCK_N1"], "BLOCK_K1": cfg["BLOCK_K1"],
                  "BLOCK_N2": cfg["BLOCK_N2"], "SWAP": cfg["swap_ab"], "SCALE_ACC2": g >= cfg["BLOCK_N1"], **flags, **grid_knobs}
        kernels.append(kernel_facts(_moe_a16wi4d_fused_kernel, types, vals, consts, cfg["warps1"], cfg["stages1"],
                                    2 * cfg["BLOCK_N1"] * cfg["BLOCK_K1"], arch))
    else:
        splits = split_k_steps(d, cfg["BLOCK_K1"], cfg["split_k1"])[1]
        types = {"x_ptr": "*bf16", "w_ptr": wty, "s_ptr": "*bf16", "h_ptr": "*bf16", "part_ptr": "*fp32",
                 "zero_ptr": "*fp32", **routing, "zero_numel": "i32", "zero_per_prog": "i32", "k_per_split": "i32"}
        vals = {"D": d, "I": i, "stride_xt": d, **w1, **s1, "stride_ht": i, "stride_ps": t * k * 2 * i}
        consts = {"TOPK": k, "GROUP": g, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N1"], "BLOCK_K": cfg["BLOCK_K1"],
                  "SWAP": cfg["swap_ab"], "SPLIT_K": splits, **flags, **grid_knobs}
        kernels.append(kernel_facts(_moe_a16wi4d_gate_up_kernel, types, vals, consts, cfg["warps1"], cfg["stages1"],
                                    2 * cfg["BLOCK_N1"] * cfg["BLOCK_K1"], arch))
        if cfg["down"] == "atomic":
            types = {"h_ptr": "*bf16", "w_ptr": wty, "s_ptr": "*bf16", "acc_ptr": "*fp32", "tw_ptr": "*fp32", **routing}
            vals = {"D": d, "I": i, "stride_ht": i, **w2, **s2, "stride_at": d}
            consts = {"TOPK": k, "GROUP": g, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N2"], "BLOCK_K": cfg["BLOCK_K2"],
                      "SWAP": cfg["swap_ab"], **flags, **grid_knobs}
            fn = _moe_a16wi4d_down_kernel
        else:
            types = {"h_ptr": "*bf16", "w_ptr": wty, "s_ptr": "*bf16", "out_ptr": "*bf16", "ids_ptr": "*i32", "tw_ptr": "*fp32"}
            vals = {"D": d, "I": i, "stride_ht": i, **w2, **s2, "stride_ot": d}
            consts = {"TOPK": k, "GROUP": g, "BLOCK_N": cfg["BLOCK_N2"], "BLOCK_K": cfg["BLOCK_K2"], **flags}
            fn = _moe_a16wi4d_down_token_kernel
        kernels.append(kernel_facts(fn, types, vals, consts, cfg["warps2"], cfg["stages2"], cfg["BLOCK_N2"] * cfg["BLOCK_K2"],
                                    arch))
    return {"arch": arch, "config": cfg, "launches": launches(cfg, t * k), "kernels": kernels}


__all__ = ["ABLATIONS", "BASE", "EXPECT_KERNELS", "build", "check_config", "compile_only", "launches", "moe_a16wi4_decode",
           "resolve_config", "route_one", "split_k_steps"]
