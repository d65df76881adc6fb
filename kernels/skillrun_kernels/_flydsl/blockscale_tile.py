"""The 4-wave block-scale fp8 GEMM tile on gfx9, given its buffers: one (tile_m x tile_n) output tile.

    C[m0:m0+tm, n0:n0+tn] (bf16) = sum_kb (A x B^T)[kb] * sa[row, kb] * sb[col // 128, kb]

The core of fp8_blockscale_gemm/flydsl_4wave.py (its default schedule: row-pipelined promote, no
debug options), as a function of the buffer descriptors, so that a kernel that finds its operands
elsewhere (a MoE expert's weight window) emits the same tile. 4 waves split N; A goes global ->
registers -> LDS (two XOR-swizzled buffers, next tile loaded before the current MFMAs); B is
preshuffled 16x16 and read into registers a tile ahead; per 128-deep K block one unscaled fp8 MFMA
(gfx950: ``v_mfma_scale_f32_16x16x128_f8f6f4`` with both E8M0 scales pinned to 1.0; gfx942: four
``v_mfma_f32_16x16x32_fp8_fp8``) promoted in software, ``acc = fma(block, sa[row] * sb[col], acc)``;
bf16 out through an LDS C tile, rows masked at M.

fp8_blockscale_gemm/flydsl_4wave.py keeps its own copy: its measured artifacts name its bytes.
Traced inside a FlyDSL kernel body only (``D`` is skillrun_kernels._flydsl.dsl, imported by the caller).
"""
from __future__ import annotations

from typing import Any

from skillrun_kernels.fp8_blockscale_gemm import layout as L

NTHREADS = 256
WAVES = 4


def emit_tile(D: Any, g: dict, *, tid, lane, wave, Mv, m0, n0, wcol, rs_a, rs_b, rs_sa, rs_sb, rs_c) -> None:
    """Emit one output tile. ``g``: the tile geometry (N, K, tm, tn, tk, m_rep, n_acc, kbs, n_ktiles,
    a_steps, c_steps, a_tile, lds_bytes, gfx950); ``rs_*``: buffer descriptors whose offset 0 is
    element 0 of the operand as this tile indexes it (rows of A/C/sa from 0 to M, B and sb for one
    (N, K) weight)."""
    N, K, tn, tk = g["N"], g["K"], g["tn"], g["tk"]
    m_rep, n_acc, kbs, n_ktiles = g["m_rep"], g["n_acc"], g["kbs"], g["n_ktiles"]
    a_steps, c_steps, a_tile, lds_bytes = g["a_steps"], g["c_steps"], g["a_tile"], g["lds_bytes"]
    v4i32 = D.vec_t(4, D.i32_t())
    v4f32 = D.vec_t(4, D.f32_t())
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

    def block_mma(af, bf):
        if g["gfx950"]:
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
            pending = []  # row-pipelined promote: row mi-1's FMAs after row mi's MFMAs
            for mi in range(m_rep):
                af = a_frag(buf, mi, kbl)
                row_blocks = [block_mma(af, b_cur[kbl][ni]) for ni in range(n_acc)]
                for pmi, blks in pending:
                    for ni, blk in enumerate(blks):
                        acc[pmi][ni] = promote(blk, sa_t[kbl][pmi], sb_t[kbl][ni], acc[pmi][ni])
                pending = [(mi, row_blocks)]
            if kbl + 1 == kbs and not last:
                b_next = load_b(kt + 1)
            for pmi, blks in pending:
                for ni, blk in enumerate(blks):
                    acc[pmi][ni] = promote(blk, sa_t[kbl][pmi], sb_t[kbl][ni], acc[pmi][ni])
        if not last:
            s_next = load_scales(kt + 1)
            store_a(a_next, (kt + 1) % 2)
            D.barrier()
            b_cur, s_cur = b_next, s_next

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
        v = D.lds_load(lds, row * row_bytes + cbyte, v4i32)
        D.buffer_store(v, rs_c, D.guarded_offset(D.cmp_lt(gm, Mv), gm * (N * 2) + gc * 2))
