"""FlyDSL 4-wave fp8 a8w8 block-scale GEMM (software fp32 promote) for gfx950, with a gfx942 path.

    C[M, N] (bf16) = sum_kb  (A[:, kb] x B[:, kb]^T)  *  a_scale[:, kb] (x) b_scale[n//128, kb]

Design (written for this project; upstream FlyDSL was read for facts only):

* 256 threads = 4 waves, all splitting N: wave ``w`` owns columns ``[w*tile_n/4, +tile_n/4)`` of the
  ``tile_m x tile_n`` output tile, as ``(tile_m/16) x (tile_n/64)`` accumulators of one 16x16 MFMA
  each. The K loop is fully unrolled (one 128-deep scale block per MFMA), so K is compile-time.
* A goes global -> registers -> LDS (two ping-pong buffers of ``tile_m*tile_k`` bytes, 16-byte XOR
  swizzle); the next tile's loads are issued before the current tile's MFMAs.
* B never touches LDS: it is preshuffled on the host (16x16 layout), so each lane fetches its
  operand fragment with two 16-byte loads straight into registers, one tile ahead.
* The parity key: every MFMA is ``v_mfma_scale_f32_16x16x128_f8f6f4`` with both E8M0 scales pinned
  to 127 (= 1.0, ``0x7F7F7F7F``) and a zero accumulator, i.e. an *unscaled* fp8 product of one
  128-deep block; the fp32 block scales are applied in software right after it:
  ``acc = fma(block, sa[row] * sb[col], acc)``. The fp32 scales never reach the E8M0 operand (they
  are not powers of two). On gfx942 four chained ``v_mfma_f32_16x16x32_fp8_fp8`` form the block
  (inputs must then be fp8 e4m3fnuz).
* Epilogue: accumulators -> bf16 -> an LDS C tile -> 16-byte row stores, masked at M and N.

Knobs (``config``): ``tile_m``, ``tile_n``, ``tile_k`` (multiple of 128), ``waves_per_eu`` (0 = no
hint), ``xcd_swizzle`` (0 = M-fastest rasterization; g > 0 = remap over the 8 XCDs then group g
M-tiles per N column), ``fused_promote`` (promote each block right after its own MFMA; the default
promotes a row of blocks one MFMA row later, which hides the MFMA latency and keeps at most two
rows of block results live). ``debug_data_scale`` exists only for the static-gate tests: it feeds a
data-dependent value (the bits of the loaded A scale) to the E8M0 scale operands, which is
numerically wrong and must be caught by the ``e8m0_scale_pinned`` gate.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from skillrun_kernels._flydsl.runtime import check_mfma_tiles, config_from_dict, flat_out_run, waves_per_eu_attrs
from skillrun_kernels.protocol import KernelLaunch, UnsupportedShape

from . import layout as L

NTHREADS = 256
WAVES = 4
KERNEL_PREFIX = "fp8_bs_4w"


@dataclass(frozen=True)
class Config:
    tile_m: int = 64
    tile_n: int = 256
    tile_k: int = 128
    waves_per_eu: int = 2
    xcd_swizzle: int = 0
    fused_promote: bool = False
    debug_data_scale: bool = False

    @classmethod
    def from_dict(cls, config: dict | None) -> "Config":
        return config_from_dict(cls, config, "flydsl_4wave")

    def check(self, M: int, N: int, K: int) -> None:
        tm, tn = self.tile_m, self.tile_n
        check_mfma_tiles(tm, tn, self.tile_k, K, waves=WAVES, nthreads=NTHREADS, k_step=L.BLOCK_K)
        if (tm * tn * 2) % (16 * NTHREADS):
            raise UnsupportedShape(f"tile_m*tile_n*2={tm * tn * 2} must be a multiple of {16 * NTHREADS} (epilogue copy)")
        if M * K >= 2**31 or M * N * 2 >= 2**31:
            raise UnsupportedShape(f"M={M}: 32-bit buffer offsets cover at most 2 GiB per operand")
        if self.waves_per_eu < 0 or self.xcd_swizzle < 0:
            raise ValueError("waves_per_eu and xcd_swizzle must be >= 0")


def _kernel_name(cfg: Config, N: int, K: int, arch: str) -> str:
    tag = f"{KERNEL_PREFIX}_{arch}_t{cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k}_w{cfg.waves_per_eu}_x{cfg.xcd_swizzle}"
    tag += "_fp" if cfg.fused_promote else ""
    tag += "_DBGSCALE" if cfg.debug_data_scale else ""
    return f"{tag}_n{N}_k{K}"


def _geometry(N: int, K: int, cfg: Config, arch: str) -> dict:
    tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
    n16 = -(-N // 16) * 16
    return dict(
        N=N, K=K, cfg=cfg, gfx950=arch.startswith("gfx950"),
        tm=tm, tn=tn, tk=tk, m_rep=tm // 16, n_acc=tn // WAVES // 16, kbs=tk // L.BLOCK_K,
        n_ktiles=K // tk, nkb=K // L.BLOCK_K, a_steps=tm * tk // (16 * NTHREADS),
        c_steps=tm * tn * 2 // (16 * NTHREADS), a_tile=tm * tk, lds_bytes=max(2 * tm * tk, tm * tn * 2),
        n16=n16, grid_n=-(-n16 // tn), scale_nb=-(-N // L.BLOCK_K), vec8=N % 8 == 0,
    )


def _kernel_body(g: dict, C, A, B, SA, SB, M) -> None:
    """The kernel, traced once per specialization. A plain function (not the ``@flyc.kernel`` itself)
    so FlyDSL's AST rewriter leaves its Python loops alone: they unroll at trace time."""
    from skillrun_kernels._flydsl import dsl as D

    cfg = g["cfg"]
    N, K, tm, tn, tk = g["N"], g["K"], g["tm"], g["tn"], g["tk"]
    m_rep, n_acc, kbs, n_ktiles, nkb = g["m_rep"], g["n_acc"], g["kbs"], g["n_ktiles"], g["nkb"]
    a_steps, c_steps, a_tile, lds_bytes = g["a_steps"], g["c_steps"], g["a_tile"], g["lds_bytes"]
    n16, grid_n, scale_nb, vec8, gfx950 = g["n16"], g["grid_n"], g["scale_nb"], g["vec8"], g["gfx950"]
    v4i32 = D.vec_t(4, D.i32_t())
    v4f32 = D.vec_t(4, D.f32_t())
    tid = D.thread_id()
    lane = L.fmod(tid, 64)
    wave = D.wave_uniform(L.fdiv(tid, 64))
    Mv = D.I32(M)
    grid_m = L.fdiv(Mv + (tm - 1), tm)
    pid_m, pid_n = L.tile_of(D.block_id("x"), grid_m, grid_n, cfg.xcd_swizzle)
    m0 = pid_m * tm
    n0 = pid_n * tn
    wcol = n0 + L.wave_columns(wave, tn, WAVES)  # wave-uniform first column of this wave's strip

    rs_a = D.tensor_rsrc(A, Mv * K)
    rs_b = D.tensor_rsrc(B, n16 * K)
    rs_sa = D.tensor_rsrc(SA, Mv * (nkb * 4))
    rs_sb = D.tensor_rsrc(SB, scale_nb * nkb * 4)
    rs_c = D.tensor_rsrc(C, Mv * (N * 2))
    lds = D.lds_alloc(lds_bytes)

    def load_a(kt):
        regs = []
        for s in range(a_steps):
            row, kbyte = L.tile_copy_coords(tid, s, tk, NTHREADS)
            regs.append(D.buffer_load(rs_a, (m0 + row) * K + (kt * tk) + kbyte))
        return regs

    def store_a(regs, buf):
        for s, r in enumerate(regs):
            row, kbyte = L.tile_copy_coords(tid, s, tk, NTHREADS)
            D.lds_store(lds, L.lds_swizzle_offset(row, kbyte, tk) + buf * a_tile, r)

    def a_frag(buf, mi, kbl):
        row = L.operand_row(lane) + mi * 16
        halves = [
            D.lds_load(lds, L.lds_swizzle_offset(row, L.frag_chunk_k(lane, h) + kbl * L.BLOCK_K, tk) + buf * a_tile, v4i32)
            for h in (0, 1)
        ]
        return D.concat(*halves)

    def load_b(kt):
        frags = []
        for kbl in range(kbs):
            kb = kt * kbs + kbl
            row = []
            for ni in range(n_acc):
                col = wcol + ni * 16 + L.operand_row(lane)
                halves = [D.buffer_load(rs_b, L.b_frag_offset(col, kb, lane, h, K)) for h in (0, 1)]
                row.append(D.concat(*halves))
            frags.append(row)
        return frags

    def load_scales(kt):
        sa, sb = [], []
        for kbl in range(kbs):
            kb = kt * kbs + kbl
            sa.append([
                D.bitcast(D.buffer_load(rs_sa, L.a_scale_index(m0 + mi * 16 + L.acc_row(lane, 0), kb, Mv) * 4), v4f32)
                for mi in range(m_rep)
            ])
            sb.append([D.scalar_load_f32(rs_sb, L.b_scale_index(wcol + ni * 16, kb, K) * 4) for ni in range(n_acc)])
        return sa, sb

    one = D.e8m0_one()

    def block_mma(af, bf, sa_first):
        if gfx950:
            if cfg.debug_data_scale:
                # Gate-test defect: an E8M0 scale taken from data (the A scale's bits).
                s = D.bitcast(D.extract(sa_first, 0), D.i32_t())
                return D.mfma_scale_16x16x128(af, bf, D.zeros_f32(4), s, s)
            return D.mfma_scale_16x16x128(af, bf, D.zeros_f32(4), one, one)
        a64 = D.bitcast(af, D.vec_t(4, D.i64_t()))
        b64 = D.bitcast(bf, D.vec_t(4, D.i64_t()))
        blk = D.zeros_f32(4)
        for j in range(4):
            blk = D.mfma_fp8_16x16x32(D.extract(a64, j), D.extract(b64, j), blk)
        return blk

    def promote(blk, sa_v, sb_s, acc):
        return D.fma(blk, D.mulf(sa_v, D.splat(sb_s, 4)), acc)

    acc = [[D.zeros_f32(4) for _ in range(n_acc)] for _ in range(m_rep)]
    a_next = load_a(0)
    b_cur = load_b(0)
    s_cur = load_scales(0)
    store_a(a_next, 0)
    D.barrier()
    for kt in range(n_ktiles):
        last = kt + 1 == n_ktiles
        if not last:
            a_next = load_a(kt + 1)
        buf = kt % 2
        sa_t, sb_t = s_cur
        for kbl in range(kbs):
            pending = []  # (mi, blocks of row mi) not yet promoted
            for mi in range(m_rep):
                af = a_frag(buf, mi, kbl)
                row_blocks = [block_mma(af, b_cur[kbl][ni], sa_t[kbl][0]) for ni in range(n_acc)]
                if cfg.fused_promote:
                    for ni, blk in enumerate(row_blocks):
                        acc[mi][ni] = promote(blk, sa_t[kbl][mi], sb_t[kbl][ni], acc[mi][ni])
                    continue
                # Row-pipelined promote: row mi-1's fp32 FMAs are issued after row mi's MFMAs, so
                # each MFMA result is read one row of MFMAs later (latency hidden) and at most two
                # rows of block results are live (the 4-wave register wall leaves no room for all).
                for pmi, blks in pending:
                    for ni, blk in enumerate(blks):
                        acc[pmi][ni] = promote(blk, sa_t[kbl][pmi], sb_t[kbl][ni], acc[pmi][ni])
                pending = [(mi, row_blocks)]
            if kbl + 1 == kbs and not last:
                # Next tile's B fragments are issued once this tile's MFMAs have read theirs, so
                # the two B register sets are never live together; their latency overlaps the last
                # promotes, the LDS store and the barrier.
                b_next = load_b(kt + 1)
            for pmi, blks in pending:
                for ni, blk in enumerate(blks):
                    acc[pmi][ni] = promote(blk, sa_t[kbl][pmi], sb_t[kbl][ni], acc[pmi][ni])
        if not last:
            # The next tile's scales are first needed by its promotes, after all its MFMAs: load
            # them late so they do not overlap this tile's scales in registers.
            s_next = load_scales(kt + 1)
            store_a(a_next, (kt + 1) % 2)
            D.barrier()
            b_cur, s_cur = b_next, s_next

    # Epilogue: bf16 tile through LDS so global stores are full 16-byte rows.
    D.barrier()
    row_bytes = tn * 2
    for mi in range(m_rep):
        for ni in range(n_acc):
            vals = D.to_bf16(acc[mi][ni])
            col = L.wave_columns(wave, tn, WAVES) + ni * 16 + L.acc_col(lane)
            for i in range(4):
                row = mi * 16 + L.acc_row(lane, i)
                D.lds_store(lds, row * row_bytes + col * 2, D.extract(vals, i), align=2)
    D.barrier()
    for s in range(c_steps):
        row, cbyte = L.tile_copy_coords(tid, s, row_bytes, NTHREADS)
        gm = m0 + row
        gc = n0 + L.fdiv(cbyte, 2)
        if vec8:
            v = D.lds_load(lds, row * row_bytes + cbyte, v4i32)
            ok = D.and_(D.cmp_lt(gm, Mv), D.cmp_lt(gc, N))
            D.buffer_store(v, rs_c, D.guarded_offset(ok, gm * (N * 2) + gc * 2))
        else:
            v = D.lds_load(lds, row * row_bytes + cbyte, v4i32)
            halves = D.bitcast(v, D.vec_t(8, D.bf16_t()))
            for e in range(8):
                ok = D.and_(D.cmp_lt(gm, Mv), D.cmp_lt(gc + e, N))
                D.buffer_store(D.extract(halves, e), rs_c, D.guarded_offset(ok, gm * (N * 2) + (gc + e) * 2))



