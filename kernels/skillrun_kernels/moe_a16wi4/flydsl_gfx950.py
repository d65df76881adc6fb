"""FlyDSL a16wi4 MoE for gfx950 (gfx942 path included): bf16 activations x int4 weights with bf16 group scales.

Two-stage GEMM, both stages launched by one ``@flyc.jit`` launcher on the same stream:

* **stage 1** ``act[p, n] = SiLU(x[tok(p)] . W1_gate[e][n]) * (x[tok(p)] . W1_up[e][n])`` for every
  sorted (token, slot) row ``p`` of a ``tile_m``-row block owned by expert ``e``; the A rows are
  gathered through the routing's sorted pair ids; gate and up columns ``n`` and ``I + n`` share the
  A tile. Output ``act`` is bf16 ``[blocks*tile_m, I]``.
* **stage 2** ``out[tok(p)] += w(p) * (act[p] . W2[e])``: A rows are contiguous, the weighted result
  is scattered with ``buffer_atomic_add_f32`` into an f32 ``[tokens, D]`` buffer (then cast to bf16).

The int4 weights are packed two codes per byte (low nibble = even k) in the kpack-16 16x16
preshuffle (``layout.py``); each lane fetches its codes straight into registers and dequantizes
them in-register (signed bit-field extract -> f32 -> x group scale -> bf16) before
``v_mfma_f32_16x16x32_bf16`` (gfx942: two ``v_mfma_f32_16x16x16_bf16``). A goes through LDS (two
buffers, 16-byte XOR swizzle).

Decode tile rules (stage 1): the 4 waves split ``n_waves = 4 / k_wave`` ways along N and ``k_wave``
ways along K (intra-block slice-K, reduced through LDS), so narrow ``tile_n`` (16/32) still gives
every wave a 16-column MFMA strip and the grid (``blocks * I / tile_n``) fills the GPU at 1-16 tokens.
``tile_m`` defaults from tokens*topk/experts when the recipe omits it. The K loop is **rolled**
(runtime ``scf.for``) for ``tile_m <= 16`` and unrolled above, as in the seed (``k_loop`` overrides),
except for the one combination the seed found the rolled loop computes wrongly: ``k_wave == 1`` (four
N-waves) with one N accumulator per wave and ``tile_k >= 256`` (e.g. stage 2's t16x64x256). That stage
falls back to the unrolled body whatever ``k_loop`` says (:func:`roll_is_safe`; a correctness guard,
checked here by compiling only: no GPU has run it).
``b_nt`` = 2 marks stage-1 weight loads non-temporal (streaming), 0 = cached. Stage 2 runs
``stage2_b_nt`` = 0 by default: the seed's int4 stage 2 never registered b_nt and ran (and was tuned)
L2-cached.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from skillrun_kernels.protocol import KernelLaunch, UnsupportedShape

from . import layout as L

NTHREADS = 256
WAVES = 4
KERNEL_PREFIX = "moe_a16wi4"


@dataclass(frozen=True)
class StageConfig:
    tile_n: int
    tile_k: int
    k_wave: int

    @property
    def n_waves(self) -> int:
        return WAVES // self.k_wave

    @property
    def k_slice(self) -> int:
        return self.tile_k // self.k_wave


@dataclass(frozen=True)
class Config:
    tile_m: int | None = None
    tile_n: int = 128
    tile_k: int = 128
    k_wave: int = 1
    b_nt: int = 2
    k_loop: str | None = None  # "rolled" | "unrolled"; default: rolled iff tile_m <= 16 (and roll_is_safe)
    stage2_tile_n: int | None = None
    stage2_tile_k: int | None = None
    stage2_k_wave: int = 1
    stage2_b_nt: int = 0
    waves_per_eu: int = 0


def recommend_tile_m(tokens: int, topk: int, experts: int) -> int:
    """Rows per expert block: the expected rows an active expert receives, rounded to 16/32/64."""
    per_expert = tokens * topk / max(1, min(experts, tokens * topk))
    return 16 if per_expert <= 16 else (32 if per_expert <= 96 else 64)


@dataclass(frozen=True)
class Plan:
    T: int
    D: int
    I: int
    E: int
    topk: int
    gs: int
    tile_m: int
    s1: StageConfig
    s2: StageConfig
    rolled: bool  # stage 1's K loop
    b_nt: int  # stage 1's weight-load policy
    waves_per_eu: int
    rolled2: bool = False  # stage 2's K loop
    b_nt2: int = 0  # stage 2's weight-load policy

    def stage_rolled(self, stage: int) -> bool:
        return self.rolled if stage == 1 else self.rolled2

    def stage_b_nt(self, stage: int) -> int:
        return self.b_nt if stage == 1 else self.b_nt2


def roll_is_safe(sc: StageConfig) -> bool:
    """False for the combination the seed's rolled loop got wrong (aiter PR #4646): k_wave == 1 (four
    N-waves), one N accumulator per wave (tile_n == 64) and tile_k >= 256; the unrolled body is correct there."""
    n_acc = sc.tile_n // sc.n_waves // 16
    return not (sc.k_wave == 1 and n_acc == 1 and sc.tile_k >= 256)


def _check_stage(name: str, sc: StageConfig, tile_m: int, N: int, K: int, gs: int) -> None:
    if sc.k_wave not in (1, 2, 4):
        raise UnsupportedShape(f"{name}: k_wave={sc.k_wave} must be 1, 2 or 4")
    if sc.tile_n % (16 * sc.n_waves):
        raise UnsupportedShape(f"{name}: tile_n={sc.tile_n} must give each of {sc.n_waves} N-waves a multiple of 16 columns")
    if N % sc.tile_n:
        raise UnsupportedShape(f"{name}: N={N} must be a multiple of tile_n={sc.tile_n}")
    if sc.tile_k % sc.k_wave or sc.k_slice % L.MFMA_K or K % sc.tile_k:
        raise UnsupportedShape(f"{name}: tile_k={sc.tile_k} / k_wave={sc.k_wave} must be a multiple of 32 and tile_k must divide K={K}")
    quarter = sc.k_slice // 4
    if quarter % 8 or not (gs % quarter == 0 or quarter % gs == 0):
        raise UnsupportedShape(f"{name}: a lane's K run ({quarter}) must be a multiple of 8 and nest with group_size={gs}")
    if (tile_m * sc.tile_k * 2) % (16 * NTHREADS):
        raise UnsupportedShape(f"{name}: tile_m*tile_k*2={tile_m * sc.tile_k * 2} must be a multiple of {16 * NTHREADS} bytes")


def make_plan(shape: dict, config: dict | None) -> Plan:
    from . import problem

    T, D, I, E, topk, gs = problem.dims(shape)
    config = dict(config or {})
    unknown = sorted(set(config) - set(Config.__dataclass_fields__))
    if unknown:
        raise ValueError(f"moe_a16wi4.flydsl_gfx950: unknown config keys {unknown}; known: {sorted(Config.__dataclass_fields__)}")
    c = Config(**config)
    tm = c.tile_m or recommend_tile_m(T, topk, E)
    if tm % 16:
        raise UnsupportedShape(f"tile_m={tm} must be a multiple of 16")
    s1 = StageConfig(c.tile_n, c.tile_k, c.k_wave)
    s2 = StageConfig(c.stage2_tile_n or (64 if tm <= 16 and D % 64 == 0 else 128),
                     c.stage2_tile_k or (256 if I % 256 == 0 and tm <= 16 else 128), c.stage2_k_wave)
    _check_stage("stage 1", s1, tm, I, D, gs)
    _check_stage("stage 2", s2, tm, D, I, gs)
    if D % 32 or I % 32:
        raise UnsupportedShape("model_dim and inter_dim must be multiples of 32 (kpack-16 preshuffle)")
    if c.k_loop not in (None, "rolled", "unrolled"):
        raise ValueError(f"k_loop must be 'rolled' or 'unrolled', got {c.k_loop!r}")
    want_roll = (tm <= 16) if c.k_loop is None else (c.k_loop == "rolled")
    # The guard wins over k_loop: a rolled body known to compute wrong results is never built.
    rolled, rolled2 = want_roll and roll_is_safe(s1), want_roll and roll_is_safe(s2)
    for name, v in (("b_nt", c.b_nt), ("stage2_b_nt", c.stage2_b_nt)):
        if v not in (0, 2):
            raise ValueError(f"{name} must be 0 (cached) or 2 (streaming), got {v}")
    # 32-bit buffer offsets: f32 output [T, D], act [blocks*tile_m, I], all experts' f32 scales.
    sizes = {"out32": T * D * 4, "act": L.blocks_bound(T, topk, E, tm) * tm * I * 2, "scales": E * (D // gs) * 2 * I * 4}
    big = [k for k, v in sizes.items() if v >= 2**31 - 16]
    if big:
        raise UnsupportedShape(f"{big} exceed 2 GiB (32-bit buffer offsets)")
    return Plan(T, D, I, E, topk, gs, tm, s1, s2, rolled, c.b_nt, c.waves_per_eu, rolled2, c.stage2_b_nt)


def _stage_geometry(p: Plan, stage: int, arch: str) -> dict:
    sc = p.s1 if stage == 1 else p.s2
    K = p.D if stage == 1 else p.I
    N_out = p.I if stage == 1 else p.D
    N_w = 2 * p.I if stage == 1 else p.D
    sets = 2 if stage == 1 else 1
    m_rep = p.tile_m // 16
    n_acc = sc.tile_n // sc.n_waves // 16
    a_tile = p.tile_m * sc.tile_k * 2
    red_bytes = WAVES * m_rep * n_acc * sets * 1024 if sc.k_wave > 1 else 0
    return dict(
        stage=stage, sc=sc, K=K, N_out=N_out, N_w=N_w, sets=sets, m_rep=m_rep, n_acc=n_acc, tm=p.tile_m,
        G=K // p.gs, gs=p.gs, topk=p.topk, E=p.E, n_ktiles=K // sc.tile_k, a_tile=a_tile,
        a_steps=a_tile // (16 * NTHREADS), steps=sc.k_slice // L.MFMA_K, lane_bytes=sc.k_slice // 8,
        lds_bytes=max(2 * a_tile, red_bytes), rolled=p.stage_rolled(stage), b_nt=p.stage_b_nt(stage),
        gfx950=arch.startswith("gfx950"),
        T_pairs=p.T * p.topk, D=p.D, I=p.I,
    )


def _moe_stage_body(g: dict, OUT, A, W, S, SIDS, BEXP, WTS, T) -> None:
    """One stage's kernel (plain function: FlyDSL's AST rewriter leaves its trace-time loops alone)."""
    from skillrun_kernels._flydsl import dsl as D

    sc: StageConfig = g["sc"]
    stage, K, N_out, N_w, sets = g["stage"], g["K"], g["N_out"], g["N_w"], g["sets"]
    tm, m_rep, n_acc, G, gs, topk = g["tm"], g["m_rep"], g["n_acc"], g["G"], g["gs"], g["topk"]
    tk, k_slice, steps, lane_bytes = sc.tile_k, sc.k_slice, g["steps"], g["lane_bytes"]
    a_tile, a_steps, n_ktiles = g["a_tile"], g["a_steps"], g["n_ktiles"]
    row_bytes = tk * 2
    v4i32 = D.vec_t(4, D.i32_t())

    tid = D.thread_id()
    lane = L.fmod(tid, 64)
    wave = D.wave_uniform(L.fdiv(tid, 64))
    nw = L.fmod(wave, sc.n_waves)
    kw = L.fdiv(wave, sc.n_waves)
    n_tiles = N_out // sc.tile_n
    pid = D.block_id("x")
    blk = L.fdiv(pid, n_tiles)  # N fastest: neighbouring workgroups share the block's A rows
    nt = L.fmod(pid, n_tiles)
    Tv = D.I32(T)
    rs_bexp = D.tensor_rsrc(BEXP, 0x7FFFFFF0)
    e = D.I32(D.scalar_load_i32(rs_bexp, blk * 4))

    def block():
        p0 = blk * tm
        w_bytes = N_w * K // 2
        rs_w = D.tensor_rsrc(W, w_bytes, byte_offset=D.mul64(e, w_bytes))
        rs_s = D.tensor_rsrc(S, g["E"] * G * N_w * 4)
        rs_ids = D.tensor_rsrc(SIDS, 0x7FFFFFF0)
        if stage == 1:
            rs_a = D.tensor_rsrc(A, Tv * (K * 2))  # x [tokens, D]; the padding sentinel row reads 0
        else:
            rs_a = D.tensor_rsrc(A, 0x7FFFFFF0)  # act [blocks*tile_m, I]
        lds = D.lds_alloc(g["lds_bytes"])

        # The rows this thread copies are the same in every K tile: resolve the gather once.
        a_rows = []
        for s in range(a_steps):
            row, kbyte = L.tile_copy_coords(tid, s, row_bytes, NTHREADS)
            if stage == 1:
                pair = D.I32(D.buffer_load(rs_ids, (p0 + row) * 4, 4))
                a_rows.append((row, kbyte, L.pair_token(pair, topk) * (K * 2)))
            else:
                a_rows.append((row, kbyte, (p0 + row) * (K * 2)))

        def load_a(kt):
            return [D.buffer_load(rs_a, base + kt * row_bytes + kbyte) for (_, kbyte, base) in a_rows]

        def store_a(regs, buf_base):
            for (row, kbyte, _), r in zip(a_rows, regs):
                D.lds_store(lds, buf_base + L.lds_swizzle_offset(row, kbyte, row_bytes), r)

        def columns(cset, ni):
            n = nt * sc.tile_n + nw * (sc.tile_n // sc.n_waves) + ni * 16 + L.operand_row(lane)
            return n + cset * g["I"] if stage == 1 else n

        def load_b(kt):
            """Per (set, ni): the lane's k_slice/8 bytes of codes, as a list of dwords."""
            base = L.slice_base(kt, kw, tk, k_slice)
            out = []
            for cset in range(sets):
                for ni in range(n_acc):
                    n = columns(cset, ni)
                    k0 = L.lane_k0(base, lane, k_slice)
                    words = []
                    for piece in range(max(1, lane_bytes // 16)):
                        width = min(16, lane_bytes)
                        v = D.buffer_load(rs_w, L.weight_offset(n, k0 + piece * 32, K), width, nontemporal=g["b_nt"] == 2)
                        words += [D.extract(v, i) for i in range(width // 4)] if width > 4 else [v]
                    out.append(D.from_elements(words) if len(words) > 1 else words[0])
            return out

        def word_of(bvec, j):
            return D.extract(bvec, j) if steps > 1 else bvec

        def load_scales(kt):
            base = L.slice_base(kt, kw, tk, k_slice)
            quarter = k_slice // 4
            out = []
            for cset in range(sets):
                for ni in range(n_acc):
                    n = columns(cset, ni)
                    per_step, cache = [], {}
                    for j in range(steps):
                        key = (j * L.LANE_VALUES) // gs if gs <= quarter else 0
                        if key not in cache:
                            grp = L.fdiv(L.step_k0(base, lane, k_slice, j), gs)
                            cache[key] = D.bitcast(D.buffer_load(rs_s, L.scale_index(e, grp, n, G, N_w) * 4, 4), D.f32_t())
                        per_step.append(cache[key])
                    out.append(per_step)
            return out

        def mma(af, bf, acc):
            if g["gfx950"]:
                return D.mfma_bf16_16x16x32(af, bf, acc)
            a4 = [D.slice_vec(af, 0, 4), D.slice_vec(af, 4, 4)]
            b4 = [D.slice_vec(bf, 0, 4), D.slice_vec(bf, 4, 4)]
            return D.mfma_bf16_16x16x16(a4[1], b4[1], D.mfma_bf16_16x16x16(a4[0], b4[0], acc))

        def compute(kt_base_in_tile, buf_base, braw, scales, acc):
            """MFMAs of this wave's K slice of one tile; ``kt_base_in_tile`` = kw * k_slice."""
            acc = list(acc)
            for j in range(steps):
                afr = []
                for mi in range(m_rep):
                    row = mi * 16 + L.operand_row(lane)
                    kin = L.step_k0(kt_base_in_tile, lane, k_slice, j)  # K code within the tile
                    afr.append(D.bitcast(D.lds_load(lds, buf_base + L.lds_swizzle_offset(row, kin * 2, row_bytes), v4i32),
                                         D.vec_t(8, D.bf16_t())))
                for idx in range(sets * n_acc):
                    w = D.mulf(D.int4_codes_to_f32(word_of(braw[idx], j)), D.splat(scales[idx][j], 8))
                    bfrag = D.to_bf16(w)
                    for mi in range(m_rep):
                        a_i = mi * sets * n_acc + idx
                        acc[a_i] = mma(afr[mi], bfrag, acc[a_i])
            return acc

        n_accs = m_rep * sets * n_acc
        acc0 = [D.zeros_f32(4) for _ in range(n_accs)]
        kin0 = kw * k_slice
        store_a(load_a(0), 0)
        D.barrier()
        if g["rolled"] and n_ktiles > 1:
            b0 = load_b(0)

            def body(iv, state):
                kt = D.I32(iv)
                acc, bcur = state[:n_accs], state[n_accs:]
                a_next = load_a(kt + 1)
                b_next = load_b(kt + 1)
                cur = L.fmod(kt, 2) * a_tile
                acc = compute(kin0, cur, bcur, load_scales(kt), acc)
                store_a(a_next, a_tile - cur)
                D.barrier()
                return acc + b_next

            state = D.rolled_loop(0, n_ktiles - 1, acc0 + b0, body)
            acc = compute(kin0, ((n_ktiles - 1) % 2) * a_tile, state[n_accs:], load_scales(n_ktiles - 1), state[:n_accs])
        else:
            acc = acc0
            bcur = load_b(0)
            for kt in range(n_ktiles):
                if kt + 1 < n_ktiles:
                    a_next = load_a(kt + 1)
                    b_next = load_b(kt + 1)
                acc = compute(kin0, (kt % 2) * a_tile, bcur, load_scales(kt), acc)
                if kt + 1 < n_ktiles:
                    store_a(a_next, ((kt + 1) % 2) * a_tile)
                    D.barrier()
                    bcur = b_next

        if sc.k_wave > 1:
            # Slice-K: every wave parks its partial sums in LDS; the kw == 0 waves add them up.
            D.barrier()
            for i, a in enumerate(acc):
                D.lds_store(lds, ((wave * n_accs + i) * 64 + lane) * 16, a)
            D.barrier()

        def epilogue():
            final = list(acc)
            if sc.k_wave > 1:
                for other in range(1, sc.k_wave):
                    src_wave = nw + other * sc.n_waves
                    for i in range(n_accs):
                        part = D.lds_load(lds, ((src_wave * n_accs + i) * 64 + lane) * 16, D.vec_t(4, D.f32_t()))
                        final[i] = D.addf(final[i], part)
            for mi in range(m_rep):
                rows0 = p0 + mi * 16 + L.acc_row(lane, 0)
                if stage == 2:
                    pairs = D.buffer_load(rs_ids, rows0 * 4, 16)
                for ni in range(n_acc):
                    n = nt * sc.tile_n + nw * (sc.tile_n // sc.n_waves) + ni * 16 + L.acc_col(lane)
                    if stage == 1:
                        gate = final[mi * sets * n_acc + ni]
                        up = final[mi * sets * n_acc + n_acc + ni]
                        h = D.to_bf16(D.mulf(D.silu(gate), up))
                        for i in range(4):
                            D.buffer_store(D.extract(h, i), rs_out, ((rows0 + i) * N_out + n) * 2)
                    else:
                        y = final[mi * n_acc + ni]
                        for i in range(4):
                            pair = D.I32(D.extract(pairs, i))
                            ok = D.cmp_lt(pair, g["T_pairs"])
                            wgt = D.bitcast(D.buffer_load(rs_wts, D.select_i32(ok, pair, 0) * 4, 4), D.f32_t())
                            off = D.guarded_offset(ok, (L.pair_token(pair, topk) * N_out + n) * 4)
                            D.buffer_atomic_fadd(D.mulf(D.extract(y, i), wgt), rs_out, off)

        # act rows of a live block are always in range; the f32 output is bounded by tokens
        rs_out = D.tensor_rsrc(OUT, 0x7FFFFFF0) if stage == 1 else D.tensor_rsrc(OUT, Tv * (N_out * 4))
        rs_wts = D.tensor_rsrc(WTS, g["T_pairs"] * 4) if stage == 2 else None
        if sc.k_wave > 1:
            D.if_then(D.cmp_eq(kw, 0), epilogue)
        else:
            epilogue()

    D.if_then(D.cmp_ge(e, 0), block)


def _kernel_name(p: Plan, stage: int, arch: str) -> str:
    sc = p.s1 if stage == 1 else p.s2
    loop = "roll" if p.stage_rolled(stage) else "unroll"
    return (f"{KERNEL_PREFIX}_g{stage}_{arch}_t{p.tile_m}x{sc.tile_n}x{sc.tile_k}_kw{sc.k_wave}_nt{p.stage_b_nt(stage)}_{loop}"
            f"_d{p.D}_i{p.I}_e{p.E}_k{p.topk}_g{p.gs}")


def make_launcher(p: Plan, arch: str):
    """``launch(act, out32, x, w1, s1, w2, s2, sorted_ids, block_expert, weights, T, stream)``: both stages."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    g1 = _stage_geometry(p, 1, arch)
    g2 = _stage_geometry(p, 2, arch)
    nb = L.blocks_bound(p.T, p.topk, p.E, p.tile_m)
    grid1 = nb * (p.I // p.s1.tile_n)
    grid2 = nb * (p.D // p.s2.tile_n)
    value_attrs = {"rocdl.waves_per_eu": str(p.waves_per_eu)} if p.waves_per_eu else None

    @flyc.kernel(name=_kernel_name(p, 1, arch))
    def stage1(ACT: fx.Tensor, X: fx.Tensor, W1: fx.Tensor, S1: fx.Tensor, SIDS: fx.Tensor, BEXP: fx.Tensor, T: fx.Int32):
        _moe_stage_body(g1, ACT, X, W1, S1, SIDS, BEXP, None, T)

    @flyc.kernel(name=_kernel_name(p, 2, arch))
    def stage2(OUT: fx.Tensor, ACT: fx.Tensor, W2: fx.Tensor, S2: fx.Tensor, SIDS: fx.Tensor, BEXP: fx.Tensor,
               WTS: fx.Tensor, T: fx.Int32):
        _moe_stage_body(g2, OUT, ACT, W2, S2, SIDS, BEXP, WTS, T)

    @flyc.jit
    def launch(ACT: fx.Tensor, OUT: fx.Tensor, X: fx.Tensor, W1: fx.Tensor, S1: fx.Tensor, W2: fx.Tensor, S2: fx.Tensor,
               SIDS: fx.Tensor, BEXP: fx.Tensor, WTS: fx.Tensor, T: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        stage1(ACT, X, W1, S1, SIDS, BEXP, T, value_attrs=value_attrs).launch(grid=(grid1, 1, 1), block=(NTHREADS, 1, 1), stream=stream)
        stage2(OUT, ACT, W2, S2, SIDS, BEXP, WTS, T, value_attrs=value_attrs).launch(grid=(grid2, 1, 1), block=(NTHREADS, 1, 1), stream=stream)

    return launch


def _placeholders(p: Plan):
    import torch

    meta = "meta"
    nb = L.blocks_bound(p.T, p.topk, p.E, p.tile_m)
    G = p.D // p.gs
    return (
        torch.empty(nb * p.tile_m * p.I, dtype=torch.bfloat16, device=meta),
        torch.empty(p.T * p.D, dtype=torch.float32, device=meta),
        torch.empty(p.T * p.D, dtype=torch.bfloat16, device=meta),
        torch.empty(p.E * 2 * p.I * p.D // 2, dtype=torch.uint8, device=meta),
        torch.empty(p.E * G * 2 * p.I, dtype=torch.float32, device=meta),
        torch.empty(p.E * p.D * p.I // 2, dtype=torch.uint8, device=meta),
        torch.empty(p.E * (p.I // p.gs) * p.D, dtype=torch.float32, device=meta),
        torch.empty(nb * p.tile_m, dtype=torch.int32, device=meta),
        torch.empty(nb, dtype=torch.int32, device=meta),
        torch.empty(p.T * p.topk, dtype=torch.float32, device=meta),
        p.T,
    )


def compile_only(shape: dict, config: dict, arch: str) -> dict:
    from skillrun_kernels._flydsl.runtime import compile_only as _compile_only

    p = make_plan(shape, config)

    def make():
        import flydsl.expr as fx

        return make_launcher(p, arch), (*_placeholders(p), fx.Stream(None))

    describe = {"plan": {"tile_m": p.tile_m, "stage1": asdict(p.s1), "stage2": asdict(p.s2), "rolled": p.rolled, "b_nt": p.b_nt,
                         "stage2_rolled": p.rolled2, "stage2_b_nt": p.b_nt2},
                "shape": dict(shape)}
    return _compile_only(make, arch=arch, tag=_kernel_name(p, 1, arch), describe=describe)


def build(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Compile on the first ``run`` with real HIP tensors (FlyDSL runtime, current stream), then fast path."""
    from skillrun_kernels._flydsl.runtime import DeviceLaunch, require_rocm

    from . import flydsl_prep

    p = make_plan(shape, config)
    arch = require_rocm("moe_a16wi4.flydsl_gfx950")
    if not (arch.startswith("gfx950") or arch.startswith("gfx942")):
        raise UnsupportedShape(f"moe_a16wi4.flydsl_gfx950 targets gfx950/gfx942, not {arch}")
    launch = DeviceLaunch(make_launcher(p, arch))
    nb = L.blocks_bound(p.T, p.topk, p.E, p.tile_m)

    def prepare(inputs: dict) -> dict:
        import torch

        prep = flydsl_prep.prepare_weights(inputs)
        if prep["group_size"] != p.gs:
            raise ValueError(f"inputs use group_size {prep['group_size']}, the shape says {p.gs}")
        prep["x"] = inputs["x"].contiguous().view(-1)
        prep["topk_ids"], prep["topk_weights"] = inputs["topk_ids"], inputs["topk_weights"]
        prep["act"] = torch.empty(nb * p.tile_m * p.I, dtype=torch.bfloat16, device=inputs["x"].device)
        prep["out32"] = torch.empty(p.T * p.D, dtype=torch.float32, device=inputs["x"].device)
        return prep

    def run(prep: dict, out: Any) -> Any:
        import torch

        r = flydsl_prep.route(prep["topk_ids"], prep["topk_weights"], p.E, p.tile_m)
        prep["out32"].zero_()
        launch(prep["act"], prep["out32"], prep["x"], prep["w1"], prep["s1"], prep["w2"], prep["s2"],
               r.sorted_ids, r.block_expert, r.weights, p.T, torch.cuda.current_stream())
        out.copy_(prep["out32"].view(p.T, p.D))
        return out

    return KernelLaunch(
        name=f"flydsl_moe_a16wi4[t{p.tile_m}x{p.s1.tile_n}x{p.s1.tile_k},kw{p.s1.k_wave},{'roll' if p.rolled else 'unroll'}]",
        run=run,
        prepare=prepare,
        expect_kernels=KERNEL_PREFIX,
        describe={"backend": "flydsl", "arch": arch, "tile_m": p.tile_m, "stage1": asdict(p.s1), "stage2": asdict(p.s2)},
    )
