"""Planning: for each matched kernel and each of its shapes, the recipe to run and what it should buy."""
from __future__ import annotations

from skillrun.kb.cards import SkillCard
from skillrun.kb.index import SkillIndex
from skillrun.models import KernelStat, MatchReport, Plan, PlanItem, Profile
from skillrun.refs import module_constant
from skillrun.select import select_recipe


def problem_keys(card: SkillCard) -> tuple[str, ...]:
    keys = module_constant(card.references["problem"], "SHAPE_KEYS")
    return tuple(keys) if keys else ("M", "N", "K")


def projected_gain_pct(fraction_pct: float, speedup: float | None) -> float | None:
    """End-to-end gain if this share of GPU time gets `speedup` faster: f·(1−1/s), in percent."""
    if not speedup or speedup <= 0:
        return None
    return round(fraction_pct * (1.0 - 1.0 / speedup), 4)


def _item(card: SkillCard, k: KernelStat, shape, provenance, dtype, share_pct, index: SkillIndex, arch: str | None) -> PlanItem:
    facts = index.device_facts(arch) if arch else index.device_facts(card.gens[0])
    base = dict(
        skill_id=card.id,
        kernel=k.name,
        pct_gpu=round(share_pct, 4),
        dtype=dtype,
        references=card.references,
        tolerance=card.tolerance,
    )
    keys = problem_keys(card)
    if not shape:
        return PlanItem(**base, shape_provenance="unresolved", status="unresolved_shape",
                        notes=[f"shape not recoverable from the trace; supply it with --shape {','.join(keys)}"])
    missing = [key for key in keys if key not in shape]
    notes = []
    if missing:
        # e.g. a per-batch _scaled_mm loop seen as single GEMMs: batch=1 per call is what the trace shows.
        if missing == ["batch"]:
            shape = {"batch": 1, **shape}
            notes.append("batch not visible in the trace (each call is one GEMM); planned as batch=1")
        else:
            return PlanItem(**base, shape=shape, shape_provenance=provenance, status="unsupported_shape",
                            notes=[f"the card's problem needs {','.join(keys)}; the trace gives {','.join(shape)}"])
    sel = select_recipe(card, shape, facts, arch)
    r = sel.recipe
    speed = r.expected_speedup or card.data["expects"]["isolated_speedup_min"]
    if sel.untuned:
        notes.append("UNTUNED: no recipe's shape class covers this shape; using the card default (" + "; ".join(sel.reasons) + ")")
    return PlanItem(
        **base,
        shape={key: shape[key] for key in keys if key in shape},
        shape_provenance=provenance,
        recipe=r.name,
        untuned=sel.untuned,
        kernel_ref=r.kernel,
        backend=r.backend,
        config=dict(r.config),
        lever=r.lever,
        loses=list(r.loses),
        expected_speedup=speed,
        projected_e2e_gain_pct=projected_gain_pct(share_pct, speed),
        notes=notes,
    )


def make_plan(profile: Profile, report: MatchReport, index: SkillIndex, shapes: list[dict[str, int]] | None = None) -> Plan:
    """One PlanItem per (matched card, kernel, distinct shape); user shapes fill unresolved ones."""
    plan = Plan(profile=profile.source, arch=profile.arch)
    by_name = {k.name: k for k in profile.kernels}
    total = profile.total_kernel_us or 1.0
    for m in report.matches:
        card = index.skill(m.skill_id)
        k = by_name[m.kernel]
        shaped = [oc for oc in k.ops if oc.shape]
        for oc in shaped:
            plan.items.append(_item(card, k, oc.shape, oc.provenance, oc.dtype, 100.0 * oc.total_us / total, index, profile.arch))
        rest_us = k.total_us - sum(oc.total_us for oc in shaped)
        if rest_us > 0.005 * k.total_us or not shaped:
            share = 100.0 * rest_us / total
            if shapes:
                for s in shapes:
                    plan.items.append(_item(card, k, s, "user", None, share / len(shapes), index, profile.arch))
            else:
                plan.items.append(_item(card, k, None, "unresolved", None, share, index, profile.arch))
    return plan
