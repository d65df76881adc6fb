"""Gluon port of the fp8 block-scale GEMM for Hopper (sm_90a): warp-specialized, persistent.

    C[M, N] bf16 = A[M, K] fp8 e4m3 x B[N, K]^T fp8 e4m3,  a_scale (M, K/128), b_scale (ceil(N/128), K/128)

Same numerics as the Triton port (``triton_sm90.py``) and cuBLAS block-wise: each 128-deep K block
is one unscaled fp8 wgmma chain into a *fresh* fp32 partial, then the fp32 promote
``acc = fma(partial, sa[m, kb] * sb[n/128, kb], acc)`` on the CUDA cores.

Why Gluon: Triton 3.6's ``tl.dot`` pipeline on sm_90 keeps both warpgroups of a CTA in lockstep and
its one in-CTA overlap of promote and wgmma is serialised by ptxas (C7514/C7515; NOTES.md). The
promote is about a quarter of the MMA time, and hiding it is what DeepGEMM and cuBLAS do. Gluon
exposes the controls to do it by hand:

* **Partitions** (``gl.warp_specialize``): the default partition (4 warps) is the TMA producer; one
  worker partition per consumer warpgroup (4 warps each). The producer's register budget is what
  is left after the consumers take theirs (``setmaxnreg``; the kernel is compiled with a
  ``maxnreg`` cap so that the reallocation has a pool to draw from).
* **Ring**: ``stages`` shared-memory slots, each holding one K block of A (BM x 128), of B
  (BN x 128) and of the A scales (BM fp32, also brought by TMA so they arrive with their tile).
  ``ready[s]`` (count 1, completed by the TMA transaction bytes) and ``empty[s]`` (count = number of
  consumer warpgroups, one arrive each after their wgmma reading the slot has completed).
* **Consumers**: warpgroup ``w`` owns rows ``[64 w, 64 w + 64)`` of the BM x BN tile. With
  ``async_depth = 1`` it issues the wgmma of K block ``kb`` into a fresh partial, then waits for
  block ``kb - 1`` only (``warpgroup_mma_wait(num_outstanding=1)``), releases its slot and promotes
  it while block ``kb``'s wgmma runs. Two partials alternate; the K loop is unrolled by two so each
  partial keeps its own registers (a loop-carried swap would copy an in-flight accumulator, the
  C7514 trap the Triton port fell into). The two warpgroups are independent partitions, so one
  warpgroup's promote also overlaps the other's wgmma.
* **Epilogue**: each consumer converts its rows to bf16, stages them in shared memory and writes
  them with a TMA store (the copy engine clips the ragged M and N edges); the store drains while the
  next tile's K loop runs and is waited for just before the staging buffer is reused.
* **Persistent** grid (one CTA per SM) walking the tiles in grouped order (``group_m``); every
  partition walks the same sequence, so the ring's slot/phase counters agree without messages.

Ablation twins (same binary layout, one knob each): ``promote=False`` chains the K blocks in one
tensor-core accumulator (scales ignored: wrong numbers, the data-movement + MMA ceiling);
``consumers=1`` (BM 64); ``async_depth=0`` (wait for each block before promoting it: only the
cross-warpgroup overlap is left); ``stages``; ``BN`` 64/128/256 (256 = two 128-wide partials, each
with its own B scale, promoted one after the other with ``async_depth=0``: two partials in flight
would not fit the register budget); ``a_scales="global"`` (consumers load the A scales themselves:
no generic shared-memory read of the slot, so no proxy fence before each release). Each promoted
accumulator passes through ``_pinned``, an identity the compiler may not move, so the promote stays
ahead of the next wgmma that reuses its partial's registers (see ``_pinned``).

Nothing here has run on a GPU yet: see NOTES.md ("Gluon kernel") for the compile-only facts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from skillrun_kernels.fp8_blockscale_gemm import problem
from skillrun_kernels.protocol import KernelLaunch, UnsupportedShape

BK = problem.BLOCK  # 128: the scale block along K, one ring slot
WG_M = 64  # rows per consumer warpgroup (the wgmma M of one warpgroup)
KERNEL_NAME = "_fp8_blockscale_gemm_gluon_sm90"
SM90_SMEM_LIMIT = 232448  # bytes of shared memory one block may opt into on sm_90
REGISTER_FILE = 65536  # 32-bit registers per SM
_BARRIER_BYTES = 8

# --------------------------------------------------------------------------------------------
# Host side: configuration, validation, resource estimates (plain Python, testable on CPU)


@dataclass(frozen=True)
class Config:
    """One compile-time variant plus its launch knobs. Field names are what cards write."""

    BN: int = 128
    consumers: int = 2  # consumer warpgroups; BM = 64 x consumers
    stages: int = 5
    async_depth: int = 1  # wgmma groups left in flight while the previous block is promoted (0 or 1)
    group_m: int = 8
    promote: bool = True  # False: the ceiling twin (no scales, one accumulator chain; wrong numbers)
    consumer_regs: int = 0  # setmaxnreg of each consumer warpgroup; 0 = the default for `consumers`
    ctas_per_sm: int = 1
    a_scales: str = "tma"  # "tma": A scales ride in the ring slot; "global": consumers load them (ablation)

    @property
    def BM(self) -> int:
        return WG_M * self.consumers

    @property
    def SUB_N(self) -> int:
        return min(self.BN, BK)

    @property
    def NSUB(self) -> int:
        return self.BN // self.SUB_N

    @property
    def regs(self) -> int:
        if self.consumer_regs:
            return self.consumer_regs
        return 232 if self.consumers == 2 else 240

    @property
    def maxnreg(self) -> int:
        """Per-thread register cap at launch: the pool setmaxnreg redistributes (whole CTA fits one SM)."""
        threads = 128 * (self.consumers + 1)
        return min(248, (REGISTER_FILE // threads) // 8 * 8)

    @property
    def producer_regs(self) -> int:
        """What the default (producer) partition is left with after the consumers' setmaxnreg."""
        return self.maxnreg * (self.consumers + 1) - self.regs * self.consumers

    @staticmethod
    def from_dict(d: dict | None) -> "Config":
        d = dict(d or {})
        known = {f.name for f in fields(Config)}
        extra = set(d) - known
        if extra:
            raise ValueError(f"gluon_sm90 config: unknown key(s) {sorted(extra)} (known: {sorted(known)})")
        for k, v in d.items():
            want = bool if k == "promote" else (str if k == "a_scales" else int)
            if want is str and not isinstance(v, str):
                raise ValueError(f"gluon_sm90 config: {k}={v!r} must be a string")
            if want is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"gluon_sm90 config: {k}={v!r} must be an integer")
            if want is bool and not isinstance(v, bool):
                raise ValueError(f"gluon_sm90 config: {k}={v!r} must be true or false")
        return Config(**d)

    def check(self) -> None:
        """Reject a config that cannot compile, cannot launch or would spill, with the reason."""
        if self.a_scales not in ("tma", "global"):
            raise ValueError(f"gluon_sm90 config: a_scales={self.a_scales!r} must be 'tma' or 'global'")
        if self.consumers not in (1, 2):
            raise ValueError(f"gluon_sm90 config: consumers={self.consumers} must be 1 or 2 (BM = 64 x consumers)")
        if self.BN not in (64, 128, 256):
            raise ValueError(f"gluon_sm90 config: BN={self.BN} must be 64, 128 or 256")
        if self.async_depth not in (0, 1):
            raise ValueError(f"gluon_sm90 config: async_depth={self.async_depth} must be 0 or 1")
        if self.async_depth == 1 and self.NSUB > 1 and self.promote:
            raise ValueError(
                f"gluon_sm90 config: BN={self.BN} needs async_depth=0 (accumulator {self.BN // 2} + two "
                f"partials of {self.SUB_N // 2} registers per thread exceed the consumer budget)")
        if not 2 <= self.stages <= 8:
            raise ValueError(f"gluon_sm90 config: stages={self.stages} must be in 2..8")
        if self.group_m < 1:
            raise ValueError(f"gluon_sm90 config: group_m={self.group_m} must be >= 1")
        if self.ctas_per_sm != 1:
            raise ValueError("gluon_sm90 config: ctas_per_sm must be 1 (one warp-specialized CTA fills an SM)")
        if self.regs % 8 or not 24 <= self.regs <= 256:
            raise ValueError(f"gluon_sm90 config: consumer_regs={self.regs} must be a multiple of 8 in 24..256")
        need = self.register_estimate()
        if need > self.regs:
            raise ValueError(
                f"gluon_sm90 config: a consumer thread needs about {need} registers (accumulator, partials, "
                f"addressing) but consumer_regs={self.regs}; lower BN or async_depth")
        if self.producer_regs < 24:
            raise ValueError(
                f"gluon_sm90 config: consumer_regs={self.regs} x {self.consumers} leaves the producer "
                f"{self.producer_regs} registers (< 24) of the {self.maxnreg} x {128 * (self.consumers + 1)} pool")
        smem = self.smem_bytes()
        if smem > SM90_SMEM_LIMIT:
            raise ValueError(
                f"gluon_sm90 config: {smem} bytes of shared memory (stages={self.stages}, BM={self.BM}, "
                f"BN={self.BN}) exceed the sm_90 limit of {SM90_SMEM_LIMIT}; use fewer stages")

    def register_estimate(self) -> int:
        """Live fp32 registers per consumer thread: accumulator + partials + ~32 for addressing,
        barrier phases and scales (calibrated against ptxas -v on the compile-only configs)."""
        acc = self.BM // self.consumers * self.BN // 128
        partial = WG_M * self.SUB_N // 128
        live_partials = 0 if not self.promote else (1 + self.async_depth)
        return acc + live_partials * partial + 32

    def smem_bytes(self) -> int:
        """The ring (A, B, A-scale slots), the epilogue staging and the barriers, in bytes."""
        ring = self.stages * (self.BM * BK + self.BN * BK + 4 * self.BM)
        staging = self.consumers * self.NSUB * WG_M * self.SUB_N * 2
        return ring + staging + 2 * self.stages * _BARRIER_BYTES

    def as_dict(self) -> dict:
        return asdict(self)


