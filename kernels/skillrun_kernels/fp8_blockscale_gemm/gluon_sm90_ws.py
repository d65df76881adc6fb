"""Gluon fp8 block-scale GEMM for Hopper (sm_90a) with DeepGEMM's levers as config knobs (issue 40).

    C[M, N] bf16 = A[M, K] fp8 e4m3 x B[N, K]^T fp8 e4m3,  a_scale (M, K/128), b_scale (ceil(N/128), K/128)

The successor of ``gluon_sm90.py`` (whose design point ran on the H200 at 0.98-1.11x of cuBLAS
block-wise). Same numerics (each K block an unscaled fp8 wgmma chain into a fresh fp32 partial,
then ``acc = fma(partial, sa * sb, acc)`` on the CUDA cores), same partitions (a TMA producer and
one or two consumer warpgroups with ``setmaxnreg``), same ring. The default config is that design
point; every lever below is one knob away from it, so each can be timed against it in one session
(``ABLATIONS``) and swept by ``skill-run tune`` (the card's ``tunable_kernels`` entries):

* ``BN`` 64/128/256 and ``consumers`` 1/2 (BM = 64 x consumers), ``stages`` (ring depth),
  ``group_m`` (grouped raster: row tiles that share a column tile while it is hot in L2).
* ``cluster_m=2``: a 2x1 thread-block cluster over two vertically adjacent tiles. Both need the same
  B tile; each CTA loads half of its rows and the copy engine multicasts it into both CTAs' shared
  memory, so B crosses L2 once per pair. Triton 3.6 has no multicast in Gluon's TMA op (it compiles a
  cluster, but every CTA loads its own copy), so the producer issues
  ``cp.async.bulk.tensor...multicast::cluster`` as inline PTX, and each consumer releases a slot on
  its own *and* its peer's ``empty`` barrier (``mapa`` + ``mbarrier.arrive...shared::cluster``):
  a slot is refilled only when both CTAs have finished reading it. Inline PTX needs shared-memory
  addresses, which Gluon 3.6 does not expose: they are read from the compiled kernel itself
  (``allocation_offsets``: Triton's own allocation pass run on its TTGIR) and passed as arguments;
  ``compile_only`` cross-checks them against the PTX's barrier inits. The kernel is compiled as a
  single-CTA program (no Triton cluster semantics) and launched with cluster dimension 2
  (``_launch_cluster``); a CTA's rank is its program id mod 2 (``%cluster_ctarank``, read where it
  is used: the consumers have no register to keep it in). Each partition meets the cluster barrier
  once after the barrier inits, and the producer waits for its last ``STAGES`` releases before
  exiting, so no CTA leaves while its peer may still write into it or arrive on it.
* ``persistent``: one CTA (cluster) per SM walking tiles in grouped order, or one per tile.
* ``epilogue_overlap``: the consumer runs one stream of K blocks across all its tiles, so the next
  tile's first wgmma is issued before the current tile's last promote, bf16 conversion and TMA
  store; without it each tile drains its last wgmma before its epilogue (the design point).
* ``promote_k``: the promotion interval along K, i.e. how many fp8 products the tensor core sums
  (with its ~14-bit accumulator) before the fp32 promote. 128 is the recipe's scale block and what
  DeepGEMM and cuBLAS do; 64 promotes each half block separately (same scales, twice the FFMAs,
  more precision). More than 128 is not a knob: the scales change every 128, so a longer interval
  would be different numerics.
* ``async_depth`` (0: promote each block after its wgmma drained) and ``promote=False`` (the
  ceiling twin: scales ignored, wrong numbers) are kept from ``gluon_sm90`` for the ablations.

Nothing here has run on a GPU: every fact about it is compile-only (``compile_only``, results/).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from skillrun_kernels.fp8_blockscale_gemm import gluon_sm90 as _g1
from skillrun_kernels.fp8_blockscale_gemm import problem
from skillrun_kernels.protocol import KernelLaunch, UnsupportedShape

# the ring, partitions and register budget are gluon_sm90's: its constants, its Config arithmetic
BK = _g1.BK  # 128: the scale block along K, one ring slot
WG_M = _g1.WG_M
KERNEL_NAME = "_fp8_blockscale_gemm_gluon_ws_sm90"
SM90_SMEM_LIMIT = _g1.SM90_SMEM_LIMIT
REGISTER_FILE = _g1.REGISTER_FILE
# The cluster launch and the allocation read use Triton internals of this version (the H200's).
TRITON_TESTED = "3.6.0"
check_problem = _g1.check_problem
a_scale_rows = _g1.a_scale_rows
prepared_a_scales = _g1.prepared_a_scales

# --------------------------------------------------------------------------------------------
# Host side: configuration, validation, resource estimates (plain Python, testable on CPU)


@dataclass(frozen=True)
class Config:
    """One compile-time variant plus its launch knobs. Field names are what cards write. The tile,
    register-budget and shared-memory arithmetic is gluon_sm90.Config's (same partitions, same ring)."""

    BN: int = 128
    consumers: int = 2
    stages: int = 5
    async_depth: int = 1
    group_m: int = 8
    promote: bool = True
    consumer_regs: int = 0
    cluster_m: int = 1
    persistent: bool = True
    epilogue_overlap: bool = False
    promote_k: int = 128

    BM = _g1.Config.BM
    SUB_N = _g1.Config.SUB_N
    NSUB = _g1.Config.NSUB
    regs = _g1.Config.regs
    maxnreg = _g1.Config.maxnreg
    producer_regs = _g1.Config.producer_regs
    smem_bytes = _g1.Config.smem_bytes
    as_dict = _g1.Config.as_dict

    @property
    def stream(self) -> bool:
        """Whether the consumers run the overlapped block stream (async depth 1, promoted, one sub-tile)."""
        return self.promote and self.async_depth == 1 and self.NSUB == 1

    @staticmethod
    def from_dict(d: dict | None) -> "Config":
        d = dict(d or {})
        known = {f.name for f in fields(Config)}
        extra = set(d) - known
        if extra:
            raise ValueError(f"gluon_sm90_ws config: unknown key(s) {sorted(extra)} (known: {sorted(known)})")
        booleans = {"promote", "persistent", "epilogue_overlap"}
        for k, v in d.items():
            if k in booleans:
                if not isinstance(v, bool):
                    raise ValueError(f"gluon_sm90_ws config: {k}={v!r} must be true or false")
            elif isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"gluon_sm90_ws config: {k}={v!r} must be an integer")
        return Config(**d)

    def check(self) -> None:
        """Reject a config that cannot compile, cannot launch or would spill, with the reason."""
        def bad(why: str) -> None:
            raise ValueError(f"gluon_sm90_ws config: {why}")

        if self.consumers not in (1, 2):
            bad(f"consumers={self.consumers} must be 1 or 2 (BM = 64 x consumers)")
        if self.BN not in (64, 128, 256):
            bad(f"BN={self.BN} must be 64, 128 or 256")
        if self.async_depth not in (0, 1):
            bad(f"async_depth={self.async_depth} must be 0 or 1")
        if self.cluster_m not in (1, 2):
            bad(f"cluster_m={self.cluster_m} must be 1 or 2 (2x1 cluster, B multicast)")
        if self.promote_k not in (64, 128):
            bad(f"promote_k={self.promote_k} must be 64 or 128 (the scales change every 128 of K: a longer "
                "interval is other numerics)")
        if self.async_depth == 1 and self.NSUB > 1 and self.promote:
            bad(f"BN={self.BN} needs async_depth=0 (accumulator {self.BN // 2} + two partials of {self.SUB_N // 2} "
                "registers per thread exceed the consumer budget)")
        if self.epilogue_overlap and not self.stream:
            bad("epilogue_overlap needs the overlapped stream (promote, async_depth=1, BN <= 128): only there is a "
                "next wgmma in flight to hide the epilogue behind")
        if self.promote_k != BK and not self.stream:
            bad(f"promote_k={self.promote_k} needs the overlapped stream (promote, async_depth=1, BN <= 128)")
        if not 2 <= self.stages <= 8:
            bad(f"stages={self.stages} must be in 2..8")
        if self.group_m < 1:
            bad(f"group_m={self.group_m} must be >= 1")
        if self.regs % 8 or not 24 <= self.regs <= 256:
            bad(f"consumer_regs={self.regs} must be a multiple of 8 in 24..256")
        need = self.register_estimate()
        if need > self.regs:
            bad(f"a consumer thread needs about {need} registers (accumulator, partials, addressing) but "
                f"consumer_regs={self.regs}; lower BN or async_depth")
        if self.producer_regs < 24:
            bad(f"consumer_regs={self.regs} x {self.consumers} leaves the producer {self.producer_regs} registers "
                f"(< 24) of the {self.maxnreg} x {128 * (self.consumers + 1)} pool")
        smem = self.smem_bytes()
        if smem > SM90_SMEM_LIMIT:
            bad(f"{smem} bytes of shared memory (stages={self.stages}, BM={self.BM}, BN={self.BN}) exceed the "
                f"sm_90 limit of {SM90_SMEM_LIMIT}; use fewer stages")

    def register_estimate(self) -> int:
        """gluon_sm90's estimate of the live fp32 registers per consumer thread (accumulator + partials
        + ~32 for addressing and scales), +8 in the stream: the next block's cursor and scales ride along."""
        return _g1.Config.register_estimate(self) + (8 if self.stream else 0)


