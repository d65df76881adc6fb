"""Triton port (sm_90) of the batched fp8 rowwise GEMM: all batches in one launch.

One program computes one (BLOCK_M x BLOCK_N) output tile of one batch; the batch is the grid's
second axis, so B batches cost one launch instead of B (the per-batch `torch._scaled_mm` loop pays
B launches and B cuBLAS heuristic lookups). The fp32 accumulator is scaled once in the epilogue
by the per-row activation scale and the per-column weight scale, then rounded to bf16.

Weights are (B, N, K) with K contiguous: that is already the K-major operand layout Hopper's fp8
wgmma needs, so ``prepare_weights`` is an explicit, optional caller step (contiguity, or the
(B, K, N) layout kept for ablation). Nothing is cached behind the caller's back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from skillrun_kernels.protocol import KernelLaunch

KERNEL_NAME = "_fp8_rowwise_bmm_kernel"
EXPECT_KERNELS = rf"^{KERNEL_NAME}$"


@triton.jit
def _fp8_rowwise_bmm_kernel(
    x_ptr, w_ptr, xs_ptr, ws_ptr, out_ptr,
    M, N, K,
    stride_xb, stride_xm, stride_xk,
    stride_wb, stride_wn, stride_wk,
    stride_ob, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISE_ACC: tl.constexpr,
):
    pid = tl.program_id(0)
    bid = tl.program_id(1).to(tl.int64)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    # Grouped raster: GROUP_M row tiles share each weight tile while it is hot in L2.
    per_group = GROUP_M * tiles_n
    group = pid // per_group
    first_m = group * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Wrapped row/column indices keep every load in bounds without masks; the store is masked.
    rows = offs_m % M
    cols = offs_n % N
    x_ptrs = x_ptr + bid * stride_xb + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + bid * stride_wb + cols[None, :] * stride_wn + offs_k[:, None] * stride_wk

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(x_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_left = K - kt * BLOCK_K
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            w = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if PRECISE_ACC > 0:
            # sm_90 fp8 wgmma adds into its accumulator with ~14 significant bits; Triton's default
            # for fp8 dots there is no promotion at all (max_num_imprecise_acc = 2**30). With a bound,
            # the lowering accumulates each PRECISE_ACC-deep slice of K into a zeroed partial and
            # adds that into `acc` with full fp32 adds (DeepSeek-V3 §3.3.2). mma.sync tiles
            # (BLOCK_M < 64) ignore it: they accumulate in fp32 already.
            acc = tl.dot(a, w, acc, max_num_imprecise_acc=PRECISE_ACC)
        else:
            acc = tl.dot(a, w, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    xs = tl.load(xs_ptr + bid * M + rows)
    ws = tl.load(ws_ptr + bid * N + cols)
    res = acc * xs[:, None] * ws[None, :]
    o_ptrs = out_ptr + bid * stride_ob + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(o_ptrs, res.to(out_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class PreparedWeights:
    """Weights after the caller's explicit preparation step. ``layout`` is "nk" (B, N, K) or "kn" (B, K, N)."""

    data: torch.Tensor
    layout: str = "nk"

    def strides(self) -> tuple[int, int, int]:
        """(batch, n, k) element strides of the underlying tensor."""
        s = self.data.stride()
        return (s[0], s[1], s[2]) if self.layout == "nk" else (s[0], s[2], s[1])

    @property
    def n(self) -> int:
        return self.data.shape[1] if self.layout == "nk" else self.data.shape[2]

    @property
    def k(self) -> int:
        return self.data.shape[2] if self.layout == "nk" else self.data.shape[1]