def default_config(shape: dict) -> Config:
    """The config ``build`` uses when it is given none. Nothing is measured yet: this is the design
    point (128x128 tile, 2 consumer warpgroups, async depth 1, 5 stages), not a tuned choice."""
    problem.check_shape(shape)
    return Config()


# The design point and one-knob ablations of it (the list), by name. The compile check,
# the tests and the benchmark all read this table; ratios are always taken against "design" in
# the same session. Compile-only facts for each are in kernels/fp8_blockscale_gemm/results/.
ABLATIONS: dict[str, dict] = {
    "design": {},                                                   # 128x128, 2 consumer WGs, depth 1, 5 stages
    "no_promote": {"promote": False},                               # ceiling twin (scales ignored)
    "no_promote_depth0": {"promote": False, "async_depth": 0},
    "one_consumer": {"consumers": 1},                               # 64x128 tile, one consumer WG
    "async_depth_0": {"async_depth": 0},                            # promote only after each block's wgmma drained
    "stages_3": {"stages": 3},
    "stages_4": {"stages": 4},
    "tile_128x256": {"BN": 256, "async_depth": 0, "stages": 3},     # two 128-wide partials, one live at a time
    "tile_128x256_no_promote": {"BN": 256, "promote": False, "stages": 3},
    "tile_128x64": {"BN": 64, "stages": 6},
    "a_scales_global": {"a_scales": "global"},                      # no generic smem read, no proxy fence
}


