"""Byte-traffic models of a MoE layer call, shared by the MoE families (issue 41).

A decode MoE layer is memory-bound: its floor is the bytes it must move divided by the memory
bandwidth. A family's ``traffic`` module lists, per variant (config) and shape, the bytes each part
of a call moves; this module holds what they share: the expected number of touched experts, the
time those bytes take at the copy roof, and the percent of that roof a measured time reaches.

Three kinds of bytes, kept apart so a reader can see which the time must pay:
- ``hbm``: compulsory DRAM traffic: each touched expert's weights and scales once, the layer's
  input once, its output once, the routing once. This is the problem's ``min_bytes``; the copy
  roof time of these bytes is the floor no kernel beats.
- ``reread``: weight bytes a variant reads from DRAM more than once by its design (e.g. a
  token-major down projection reads an expert's W2 once per token routed to it). Upper bound: L2
  may serve some of them.
- ``l2``: intermediates a decode call writes and reads back (h, split-K partials, the fp32 top-k
  accumulator, its zeroing and the atomics' read-modify-write): at decode they fit in the H200's
  60 MB L2 and cost L2 bandwidth and latency, not DRAM bytes. Listed, not added to the roof.

The copy roof: the H200's measured device-to-device copy bandwidth (bytes read plus bytes written
over time), 4.2-4.3 TB/s in the sessions of h200-measured.md (benchmarks/sm90_timing.py's
copy_bandwidth_tbps), against 4.8 TB/s on the datasheet. A GPU run reports % of the roof measured
in the same call; ``H200_COPY_TBPS`` is only the default for planning.
"""
from __future__ import annotations

from dataclasses import dataclass, field

H200_COPY_TBPS = 4.25  # measured copy roof, 4.2-4.3 TB/s (h200-measured.md, commit b3bfb7f); a default for plans
H200_HBM_TBPS = 4.8  # datasheet


def expected_active_experts(tokens: int, experts: int, topk: int) -> float:
    """Experts touched by ``tokens`` tokens under uniform top-k routing: E (1 - (1 - k/E)^T)."""
    return experts * (1.0 - (1.0 - topk / experts) ** tokens)


@dataclass
class Traffic:
    """Bytes of one layer call by part (``parts``), grouped into hbm / reread / l2 (module docstring)."""

    hbm: dict[str, float] = field(default_factory=dict)
    reread: dict[str, float] = field(default_factory=dict)
    l2: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)  # launches, atomic adds, programs ... (not bytes)

    @property
    def hbm_bytes(self) -> float:
        return float(sum(self.hbm.values()))

    @property
    def reread_bytes(self) -> float:
        return float(sum(self.reread.values()))

    @property
    def l2_bytes(self) -> float:
        return float(sum(self.l2.values()))

    def as_dict(self, copy_tbps: float = H200_COPY_TBPS) -> dict:
        """JSON-ready: every part, the totals and the copy-roof times (us) of hbm and hbm + reread."""
        return {
            "hbm": dict(self.hbm), "reread": dict(self.reread), "l2": dict(self.l2), "counts": dict(self.counts),
            "hbm_bytes": self.hbm_bytes, "reread_bytes": self.reread_bytes, "l2_bytes": self.l2_bytes,
            "copy_tbps": copy_tbps,
            "roof_us": roof_us(self.hbm_bytes, copy_tbps),
            "model_us": roof_us(self.hbm_bytes + self.reread_bytes, copy_tbps),
        }


def decode_layout(tr: Traffic, cfg: dict, t: int, d: int, i: int, pairs: int, act: float, w2_bytes: float,
                  h_part: tuple[str, float], fused_tile: int) -> Traffic:
    """What a decode variant's launch layout adds to a family's compulsory ``tr.hbm`` bytes (the knobs
    the families' ``triton_sm90_decode`` share: ``down``, ``split_k1``, ``fuse_down``).

    ``w2_bytes``: one expert's W2 with its scales; ``h_part``: the name and the bytes of h written by
    stage 1 and read back by stage 2 (its dtype is the family's); ``fused_tile``: the N1 tile over
    which ``fuse_down`` splits the down GEMM (one atomic partial per tile).
    """
    atomic = cfg.get("down", "atomic") == "atomic"
    if cfg.get("down") == "token":
        # every (token, slot) pair reads its expert's W2 rows: pairs - active extra expert reads
        tr.reread = {"w2_per_token": max(0.0, pairs - act) * w2_bytes}
    splits = int(cfg.get("split_k1", 1))
    if cfg.get("fuse_down"):
        # h never leaves the program; the down GEMM is split over inter_dim by N1 tiles
        adds = pairs * d * (i / fused_tile)
    else:
        tr.l2[h_part[0]] = h_part[1]
        adds = pairs * d if atomic else 0.0
        if splits > 1:
            tr.l2["splitk_partials_write_read"] = 2 * 4.0 * splits * pairs * 2 * i
    if atomic:
        tr.l2["acc_fp32_zero"] = 4.0 * t * d
        tr.l2["acc_fp32_atomic_rmw"] = 8.0 * adds
        tr.l2["acc_fp32_cast_read"] = 4.0 * t * d
    tr.counts = {"active_experts": act, "pairs": pairs, "atomic_adds": adds}
    return tr


def roof_functions(bytes_moved):
    """``(roof_time_us, percent_of_roof)`` of a family whose ``bytes_moved(shape, config,
    active_experts)`` returns a call's :class:`Traffic`: both judge the call's ``hbm`` bytes."""

    def roof_time_us(shape: dict, config: dict | None = None, copy_tbps: float = H200_COPY_TBPS,
                     active_experts: float | None = None) -> float:
        """The floor of a call: its compulsory DRAM bytes at the copy roof (us)."""
        return roof_us(bytes_moved(shape, config, active_experts).hbm_bytes, copy_tbps)

    def percent_of_call_roof(time_us: float, shape: dict, config: dict | None = None,
                             copy_tbps: float = H200_COPY_TBPS, active_experts: float | None = None) -> float:
        """% of the copy roof a measured call time reaches."""
        return percent_of_roof(time_us, bytes_moved(shape, config, active_experts).hbm_bytes, copy_tbps)

    percent_of_call_roof.__name__ = percent_of_call_roof.__qualname__ = "percent_of_roof"
    return roof_time_us, percent_of_call_roof


def roof_us(nbytes: float, copy_tbps: float = H200_COPY_TBPS) -> float:
    """Microseconds ``nbytes`` take at ``copy_tbps`` TB/s (the copy roof)."""
    if copy_tbps <= 0:
        raise ValueError(f"copy bandwidth must be positive, got {copy_tbps}")
    return nbytes / (copy_tbps * 1e6)


def percent_of_roof(time_us: float, nbytes: float, copy_tbps: float = H200_COPY_TBPS) -> float:
    """The percent of the copy roof a call of ``time_us`` reached moving ``nbytes``
    (= achieved bytes/s over the copy bandwidth x 100; 100 means it ran at the roof)."""
    if time_us <= 0:
        raise ValueError(f"time must be positive, got {time_us}")
    return 100.0 * roof_us(nbytes, copy_tbps) / time_us
