"""Pieces shared by the MoE decode variants of issue 41 (moe_a16wi4.triton_sm90_decode,
fp8_blockscale_moe.triton_sm90_decode): the one-launch routing, the work-item decomposition of a
persistent or one-item-per-program grid, the swap-AB tile layout of accumulators and stores, the
top-k sum into the fp32 accumulator, the grid sizing, the launch layout the shared knobs
(``route``, ``split_k1``, ``fuse_down``, ``down``, ``persistent``, ``tile_order``) make, and the
compile-only facts call. What differs between the families (the weights' dequantization, h's dtype
and quantization) stays in their modules.

The routing layout is the one ``moe_a16wi4.triton_sm90.align_by_expert`` produces (``Routing``): the
(token, slot) pairs sorted by expert in BLOCK_M-padded blocks, one expert per block, valid-row ends
and the total row count on the device, bounded on the host without a sync. That module keeps its own
two launches (its H200 artifacts name its bytes); ``route_one`` is the same layout in one program.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from skillrun_kernels.moe_a16wi4.triton_sm90 import Routing, align_by_expert

ROUTE_ONE_MAX_PAIRS = 256
H200_SMS = 132
TILE_ORDERS = ("expert_major", "n_major")
ROUTES = ("two", "one")
DOWNS = ("atomic", "token")
# One lever at a time of the launch-layout knobs both families have, as changes to a family's BASE
# (ablation candidates named the same in both; layout_levers).
LAYOUT_LEVERS = {
    "split_k4": {"split_k1": 4},
    "persistent": {"persistent": True},
    "n_major": {"tile_order": "n_major"},
    "route_one": {"route": "one"},
    "down_token": {"down": "token", "BLOCK_N2": 32},
    "fuse_down": {"fuse_down": True, "BLOCK_N2": 64},
}
# the routing arguments of every expert-block kernel, as compile_only types them
ROUTING_TYPES = {"sorted_ptr": "*i32", "block_expert_ptr": "*i32", "valid_end_ptr": "*i32", "num_rows_ptr": "*i32"}


@triton.jit(do_not_specialize=["P"])
def _moe_route_one_kernel(ids_ptr, sorted_ptr, block_expert_ptr, meta_ptr, P,
                              E: tl.constexpr, NBINS: tl.constexpr, BLOCK_M: tl.constexpr, PB: tl.constexpr):
    """align + scatter of moe_a16wi4.triton_sm90 in one program (P <= PB): the same Routing layout."""
    offs = tl.arange(0, PB)
    ok = offs < P
    ids = tl.load(ids_ptr + offs, mask=ok, other=E)  # bin E collects the tail
    counts = tl.histogram(ids, NBINS)
    bins = tl.arange(0, NBINS)
    real = bins < E
    counts = tl.where(real, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    tl.store(meta_ptr + bins, starts, mask=real)
    tl.store(meta_ptr + E + bins, starts + counts, mask=real)
    tl.store(meta_ptr + 3 * E, tl.sum(padded, 0))
    tl.debug_barrier()  # the starts are read back below by other threads of this program
    # rank of each pair among the earlier pairs of its expert: a stable order, no atomics
    same = (ids[:, None] == ids[None, :]) & (offs[None, :] < offs[:, None])
    rank = tl.sum(same.to(tl.int32), axis=1)
    dest = tl.load(meta_ptr + ids, mask=ok, other=0) + rank
    tl.store(sorted_ptr + dest, offs, mask=ok)
    tl.store(block_expert_ptr + dest // BLOCK_M, ids, mask=ok)


def route_one(topk_ids: torch.Tensor, experts: int, block_m: int) -> Routing:
    """:func:`moe_a16wi4.triton_sm90.align_by_expert` in one launch (tokens x topk <= ROUTE_ONE_MAX_PAIRS)."""
    ids = topk_ids.reshape(-1)
    if ids.dtype != torch.int32:
        ids = ids.to(torch.int32)
    pairs = ids.numel()
    if pairs > ROUTE_ONE_MAX_PAIRS:
        raise ValueError(f"route 'one' serves at most {ROUTE_ONE_MAX_PAIRS} (token, slot) pairs, got {pairs}")
    dev = ids.device
    max_rows = pairs + min(experts, pairs) * (block_m - 1)
    max_blocks = triton.cdiv(max_rows, block_m)
    sorted_ids = torch.empty(max_blocks * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    meta = torch.empty(3 * experts + 1, dtype=torch.int32, device=dev)
    _moe_route_one_kernel[(1,)](ids, sorted_ids, block_expert, meta, pairs, E=experts,
                                NBINS=triton.next_power_of_2(experts + 1), BLOCK_M=block_m,
                                PB=max(16, triton.next_power_of_2(pairs)), num_warps=8)
    return Routing(sorted_ids, block_expert, meta[experts:2 * experts], meta[3 * experts:], max_blocks)


@triton.jit
def item_coords(item, n_tiles, blocks, SPLIT_K: tl.constexpr, N_MAJOR: tl.constexpr):
    """(expert block, N tile, K split) of a linear work item."""
    s = item % SPLIT_K
    r = item // SPLIT_K
    if N_MAJOR:
        return r % blocks, r // blocks, s
    else:
        return r // n_tiles, r % n_tiles, s


@triton.jit
def block_rows(m, sorted_ptr, block_expert_ptr, valid_end_ptr, BLOCK_M: tl.constexpr):
    """(expert, row mask, pair ids) of expert block ``m``; rows past the expert's valid end masked."""
    e = tl.load(block_expert_ptr + m).to(tl.int64)
    rows = m * BLOCK_M + tl.arange(0, BLOCK_M)
    rvalid = rows < tl.load(valid_end_ptr + e)
    pair = tl.load(sorted_ptr + rows, mask=rvalid, other=0).to(tl.int64)
    return e, rvalid, pair


