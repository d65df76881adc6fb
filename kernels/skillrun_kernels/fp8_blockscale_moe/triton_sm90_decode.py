"""Decode variants of the fp8 block-scale MoE layer on sm_90 (issue 41): levers toward the memory roof.

DeepSeek-V3 decode (E256, I2048, top-8, D7168) streams 44 MB of fp8 weights per touched expert: at
1 token 8 experts (352 MB, ~83 us at the 4.25 TB/s copy roof), at 16 tokens ~102 (4.5 GB). The
measured port (``triton_sm90``: 114 us at 1 token on the H200, ~72 % of that roof, no production
kernel compared yet) keeps its source (its artifacts name its bytes); its levers are knobs here, off
unless a config turns them on:

- ``swap_ab``: W . A^T: the 128 weight rows of a tile on the MMA's M side (wgmma with 4 warps), the
  16 padded token rows on its N side, instead of 16 token rows on mma.sync.
- ``split_k1`` (> 1): stage 1's 7168-deep K loop split over more programs (at 1 token: 8 experts x 16
  N tiles = 128 programs for 132 SMs); partials are plain stores into a (splits, pairs, 2I) fp32
  workspace that ``_moe_fp8bsd_splitk_quant_kernel`` sums in a fixed order before SiLU and the
  recipe's 1x128 re-quantization of h (no atomics, no zeroing).
- ``persistent`` + ``ctas_per_sm``, ``tile_order`` (expert_major | n_major), ``route`` (two | one, the
  one-launch routing where tokens x topk <= 256): as in moe_a16wi4/triton_sm90_decode.py (shared
  pieces in _moe/triton_decode.py).
- ``down``: ``atomic`` (expert blocks, fp32 atomic top-k sum, cast launch) or ``token`` (one program
  per (token, N2 tile) loops over the token's experts on the CUDA cores, bf16 out; no accumulator,
  no cast launch; an expert's W2 is re-read by every token routed to it).
- ``fuse_down`` (BLOCK_N1 = 128): gate/up, SiLU, the 1x128 quantization of h and the down projection
  in one launch: a 128-column h tile is exactly one quantization group, so each program quantizes
  its own tile as the recipe does and multiplies it by W2's matching 128 columns (one K block of the
  down GEMM, its 128x128 scales), adding into the fp32 accumulator atomically. No h round trip.

Every variant computes the layer the oracle defines (problem.py: h re-quantized to fp8 per 1x128
block); tests/test_fp8_blockscale_moe_decode_cpu.py runs each in Triton's interpreter. Nothing here
is measured yet.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from skillrun_kernels._moe.triton_decode import (ROUTING_TYPES, acc_tile, add_rows, cast_bf16, choice_problems,
                                                 describe, device_sms, expert_items, fp32_buffer, grid_constexprs,
                                                 grid_size, item_range, item_rows, kernel_facts, launch_cast,
                                                 launch_zero, launches, layout_levers, route, silu_mul, split_k_steps,
                                                 store_partials, tile_index, zero_fill, zero_share)
from skillrun_kernels.protocol import KernelLaunch

from . import problem

KERNEL_PREFIX = "_moe_fp8bsd_"
EXPECT_KERNELS = (r"^(_moe_fp8bsd_(gate_up|fused|splitk_quant|down|down_token|zero|cast)_kernel"
                  r"|_moe_route_one_kernel|_moe_a16wi4_(align|scatter)_kernel)$")
BLOCK_K = 128
FP8_MAX = 448.0


@triton.jit
def _promote(acc, a, w, sa, sw, SWAP: tl.constexpr):
    """acc += (w . a^T or a . w^T) x activation scales (per token row) x the weight block's scale
    (a scalar: the tile sits inside one 128-row scale block)."""
    if SWAP:
        acc += tl.dot(w, tl.trans(a)) * (sa * sw)[None, :]
    else:
        acc += tl.dot(a, tl.trans(w)) * (sa * sw)[:, None]
    return acc


@triton.jit
def _gate_up_tile(a_ptr, as_ptr, w_ptr, ws_ptr, e, tok, rvalid, n0, kb_first, kb_last, I,
                  stride_at, stride_ast, stride_we, stride_wn, stride_wse, stride_wsn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP: tl.constexpr):
    """Gate and up fp32 accumulators of one (expert block, N tile of BLOCK_N <= 128 rows) over K blocks."""
    acc_g = acc_tile(BLOCK_M, BLOCK_N, SWAP)
    acc_u = acc_tile(BLOCK_M, BLOCK_N, SWAP)
    offs_n = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    wg = w_ptr + e * stride_we + offs_n[:, None] * stride_wn
    wu = wg + I * stride_wn
    sg = ws_ptr + e * stride_wse + (n0 // BLOCK_K) * stride_wsn
    su = sg + (I // BLOCK_K) * stride_wsn
    for kb in range(kb_first, kb_last):
        k0 = kb * BLOCK_K
        a = tl.load(a_ptr + tok[:, None] * stride_at + (k0 + offs_k)[None, :], mask=rvalid[:, None], other=0.0)
        sa = tl.load(as_ptr + tok * stride_ast + kb, mask=rvalid, other=0.0)
        bg = tl.load(wg + (k0 + offs_k)[None, :])
        bu = tl.load(wu + (k0 + offs_k)[None, :])
        acc_g = _promote(acc_g, a, bg, sa, tl.load(sg + kb), SWAP)
        acc_u = _promote(acc_u, a, bu, sa, tl.load(su + kb), SWAP)
    return acc_g, acc_u


@triton.jit
def _quant_rows(h, SWAP: tl.constexpr):
    """The recipe's 1x128 quantization of an fp32 h tile holding one 128-column group per token row:
    (fp8-ready values clamped to +-448, per-row scales). SWAP: the tile is (128, BM), rows on axis 1."""
    ax: tl.constexpr = 0 if SWAP else 1
    scale = tl.maximum(tl.max(tl.abs(h), axis=ax), 1e-12) / 448.0
    if SWAP:
        q = h / scale[None, :]
    else:
        q = h / scale[:, None]
    return tl.minimum(tl.maximum(q, -448.0), 448.0), scale


# --------------------------------------------------------------------------------------------- stage 1


@triton.jit(do_not_specialize=["zero_numel", "zero_per_prog", "k_per_split"])
def _moe_fp8bsd_gate_up_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, h_ptr, hs_ptr, part_ptr, zero_ptr,
    sorted_ptr, block_expert_ptr, valid_end_ptr, num_rows_ptr,
    D, I, zero_numel, zero_per_prog, k_per_split,
    stride_at, stride_ast, stride_we, stride_wn, stride_wse, stride_wsn, stride_ht, stride_hst, stride_ps,
    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SWAP: tl.constexpr, SPLIT_K: tl.constexpr, PERSISTENT: tl.constexpr, N_MAJOR: tl.constexpr,
):
    zero_share(zero_ptr, zero_numel, zero_per_prog)
    blocks, n_tiles, n_items = expert_items(num_rows_ptr, I, BLOCK_N, SPLIT_K, BLOCK_M)
    k_blocks = D // BLOCK_K
    first, last, step = item_range(n_items, PERSISTENT)
    for it in range(first, last, step):
        item = it if PERSISTENT else tl.program_id(0)
        if item < n_items:
            e, rvalid, pair, n, s = item_rows(item, n_tiles, blocks, sorted_ptr, block_expert_ptr, valid_end_ptr,
                                              BLOCK_M, SPLIT_K, N_MAJOR)
            kb_first = s * k_per_split
            kb_last = tl.minimum(kb_first + k_per_split, k_blocks)
            acc_g, acc_u = _gate_up_tile(a_ptr, as_ptr, w_ptr, ws_ptr, e, pair // TOPK, rvalid, n * BLOCK_N, kb_first, kb_last, I,
                                         stride_at, stride_ast, stride_we, stride_wn, stride_wse, stride_wsn,
                                         BLOCK_M, BLOCK_N, BLOCK_K, SWAP)
            offs_n = n * BLOCK_N + tl.arange(0, BLOCK_N)
            cols, prow, pmask = tile_index(offs_n, pair, rvalid, SWAP)
            if SPLIT_K > 1:
                store_partials(part_ptr, s, stride_ps, prow, cols, pmask, I, acc_g, acc_u)
            else:
                q, scale = _quant_rows(silu_mul(acc_g, acc_u), SWAP)
                tl.store(h_ptr + prow * stride_ht + cols, q.to(h_ptr.dtype.element_ty), mask=pmask)
                tl.store(hs_ptr + pair * stride_hst + n, scale, mask=rvalid)


@triton.jit(do_not_specialize=["pairs"])
def _moe_fp8bsd_splitk_quant_kernel(part_ptr, h_ptr, hs_ptr, pairs, I, stride_ht, stride_hst, stride_ps,
                                    SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """h = q(SiLU(gate) * up) for one pair row and one 128-column group, the partials summed in split order."""
    row = tl.program_id(0).to(tl.int64)
    grp = tl.program_id(1)
    offs = grp * BLOCK_K + tl.arange(0, BLOCK_K)
    g = tl.zeros((BLOCK_K,), dtype=tl.float32)
    u = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for s in range(SPLIT_K):
        base = part_ptr + s * stride_ps + row * (2 * I) + offs
        g += tl.load(base)
        u += tl.load(base + I)
    h = silu_mul(g, u)
    scale = tl.maximum(tl.max(tl.abs(h), axis=0), 1e-12) / 448.0
    q = tl.minimum(tl.maximum(h / scale, -448.0), 448.0)
    tl.store(h_ptr + row * stride_ht + offs, q.to(h_ptr.dtype.element_ty))
    tl.store(hs_ptr + row * stride_hst + grp, scale)


# --------------------------------------------------------------------------------------------- stage 2


@triton.jit
def _moe_fp8bsd_down_kernel(
    h_ptr, hs_ptr, w_ptr, ws_ptr, acc_ptr, tw_ptr,
    sorted_ptr, block_expert_ptr, valid_end_ptr, num_rows_ptr,
    D, I, stride_ht, stride_hst, stride_we, stride_wn, stride_wse, stride_wsn, stride_at,
    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SWAP: tl.constexpr, PERSISTENT: tl.constexpr, N_MAJOR: tl.constexpr,
):
    blocks, n_tiles, n_items = expert_items(num_rows_ptr, D, BLOCK_N, 1, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    first, last, step = item_range(n_items, PERSISTENT)
    for it in range(first, last, step):
        item = it if PERSISTENT else tl.program_id(0)
        if item < n_items:
            e, rvalid, pair, n, _s = item_rows(item, n_tiles, blocks, sorted_ptr, block_expert_ptr, valid_end_ptr,
                                               BLOCK_M, 1, N_MAJOR)
            offs_n = n * BLOCK_N + tl.arange(0, BLOCK_N)
            w_rows = w_ptr + e * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
            s_row = ws_ptr + e * stride_wse + ((n * BLOCK_N) // BLOCK_K) * stride_wsn
            acc = acc_tile(BLOCK_M, BLOCK_N, SWAP)
            for kb in range(0, I // BLOCK_K):
                k0 = kb * BLOCK_K
                a = tl.load(h_ptr + pair[:, None] * stride_ht + (k0 + offs_k)[None, :], mask=rvalid[:, None], other=0.0)
                sa = tl.load(hs_ptr + pair * stride_hst + kb, mask=rvalid, other=0.0)
                w = tl.load(w_rows + (k0 + offs_k)[None, :])
                acc = _promote(acc, a, w, sa, tl.load(s_row + kb), SWAP)
            wt = tl.load(tw_ptr + pair, mask=rvalid, other=0.0)
            add_rows(acc_ptr, stride_at, pair // TOPK, offs_n, acc, wt, rvalid, SWAP)


@triton.jit
def _moe_fp8bsd_down_token_kernel(
    h_ptr, hs_ptr, w_ptr, ws_ptr, out_ptr, ids_ptr, tw_ptr,
    D, I, stride_ht, stride_hst, stride_we, stride_wn, stride_wse, stride_wsn, stride_ot,
    TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """out[t, n tile] = sum_j w_tj * (deq(h[t, j]) . deq(W2[e_tj][n tile])^T) on the CUDA cores, bf16 out."""
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1)
    offs_n = n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    out = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(TOPK):
        pair = t * TOPK + j
        e = tl.load(ids_ptr + pair).to(tl.int64)
        w_rows = w_ptr + e * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
        s_row = ws_ptr + e * stride_wse + ((n * BLOCK_N) // BLOCK_K) * stride_wsn
        y = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for kb in range(0, I // BLOCK_K):
            k0 = kb * BLOCK_K
            hv = tl.load(h_ptr + pair * stride_ht + k0 + offs_k).to(tl.float32)
            w = tl.load(w_rows + (k0 + offs_k)[None, :]).to(tl.float32)
            y += tl.sum(w * hv[None, :], axis=1) * (tl.load(hs_ptr + pair * stride_hst + kb) * tl.load(s_row + kb))
        out += y * tl.load(tw_ptr + pair)
    tl.store(out_ptr + t * stride_ot + offs_n, out.to(tl.bfloat16))


# --------------------------------------------------------------------------------------------- fused


@triton.jit
def _moe_fp8bsd_fused_kernel(
    a_ptr, as_ptr, w1_ptr, w1s_ptr, w2_ptr, w2s_ptr, acc_ptr, tw_ptr,
    sorted_ptr, block_expert_ptr, valid_end_ptr, num_rows_ptr,
    D, I, stride_at, stride_ast, stride_w1e, stride_w1n, stride_w1se, stride_w1sn,
    stride_w2e, stride_w2n, stride_w2se, stride_w2sn, stride_acc,
    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N2: tl.constexpr,
    SWAP: tl.constexpr, PERSISTENT: tl.constexpr, N_MAJOR: tl.constexpr,
):
    """Gate/up + SiLU + 1x128 quantization + down for one (expert block, 128-column N1 tile): the tile
    is one quantization group of h, then one K block of the down GEMM, added into acc atomically (acc
    zeroed by ``_moe_fp8bsd_zero_kernel`` before this launch)."""
    blocks, n_tiles, n_items = expert_items(num_rows_ptr, I, BLOCK_K, 1, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    first, last, step = item_range(n_items, PERSISTENT)
    for it in range(first, last, step):
        item = it if PERSISTENT else tl.program_id(0)
        if item < n_items:
            e, rvalid, pair, n, _s = item_rows(item, n_tiles, blocks, sorted_ptr, block_expert_ptr, valid_end_ptr,
                                               BLOCK_M, 1, N_MAJOR)
            acc_g, acc_u = _gate_up_tile(a_ptr, as_ptr, w1_ptr, w1s_ptr, e, pair // TOPK, rvalid, n * BLOCK_K, 0, D // BLOCK_K, I,
                                         stride_at, stride_ast, stride_w1e, stride_w1n, stride_w1se, stride_w1sn,
                                         BLOCK_M, BLOCK_K, BLOCK_K, SWAP)
            q, hs = _quant_rows(silu_mul(acc_g, acc_u), SWAP)
            hq = q.to(a_ptr.dtype.element_ty)  # h's fp8 codes: (128, BM) when SWAP, else (BM, 128)
            wt = tl.load(tw_ptr + pair, mask=rvalid, other=0.0)
            tok = pair // TOPK
            k0 = n * BLOCK_K  # this tile is K block n of the down GEMM
            for d0 in range(0, D, BLOCK_N2):
                offs_d = d0 + tl.arange(0, BLOCK_N2)
                w = tl.load(w2_ptr + e * stride_w2e + offs_d.to(tl.int64)[:, None] * stride_w2n + (k0 + offs_k)[None, :])
                sw = tl.load(w2s_ptr + e * stride_w2se + (d0 // BLOCK_K) * stride_w2sn + n)
                if SWAP:
                    y = tl.dot(w, hq) * (hs * sw * wt)[None, :]
                    tl.atomic_add(acc_ptr + tok[None, :] * stride_acc + offs_d[:, None], y, mask=rvalid[None, :], sem="relaxed")
                else:
                    y = tl.dot(hq, tl.trans(w)) * (hs * sw * wt)[:, None]
                    tl.atomic_add(acc_ptr + tok[:, None] * stride_acc + offs_d[None, :], y, mask=rvalid[:, None], sem="relaxed")


# the family's names for the shared zero and cast kernels (EXPECT_KERNELS)
@triton.jit(do_not_specialize=["n"])
def _moe_fp8bsd_zero_kernel(dst_ptr, n, BLOCK: tl.constexpr):
    zero_fill(dst_ptr, n, BLOCK)


@triton.jit(do_not_specialize=["n"])
def _moe_fp8bsd_cast_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    cast_bf16(src_ptr, dst_ptr, n, BLOCK)


# --------------------------------------------------------------------------------------------- configs
# The card's decode recipe tiles (BLOCK_M 16, stage 1 16x128 8 warps 3 stages, stage 2 16x64 4 warps)
# with every lever off; one lever at a time, then combinations chosen by reasoning, not by timing.
BASE = {
    "BLOCK_M": 16, "BLOCK_N1": 128, "warps1": 8, "stages1": 3, "BLOCK_N2": 64, "warps2": 4, "stages2": 3,
    "swap_ab": False, "split_k1": 1, "persistent": False, "ctas_per_sm": 2, "tile_order": "expert_major",
    "route": "two", "down": "atomic", "fuse_down": False,
}
ABLATIONS = {
    "base": dict(BASE),
    "swap_ab": {**BASE, "swap_ab": True, "warps1": 4, "BLOCK_N2": 128},
    **layout_levers(BASE),  # split_k4, persistent, n_major, route_one, down_token, fuse_down
    # 1 token: 128 stage-1 programs for 132 SMs -> split K; launches: one routing, no cast
    "t1": {**BASE, "swap_ab": True, "warps1": 4, "BLOCK_N2": 128, "split_k1": 4, "route": "one"},
    "t1_fused": {**BASE, "swap_ab": True, "warps1": 4, "fuse_down": True, "BLOCK_N2": 128, "route": "one"},
    # 16 tokens: ~102 experts, ~1800 stage-1 items: persistent grid, one routing launch
    "t16": {**BASE, "swap_ab": True, "warps1": 4, "BLOCK_N2": 128, "persistent": True, "route": "one"},
}


def check_config(cfg: dict, shape: dict) -> None:
    """Reject configs the kernels do not handle, naming the rule."""
    t, d, i, _e, k = problem.dims(shape)
    missing = sorted(set(BASE) - set(cfg))
    if missing:
        raise ValueError(f"fp8_blockscale_moe decode config is missing {missing}")
    p = []
    for key in ("BLOCK_M", "BLOCK_N1", "BLOCK_N2", "warps1", "warps2", "stages1", "stages2", "split_k1", "ctas_per_sm"):
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            p.append(f"{key} must be a positive int, got {v!r}")
    if p:
        raise ValueError("fp8_blockscale_moe decode config rejected: " + "; ".join(p))
    if cfg["BLOCK_M"] < 16:
        p.append(f"BLOCK_M={cfg['BLOCK_M']} must be at least 16 (the fp8 dot's minimum)")
    if cfg["BLOCK_N1"] != BLOCK_K:
        p.append(f"BLOCK_N1={cfg['BLOCK_N1']} must be {BLOCK_K}: one quantization group of h per tile")
    bn2 = cfg["BLOCK_N2"]
    if d % bn2 or BLOCK_K % bn2 and bn2 % BLOCK_K or bn2 > BLOCK_K:
        p.append(f"BLOCK_N2={bn2} must divide model_dim={d} and 128 (one weight-scale block per tile)")
    if cfg["split_k1"] > d // BLOCK_K:
        p.append(f"split_k1={cfg['split_k1']} exceeds the {d // BLOCK_K} K blocks of model_dim={d}")
    if cfg["fuse_down"] and cfg["split_k1"] != 1:
        p.append("fuse_down needs split_k1 = 1 (SiLU and the quantization need the whole K sum)")
    if cfg["fuse_down"] and cfg["down"] != "atomic":
        p.append("fuse_down adds into the fp32 accumulator: down must be 'atomic'")
    p += choice_problems(cfg, "tile_order", "route", "down")
    if not 1 <= cfg["ctas_per_sm"] <= 16:
        p.append(f"ctas_per_sm must be in 1..16, got {cfg['ctas_per_sm']}")
    if p:
        raise ValueError("fp8_blockscale_moe decode config rejected: " + "; ".join(p))


def resolve_config(shape: dict, config: dict | None) -> dict:
    cfg = {**BASE, **(config or {})}
    check_config(cfg, shape)
    return cfg


def moe_fp8_blockscale_decode(a, a_scale, w1, w1_scale, w2, w2_scale, topk_ids, topk_weights, out, cfg: dict,
                              num_sms: int | None = None):
    """The layer with the knobs of ``cfg`` (resolve_config); writes ``out`` (tokens, model_dim) bf16."""
    t, d = a.shape
    e, two_i, _ = w1.shape
    inter = two_i // 2
    topk = topk_ids.shape[1]
    dev = a.device
    sms = num_sms or device_sms(dev)
    a, a_scale = a.contiguous(), a_scale.contiguous()
    wts = topk_weights.to(torch.float32).contiguous()
    bm = cfg["BLOCK_M"]
    routing = route(topk_ids, e, bm, cfg)
    grid_knobs = grid_constexprs(cfg)
    rt = (routing.sorted_ids, routing.block_expert, routing.valid_end, routing.num_rows)
    atomic = cfg["down"] == "atomic"
    acc = fp32_buffer((t, d), atomic, dev)
    if cfg["fuse_down"]:
        launch_zero(_moe_fp8bsd_zero_kernel, acc)
        grid = grid_size(routing.max_blocks * (inter // BLOCK_K), cfg, sms)
        _moe_fp8bsd_fused_kernel[(grid,)](
            a, a_scale, w1, w1_scale, w2, w2_scale, acc, wts, *rt, d, inter,
            a.stride(0), a_scale.stride(0), w1.stride(0), w1.stride(1), w1_scale.stride(0), w1_scale.stride(1),
            w2.stride(0), w2.stride(1), w2_scale.stride(0), w2_scale.stride(1), acc.stride(0),
            TOPK=topk, BLOCK_M=bm, BLOCK_K=BLOCK_K, BLOCK_N2=cfg["BLOCK_N2"], SWAP=cfg["swap_ab"], **grid_knobs,
            num_warps=cfg["warps1"], num_stages=cfg["stages1"])
    else:
        h = torch.empty(t * topk, inter, dtype=a.dtype, device=dev)
        hs = torch.empty(t * topk, inter // BLOCK_K, dtype=torch.float32, device=dev)
        per, splits = split_k_steps(d, BLOCK_K, cfg["split_k1"])
        part = fp32_buffer((splits, t * topk, 2 * inter), splits > 1, dev)
        zero_numel = acc.numel() if atomic else 0
        grid = grid_size(routing.max_blocks * (inter // BLOCK_K) * splits, cfg, sms)
        _moe_fp8bsd_gate_up_kernel[(grid,)](
            a, a_scale, w1, w1_scale, h, hs, part, acc, *rt, d, inter, zero_numel, triton.cdiv(zero_numel, grid), per,
            a.stride(0), a_scale.stride(0), w1.stride(0), w1.stride(1), w1_scale.stride(0), w1_scale.stride(1),
            h.stride(0), hs.stride(0), t * topk * 2 * inter,
            TOPK=topk, BLOCK_M=bm, BLOCK_N=BLOCK_K, BLOCK_K=BLOCK_K, SWAP=cfg["swap_ab"], SPLIT_K=splits, **grid_knobs,
            num_warps=cfg["warps1"], num_stages=cfg["stages1"])
        if splits > 1:
            _moe_fp8bsd_splitk_quant_kernel[(t * topk, inter // BLOCK_K)](
                part, h, hs, t * topk, inter, h.stride(0), hs.stride(0), t * topk * 2 * inter,
                SPLIT_K=splits, BLOCK_K=BLOCK_K, num_warps=4)
        if atomic:
            grid2 = grid_size(routing.max_blocks * (d // cfg["BLOCK_N2"]), cfg, sms)
            _moe_fp8bsd_down_kernel[(grid2,)](
                h, hs, w2, w2_scale, acc, wts, *rt, d, inter,
                h.stride(0), hs.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0), w2_scale.stride(1), acc.stride(0),
                TOPK=topk, BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N2"], BLOCK_K=BLOCK_K, SWAP=cfg["swap_ab"], **grid_knobs,
                num_warps=cfg["warps2"], num_stages=cfg["stages2"])
        else:
            ids = topk_ids.reshape(-1).to(torch.int32)
            _moe_fp8bsd_down_token_kernel[(t, d // cfg["BLOCK_N2"])](
                h, hs, w2, w2_scale, out, ids, wts, d, inter,
                h.stride(0), hs.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0), w2_scale.stride(1), out.stride(0),
                TOPK=topk, BLOCK_N=cfg["BLOCK_N2"], BLOCK_K=BLOCK_K, num_warps=cfg["warps2"], num_stages=cfg["stages2"])
            return out
    return launch_cast(_moe_fp8bsd_cast_kernel, acc, out)


def build(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Builder (kernels/protocol.py): the problem's operands as they are (weights made contiguous once)."""
    cfg = resolve_config(shape, config)

    def prepare(inputs: dict) -> dict:
        return {**inputs, **{key: inputs[key].contiguous() for key in ("w1", "w1_scale", "w2", "w2_scale")}}

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        return moe_fp8_blockscale_decode(p["a"], p["a_scale"], p["w1"], p["w1_scale"], p["w2"], p["w2_scale"],
                                         p["topk_ids"], p["topk_weights"], out, cfg)

    from . import traffic

    return KernelLaunch(name="triton_sm90_moe_fp8_blockscale_decode", run=run, prepare=prepare, expect_kernels=EXPECT_KERNELS,
                        describe=describe(cfg, shape, traffic))


