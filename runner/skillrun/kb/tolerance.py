"""How loose a card's parity tolerance may be: a ceiling per problem family, checked by lint.

A card is untrusted input, and its ``tolerance`` is what the parity gate compares a port's output
against: ``rtol: 1e300`` or ``min_cosine: 0`` would let a kernel that writes zeros pass, and a
tolerance loosened by hand can turn a reference that fails the oracle into one that "passes" (the
fp8 MoE verdict went from skipped to validated that way). The bounds therefore do not come from the
card alone. Three levels, each checked by lint (a card lint refuses is never matched or run,
``SkillIndex.check_cards``):

* :data:`ENGINE_LIMITS`: no card of any family passes them (``rtol``/``atol``/``max_rel_fro`` ≤ 0.1,
  ``min_cosine`` ≥ 0.99); a family's ``problem`` module may only tighten them with a literal
  ``TOLERANCE_LIMITS`` (read with :mod:`ast`, never imported, like every other static check of lint):
  together, :func:`family_limits`, the most any reason can loosen a card of that family to;
* the family's **ceiling** (:func:`family_ceiling`): :data:`DEFAULT_CEILING`, the dense GEMM's
  tolerance (``rtol = atol = 1e-2``, ``max_rel_fro`` 1e-2, ``min_cosine`` 0.999: the engine's default
  judge of a low-precision GEMM against its fp32 oracle), unless the problem module declares its own
  literal ``TOLERANCE_CEILING`` (clamped to the family's limits);
* a card above its family's ceiling (but within the limits) needs its **measured reason** in the
  card: ``tolerance_reason: {why: "...", measured: [KB-relative paths of committed evidence]}``,
  every path an existing file. Without it, lint refuses the card.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

from skillrun.errors import SkillRunError
from skillrun.kb.refs import module_constant

# Upper bounds (rtol, atol, max_rel_fro) and a lower bound (min_cosine) for any family. Every
# family today is a low-precision GEMM checked against an fp32 oracle: its honest error is a few
# bf16/fp8 rounding steps (about 1e-2 relative), so ten times that still admits every real port
# and refuses an output that is merely the right order of magnitude.
ENGINE_LIMITS: dict[str, float] = {"rtol": 0.1, "atol": 0.1, "max_rel_fro": 0.1, "min_cosine": 0.99}
# The dense GEMM's tolerance: the ceiling of every family that declares none.
DEFAULT_CEILING: dict[str, float] = {"rtol": 0.01, "atol": 0.01, "max_rel_fro": 0.01, "min_cosine": 0.999}
_UPPER = ("rtol", "atol", "max_rel_fro")
_LOWER = ("min_cosine",)


def _tighten(base: dict[str, float], declared: Any, *, loosen: bool = False) -> dict[str, float]:
    """``base`` moved to the finite numbers of ``declared`` (only tighter, unless ``loosen``)."""
    out = dict(base)
    if not isinstance(declared, dict):
        return out
    for key, value in declared.items():
        if key not in out or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if loosen:
            out[key] = float(value)
        else:
            out[key] = min(out[key], float(value)) if key in _UPPER else max(out[key], float(value))
    return out


def family_limits(problem_module: str) -> dict[str, float]:
    """The most a card whose ``references.problem`` is ``problem_module`` may loosen to, with a reason."""
    return _tighten(ENGINE_LIMITS, module_constant(problem_module, "TOLERANCE_LIMITS"))


def family_ceiling(problem_module: str) -> dict[str, float]:
    """The family's ceiling: the dense GEMM's unless it declares ``TOLERANCE_CEILING``, never past its limits."""
    limits = family_limits(problem_module)
    ceiling = _tighten(DEFAULT_CEILING, module_constant(problem_module, "TOLERANCE_CEILING"), loosen=True)
    return _tighten(ceiling, limits)


def _looser(key: str, value: float, bound: float) -> bool:
    return value > bound if key in _UPPER else value < bound


def reason_problems(path: str, reason: Any, root: Optional[Path]) -> list[SkillRunError]:
    """What is missing from a card's ``tolerance_reason`` (a why and committed evidence that exists)."""
    field = "tolerance_reason"
    if not isinstance(reason, dict):
        return [SkillRunError("the tolerance is looser than this family's ceiling: give its measured reason as "
                              "tolerance_reason: {why: ..., measured: [committed artifact paths]}", path=path, field=field)]
    errors = []
    if not str(reason.get("why") or "").strip():
        errors.append(SkillRunError("says no why", path=path, field=f"{field}.why"))
    measured = reason.get("measured")
    if not isinstance(measured, list) or not measured:
        errors.append(SkillRunError("names no measurement (committed evidence, KB-relative paths)", path=path,
                                    field=f"{field}.measured"))
        return errors
    for i, rel in enumerate(measured):
        p = Path(str(rel))
        if p.is_absolute() or ".." in p.parts:
            errors.append(SkillRunError(f"{rel!r} is not a KB-relative path", path=path, field=f"{field}.measured.{i}"))
        elif root is not None and not (root / p).is_file():
            errors.append(SkillRunError(f"{rel!r} does not exist", path=path, field=f"{field}.measured.{i}"))
    return errors