def prepare_weights(wq: torch.Tensor, layout: str = "nk") -> PreparedWeights:
    """Explicit weight preparation, done once by the caller (never cached here).

    "nk": a contiguous (B, N, K) copy (K-major, what sm_90 fp8 wgmma consumes directly);
    "kn": a (B, K, N) transposed copy, kept only to measure what the other layout costs.
    """
    if wq.dim() != 3:
        raise ValueError(f"wq must be (B, N, K), got shape {tuple(wq.shape)}")
    if wq.dtype != torch.float8_e4m3fn:
        raise TypeError(f"wq must be float8_e4m3fn, got {wq.dtype}")
    if layout == "nk":
        return PreparedWeights(wq.contiguous(), "nk")
    if layout == "kn":
        return PreparedWeights(wq.transpose(1, 2).contiguous(), "kn")
    raise ValueError(f"layout must be 'nk' or 'kn', got {layout!r}")


# K depth from which the port promotes the fp8 accumulator by default. At K=8192 the unpromoted
# wgmma sum put 3-7 of 2.6M outputs past atol=rtol=1e-2 on the H200 (cuBLAS rowwise identically);
# at K=1024 every implementation stayed inside it.
PRECISE_ACC_MIN_K = 2048
PRECISE_ACC_DEFAULT = 128


def default_precise_acc(k: int) -> int | None:
    """Promotion interval (elements of K) the port uses when a config does not say: None = off."""
    return PRECISE_ACC_DEFAULT if k >= PRECISE_ACC_MIN_K else None


def _cfg(bm: int, bn: int, bk: int, gm: int, warps: int, stages: int, precise_acc: int | None) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": gm, "num_warps": warps, "num_stages": stages,
            "precise_acc": precise_acc}


# Sweep winners on the H200 (benchmarks/bench_fp8_rowwise_batched_sm90.py --sweep, B=16; N=1280/K=8192
# first measured at commit f95b066, both classes re-swept at commit 4068027, whose graph-replay times
# are in the comments). Keyed by (N, K) -> [(largest M covered, config)]; buckets are the skill
# card's M classes, each measured at one M. The sweep ran without promotion; at K=8192 the recipes
# promote every 128 of K (parity, see default_precise_acc), which cost 1.10x at M=128 (64x128 tile). Shapes with no entry get a regime
# default and are reported as untuned.
_P = PRECISE_ACC_DEFAULT
TUNED: dict[tuple[int, int], list[tuple[int, dict]]] = {
    (1280, 8192): [
        (16, _cfg(16, 128, 256, 1, 4, 3, _P)),     # M=1: 58.3 us (mma.sync: fp32 accumulation anyway)
        (64, _cfg(64, 128, 128, 1, 4, 4, _P)),     # M=32: 59.7 us
        (256, _cfg(64, 128, 128, 8, 4, 4, _P)),    # M=128: 80.2 us
        (768, _cfg(128, 128, 128, 8, 4, 4, _P)),   # M=512: 155.6 us
        # M >= 1024: the unpromoted winner 128x256 (253.5 / 979.9 us) spills once promotion doubles its
        # accumulator registers (255 regs + 408 B spill, compile check) and ran 804.1 us at M=1024;
        # 256x128 promoted ran 349.9 us there (no spill), same session (commit 19e3d27).
        (1024, _cfg(256, 128, 128, 8, 8, 3, _P)),
        (4096, _cfg(256, 128, 128, 8, 8, 3, _P)),  # promoted time at M=4096 not measured
    ],
    (8192, 1024): [
        (16, _cfg(16, 128, 256, 1, 4, 3, None)),     # M=1: 48.9 us
        (64, _cfg(64, 128, 128, 1, 4, 4, None)),     # M=32: 52.8 us
        (256, _cfg(128, 64, 128, 8, 4, 4, None)),    # M=128: 68.9 us
        (768, _cfg(128, 256, 128, 8, 8, 3, None)),   # M=512: 170.1 us
        (1024, _cfg(128, 256, 128, 8, 8, 3, None)),  # M=1024: 303.0 us
        (4096, _cfg(128, 256, 128, 8, 8, 3, None)),  # M=4096: 1130.1 us, slower than the _scaled_mm loop
    ],
}

DEFAULT_SMALL_M = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}
DEFAULT_MID_M = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 4}
DEFAULT_LARGE_M = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4}