@triton.jit
def expert_items(num_rows_ptr, N, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr):
    """(expert blocks, N tiles, work items) of a launch over the routing's live expert blocks x the
    N / BLOCK_N tiles x SPLIT_K K slices."""
    blocks = tl.load(num_rows_ptr) // BLOCK_M
    n_tiles = N // BLOCK_N
    return blocks, n_tiles, blocks * n_tiles * SPLIT_K


@triton.jit
def item_range(n_items, PERSISTENT: tl.constexpr):
    """(first, last, step) of the program's loop over work items. Persistent: its items in turn; else
    one item (its program id), a loop of one iteration the compiler removes, so the kernel is the
    straight-line one-tile kernel."""
    if PERSISTENT:
        return tl.program_id(0), n_items, tl.num_programs(0)
    else:
        return 0, 1, 1


@triton.jit
def item_rows(item, n_tiles, blocks, sorted_ptr, block_expert_ptr, valid_end_ptr, BLOCK_M: tl.constexpr,
              SPLIT_K: tl.constexpr, N_MAJOR: tl.constexpr):
    """(expert, row mask, pair ids, N tile, K split) of a live work item (item_coords, then block_rows)."""
    m, n, s = item_coords(item, n_tiles, blocks, SPLIT_K, N_MAJOR)
    e, rvalid, pair = block_rows(m, sorted_ptr, block_expert_ptr, valid_end_ptr, BLOCK_M)
    return e, rvalid, pair, n, s


@triton.jit
def acc_tile(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP: tl.constexpr):
    """A zero fp32 accumulator of (expert block, N tile): (BLOCK_N, BLOCK_M) under swap-AB (the
    weight rows on the MMA's M side, the token rows on its N side), else (BLOCK_M, BLOCK_N)."""
    if SWAP:
        return tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        return tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def silu_mul(g, u):
    """SiLU(gate) x up, in fp32."""
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def tile_index(offs_n, pair, rvalid, SWAP: tl.constexpr):
    """(columns, pair rows, row mask) broadcast to an accumulator tile's layout (acc_tile)."""
    if SWAP:
        return offs_n[:, None], pair[None, :], rvalid[None, :]
    else:
        return offs_n[None, :], pair[:, None], rvalid[:, None]


@triton.jit
def store_partials(part_ptr, s, stride_ps, prow, cols, pmask, I, acc_g, acc_u):
    """Split-K: this K slice's gate and up partial sums as plain stores into the (splits, pairs, 2I)
    fp32 workspace, summed in a fixed order by the family's reduce kernel (no atomics, no zeroing)."""
    base = part_ptr + s * stride_ps + prow * (2 * I) + cols
    tl.store(base, acc_g, mask=pmask)
    tl.store(base + I, acc_u, mask=pmask)


@triton.jit
def add_rows(acc_ptr, stride, tok, offs_n, y, wt, rvalid, SWAP: tl.constexpr):
    """acc[token, offs_n] += y x the pair's top-k weight, atomically (relaxed) into the fp32 top-k
    accumulator; y is laid out as acc_tile (BLOCK_N, BLOCK_M) under swap-AB."""
    if SWAP:
        tl.atomic_add(acc_ptr + tok[None, :] * stride + offs_n[:, None], y * wt[None, :],
                      mask=rvalid[None, :], sem="relaxed")
    else:
        tl.atomic_add(acc_ptr + tok[:, None] * stride + offs_n[None, :], y * wt[:, None],
                      mask=rvalid[:, None], sem="relaxed")


@triton.jit
def zero_fill(dst_ptr, n, BLOCK: tl.constexpr):
    """Zero this program's BLOCK of an fp32 buffer of n elements (before a launch that adds into it)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.zeros((BLOCK,), dtype=tl.float32), mask=offs < n)


@triton.jit
def cast_bf16(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    """This program's BLOCK of the fp32 accumulator written out as bf16."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=ok).to(tl.bfloat16), mask=ok)


@triton.jit
def zero_share(zero_ptr, zero_numel, zero_per_prog):
    """Zero this program's share of the fp32 output accumulator that a later launch adds into."""
    zoffs = tl.arange(0, 1024)
    for z in range(0, zero_per_prog, 1024):
        idx = tl.program_id(0).to(tl.int64) * zero_per_prog + z + zoffs
        tl.store(zero_ptr + idx, tl.zeros((1024,), dtype=tl.float32), mask=(z + zoffs < zero_per_prog) & (idx < zero_numel))


