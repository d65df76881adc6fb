"""Host-side checks of the FlyDSL ports' layout math (no GPU, no FlyDSL compile).

The kernels compute every address with the functions in ``kernels/<family>/layout.py``. Here the
same functions run on torch integer tensors to simulate what each lane of each workgroup fetches
from the *prepared* buffers, the MFMA tile products are assembled in fp32 following the MFMA
operand/accumulator lane conventions, and the result is compared with the problem's fp32 oracle.
A deliberately broken layout must make the simulation disagree with the oracle.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skillrun_kernels._flydsl import layoutmath as LM
from skillrun_kernels.fp8_blockscale_gemm import layout as BL
from skillrun_kernels.fp8_blockscale_gemm import problem as bs_problem

LANES = torch.arange(64)


def fp8_bytes_to_f32(b: torch.Tensor) -> torch.Tensor:
    return b.to(torch.uint8).view(torch.float8_e4m3fn).float()


def gather(buf: torch.Tensor, offsets: torch.Tensor, nbytes: int) -> torch.Tensor:
    """Bytes ``[off, off+nbytes)`` per offset, 0 past the end (a bounded buffer descriptor)."""
    idx = offsets.unsqueeze(-1) + torch.arange(nbytes)
    ok = (idx >= 0) & (idx < buf.numel())
    return torch.where(ok, buf[idx.clamp(0, buf.numel() - 1)], torch.zeros((), dtype=buf.dtype))


def mfma_f8_16x16x128(a_frag: torch.Tensor, b_frag: torch.Tensor) -> torch.Tensor:
    """16x16x128 fp8 MFMAs from per-lane 32-byte fragments -> per-lane 4 f32 results.

    ``a_frag [MI, 64, 32]`` and ``b_frag [NI, 64, 32]`` give all ``MI x NI`` products at once.
    Lane ``l`` supplies A row ``l%16`` / B column ``l%16``; lane group ``g = l//16`` supplies the
    same 32 K slots for A and B, so the product sums over groups and slots. Result element ``i`` of
    lane ``l`` is row ``acc_row(l, i)``, column ``acc_col(l)``. Returns ``[MI, NI, 64, 4]``.
    """
    a = fp8_bytes_to_f32(a_frag).view(-1, 4, 16, 32)  # [mi, group, row, slot]
    b = fp8_bytes_to_f32(b_frag).view(-1, 4, 16, 32)  # [ni, group, col, slot]
    tile = torch.einsum("mgrs,ngcs->mnrc", a, b)  # [mi, ni, 16 rows, 16 cols]
    rows = torch.stack([LM.acc_row(LANES, i) for i in range(4)], dim=1)  # [64, 4]
    cols = LM.acc_col(LANES).unsqueeze(1).expand(64, 4)
    return tile[:, :, rows, cols]


def simulate_blockscale(prep: dict, tile_m: int, tile_n: int, tile_k: int, xcd_swizzle: int,
                        waves_m: int = 1, waves_n: int = 4, lay=BL) -> torch.Tensor:
    """Run every workgroup's address math on the prepared buffers and return C in fp32.

    ``waves_m x waves_n`` waves split the tile (4-wave core: 1x4; 8-wave core: 2x4 with 64-row halves).
    """
    M, N, K = prep["M"], prep["N"], prep["K"]
    a, b, sa, sb = prep["a"], prep["b_shuf"], prep["a_scale_t"], prep["b_scale"]
    n16 = -(-N // 16) * 16
    grid_m, grid_n = -(-M // tile_m), -(-n16 // tile_n)
    rows_per_wave, cols_per_wave = tile_m // waves_m, tile_n // waves_n
    out = torch.full((M, N), float("nan"))
    seen = torch.zeros(grid_m, grid_n, dtype=torch.int64)
    for pid in range(grid_m * grid_n):
        pm, pn = lay.tile_of(pid, grid_m, grid_n, xcd_swizzle)
        seen[pm, pn] += 1
        m0, n0 = pm * tile_m, pn * tile_n
        acc = {}
        for kt in range(K // tile_k):
            # Global -> LDS copy of the A tile, through the kernel's copy map and swizzle.
            # (8-wave core: each 256-thread group copies its own row half into its own LDS half)
            lds = torch.zeros(tile_m * tile_k, dtype=torch.uint8)
            threads = torch.arange(256)
            for grp in range(waves_m):
                r0 = grp * rows_per_wave
                for s in range(rows_per_wave * tile_k // (16 * 256)):
                    row, kbyte = lay.tile_copy_coords(threads, s, tile_k, 256)
                    src = torch.where(m0 + r0 + row < M, (m0 + r0 + row) * K + kt * tile_k + kbyte, torch.full_like(row, a.numel()))
                    data = gather(a, src, 16)
                    dst = grp * rows_per_wave * tile_k + lay.lds_swizzle_offset(row, kbyte, tile_k).unsqueeze(-1) + torch.arange(16)
                    lds[dst.reshape(-1)] = data.reshape(-1)
            for wm in range(waves_m):
                for wn in range(waves_n):
                    wrow = wm * rows_per_wave
                    wcol = n0 + lay.wave_columns(wn, tile_n, waves_n)
                    m_rep, n_acc = rows_per_wave // 16, cols_per_wave // 16
                    mis, nis = torch.arange(m_rep).view(-1, 1), torch.arange(n_acc).view(-1, 1)
                    for kbl in range(tile_k // 128):
                        kb = kt * (tile_k // 128) + kbl
                        r = mis * 16 + lay.operand_row(LANES)  # [mi, 64], rows within the group's half
                        a_frag = torch.cat([
                            gather(lds, wrow * tile_k + lay.lds_swizzle_offset(r, lay.frag_chunk_k(LANES, h) + kbl * 128, tile_k), 16)
                            for h in (0, 1)], dim=-1)
                        srow = m0 + wrow + mis * 16 + lay.acc_row(LANES, 0)  # [mi, 64]
                        sidx = lay.a_scale_index(srow, kb, M).unsqueeze(-1) + torch.arange(4)
                        sa_v = sa[sidx.clamp(0, sa.numel() - 1)]  # [mi, 64, 4]
                        col = wcol + nis * 16 + lay.operand_row(LANES)  # [ni, 64]
                        b_frag = torch.cat([gather(b, lay.b_frag_offset(col, kb, LANES, h, K), 16) for h in (0, 1)], dim=-1)
                        blk = mfma_f8_16x16x128(a_frag, b_frag)  # [mi, ni, 64, 4]
                        sbi = lay.b_scale_index(wcol + nis.view(-1) * 16, kb, K)
                        sb_s = torch.where(sbi < sb.numel(), sb[sbi.clamp(0, sb.numel() - 1)], torch.zeros(()))
                        contrib = blk * (sa_v[:, None] * sb_s.view(1, -1, 1, 1))
                        key = (wm, wn)
                        acc[key] = acc.get(key, torch.zeros_like(contrib)) + contrib
        for (wm, wn), v in acc.items():
            for mi in range(v.shape[0]):
                for ni in range(v.shape[1]):
                    rows = m0 + wm * rows_per_wave + mi * 16 + torch.stack([lay.acc_row(LANES, i) for i in range(4)], 1)
                    cols = (n0 + lay.wave_columns(wn, tile_n, waves_n) + ni * 16 + lay.acc_col(LANES)).unsqueeze(1).expand(64, 4)
                    ok = (rows < M) & (cols < N)
                    out[rows[ok], cols[ok]] = v[mi, ni][ok]
    assert int(seen.min()) == 1 and int(seen.max()) == 1, "rasterization must visit every tile exactly once"
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    return float((out.double() - ref.double()).norm() / ref.double().norm())


BS_SHAPE = {"M": 80, "N": 272, "K": 512}  # ragged M, N not a multiple of 128 or of tile_n


@pytest.fixture(scope="module")
def bs_case():
    inputs = bs_problem.make_inputs(BS_SHAPE, seed=3, device="cpu")
    return BL.prepare(inputs), bs_problem.oracle(inputs)


@pytest.mark.parametrize("tiles,xcd", [((64, 256, 128), 0), ((32, 128, 256), 2), ((16, 64, 256), 1)])
def test_blockscale_4wave_fetches_reproduce_the_oracle(bs_case, tiles, xcd):
    prep, ref = bs_case
    out = simulate_blockscale(prep, *tiles, xcd_swizzle=xcd)
    assert rel_err(out, ref) < 1e-5


def test_blockscale_8wave_fetches_reproduce_the_oracle(bs_case):
    prep, ref = bs_case
    out = simulate_blockscale(prep, 128, 256, 128, xcd_swizzle=0, waves_m=2, waves_n=4)
    assert rel_err(out, ref) < 1e-5


class _BrokenPreshuffle:
    """The block-scale layout with the 16x16 preshuffle's row/column roles swapped in the reader."""

    def __getattr__(self, name):
        return getattr(BL, name)

    @staticmethod
    def b_frag_offset(col, kb, lane, half, K):
        k = kb * 128 + BL.frag_chunk_k(lane, half)
        # Wrong: treats the 16-byte chunk as column-major (n and k swapped inside a 256-byte tile).
        return (col // 16) * 16 * K + (k // 16) * 256 + (k % 16) * 16 + (col % 16)


class _BrokenFragment:
    """A-side fragment halves read 32 bytes apart instead of 64 (B keeps the right convention)."""

    def __getattr__(self, name):
        return getattr(BL, name)

    @staticmethod
    def frag_chunk_k(lane, half):
        return (lane // 16) * 32 + half * 16


@pytest.mark.parametrize("broken", [_BrokenPreshuffle(), _BrokenFragment()], ids=["preshuffle", "fragment"])
def test_a_broken_layout_fails_the_simulation(bs_case, broken):
    prep, ref = bs_case
    out = simulate_blockscale(prep, 64, 256, 128, xcd_swizzle=0, lay=broken)
    assert rel_err(out, ref) > 0.1


def test_transposed_scale_index_matches_the_problem_layout(bs_case):
    prep, _ = bs_case
    inputs = bs_problem.make_inputs(BS_SHAPE, seed=3, device="cpu")
    M, K = BS_SHAPE["M"], BS_SHAPE["K"]
    rows, kbs = torch.meshgrid(torch.arange(M), torch.arange(K // 128), indexing="ij")
    assert torch.equal(prep["a_scale_t"][BL.a_scale_index(rows, kbs, M)], inputs["a_scale"])
    cols = torch.arange(BS_SHAPE["N"])
    for kb in range(K // 128):
        assert torch.equal(prep["b_scale"][BL.b_scale_index(cols, kb, K)], inputs["b_scale"][cols // 128, kb])


# ---------------------------------------------------------------- preshuffle and lane maps
@given(n16=st.integers(1, 6), k16=st.integers(1, 12))
@settings(max_examples=40, deadline=None)
def test_preshuffle_offset_is_a_bijection_and_matches_the_host_shuffle(n16, k16):
    N, K = 16 * n16, 16 * k16
    w = torch.randint(0, 256, (N, K), dtype=torch.uint8)
    flat = BL.preshuffle_b(w)
    n, k = torch.meshgrid(torch.arange(N), torch.arange(K), indexing="ij")
    off = BL.preshuffle_offset(n, k, K)
    assert torch.equal(flat[off], w)
    assert torch.equal(torch.sort(off.reshape(-1)).values, torch.arange(N * K))
    n2, k2 = BL.preshuffle_inverse(off, K)
    assert torch.equal(n2, n) and torch.equal(k2, k)
    assert torch.equal(BL.unshuffle_b(flat, N, K), w)


def test_operand_fragment_covers_each_k_once_per_lane_group():
    for g in range(4):
        ks = sorted(BL.frag_kbyte(16 * g + r, j) for r in range(1) for j in range(32))
        assert len(set(ks)) == 32
    allk = sorted(BL.frag_kbyte(16 * g, j) for g in range(4) for j in range(32))
    assert allk == list(range(128))
    assert [BL.frag_chunk_k(l, 0) for l in (0, 16, 32, 48)] == [0, 16, 32, 48]
    assert [BL.frag_chunk_k(l, 1) for l in (0, 16, 32, 48)] == [64, 80, 96, 112]


def test_accumulator_lane_map_tiles_16x16_once():
    cells = {(int(LM.acc_row(l, i)), int(LM.acc_col(l))) for l in range(64) for i in range(4)}
    assert cells == {(r, c) for r in range(16) for c in range(16)}


@given(rows=st.integers(1, 64), chunks_log=st.integers(0, 4))
@settings(max_examples=30, deadline=None)
def test_lds_swizzle_is_a_bijection_on_the_tile(rows, chunks_log):
    row_bytes = 16 << chunks_log
    r, kb = torch.meshgrid(torch.arange(rows), torch.arange(row_bytes), indexing="ij")
    off = LM.lds_swizzle_offset(r, kb, row_bytes)
    assert torch.equal(torch.sort(off.reshape(-1)).values, torch.arange(rows * row_bytes))


# ---------------------------------------------------------------- rasterization bijections
@given(grid_m=st.integers(1, 70), grid_n=st.integers(1, 70), group=st.integers(0, 9), xcds=st.sampled_from([1, 3, 8]))
@settings(max_examples=200, deadline=None)
def test_tile_of_is_a_bijection_over_the_grid(grid_m, grid_n, group, xcds):
    pids = torch.arange(grid_m * grid_n)
    pm, pn = LM.tile_of(pids, grid_m, grid_n, group, xcds)
    assert int(pm.min()) >= 0 and int(pm.max()) < grid_m and int(pn.min()) >= 0 and int(pn.max()) < grid_n
    assert torch.unique(pm * grid_n + pn).numel() == grid_m * grid_n
    # The scalar path (what a kernel traces per workgroup) agrees with the vectorized one.
    for p in (0, grid_m * grid_n - 1, (grid_m * grid_n) // 2):
        assert LM.tile_of(p, grid_m, grid_n, group, xcds) == (int(pm[p]), int(pn[p]))


@given(n=st.integers(1, 5000), xcds=st.sampled_from([2, 8]))
@settings(max_examples=200, deadline=None)
def test_xcd_remap_is_a_bijection_with_remainders(n, xcds):
    pids = torch.arange(n)
    ids = LM.xcd_remap(pids, n, xcds)
    assert torch.equal(torch.sort(ids).values, pids)
    # Each XCD's workgroups get one contiguous run of ids.
    for x in range(min(xcds, n)):
        run = torch.sort(ids[pids % xcds == x]).values
        assert torch.equal(run, torch.arange(int(run[0]), int(run[0]) + run.numel()))


def test_xcd_remap_unbalanced_example():
    # 10 workgroups on 8 XCDs: XCDs 0 and 1 get two each, the rest one.
    assert [LM.xcd_remap(p, 10, 8) for p in range(10)] == [0, 2, 4, 5, 6, 7, 8, 9, 1, 3]


# ---------------------------------------------------------------- batched row-wise fp8 GEMM
from skillrun_kernels.fp8_rowwise_batched_gemm import layout as RL  # noqa: E402
from skillrun_kernels.fp8_rowwise_batched_gemm import problem as rw_problem  # noqa: E402


def simulate_rowwise(prep: dict, tile_m: int, tile_n: int, tile_k: int, xcd_swizzle: int, lay=RL) -> torch.Tensor:
    """Every (batch, workgroup): batch windows, A through the swizzled LDS tile, B fragments, epilogue scales."""
    B, M, N, K = prep["B"], prep["M"], prep["N"], prep["K"]
    n16 = -(-N // 16) * 16
    grid_m, grid_n = -(-M // tile_m), -(-n16 // tile_n)
    out = torch.full((B, M, N), float("nan"))
    m_rep, n_acc = tile_m // 16, tile_n // 64
    mis, nis = torch.arange(m_rep).view(-1, 1), torch.arange(n_acc).view(-1, 1)
    for bz in range(B):
        x = prep["xq"][bz * M * K:(bz + 1) * M * K]  # the batch's descriptor window
        w = prep["wq_shuf"][bz * n16 * K:(bz + 1) * n16 * K]
        xs = prep["x_scale"][bz * M:(bz + 1) * M]
        ws = prep["w_scale"][bz * N:(bz + 1) * N]
        for pid in range(grid_m * grid_n):
            pm, pn = lay.tile_of(pid, grid_m, grid_n, xcd_swizzle)
            m0, n0 = pm * tile_m, pn * tile_n
            acc = torch.zeros(4, m_rep, n_acc, 64, 4)
            for kt in range(K // tile_k):
                lds = torch.zeros(tile_m * tile_k, dtype=torch.uint8)
                threads = torch.arange(256)
                for s in range(tile_m * tile_k // 4096):
                    row, kbyte = lay.tile_copy_coords(threads, s, tile_k, 256)
                    data = gather(x, (m0 + row) * K + kt * tile_k + kbyte, 16)
                    dst = lay.lds_swizzle_offset(row, kbyte, tile_k).unsqueeze(-1) + torch.arange(16)
                    lds[dst.reshape(-1)] = data.reshape(-1)
                for wn in range(4):
                    wcol = n0 + lay.wave_columns(wn, tile_n, 4)
                    for ks in range(tile_k // 128):
                        kstep = kt * (tile_k // 128) + ks
                        r = mis * 16 + lay.operand_row(LANES)
                        a_frag = torch.cat([gather(lds, lay.lds_swizzle_offset(r, lay.frag_chunk_k(LANES, h) + ks * 128, tile_k), 16)
                                            for h in (0, 1)], dim=-1)
                        col = wcol + nis * 16 + lay.operand_row(LANES)
                        b_frag = torch.cat([gather(w, lay.b_frag_offset(col, kstep, LANES, h, K), 16) for h in (0, 1)], dim=-1)
                        acc[wn] += mfma_f8_16x16x128(a_frag, b_frag)
            for wn in range(4):
                for mi in range(m_rep):
                    rows = m0 + mi * 16 + torch.stack([lay.acc_row(LANES, i) for i in range(4)], 1)
                    xs_v = torch.where(rows < M, xs[rows.clamp(max=M - 1)], torch.zeros(()))
                    for ni in range(n_acc):
                        cols = (n0 + lay.wave_columns(wn, tile_n, 4) + ni * 16 + lay.acc_col(LANES)).unsqueeze(1).expand(64, 4)
                        ws_v = torch.where(cols < N, ws[cols.clamp(max=N - 1)], torch.zeros(()))
                        ok = (rows < M) & (cols < N)
                        out[bz, rows[ok], cols[ok]] = (acc[wn, mi, ni] * xs_v * ws_v)[ok]
    return out


RW_SHAPE = {"batch": 3, "M": 40, "N": 208, "K": 512}


@pytest.fixture(scope="module")
def rw_case():
    inputs = rw_problem.make_inputs(RW_SHAPE, seed=5, device="cpu")
    return RL.prepare(inputs), rw_problem.oracle(inputs)


@pytest.mark.parametrize("tiles,xcd", [((32, 128, 256), 1), ((16, 64, 256), 0)])
def test_rowwise_batched_fetches_reproduce_the_oracle(rw_case, tiles, xcd):
    prep, ref = rw_case
    assert rel_err(simulate_rowwise(prep, *tiles, xcd), ref) < 1e-5


def test_rowwise_broken_batch_window_fails(rw_case):
    prep, ref = rw_case
    broken = dict(prep)
    # A window computed with N instead of N16 (= the real bug class of a wrong per-batch stride).
    n, k = prep["N"], prep["K"]
    broken["wq_shuf"] = torch.roll(prep["wq_shuf"], shifts=16 * k)
    assert rel_err(simulate_rowwise(broken, 32, 128, 256, 1), ref) > 0.1
    assert n % 16 == 0  # the roll is a whole 16-row block, so only the window start is wrong


def test_rowwise_default_config_respects_the_occupancy_rule():
    from skillrun_kernels.fp8_rowwise_batched_gemm.flydsl_gfx950 import MIN_WORKGROUPS, select_default_config

    for (B, M, N, K) in [(16, 1, 1280, 8192), (16, 4096, 8192, 1024), (1, 64, 4096, 4096), (2, 300, 512, 768)]:
        cfg = select_default_config(B, M, N, K)
        assert K % cfg["tile_k"] == 0 and (cfg["tile_m"] * cfg["tile_k"]) % 4096 == 0
        tiles = -(-M // cfg["tile_m"]) * -(-N // cfg["tile_n"]) * B
        smallest = -(-M // 16) * -(-N // 64) * B
        assert tiles >= MIN_WORKGROUPS or tiles == smallest


# ---------------------------------------------------------------- a16wi4 MoE
from skillrun_kernels.moe_a16wi4 import flydsl_prep as moe_prep  # noqa: E402
from skillrun_kernels.moe_a16wi4 import layout as ML  # noqa: E402
from skillrun_kernels.moe_a16wi4 import problem as moe_problem  # noqa: E402


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def lane_codes(words: torch.Tensor, lay) -> torch.Tensor:
    """int32 dwords [..., W] -> the 8 signed codes of each, by the kernel's shift/sign-extend rule."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.tensor([lay.code_bit_shift(i) for i in range(8)])
    top = ((w.unsqueeze(-1) << shifts) & 0xFFFFFFFF)  # code i in bits [31:28]
    code = top >> 28
    return torch.where(code >= 8, code - 16, code).flatten(-2).float()  # [..., W*8]


def mfma_bf16_16x16x32(a_vals: torch.Tensor, b_vals: torch.Tensor) -> torch.Tensor:
    """a_vals [MI, 64, 8], b_vals [NI, 64, 8] (lane group g supplies the same 8 K slots) -> [MI, NI, 64, 4]."""
    a = a_vals.view(-1, 4, 16, 8)
    b = b_vals.view(-1, 4, 16, 8)
    tile = torch.einsum("mgri,ngci->mnrc", a, b)
    rows = torch.stack([LM.acc_row(LANES, i) for i in range(4)], dim=1)
    return tile[:, :, rows, LM.acc_col(LANES).unsqueeze(1).expand(64, 4)]


def simulate_moe_stage(stage: int, a_src: torch.Tensor, a_rows: torch.Tensor, w: torch.Tensor, s: torch.Tensor,
                       block_expert: torch.Tensor, tile_m: int, tile_n: int, tile_k: int, k_wave: int,
                       K: int, N_w: int, N_out: int, gs: int, I: int, lay=ML) -> torch.Tensor:
    """Partial sums of one stage for every live block: returns [blocks*tile_m, N_out] (stage 1: SiLU(g)*u)."""
    n_waves, k_slice = 4 // k_wave, tile_k // k_wave
    steps, lane_bytes, G = k_slice // 32, k_slice // 8, K // gs
    n_acc, sets = tile_n // n_waves // 16, (2 if stage == 1 else 1)
    row_bytes = tile_k * 2
    out = torch.zeros(block_expert.numel() * tile_m, N_out)
    w_window = N_w * K // 2
    for blk, e in enumerate(block_expert.tolist()):
        if e < 0:
            continue
        we = w[e * w_window:(e + 1) * w_window]
        for nt in range(N_out // tile_n):
            acc = torch.zeros(k_wave, n_waves, tile_m // 16, sets * n_acc, 64, 4)
            for kt in range(K // tile_k):
                lds = torch.zeros(tile_m * row_bytes, dtype=torch.uint8)
                threads = torch.arange(256)
                for st_ in range(tile_m * row_bytes // 4096):
                    row, kbyte = lay.tile_copy_coords(threads, st_, row_bytes, 256)
                    base = a_rows[blk * tile_m + row]  # byte offset of the row (token row or act row)
                    data = gather(a_src, base + kt * row_bytes + kbyte, 16)
                    dst = lay.lds_swizzle_offset(row, kbyte, row_bytes).unsqueeze(-1) + torch.arange(16)
                    lds[dst.reshape(-1)] = data.reshape(-1)
                for kw in range(k_wave):
                    for nw in range(n_waves):
                        base_k = lay.slice_base(kt, kw, tile_k, k_slice)
                        bvals = []
                        for cset in range(sets):
                            for ni in range(n_acc):
                                n = nt * tile_n + nw * (tile_n // n_waves) + ni * 16 + lay.operand_row(LANES)
                                n = n + cset * I if stage == 1 else n
                                k0 = lay.lane_k0(base_k, LANES, k_slice)
                                raw = torch.cat([gather(we, lay.weight_offset(n, k0 + p * 32, K), min(16, lane_bytes))
                                                 for p in range(max(1, lane_bytes // 16))], dim=-1)
                                words = raw.view(64, -1).contiguous().view(torch.int32)
                                codes = lane_codes(words, lay)  # [64, steps*8]
                                scl = torch.stack([
                                    s[lay.scale_index(e, lay.step_k0(base_k, LANES, k_slice, j) // gs, n, G, N_w)]
                                    for j in range(steps)], dim=1)  # [64, steps]
                                bvals.append(bf16_round(codes.view(64, steps, 8) * scl.unsqueeze(-1)))
                        bvals = torch.stack(bvals)  # [sets*n_acc, 64, steps, 8]
                        for j in range(steps):
                            rows = torch.arange(tile_m // 16).view(-1, 1) * 16 + lay.operand_row(LANES)
                            kin = lay.step_k0(kw * k_slice, LANES, k_slice, j)
                            a_b = gather(lds, lay.lds_swizzle_offset(rows, kin * 2, row_bytes), 16)
                            a_vals = a_b.contiguous().view(torch.bfloat16).float().view(-1, 64, 8)
                            acc[kw, nw] += mfma_bf16_16x16x32(a_vals, bvals[:, :, j])
            total = acc.sum(0)  # the slice-K reduction
            for nw in range(n_waves):
                for mi in range(tile_m // 16):
                    rows = blk * tile_m + mi * 16 + torch.stack([lay.acc_row(LANES, i) for i in range(4)], 1)
                    for ni in range(n_acc):
                        cols = (nt * tile_n + nw * (tile_n // n_waves) + ni * 16 + lay.acc_col(LANES)).unsqueeze(1).expand(64, 4)
                        if stage == 1:
                            gate, up = total[nw, mi, ni], total[nw, mi, n_acc + ni]
                            out[rows, cols] = bf16_round(torch.nn.functional.silu(gate) * up)
                        else:
                            out[rows, cols] = total[nw, mi, ni]
    return out


MOE_SHAPE = {"tokens": 5, "model_dim": 256, "inter_dim": 128, "experts": 4, "topk": 2, "group_size": 32}


@pytest.fixture(scope="module")
def moe_case():
    inputs = moe_problem.make_inputs(MOE_SHAPE, seed=7, device="cpu")
    return inputs, moe_prep.prepare_weights(inputs), moe_problem.oracle(inputs)


def simulate_moe(inputs, prep, tile_m, s1, s2, lay=ML):
    T, topk = inputs["topk_ids"].shape
    D, I, gs = prep["D"], prep["I"], prep["group_size"]
    r = moe_prep.route(inputs["topk_ids"], inputs["topk_weights"], prep["E"], tile_m)
    ids = r.sorted_ids.long()
    x_bytes = inputs["x"].contiguous().view(torch.uint8).view(-1)
    x_rows = lay.pair_token(ids, topk) * (D * 2)  # sentinel rows land past x: read as 0
    act = simulate_moe_stage(1, x_bytes, x_rows, prep["w1"], prep["s1"], r.block_expert, tile_m, *s1,
                             K=D, N_w=2 * I, N_out=I, gs=gs, I=I, lay=lay)
    act_bytes = act.to(torch.bfloat16).view(torch.uint8).view(-1)
    act_rows = torch.arange(ids.numel()) * (I * 2)
    y = simulate_moe_stage(2, act_bytes, act_rows, prep["w2"], prep["s2"], r.block_expert, tile_m, *s2,
                           K=I, N_w=D, N_out=D, gs=gs, I=I, lay=lay)
    out = torch.zeros(T, D)
    live = ids < T * topk
    out.index_add_(0, lay.pair_token(ids[live], topk), y[live] * r.weights[ids[live]].unsqueeze(1))
    return out


@pytest.mark.parametrize("s1,s2", [((32, 128, 2), (64, 128, 1)), ((16, 128, 4), (128, 128, 1)), ((64, 256, 1), (64, 128, 2))],
                         ids=["kslice64", "kslice32", "kslice256"])
def test_moe_fetches_reproduce_the_oracle(moe_case, s1, s2):
    inputs, prep, ref = moe_case
    out = simulate_moe(inputs, prep, 16, s1, s2)
    assert rel_err(out, ref) < 1e-2  # bf16 weights, activations and intermediate


class _SwappedNibbles:
    """Reads the high nibble as the even k: the packing convention broken on the kernel side."""

    def __getattr__(self, name):
        return getattr(ML, name)

    @staticmethod
    def code_bit_shift(i):
        return 28 - 4 * (i ^ 1)


def test_moe_broken_nibble_order_fails(moe_case):
    inputs, prep, ref = moe_case
    out = simulate_moe(inputs, prep, 16, (32, 128, 2), (64, 128, 1), lay=_SwappedNibbles())
    assert rel_err(out, ref) > 0.3


def test_moe_routing_covers_every_pair_once_in_expert_blocks():
    ids = torch.tensor([[2, 0], [2, 3], [1, 2], [0, 2], [3, 1]], dtype=torch.int32)
    r = moe_prep.route(ids, torch.rand(5, 2), experts=4, tile_m=16)
    live = r.sorted_ids[r.sorted_ids < 10].long()
    assert torch.equal(torch.sort(live).values, torch.arange(10))
    for b, e in enumerate(r.block_expert.tolist()):
        rows = r.sorted_ids[b * 16:(b + 1) * 16].long()
        rows = rows[rows < 10]
        if e < 0:
            assert rows.numel() == 0
        else:
            assert torch.all(ids.view(-1)[rows] == e)
    assert r.blocks == ML.blocks_bound(5, 2, 4, 16) >= int((r.block_expert >= 0).sum())


@given(q=st.lists(st.integers(-8, 7), min_size=2, max_size=64).filter(lambda v: len(v) % 2 == 0))
@settings(max_examples=60, deadline=None)
def test_int4_pack_unpack_round_trip(q):
    t = torch.tensor(q, dtype=torch.int8).view(1, -1)
    packed = ML.pack_int4(t)
    assert torch.equal(ML.unpack_int4(packed), t)
    # low nibble = even k
    assert int(packed[0, 0]) & 0xF == q[0] & 0xF and int(packed[0, 0]) >> 4 == q[1] & 0xF
    # the kernel's dword decode gives the same codes
    if len(q) % 8 == 0:
        words = packed.view(-1).contiguous().view(torch.int32)
        assert torch.equal(lane_codes(words, ML).to(torch.int8), t.view(-1))


def test_int4_packing_matches_the_problem_helpers():
    from skillrun_kernels.moe_a16wi4 import packing

    q = torch.randint(-8, 8, (3, 32, 64), dtype=torch.int8)
    assert torch.equal(ML.pack_int4(q), packing.pack_int4(q))
