"""How loose a card's parity tolerance may be: a ceiling per problem family, checked by lint.

A card is untrusted input, and its ``tolerance`` is what the parity gate compares a port's output
against: ``rtol: 1e300`` or ``min_cosine: 0`` would let a kernel that writes zeros pass. The
bounds therefore do not come from the card. The engine holds one limit for every family
(:data:`ENGINE_LIMITS`); a family's ``problem`` module may tighten it with a literal top-level

    TOLERANCE_LIMITS = {"rtol": 0.05, "atol": 0.05, "max_rel_fro": 0.02, "min_cosine": 0.995}

(read with :mod:`ast`, never imported, like every other static check of lint). A family can only
tighten: a looser value there is ignored in favour of the engine's. Lint refuses a card past its
family's limits, and a card lint refuses is never matched or run (``SkillIndex.check_cards``).
"""
from __future__ import annotations

import math
from typing import Any

from skillrun.errors import SkillRunError
from skillrun.kb.refs import module_constant

# Upper bounds (rtol, atol, max_rel_fro) and a lower bound (min_cosine) for any family. Every
# family today is a low-precision GEMM checked against an fp32 oracle: its honest error is a few
# bf16/fp8 rounding steps (about 1e-2 relative), so ten times that still admits every real port
# and refuses an output that is merely the right order of magnitude.
ENGINE_LIMITS: dict[str, float] = {"rtol": 0.1, "atol": 0.1, "max_rel_fro": 0.1, "min_cosine": 0.99}
_UPPER = ("rtol", "atol", "max_rel_fro")
_LOWER = ("min_cosine",)


def family_limits(problem_module: str) -> dict[str, float]:
    """The limits for a card whose ``references.problem`` is ``problem_module``."""
    limits = dict(ENGINE_LIMITS)
    declared = module_constant(problem_module, "TOLERANCE_LIMITS")
    if not isinstance(declared, dict):
        return limits
    for key, value in declared.items():
        if key not in limits or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        limits[key] = min(limits[key], float(value)) if key in _UPPER else max(limits[key], float(value))
    return limits


def lint_tolerance(path: str, tolerance: dict[str, Any], problem_module: str) -> list[SkillRunError]:
    """Every way ``tolerance`` is looser than its family allows (or not a finite number)."""
    limits = family_limits(problem_module)
    errors: list[SkillRunError] = []
    for key, value in tolerance.items():
        field = f"tolerance.{key}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # the schema reports the type
        if not math.isfinite(value):
            errors.append(SkillRunError(f"{value!r} is not a finite number", path=path, field=field))
        elif key in _UPPER and value > limits[key]:
            errors.append(SkillRunError(f"{value:g} is looser than this family allows ({key} <= {limits[key]:g}, "
                                        f"from {problem_module})", path=path, field=field))
        elif key in _LOWER and value < limits[key]:
            errors.append(SkillRunError(f"{value:g} is looser than this family allows ({key} >= {limits[key]:g}, "
                                        f"from {problem_module})", path=path, field=field))
    return errors
