"""Which plan items an e2e run routes, and the routing spec the workload's hook reads.

A plan item is routable when it is planned (a recipe for a resolved shape), the card expects it to
pay off (or ``include_slower``), its card's problem family has a ``route`` module beside its
``problem`` module (kernels/<family>/route.py), and its recipe backend runs on this machine.
Every other item is listed with the reason it is left out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skillrun.kb.index import SkillIndex
from skillrun.models import Plan
from skillrun.kb.refs import module_file


@dataclass
class RouteSpec:
    items: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items}


def route_module_of(problem_module: str) -> str:
    """skillrun_kernels.<family>.problem -> skillrun_kernels.<family>.route"""
    head, _, _ = problem_module.rpartition(".")
    return f"{head}.route" if head else "route"


def build_spec(plan: Plan, index: SkillIndex, runs_here: tuple[str, ...], include_slower: bool = False) -> RouteSpec:
    """``include_slower``: also route items whose card expects a slowdown (the plan keeps their baseline)."""
    spec = RouteSpec()
    for n, it in enumerate(plan.items):
        where = {"card": it.skill_id, "shape": it.shape, "recipe": it.recipe}
        if it.status != "planned" or not it.recipe or not it.kernel_ref or not it.shape:
            spec.skipped.append({**where, "reason": f"not planned ({it.status}): " + "; ".join(it.notes[:2])})
            continue
        if not include_slower and it.expected_speedup is not None and it.expected_speedup < 1.0:
            spec.skipped.append({**where, "reason": f"the card expects {it.expected_speedup:.2f}x here, so the plan keeps the "
                                                    "baseline (route it anyway with --include-slower)"})
            continue
        card = index.skill(it.skill_id)
        route = route_module_of(card.references["problem"])
        if module_file(route) is None:
            spec.skipped.append({**where, "reason": f"the card's family has no route module ({route})"})
            continue
        backend = it.backend or card.recipe(it.recipe).backend
        if backend not in runs_here:
            spec.skipped.append({**where, "reason": f"a {backend} port does not run on this machine"})
            continue
        spec.items.append({
            "id": f"i{n}",
            "card": it.skill_id,
            "recipe": it.recipe,
            "untuned": bool(it.untuned),
            "kernel_ref": it.kernel_ref,
            "backend": backend,
            "config": dict(it.config or {}),
            "shape": dict(it.shape),
            "route": route,
            "problem": card.references["problem"],
            "pct_gpu": it.pct_gpu,
            "expected_speedup": it.expected_speedup,
            "projected_gain_pct": it.projected_e2e_gain_pct,
            "tolerance": dict(it.tolerance or card.tolerance),
            "card_regex": card.regex,
        })
    return spec