def device_sms(device) -> int:
    """The device's SM count (the H200's 132 off-GPU, e.g. in the interpreter)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return H200_SMS


def grid_size(items_bound: int, cfg: dict, num_sms: int) -> int:
    """Programs to launch: every item bound (one item each), or SMs x ctas_per_sm when persistent."""
    return max(1, min(items_bound, num_sms * cfg["ctas_per_sm"])) if cfg["persistent"] else max(1, items_bound)


def split_k_steps(model_dim: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(BLOCK_K steps per split, splits launched): whole steps, no empty split."""
    steps = model_dim // block_k
    per = triton.cdiv(steps, min(split_k, steps))
    return per, triton.cdiv(steps, per)


# --------------------------------------------------------------------------------------------- host side


def layout_levers(base: dict) -> dict:
    """{name: base with that one LAYOUT_LEVERS change}, in LAYOUT_LEVERS' order."""
    return {name: {**base, **knobs} for name, knobs in LAYOUT_LEVERS.items()}


def choice_problems(cfg: dict, *keys: str) -> list[str]:
    """What is wrong with the named choice knobs of ``cfg`` (tile_order, route, down), each with its choices."""
    choices = {"tile_order": TILE_ORDERS, "route": ROUTES, "down": DOWNS}
    return [f"{k} must be one of {choices[k]}, got {cfg[k]!r}" for k in keys if cfg[k] not in choices[k]]


def one_launch_routing(cfg: dict, pairs: int) -> bool:
    """route 'one' routes in one launch where it can (tokens x topk <= ROUTE_ONE_MAX_PAIRS), else in two."""
    return cfg["route"] == "one" and pairs <= ROUTE_ONE_MAX_PAIRS


def launches(cfg: dict, pairs: int = 1) -> int:
    """Kernel launches per layer call of ``pairs`` (token, slot) pairs."""
    n = 1 if one_launch_routing(cfg, pairs) else 2
    n += 1  # gate/up (or fused)
    if cfg["split_k1"] > 1:
        n += 1  # the split-K reduce
    n += 1  # down, or the accumulator's zeroing before the fused launch (its programs add from their first tile on)
    if cfg["down"] == "atomic":
        n += 1  # fp32 -> bf16 cast
    return n


def route(topk_ids: torch.Tensor, experts: int, block_m: int, cfg: dict) -> Routing:
    """The routing of ``cfg``: one launch (route_one) where one_launch_routing allows, else the
    incumbent's two (moe_a16wi4.triton_sm90.align_by_expert)."""
    if one_launch_routing(cfg, topk_ids.numel()):
        return route_one(topk_ids, experts, block_m)
    return align_by_expert(topk_ids, experts, block_m)


def grid_constexprs(cfg: dict) -> dict:
    """The grid knobs as the kernels' constexprs."""
    return {"PERSISTENT": cfg["persistent"], "N_MAJOR": cfg["tile_order"] == "n_major"}


def fp32_buffer(shape: tuple, used: bool, device) -> torch.Tensor:
    """An uninitialised fp32 buffer of ``shape``, or a one-element stand-in where the launch does not use it."""
    return torch.empty(shape if used else (1,), dtype=torch.float32, device=device)


def launch_zero(kernel, acc: torch.Tensor) -> None:
    """``kernel`` (a zero_fill kernel) over all of ``acc``."""
    kernel[(triton.cdiv(acc.numel(), 2048),)](acc, acc.numel(), BLOCK=2048, num_warps=4)


def launch_cast(kernel, acc: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``kernel`` (a cast_bf16 kernel): the fp32 accumulator into ``out``."""
    n = acc.numel()
    kernel[(triton.cdiv(n, 2048),)](acc, out, n, BLOCK=2048, num_warps=4)
    return out


def describe(cfg: dict, shape: dict, traffic) -> dict:
    """A decode builder's ``describe``: its config, launch count and byte model (nothing tuned)."""
    return {"backend": "triton", "config": cfg, "tuned": False,
            "launches": launches(cfg, int(shape["tokens"]) * int(shape["topk"])),
            "bytes_model": traffic.bytes_moved(shape, cfg).as_dict()}


def kernel_facts(fn, types: dict, values: dict, constexprs: dict, num_warps: int, num_stages: int,
                 weights_per_iteration: int, arch: str) -> dict:
    """Compile-only facts of one kernel with its hot loop (_triton.sass); pointer arguments 16-aligned."""
    from skillrun_kernels._triton.sass import compile_facts_with_loop

    return compile_facts_with_loop(fn, weights_per_iteration=weights_per_iteration, types=types, constexprs=constexprs,
                                   divisible=[a for a, ty in types.items() if ty[0] == "*"], values=values,
                                   num_warps=num_warps, num_stages=num_stages, arch=arch)