def lint_tolerance(path: str, tolerance: dict[str, Any], problem_module: str, reason: Any = None,
                   root: Optional[Path] = None) -> list[SkillRunError]:
    """Every way ``tolerance`` is looser than its family allows (or not a finite number), and a
    missing or unfounded ``tolerance_reason`` for a tolerance above the family's ceiling."""
    limits = family_limits(problem_module)
    ceiling = family_ceiling(problem_module)
    errors: list[SkillRunError] = []
    above: list[str] = []
    for key, value in tolerance.items():
        field = f"tolerance.{key}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # the schema reports the type
        if not math.isfinite(value):
            errors.append(SkillRunError(f"{value!r} is not a finite number", path=path, field=field))
        elif key in limits and _looser(key, value, limits[key]):
            rel = "<=" if key in _UPPER else ">="
            errors.append(SkillRunError(f"{value:g} is looser than this family allows ({key} {rel} {limits[key]:g}, "
                                        f"from {problem_module})", path=path, field=field))
        elif key in ceiling and _looser(key, value, ceiling[key]):
            above.append(f"{key} {value:g} (ceiling {ceiling[key]:g})")
    if above:
        for e in reason_problems(path, reason, root):
            e.reason = f"{'; '.join(above)} above this family's ceiling (from {problem_module}, default: the dense GEMM's): {e.reason}"
            errors.append(e)
    return errors


def bounded(card_tolerance: dict[str, Any], requested: Any, problem_module: str) -> tuple[dict[str, float], list[str]]:
    """The judge's tolerance for a run: the card's (lint-checked against its family) over the engine's defaults,
    which a requested tolerance (a plan item's: a ``--plan`` file is untrusted input too) may only tighten; every
    value kept within the family's limits. Returns (tolerance, what was refused)."""
    base = dict(_JUDGE_DEFAULT)
    for k, v in (card_tolerance or {}).items():
        if not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v):
            base[k] = float(v)
    limits = family_limits(problem_module)
    ceiling = family_ceiling(problem_module)
    refused: list[str] = []
    out = dict(base)
    for k, v in (requested or {}).items() if isinstance(requested, dict) else ():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            refused.append(f"{k}={v!r} (not a finite number)")
            continue
        bound = base.get(k, ceiling.get(k))
        if bound is None:
            refused.append(f"{k} (not a tolerance the judge knows)")
            continue
        if _looser(k, float(v), bound):
            refused.append(f"{k} {float(v):g} (the card allows {bound:g})")
            out[k] = bound
        else:
            out[k] = float(v)
    for k, lim in limits.items():  # the card passed lint; this holds whatever reached here
        if k in out and _looser(k, out[k], lim):
            refused.append(f"{k} {out[k]:g} (the family allows {lim:g})")
            out[k] = lim
    return out, refused


# What the judge uses for a key the card leaves out (execute/parity.DEFAULT_TOLERANCE).
_JUDGE_DEFAULT: dict[str, float] = {"rtol": 1e-2, "atol": 1e-2, "min_cosine": 0.999}