def pick_config(batch: int, m: int, n: int, k: int) -> tuple[dict, bool]:
    """The config for a shape and whether it was tuned (a measured entry) or a fallback."""
    for max_m, cfg in TUNED.get((n, k), []):
        if m <= max_m:
            return dict(cfg), True
    base = DEFAULT_SMALL_M if m <= 32 else DEFAULT_MID_M if m <= 256 else DEFAULT_LARGE_M
    return {**base, "precise_acc": default_precise_acc(k)}, False


def _precise_acc_constexpr(precise_acc: int | None, block_k: int) -> int:
    """The kernel's PRECISE_ACC: 0 = hardware accumulation, else promote every min(value, BLOCK_K) of K.

    Triton requires the bound to be <= the dot's K (BLOCK_K), and always promotes at the end of a
    dot, so a larger request is served at BLOCK_K.
    """
    if precise_acc is None or precise_acc == 0:
        return 0
    if isinstance(precise_acc, bool) or not isinstance(precise_acc, int) or precise_acc < 0:
        raise ValueError(f"config precise_acc must be None or a positive int (elements of K), got {precise_acc!r}")
    return min(precise_acc, block_k)


def check_operands(xq: torch.Tensor, pw: PreparedWeights, x_scale: torch.Tensor, w_scale: torch.Tensor) -> tuple[int, int, int, int]:
    """(B, M, N, K) of a batched rowwise call, or a clear error naming the operand that does not fit."""
    if xq.dim() != 3 or pw.data.dim() != 3:
        raise ValueError(f"xq must be (B, M, K) and wq (B, N, K); got {tuple(xq.shape)} and {tuple(pw.data.shape)}")
    bsz, m, k = xq.shape
    n = pw.n
    if pw.data.shape[0] != bsz or pw.k != k:
        raise ValueError(f"batch/K mismatch: xq {tuple(xq.shape)} vs weights {tuple(pw.data.shape)} ({pw.layout})")
    if xq.dtype != torch.float8_e4m3fn or pw.data.dtype != torch.float8_e4m3fn:
        raise TypeError(f"operands must be float8_e4m3fn, got {xq.dtype} and {pw.data.dtype}")
    if tuple(x_scale.shape) != (bsz, m) or tuple(w_scale.shape) != (bsz, n):
        raise ValueError(
            f"x_scale must be (B, M)=({bsz}, {m}) and w_scale (B, N)=({bsz}, {n}); "
            f"got {tuple(x_scale.shape)} and {tuple(w_scale.shape)}"
        )
    if x_scale.dtype != torch.float32 or w_scale.dtype != torch.float32:
        raise TypeError("x_scale and w_scale must be float32")
    return bsz, m, n, k


def fp8_rowwise_batched_gemm(
    xq: torch.Tensor,
    w: PreparedWeights | torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """out[b] = (xq[b] @ wq[b].T) * x_scale[b][:, None] * w_scale[b][None, :], bf16, one launch.

    ``w`` is the result of :func:`prepare_weights`, or a raw (B, N, K) tensor used as is.
    ``config["precise_acc"]``: promote the fp8 wgmma accumulator to fp32 every that many elements
    of K (None = never); absent, :func:`default_precise_acc` decides by K.
    """
    if bias is not None:
        raise NotImplementedError(
            "fp8_rowwise_batched_gemm: bias is not supported by the Triton sm_90 port; "
            "add it to the bf16 output yourself"
        )
    pw = w if isinstance(w, PreparedWeights) else PreparedWeights(w, "nk")
    bsz, m, n, k = check_operands(xq, pw, x_scale, w_scale)
    x_scale = x_scale.contiguous()
    w_scale = w_scale.contiguous()
    if out is None:
        out = torch.empty(bsz, m, n, dtype=torch.bfloat16, device=xq.device)
    cfg = dict(config) if config else pick_config(bsz, m, n, k)[0]
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    precise = _precise_acc_constexpr(cfg.get("precise_acc", default_precise_acc(k)), bk)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), bsz)
    swb, swn, swk = pw.strides()
    _fp8_rowwise_bmm_kernel[grid](
        xq, pw.data, x_scale, w_scale, out,
        m, n, k,
        xq.stride(0), xq.stride(1), xq.stride(2),
        swb, swn, swk,
        out.stride(0), out.stride(1), out.stride(2),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.get("GROUP_M", 8),
        EVEN_K=(k % bk == 0), PRECISE_ACC=precise,
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3),
    )
    return out


