"""Triton port of the fp8 block-scale GEMM for Hopper (sm_90).

    C[M, N] bf16 = A[M, K] fp8 e4m3 x B[N, K]^T fp8 e4m3,  a_scale (M, K/128), b_scale (N/128, K/128)

Numerics (the DeepSeek recipe, same as cuBLAS block-wise and DeepGEMM): one unscaled fp8 wgmma
chain per 128-deep K block into a fresh fp32 partial, then an fp32 promote
``acc = fma(partial, sa * sb, acc)``. Operands are never pre-scaled.

One kernel, several compile-time variants (all chosen per shape class from measurement):

* ``PERSISTENT``: one program per SM walking the tiles in grouped order (GROUP_M, a runtime arg);
  otherwise one program per (tile, split).
* ``PAIR``: two K blocks per loop iteration, written so that Triton's wgmma pipeliner keeps the
  second block's wgmma in flight while the first block's partial is promoted (see ``_k_loop_pair``).
* ``NSUB = 2``: a 256-wide N tile as two 128-wide dots, so each dot has one scalar B scale and
  only one partial is live at a time (register budget).
* ``USE_SPLIT``: split-K over a runtime SPLIT_K for skinny (decode) shapes; partials go to an fp32
  workspace and the last program of a tile (an atomic ticket) sums them in a fixed order.

A and B are read through host-built TMA tensor descriptors (out-of-range rows of a ragged M or N
tile are zero-filled by the copy engine); scales and C use plain masked loads and stores.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from skillrun_kernels.fp8_blockscale_gemm import problem
from skillrun_kernels.protocol import KernelLaunch, UnsupportedShape

BK = problem.BLOCK
KERNEL_NAME = "_fp8_blockscale_gemm_sm90"


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M):
    # Grouped raster: GROUP_M row-tiles share each column-tile while it is hot in L2.
    in_group = GROUP_M * num_pid_n
    group = tile_id // in_group
    first_m = group * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % in_group) % group_m
    pid_n = (tile_id % in_group) // group_m
    return pid_m, pid_n


@triton.jit
def _row_scale(sa_ptr, sb_ptr, offs_m, M, col_block, kb, stride_sam, stride_sak, stride_sbn, stride_sbk):
    # sa[m, kb] * sb[col_block, kb]: the per-row multiplier of one K block's partial.
    sa = tl.load(sa_ptr + offs_m * stride_sam + kb * stride_sak, mask=offs_m < M, other=0.0)
    sb = tl.load(sb_ptr + col_block * stride_sbn + kb * stride_sbk)
    return sa * sb


@triton.jit
def _load_tile(src, off_r, k, n_rows, ld, ROWS: tl.constexpr, BK: tl.constexpr, TMA: tl.constexpr):
    # TMA: a host-built tensor descriptor (the copy engine zero-fills rows past n_rows).
    # Otherwise ``src`` is a plain pointer and the pipeliner uses cp.async with a row mask.
    if TMA:
        return src.load([off_r, k])
    else:
        r = off_r + tl.arange(0, ROWS)
        c = k + tl.arange(0, BK)
        return tl.load(src + r[:, None] * ld + c[None, :], mask=(r < n_rows)[:, None], other=0.0)


@triton.jit
def _k_loop_plain(a_desc, b_desc, sa_ptr, sb_ptr, off_m, off_n, offs_m, M, N, K, kb_lo, kb_hi,
                  stride_sam, stride_sak, stride_sbn, stride_sbk,
                  BM: tl.constexpr, SUB_N: tl.constexpr, NSUB: tl.constexpr, BK: tl.constexpr,
                  STAGES: tl.constexpr, WS: tl.constexpr, TMA: tl.constexpr, DIAG: tl.constexpr):
    acc0 = tl.zeros((BM, SUB_N), dtype=tl.float32)
    acc1 = tl.zeros((BM, SUB_N), dtype=tl.float32)
    for kb in tl.range(kb_lo, kb_hi, num_stages=STAGES, warp_specialize=WS):
        k = kb * BK
        a = _load_tile(a_desc, off_m, k, M, K, BM, BK, TMA)
        b0 = _load_tile(b_desc, off_n, k, N, K, SUB_N, BK, TMA)
        if DIAG:
            # Diagnostic only (ignores the scales): the same data movement and wgmma with the
            # accumulation left in the tensor cores, i.e. this tile's ceiling without the promote.
            acc0 = tl.dot(a, b0.T, acc0)
        else:
            s0 = _row_scale(sa_ptr, sb_ptr, offs_m, M, off_n // BK, kb, stride_sam, stride_sak, stride_sbn, stride_sbk)
            p0 = tl.dot(a, b0.T)
            acc0 = tl.fma(p0, s0[:, None], acc0)
        if NSUB == 2:
            b1 = _load_tile(b_desc, off_n + SUB_N, k, N, K, SUB_N, BK, TMA)
            s1 = _row_scale(sa_ptr, sb_ptr, offs_m, M, (off_n + SUB_N) // BK, kb, stride_sam, stride_sak,
                            stride_sbn, stride_sbk)
            p1 = tl.dot(a, b1.T)
            acc1 = tl.fma(p1, s1[:, None], acc1)
    return acc0, acc1


@triton.jit
def _k_loop_pair(a_desc, b_desc, sa_ptr, sb_ptr, off_m, off_n, offs_m, M, N, K, kb_lo, kb_hi,
                 stride_sam, stride_sak, stride_sbn, stride_sbk,
                 BM: tl.constexpr, SUB_N: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
                 TMA: tl.constexpr):
    # Two K blocks per iteration. The first dot's partial is used in the loop, so Triton waits
    # for it at once (wgmma wait 0); the second dot's partial is only carried to the next
    # iteration and first read after that wait, so Triton's pipeliner leaves it in flight (its
    # "properly async" rule 3b) and the PTX has block 2j's promote issued while block 2j+1's
    # wgmma group is pending (compile_only: fma_while_wgmma_pending = 64).
    # ptxas then undoes it: C7515 "wgmma.mma_async instructions are serialized due to non wgmma
    # instructions defining accumulator registers" (every wgmma waits), and 544-775 TF against
    # 788-805 for the plain loop on the H200. Issuing the second dot before the carried promote
    # instead gives C7514 (the loop-carried copy reads the in-flight accumulator) and spills.
    # Kept as the measured ablation; no recipe selects it.
    cb = off_n // BK
    acc = tl.zeros((BM, SUB_N), dtype=tl.float32)
    odd = (kb_hi - kb_lo) % 2
    if odd == 1:  # an odd block count: the first block seeds the carried partial
        a = _load_tile(a_desc, off_m, kb_lo * BK, M, K, BM, BK, TMA)
        b = _load_tile(b_desc, off_n, kb_lo * BK, N, K, SUB_N, BK, TMA)
        s_carry = _row_scale(sa_ptr, sb_ptr, offs_m, M, cb, kb_lo, stride_sam, stride_sak, stride_sbn, stride_sbk)
        p_carry = tl.dot(a, b.T)
    else:
        s_carry = tl.zeros((BM,), dtype=tl.float32)
        p_carry = tl.zeros((BM, SUB_N), dtype=tl.float32)
    for kb in tl.range(kb_lo + odd, kb_hi, 2, num_stages=STAGES):
        k0 = kb * BK
        a0 = _load_tile(a_desc, off_m, k0, M, K, BM, BK, TMA)
        b0 = _load_tile(b_desc, off_n, k0, N, K, SUB_N, BK, TMA)
        a1 = _load_tile(a_desc, off_m, k0 + BK, M, K, BM, BK, TMA)
        b1 = _load_tile(b_desc, off_n, k0 + BK, N, K, SUB_N, BK, TMA)
        s0 = _row_scale(sa_ptr, sb_ptr, offs_m, M, cb, kb, stride_sam, stride_sak, stride_sbn, stride_sbk)
        s1 = _row_scale(sa_ptr, sb_ptr, offs_m, M, cb, kb + 1, stride_sam, stride_sak, stride_sbn, stride_sbk)
        p0 = tl.dot(a0, b0.T)
        acc = tl.fma(p_carry, s_carry[:, None], acc)
        p1 = tl.dot(a1, b1.T)
        acc = tl.fma(p0, s0[:, None], acc)
        p_carry = p1
        s_carry = s1
    acc = tl.fma(p_carry, s_carry[:, None], acc)
    return acc


@triton.jit
def _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn):
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(tl.bfloat16), mask=mask)


# M, K and the strides that follow them are not specialised, so one binary serves every shape of
# a config (compile once, sweep many shapes; decode M = 1 is not a separate kernel). N IS
# specialised (divisibility by 16): the store mask on the N edge needs it to vectorise. Without
# it every bf16 of C was a separate 2-byte st.global and output-heavy shapes (16384x7168x768,
# 4096x65536x1536) ran at a third of their speed, even with the promote removed (H200 run 1).
@triton.jit(do_not_specialize=["M", "K", "stride_sak", "stride_sbn", "GROUP_M", "NUM_SMS", "SPLIT_K"])
def _fp8_blockscale_gemm_sm90(
    a_desc, b_desc, sa_ptr, sb_ptr, c_ptr, ws_ptr, ticket_ptr,
    M, N, K,
    stride_sam, stride_sak, stride_sbn, stride_sbk, stride_cm, stride_cn,
    GROUP_M, NUM_SMS, SPLIT_K,
    BM: tl.constexpr, BN: tl.constexpr, NSUB: tl.constexpr, BK: tl.constexpr,
    STAGES: tl.constexpr, PERSISTENT: tl.constexpr, PAIR: tl.constexpr, WS: tl.constexpr,
    USE_SPLIT: tl.constexpr, FLATTEN: tl.constexpr, TMA: tl.constexpr, DIAG: tl.constexpr,
):
    SUB_N: tl.constexpr = BN // NSUB
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_tiles = num_pid_m * num_pid_n
    num_kb = K // BK
    if PERSISTENT:
        for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=FLATTEN):
            pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BM
            off_n = pid_n * BN
            offs_m = off_m + tl.arange(0, BM)
            offs_n = off_n + tl.arange(0, SUB_N)
            if PAIR:
                acc0 = _k_loop_pair(a_desc, b_desc, sa_ptr, sb_ptr, off_m, off_n, offs_m, M, N, K, 0, num_kb,
                                    stride_sam, stride_sak, stride_sbn, stride_sbk, BM, SUB_N, BK, STAGES, TMA)
                _store_tile(c_ptr, acc0, offs_m, offs_n, M, N, stride_cm, stride_cn)
            else:
                acc0, acc1 = _k_loop_plain(a_desc, b_desc, sa_ptr, sb_ptr, off_m, off_n, offs_m, M, N, K, 0, num_kb,
                                           stride_sam, stride_sak, stride_sbn, stride_sbk,
                                           BM, SUB_N, NSUB, BK, STAGES, WS, TMA, DIAG)
                _store_tile(c_ptr, acc0, offs_m, offs_n, M, N, stride_cm, stride_cn)
                if NSUB == 2:
                    _store_tile(c_ptr, acc1, offs_m, offs_n + SUB_N, M, N, stride_cm, stride_cn)
    else:
        tile_id = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        offs_m = off_m + tl.arange(0, BM)
        offs_n = off_n + tl.arange(0, SUB_N)
        kb_lo = 0
        kb_hi = num_kb
        if USE_SPLIT:
            per = tl.cdiv(num_kb, SPLIT_K)
            kb_lo = pid_k * per
            kb_hi = tl.minimum(kb_lo + per, num_kb)
        if PAIR:
            acc0 = _k_loop_pair(a_desc, b_desc, sa_ptr, sb_ptr, off_m, off_n, offs_m, M, N, K, kb_lo, kb_hi,
                                stride_sam, stride_sak, stride_sbn, stride_sbk, BM, SUB_N, BK, STAGES, TMA)
            acc1 = acc0
        else:
            acc0, acc1 = _k_loop_plain(a_desc, b_desc, sa_ptr, sb_ptr, off_m, off_n, offs_m, M, N, K, kb_lo, kb_hi,
                                       stride_sam, stride_sak, stride_sbn, stride_sbk,
                                       BM, SUB_N, NSUB, BK, STAGES, WS, TMA, DIAG)
        if USE_SPLIT:
            # Each split writes its fp32 partial; the last to take a ticket sums all splits in
            # split order (deterministic) and resets the ticket for the next launch.
            mn = M * N
            mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
            w_off = offs_m[:, None] * N + offs_n[None, :]
            tl.store(ws_ptr + pid_k * mn + w_off, acc0, mask=mask)
            if NSUB == 2:
                tl.store(ws_ptr + pid_k * mn + w_off + SUB_N, acc1, mask=mask & ((offs_n + SUB_N) < N)[None, :])
            tl.debug_barrier()
            ticket = tl.atomic_add(ticket_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLIT_K - 1:
                tot0 = tl.zeros((BM, SUB_N), dtype=tl.float32)
                tot1 = tl.zeros((BM, SUB_N), dtype=tl.float32)
                for s in range(0, SPLIT_K):
                    tot0 += tl.load(ws_ptr + s * mn + w_off, mask=mask, other=0.0, cache_modifier=".cg")
                    if NSUB == 2:
                        tot1 += tl.load(ws_ptr + s * mn + w_off + SUB_N, mask=mask & ((offs_n + SUB_N) < N)[None, :],
                                        other=0.0, cache_modifier=".cg")
                _store_tile(c_ptr, tot0, offs_m, offs_n, M, N, stride_cm, stride_cn)
                if NSUB == 2:
                    _store_tile(c_ptr, tot1, offs_m, offs_n + SUB_N, M, N, stride_cm, stride_cn)
                tl.atomic_xchg(ticket_ptr + tile_id, 0, sem="relaxed", scope="gpu")
        else:
            _store_tile(c_ptr, acc0, offs_m, offs_n, M, N, stride_cm, stride_cn)
            if NSUB == 2:
                _store_tile(c_ptr, acc1, offs_m, offs_n + SUB_N, M, N, stride_cm, stride_cn)


# --------------------------------------------------------------------------------------------
# Host side


@dataclass(frozen=True)
class Config:
    """One compile-time variant plus its launch knobs. Field names are what cards write."""

    BM: int = 128
    BN: int = 128
    NSUB: int = 1
    num_warps: int = 8
    stages: int = 4
    persistent: bool = True
    pair: bool = False
    ws: bool = False
    flatten: bool = False
    tma: bool = True  # False: pointer loads through cp.async (the TMA ablation)
    diag_nopromote: bool = False  # diagnostic: skip the block scales (wrong numbers; a ceiling)
    group_m: int = 8
    split_k: int = 1
    ctas_per_sm: int = 1  # persistent grid = min(tiles, SMs x this); 2 lets two small CTAs share an SM

    @staticmethod
    def from_dict(d: dict | None) -> "Config":
        d = dict(d or {})
        known = set(Config.__dataclass_fields__)
        extra = set(d) - known
        if extra:
            raise ValueError(f"triton_sm90 config: unknown key(s) {sorted(extra)} (known: {sorted(known)})")
        return Config(**d)

    def check(self) -> None:
        if self.BN % self.NSUB or ((self.BN // self.NSUB) > BK and not self.diag_nopromote):
            raise ValueError(f"triton_sm90 config: BN={self.BN} / NSUB={self.NSUB} must give a sub-tile <= {BK}")
        if self.diag_nopromote and (self.pair or self.split_k > 1):
            raise ValueError("triton_sm90 config: diag_nopromote is for the plain loop only")
        if self.pair and self.NSUB != 1:
            raise ValueError("triton_sm90 config: pair=True needs NSUB=1 (one extra partial must fit in registers)")
        if self.persistent and self.split_k > 1:
            raise ValueError("triton_sm90 config: split_k > 1 needs persistent=False")
        if self.BM not in (16, 32, 64, 128, 256) or self.BN not in (32, 64, 128, 256):
            raise ValueError(f"triton_sm90 config: BM={self.BM}, BN={self.BN} not supported")

    def as_dict(self) -> dict:
        return asdict(self)


# Per-shape-class defaults: the configs the H200 sweep picked (run 2, commit ceb7b8a; NOTES.md has
# the tables). The card's recipes carry the same values and are the authority for planning; this
# is what ``build`` uses when it is given no config.
def default_config(shape: dict) -> Config:
    M, N, K = problem.check_shape(shape)
    if M <= 16:  # decode: mma v2 on a 16-row tile, split-K to put ~2 CTAs on every SM
        if K <= 2048:
            return Config(BM=16, BN=128, num_warps=4, stages=4, persistent=False, split_k=2, group_m=1)
        return Config(BM=16, BN=64, num_warps=4, stages=4, persistent=False, split_k=8, group_m=1)
    if M <= 64:
        return Config(BM=64, BN=64, num_warps=4, stages=6, persistent=False, split_k=1 if K <= 2048 else 4, group_m=1)
    if M <= 256:
        if K <= 2048:
            return Config(BM=64, BN=64, num_warps=4, stages=6, persistent=False, split_k=1, group_m=1)
        return Config(BM=128, BN=64, num_warps=4, stages=6, persistent=False, split_k=4, group_m=1)
    # Prefill: 64x128 tiles, one warpgroup per CTA, three CTAs per SM (independent CTAs hide each
    # other's promote; 128x128 tiles cannot: one CTA per SM, both warpgroups in lockstep).
    if N <= 2048 and K >= 4096 and M >= 8192:
        return Config(BM=64, BN=128, num_warps=4, stages=3, persistent=False, group_m=32)
    group = 8 if N >= 32768 else (16 if K <= 1024 else 4)
    return Config(BM=64, BN=128, num_warps=4, stages=3, persistent=True, ctas_per_sm=3, group_m=group)


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def _descriptor(t: torch.Tensor, block: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), block)


def prepare_operands(inputs: dict, cfg: Config) -> dict:
    """Kernel operands from problem inputs (untimed): TMA descriptors, M-major activation scales
    (coalesced per-K-block reads; the layout cuBLAS and DeepGEMM also take), workspace, tickets."""
    a, b = inputs["a"].contiguous(), inputs["b"].contiguous()
    M, K = a.shape
    N = b.shape[0]
    sa = inputs["a_scale"].float()
    sa_mn = sa.t().contiguous().t()  # shape (M, K/128), strides (1, M)
    sb = inputs["b_scale"].float().contiguous()
    dev = a.device
    prep = {
        "a": a, "b": b, "sa": sa_mn, "sb": sb, "M": M, "N": N, "K": K,
        "a_desc": _descriptor(a, [cfg.BM, BK]) if cfg.tma else a,
        "b_desc": _descriptor(b, [cfg.BN // cfg.NSUB, BK]) if cfg.tma else b,
        "ws": torch.empty(1, device=dev, dtype=torch.float32),
        "tickets": torch.zeros(1, device=dev, dtype=torch.int32),
    }
    if cfg.split_k > 1:
        tiles = -(-M // cfg.BM) * -(-N // cfg.BN)
        prep["ws"] = torch.empty((cfg.split_k, M, N), device=dev, dtype=torch.float32)
        prep["tickets"] = torch.zeros(tiles, device=dev, dtype=torch.int32)
    return prep


def launch(prep: dict, out: torch.Tensor, cfg: Config, num_sms: int | None = None) -> torch.Tensor:
    M, N, K = prep["M"], prep["N"], prep["K"]
    tiles = -(-M // cfg.BM) * -(-N // cfg.BN)
    if cfg.persistent:
        nsm = num_sms or (_sm_count(out.device) if out.is_cuda else 4)
        grid = (min(nsm * cfg.ctas_per_sm, tiles), 1)
    else:
        nsm = 1
        grid = (tiles, cfg.split_k)
    _fp8_blockscale_gemm_sm90[grid](
        prep["a_desc"], prep["b_desc"], prep["sa"], prep["sb"], out, prep["ws"], prep["tickets"],
        M, N, K,
        prep["sa"].stride(0), prep["sa"].stride(1), prep["sb"].stride(0), prep["sb"].stride(1),
        out.stride(0), out.stride(1),
        cfg.group_m, grid[0] if cfg.persistent else nsm, cfg.split_k,
        BM=cfg.BM, BN=cfg.BN, NSUB=cfg.NSUB, BK=BK, STAGES=cfg.stages, PERSISTENT=cfg.persistent,
        PAIR=cfg.pair, WS=cfg.ws, USE_SPLIT=cfg.split_k > 1, FLATTEN=cfg.flatten, TMA=cfg.tma,
        DIAG=cfg.diag_nopromote, num_warps=cfg.num_warps, num_stages=cfg.stages,
    )
    return out


def build(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """The port as a KernelLaunch; ``config`` keys are :class:`Config` fields (missing: shape default)."""
    M, N, K = problem.check_shape(shape)
    # A given config is complete on its own (unset fields take the Config defaults); mixing it
    # with the shape default would silently combine knobs from two recipes.
    cfg = Config.from_dict(config) if config else default_config(shape)
    cfg.check()
    if K % BK:
        raise UnsupportedShape(f"K={K} is not a multiple of {BK}")

    def prepare(inputs: dict) -> Any:
        return prepare_operands(inputs, cfg)

    def run(prep: Any, out: torch.Tensor) -> torch.Tensor:
        return launch(prep, out, cfg)

    return KernelLaunch(
        name="triton_sm90",
        run=run,
        prepare=prepare,
        expect_kernels=KERNEL_NAME,
        describe={"backend": "triton", "config": cfg.as_dict(), "kernel": KERNEL_NAME},
    )


# --------------------------------------------------------------------------------------------
# Static facts without a GPU: compile for sm_90 here and read the resource usage and the wgmma
# structure. This is how the variants were screened before any device time was spent.


def _signature(cfg: Config) -> tuple[dict, dict, dict]:
    sub_n = cfg.BN // cfg.NSUB
    sig: dict[str, str] = {}
    attrs: dict = {}
    names = _fp8_blockscale_gemm_sm90.arg_names
    aligned = {"a_desc", "b_desc", "sa_ptr", "sb_ptr", "c_ptr", "ws_ptr", "ticket_ptr", "stride_cm", "N"}
    types = {
        "a_desc": f"tensordesc<fp8e4nv[{cfg.BM}, {BK}]>" if cfg.tma else "*fp8e4nv",
        "b_desc": f"tensordesc<fp8e4nv[{sub_n}, {BK}]>" if cfg.tma else "*fp8e4nv",
        "sa_ptr": "*fp32", "sb_ptr": "*fp32", "c_ptr": "*bf16", "ws_ptr": "*fp32", "ticket_ptr": "*i32",
    }
    constexprs = {"BM": cfg.BM, "BN": cfg.BN, "NSUB": cfg.NSUB, "BK": BK, "STAGES": cfg.stages,
                  "PERSISTENT": cfg.persistent, "PAIR": cfg.pair, "WS": cfg.ws, "USE_SPLIT": cfg.split_k > 1,
                  "FLATTEN": cfg.flatten, "TMA": cfg.tma, "DIAG": cfg.diag_nopromote,
                  # strides of unit value are specialised to constants by the JIT, as on the device
                  "stride_sam": 1, "stride_sbk": 1, "stride_cn": 1}
    for i, n in enumerate(names):
        if n in constexprs:
            sig[n] = "constexpr"
        else:
            sig[n] = types.get(n, "i32")
            if n in aligned:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


def _fma_while_pending(ptx: str) -> int:
    """fp32 FMAs issued (in program order) between a wgmma commit and the next wait: promote work
    the CUDA cores do while the tensor cores still run a group. 0 means no promote is overlapped."""
    pending = False
    count = 0
    for line in ptx.splitlines():
        if "wgmma.commit_group" in line:
            pending = True
        elif "wgmma.wait_group" in line:
            pending = False
        elif pending and "fma.rn.f32" in line:
            count += 1
    return count


def compile_only(shape: dict | None = None, config: dict | None = None, arch: str = "sm_90") -> dict:
    """Compile one variant for ``arch`` on this machine (no GPU needed) and return its static facts:
    registers, spill/stack bytes, shared memory, and the wgmma / wgmma-wait structure of the PTX."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cfg = Config.from_dict(config) if config else default_config(shape or {"M": 4096, "N": 4096, "K": 4096})
    cfg.check()
    cap = int(arch.replace("sm_", "").rstrip("a"))
    sig, constexprs, attrs = _signature(cfg)
    src = ASTSource(fn=_fp8_blockscale_gemm_sm90, signature=sig, constexprs=constexprs, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", cap, 32), options={"num_warps": cfg.num_warps, "num_stages": cfg.stages})
    ptx = ck.asm["ptx"]
    facts: dict[str, Any] = {
        "config": cfg.as_dict(),
        "shared_bytes": int(ck.metadata.shared),
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "wgmma_wait": {n: len(re.findall(rf"wgmma\.wait_group\.sync\.aligned\s+{n};", ptx)) for n in range(4)},
        "bar_sync": len(re.findall(r"\bbar\.sync\b|barrier\.sync", ptx)),
        "fma_f32": len(re.findall(r"\bfma\.rn\.f32\b", ptx)),
        "fma_while_wgmma_pending": _fma_while_pending(ptx),
    }
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(ck.asm["cubin"])
        try:
            res = subprocess.run([str(tool), "--dump-resource-usage", str(cubin)], capture_output=True, text=True, timeout=60)
            m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", res.stdout)
            if m:
                facts.update(regs=int(m.group(1)), stack=int(m.group(2)), local=int(m.group(4)))
            sass = subprocess.run([str(tool), "--dump-sass", str(cubin)], capture_output=True, text=True, timeout=120).stdout
            # ptxas's own verdict on the wgmma pipeline: C7514/C7515 mean it serialised every wgmma.
            ptxas = tool.parent / "ptxas"
            ptx_file = Path(tmp) / "k.ptx"
            ptx_file.write_text(ptx)
            info = subprocess.run([str(ptxas), f"-arch=sm_{cap}a", "-v", str(ptx_file), "-o", str(Path(tmp) / "v.cubin")],
                                  capture_output=True, text=True, timeout=120)
            facts["ptxas_wgmma_serialized"] = sorted(set(re.findall(r"C751[45]", info.stdout + info.stderr)))
            facts["sass_qgmma"] = len(re.findall(r"\bQGMMA\b|HGMMA\.\S*E4M3", sass))
            facts["sass_local_ld_st"] = len(re.findall(r"\b(LDL|STL)\b", sass))
        except (OSError, subprocess.SubprocessError) as exc:  # tool missing: report what we have
            facts["cuobjdump_error"] = str(exc)
    return facts
