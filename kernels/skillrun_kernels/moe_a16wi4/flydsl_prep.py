"""Host-side preparation for the FlyDSL a16wi4 MoE port (torch; runs on the device's tensors).

* :func:`prepare_weights` (once, untimed): int4 codes -> packed (low nibble = even k) -> kpack-16
  16x16 preshuffle per expert; bf16 group scales -> f32 group-major ``[E, G, N]``.
* :func:`route` (every call, device ops only, no host sync): sort (token, slot) pairs by expert,
  pad each expert's run to ``tile_m`` rows, one expert id per row block (``-1`` past the end).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import layout as L


def prepare_weights(inputs: dict) -> dict[str, Any]:
    w1, w2 = inputs["w1_q"], inputs["w2_q"]
    E, two_i, D = w1.shape
    I = w2.shape[2]
    if two_i != 2 * I or w2.shape[1] != D:
        raise ValueError(f"w1_q {tuple(w1.shape)} and w2_q {tuple(w2.shape)} disagree on model_dim/inter_dim")
    g1 = D // inputs["w1_scale"].shape[-1]
    g2 = I // inputs["w2_scale"].shape[-1]
    if g1 != g2:
        raise ValueError(f"w1 and w2 use different group sizes ({g1} vs {g2})")
    return {
        "w1": L.preshuffle_experts(L.pack_int4(w1)),
        "w2": L.preshuffle_experts(L.pack_int4(w2)),
        "s1": L.scales_group_major(inputs["w1_scale"]),
        "s2": L.scales_group_major(inputs["w2_scale"]),
        "E": E, "D": D, "I": I, "group_size": g1,
    }


@dataclass
class Routing:
    sorted_ids: Any  # int32 [blocks * tile_m]: pair ids, sentinel for padding
    block_expert: Any  # int32 [blocks]: expert per row block, -1 past the end
    weights: Any  # f32 [tokens * topk]: routing weight per pair id
    blocks: int  # the static bound the grids are sized with


def route(topk_ids, topk_weights, experts: int, tile_m: int) -> Routing:
    import torch

    T, topk = topk_ids.shape
    dev = topk_ids.device
    pairs = T * topk
    nb = L.blocks_bound(T, topk, experts, tile_m)
    flat = topk_ids.reshape(-1).long()
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + tile_m - 1) // tile_m * tile_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    first_of_expert = torch.cumsum(counts, 0) - counts
    rank = torch.arange(pairs, device=dev) - first_of_expert[flat[order]]
    sorted_ids = torch.full((nb * tile_m,), L.sentinel(T, topk), dtype=torch.int32, device=dev)
    sorted_ids[starts[flat[order]] + rank] = order.to(torch.int32)
    block_rows = torch.arange(nb, device=dev) * tile_m
    owner = torch.searchsorted(ends, block_rows, right=True)
    block_expert = torch.where(block_rows < ends[-1], owner, torch.full_like(owner, -1)).to(torch.int32)
    return Routing(sorted_ids, block_expert, topk_weights.reshape(-1).float().contiguous(), nb)
