"""Triton port (sm_90) of the fp8 block-scale MoE layer (problem.py): two block-scale grouped GEMMs.

Five launches, none waiting on the host (the layer can be captured in a CUDA graph):

1-2. the a16wi4 family's device-side expert alignment (``moe_a16wi4.triton_sm90.align_by_expert``:
     ``_moe_a16wi4_align_kernel`` + ``_moe_a16wi4_scatter_kernel``): (token, slot) pairs grouped by
     expert in BLOCK_M-padded blocks, one expert id per block, valid-row ends, total rows. The
     routing contract does not depend on the weight format, so it is shared rather than copied.
3. ``_moe_fp8bs_gate_up_kernel``: per (expert block, N tile), the fp8 A rows of the block's tokens
   (gathered through the sorted pair ids) against the gate and the up tiles of W1: one unscaled fp8
   dot per 128-deep K block, promoted into fp32 accumulators as ``acc += dot * a_scale[row] *
   w_scale[n_block]`` (the DeepSeek recipe; fp8_blockscale_numerics). Epilogue: SiLU(gate) * up in
   fp32, then the recipe's fp8 1x128 quantization of h per pair row (amax / 448 over each 128-column
   group, which is why BLOCK_N1 is a multiple of 128): h (pairs, I) fp8 and h_scale (pairs, I/128).
   It also zeroes the fp32 output accumulator of stage 2 (saves a fill launch).
4. ``_moe_fp8bs_down_kernel``: h @ W2^T per expert block with the same per-K-block promotion, times
   the routing weight, atomically added into the fp32 (tokens, model_dim) accumulator.
5. ``_moe_fp8bs_cast_kernel``: fp32 accumulator -> bf16 output.

BLOCK_K is 128 in both stages: one scale per K step for every operand.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from skillrun_kernels._moe.triton_routing import block_pairs
from skillrun_kernels.moe_a16wi4.triton_sm90 import Routing, align_by_expert
from skillrun_kernels.protocol import KernelLaunch

from . import problem

KERNEL_PREFIX = "_moe_fp8bs_"
EXPECT_KERNELS = r"^(_moe_fp8bs_(gate_up|down|cast)_kernel|_moe_a16wi4_(align|scatter)_kernel)$"
BLOCK_K = 128
FP8_MAX = 448.0


@triton.jit(do_not_specialize=["zero_numel", "zero_per_prog"])
def _moe_fp8bs_gate_up_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, h_ptr, hs_ptr, zero_ptr,
    sorted_ptr, block_expert_ptr, valid_end_ptr, num_rows_ptr,
    D, I, zero_numel, zero_per_prog,
    stride_at, stride_ast, stride_we, stride_wn, stride_wse, stride_wsn, stride_ht, stride_hst,
    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    # Clear this program's share of stage 2's fp32 accumulator (stage 2 runs after this launch).
    prog = pid_n * tl.num_programs(0) + pid_m
    zoffs = tl.arange(0, 1024)
    for z in range(0, zero_per_prog, 1024):
        idx = prog.to(tl.int64) * zero_per_prog + z + zoffs
        tl.store(zero_ptr + idx, tl.zeros((1024,), dtype=tl.float32), mask=(z + zoffs < zero_per_prog) & (idx < zero_numel))

    if pid_m * BLOCK_M >= tl.load(num_rows_ptr):
        return
    e, rvalid, pair = block_pairs(pid_m, sorted_ptr, block_expert_ptr, valid_end_ptr, BLOCK_M)
    tok = pair // TOPK

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + tok[:, None] * stride_at + offs_k[None, :]
    as_ptrs = as_ptr + tok * stride_ast
    wg_ptrs = w_ptr + e * stride_we + offs_n[:, None] * stride_wn + offs_k[None, :]
    wu_ptrs = wg_ptrs + I * stride_wn
    # 128x128 weight scales: one per K step when the tile sits inside one N block (a scalar, no
    # per-column vector in registers), else the N block of each column
    if BLOCK_N <= BLOCK_K:
        sg_ptrs = ws_ptr + e * stride_wse + ((pid_n * BLOCK_N) // BLOCK_K) * stride_wsn
    else:
        sg_ptrs = ws_ptr + e * stride_wse + (offs_n // BLOCK_K) * stride_wsn
    su_ptrs = sg_ptrs + (I // BLOCK_K) * stride_wsn

    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, D // BLOCK_K):
        a = tl.load(a_ptrs, mask=rvalid[:, None], other=0.0)
        sa = tl.load(as_ptrs + kb, mask=rvalid, other=0.0)
        bg = tl.load(wg_ptrs)
        bu = tl.load(wu_ptrs)
        sg = tl.load(sg_ptrs + kb)
        su = tl.load(su_ptrs + kb)
        # unscaled fp8 MMA over one K block, promoted once into fp32 with both scales
        if BLOCK_N <= BLOCK_K:
            acc_g += tl.dot(a, tl.trans(bg)) * (sa * sg)[:, None]
            acc_u += tl.dot(a, tl.trans(bu)) * (sa * su)[:, None]
        else:
            acc_g += tl.dot(a, tl.trans(bg)) * sa[:, None] * sg[None, :]
            acc_u += tl.dot(a, tl.trans(bu)) * sa[:, None] * su[None, :]
        a_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K
        wu_ptrs += BLOCK_K

    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    # The recipe's 1x128 quantization of h: amax per (row, 128-column group) of this tile.
    G: tl.constexpr = BLOCK_N // BLOCK_K
    hg = tl.reshape(h, (BLOCK_M, G, BLOCK_K))
    amax = tl.maximum(tl.max(tl.abs(hg), axis=2), 1e-12)
    scale = amax / 448.0
    q = hg / scale[:, :, None]
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    q = tl.reshape(q, (BLOCK_M, BLOCK_N)).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + pair[:, None] * stride_ht + offs_n[None, :], q, mask=rvalid[:, None])
    offs_g = pid_n * G + tl.arange(0, G)
    tl.store(hs_ptr + pair[:, None] * stride_hst + offs_g[None, :], scale, mask=rvalid[:, None])


@triton.jit
def _moe_fp8bs_down_kernel(
    h_ptr, hs_ptr, w_ptr, ws_ptr, acc_ptr, tw_ptr,
    sorted_ptr, block_expert_ptr, valid_end_ptr, num_rows_ptr,
    I, stride_ht, stride_hst, stride_we, stride_wn, stride_wse, stride_wsn, stride_at,
    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_rows_ptr):
        return
    e, rvalid, pair = block_pairs(pid_m, sorted_ptr, block_expert_ptr, valid_end_ptr, BLOCK_M)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    h_ptrs = h_ptr + pair[:, None] * stride_ht + offs_k[None, :]
    hs_ptrs = hs_ptr + pair * stride_hst
    w_ptrs = w_ptr + e * stride_we + offs_n[:, None] * stride_wn + offs_k[None, :]
    if BLOCK_N <= BLOCK_K:  # one weight scale per K step (see the gate/up kernel)
        s_ptrs = ws_ptr + e * stride_wse + ((pid_n * BLOCK_N) // BLOCK_K) * stride_wsn
    else:
        s_ptrs = ws_ptr + e * stride_wse + (offs_n // BLOCK_K) * stride_wsn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, I // BLOCK_K):
        a = tl.load(h_ptrs, mask=rvalid[:, None], other=0.0)
        sa = tl.load(hs_ptrs + kb, mask=rvalid, other=0.0)
        b = tl.load(w_ptrs)
        sb = tl.load(s_ptrs + kb)
        if BLOCK_N <= BLOCK_K:
            acc += tl.dot(a, tl.trans(b)) * (sa * sb)[:, None]
        else:
            acc += tl.dot(a, tl.trans(b)) * sa[:, None] * sb[None, :]
        h_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    wt = tl.load(tw_ptr + pair, mask=rvalid, other=0.0)
    tok = pair // TOPK
    tl.atomic_add(acc_ptr + tok[:, None] * stride_at + offs_n[None, :], acc * wt[:, None], mask=rvalid[:, None], sem="relaxed")


@triton.jit(do_not_specialize=["n"])
def _moe_fp8bs_cast_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=ok).to(tl.bfloat16), mask=ok)


# Regime by rows per expert r = tokens * topk / experts (DeepSeek-V3: r = tokens / 32). Starting points
# picked by compiling only, NOT by timing (no H200 run exists yet): the fewest-spill points of a small
# sweep whose compiles lacked the launch's stride specialisation. Compiled as launched (compile_only
# below, benchmarks/compile_check_sm90.py; compile_sm90.json) none of them spills.
DEFAULT_DECODE = {"BLOCK_M": 16, "BLOCK_N1": 128, "warps1": 8, "stages1": 3, "BLOCK_N2": 64, "warps2": 4, "stages2": 3}
DEFAULT_MID = {"BLOCK_M": 32, "BLOCK_N1": 128, "warps1": 8, "stages1": 3, "BLOCK_N2": 128, "warps2": 8, "stages2": 3}
DEFAULT_PREFILL = {"BLOCK_M": 64, "BLOCK_N1": 128, "warps1": 8, "stages1": 3, "BLOCK_N2": 128, "warps2": 8, "stages2": 3}


def regime(tokens: int, topk: int, experts: int) -> str:
    r = tokens * topk / experts
    return "decode" if r <= 8 else "mid" if r <= 64 else "prefill"


def pick_config(tokens: int, topk: int, experts: int) -> dict:
    return dict({"decode": DEFAULT_DECODE, "mid": DEFAULT_MID, "prefill": DEFAULT_PREFILL}[regime(tokens, topk, experts)])


def check_config(cfg: dict, model_dim: int, inter_dim: int) -> None:
    """Reject tile choices the kernels do not handle (no K/N tail masks; h quantized per 128 columns)."""
    problems = []
    for key in ("BLOCK_M", "BLOCK_N1", "BLOCK_N2", "warps1", "warps2", "stages1", "stages2"):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            problems.append(f"{key} must be a positive int, got {v!r}")
    if not problems:
        if cfg["BLOCK_M"] < 16:
            problems.append(f"BLOCK_M={cfg['BLOCK_M']} must be at least 16 (the fp8 dot's minimum M)")
        if cfg["BLOCK_N1"] % BLOCK_K or inter_dim % cfg["BLOCK_N1"]:
            problems.append(f"BLOCK_N1={cfg['BLOCK_N1']} must be a multiple of {BLOCK_K} (h is quantized per 128 columns) dividing inter_dim={inter_dim}")
        bn2 = cfg["BLOCK_N2"]
        if model_dim % bn2 or (bn2 < BLOCK_K and BLOCK_K % bn2) or (bn2 > BLOCK_K and bn2 % BLOCK_K):
            problems.append(f"BLOCK_N2={bn2} must divide model_dim={model_dim} and divide or be a multiple of {BLOCK_K}")
    if model_dim % BLOCK_K or inter_dim % BLOCK_K:
        problems.append(f"model_dim={model_dim} and inter_dim={inter_dim} must be multiples of {BLOCK_K}")
    if problems:
        raise ValueError("fp8_blockscale_moe config rejected: " + "; ".join(problems))


def stage1(a, a_scale, w1, w1_scale, routing: Routing, topk: int, cfg: dict, zero: torch.Tensor | None = None):
    """(h fp8 (tokens*topk, I), h_scale fp32 (tokens*topk, I/128)) for every routed pair."""
    t, d = a.shape
    inter = w1.shape[1] // 2
    h = torch.empty(t * topk, inter, dtype=a.dtype, device=a.device)
    hs = torch.empty(t * topk, inter // BLOCK_K, dtype=torch.float32, device=a.device)
    grid = (routing.max_blocks, inter // cfg["BLOCK_N1"])
    zero_numel = 0 if zero is None else zero.numel()
    if zero is None:  # same pointer type either way: one compiled kernel for both uses
        zero = torch.empty(1, dtype=torch.float32, device=a.device)
    per_prog = triton.cdiv(zero_numel, grid[0] * grid[1]) if zero_numel else 0
    _moe_fp8bs_gate_up_kernel[grid](
        a, a_scale, w1, w1_scale, h, hs, zero,
        routing.sorted_ids, routing.block_expert, routing.valid_end, routing.num_rows,
        d, inter, zero_numel, per_prog,
        a.stride(0), a_scale.stride(0), w1.stride(0), w1.stride(1), w1_scale.stride(0), w1_scale.stride(1),
        h.stride(0), hs.stride(0),
        TOPK=topk, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N1"], BLOCK_K=BLOCK_K,
        num_warps=cfg["warps1"], num_stages=cfg["stages1"],
    )
    return h, hs


def stage2(h, h_scale, w2, w2_scale, routing: Routing, topk_weights: torch.Tensor, acc: torch.Tensor, cfg: dict):
    """acc (tokens, model_dim) fp32 += sum over slots of weight * (h @ W2^T); acc must start at zero."""
    inter = h.shape[1]
    d = w2.shape[1]
    grid = (routing.max_blocks, d // cfg["BLOCK_N2"])
    _moe_fp8bs_down_kernel[grid](
        h, h_scale, w2, w2_scale, acc, topk_weights.reshape(-1),
        routing.sorted_ids, routing.block_expert, routing.valid_end, routing.num_rows,
        inter, h.stride(0), h_scale.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0), w2_scale.stride(1),
        acc.stride(0),
        TOPK=topk_weights.shape[1], BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N2"], BLOCK_K=BLOCK_K,
        num_warps=cfg["warps2"], num_stages=cfg["stages2"],
    )
    return acc


def check_operands(a, a_scale, w1, w1_scale, w2, w2_scale, topk_ids, topk_weights) -> None:
    """Shapes and dtypes of the problem's operands, with a message naming the one that is wrong."""
    fp8 = problem.FP8_DTYPE
    for name, x in (("a", a), ("w1", w1), ("w2", w2)):
        if x.dtype != fp8:
            raise TypeError(f"{name} must be {fp8}, got {x.dtype}")
    t, d = a.shape
    e, two_i, d1 = w1.shape
    i = two_i // 2
    want = {"a_scale": (t, d // BLOCK_K), "w1": (e, 2 * i, d), "w1_scale": (e, 2 * i // BLOCK_K, d // BLOCK_K),
            "w2": (e, d, i), "w2_scale": (e, d // BLOCK_K, i // BLOCK_K)}
    got = {"a_scale": a_scale, "w1": w1, "w1_scale": w1_scale, "w2": w2, "w2_scale": w2_scale}
    for name, shape in want.items():
        if tuple(got[name].shape) != shape:
            raise ValueError(f"{name} has shape {tuple(got[name].shape)}, expected {shape} (tokens={t}, model_dim={d}, inter_dim={i}, experts={e})")
    for name in ("a_scale", "w1_scale", "w2_scale"):
        if got[name].dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {got[name].dtype}")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != t:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must both be (tokens, topk)")


def moe_fp8_blockscale(a, a_scale, w1, w1_scale, w2, w2_scale, topk_ids, topk_weights,
                       out: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """The full layer: (tokens, model_dim) bf16 = sum_j w_tj * FFN_{e_tj}(x_t), fp8 block-scaled experts."""
    check_operands(a, a_scale, w1, w1_scale, w2, w2_scale, topk_ids, topk_weights)
    t, d = a.shape
    e, two_i, _ = w1.shape
    topk = topk_ids.shape[1]
    cfg = dict(config) if config else pick_config(t, topk, e)
    check_config(cfg, d, two_i // 2)
    routing = align_by_expert(topk_ids, e, cfg["BLOCK_M"])
    acc = torch.empty(t, d, dtype=torch.float32, device=a.device)
    h, hs = stage1(a.contiguous(), a_scale.contiguous(), w1, w1_scale, routing, topk, cfg, zero=acc)
    stage2(h, hs, w2, w2_scale, routing, topk_weights.to(torch.float32).contiguous(), acc, cfg)
    if out is None:
        out = torch.empty(t, d, dtype=torch.bfloat16, device=a.device)
    n = acc.numel()
    _moe_fp8bs_cast_kernel[(triton.cdiv(n, 2048),)](acc, out, n, BLOCK=2048, num_warps=4)
    return out


def build(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Builder (kernels/protocol.py): the problem's operands are used as they are (no preparation)."""
    t, d, i, e, k = problem.dims(shape)
    cfg = pick_config(t, k, e)
    cfg.update(config or {})
    check_config(cfg, d, i)

    def prepare(inputs: dict) -> dict:
        w = {key: inputs[key].contiguous() for key in ("w1", "w1_scale", "w2", "w2_scale")}
        return {**inputs, **w}

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        return moe_fp8_blockscale(p["a"], p["a_scale"], p["w1"], p["w1_scale"], p["w2"], p["w2_scale"],
                                  p["topk_ids"], p["topk_weights"], out=out, config=cfg)

    return KernelLaunch(name="triton_sm90_moe_fp8_blockscale", run=run, prepare=prepare, expect_kernels=EXPECT_KERNELS,
                        describe={"backend": "triton", "config": cfg, "tuned": False, "launches": 5})


def _int_type(v: int) -> str:
    return "i32" if -2**31 <= v < 2**31 else "i64"


def compile_only(shape: dict, config: dict | None = None, arch: str = "sm_90a") -> dict:
    """Compile the two GEMM kernels ``build(shape, config)`` would launch for ``arch`` (no GPU) and
    return their static facts (kernels/protocol.py); the cast kernel is not a GEMM and is left out."""
    from skillrun_kernels._triton.compile import compile_facts

    t, d, i, e, k = problem.dims(shape)
    cfg = pick_config(t, k, e)
    cfg.update(config or {})
    check_config(cfg, d, i)
    routing = ("sorted_ptr", "block_expert_ptr", "valid_end_ptr", "num_rows_ptr")
    # stage1's two unspecialised ints, valued as it launches them: the JIT still types a Python int
    # by its value (i32 below 2**31), so i32 for any tokens * model_dim < 2**31
    zero_numel = t * d
    max_blocks = triton.cdiv(t * k + min(e, t * k) * (cfg["BLOCK_M"] - 1), cfg["BLOCK_M"])
    per_prog = triton.cdiv(zero_numel, max_blocks * (i // cfg["BLOCK_N1"]))
    s1_types = {"a_ptr": "*fp8e4nv", "as_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "h_ptr": "*fp8e4nv",
                "hs_ptr": "*fp32", "zero_ptr": "*fp32", **{r: "*i32" for r in routing},
                "zero_numel": _int_type(zero_numel), "zero_per_prog": _int_type(per_prog)}
    s2_types = {"h_ptr": "*fp8e4nv", "hs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "acc_ptr": "*fp32",
                "tw_ptr": "*fp32", **{r: "*i32" for r in routing}}
    # contiguous operands (prepare makes the weights so): w1 (E, 2I, D), w2 (E, D, I), scales per 128x128
    s1_vals = {"D": d, "I": i, "stride_at": d, "stride_ast": d // BLOCK_K, "stride_we": 2 * i * d, "stride_wn": d,
               "stride_wse": (2 * i // BLOCK_K) * (d // BLOCK_K), "stride_wsn": d // BLOCK_K, "stride_ht": i,
               "stride_hst": i // BLOCK_K}
    s2_vals = {"I": i, "stride_ht": i, "stride_hst": i // BLOCK_K, "stride_we": d * i, "stride_wn": i,
               "stride_wse": (d // BLOCK_K) * (i // BLOCK_K), "stride_wsn": i // BLOCK_K, "stride_at": d}
    kernels = []
    for fn, types, vals, n, warps, stages in (
        (_moe_fp8bs_gate_up_kernel, s1_types, s1_vals, "BLOCK_N1", "warps1", "stages1"),
        (_moe_fp8bs_down_kernel, s2_types, s2_vals, "BLOCK_N2", "warps2", "stages2"),
    ):
        consts = {"TOPK": k, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg[n], "BLOCK_K": BLOCK_K}
        kernels.append(compile_facts(fn, types=types, constexprs=consts, divisible=[a for a, ty in types.items() if ty[0] == "*"],
                                     values=vals, num_warps=cfg[warps], num_stages=cfg[stages], arch=arch))
    return {"arch": arch, "config": cfg, "kernels": kernels}