def build(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Builder (kernels/protocol.py): explicit weight preparation in ``prepare``, one launch in ``run``."""
    b, m, n, k = (int(shape[key]) for key in ("batch", "M", "N", "K"))
    cfg = dict(config or {})
    layout = cfg.pop("w_layout", "nk")
    tuned = True
    if not all(key in cfg for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K")):
        base, tuned = pick_config(b, m, n, k)
        cfg = {**base, **cfg}
    cfg.setdefault("precise_acc", default_precise_acc(k))
    _precise_acc_constexpr(cfg["precise_acc"], cfg["BLOCK_K"])  # a bad value fails here, not at launch

    def prepare(inputs: dict) -> dict:
        return {
            "xq": inputs["xq"],
            "w": prepare_weights(inputs["wq"], layout),
            "x_scale": inputs["x_scale"],
            "w_scale": inputs["w_scale"],
        }

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        return fp8_rowwise_batched_gemm(p["xq"], p["w"], p["x_scale"], p["w_scale"], out=out, config=cfg)

    return KernelLaunch(
        name="triton_sm90_fp8_rowwise_batched",
        run=run,
        prepare=prepare,
        expect_kernels=EXPECT_KERNELS,
        describe={"backend": "triton", "config": {**cfg, "w_layout": layout}, "tuned": tuned},
    )


def resolved_config(shape: dict, config: dict | None) -> dict:
    """The config ``build`` launches for this shape (tuned entry or regime default under the card's keys)."""
    b, m, n, k = (int(shape[key]) for key in ("batch", "M", "N", "K"))
    cfg = dict(config or {})
    cfg.setdefault("w_layout", "nk")
    if not all(key in cfg for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K")):
        cfg = {**pick_config(b, m, n, k)[0], **cfg}
    cfg.setdefault("precise_acc", default_precise_acc(k))
    return cfg


def compile_only(shape: dict, config: dict | None = None, arch: str = "sm_90a") -> dict:
    """Compile the kernel ``build(shape, config)`` would launch for ``arch`` (no GPU) and return its
    static facts (kernels/protocol.py): registers, spills, shared memory, wgmma vs mma.sync."""
    from skillrun_kernels._triton.compile import compile_facts

    cfg = resolved_config(shape, config)
    bk = cfg["BLOCK_K"]
    kn = cfg["w_layout"] == "kn"
    # Unit strides are specialised to the constant 1 by the JIT at run time, as here.
    _b, m, n, k = (int(shape[key]) for key in ("batch", "M", "N", "K"))
    consts = {"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_K": bk, "GROUP_M": cfg.get("GROUP_M", 8),
              "EVEN_K": k % bk == 0, "PRECISE_ACC": _precise_acc_constexpr(cfg["precise_acc"], bk),
              "stride_xk": 1, "stride_on": 1, ("stride_wn" if kn else "stride_wk"): 1}
    ptrs = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "ws_ptr": "*fp32", "out_ptr": "*bf16"}
    # the launch's operands are contiguous (prepare_weights), so their strides follow from the shape
    values = {"M": m, "N": n, "K": k, "stride_xb": m * k, "stride_xm": k, "stride_wb": n * k,
              ("stride_wk" if kn else "stride_wn"): n if kn else k, "stride_ob": m * n, "stride_om": n}
    facts = compile_facts(_fp8_rowwise_bmm_kernel, types=ptrs, constexprs=consts, divisible=list(ptrs), values=values,
                          num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3), arch=arch)
    return {"arch": arch, "config": cfg, "kernels": [facts]}
