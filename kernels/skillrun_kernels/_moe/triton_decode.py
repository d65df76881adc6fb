"""Device-side pieces shared by the MoE decode variants of issue 41 (moe_a16wi4.triton_sm90_decode,
fp8_blockscale_moe.triton_sm90_decode): the one-launch routing, the work-item decomposition of a
persistent or one-item-per-program grid, and the grid sizing.

The routing layout is the one ``moe_a16wi4.triton_sm90.align_by_expert`` produces (``Routing``): the
(token, slot) pairs sorted by expert in BLOCK_M-padded blocks, one expert per block, valid-row ends
and the total row count on the device, bounded on the host without a sync. That module keeps its own
two launches (its H200 artifacts name its bytes); ``route_one`` is the same layout in one program.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from skillrun_kernels.moe_a16wi4.triton_sm90 import Routing

ROUTE_ONE_MAX_PAIRS = 256
H200_SMS = 132


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
