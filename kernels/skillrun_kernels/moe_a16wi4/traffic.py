"""Bytes an a16wi4 MoE layer call moves, per variant and shape (issue 41; _moe/traffic.py says how).

``bytes_moved(shape, config)`` follows the launches of ``triton_sm90_decode`` for a config (its
knobs; None or the incumbent ``triton_sm90`` recipes = the five-launch layout: routing, gate/up,
down with fp32 atomics, cast). Its ``hbm`` part equals ``problem.min_bytes`` for every variant:
the levers change how those bytes are issued, and what else a call touches (``reread``, ``l2``).

    from skillrun_kernels.moe_a16wi4 import traffic
    t = traffic.bytes_moved({"tokens": 16, "model_dim": 7168, "inter_dim": 2048, "experts": 64,
                             "topk": 8, "group_size": 128}, None)
    t.hbm_bytes, t.as_dict()["roof_us"]          # 1.28e9 bytes, ~302 us at 4.25 TB/s
    traffic.percent_of_roof(701.0, shape)         # the measured 701 us -> ~43 %
"""
from __future__ import annotations

from skillrun_kernels._moe import traffic as common
from skillrun_kernels._moe.traffic import Traffic

from . import problem

# the incumbent's layout when no decode config is given: two routing launches, atomic down, cast
_INCUMBENT = {"route": "two", "down": "atomic", "fuse_down": False, "split_k1": 1, "BLOCK_N1": 64}


def bytes_moved(shape: dict, config: dict | None = None, active_experts: float | None = None) -> Traffic:
    """The call's bytes by part. ``active_experts``: the touched experts of one routing (exact), else
    the expectation under uniform routing."""
    t, d, i, e, k, g = problem.dims(shape)
    cfg = {**_INCUMBENT, **(config or {})}
    act = problem.expected_active_experts(shape) if active_experts is None else float(active_experts)
    pairs = t * k
    w1 = 2 * i * d / 2
    w2 = d * i / 2
    s1 = 2 * 2 * i * d / g
    s2 = 2 * d * i / g
    tr = Traffic()
    tr.hbm = {"w1_int4": act * w1, "w1_scales": act * s1, "w2_int4": act * w2, "w2_scales": act * s2,
              "x_bf16": 2.0 * t * d, "out_bf16": 2.0 * t * d, "routing": 8.0 * pairs}
    # h in bf16; fuse_down splits the down GEMM over inter_dim by BLOCK_N1 tiles
    return common.decode_layout(tr, cfg, t, d, i, pairs, act, w2 + s2, ("h_bf16_write_read", 2 * 2.0 * pairs * i),
                                int(cfg["BLOCK_N1"]))


# roof_time_us(shape, config=None, copy_tbps, active_experts): the floor of a call, its compulsory DRAM
# bytes at the copy roof (us); percent_of_roof(time_us, shape, ...): % of the copy roof a measured call
# time reaches (issue 41's target: >= 60 at 1 and 16 tokens)
roof_time_us, percent_of_roof = common.roof_functions(bytes_moved)