def default_config(shape: dict) -> Config:
    """The gluon_sm90 design point (128x128, 2 consumer warpgroups, depth 1, 5 stages, persistent,
    no cluster, no epilogue overlap, promote every 128): not a tuned choice."""
    problem.check_shape(shape)
    return Config()


# The design point and one lever each (issue 40's list), by name. The compile check (facts in
# results/), the prune, the tests and the benchmark read this table; ratios are taken against
# "design" in one session. Two-lever rows name what they combine.
ABLATIONS: dict[str, dict] = {
    "design": {},
    "tile_128x256": {"BN": 256, "async_depth": 0, "stages": 3},     # tile N 256 (two 128-wide partials)
    "tile_128x64": {"BN": 64, "stages": 6},
    "stages_4": {"stages": 4},
    "stages_3": {"stages": 3},
    "one_consumer": {"consumers": 1},                               # BM 64, one consumer warpgroup
    "group_m_16": {"group_m": 16},                                  # raster group
    "group_m_1": {"group_m": 1},
    "cluster_2x1": {"cluster_m": 2},                                # 2x1 cluster, B multicast
    "non_persistent": {"persistent": False},                        # one CTA per tile
    "epilogue_overlap": {"epilogue_overlap": True},                 # next tile's wgmma under the epilogue
    "promote_k_64": {"promote_k": 64},                              # promotion interval 64
    "async_depth_0": {"async_depth": 0},
    "no_promote": {"promote": False},                               # ceiling twin (wrong numbers)
    "cluster_2x1_epilogue_overlap": {"cluster_m": 2, "epilogue_overlap": True},
    "cluster_2x1_no_promote": {"cluster_m": 2, "promote": False},   # ceiling of the cluster data path
}


def ablation_config(name: str) -> Config:
    if name not in ABLATIONS:
        raise ValueError(f"gluon_sm90_ws: unknown ablation {name!r} (known: {sorted(ABLATIONS)})")
    return Config.from_dict(ABLATIONS[name])


