"""Small proxy shapes for numerics on a CPU (Triton interpreter or torch).

The interpreter runs every program instance in Python, so a production GEMM shape would take
hours. We shrink each dimension to a cap while keeping the power-of-two alignment the kernel may
need (K stays a multiple of 128 for 128-wide scale blocks, N a multiple of the tile, …). Kernel or
problem modules that know better can say so: ``cpu_proxy_shape(shape, config)`` on the kernel
module wins over ``proxy_shape(shape)`` on the problem module, which wins over this generic rule.
"""
from __future__ import annotations

from typing import Any

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


def proxy_shape(shape: dict[str, int], config: dict[str, Any], kernel_mod: Any = None, problem_mod: Any = None,
                caps: dict[str, int] | None = None) -> tuple[dict[str, int], str]:
    """(proxy shape, how it was chosen)."""
    hook = getattr(kernel_mod, "cpu_proxy_shape", None) if kernel_mod is not None else None
    if callable(hook):
        return {k: int(v) for k, v in hook(dict(shape), dict(config)).items()}, "kernel module cpu_proxy_shape()"
    hook = getattr(problem_mod, "proxy_shape", None) if problem_mod is not None else None
    if callable(hook):
        return {k: int(v) for k, v in hook(dict(shape)).items()}, "problem module proxy_shape()"
    return generic_proxy(shape, caps), f"generic: each dimension capped ({', '.join(f'{k}<={v}' for k, v in {**DEFAULT_CAPS, **(caps or {})}.items() if k in shape)}) keeping its power-of-two alignment up to {MAX_ALIGN}"