def compile_only(shape: dict, config: dict | None = None, arch: str = "sm_90a") -> dict:
    """Compile the GEMM/GEMV kernels ``build(shape, config)`` launches for ``arch`` (no GPU) with their
    static facts and hot-loop SASS counts; routing, reduce, zero and cast kernels are left out."""
    t, d, i, e, k = problem.dims(shape)
    cfg = resolve_config(shape, config)
    routing = ROUTING_TYPES
    grid_knobs = grid_constexprs(cfg)
    fp8 = "*fp8e4nv"
    w1 = {"stride_we": 2 * i * d, "stride_wn": d, "stride_wse": (2 * i // BLOCK_K) * (d // BLOCK_K), "stride_wsn": d // BLOCK_K}
    w2 = {"stride_we": d * i, "stride_wn": i, "stride_wse": (d // BLOCK_K) * (i // BLOCK_K), "stride_wsn": i // BLOCK_K}
    h = {"stride_ht": i, "stride_hst": i // BLOCK_K}

    def facts(fn, types, vals, consts, warps, stages, wpi):
        return kernel_facts(fn, types, vals, consts, warps, stages, wpi, arch)

    kernels = []
    if cfg["fuse_down"]:
        types = {"a_ptr": fp8, "as_ptr": "*fp32", "w1_ptr": fp8, "w1s_ptr": "*fp32", "w2_ptr": fp8, "w2s_ptr": "*fp32",
                 "acc_ptr": "*fp32", "tw_ptr": "*fp32", **routing}
        vals = {"D": d, "I": i, "stride_at": d, "stride_ast": d // BLOCK_K, "stride_acc": d,
                **{k_.replace("_w", "_w1"): v for k_, v in w1.items()}, **{k_.replace("_w", "_w2"): v for k_, v in w2.items()}}
        consts = {"TOPK": k, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_K": BLOCK_K, "BLOCK_N2": cfg["BLOCK_N2"], "SWAP": cfg["swap_ab"], **grid_knobs}
        kernels.append(facts(_moe_fp8bsd_fused_kernel, types, vals, consts, cfg["warps1"], cfg["stages1"], 2 * BLOCK_K * BLOCK_K))
        return {"arch": arch, "config": cfg, "launches": launches(cfg, t * k), "kernels": kernels}
    splits = split_k_steps(d, BLOCK_K, cfg["split_k1"])[1]
    types = {"a_ptr": fp8, "as_ptr": "*fp32", "w_ptr": fp8, "ws_ptr": "*fp32", "h_ptr": fp8, "hs_ptr": "*fp32",
             "part_ptr": "*fp32", "zero_ptr": "*fp32", **routing, "zero_numel": "i32", "zero_per_prog": "i32", "k_per_split": "i32"}
    vals = {"D": d, "I": i, "stride_at": d, "stride_ast": d // BLOCK_K, **w1, **h, "stride_ps": t * k * 2 * i}
    consts = {"TOPK": k, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": BLOCK_K, "BLOCK_K": BLOCK_K, "SWAP": cfg["swap_ab"],
              "SPLIT_K": splits, **grid_knobs}
    kernels.append(facts(_moe_fp8bsd_gate_up_kernel, types, vals, consts, cfg["warps1"], cfg["stages1"], 2 * BLOCK_K * BLOCK_K))
    if cfg["down"] == "atomic":
        types = {"h_ptr": fp8, "hs_ptr": "*fp32", "w_ptr": fp8, "ws_ptr": "*fp32", "acc_ptr": "*fp32", "tw_ptr": "*fp32", **routing}
        vals = {"D": d, "I": i, **h, **w2, "stride_at": d}
        consts = {"TOPK": k, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N2"], "BLOCK_K": BLOCK_K, "SWAP": cfg["swap_ab"], **grid_knobs}
        kernels.append(facts(_moe_fp8bsd_down_kernel, types, vals, consts, cfg["warps2"], cfg["stages2"], cfg["BLOCK_N2"] * BLOCK_K))
    else:
        types = {"h_ptr": fp8, "hs_ptr": "*fp32", "w_ptr": fp8, "ws_ptr": "*fp32", "out_ptr": "*bf16", "ids_ptr": "*i32",
                 "tw_ptr": "*fp32"}
        vals = {"D": d, "I": i, **h, **w2, "stride_ot": d}
        consts = {"TOPK": k, "BLOCK_N": cfg["BLOCK_N2"], "BLOCK_K": BLOCK_K}
        kernels.append(facts(_moe_fp8bsd_down_token_kernel, types, vals, consts, cfg["warps2"], cfg["stages2"],
                             cfg["BLOCK_N2"] * BLOCK_K))
    return {"arch": arch, "config": cfg, "launches": launches(cfg, t * k), "kernels": kernels}
