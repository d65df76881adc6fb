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
    notes: list[str] = []
    if missing:
        return PlanItem(**base, shape=shape, shape_provenance=provenance, status="unsupported_shape",
                        notes=[f"the card's problem needs {','.join(keys)}; the shape given has {','.join(shape)}"])
    sel = select_recipe(card, shape, facts, arch)
    r = sel.recipe
    speed = r.expected_speedup or card.data["expects"]["isolated_speedup_min"]
    if speed < 1.0:
        notes.append(f"the card expects {speed:.2f}x here: keep the baseline for this shape unless a run says otherwise")
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
    """One PlanItem per (matched card, distinct shape); user shapes fill what the trace cannot give.

    A trace shape that does not determine the card's problem (e.g. a MoE baseline seen as
    ``aten::_grouped_mm`` M,N,K: top-k and group size are not in it) is treated as unresolved:
    the user's ``--shape`` then supplies the problem, with provenance ``user``.
    """
    plan = Plan(profile=profile.source, arch=profile.arch)
    by_name = {k.name: k for k in profile.kernels}
    total = profile.total_kernel_us or 1.0
    items: list[PlanItem] = []
    for m in report.matches:
        card = index.skill(m.skill_id)
        # A per-batch loop of GEMMs shows M,N,K but not the batch: that does not determine a batched
        # problem, so such a trace needs --shape (we do not guess the batch from call counts).
        keys = set(problem_keys(card))
        k = by_name[m.kernel]
        shaped = [oc for oc in k.ops if oc.shape and keys <= set(oc.shape)]
        for oc in shaped:
            items.append(_item(card, k, oc.shape, oc.provenance, oc.dtype, 100.0 * oc.total_us / total, index, profile.arch))
        rest_us = k.total_us - sum(oc.total_us for oc in shaped)
        if rest_us > 0.005 * k.total_us or not shaped:
            share = 100.0 * rest_us / total
            partial = [oc for oc in k.ops if oc.shape and oc not in shaped]
            if shapes:
                for s in shapes:
                    it = _item(card, k, s, "user", None, share / len(shapes), index, profile.arch)
                    if partial:
                        it.notes.append("the trace's shapes (" + "; ".join(",".join(f"{a}={b}" for a, b in oc.shape.items()) for oc in partial[:3])
                                        + ") do not determine this card's problem; using the shape given with --shape")
                    items.append(it)
            else:
                it = _item(card, k, None, "unresolved", None, share, index, profile.arch)
                if partial:
                    it.notes.append("the trace gives " + "; ".join(",".join(f"{a}={b}" for a, b in oc.shape.items()) for oc in partial[:3])
                                    + f", which does not determine {','.join(problem_keys(card))}")
                items.append(it)
    plan.items = _merge(items)
    return plan


def _merge(items: list[PlanItem]) -> list[PlanItem]:
    """Several kernels (or ops) of one layer planned to the same card, shape and recipe are one run."""
    merged: dict[tuple, PlanItem] = {}
    order: list[PlanItem] = []
    for it in items:
        if it.shape is None:
            order.append(it)
            continue
        key = (it.skill_id, tuple(sorted(it.shape.items())), it.recipe, it.shape_provenance)
        if key not in merged:
            merged[key] = it
            order.append(it)
            continue
        first = merged[key]
        first.pct_gpu = round(first.pct_gpu + it.pct_gpu, 4)
        first.projected_e2e_gain_pct = projected_gain_pct(first.pct_gpu, first.expected_speedup)
        if it.kernel != first.kernel and f"also replaces {it.kernel[:80]}" not in first.notes:
            first.notes.append(f"also replaces {it.kernel[:80]}")
        for n in it.notes:
            if n not in first.notes:
                first.notes.append(n)
    return order
