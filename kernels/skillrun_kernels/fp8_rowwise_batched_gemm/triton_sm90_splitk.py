"""Split-K variant (sm_90) of the batched fp8 rowwise GEMM, for the weight-streaming classes (M <= 128).

Why a second kernel: at decode and small batch the problem is a weight stream (B x N x K fp8 bytes,
168 MB at B=16, N=1280, K=8192) and its roof is HBM bandwidth. The one-pass port launches
tiles_m x tiles_n x B programs: at N=1280 with 128-wide N tiles that is 10 x 16 = 160 programs on
132 SMs, 1.2 waves, so a fifth of the machine idles through the second wave and each SM has a single
CTA's loads in flight. Splitting K multiplies the programs by SPLIT_K (4 -> 640, ~4.8 waves with
2-3 resident per SM) without re-reading any weight byte: each program streams a disjoint K slice.

The partial sums meet in an fp32 workspace (B, M, N) through ``tl.atomic_add``: at M <= 128 that
buffer is at most 10.5 MB (B=16, N=1280), so it lives in the 60 MB L2 and the atomics never reach
HBM. Scales are applied to each partial before the add (they are per row and per column, so
scaling distributes over the K sum). A finishing kernel rounds the workspace to bf16 into the
caller's ``out`` and writes zeros back, so the workspace is zero again for the next call without a
separate memset launch (and a CUDA-graph replay of the two kernels stays self-contained).

Numerics: each program promotes its wgmma accumulator exactly as the one-pass port does
(PRECISE_ACC); the atomics add fp32 partials in an unspecified order, so results can differ between
runs in the last fp32 bits, far inside the card's bf16 tolerance.

Nothing here is measured yet: the split factor, tile and stage count are tunable knobs
(``TUNABLE`` below) for ``skill-run tune`` to sweep on the H200 against MSLK's batched kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from skillrun_kernels.fp8_rowwise_batched_gemm.triton_sm90 import (
    PreparedWeights,
    _precise_acc_constexpr,
    check_operands,
    default_precise_acc,
    prepare_weights,
)
from skillrun_kernels.protocol import KernelLaunch

KERNEL_NAME = "_fp8_rowwise_bmm_splitk_kernel"
FINISH_NAME = "_fp8_rowwise_splitk_finish_kernel"
EXPECT_KERNELS = rf"^({KERNEL_NAME}|{FINISH_NAME})$"

# Knobs and the values worth sweeping on the H200 (constraints in ``check_config``).
TUNABLE = {
    "BLOCK_M": [16, 64, 128],
    "BLOCK_N": [64, 128],
    "BLOCK_K": [128, 256],
    "SPLIT_K": [1, 2, 4, 8],
    "num_warps": [4, 8],
    "num_stages": [3, 4, 5],
}
SM90_SMEM_LIMIT = 232448  # bytes per block, the opt-in maximum on sm_90
DEFAULT = {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4}


@triton.jit
def _fp8_rowwise_bmm_splitk_kernel(
    x_ptr, w_ptr, xs_ptr, ws_ptr, acc_ptr,
    M, N, K, k_per_split,
    stride_xb, stride_xm, stride_xk,
    stride_wb, stride_wn, stride_wk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, PRECISE_ACC: tl.constexpr,
):
    pid = tl.program_id(0)
    bid = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    tiles_n = tl.cdiv(N, BLOCK_N)
    # N-major order inside a batch: consecutive programs read consecutive weight rows, so the
    # DRAM pages a wave opens are contiguous.
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = offs_m % M  # wrapped indices keep loads in bounds without masks; the add is masked
    cols = offs_n % N
    k0 = split * k_per_split
    x_ptrs = x_ptr + bid * stride_xb + rows[:, None] * stride_xm + (k0 + offs_k)[None, :] * stride_xk
    w_ptrs = w_ptr + bid * stride_wb + cols[None, :] * stride_wn + (k0 + offs_k)[:, None] * stride_wk

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.minimum(k0 + k_per_split, K)
    for kk in range(k0, k_end, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_left = k_end - kk
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            w = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if PRECISE_ACC > 0:
            acc = tl.dot(a, w, acc, max_num_imprecise_acc=PRECISE_ACC)
        else:
            acc = tl.dot(a, w, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    xs = tl.load(xs_ptr + bid * M + rows)
    ws = tl.load(ws_ptr + bid * N + cols)
    part = acc * xs[:, None] * ws[None, :]
    a_ptrs = acc_ptr + bid * M * N + offs_m[:, None] * N + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.atomic_add(a_ptrs, part, mask=mask, sem="relaxed")


@triton.jit
def _fp8_rowwise_splitk_finish_kernel(acc_ptr, out_ptr, total, BLOCK: tl.constexpr):
    """bf16 out = workspace, then zero the workspace for the next call (no separate memset)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    v = tl.load(acc_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, v.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(acc_ptr + offs, tl.zeros_like(v), mask=mask)


def check_config(cfg: dict, k: int) -> None:
    """Reject configs the kernel cannot run, with the reason (the tuner records it per candidate)."""
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K"):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"config {key} must be a positive int, got {v!r}")
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        if cfg[key] & (cfg[key] - 1) or cfg[key] < 16:
            raise ValueError(f"config {key} must be a power of two >= 16 (tl.dot tile), got {cfg[key]}")
    if k % 16:
        raise ValueError(f"K must be a multiple of 16 (fp8 row alignment), got {k}")
    smem = shared_bytes(cfg)
    if smem > SM90_SMEM_LIMIT:
        raise ValueError(f"config needs {smem} B of shared memory ({cfg.get('num_stages')} stages of "
                         f"({cfg['BLOCK_M']}+{cfg['BLOCK_N']})x{cfg['BLOCK_K']} fp8), over sm_90's {SM90_SMEM_LIMIT} B per block")


def shared_bytes(cfg: dict) -> int:
    """The pipeline's shared memory: one fp8 A and B tile per buffered stage.

    Triton 3.6 on sm_90 keeps ``num_stages`` buffers for wgmma tiles (BLOCK_M >= 64) and
    ``num_stages - 1`` for mma.sync tiles (BLOCK_M < 64, operands leave shared memory through
    ldmatrix a stage earlier); this matches what ptxas reported for every config of TUNABLE
    (compile_sm90_splitk.json, compile only).
    """
    stages = int(cfg.get("num_stages", DEFAULT["num_stages"]))
    buffers = stages if cfg["BLOCK_M"] >= 64 else stages - 1
    return buffers * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"]


def split_plan(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(K elements per split, splits actually used): slices are whole BLOCK_K steps, none empty."""
    steps = triton.cdiv(k, block_k)
    per = triton.cdiv(steps, min(split_k, steps))
    used = triton.cdiv(steps, per)
    return per * block_k, used


class Workspace:
    """The fp32 (B, M, N) accumulation buffer, zeroed once here and re-zeroed by the finishing kernel."""

    def __init__(self, shape: tuple[int, int, int], device) -> None:
        self.data = torch.zeros(shape, dtype=torch.float32, device=device)


def fp8_rowwise_batched_gemm_splitk(
    xq: torch.Tensor,
    w: PreparedWeights | torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    out: torch.Tensor,
    workspace: Workspace,
    config: dict | None = None,
) -> torch.Tensor:
    """out[b] = (xq[b] @ wq[b].T) * x_scale[b][:, None] * w_scale[b][None, :], bf16, split over K."""
    pw = w if isinstance(w, PreparedWeights) else PreparedWeights(w, "nk")
    bsz, m, n, k = check_operands(xq, pw, x_scale, w_scale)
    if tuple(out.shape) != (bsz, m, n) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous (B, M, N) = ({bsz}, {m}, {n}) tensor, got {tuple(out.shape)}")
    if tuple(workspace.data.shape) != (bsz, m, n):
        raise ValueError(f"workspace is {tuple(workspace.data.shape)}, this call needs ({bsz}, {m}, {n})")
    cfg = {**DEFAULT, **(config or {})}
    check_config(cfg, k)
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    precise = _precise_acc_constexpr(cfg.get("precise_acc", default_precise_acc(k)), bk)
    k_per, used = split_plan(k, bk, cfg["SPLIT_K"])
    swb, swn, swk = pw.strides()
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), bsz, used)
    _fp8_rowwise_bmm_splitk_kernel[grid](
        xq, pw.data, x_scale.contiguous(), w_scale.contiguous(), workspace.data,
        m, n, k, k_per,
        xq.stride(0), xq.stride(1), xq.stride(2),
        swb, swn, swk,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=(k % bk == 0), PRECISE_ACC=precise,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    total = bsz * m * n
    fin_block = 1024
    _fp8_rowwise_splitk_finish_kernel[(triton.cdiv(total, fin_block),)](workspace.data, out, total, BLOCK=fin_block, num_warps=4)
    return out


def build(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Builder (kernels/protocol.py): weights prepared and workspace allocated in ``prepare`` (untimed)."""
    b, m, n, k = (int(shape[key]) for key in ("batch", "M", "N", "K"))
    cfg = {**DEFAULT, **dict(config or {})}
    layout = cfg.pop("w_layout", "nk")
    cfg.setdefault("precise_acc", default_precise_acc(k))
    check_config(cfg, k)
    _precise_acc_constexpr(cfg["precise_acc"], cfg["BLOCK_K"])  # a bad value fails at build, not at launch

    def prepare(inputs: dict) -> dict:
        return {
            "xq": inputs["xq"],
            "w": prepare_weights(inputs["wq"], layout),
            "x_scale": inputs["x_scale"],
            "w_scale": inputs["w_scale"],
            # One workspace per prepared input set: sets are timed interleaved, so each gets its own.
            "ws": Workspace((b, m, n), inputs["xq"].device),
        }

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        return fp8_rowwise_batched_gemm_splitk(p["xq"], p["w"], p["x_scale"], p["w_scale"], out, p["ws"], config=cfg)

    k_per, used = split_plan(k, cfg["BLOCK_K"], cfg["SPLIT_K"])
    return KernelLaunch(
        name="triton_sm90_fp8_rowwise_batched_splitk",
        run=run,
        prepare=prepare,
        expect_kernels=EXPECT_KERNELS,
        describe={"backend": "triton", "config": {**cfg, "w_layout": layout}, "splits_used": used,
                  "k_per_split": k_per, "launches": 2},
    )


def compile_only(shape: dict, config: dict | None = None, arch: str = "sm_90a") -> dict:
    """Compile the split-K kernel ``build(shape, config)`` would launch for ``arch`` (no GPU) and return
    its static facts (kernels/protocol.py). SPLIT_K is a run-time argument: it does not change the
    compiled code; the finishing kernel is an elementwise copy and is left out."""
    from skillrun_kernels._triton.compile import compile_facts

    _b, m, n, k = (int(shape[key]) for key in ("batch", "M", "N", "K"))
    cfg = {**DEFAULT, **dict(config or {})}
    cfg.setdefault("w_layout", "nk")
    cfg.setdefault("precise_acc", default_precise_acc(k))
    check_config(cfg, k)
    bk = cfg["BLOCK_K"]
    kn = cfg["w_layout"] == "kn"
    k_per = split_plan(k, bk, cfg["SPLIT_K"])[0]
    consts = {"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_K": bk, "EVEN_K": k % bk == 0,
              "PRECISE_ACC": _precise_acc_constexpr(cfg["precise_acc"], bk), "stride_xk": 1,
              ("stride_wn" if kn else "stride_wk"): 1}  # unit strides: constants at run time too
    ptrs = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "ws_ptr": "*fp32", "acc_ptr": "*fp32"}
    values = {"M": m, "N": n, "K": k, "k_per_split": k_per, "stride_xb": m * k, "stride_xm": k, "stride_wb": n * k,
              ("stride_wk" if kn else "stride_wn"): n if kn else k}
    facts = compile_facts(_fp8_rowwise_bmm_splitk_kernel, types=ptrs, constexprs=consts, divisible=list(ptrs),
                          values=values, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], arch=arch)
    return {"arch": arch, "config": cfg, "kernels": [facts]}
