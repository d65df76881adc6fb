"""FlyDSL fp8 block-scale MoE for gfx950 (gfx942 path included): one grouped block-scale GEMM kernel
in the contiguous layout, launched once per stage, with torch glue between the stages.

    stage 1:  gu[r, :] = A_g[r] . W1[e(r)]^T        (N = 2I, K = D)
    stage 2:  y[r, :]  = hq[r] . W2[e(r)]^T         (N = D,  K = I)

``r`` runs over the (token, slot) pairs sorted by expert, each expert's run padded to ``tile_m`` rows
(DeepGEMM's "contiguous" layout; facts/fp8_blockscale_moe.md), so every ``tile_m``-row M block
belongs to one expert ``e = block_expert[block]``. What is a kernel and what is not:

* **Kernel** (``moe_fp8bs_g{1,2}_…``: the dense block-scale tile of
  ``fp8_blockscale_gemm/flydsl_4wave.py``, shared as ``_flydsl.blockscale_tile.emit_tile``, over
  per-expert buffer windows; the dense module keeps its own copy so its measured artifacts stay
  current): 4 waves split N; per 128-deep K block one unscaled fp8 MFMA
  (``v_mfma_scale_f32_16x16x128_f8f6f4`` with both E8M0 scales pinned to 1.0; gfx942: four
  ``v_mfma_f32_16x16x32_fp8_fp8``) promoted in software ``acc = fma(block, sa[row] * sb[col], acc)``;
  the weight buffer descriptor and the 128x128 scale descriptor are rebased to expert ``e`` with
  64-bit address arithmetic (all experts' W1 is 7.5 GB at DeepSeek-V3 sizes: 32-bit buffer offsets
  cover one expert, not the stack). A goes through LDS (two buffers, XOR swizzle), B is preshuffled
  16x16 and read straight into registers. bf16 out through an LDS C tile.
* **Torch glue (not fused, timed with the layer)**: the sort/pad of the pairs (one host sync for the
  padded row count), the gather of A rows and scales, SiLU(gate) * up with the recipe's fp8 1x128
  re-quantization of h, and the weighted top-k sum. The production kernels (aiter CK/ASM, FlyDSL
  upstream) fuse the gather, SiLU and the weighted sum into the GEMMs: this port is the smaller
  kernel the issue allows, and the card says so.

Knobs (``config``): ``tile_m`` (= routing alignment), ``tile_n1``, ``tile_n2``, ``tile_k`` (multiple
of 128), ``waves_per_eu`` (0 = no hint).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from skillrun_kernels._flydsl.blockscale_tile import NTHREADS, WAVES, emit_tile
from skillrun_kernels._flydsl.runtime import check_mfma_tiles, config_from_dict, waves_per_eu_attrs
from skillrun_kernels.fp8_blockscale_gemm import layout as L
from skillrun_kernels.protocol import KernelLaunch, UnsupportedShape

from . import problem

KERNEL_PREFIX = "moe_fp8bs"


@dataclass(frozen=True)
class Config:
    tile_m: int = 32
    tile_n1: int = 256
    tile_n2: int = 256
    tile_k: int = 128
    waves_per_eu: int = 2

    @classmethod
    def from_dict(cls, config: dict | None) -> "Config":
        return config_from_dict(cls, config, "fp8_blockscale_moe.flydsl_gfx950")

    def check(self, D: int, I: int) -> None:
        for stage, tn, n, k in ((1, self.tile_n1, 2 * I, D), (2, self.tile_n2, D, I)):
            check_mfma_tiles(self.tile_m, tn, self.tile_k, k, waves=WAVES, nthreads=NTHREADS, k_step=L.BLOCK_K)
            if n % tn:
                raise UnsupportedShape(f"tile_n{stage}={tn} must divide stage {stage}'s N={n}")
            if (self.tile_m * tn * 2) % (16 * NTHREADS):
                raise UnsupportedShape(f"tile_m*tile_n{stage}*2 must be a multiple of {16 * NTHREADS} (epilogue copy)")
            if n * k >= 2**31:
                raise UnsupportedShape(f"stage {stage}: one expert's weights ({n}x{k}) exceed a 2 GiB buffer window")
        if self.waves_per_eu < 0:
            raise ValueError("waves_per_eu must be >= 0")


def kernel_name(cfg: Config, stage: int, N: int, K: int, arch: str) -> str:
    tn = cfg.tile_n1 if stage == 1 else cfg.tile_n2
    return f"{KERNEL_PREFIX}_g{stage}_{arch}_t{cfg.tile_m}x{tn}x{cfg.tile_k}_w{cfg.waves_per_eu}_n{N}_k{K}"


def _geometry(N: int, K: int, tm: int, tn: int, tk: int, arch: str) -> dict:
    return dict(
        N=N, K=K, gfx950=arch.startswith("gfx950"), tm=tm, tn=tn, tk=tk,
        m_rep=tm // 16, n_acc=tn // WAVES // 16, kbs=tk // L.BLOCK_K, n_ktiles=K // tk, nkb=K // L.BLOCK_K,
        a_steps=tm * tk // (16 * NTHREADS), c_steps=tm * tn * 2 // (16 * NTHREADS), a_tile=tm * tk,
        lds_bytes=max(2 * tm * tk, tm * tn * 2), grid_n=N // tn,
    )


def _grouped_body(g: dict, C, A, B, SA, SB, BE, M) -> None:
    """One (M block, N tile) of the grouped GEMM; traced once per specialization (Python loops unroll)."""
    from skillrun_kernels._flydsl import dsl as D

    N, K, tm, tn, nkb, grid_n = g["N"], g["K"], g["tm"], g["tn"], g["nkb"], g["grid_n"]
    tid = D.thread_id()
    lane = L.fmod(tid, 64)
    wave = D.wave_uniform(L.fdiv(tid, 64))
    Mv = D.I32(M)
    grid_m = L.fdiv(Mv + (tm - 1), tm)
    pid_m, pid_n = L.tile_of(D.block_id("x"), grid_m, grid_n, 0)
    m0 = pid_m * tm
    n0 = pid_n * tn
    wcol = n0 + L.wave_columns(wave, tn, WAVES)

    # The block's expert (wave-uniform SMEM load), then per-expert windows over W and its scales.
    rs_be = D.tensor_rsrc(BE, grid_m * 4)
    e = D.wave_uniform(D.I32(D.scalar_load_i32(rs_be, pid_m * 4)))
    rs_b = D.tensor_rsrc(B, N * K, byte_offset=D.mul64(e, N * K))
    sb_elems = (N // L.BLOCK_K) * nkb
    rs_sb = D.tensor_rsrc(SB, sb_elems * 4, byte_offset=D.mul64(e, sb_elems * 4))
    rs_a = D.tensor_rsrc(A, Mv * K)
    rs_sa = D.tensor_rsrc(SA, Mv * (nkb * 4))
    rs_c = D.tensor_rsrc(C, Mv * (N * 2))
    emit_tile(D, g, tid=tid, lane=lane, wave=wave, Mv=Mv, m0=m0, n0=n0, wcol=wcol,
              rs_a=rs_a, rs_b=rs_b, rs_sa=rs_sa, rs_sb=rs_sb, rs_c=rs_c)


def make_kernel(stage: int, N: int, K: int, cfg: Config, arch: str):
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    tn = cfg.tile_n1 if stage == 1 else cfg.tile_n2
    g = _geometry(N, K, cfg.tile_m, tn, cfg.tile_k, arch)

    @flyc.kernel(name=kernel_name(cfg, stage, N, K, arch))
    def kernel(C: fx.Tensor, A: fx.Tensor, B: fx.Tensor, SA: fx.Tensor, SB: fx.Tensor, BE: fx.Tensor, M: fx.Int32):
        _grouped_body(g, C, A, B, SA, SB, BE, M)

    return kernel, g["grid_n"]


def make_launcher(stage: int, N: int, K: int, cfg: Config, arch: str):
    """``launch(C, A, B_shuf, SA_t, SB, block_expert, M, stream)`` for one stage."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    kernel, grid_n = make_kernel(stage, N, K, cfg, arch)
    tm = cfg.tile_m
    attrs = waves_per_eu_attrs(cfg.waves_per_eu)

    @flyc.jit
    def launch(C: fx.Tensor, A: fx.Tensor, B: fx.Tensor, SA: fx.Tensor, SB: fx.Tensor, BE: fx.Tensor, M: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        grid = (M + (tm - 1)) // tm * grid_n
        kernel(C, A, B, SA, SB, BE, M, value_attrs=attrs).launch(grid=(grid, 1, 1), block=(NTHREADS, 1, 1), stream=stream)

    return launch


def make_layer_launcher(D_: int, I: int, cfg: Config, arch: str):
    """Both stages' kernels in one launcher: what ``compile_only`` compiles (facts for both kernels).
    The torch glue between them does not exist here; runs use one launcher per stage."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    k1, gn1 = make_kernel(1, 2 * I, D_, cfg, arch)
    k2, gn2 = make_kernel(2, D_, I, cfg, arch)
    tm = cfg.tile_m
    attrs = waves_per_eu_attrs(cfg.waves_per_eu)

    @flyc.jit
    def launch(C1: fx.Tensor, A1: fx.Tensor, B1: fx.Tensor, SA1: fx.Tensor, SB1: fx.Tensor,
               C2: fx.Tensor, A2: fx.Tensor, B2: fx.Tensor, SA2: fx.Tensor, SB2: fx.Tensor, BE: fx.Tensor, M: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        grid_m = (M + (tm - 1)) // tm
        k1(C1, A1, B1, SA1, SB1, BE, M, value_attrs=attrs).launch(grid=(grid_m * gn1, 1, 1), block=(NTHREADS, 1, 1), stream=stream)
        k2(C2, A2, B2, SA2, SB2, BE, M, value_attrs=attrs).launch(grid=(grid_m * gn2, 1, 1), block=(NTHREADS, 1, 1), stream=stream)

    return launch


def rows_bound(shape: dict, tile_m: int) -> int:
    """Padded sorted rows at most: every active expert wastes < tile_m rows."""
    t, _, _, e, k = problem.dims(shape)
    pairs = t * k
    return -(-(pairs + min(e, pairs) * (tile_m - 1)) // tile_m) * tile_m


def _placeholders(shape: dict, cfg: Config):
    import torch

    t, d, i, e, k = problem.dims(shape)
    m = rows_bound(shape, cfg.tile_m)
    meta = "meta"

    def stage(n, kk):
        return (torch.empty(m * n, dtype=torch.bfloat16, device=meta), torch.empty(m * kk, dtype=torch.uint8, device=meta),
                torch.empty(e * n * kk, dtype=torch.uint8, device=meta), torch.empty((kk // 128) * m, dtype=torch.float32, device=meta),
                torch.empty(e * (n // 128) * (kk // 128), dtype=torch.float32, device=meta))

    return (*stage(2 * i, d), *stage(d, i), torch.empty(m // cfg.tile_m, dtype=torch.int32, device=meta), m)


def resolve(shape: dict, config: dict | None) -> tuple[tuple[int, ...], Config]:
    dims = problem.dims(shape)
    cfg = Config.from_dict(config)
    cfg.check(dims[1], dims[2])
    return dims, cfg


def compile_only(shape: dict, config: dict, arch: str) -> dict:
    """Compile both stages for ``arch`` on this machine (no GPU) and return the compiled facts."""
    from skillrun_kernels._flydsl.runtime import compile_stream_launcher

    (t, d, i, e, k), cfg = resolve(shape, config)
    return compile_stream_launcher(lambda: make_layer_launcher(d, i, cfg, arch), lambda: _placeholders(shape, cfg), arch=arch,
                                   tag=f"{KERNEL_PREFIX}_{arch}_t{cfg.tile_m}_d{d}_i{i}",
                                   describe={"config": asdict(cfg), "shape": dict(shape),
                                             "kernels": [kernel_name(cfg, 1, 2 * i, d, arch), kernel_name(cfg, 2, d, i, arch)]})


# ---------------------------------------------------------------- host side (torch; ROCm device)
def contiguous_routing(topk_ids, experts: int, tile_m: int):
    """(dest row of every pair, block_expert int32, padded row count): pairs sorted by expert, each
    expert's run padded to ``tile_m``. One host sync (the row count sizes the buffers)."""
    import torch

    flat = topk_ids.reshape(-1).long()
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + tile_m - 1) // tile_m * tile_m
    starts = torch.cumsum(padded, 0) - padded
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    rank = torch.arange(flat.numel(), device=flat.device) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    dest = torch.empty_like(flat)
    dest[order] = starts[sorted_e] + rank
    rows = int(padded.sum())
    block_expert = torch.repeat_interleave(torch.arange(experts, device=flat.device, dtype=torch.int32), padded // tile_m)
    return dest, block_expert, rows


def prepare_weights(inputs: dict) -> dict:
    """Preshuffled W1/W2 (16x16, all experts as one (E*N, K) byte matrix) and flat block scales."""
    out = {}
    for w in ("w1", "w2"):
        q = inputs[w]
        e, n, k = q.shape
        out[f"{w}_shuf"] = L.preshuffle_b(q.reshape(e * n, k))
        out[f"{w}_scale"] = inputs[f"{w}_scale"].float().contiguous().view(-1)
    out["a"], out["a_scale"] = inputs["a"], inputs["a_scale"].float()
    out["topk_ids"], out["topk_weights"] = inputs["topk_ids"], inputs["topk_weights"]
    return out


def build(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Compile each stage on its first ``run`` with real HIP tensors (FlyDSL runtime), then fast path."""
    import torch

    from skillrun_kernels._flydsl.runtime import DeviceLaunch, require_rocm

    (t, d, i, e, k), cfg = resolve(shape, config)
    arch = require_rocm("fp8_blockscale_moe.flydsl_gfx950")
    if not (arch.startswith("gfx950") or arch.startswith("gfx942")):
        raise UnsupportedShape(f"fp8_blockscale_moe.flydsl_gfx950 targets gfx950/gfx942, not {arch}")
    s1 = DeviceLaunch(make_launcher(1, 2 * i, d, cfg, arch))
    s2 = DeviceLaunch(make_launcher(2, d, i, cfg, arch))

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream()
        dest, be, rows = contiguous_routing(p["topk_ids"], e, cfg.tile_m)
        tok = torch.arange(t * k, device=dest.device) // k
        a = torch.zeros(rows, d, dtype=torch.uint8, device=dest.device)
        sa = torch.zeros(rows, d // 128, dtype=torch.float32, device=dest.device)
        a[dest] = p["a"].view(torch.uint8)[tok]
        sa[dest] = p["a_scale"][tok]
        gu = torch.empty(rows, 2 * i, dtype=torch.bfloat16, device=dest.device)
        s1(gu.view(-1), a.view(-1), p["w1_shuf"], sa.t().contiguous().view(-1), p["w1_scale"], be, rows, stream)
        h = torch.nn.functional.silu(gu[:, :i].float()) * gu[:, i:].float()
        hq, hs = problem.quantize_rows_1x128(h)
        y = torch.empty(rows, d, dtype=torch.bfloat16, device=dest.device)
        s2(y.view(-1), hq.view(torch.uint8).view(-1), p["w2_shuf"], hs.t().contiguous().view(-1), p["w2_scale"], be, rows, stream)
        acc = torch.zeros(t, d, dtype=torch.float32, device=dest.device)
        acc.index_add_(0, tok, y[dest].float() * p["topk_weights"].reshape(-1, 1))
        out.copy_(acc)
        return out

    return KernelLaunch(
        name=f"flydsl_moe_fp8bs[t{cfg.tile_m}x{cfg.tile_n1}/{cfg.tile_n2}x{cfg.tile_k},wpe{cfg.waves_per_eu}]",
        run=run,
        prepare=prepare_weights,
        expect_kernels=rf"^({KERNEL_PREFIX}_g[12]_|void at::native::|at::native::|void at_cuda_detail::|Memcpy |Memset )",
        describe={"backend": "flydsl", "arch": arch, "config": asdict(cfg),
                  "fused": "GEMMs only; gather, SiLU + fp8 re-quantization and the top-k sum run in torch"},
    )
