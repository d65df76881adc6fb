"""Small proxy shapes for numerics on a CPU (Triton interpreter or torch).

The interpreter runs every program instance in Python, so a production GEMM shape would take
hours. We shrink each dimension to a cap while keeping the power-of-two alignment the kernel may
need (K stays a multiple of 128 for 128-wide scale blocks, N a multiple of the tile, …).

The runner alone chooses the proxy, in the parent process, from the card's planned shape and the
runner's own caps (``ExecOptions.proxy_caps``): no module a card names is consulted or even imported
for it. A kernel module that could pick its proxy (an earlier ``cpu_proxy_shape`` hook) could pick a
shape where it happens to be right, or one so small that it proves nothing; every candidate and the
session then run exactly this shape, and the artifact's ``proxy_shape`` records it.
"""
from __future__ import annotations


# Per-dimension caps; dimensions not listed keep their value (group_size, topk: structural).
DEFAULT_CAPS: dict[str, int] = {
    "M": 256, "N": 256, "K": 256, "batch": 2, "tokens": 64,
    "model_dim": 256, "inter_dim": 256, "experts": 8,
}
MAX_ALIGN = 128


def _alignment(v: int) -> int:
    """The largest power of two dividing v, at most MAX_ALIGN."""
    a = 1
    while v % (a * 2) == 0 and a * 2 <= MAX_ALIGN:
        a *= 2
    return a


def generic_proxy(shape: dict[str, int], caps: dict[str, int] | None = None) -> dict[str, int]:
    caps = {**DEFAULT_CAPS, **(caps or {})}
    out: dict[str, int] = {}
    for k, v in shape.items():
        cap = caps.get(k)
        if cap is None or v <= cap:
            out[k] = v
            continue
        a = _alignment(v)
        out[k] = max(a, (cap // a) * a)
    if "experts" in out and "topk" in out and out["experts"] < out["topk"]:
        out["experts"] = min(shape["experts"], out["topk"])
    return out


def proxy_shape(shape: dict[str, int], caps: dict[str, int] | None = None) -> tuple[dict[str, int], str]:
    """(proxy shape, how it was chosen): the generic rule; never larger than ``shape`` in any dimension."""
    out = generic_proxy(shape, caps)
    assert all(1 <= out[k] <= v for k, v in shape.items() if v >= 1), (shape, out)
    rule = ", ".join(f"{k}<={v}" for k, v in {**DEFAULT_CAPS, **(caps or {})}.items() if k in shape)
    return out, (f"the runner (generic rule: each dimension capped ({rule}) keeping its power-of-two alignment up "
                 f"to {MAX_ALIGN}; kernel and problem modules have no say)")