def tiles(M: int, N: int, cfg: Config) -> int:
    """Work units: tiles, or pairs of vertically adjacent tiles under a 2x1 cluster."""
    return -(-(-(-M // cfg.BM)) // cfg.cluster_m) * -(-N // cfg.BN)


def grid(M: int, N: int, cfg: Config, num_sms: int) -> int:
    """Programs of the launch in units of clusters (= CTAs without a cluster)."""
    units = tiles(M, N, cfg)
    return min(num_sms // cfg.cluster_m, units) if cfg.persistent else units


def tile_order(M: int, N: int, cfg: Config, rank: int = 0) -> list[tuple[int, int]]:
    """(pid_m, pid_n) of CTA ``rank`` for each work unit, in the kernel's grouped order (_tile_of)."""
    num_pid_m, num_pid_n = -(-M // cfg.BM), -(-N // cfg.BN)
    pairs = _g1.tile_order(-(-num_pid_m // cfg.cluster_m) * cfg.BM, N, cfg.BM, cfg.BN, cfg.group_m)
    return [(pm * cfg.cluster_m + rank, pn) for pm, pn in pairs]


def block_stream(first: int, step: int, ntiles: int, L: int) -> list[tuple[int, int]]:
    """(tile id, K block) of each block a consumer stream walks: the host mirror of _issue_next and _promote_next."""
    return [(first + (u // L) * step, u % L) for u in range(ntiles * L)]


# --------------------------------------------------------------------------------------------
# Device side

GLUON_IMPORT_ERROR = _g1.GLUON_IMPORT_ERROR
if GLUON_IMPORT_ERROR is None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    _advance = _g1._advance
    _pinned = _g1._pinned
    _prev_slot = _g1._prev_slot
    _store_tile = _g1._store_tile
    _tile_coords = _g1._tile_coords


def _kernel():
    if GLUON_IMPORT_ERROR is not None:
        raise UnsupportedShape(f"gluon_sm90_ws needs triton.experimental.gluon ({GLUON_IMPORT_ERROR})")
    return _fp8_blockscale_gemm_gluon_ws_sm90


if GLUON_IMPORT_ERROR is None:
    # Inline PTX. Every instruction that must run once per partition is guarded by the partition's
    # first thread ((tid.x & 127) == 0: the producer is warps 0-3, each consumer a later warpgroup).
    # The multicast copy reads B's tensor map from the kernel's first parameter (b_desc), as Triton's
    # own TMA lowering does (mov + cvta.param); compile_only checks the parameter is the 128-byte map.
    _ASM_SMEM: gl.constexpr = gl.constexpr("{ .reg .b32 t; mov.b32 t, global_smem; add.s32 $0, t, $1; }")
    _ASM_MULTICAST_B: gl.constexpr = gl.constexpr(
        "{ .reg .b64 d; .reg .pred p; .reg .b32 t; .reg .b16 m;"
        " mov.u32 t, %tid.x; and.b32 t, t, 127; setp.eq.u32 p, t, 0;"
        f" mov.b64 d, {KERNEL_NAME}_param_0; cvta.param.u64 d, d; mov.b16 m, 3;"
        " @p cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [$1], [d, {$3, $4}], [$2], m; mov.b32 $0, 0; }")
    # The peer's barrier: same offset in its shared memory; address and rank made inside the asm at
    # each use (not hoisted into registers: the consumer has none to spare).
    _ASM_REMOTE_ARRIVE: gl.constexpr = gl.constexpr(
        "{ .reg .pred p, q; .reg .b32 t, a, r;"
        " mov.u32 t, %tid.x; and.b32 t, t, 127; setp.eq.u32 p, t, 0; setp.ne.u32 q, $2, 0; and.pred p, p, q;"
        " mov.b32 a, global_smem; add.s32 a, a, $1; mov.u32 r, %cluster_ctarank; xor.b32 r, r, 1;"
        " mapa.shared::cluster.u32 a, a, r;"
        " @p mbarrier.arrive.release.cluster.shared::cluster.b64 _, [a]; mov.b32 $0, 0; }")
    _ASM_RANK: gl.constexpr = gl.constexpr("mov.u32 $0, %cluster_ctarank;")
    _ASM_CLUSTER_SYNC: gl.constexpr = gl.constexpr(
        "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; mov.b32 $0, $1;")
    _ASM_INIT_FENCE: gl.constexpr = gl.constexpr("fence.mbarrier_init.release.cluster; mov.b32 $0, $1;")

    @gluon.jit
    def _smem(off):
        # The shared-window address of byte ``off`` of the kernel's dynamic shared memory.
        return gl.inline_asm_elementwise(_ASM_SMEM, "=r,r", [off], dtype=gl.int32, is_pure=True, pack=1)

    @gluon.jit
    def _cluster_sync(x):
        return gl.inline_asm_elementwise(_ASM_CLUSTER_SYNC, "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _meet_cluster(CLUSTER: gl.constexpr):
        # Under a 2x1 cluster every partition meets the cluster barrier once, after the barrier inits.
        if CLUSTER == 2:
            _cluster_sync(gl.program_id(0))

    @gluon.jit
    def _rank(CLUSTER: gl.constexpr):
        # The CTA's rank in its cluster (= program id mod CLUSTER for the 1-D grid), read where used.
        if CLUSTER == 2:
            return gl.inline_asm_elementwise(_ASM_RANK, "=r,r", [gl.program_id(0)], dtype=gl.int32, is_pure=False,
                                             pack=1)
        else:
            return 0

    @gluon.jit
    def _remote_arrive(empty_off, slot, pred):
        # One arrive on the peer CTA's empty[slot].
        return gl.inline_asm_elementwise(_ASM_REMOTE_ARRIVE, "=r,r,r", [empty_off + slot * 8, pred],
                                         dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _cta(CLUSTER: gl.constexpr):
        # (work-unit walker id, walkers, rank in the cluster). A cluster is CLUSTER consecutive CTAs.
        pid = gl.program_id(0)
        return pid // CLUSTER, gl.num_programs(0) // CLUSTER, pid % CLUSTER

    @gluon.jit
    def _tile_of(unit, num_pid_m, num_pid_n, GROUP_M, CLUSTER: gl.constexpr):
        # The CTA's tile of a work unit: grouped raster over cluster rows, then the rank's row in it.
        pm, pn = _tile_coords(unit, gl.cdiv(num_pid_m, CLUSTER), num_pid_n, GROUP_M)
        return pm * CLUSTER + _rank(CLUSTER), pn

    @gluon.jit
    def _walk(M, N, BM: gl.constexpr, BN: gl.constexpr, CLUSTER: gl.constexpr):
        # A partition's walk over the work units: (its first unit, the stride, the CTA's rank in its
        # cluster, row tiles, column tiles, units).
        walker, walkers, rank = _cta(CLUSTER)
        num_pid_m = gl.cdiv(M, BM)
        num_pid_n = gl.cdiv(N, BN)
        return walker, walkers, rank, num_pid_m, num_pid_n, gl.cdiv(num_pid_m, CLUSTER) * num_pid_n

    @gluon.jit
    def _origin(unit, num_pid_m, num_pid_n, GROUP_M, BM: gl.constexpr, BN: gl.constexpr, CLUSTER: gl.constexpr):
        # (first row, first column) of the CTA's tile of a work unit.
        pid_m, pid_n = _tile_of(unit, num_pid_m, num_pid_n, GROUP_M, CLUSTER)
        return pid_m * BM, pid_n * BN

    @gluon.jit
    def _release(empty, slot, empty_off, FENCE: gl.constexpr, CLUSTER: gl.constexpr):
        # FENCE: the A scales were read from the slot by a generic-proxy load, and the producer's next
        # write to it is a TMA (async proxy): fence so the two are ordered across the arrive.
        if FENCE:
            fence_async_shared()
        mbarrier.arrive(empty.index(slot), count=1)
        if CLUSTER == 2:
            _remote_arrive(empty_off, slot, 1)

    @gluon.jit
    def _release_if(empty, slot, pred, empty_off, CLUSTER: gl.constexpr):
        mbarrier.arrive(empty.index(slot), count=1, pred=pred)
        if CLUSTER == 2:
            _remote_arrive(empty_off, slot, pred.to(gl.int32))

    # ---- producer (default partition)
    @gluon.jit
    def _producer(b_desc, a_desc, sa_desc, a_ring, b_ring, sa_ring, ready, empty, M, N, L, GROUP_M, B_OFF, READY_OFF,
                  BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, CLUSTER: gl.constexpr):
        _meet_cluster(CLUSTER)
        walker, walkers, rank, num_pid_m, num_pid_n, units = _walk(M, N, BM, BN, CLUSTER)
        nbytes: gl.constexpr = BM * 128 + BN * 128 + 4 * BM
        HALF: gl.constexpr = BN // CLUSTER
        slot = 0
        phase = 0
        for unit in range(walker, units, walkers):
            off_m, off_n = _origin(unit, num_pid_m, num_pid_n, GROUP_M, BM, BN, CLUSTER)
            for kb in range(L):
                mbarrier.wait(empty.index(slot), phase ^ 1)
                bar = ready.index(slot)
                mbarrier.expect(bar, nbytes)  # the whole B tile: half from this CTA, half from its peer
                tma.async_copy_global_to_shared(a_desc, [off_m, kb * 128], bar, a_ring.index(slot))
                if CLUSTER == 2:
                    gl.inline_asm_elementwise(
                        _ASM_MULTICAST_B, "=r,r,r,r,r",
                        [_smem(B_OFF + slot * (BN * 128) + rank * (HALF * 128)), _smem(READY_OFF + slot * 8),
                         kb * 128, off_n + rank * HALF],
                        dtype=gl.int32, is_pure=False, pack=1)
                else:
                    tma.async_copy_global_to_shared(b_desc, [off_n, kb * 128], bar, b_ring.index(slot))
                tma.async_copy_global_to_shared(sa_desc, [kb, off_m], bar, sa_ring.index(slot))
                slot, phase = _advance(slot, phase, STAGES)
        if CLUSTER == 2:
            # Stay until both CTAs' consumers have released every slot this CTA filled: their arrives
            # land in this CTA's shared memory (and the peer's copies into it have landed by then).
            for _i in range(STAGES):
                mbarrier.wait(empty.index(slot), phase ^ 1)
                slot, phase = _advance(slot, phase, STAGES)

    # ---- consumer helpers
    @gluon.jit
    def _issue(a_ring, b_ring, slot, p, WG: gl.constexpr, HALF_K: gl.constexpr, PK: gl.constexpr):
        # The wgmma group of one promotion unit: K [HALF_K * PK, HALF_K * PK + PK) of the slot's block.
        a = a_ring.index(slot).slice(WG * 64, 64)
        b = b_ring.index(slot)
        if PK != 128:
            a = a.slice(HALF_K * PK, PK, dim=1)
            b = b.slice(HALF_K * PK, PK, dim=1)
        return warpgroup_mma(a, b.permute((1, 0)), p, use_acc=False, is_async=True)

    @gluon.jit
    def _sb_row(unit, L, num_pid_m, num_pid_n, GROUP_M, BN: gl.constexpr, CLUSTER: gl.constexpr):
        # First element of the tile's row of B scales: (off_n / 128) * L.
        pid_m, pid_n = _tile_of(unit, num_pid_m, num_pid_n, GROUP_M, CLUSTER)
        return (pid_n * BN // 128) * L

    @gluon.jit
    def _issue_next(kb, unit, row, step, L, num_pid_m, num_pid_n, GROUP_M, BN: gl.constexpr, CLUSTER: gl.constexpr):
        # The issue cursor's next block: the next K block, or the first of the next tile.
        kb = kb + 1
        if kb == L:
            kb = 0
            unit = unit + step
            row = _sb_row(unit, L, num_pid_m, num_pid_n, GROUP_M, BN, CLUSTER)
        return kb, unit, row

    @gluon.jit
    def _promote_next(kb, unit, step, L):
        kb = kb + 1
        if kb == L:
            kb = 0
            unit = unit + step
        return kb, unit

    @gluon.jit
    def _store_unit(acc, unit, c_desc, c_smem, num_pid_m, num_pid_n, GROUP_M, WG: gl.constexpr, BM: gl.constexpr,
                    BN: gl.constexpr, CLUSTER: gl.constexpr):
        pid_m, pid_n = _tile_of(unit, num_pid_m, num_pid_n, GROUP_M, CLUSTER)
        _store_tile(acc, c_desc, c_smem, pid_m * BM + WG * 64, pid_n * BN)

    @gluon.jit
    def _finish(acc, kb, unit, L, c_desc, c_smem, num_pid_m, num_pid_n, GROUP_M, WG: gl.constexpr,
                BM: gl.constexpr, BN: gl.constexpr, CLUSTER: gl.constexpr):
        # A tile whose last block was just promoted: write it (bf16, TMA store) and start a new one.
        if kb == L - 1:
            _store_unit(acc, unit, c_desc, c_smem, num_pid_m, num_pid_n, GROUP_M, WG, BM, BN, CLUSTER)
            acc = gl.zeros_like(acc)
        return acc

    @gluon.jit
    def _acquire(a_ring, b_ring, sa_ring, ready, slot, phase, p, WG: gl.constexpr, STAGES: gl.constexpr,
                 PK: gl.constexpr, row_layout: gl.constexpr):
        # The next block of the ring: wait for it, read its A-scale rows, issue its (first) wgmma group
        # into the partial p. Returns (A scales, wgmma token, the block's slot, the ring cursor moved on).
        mbarrier.wait(ready.index(slot), phase)
        sa = sa_ring.index(slot).slice(WG * 64, 64).load(row_layout)
        tok = _issue(a_ring, b_ring, slot, p, WG, 0, PK)
        nslot, nphase = _advance(slot, phase, STAGES)
        return sa, tok, slot, nslot, nphase

    @gluon.jit
    def _retire(tok, slot, sa, sb, acc, kb_i, unit_i, row_i, kb_p, unit_p, empty, sb_ptr, step, L, num_pid_m,
                num_pid_n, GROUP_M, EMPTY_OFF, c_desc, c_smem, WG: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                CLUSTER: gl.constexpr):
        # The promotion unit issued before the last one: wait for it (the last stays in flight), release
        # its slot, read the B scale of the issue cursor's block (after the release's fence, so the fence
        # never waits on it) and move that cursor on, promote the unit into acc, and write the tile if it
        # was the tile's last K block. Returns (its partial, the B scale, both cursors, acc).
        p = warpgroup_mma_wait(1, deps=(tok,))
        _release(empty, slot, EMPTY_OFF, True, CLUSTER)
        sb_next = gl.load(sb_ptr + row_i + kb_i)
        kb_i, unit_i, row_i = _issue_next(kb_i, unit_i, row_i, step, L, num_pid_m, num_pid_n, GROUP_M, BN, CLUSTER)
        acc = _pinned(gl.fma(p, (sa * sb)[:, None], acc))
        acc = _finish(acc, kb_p, unit_p, L, c_desc, c_smem, num_pid_m, num_pid_n, GROUP_M, WG, BM, BN, CLUSTER)
        kb_p, unit_p = _promote_next(kb_p, unit_p, step, L)
        return p, sb_next, kb_i, unit_i, row_i, acc, kb_p, unit_p

    # ---- consumer stream, async depth 1: a stream of K blocks over `ntiles` tiles; each block's wgmma
    # group runs while the previous one is promoted. Called once per tile (the design point: the
    # tile's last block drains before its epilogue) or once for all of a CTA's tiles
    # (epilogue_overlap: the next tile's first wgmma runs under this tile's last promote and epilogue).
    @gluon.jit
    def _stream(first, step, ntiles, slot, phase, p_a, p_b, a_ring, b_ring, sa_ring, ready, empty, c_desc, c_smem,
                sb_ptr, M, N, L, GROUP_M, EMPTY_OFF, WG: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                STAGES: gl.constexpr, CLUSTER: gl.constexpr, PK: gl.constexpr):
        # p_a, p_b: the two partials, made once per consumer and handed from stream to stream (each
        # wgmma takes the partial it overwrites as its ignored use_acc=False input), so that no
        # instruction but a wgmma defines their registers.
        # Two cursors walk the stream's blocks: the issue cursor (i: K block, work unit, the row of its
        # B scales) and, one block behind, the promote cursor (p: whose last K block ends a tile; the
        # tile's origin is recomputed only then). Per partial only its A-scale rows, B scale and ring
        # slot are kept: registers are the consumer's limit (232, of which the accumulator and the two
        # partials take 192), and every one the stream holds more spills under a 2x1 cluster.
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
        row_layout: gl.constexpr = gl.SliceLayout(1, mma)
        num_pid_m = gl.cdiv(M, BM)
        num_pid_n = gl.cdiv(N, BN)
        nblk = ntiles * L
        acc = gl.zeros([64, BN], gl.float32, mma)
        kb_i = 0
        unit_i = first
        row_i = _sb_row(first, L, num_pid_m, num_pid_n, GROUP_M, BN, CLUSTER)
        kb_p = 0
        unit_p = first
        # block 0 (its first promotion unit) -> p_a
        sa_a, tok_a, slot_a, slot, phase = _acquire(a_ring, b_ring, sa_ring, ready, slot, phase, p_a, WG, STAGES, PK,
                                                    row_layout)
        sb_a = gl.load(sb_ptr + row_i + kb_i)
        kb_i, unit_i, row_i = _issue_next(kb_i, unit_i, row_i, step, L, num_pid_m, num_pid_n, GROUP_M, BN, CLUSTER)
        if PK == 128:
            sa_b = sa_a
            sb_b = sb_a
            slot_b = slot_a
            # Pairs of blocks (2j+1 -> p_b, 2j+2 -> p_a), unrolled so p_a and p_b never swap registers.
            for j in range((nblk - 1) // 2):
                # issue the next block into p_b while p_a's is retired, then the one after into p_a
                sa_b, tok_b, slot_b, slot, phase = _acquire(a_ring, b_ring, sa_ring, ready, slot, phase, p_b, WG,
                                                            STAGES, PK, row_layout)
                p_a, sb_b, kb_i, unit_i, row_i, acc, kb_p, unit_p = _retire(
                    tok_a, slot_a, sa_a, sb_a, acc, kb_i, unit_i, row_i, kb_p, unit_p, empty, sb_ptr, step, L,
                    num_pid_m, num_pid_n, GROUP_M, EMPTY_OFF, c_desc, c_smem, WG, BM, BN, CLUSTER)
                sa_a, tok_a, slot_a, slot, phase = _acquire(a_ring, b_ring, sa_ring, ready, slot, phase, p_a, WG,
                                                            STAGES, PK, row_layout)
                p_b, sb_a, kb_i, unit_i, row_i, acc, kb_p, unit_p = _retire(
                    tok_b, slot_b, sa_b, sb_b, acc, kb_i, unit_i, row_i, kb_p, unit_p, empty, sb_ptr, step, L,
                    num_pid_m, num_pid_n, GROUP_M, EMPTY_OFF, c_desc, c_smem, WG, BM, BN, CLUSTER)
            if nblk % 2 == 0:
                sa_b, tok_b, slot_b, slot, phase = _acquire(a_ring, b_ring, sa_ring, ready, slot, phase, p_b, WG,
                                                            STAGES, PK, row_layout)
                p_a = warpgroup_mma_wait(1, deps=(tok_a,))
                _release(empty, slot_a, EMPTY_OFF, True, CLUSTER)
                sb_b = gl.load(sb_ptr + row_i + kb_i)
                acc = _pinned(gl.fma(p_a, (sa_a * sb_a)[:, None], acc))
                p_b = warpgroup_mma_wait(0, deps=(tok_b,))
                # (a tile of one K block ends here: its store waits for the drain above, because a
                # branch here with p_b in flight made LLVM copy p_b's registers: ptxas C7514)
                acc = _finish(acc, kb_p, unit_p, L, c_desc, c_smem, num_pid_m, num_pid_n, GROUP_M, WG, BM, BN, CLUSTER)
                kb_p, unit_p = _promote_next(kb_p, unit_p, step, L)
                _release(empty, slot_b, EMPTY_OFF, True, CLUSTER)
                acc = _pinned(gl.fma(p_b, (sa_b * sb_b)[:, None], acc))
            else:
                p_a = warpgroup_mma_wait(0, deps=(tok_a,))
                _release(empty, slot_a, EMPTY_OFF, True, CLUSTER)
                acc = _pinned(gl.fma(p_a, (sa_a * sb_a)[:, None], acc))
        else:
            # Promotion interval 64: each block is two units (K halves 0 -> p_a, 1 -> p_b) with the
            # same scales; the block's slot is released once its second half has completed.
            for j in range(nblk - 1):
                tok_b = _issue(a_ring, b_ring, slot_a, p_b, WG, 1, PK)
                p_a = warpgroup_mma_wait(1, deps=(tok_a,))
                acc = _pinned(gl.fma(p_a, (sa_a * sb_a)[:, None], acc))
                sa_n, tok_a, slot_n, slot, phase = _acquire(a_ring, b_ring, sa_ring, ready, slot, phase, p_a, WG,
                                                            STAGES, PK, row_layout)
                p_b, sb_n, kb_i, unit_i, row_i, acc, kb_p, unit_p = _retire(
                    tok_b, slot_a, sa_a, sb_a, acc, kb_i, unit_i, row_i, kb_p, unit_p, empty, sb_ptr, step, L,
                    num_pid_m, num_pid_n, GROUP_M, EMPTY_OFF, c_desc, c_smem, WG, BM, BN, CLUSTER)
                sa_a = sa_n
                sb_a = sb_n
                slot_a = slot_n
            tok_b = _issue(a_ring, b_ring, slot_a, p_b, WG, 1, PK)
            p_a = warpgroup_mma_wait(1, deps=(tok_a,))
            acc = _pinned(gl.fma(p_a, (sa_a * sb_a)[:, None], acc))
            p_b = warpgroup_mma_wait(0, deps=(tok_b,))
            _release(empty, slot_a, EMPTY_OFF, True, CLUSTER)
            acc = _pinned(gl.fma(p_b, (sa_a * sb_a)[:, None], acc))
        # the stream's last block ends a tile
        _store_unit(acc, unit_p, c_desc, c_smem, num_pid_m, num_pid_n, GROUP_M, WG, BM, BN, CLUSTER)
        return slot, phase, p_a, p_b

    @gluon.jit
    def _consumer_stream(a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, M, N, L, GROUP_M, EMPTY_OFF,
                         WG: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                         CLUSTER: gl.constexpr, OVERLAP: gl.constexpr, PK: gl.constexpr):
        _meet_cluster(CLUSTER)
        walker, walkers, rank = _cta(CLUSTER)
        units = gl.cdiv(gl.cdiv(M, BM), CLUSTER) * gl.cdiv(N, BN)
        c_smem = c_bufs.index(WG)
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
        # Pinned: registers of their own, never a constant LLVM may share with the accumulator's zeros
        # (it did with promote_k=64, and ptxas serialised every wgmma: C7514).
        p_a = _pinned(gl.zeros([64, BN], gl.float32, mma))
        p_b = _pinned(gl.zeros([64, BN], gl.float32, mma))
        slot = 0
        phase = 0
        if OVERLAP:
            mine = gl.cdiv(units - walker, walkers)
            if mine > 0:
                slot, phase, p_a, p_b = _stream(walker, walkers, mine, slot, phase, p_a, p_b, a_ring, b_ring, sa_ring,
                                                ready, empty, c_desc, c_smem, sb_ptr, M, N, L, GROUP_M, EMPTY_OFF,
                                                WG, BM, BN, STAGES, CLUSTER, PK)
        else:
            for unit in range(walker, units, walkers):
                slot, phase, p_a, p_b = _stream(unit, walkers, 1, slot, phase, p_a, p_b, a_ring, b_ring, sa_ring, ready,
                                                empty, c_desc, c_smem, sb_ptr, M, N, L, GROUP_M, EMPTY_OFF,
                                                WG, BM, BN, STAGES, CLUSTER, PK)
        tma.store_wait(0)

    # ---- consumer, async depth 0 (BN up to 256 as 128-wide partials, one live at a time), and the
    # ceiling twin (PROMOTE False) for either depth: one tile at a time, as in gluon_sm90.
    @gluon.jit
    def _consumer_serial(a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, M, N, L, GROUP_M, EMPTY_OFF,
                         WG: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                         ASYNC: gl.constexpr, PROMOTE: gl.constexpr, CLUSTER: gl.constexpr):
        _meet_cluster(CLUSTER)
        SUB_N: gl.constexpr = 128 if BN > 128 else BN
        NSUB: gl.constexpr = BN // SUB_N
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SUB_N, 32])
        row_layout: gl.constexpr = gl.SliceLayout(1, mma)
        walker, walkers, rank, num_pid_m, num_pid_n, units = _walk(M, N, BM, BN, CLUSTER)
        p = gl.zeros([64, SUB_N], gl.float32, mma)
        slot = 0
        phase = 0
        for unit in range(walker, units, walkers):
            off_m, off_n = _origin(unit, num_pid_m, num_pid_n, GROUP_M, BM, BN, CLUSTER)
            acc0 = gl.zeros([64, SUB_N], gl.float32, mma)
            acc1 = gl.zeros([64, SUB_N], gl.float32, mma)
            for kb in range(L):
                mbarrier.wait(ready.index(slot), phase)
                a_tile = a_ring.index(slot).slice(WG * 64, 64)
                b_tile = b_ring.index(slot)
                if PROMOTE:
                    sa = sa_ring.index(slot).slice(WG * 64, 64).load(row_layout)
                    sb0 = gl.load(sb_ptr + (off_n // 128) * L + kb)
                    tok = warpgroup_mma(a_tile, b_tile.slice(0, SUB_N).permute((1, 0)), p, use_acc=False, is_async=True)
                    p = warpgroup_mma_wait(0, deps=(tok,))
                    acc0 = _pinned(gl.fma(p, (sa * sb0)[:, None], acc0))
                    if NSUB == 2:
                        sb1 = gl.load(sb_ptr + (off_n // 128 + 1) * L + kb, mask=off_n + 128 < N, other=0.0)
                        tok = warpgroup_mma(a_tile, b_tile.slice(SUB_N, SUB_N).permute((1, 0)), p, use_acc=False,
                                            is_async=True)
                        p = warpgroup_mma_wait(0, deps=(tok,))
                        acc1 = _pinned(gl.fma(p, (sa * sb1)[:, None], acc1))
                    _release(empty, slot, EMPTY_OFF, True, CLUSTER)
                else:
                    t0 = warpgroup_mma(a_tile, b_tile.slice(0, SUB_N).permute((1, 0)), acc0, use_acc=kb > 0,
                                       is_async=True)
                    if NSUB == 2:
                        t1 = warpgroup_mma(a_tile, b_tile.slice(SUB_N, SUB_N).permute((1, 0)), acc1,
                                           use_acc=kb > 0, is_async=True)
                        acc0, acc1 = warpgroup_mma_wait(ASYNC * 2, deps=(t0, t1))
                    else:
                        acc0 = warpgroup_mma_wait(ASYNC, deps=(t0,))
                    if ASYNC == 1:
                        # The block before this one has completed: release its slot (index computed
                        # here from the loop's own slot, see gluon_sm90._prev_slot).
                        _release_if(empty, _prev_slot(slot, STAGES), kb > 0, EMPTY_OFF, CLUSTER)
                    else:
                        _release(empty, slot, EMPTY_OFF, False, CLUSTER)
                slot, phase = _advance(slot, phase, STAGES)
            if not PROMOTE:
                if ASYNC == 1:
                    if NSUB == 2:
                        acc0, acc1 = warpgroup_mma_wait(0, deps=(acc0, acc1))
                    else:
                        acc0 = warpgroup_mma_wait(0, deps=(acc0,))
                    _release(empty, _prev_slot(slot, STAGES), EMPTY_OFF, False, CLUSTER)  # the tile's last block
            _store_tile(acc0, c_desc, c_bufs.index(WG * NSUB), off_m + WG * 64, off_n)
            if NSUB == 2:
                _store_tile(acc1, c_desc, c_bufs.index(WG * NSUB + 1), off_m + WG * 64, off_n + SUB_N)
        tma.store_wait(0)

    @gluon.jit
    def _consumer(a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, M, N, L, GROUP_M, EMPTY_OFF,
                  WG: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, ASYNC: gl.constexpr,
                  PROMOTE: gl.constexpr, CLUSTER: gl.constexpr, OVERLAP: gl.constexpr, PK: gl.constexpr):
        if PROMOTE and ASYNC == 1 and BN <= 128:
            _consumer_stream(a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, M, N, L, GROUP_M,
                             EMPTY_OFF, WG, BM, BN, STAGES, CLUSTER, OVERLAP, PK)
        else:
            _consumer_serial(a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, M, N, L, GROUP_M,
                             EMPTY_OFF, WG, BM, BN, STAGES, ASYNC, PROMOTE, CLUSTER)

    # b_desc is the first parameter on purpose: the multicast copy names it as <kernel>_param_0.
    @gluon.jit(do_not_specialize=["M", "L", "GROUP_M", "B_OFF", "READY_OFF", "EMPTY_OFF"])
    def _fp8_blockscale_gemm_gluon_ws_sm90(
        b_desc, a_desc, sa_desc, c_desc, sb_ptr, M, N, L, GROUP_M, B_OFF, READY_OFF, EMPTY_OFF,
        BN: gl.constexpr, CONSUMERS: gl.constexpr, STAGES: gl.constexpr, ASYNC: gl.constexpr,
        PROMOTE: gl.constexpr, CONSUMER_REGS: gl.constexpr, CLUSTER: gl.constexpr, OVERLAP: gl.constexpr,
        PK: gl.constexpr,
    ):
        BM: gl.constexpr = 64 * CONSUMERS
        SUB_N: gl.constexpr = 128 if BN > 128 else BN
        NSUB: gl.constexpr = BN // SUB_N
        b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, 128], gl.float8e4nv)
        a_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, 128], a_desc.layout)
        b_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, 128], b_layout)
        sa_tma = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BM], sa_desc.layout)
        sa_ring = sa_tma._reinterpret(gl.float32, [STAGES, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        c_bufs = gl.allocate_shared_memory(gl.bfloat16, [CONSUMERS * NSUB, 64, SUB_N], c_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=CONSUMERS * CLUSTER)  # each consumer of each CTA of the cluster
        fence_async_shared()
        if CLUSTER == 2:
            gl.inline_asm_elementwise(_ASM_INIT_FENCE, "=r,r", [gl.program_id(0)], dtype=gl.int32, is_pure=False,
                                      pack=1)
        if CONSUMERS == 2:
            gl.warp_specialize([
                (_producer, (b_desc, a_desc, sa_desc, a_ring, b_ring, sa_tma, ready, empty, M, N, L, GROUP_M, B_OFF,
                             READY_OFF, BM, BN, STAGES, CLUSTER)),
                (_consumer, (a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, M, N, L, GROUP_M,
                             EMPTY_OFF, 0, BM, BN, STAGES, ASYNC, PROMOTE, CLUSTER, OVERLAP, PK)),
                (_consumer, (a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, M, N, L, GROUP_M,
                             EMPTY_OFF, 1, BM, BN, STAGES, ASYNC, PROMOTE, CLUSTER, OVERLAP, PK)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (_producer, (b_desc, a_desc, sa_desc, a_ring, b_ring, sa_tma, ready, empty, M, N, L, GROUP_M, B_OFF,
                             READY_OFF, BM, BN, STAGES, CLUSTER)),
                (_consumer, (a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, M, N, L, GROUP_M,
                             EMPTY_OFF, 0, BM, BN, STAGES, ASYNC, PROMOTE, CLUSTER, OVERLAP, PK)),
            ], [4], [CONSUMER_REGS])


# --------------------------------------------------------------------------------------------
# Host side: layouts, constexprs, shared-memory offsets, launch, the build protocol


def _layouts(cfg: Config) -> dict:
    """gluon_sm90's shared layouts, B's for the rows one CTA's copy brings (half the tile under a 2x1 cluster)."""
    from triton.experimental.gluon import language as gl

    half = cfg.BN // cfg.cluster_m
    return {**_g1._layouts(cfg), "b": gl.NVMMASharedLayout.get_default_for([half, BK], gl.float8e4nv),
            "b_block": [half, BK]}


def constexprs(cfg: Config) -> dict:
    return {"BN": cfg.BN, "CONSUMERS": cfg.consumers, "STAGES": cfg.stages, "ASYNC": cfg.async_depth,
            "PROMOTE": cfg.promote, "CONSUMER_REGS": cfg.regs, "CLUSTER": cfg.cluster_m,
            "OVERLAP": cfg.epilogue_overlap, "PK": cfg.promote_k}


_ALLOCS = ("b_ring", "ready", "empty")
_OFFSETS: dict[str, dict[str, int]] = {}


def allocation_offsets(ttgir: str, key: str | None = None) -> dict[str, int]:
    """Byte offsets of the B ring and the two barrier arrays in the kernel's dynamic shared memory.

    Read by running Triton's own shared-memory allocation (the passes ``make_llir`` runs before it,
    then ``allocate_shared_memory_nv``) on the compiled TTGIR, whose ``local_alloc`` ops keep the
    source's variable names. The inline PTX needs them (Gluon 3.6 gives no address of a buffer);
    ``compile_only`` checks them against the barrier inits in the PTX."""
    if key is not None and key in _OFFSETS:
        return _OFFSETS[key]
    import os
    import tempfile

    from triton._C.libtriton import ir, nvidia, passes
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend, get_ptx_version_from_options

    ctx = ir.context()
    ir.load_dialects(ctx)
    backend = CUDABackend(GPUTarget("cuda", 90, 32))
    backend.load_dialects(ctx)
    fd, path = tempfile.mkstemp(suffix=".ttgir")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(ttgir)
        mod = ir.parse_mlir_module(path, ctx)
    finally:
        os.unlink(path)
    pm = ir.pass_manager(ctx)
    passes.ttgpuir.add_combine_tensor_select_and_if(pm)
    passes.ttgpuir.add_allocate_warp_groups(pm)
    passes.convert.add_scf_to_cf(pm)
    passes.gluon.add_inliner(pm)
    opts = backend.parse_options({"num_warps": 4})
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, 90, get_ptx_version_from_options(opts, 90))
    pm.run(mod, "gluon_sm90_ws.allocation_offsets")
    found = {}
    for line in str(mod).splitlines():
        m = re.match(r"\s*%(\w+) = ttg\.local_alloc \{allocation\.offset = (\d+) : i32\}", line)
        if m and m.group(1) in _ALLOCS:
            found[m.group(1)] = int(m.group(2))
    missing = [n for n in _ALLOCS if n not in found]
    if missing:
        raise RuntimeError(f"gluon_sm90_ws: no allocation offset found for {missing} in the compiled TTGIR "
                           "(a Triton other than 3.6 may name or place them differently)")
    if key is not None:
        _OFFSETS[key] = found
    return found


def barrier_init_offsets(ptx: str) -> list[int]:
    """Offsets (from global_smem) of every ``mbarrier.init`` in the PTX, for the cross-check."""
    base = set(re.findall(r"mov\.b32\s+(%r\d+),\s*global_smem;", ptx))
    adds = {m.group(1): (m.group(2), int(m.group(3)))
            for m in re.finditer(r"add\.s32\s+(%r\d+),\s*(%r\d+),\s*(\d+);", ptx)}
    out = []
    for m in re.finditer(r"mbarrier\.init\.shared(?:::cta)?\.b64\s+\[(%r\d+)(?:\+(\d+))?\]", ptx):
        reg, extra = m.group(1), int(m.group(2) or 0)
        if reg in base:
            out.append(extra)
        elif reg in adds and adds[reg][0] in base:
            out.append(adds[reg][1] + extra)
    m2 = re.findall(r"mbarrier\.init\.shared(?:::cta)?\.b64\s+\[global_smem\+(\d+)\]", ptx)
    return sorted(out + [int(x) for x in m2])


_sm_count = _g1._sm_count


def prepare_operands(inputs: dict, cfg: Config) -> dict:
    """gluon_sm90's operands (TMA descriptors over A, B and the transposed, 16-byte pitched A scales;
    the B scales row-major (ceil(N/128), K/128) fp32), B's descriptor a half tile per CTA under a cluster."""
    prep = _g1.prepare_operands(inputs, cfg)
    if cfg.cluster_m > 1:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        lay = _layouts(cfg)
        prep["b_desc"] = TensorDescriptor(prep["b"], [prep["N"], prep["K"]], [prep["K"], 1], lay["b_block"], lay["b"])
    return prep


# (kernel hash, cluster size) -> clusters co-resident on this device (cuOccupancyMaxActiveClusters),
# or None where the query failed; read by _launch_cluster and printed by benchmarks/device_issue40.sh.
CLUSTER_OCCUPANCY: dict[tuple[str, int], int | None] = {}


def _max_active_clusters(ck, size: int) -> int | None:
    """How many clusters of ``size`` CTAs of this compiled kernel fit on the device at once (the
    driver's answer: GPCs whose SM count is odd leave an SM idle under a 2-CTA cluster). None if the
    CUDA Python bindings are missing or the query fails: the launch then assumes SMs / size."""
    key = (ck.hash, size)
    if key not in CLUSTER_OCCUPANCY:
        n = None
        try:
            from cuda.bindings import driver as cu

            conf = cu.CUlaunchConfig()
            conf.gridDimX, conf.gridDimY, conf.gridDimZ = size * 1024, 1, 1
            conf.blockDimX, conf.blockDimY, conf.blockDimZ = 32 * ck.metadata.num_warps, 1, 1
            conf.sharedMemBytes = ck.metadata.shared
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = size, 1, 1
            conf.attrs = [attr]
            conf.numAttrs = 1
            err, got = cu.cuOccupancyMaxActiveClusters(cu.CUfunction(ck.function), conf)
            n = int(got) if err == cu.CUresult.CUDA_SUCCESS and int(got) > 0 else None
        except Exception:  # noqa: BLE001 - best effort: no bindings, another API version, a driver refusal
            n = None
        CLUSTER_OCCUPANCY[key] = n
    return CLUSTER_OCCUPANCY[key]


def _launch_cluster(args: list, consts: dict, clusters: int, cfg: Config) -> None:
    """Compile (once) as a single-CTA program, read the shared-memory offsets from that compiled
    kernel, and launch it with cluster dimension ``cfg.cluster_m`` the way ``JITFunction.run`` launches
    (Triton 3.6: ``CompiledKernel.run`` with its packed (num_warps, num_ctas, shared) metadata, here
    with num_ctas = the cluster size, which sets the launch's cluster attribute and multiplies the grid)."""
    import triton
    from triton import knobs
    from triton.runtime.driver import driver

    if triton.__version__ != TRITON_TESTED:
        raise UnsupportedShape(f"gluon_sm90_ws: the cluster launch uses Triton {TRITON_TESTED} internals; "
                               f"this is triton {triton.__version__}")
    kern = _kernel()
    ck = kern.warmup(*args, grid=(clusters,), **consts, num_warps=4, maxnreg=cfg.maxnreg)
    offs = allocation_offsets(ck.asm["ttgir"], key=ck.hash)
    names = [n for n in kern.arg_names if n not in consts]
    vals = dict(zip(names, args))
    vals.update(B_OFF=offs["b_ring"], READY_OFF=offs["ready"], EMPTY_OFF=offs["empty"])
    full = [consts[n] if n in consts else vals[n] for n in kern.arg_names]
    device = driver.active.get_current_device()
    stream = driver.active.get_current_stream(device)
    ck._init_handles()
    if cfg.persistent:  # one cluster per co-resident slot, as the driver counts them
        clusters = min(clusters, _max_active_clusters(ck, cfg.cluster_m) or clusters)
    packed = (ck.metadata.num_warps, cfg.cluster_m, ck.metadata.shared)
    grid3 = (clusters, 1, 1)
    ck.run(clusters, 1, 1, stream, ck.function, packed, ck.launch_metadata(grid3, stream, *full),
           knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *full)


def launch(prep: dict, out, cfg: Config, num_sms: int | None = None):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    M, N, K = prep["M"], prep["N"], prep["K"]
    if out.stride(1) != 1 or (out.stride(0) * 2) % 16 or out.data_ptr() % 16:
        raise ValueError("gluon_sm90_ws: C must be row-major with a 16-byte aligned base and row pitch (TMA store)")
    c_desc = TensorDescriptor(out, [M, N], [out.stride(0), 1], [WG_M, cfg.SUB_N], prep["c_layout"])
    programs = grid(M, N, cfg, num_sms or _sm_count(out.device))
    consts = constexprs(cfg)
    args = [prep["b_desc"], prep["a_desc"], prep["sa_desc"], c_desc, prep["sb"], M, N, K // BK, cfg.group_m, 0, 0, 0]
    if cfg.cluster_m == 1:
        _kernel()[(programs,)](*args, **consts, num_warps=4, maxnreg=cfg.maxnreg)
    else:
        _launch_cluster(args, consts, programs, cfg)
    return out


def build(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """The Gluon port as a KernelLaunch; ``config`` keys are :class:`Config` fields (missing: defaults)."""
    check_problem(shape)
    cfg = Config.from_dict(config) if config else default_config(shape)
    cfg.check()

    def prepare(inputs: dict) -> Any:
        return prepare_operands(inputs, cfg)

    def run(prep: Any, out) -> Any:
        return launch(prep, out, cfg)

    return KernelLaunch(
        name="gluon_sm90_ws",
        run=run,
        prepare=prepare,
        expect_kernels=KERNEL_NAME,
        describe={"backend": "gluon", "config": cfg.as_dict(), "kernel": KERNEL_NAME,
                  "cluster": f"{cfg.cluster_m}x1" + (" (B multicast)" if cfg.cluster_m > 1 else ""),
                  "numerics": (f"promote every {cfg.promote_k} of K" if cfg.promote
                               else "ceiling twin: scales ignored (wrong numbers)")},
    )


# --------------------------------------------------------------------------------------------
# Static facts without a GPU, and the CPU-side prune


def _signature(cfg: Config) -> tuple[dict, dict, dict]:
    lay = _layouts(cfg)
    kern = _kernel()
    hb = lay["b_block"][0]
    types = {
        "b_desc": f"tensordesc<fp8e4nv[{hb}, {BK}],{lay['b']!r}>",
        "a_desc": f"tensordesc<fp8e4nv[{cfg.BM}, {BK}],{lay['a']!r}>",
        "sa_desc": f"tensordesc<fp32[1, {cfg.BM}],{lay['sa']!r}>",
        "c_desc": f"tensordesc<bf16[{WG_M}, {cfg.SUB_N}],{lay['c']!r}>",
        "sb_ptr": "*fp32",
    }
    consts = constexprs(cfg)
    sig = {n: ("constexpr" if n in consts else types.get(n, "i32")) for n in kern.arg_names}
    names = list(kern.arg_names)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("sb_ptr", "N")}
    return sig, consts, attrs


def compile_only(shape: dict | None = None, config: dict | None = None, arch: str = "sm_90a") -> dict:
    """Compile one variant for sm_90a here (no GPU) and return its static facts: what
    ``gluon_sm90.compile_only`` reports (registers, spills, shared memory, wgmma and QGMMA counts,
    setmaxnreg, ptxas's serialisation verdict, FFMAs while a QGMMA group is pending, ring-index check)
    plus the cluster path's facts (multicast copies and remote arrives in PTX and SASS, cluster
    barriers, the shared-memory offsets and their cross-check against the barrier inits) and the
    epilogue's place (TMA stores issued while a QGMMA group is pending)."""
    import subprocess
    import tempfile
    import time
    from pathlib import Path

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = Config.from_dict(config) if config else default_config(shape or {"M": 4096, "N": 4096, "K": 4096})
    cfg.check()
    cap = int(arch.replace("sm_", "").rstrip("a"))
    sig, consts, attrs = _signature(cfg)
    t0 = time.perf_counter()
    src = GluonASTSource(fn=_kernel(), signature=sig, constexprs=consts, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", cap, 32), options={"num_warps": 4, "maxnreg": cfg.maxnreg})
    compile_s = round(time.perf_counter() - t0, 2)
    ptx = ck.asm["ptx"]
    offs = allocation_offsets(ck.asm["ttgir"])
    inits = barrier_init_offsets(ptx)
    want = sorted([offs["ready"] + 8 * s for s in range(cfg.stages)] + [offs["empty"] + 8 * s for s in range(cfg.stages)])
    facts: dict[str, Any] = {
        **_g1.ring_index_facts(ck.asm["ttgir"]),
        "config": cfg.as_dict(),
        "BM": cfg.BM,
        "compile_s": compile_s,
        "shared_bytes": int(ck.metadata.shared),
        "shared_estimate": cfg.smem_bytes(),
        "fits_smem": int(ck.metadata.shared) <= SM90_SMEM_LIMIT,
        "num_warps_total": int(getattr(ck.metadata, "num_warps", 0)),
        "maxnreg": cfg.maxnreg,
        "requested_regs": {"consumer": cfg.regs, "producer_left_estimate": cfg.producer_regs,
                           "consumer_estimate": cfg.register_estimate()},
        "smem_offsets": offs,
        "barrier_inits_match_offsets": inits == want,
        "barrier_inits_ptx": inits,
        "b_desc_is_param_0": bool(re.search(rf"\.param \.align 64 \.b8 {KERNEL_NAME}_param_0\[128\]", ptx)),
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "wgmma_commit": len(re.findall(r"wgmma\.commit_group", ptx)),
        "setmaxnreg_ptx": sorted(set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+\d+", ptx))),
        "fma_f32": len(re.findall(r"\bfma\.rn\.f32\b", ptx)),
        "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\.mbarrier::complete_tx::bytes \[", ptx)),
        "tma_multicast": len(re.findall(r"multicast::cluster", ptx)),
        "remote_arrive": len(re.findall(r"mbarrier\.arrive\.release\.cluster\.shared::cluster", ptx)),
        "cluster_barrier": len(re.findall(r"barrier\.cluster\.arrive", ptx)),
        "tma_stores": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
        "bar_sync": len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b|\bbar\.arrive\b|\bbarrier\.arrive\b", ptx)),
    }
    facts.update(_g1._overlap_facts(ptx))
    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        ptx_file = Path(tmp) / "k.ptx"
        ptx_file.write_text(ptx)
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(ck.asm["cubin"])
        try:
            info = subprocess.run([str(bindir / "ptxas"), f"-arch=sm_{cap}a", "-v", str(ptx_file), "-o",
                                   str(Path(tmp) / "v.cubin")], capture_output=True, text=True, timeout=300)
            text = info.stdout + info.stderr
            m = re.search(r"Used (\d+) registers", text)
            s = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
            st = re.search(r"(\d+) bytes stack frame", text)
            facts["regs"] = int(m.group(1)) if m else None
            facts["spill_store_bytes"] = int(s.group(1)) if s else None
            facts["spill_load_bytes"] = int(s.group(2)) if s else None
            facts["stack_bytes"] = int(st.group(1)) if st else None
            facts["ptxas_wgmma_serialized"] = sorted(set(re.findall(r"C75\d\d", text)))
            facts["ptxas_warnings"] = [ln.strip() for ln in text.splitlines() if "warning" in ln.lower()][:8]
            sass = subprocess.run([str(bindir / "cuobjdump"), "--dump-sass", str(cubin)], capture_output=True,
                                  text=True, timeout=300).stdout
            facts["sass_qgmma"] = len(re.findall(r"\bQGMMA\b|HGMMA\.\S*E4M3", sass))
            facts["sass_local_ld_st"] = len(re.findall(r"\b(LDL|STL)\b", sass))
            facts["sass_setmaxnreg"] = sorted(set(re.findall(r"USETMAXREG\S*\s+[^;]*", sass)))
            facts["sass_ffma"] = len(re.findall(r"\bFFMA\b", sass))
            facts.update(_g1.sass_overlap(sass))
            facts.update(sass_epilogue_overlap(sass))
            facts["sass_utmaldg"] = len(re.findall(r"\bUTMALDG\b", sass))
            facts["sass_utmaldg_multicast"] = len(re.findall(r"\bUTMALDG\S*MULTICAST", sass))
            facts["sass_utmastg"] = len(re.findall(r"\bUTMASTG\b", sass))
            facts["sass_remote_arrive"] = len(re.findall(r"\bSYNCS\.ARRIVE\S*\.RED\b|\bSYNCS\.ARRIVE\S*A1T0\S*\.RED", sass))
        except (OSError, subprocess.SubprocessError) as exc:
            facts["tool_error"] = f"{type(exc).__name__}: {exc}"
    facts["arch"] = arch
    facts["kernels"] = [{"name": KERNEL_NAME, "mma_sync": len(re.findall(r"\bmma\.sync", ptx)),
                         **{k: facts.get(k) for k in ("shared_bytes", "fits_smem", "wgmma", "regs", "spill_store_bytes",
                                                      "spill_load_bytes", "stack_bytes", "ptxas_wgmma_serialized",
                                                      "compile_s")}}]
    return facts


def sass_epilogue_overlap(sass: str) -> dict:
    """TMA stores (UTMASTG) issued while a QGMMA group is pending: the epilogue under the next tile's
    wgmma. The design point drains every group before its store, so it has none."""
    pending = 0
    stores = 0
    for line in sass.splitlines():
        if "QGMMA" in line and "gsb0" in line:
            pending += 1
            continue
        m = re.search(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)", line)
        if m:
            pending = min(pending, int(m.group(1), 16))
        elif pending and re.search(r"\bUTMASTG\b", line):
            stores += 1
    return {"sass_utmastg_while_qgmma_pending": stores}


def prune_reasons(facts: dict) -> list[str]:
    """Why a compiled variant is not worth device time (empty: keep it). Compile facts only:
    spills or local memory (every spill is a round trip through L1 in the promote), ptxas
    serialising the wgmma (C7514/C7515: every wgmma waits), a promote that no longer overlaps a
    pending wgmma group where the config asks for one, shared memory over the limit, a ring barrier
    indexed from outside its loop (a hang), and a cluster variant whose shared-memory offsets do not
    match its barrier inits (its inline PTX would address the wrong bytes)."""
    why = []
    if facts.get("tool_error"):
        why.append(f"no ptxas facts ({facts['tool_error'][:120]})")
    if facts.get("spill_store_bytes") or facts.get("spill_load_bytes") or facts.get("sass_local_ld_st") or facts.get("stack_bytes"):
        why.append(f"spills: {facts.get('spill_store_bytes')} B stored, {facts.get('spill_load_bytes')} B loaded, "
                   f"{facts.get('sass_local_ld_st')} local ld/st, stack {facts.get('stack_bytes')} B")
    if facts.get("ptxas_wgmma_serialized"):
        why.append(f"ptxas serialises the wgmma ({', '.join(facts['ptxas_wgmma_serialized'])})")
    cfg = facts.get("config")
    if cfg is not None and Config.from_dict(cfg).stream and not facts.get("sass_ffma_while_qgmma_pending"):
        why.append("no promote FFMA issues while a QGMMA group is pending: the overlap the config asks for is gone")
    if facts.get("fits_smem") is False:
        why.append(f"{facts.get('shared_bytes')} B of shared memory > {SM90_SMEM_LIMIT}")
    if facts.get("loop_invariant_barrier_ops"):
        why.append(f"ring barrier indexed from outside its loop: {facts['loop_invariant_barrier_ops'][0]}")
    if (cfg or {}).get("cluster_m", 1) > 1 and not (facts.get("barrier_inits_match_offsets") and facts.get("b_desc_is_param_0")):
        why.append("cluster inline PTX would address the wrong shared memory or tensor map "
                   f"(offsets {facts.get('smem_offsets')}, inits {facts.get('barrier_inits_ptx')})")
    return why


def prune(configs: list[dict], shape: dict | None = None, arch: str = "sm_90a") -> dict:
    """The CPU-side prune of a tunable space: each config checked (``Config.check``) and compiled;
    kept when :func:`prune_reasons` finds nothing. Returns {"kept": [config...], "dropped":
    [{"config", "reason"}...], "facts": {label: compact facts}} (compile-only, not a measurement)."""
    kept, dropped, facts = [], [], {}
    for c in configs:
        label = ",".join(f"{k}={v}" for k, v in sorted(c.items())) or "design"
        try:
            cfg = Config.from_dict(c)
            cfg.check()
        except ValueError as exc:
            dropped.append({"config": c, "reason": f"check: {exc}"})
            continue
        try:
            f = compile_only(shape, c, arch)
        except Exception as exc:  # noqa: BLE001 - a compile failure is a reason, recorded
            dropped.append({"config": c, "reason": f"compile failed: {type(exc).__name__}: {str(exc)[:300]}"})
            continue
        facts[label] = compact(f)
        why = prune_reasons(f)
        if why:
            dropped.append({"config": c, "reason": "; ".join(why)})
        else:
            kept.append(c)
    return {"what": "compile-only prune (no GPU): configs that spill, serialise wgmma, lose the overlap or "
                    "break the cluster checks are dropped before any device time; nothing here is a measurement",
            "arch": arch, "kept": kept, "dropped": dropped, "facts": facts}


def compact(f: dict) -> dict:
    """The facts a prune or a card quotes, per variant."""
    keys = ("regs", "spill_store_bytes", "spill_load_bytes", "stack_bytes", "sass_local_ld_st", "shared_bytes",
            "fits_smem", "ptxas_wgmma_serialized", "wgmma", "sass_qgmma", "sass_ffma_while_qgmma_pending",
            "sass_utmastg_while_qgmma_pending", "sass_depbar", "tma_multicast", "sass_utmaldg_multicast",
            "remote_arrive", "cluster_barrier", "barrier_inits_match_offsets", "smem_offsets",
            "loop_invariant_barrier_ops", "setmaxnreg_ptx", "compile_s")
    return {k: f.get(k) for k in keys if k in f}