def ablation_config(name: str) -> Config:
    if name not in ABLATIONS:
        raise ValueError(f"gluon_sm90: unknown ablation {name!r} (known: {sorted(ABLATIONS)})")
    return Config.from_dict(ABLATIONS[name])


def check_problem(shape: dict) -> tuple[int, int, int]:
    """(M, N, K) this kernel supports, or UnsupportedShape naming the reason."""
    M, N, K = problem.check_shape(shape)
    if K % BK:
        raise UnsupportedShape(f"gluon_sm90: K={K} is not a multiple of {BK}")
    if N % 8:
        # The TMA store of C needs a 16-byte row pitch (8 bf16); B's and A's rows are K bytes (K % 128 == 0).
        raise UnsupportedShape(f"gluon_sm90: N={N} must be a multiple of 8 (TMA store row pitch of bf16 C)")
    return M, N, K


def a_scale_rows(M: int) -> int:
    """Row pitch (elements) of the transposed A scales: M rounded up to 4, a 16-byte TMA pitch."""
    return -(-M // 4) * 4


def tile_order(M: int, N: int, BM: int, BN: int, group_m: int) -> list[tuple[int, int]]:
    """(pid_m, pid_n) of each tile id in the kernel's grouped order; same arithmetic as _tile_coords."""
    num_pid_m, num_pid_n = -(-M // BM), -(-N // BN)
    out = []
    for t in range(num_pid_m * num_pid_n):
        in_group = group_m * num_pid_n
        first_m = (t // in_group) * group_m
        gm = min(num_pid_m - first_m, group_m)
        out.append((first_m + (t % in_group) % gm, (t % in_group) // gm))
    return out


def prepared_a_scales(a_scale, M: int):
    """(K/128, M4) fp32 row-major, zero in the padding columns: the TMA-loadable A-scale layout."""
    import torch

    L = a_scale.shape[1]
    sa_t = torch.zeros((L, a_scale_rows(M)), dtype=torch.float32, device=a_scale.device)
    sa_t[:, :M] = a_scale.float().t()
    return sa_t


# --------------------------------------------------------------------------------------------
# Device side. Gluon resolves names through the module's globals, so its imports live here; a
# machine without triton (or with a triton lacking Gluon) still gets the host-side half above.

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    GLUON_IMPORT_ERROR: str | None = None
except Exception as _exc:  # ImportError, or a triton build without the experimental dialect
    GLUON_IMPORT_ERROR = f"{type(_exc).__name__}: {_exc}"


def _kernel():
    if GLUON_IMPORT_ERROR is not None:
        raise UnsupportedShape(f"gluon_sm90 needs triton.experimental.gluon ({GLUON_IMPORT_ERROR})")
    return _fp8_blockscale_gemm_gluon_sm90


if GLUON_IMPORT_ERROR is None:

    @gluon.jit
    def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M):
        # Grouped raster: GROUP_M row-tiles share each column-tile while it is hot in L2.
        in_group = GROUP_M * num_pid_n
        first_m = (tile_id // in_group) * GROUP_M
        group_m = gl.minimum(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile_id % in_group) % group_m
        pid_n = (tile_id % in_group) // group_m
        return pid_m, pid_n

    @gluon.jit
    def _advance(slot, phase, STAGES: gl.constexpr):
        nxt = slot + 1
        wrap = nxt == STAGES
        return gl.where(wrap, 0, nxt), gl.where(wrap, phase ^ 1, phase)

    @gluon.jit
    def _prev_slot(slot, STAGES: gl.constexpr):
        # The ring slot used one K block before ``slot``. It used to be a variable (``prev = slot``
        # before the K loop and again at the end of its body), which hung the no-promote twin with
        # async depth 1 on the H200: the frontend finds loop-carried variables by a dry run of the
        # body and compares handles, and at that statement ``slot`` is still the loop's input, the
        # very value ``prev`` started from, so ``prev`` was not carried: every arrive of a tile went
        # to the tile's first slot, the others were never released, and the producer waited on them
        # for ever. Computing the index from ``slot`` has no variable to lose.
        return gl.where(slot == 0, STAGES - 1, slot - 1)

    # ---- producer: the default partition (4 warps; the copy ops are issued by one thread)
    @gluon.jit
    def _producer(a_desc, b_desc, sa_desc, a_ring, b_ring, sa_ring, ready, empty,
                  M, N, L, GROUP_M, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                  SA_TMA: gl.constexpr):
        num_pid_m = gl.cdiv(M, BM)
        num_pid_n = gl.cdiv(N, BN)
        num_tiles = num_pid_m * num_pid_n
        nbytes: gl.constexpr = (BM * 128 + BN * 128 + 4 * BM) if SA_TMA else (BM * 128 + BN * 128)
        slot = 0
        phase = 0
        for tile_id in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BM
            off_n = pid_n * BN
            for kb in range(L):
                # A slot is free once every consumer warpgroup has arrived on it; a fresh barrier
                # counts as having completed the phase before phase 0, hence the ^ 1.
                mbarrier.wait(empty.index(slot), phase ^ 1)
                bar = ready.index(slot)
                mbarrier.expect(bar, nbytes)
                tma.async_copy_global_to_shared(a_desc, [off_m, kb * 128], bar, a_ring.index(slot))
                tma.async_copy_global_to_shared(b_desc, [off_n, kb * 128], bar, b_ring.index(slot))
                if SA_TMA:
                    tma.async_copy_global_to_shared(sa_desc, [kb, off_m], bar, sa_ring.index(slot))
                slot, phase = _advance(slot, phase, STAGES)

    # ---- consumer helpers
    @gluon.jit
    def _sa_rows(sa_ring, slot, sa_ptr, SA_PITCH, kb, off_m, WG: gl.constexpr, row_layout: gl.constexpr,
                 SA_TMA: gl.constexpr):
        # sa[rows of this warpgroup, kb] for the block in ``slot``. SA_TMA: it came with the tile
        # (TMA, BM fp32 in the slot). Otherwise (the a_scales="global" ablation) two plain loads per
        # thread from the same (K/128, SA_PITCH) copy; rows past its pitch read 0.
        if SA_TMA:
            return sa_ring.index(slot).slice(WG * 64, 64).load(row_layout)
        else:
            rows = off_m + WG * 64 + gl.arange(0, 64, layout=row_layout)
            return gl.load(sa_ptr + kb * SA_PITCH + rows, mask=rows < SA_PITCH, other=0.0)

    @gluon.jit
    def _pinned(acc):
        # An identity the compiler may not move (a side-effecting asm, ordered with the wgmma asm).
        # It keeps a promote's FMAs ahead of the next wgmma that reuses their partial's registers:
        # left free, LLVM sank them past it and copied the in-flight partial, and ptxas then
        # serialised every wgmma (C7514), undoing the overlap.
        return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [acc], dtype=gl.float32, is_pure=False, pack=1)

    @gluon.jit
    def _release(empty, slot, SA_TMA: gl.constexpr):
        # The A-scale read above was a generic-proxy shared load; the producer's next TMA write to
        # this slot is an async-proxy write: fence so the two are ordered across the arrive. Without
        # that read (A scales from global memory) the slot is only read by the wgmma (async proxy).
        if SA_TMA:
            fence_async_shared()
        mbarrier.arrive(empty.index(slot), count=1)

    @gluon.jit
    def _store_tile(acc, c_desc, c_smem, off_m, off_n):
        # The previous tile's TMA store read c_smem asynchronously: drain it before overwriting.
        tma.store_wait(0)
        c_smem.store(acc.to(gl.bfloat16))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)

    # ---- consumer, async depth 1: block kb's wgmma in flight while block kb-1 is promoted
    @gluon.jit
    def _consumer_overlap(a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, sa_ptr, SA_PITCH,
                          M, N, L, GROUP_M, WG: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                          STAGES: gl.constexpr, SA_TMA: gl.constexpr):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
        row_layout: gl.constexpr = gl.SliceLayout(1, mma)
        num_pid_m = gl.cdiv(M, BM)
        num_pid_n = gl.cdiv(N, BN)
        num_tiles = num_pid_m * num_pid_n
        c_smem = c_bufs.index(WG)
        # Two partials with fixed registers. Each wgmma takes the partial it overwrites as its
        # (ignored, use_acc=False) input, so no instruction but a wgmma ever defines them.
        p_a = gl.zeros([64, BN], gl.float32, mma)
        p_b = gl.zeros([64, BN], gl.float32, mma)
        slot = 0
        phase = 0
        for tile_id in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BM
            off_n = pid_n * BN
            sb_row = (off_n // 128) * L
            acc = gl.zeros([64, BN], gl.float32, mma)
            # K block 0 -> p_a. Each step below: wait for the slot, read its A scales, issue its wgmma,
            # wait for the *previous* block, release the previous slot, load this block's B scale
            # (after the release's fence, so the fence never waits on it), promote the previous block.
            mbarrier.wait(ready.index(slot), phase)
            sa_a = _sa_rows(sa_ring, slot, sa_ptr, SA_PITCH, 0, off_m, WG, row_layout, SA_TMA)
            tok_a = warpgroup_mma(a_ring.index(slot).slice(WG * 64, 64), b_ring.index(slot).permute((1, 0)), p_a,
                                  use_acc=False, is_async=True)
            slot_a = slot
            slot, phase = _advance(slot, phase, STAGES)
            sb_a = gl.load(sb_ptr + sb_row)
            sa_b = sa_a
            sb_b = sb_a
            slot_b = slot_a
            # Pairs of K blocks (2j+1 -> p_b, 2j+2 -> p_a), unrolled so that p_a and p_b never swap.
            for j in range((L - 1) // 2):
                kb = 1 + 2 * j
                mbarrier.wait(ready.index(slot), phase)
                sa_b = _sa_rows(sa_ring, slot, sa_ptr, SA_PITCH, kb, off_m, WG, row_layout, SA_TMA)
                tok_b = warpgroup_mma(a_ring.index(slot).slice(WG * 64, 64), b_ring.index(slot).permute((1, 0)),
                                      p_b, use_acc=False, is_async=True)
                slot_b = slot
                slot, phase = _advance(slot, phase, STAGES)
                p_a = warpgroup_mma_wait(1, deps=(tok_a,))  # block kb-1 done; block kb still running
                _release(empty, slot_a, SA_TMA)
                sb_b = gl.load(sb_ptr + sb_row + kb)
                acc = _pinned(gl.fma(p_a, (sa_a * sb_a)[:, None], acc))

                mbarrier.wait(ready.index(slot), phase)
                sa_a = _sa_rows(sa_ring, slot, sa_ptr, SA_PITCH, kb + 1, off_m, WG, row_layout, SA_TMA)
                tok_a = warpgroup_mma(a_ring.index(slot).slice(WG * 64, 64), b_ring.index(slot).permute((1, 0)),
                                      p_a, use_acc=False, is_async=True)
                slot_a = slot
                slot, phase = _advance(slot, phase, STAGES)
                p_b = warpgroup_mma_wait(1, deps=(tok_b,))
                _release(empty, slot_b, SA_TMA)
                sb_a = gl.load(sb_ptr + sb_row + kb + 1)
                acc = _pinned(gl.fma(p_b, (sa_b * sb_b)[:, None], acc))
            if L % 2 == 0:
                # One block left (L - 1 is odd): issue it, then drain both.
                mbarrier.wait(ready.index(slot), phase)
                sa_b = _sa_rows(sa_ring, slot, sa_ptr, SA_PITCH, L - 1, off_m, WG, row_layout, SA_TMA)
                tok_b = warpgroup_mma(a_ring.index(slot).slice(WG * 64, 64), b_ring.index(slot).permute((1, 0)),
                                      p_b, use_acc=False, is_async=True)
                slot_b = slot
                slot, phase = _advance(slot, phase, STAGES)
                p_a = warpgroup_mma_wait(1, deps=(tok_a,))
                _release(empty, slot_a, SA_TMA)
                sb_b = gl.load(sb_ptr + sb_row + L - 1)
                acc = _pinned(gl.fma(p_a, (sa_a * sb_a)[:, None], acc))
                p_b = warpgroup_mma_wait(0, deps=(tok_b,))
                _release(empty, slot_b, SA_TMA)
                acc = _pinned(gl.fma(p_b, (sa_b * sb_b)[:, None], acc))
            else:
                p_a = warpgroup_mma_wait(0, deps=(tok_a,))
                _release(empty, slot_a, SA_TMA)
                acc = _pinned(gl.fma(p_a, (sa_a * sb_a)[:, None], acc))
            _store_tile(acc, c_desc, c_smem, off_m + WG * 64, off_n)
        tma.store_wait(0)

    # ---- consumer, async depth 0: wait for each block's wgmma, then promote it (BN up to 256 as
    # NSUB 128-wide partials, one live at a time); the ceiling twin (PROMOTE False) for any depth.
    @gluon.jit
    def _consumer_serial(a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, sa_ptr, SA_PITCH,
                         M, N, L, GROUP_M, WG: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                         STAGES: gl.constexpr, ASYNC: gl.constexpr, PROMOTE: gl.constexpr, SA_TMA: gl.constexpr):
        SUB_N: gl.constexpr = 128 if BN > 128 else BN
        NSUB: gl.constexpr = BN // SUB_N
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SUB_N, 32])
        row_layout: gl.constexpr = gl.SliceLayout(1, mma)
        num_pid_m = gl.cdiv(M, BM)
        num_pid_n = gl.cdiv(N, BN)
        num_tiles = num_pid_m * num_pid_n
        p = gl.zeros([64, SUB_N], gl.float32, mma)
        slot = 0
        phase = 0
        for tile_id in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BM
            off_n = pid_n * BN
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
                    _release(empty, slot, SA_TMA)
                else:
                    # Ceiling twin: one tensor-core accumulator chain per sub-tile across all of K,
                    # ASYNC blocks left in flight, the slot of the block that completed released.
                    t0 = warpgroup_mma(a_tile, b_tile.slice(0, SUB_N).permute((1, 0)), acc0, use_acc=kb > 0,
                                       is_async=True)
                    if NSUB == 2:
                        t1 = warpgroup_mma(a_tile, b_tile.slice(SUB_N, SUB_N).permute((1, 0)), acc1,
                                           use_acc=kb > 0, is_async=True)
                        acc0, acc1 = warpgroup_mma_wait(ASYNC * 2, deps=(t0, t1))
                    else:
                        acc0 = warpgroup_mma_wait(ASYNC, deps=(t0,))
                    if ASYNC == 1:
                        # The block before this one has completed: release its slot. Its index is
                        # computed here, never kept in a variable: see _prev_slot.
                        mbarrier.arrive(empty.index(_prev_slot(slot, STAGES)), count=1, pred=kb > 0)
                    else:
                        mbarrier.arrive(empty.index(slot), count=1)
                slot, phase = _advance(slot, phase, STAGES)
            if not PROMOTE:
                if ASYNC == 1:
                    if NSUB == 2:
                        acc0, acc1 = warpgroup_mma_wait(0, deps=(acc0, acc1))
                    else:
                        acc0 = warpgroup_mma_wait(0, deps=(acc0,))
                    mbarrier.arrive(empty.index(_prev_slot(slot, STAGES)), count=1)  # the tile's last block
            _store_tile(acc0, c_desc, c_bufs.index(WG * NSUB), off_m + WG * 64, off_n)
            if NSUB == 2:
                _store_tile(acc1, c_desc, c_bufs.index(WG * NSUB + 1), off_m + WG * 64, off_n + SUB_N)
        tma.store_wait(0)

    @gluon.jit
    def _consumer(a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, sa_ptr, SA_PITCH, M, N, L, GROUP_M,
                  WG: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                  ASYNC: gl.constexpr, PROMOTE: gl.constexpr, SA_TMA: gl.constexpr):
        if PROMOTE and ASYNC == 1:
            _consumer_overlap(a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, sa_ptr, SA_PITCH,
                              M, N, L, GROUP_M, WG, BM, BN, STAGES, SA_TMA)
        else:
            _consumer_serial(a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, sa_ptr, SA_PITCH,
                             M, N, L, GROUP_M, WG, BM, BN, STAGES, ASYNC, PROMOTE, SA_TMA)

    @gluon.jit(do_not_specialize=["M", "L", "GROUP_M", "SA_PITCH"])
    def _fp8_blockscale_gemm_gluon_sm90(
        a_desc, b_desc, sa_desc, c_desc, sb_ptr, sa_ptr, SA_PITCH, M, N, L, GROUP_M,
        BN: gl.constexpr, CONSUMERS: gl.constexpr, STAGES: gl.constexpr, ASYNC: gl.constexpr,
        PROMOTE: gl.constexpr, CONSUMER_REGS: gl.constexpr, SA_TMA: gl.constexpr,
    ):
        BM: gl.constexpr = 64 * CONSUMERS
        SUB_N: gl.constexpr = 128 if BN > 128 else BN
        NSUB: gl.constexpr = BN // SUB_N
        a_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, 128], a_desc.layout)
        b_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, 128], b_desc.layout)
        sa_tma = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BM], sa_desc.layout)
        # The same bytes as [STAGES, BM] plain rows (a 1 x BM box has no swizzle) for the consumers'
        # register loads; the producer writes through the TMA-shaped view.
        sa_ring = sa_tma._reinterpret(gl.float32, [STAGES, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        c_bufs = gl.allocate_shared_memory(gl.bfloat16, [CONSUMERS * NSUB, 64, SUB_N], c_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=CONSUMERS)
        fence_async_shared()  # barrier inits visible to the copy engine before the first TMA
        if CONSUMERS == 2:
            gl.warp_specialize([
                (_producer, (a_desc, b_desc, sa_desc, a_ring, b_ring, sa_tma, ready, empty, M, N, L, GROUP_M,
                             BM, BN, STAGES, SA_TMA)),
                (_consumer, (a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, sa_ptr, SA_PITCH,
                             M, N, L, GROUP_M, 0, BM, BN, STAGES, ASYNC, PROMOTE, SA_TMA)),
                (_consumer, (a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, sa_ptr, SA_PITCH,
                             M, N, L, GROUP_M, 1, BM, BN, STAGES, ASYNC, PROMOTE, SA_TMA)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (_producer, (a_desc, b_desc, sa_desc, a_ring, b_ring, sa_tma, ready, empty, M, N, L, GROUP_M,
                             BM, BN, STAGES, SA_TMA)),
                (_consumer, (a_ring, b_ring, sa_ring, ready, empty, c_desc, c_bufs, sb_ptr, sa_ptr, SA_PITCH,
                             M, N, L, GROUP_M, 0, BM, BN, STAGES, ASYNC, PROMOTE, SA_TMA)),
            ], [4], [CONSUMER_REGS])



# --------------------------------------------------------------------------------------------
# Host side: operands, launch, the build protocol


def _layouts(cfg: Config) -> dict:
    from triton.experimental.gluon import language as gl

    return {
        "a": gl.NVMMASharedLayout.get_default_for([cfg.BM, BK], gl.float8e4nv),
        "b": gl.NVMMASharedLayout.get_default_for([cfg.BN, BK], gl.float8e4nv),
        "sa": gl.NVMMASharedLayout.get_default_for([1, cfg.BM], gl.float32),
        "c": gl.NVMMASharedLayout.get_default_for([WG_M, cfg.SUB_N], gl.bfloat16),
    }


_SM_COUNT: dict[int, int] = {}


def _sm_count(device) -> int:
    import torch

    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def prepare_operands(inputs: dict, cfg: Config) -> dict:
    """Kernel operands from problem inputs (untimed): TMA descriptors over A, B and the transposed,
    16-byte-pitched A scales; the B scales as a row-major (ceil(N/128), K/128) fp32 tensor."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    a, b = inputs["a"].contiguous(), inputs["b"].contiguous()
    M, K = a.shape
    N = b.shape[0]
    lay = _layouts(cfg)
    sa_t = prepared_a_scales(inputs["a_scale"], M)
    sb = inputs["b_scale"].float().contiguous()
    return {
        "a": a, "b": b, "sa_t": sa_t, "sb": sb, "M": M, "N": N, "K": K,
        "a_desc": TensorDescriptor(a, [M, K], [K, 1], [cfg.BM, BK], lay["a"]),
        "b_desc": TensorDescriptor(b, [N, K], [K, 1], [cfg.BN, BK], lay["b"]),
        "sa_desc": TensorDescriptor(sa_t, list(sa_t.shape), [sa_t.shape[1], 1], [1, cfg.BM], lay["sa"]),
        "c_layout": lay["c"],
    }


def launch(prep: dict, out, cfg: Config, num_sms: int | None = None):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    M, N, K = prep["M"], prep["N"], prep["K"]
    if out.stride(1) != 1 or (out.stride(0) * 2) % 16 or out.data_ptr() % 16:
        raise ValueError("gluon_sm90: C must be row-major with a 16-byte aligned base and row pitch (TMA store)")
    c_desc = TensorDescriptor(out, [M, N], [out.stride(0), 1], [WG_M, cfg.SUB_N], prep["c_layout"])
    tiles = -(-M // cfg.BM) * -(-N // cfg.BN)
    grid = (min(num_sms or _sm_count(out.device), tiles),)
    _kernel()[grid](
        prep["a_desc"], prep["b_desc"], prep["sa_desc"], c_desc, prep["sb"], prep["sa_t"], prep["sa_t"].shape[1],
        M, N, K // BK, cfg.group_m,
        BN=cfg.BN, CONSUMERS=cfg.consumers, STAGES=cfg.stages, ASYNC=cfg.async_depth, PROMOTE=cfg.promote,
        CONSUMER_REGS=cfg.regs, SA_TMA=cfg.a_scales == "tma", num_warps=4, maxnreg=cfg.maxnreg,
    )
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
        name="gluon_sm90",
        run=run,
        prepare=prepare,
        expect_kernels=KERNEL_NAME,
        describe={"backend": "gluon", "config": cfg.as_dict(), "kernel": KERNEL_NAME,
                  "numerics": "promote per 128-K block" if cfg.promote else "ceiling twin: scales ignored (wrong numbers)"},
    )


# --------------------------------------------------------------------------------------------
# Static facts without a GPU: compile for sm_90a here and read what the speed depends on.


def _signature(cfg: Config) -> tuple[dict, dict, dict]:
    lay = _layouts(cfg)
    kern = _kernel()
    types = {
        "a_desc": f"tensordesc<fp8e4nv[{cfg.BM}, {BK}],{lay['a']!r}>",
        "b_desc": f"tensordesc<fp8e4nv[{cfg.BN}, {BK}],{lay['b']!r}>",
        "sa_desc": f"tensordesc<fp32[1, {cfg.BM}],{lay['sa']!r}>",
        "c_desc": f"tensordesc<bf16[{WG_M}, {cfg.SUB_N}],{lay['c']!r}>",
        "sb_ptr": "*fp32", "sa_ptr": "*fp32", "SA_PITCH": "i32", "M": "i32", "N": "i32", "L": "i32", "GROUP_M": "i32",
    }
    constexprs = {"BN": cfg.BN, "CONSUMERS": cfg.consumers, "STAGES": cfg.stages, "ASYNC": cfg.async_depth,
                  "PROMOTE": cfg.promote, "CONSUMER_REGS": cfg.regs, "SA_TMA": cfg.a_scales == "tma"}
    sig = {n: ("constexpr" if n in constexprs else types[n]) for n in kern.arg_names}
    names = list(kern.arg_names)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("sb_ptr", "sa_ptr", "N")}
    return sig, constexprs, attrs


def _overlap_facts(ptx: str) -> dict:
    """Program-order structure of the PTX: fp32 FMAs issued while a wgmma group is pending (the
    promote overlapped with the tensor cores) and the wgmma waits by outstanding count."""
    import re

    pending = 0
    fma_pending = 0
    for line in ptx.splitlines():
        if "wgmma.commit_group" in line:
            pending += 1
        else:
            m = re.search(r"wgmma\.wait_group\.sync\.aligned\s+(\d+);", line)
            if m:
                pending = min(pending, int(m.group(1)))
            elif pending and re.search(r"\bfma\.rn\.f32\b", line):
                fma_pending += 1
    return {
        "fma_while_wgmma_pending": fma_pending,
        "wgmma_wait": {n: len(re.findall(rf"wgmma\.wait_group\.sync\.aligned\s+{n};", ptx)) for n in range(3)},
    }


def ring_index_facts(ttgir: str) -> dict:
    """Barrier operations inside a loop whose barrier index does not change with the loop.

    In this kernel every mbarrier wait, expect and arrive inside a loop walks the ring, so its
    index must be the loop's own (an iteration argument or a value computed in the body). One
    computed outside the loop hits the same barrier on every iteration: the no-promote twin with
    async depth 1 did exactly that (see ``_prev_slot``) and hung on the H200. Read from the TTGIR,
    where loops are still ``scf.for`` regions and the printer keeps the source's variable names."""
    import re

    lines = ttgir.splitlines()
    loops = []  # (first line, last line, names the loop itself defines: induction variable, iter args)
    stack = []
    for i, ln in enumerate(lines):
        m = re.search(r"scf\.for\s+(%[\w.]+)\s*=.*?(?:iter_args\((.*?)\))?\s*->|scf\.for\s+(%[\w.]+)\s*=", ln)
        if m:
            ind = m.group(1) or m.group(3)
            args = re.findall(r"(%[\w.]+)\s*=", m.group(2) or "")
            stack.append((i, len(ln) - len(ln.lstrip()), {ind, *args}))
            continue
        if stack and ln.strip().startswith("}") and len(ln) - len(ln.lstrip()) == stack[-1][1]:
            start, _, own = stack.pop()
            loops.append((start, i, own))
    checked, stale = 0, []
    for i, ln in enumerate(lines):
        m = re.search(r"ttng\.(arrive_barrier|wait_barrier|barrier_expect)\s+(%[\w.]+)", ln)
        if not m:
            continue
        inner = [lp for lp in loops if lp[0] < i < lp[1]]
        if not inner:
            continue
        start, end, own = max(inner, key=lambda lp: lp[0])
        idx = None
        for j in range(i - 1, -1, -1):  # the nearest definition above (names repeat across partitions)
            d = re.match(rf"\s*{re.escape(m.group(2))}\s*=\s*ttg\.memdesc_index\s+%[\w.]+\[(%[\w.#]+)\]", lines[j])
            if d:
                idx = d.group(1)
                break
        if idx is None:
            continue
        checked += 1
        base = idx.split("#")[0]  # %r#1: result 1 of the op that defines %r:n
        defined_in_loop = idx in own or any(re.match(rf"\s*{re.escape(base)}(?::\d+)?\s*=", lines[j])
                                            for j in range(start + 1, end))
        if not defined_in_loop:
            stale.append(f"line {i + 1}: {m.group(1)} on a barrier indexed by {idx}, defined outside its loop")
    return {"loop_barrier_ops": checked, "loop_invariant_barrier_ops": stale}


def sass_overlap(sass: str) -> dict:
    """The same question asked of ptxas's final schedule: FFMAs issued while a QGMMA group is
    pending (a group closes at the QGMMA carrying ``gsb0``; ``WARPGROUP.DEPBAR.LE gsb0, N`` waits
    until N remain). If ptxas had serialised the wgmma it would wait to 0 after every group and
    this count would be 0."""
    import re

    pending = 0
    ffma = 0
    waits: dict[int, int] = {}
    for line in sass.splitlines():
        if "QGMMA" in line and "gsb0" in line:
            pending += 1
            continue
        m = re.search(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)", line)
        if m:
            n = int(m.group(1), 16)
            waits[n] = waits.get(n, 0) + 1
            pending = min(pending, n)
        elif pending and re.search(r"\bFFMA\b", line):
            ffma += 1
    return {"sass_ffma_while_qgmma_pending": ffma, "sass_depbar": {str(k): v for k, v in sorted(waits.items())}}


def compile_only(shape: dict | None = None, config: dict | None = None, arch: str = "sm_90a") -> dict:
    """Compile one variant for sm_90a on this machine (no GPU needed) and return its static facts:
    registers (per partition where ptxas reports them), spills, shared memory, wgmma counts, the
    setmaxnreg values in PTX and SASS, ptxas's wgmma-serialisation verdict, and the overlap count."""
    import re
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
    sig, constexprs, attrs = _signature(cfg)
    t0 = time.perf_counter()
    src = GluonASTSource(fn=_kernel(), signature=sig, constexprs=constexprs, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", cap, 32),
                        options={"num_warps": 4, "maxnreg": cfg.maxnreg})
    ptx = ck.asm["ptx"]
    facts: dict[str, Any] = {
        **ring_index_facts(ck.asm["ttgir"]),
        "config": cfg.as_dict(),
        "BM": cfg.BM,
        "compile_s": round(time.perf_counter() - t0, 2),  # near 0 when Triton's on-disk cache served it
        "shared_bytes": int(ck.metadata.shared),
        "shared_estimate": cfg.smem_bytes(),
        "fits_smem": int(ck.metadata.shared) <= SM90_SMEM_LIMIT,
        "num_warps_total": int(getattr(ck.metadata, "num_warps", 0)),
        "maxnreg": cfg.maxnreg,
        "requested_regs": {"consumer": cfg.regs, "producer_left_estimate": cfg.producer_regs},
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "wgmma_commit": len(re.findall(r"wgmma\.commit_group", ptx)),
        "setmaxnreg_ptx": sorted(set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+\d+", ptx))),
        "fma_f32": len(re.findall(r"\bfma\.rn\.f32\b", ptx)),
        "mbarrier_try_wait": len(re.findall(r"mbarrier\.try_wait", ptx)),
        "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global", ptx)),
        "tma_stores": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
        "bar_sync": len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b|\bbar\.arrive\b|\bbarrier\.arrive\b", ptx)),
    }
    facts.update(_overlap_facts(ptx))
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
            facts.update(sass_overlap(sass))
            facts["sass_utmaldg"] = len(re.findall(r"\bUTMALDG\b", sass))
            facts["sass_utmastg"] = len(re.findall(r"\bUTMASTG\b", sass))
        except (OSError, subprocess.SubprocessError) as exc:  # tools missing: report what we have
            facts["tool_error"] = f"{type(exc).__name__}: {exc}"
    # the per-kernel facts every sm_90 port's compile_only gives (kernels/protocol.py)
    facts["arch"] = arch
    facts["kernels"] = [{"name": KERNEL_NAME, "mma_sync": len(re.findall(r"\bmma\.sync", ptx)),
                         **{k: facts.get(k) for k in ("shared_bytes", "fits_smem", "wgmma", "regs", "spill_store_bytes",
                                                      "spill_load_bytes", "stack_bytes", "ptxas_wgmma_serialized",
                                                      "compile_s")}}]
    return facts
