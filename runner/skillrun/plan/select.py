"""Selection: the recipe for a shape, by shape class (never by layer name).

Recipes are ordered; the first whose ``gens`` admit the arch and whose ``when`` predicate holds
wins. A shape no recipe covers gets the card's default recipe with a visible ``untuned`` flag.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skillrun.errors import UsageError
from skillrun.kb import expr
from skillrun.kb.cards import Recipe, SkillCard
from skillrun.models import DEVICE_KEYS, SHAPE_KEYS


@dataclass
class Selection:
    recipe: Recipe
    untuned: bool
    reasons: list[str] = field(default_factory=list)  # why each earlier recipe did not apply


def predicate_env(shape: dict[str, int], device_facts: dict[str, Any]) -> dict[str, Any]:
    env: dict[str, Any] = {k: device_facts.get(k) for k in DEVICE_KEYS}
    # AMD CUs and NVIDIA SMs are the same role for a grid-fill predicate; expose both names.
    if env.get("cu_count") is None and env.get("sm_count") is not None:
        env["cu_count"] = env["sm_count"]
    if env.get("sm_count") is None and env.get("cu_count") is not None:
        env["sm_count"] = env["cu_count"]
    env.update({k: v for k, v in shape.items()})
    return env


def select_recipe(card: SkillCard, shape: dict[str, int], device_facts: dict[str, Any] | None = None, arch: str | None = None) -> Selection:
    env = predicate_env(shape, device_facts or {})
    reasons: list[str] = []
    for r in card.recipes:
        if arch and r.gens and arch not in r.gens and "*" not in r.gens:
            reasons.append(f"{r.name}: for {r.gens}, not {arch}")
            continue
        try:
            ok = bool(expr.evaluate(r.when, env))
        except expr.MissingName as exc:
            reasons.append(f"{r.name}: {exc}")
            continue
        except (expr.ExprError, ArithmeticError, TypeError) as exc:
            reasons.append(f"{r.name}: predicate failed to evaluate ({exc})")
            continue
        if ok:
            return Selection(recipe=r, untuned=False, reasons=reasons)
        reasons.append(f"{r.name}: `{r.when}` is false")
    return Selection(recipe=card.default_recipe, untuned=True, reasons=reasons)


def parse_shape(text: str, keys: tuple[str, ...] = ("M", "N", "K")) -> dict[str, int]:
    """``4096,2048,7168`` (in the problem's key order) or ``M=4096,N=2048,K=7168`` / ``tokens=16,…``."""
    text = text.strip()
    if not text:
        raise UsageError("empty shape", field="--shape", hint="use M,N,K or name=value pairs")
    parts = [p.strip() for p in text.replace("x", ",").replace("×", ",").split(",") if p.strip()] if "=" not in text else [p.strip() for p in text.split(",") if p.strip()]
    out: dict[str, int] = {}
    try:
        if all("=" in p for p in parts):
            for p in parts:
                k, v = p.split("=", 1)
                k = k.strip()
                if k not in SHAPE_KEYS and k.upper() in SHAPE_KEYS:
                    k = k.upper()
                if k not in SHAPE_KEYS:
                    raise UsageError(f"unknown dimension {k!r} in shape {text!r}", field="--shape", hint=f"known: {', '.join(SHAPE_KEYS)}")
                out[k] = int(v)
        else:
            if len(parts) != len(keys):
                raise UsageError(f"shape {text!r} has {len(parts)} numbers; this problem takes {len(keys)} ({','.join(keys)})", field="--shape")
            out = {k: int(v) for k, v in zip(keys, parts)}
    except ValueError:
        raise UsageError(f"shape {text!r} is not a list of integers", field="--shape", hint="use M,N,K or name=value pairs") from None
    return check_shape_values(out, text)


# No GEMM/MoE dimension reaches 2**31 (the same bound ingest applies to shapes read from traces):
# a larger one is a typo or an attack, and would be recorded as evidence for a shape no one ran.
MAX_SHAPE_DIM = (1 << 31) - 1


def check_shape_values(shape: dict, text: object = None) -> dict[str, int]:
    """``shape`` if every dimension is an integer in [1, 2**31) (group_size may be 0); else UsageError."""
    where = f" in shape {text!r}" if text is not None else ""
    for k, v in shape.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise UsageError(f"dimension {k}={v!r}{where} is not an integer", field="--shape")
        if v < 1 and k not in ("group_size",):
            raise UsageError(f"dimension {k}={v}{where} must be >= 1", field="--shape")
        if v > MAX_SHAPE_DIM:
            raise UsageError(f"dimension {k}={v}{where} is larger than any real problem (max {MAX_SHAPE_DIM})", field="--shape")
    return shape
