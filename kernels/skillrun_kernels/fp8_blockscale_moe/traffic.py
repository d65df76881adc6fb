"""Bytes an fp8 block-scale MoE layer call moves, per variant and shape (issue 41; _moe/traffic.py says how).

``bytes_moved(shape, config)`` follows the launches of ``triton_sm90_decode`` for a config (None = the
incumbent ``triton_sm90`` layout: two routing launches, gate/up with the 1x128 quantization of h, down
with fp32 atomics, cast). Its ``hbm`` part equals ``problem.min_bytes`` for every variant.

    from skillrun_kernels.fp8_blockscale_moe import traffic
    s = {"tokens": 1, "model_dim": 7168, "inter_dim": 2048, "experts": 256, "topk": 8}
    traffic.roof_time_us(s)            # ~83 us at 4.25 TB/s (352 MB)
    traffic.percent_of_roof(114.0, s)  # the measured 114 us -> ~73 %
"""
from __future__ import annotations

from skillrun_kernels._moe import traffic as common
from skillrun_kernels._moe.traffic import Traffic

from . import problem

BLOCK = 128
_INCUMBENT = {"route": "two", "down": "atomic", "fuse_down": False, "split_k1": 1}


def bytes_moved(shape: dict, config: dict | None = None, active_experts: float | None = None) -> Traffic:
    """The call's bytes by part. ``active_experts``: the touched experts of one routing (exact), else
    the expectation under uniform routing."""
    t, d, i, e, k = problem.dims(shape)
    cfg = {**_INCUMBENT, **(config or {})}
    act = problem.expected_active_experts(shape) if active_experts is None else float(active_experts)
    pairs = t * k
    w1, w2 = 2 * i * d, d * i
    s1, s2 = 4 * (2 * i // BLOCK) * (d // BLOCK), 4 * (d // BLOCK) * (i // BLOCK)
    tr = Traffic()
    tr.hbm = {"w1_fp8": act * w1, "w1_scales": act * s1, "w2_fp8": act * w2, "w2_scales": act * s2,
              "a_fp8": 1.0 * t * d, "a_scales": 4.0 * t * d / BLOCK, "out_bf16": 2.0 * t * d, "routing": 8.0 * pairs}
    # h in fp8 with its 1x128 scales; fuse_down's N1 tile is one 128-column quantization group
    return common.decode_layout(tr, cfg, t, d, i, pairs, act, w2 + s2,
                                ("h_fp8_write_read", 2 * (1.0 * pairs * i + 4.0 * pairs * i / BLOCK)), BLOCK)


# roof_time_us(shape, config=None, copy_tbps, active_experts): the floor of a call, its compulsory DRAM
# bytes at the copy roof (us); percent_of_roof(time_us, shape, ...): % of the copy roof a measured call
# time reaches (issue 41's target: >= 75 at decode)
roof_time_us, percent_of_roof = common.roof_functions(bytes_moved)