def make_launcher(N: int, K: int, cfg: Config, arch: str):
    """The ``@flyc.jit`` launcher ``launch(C, A, B_shuf, SA_t, SB, M, stream)`` for fixed N, K, config."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    g = _geometry(N, K, cfg, arch)
    tm, grid_n = g["tm"], g["grid_n"]
    name = _kernel_name(cfg, N, K, arch)

    @flyc.kernel(name=name)
    def kernel(C: fx.Tensor, A: fx.Tensor, B: fx.Tensor, SA: fx.Tensor, SB: fx.Tensor, M: fx.Int32):
        _kernel_body(g, C, A, B, SA, SB, M)

    value_attrs = waves_per_eu_attrs(cfg.waves_per_eu)

    @flyc.jit
    def launch(C: fx.Tensor, A: fx.Tensor, B: fx.Tensor, SA: fx.Tensor, SB: fx.Tensor, M: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        grid = (M + (tm - 1)) // tm * grid_n
        kernel(C, A, B, SA, SB, M, value_attrs=value_attrs).launch(grid=(grid, 1, 1), block=(NTHREADS, 1, 1), stream=stream)

    return launch


# The prepared tensors a launch reads, in launcher order (shared with the 8-wave core).
RUN_PREP_KEYS = ("a", "b_shuf", "a_scale_t", "b_scale")


def _placeholders(M: int, N: int, K: int):
    import torch

    meta = "meta"
    n16 = -(-N // 16) * 16
    return (
        torch.empty(M * N, dtype=torch.bfloat16, device=meta),
        torch.empty(M * K, dtype=torch.uint8, device=meta),
        torch.empty(n16 * K, dtype=torch.uint8, device=meta),
        torch.empty((K // 128) * M, dtype=torch.float32, device=meta),
        torch.empty(-(-N // 128) * (K // 128), dtype=torch.float32, device=meta),
        M,
    )


def _resolve(config_cls: Any, shape: dict, config: dict | None) -> tuple[int, int, int, Any]:
    """``M, N, K`` and the checked config of a block-scale FlyDSL core (4-wave or 8-wave)."""
    from . import problem

    M, N, K = problem.check_shape(shape)
    cfg = config_cls.from_dict(config)
    cfg.check(M, N, K)
    return M, N, K, cfg


def _compile_core(config_cls: Any, make: Any, kernel_name: Any, shape: dict, config: dict | None, arch: str) -> dict:
    """``compile_only`` for a block-scale core given its Config, ``make_launcher`` and ``_kernel_name``."""
    from skillrun_kernels._flydsl.runtime import compile_stream_launcher

    M, N, K, cfg = _resolve(config_cls, shape, config)
    return compile_stream_launcher(lambda: make(N, K, cfg, arch), lambda: _placeholders(M, N, K), arch=arch,
                                   tag=kernel_name(cfg, N, K, arch), describe={"config": asdict(cfg), "shape": dict(shape)})


def compile_only(shape: dict, config: dict, arch: str) -> dict:
    """Compile for ``arch`` on this machine (no GPU) and return the compiled facts (see kernels/_flydsl)."""
    return _compile_core(Config, make_launcher, _kernel_name, shape, config, arch)


def build(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Compile on the first ``run`` with real HIP tensors (FlyDSL runtime, current stream), then fast path."""
    from skillrun_kernels._flydsl.runtime import DeviceLaunch, require_rocm

    M, N, K, cfg = _resolve(Config, shape, config)
    arch = require_rocm("flydsl_4wave")
    if not (arch.startswith("gfx950") or arch.startswith("gfx942")):
        raise UnsupportedShape(f"flydsl_4wave targets gfx950/gfx942, not {arch}")
    launch = DeviceLaunch(make_launcher(N, K, cfg, arch))

    def prepare(inputs: dict) -> Any:
        return L.prepare(inputs)

    return KernelLaunch(
        name=f"flydsl_4wave[{cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k},wpe{cfg.waves_per_eu},xcd{cfg.xcd_swizzle}]",
        run=flat_out_run(launch, RUN_PREP_KEYS, M),
        prepare=prepare,
        expect_kernels=KERNEL_PREFIX,
        describe={"backend": "flydsl", "arch": arch, "config": asdict(cfg)},
    )
