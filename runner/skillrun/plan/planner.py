"""Planning: for each matched kernel and each of its shapes, the recipe to run and what it should buy.

What it should buy is, in order: the current, non-stale GPU measurement of the same card, recipe and
shape on the same device class (from :mod:`skillrun.evidence.index`, quoted with its path and age), else the
card's prior for the recipe. A measurement is read against the trace's own call: the reference that
reproduces it (:mod:`skillrun.plan.callpattern`: scale layout, a loop of calls or one batched call,
eager or graph) is the item's baseline, the fastest oracle-correct production kernel is shown beside
it, and where the evidence says the trace's call fails the oracle the item says so first ("your call
returns wrong results here: ...") with what to do. A recipe's lever and "loses" lines are the card's
words about the shapes it was measured on; the plan says which shapes those were, and never restates
them as facts of the planned shape.
"""
from __future__ import annotations

from typing import Any, Optional

from skillrun.kb.cards import Recipe, SkillCard, problem_keys
from skillrun.kb.index import SkillIndex
from skillrun.kb.regex import RegexRejected, compile_card_regex
from skillrun.models import KernelStat, MatchReport, Plan, PlanItem, Profile
from skillrun.ingest.names import name_forms
from skillrun.plan.callpattern import call_pattern, trace_reference
from skillrun.plan.match import op_classes
from skillrun.plan.select import select_recipe


def projected_gain_pct(fraction_pct: float, speedup: float | None) -> float | None:
    """End-to-end gain if this share of GPU time gets `speedup` faster: f·(1−1/s), in percent."""
    if not speedup or speedup <= 0:
        return None
    return round(fraction_pct * (1.0 - 1.0 / speedup), 4)


def _shape_words(shape: Any, keys: tuple[str, ...]) -> str:
    if isinstance(shape, dict):
        return ",".join(f"{k}={v}" for k, v in shape.items())
    if isinstance(shape, (list, tuple)):
        return ",".join(f"{k}={v}" for k, v in zip(keys, shape)) if len(shape) == len(keys) else "x".join(map(str, shape))
    return str(shape)


def measured_on(recipe: Recipe, keys: tuple[str, ...]) -> list[str]:
    """The shapes a recipe's evidence entries name (what its lever/loses text was measured on)."""
    out: list[str] = []
    for ev in recipe.evidence or []:
        if isinstance(ev, dict) and ev.get("shape") is not None:
            w = _shape_words(ev["shape"], keys)
            if w not in out:
                out.append(w)
    return out


def prior_versus(recipe: Recipe) -> str | None:
    """The reference the recipe's expected_speedup was measured against: the ``versus`` of the
    evidence entry with that speedup (else of the first entry that names one)."""
    entries = [e for e in recipe.evidence or [] if isinstance(e, dict) and e.get("versus")]
    exp = recipe.expected_speedup
    for e in entries:
        sp = e.get("speedup")
        if exp is not None and isinstance(sp, (int, float)) and abs(sp - exp) <= 0.005 * max(abs(exp), 1e-9) + 1e-9:
            return str(e["versus"])
    return str(entries[0]["versus"]) if entries else None


def next_command(card: SkillCard, recipe: Recipe | None, shape: dict[str, int]) -> str:
    cmd = f"skill-run run {card.id} --shape {_shape_words(shape, tuple(shape))}"
    if recipe is not None and recipe.backend == "flydsl":
        cmd += f"   (on a ROCm GPU; without one: skill-run check {card.id} --shape {_shape_words(shape, tuple(shape))}, compile-only)"
    return cmd


def _evidence_dict(e) -> dict[str, Any]:
    from skillrun.evidence.index import age_text

    s = e.summary
    return {"path": e.path, "created": s.created, "age": age_text(e.created), "speedup": s.speedup, "versus": s.versus,
            "versus_production": s.versus_production, "noise_pct": s.noise_pct, "speed": s.speed, "verdict": s.verdict,
            "verdict_text": s.verdict_text, "device": s.device_class, "commit": s.commit, "timing_mode": s.timing_mode,
            "shape": e.shape, "card_edited": e.card_edited, "engine": s.engine,
            "speedup_events": s.speedup_events, "speedup_kernel": s.speedup_kernel, "clock_note": s.clock_note,
            "aa_ratio_p10": s.aa_ratio_p10, "aa_ratio_p90": s.aa_ratio_p90, "fastest_production": s.fastest_production}


def _parity_detail(record: dict[str, Any], name: str, rel_fro: Optional[float]) -> str:
    """How a reference failed the oracle, in the artifact's own numbers."""
    for r in record.get("references") or []:
        if isinstance(r, dict) and r.get("name") == name:
            p = r.get("parity") or {}
            if p.get("sampled_failed"):
                return f"{p['sampled_failed']} of {p.get('sampled_checked')} sampled timed calls off the oracle"
            if isinstance(p.get("mismatched"), int) and p.get("elements"):
                return f"rel_fro {p.get('rel_fro', float('nan')):.2g}, {p['mismatched']} of {p['elements']} elements outside the tolerance"
    return f"rel_fro {rel_fro:.2g}" if rel_fro is not None else "outside the card's tolerance"


def _versus_trace_call(item: PlanItem, card: SkillCard, hit) -> None:
    """Read the measurement against the trace's own call: the ratio to the reference that reproduces
    it becomes the item's expected speedup, and a call that fails the oracle is said first, with what to do."""
    tc = item.trace_call or {}
    name = tc.get("reference")
    if not name:
        return
    s = hit.summary
    ref = next((r for r in s.refs if r.name == name), None)
    if ref is None:
        item.notes.append(f"the trace's call ({name}) was not measured in {hit.path}")
        return
    detail = _parity_detail(hit.record, name, ref.rel_fro) if ref.parity_passed is False else None
    item.versus_trace_call = {"name": name, "production": ref.production, "status": ref.status, "speedup": ref.speedup,
                              "speed": ref.speed, "events": ref.events_speedup, "kernel": ref.kernel_speedup,
                              "clock_note": ref.clock_note, "passed": ref.parity_passed, "detail": detail, "path": hit.path}
    if ref.speedup is not None:
        item.expected_speedup = ref.speedup
    mode = s.timing_mode
    if mode == "CUDA graph" and tc.get("graph") is False:
        item.notes.append(f"the trace launches its call eagerly; {name} was timed as CUDA-graph replays, so the launch "
                          "overhead the trace pays is not in the ratio")
    elif mode == "eager" and tc.get("graph"):
        item.notes.append(f"the trace replays its call from a CUDA graph; {name} was timed eagerly, with launch overhead "
                          "the trace does not pay")
    if ref.parity_passed is not False:
        return
    # What to do: the fastest oracle-correct kernel measured here, the port or a reference.
    correct = [r for r in s.refs if r.parity_passed is True and r.speedup is not None]
    best = min(correct, key=lambda r: r.speedup) if correct else None
    hows = {str(e.get("name")): e.get("how") for e in (card.references.get("trace_calls") or []) if e.get("how")}
    if best is not None and best.speed == "slower":
        item.versus_trace_call["do"] = f"switch to {best.name}"
        how = hows.get(best.name)
        do = (f"switch to {best.name}" + (f" ({how})" if how else "")
              + f": oracle-correct and the fastest kernel measured here (the port runs at {best.speedup:.3g}× its speed)")
    else:
        item.versus_trace_call["do"] = "adopt the port"
        do = (f"adopt the port (recipe {item.recipe}): oracle-correct"
              + (f", {ref.speedup:.3g}× vs your call" if ref.speedup is not None else "")
              + ("; no other oracle-correct kernel was timed" if best is None else
                 f"; the fastest oracle-correct reference, {best.name}, runs {1 / best.speedup:.3g}× the port's speed"))
    item.wrong_results = (f"your call returns wrong results here: {name}, which reproduces the trace's call "
                          f"({tc.get('description') or tc.get('op')}), fails the fp32 oracle ({detail}; {hit.path}); do: {do}")


def _quote_evidence(item: PlanItem, card: SkillCard, recipe: Recipe, evidence, arch: Optional[str], device: Optional[str]) -> None:
    """Replace the card prior by the current measurement where one exists; else say how to get one."""
    hit = evidence.measured(card.id, recipe.name, item.shape, arch=arch, device_name=device) if evidence is not None else None
    stale = None
    if hit is None and evidence is not None:
        stale = evidence.measured(card.id, recipe.name, item.shape, arch=arch, device_name=device, include_stale=True)
    if hit is not None:
        item.evidence = _evidence_dict(hit)
        s = hit.summary
        if s.speedup is not None:
            item.expected_speedup = s.speedup
            item.expected_source = "measured"
            _versus_trace_call(item, card, hit)
            if s.engine == "position_biased":
                item.notes.append("timed by the earlier, position-biased engine (no device hold, slot order alternating): "
                                  "its ratios can read up to 45% against the port; re-run to confirm")
            elif s.engine == "held":
                item.notes.append("timed with held rounds but without the sustained load: single launches at the boost "
                                  "clock, whose ratios differed from back-to-back work by up to 5% on the H200; re-run to confirm")
            return
        item.notes.append(f"measured on {s.device_class} ({hit.path}, {item.evidence['age']}): {s.verdict}, no speedup "
                          f"({s.verdict_text[:160]}); the expected speedup stays the card's prior")
        return
    if stale is not None:
        item.notes.append(f"a stale measurement exists ({stale.path}: {'; '.join(stale.stale_reasons)[:160]}); not quoted")
    item.next_command = next_command(card, recipe, item.shape)


def _item(card: SkillCard, k: KernelStat, shape, provenance, dtype, share_pct, index: SkillIndex, arch: str | None,
          evidence=None, device: Optional[str] = None, oc=None) -> PlanItem:
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
    if sel.untuned:
        notes.append("UNTUNED: no recipe's shape class covers this shape; using the card default (" + "; ".join(sel.reasons) + ")")
    item = PlanItem(
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
        lever_measured_on=measured_on(r, keys),
        expected_speedup=speed,
        prior_versus=prior_versus(r),
        notes=notes,
    )
    if oc is not None:
        pattern = call_pattern(oc, k)
        entry = trace_reference(card.references.get("trace_calls"), pattern)
        item.trace_call = {**pattern, "reference": entry.get("name") if entry else None}
    _quote_evidence(item, card, r, evidence, arch, device)
    speed = item.expected_speedup
    vs = item.versus_trace_call or {}
    if item.wrong_results:
        pass  # the item says what to do instead of "keep the baseline": the baseline is wrong here
    elif item.expected_source == "measured" and (vs.get("speed") or item.evidence["speed"]) == "within_noise":
        item.notes.append(f"measured {speed:.3f}x is inside the A/A noise: no measurable win; keep the baseline")
    elif speed < 1.0:
        what = "measured" if item.expected_source == "measured" else "the card expects"
        item.notes.append(f"{what} {speed:.2f}x here: keep the baseline for this shape unless a run says otherwise")
    item.projected_e2e_gain_pct = projected_gain_pct(share_pct, speed)
    if item.expected_source == "card_prior" and sel.untuned:
        item.projected_e2e_gain_pct = None  # an untuned fallback's prior is no ratio of anything measured
        item.notes.append("no gain projected: the card's prior for an untuned fallback is not a measurement of this shape")
    elif item.expected_source == "measured" and not item.versus_trace_call and item.evidence["verdict"] == "no_production_reference":
        item.projected_e2e_gain_pct = None  # a ratio against an alternative is not a gain over what the trace runs
        item.notes.append("no gain projected: the measurement compared no production kernel and not the trace's own call")
    return item


def make_plan(profile: Profile, report: MatchReport, index: SkillIndex, shapes: list[dict[str, int]] | None = None,
              evidence=None) -> Plan:
    """One PlanItem per (matched card, distinct shape); user shapes fill what the trace cannot give.

    A trace shape that does not determine the card's problem (e.g. a MoE baseline seen as
    ``aten::_grouped_mm`` M,N,K: top-k and group size are not in it) is treated as unresolved:
    the user's ``--shape`` then supplies the problem, with provenance ``user``.
    """
    device = next((d.name for d in profile.devices if d.name), None)
    plan = Plan(profile=profile.source, arch=profile.arch, device=device, coverage=report.coverage)
    ev_kw = {"evidence": evidence, "device": device}
    by_name = {k.name: k for k in profile.kernels}
    total = profile.total_kernel_us or 1.0
    items: list[PlanItem] = []
    for m in report.matches:
        card = index.skill(m.skill_id)
        # A per-batch loop of GEMMs shows M,N,K but not the batch. When ingestion saw the op run as
        # identical consecutive calls inside each profiler step (OpCall.loop_batch), that run length is
        # the batch (provenance inferred_loop); the user's --shape overrides it.
        keys = set(problem_keys(card))
        k = by_name[m.kernel]
        # Calls of the kernel whose launching op is of another operator class are not this card's
        # (one cuBLAS kernel serves dense GEMMs and, inside a MoE layer op, the layer's expert GEMMs)
        wanted = set(card.match.get("operator", []))
        mine = [oc for oc in k.ops if not op_classes(oc.op) or op_classes(oc.op) & wanted]
        # A card that identified the kernel by its launching op alone (its name regex missed) takes
        # only that op's calls: the layer op's, not the same kernel's dense calls elsewhere
        spec_ops = {spec["name"] for spec in card.match["profile_signature"].get("ops", [])}
        if spec_ops and not _name_hit(card, k):
            mine = [oc for oc in mine if oc.op in spec_ops]
        foreign_us = sum(oc.total_us for oc in k.ops if oc not in mine)
        shaped = [oc for oc in mine if oc.shape and keys <= set(oc.shape)]
        for oc in shaped:
            items.append(_item(card, k, oc.shape, oc.provenance, oc.dtype, 100.0 * oc.total_us / total, index, profile.arch,
                               oc=oc, **ev_kw))
        if "batch" in keys and not shapes:
            for oc in mine:
                if oc in shaped or not oc.shape or "batch" in oc.shape or not keys <= set(oc.shape) | {"batch"}:
                    continue
                if not oc.loop_batch:
                    if _two_d(oc):  # one 2-D GEMM per call (aten::_scaled_mm [M,K]x[K,N]): a batch of one
                        it = _item(card, k, {"batch": 1, **oc.shape}, oc.provenance, oc.dtype, 100.0 * oc.total_us / total,
                                   index, profile.arch, **ev_kw)
                        it.notes.append(f"batch=1: each {oc.op} call is one 2-D GEMM ([M,K]×[K,N]), not a batch; "
                                        "--shape overrides it")
                        items.append(it)
                        shaped.append(oc)
                    continue
                it = _item(card, k, {"batch": oc.loop_batch, **oc.shape}, "inferred_loop", oc.dtype, 100.0 * oc.total_us / total,
                           index, profile.arch, oc=oc, **ev_kw)
                it.notes.append(f"batch={oc.loop_batch} inferred from runs of {oc.loop_batch} identical {oc.op} calls "
                                f"({','.join(f'{a}={b}' for a, b in oc.shape.items())}) per profiler step; --shape overrides it")
                items.append(it)
                shaped.append(oc)
        rest_us = k.total_us - foreign_us - sum(oc.total_us for oc in shaped)
        if rest_us > 0.005 * k.total_us or not shaped:
            share = 100.0 * rest_us / total
            partial = [oc for oc in mine if oc.shape and oc not in shaped]
            # a --shape applies to the cards whose problem it speaks of (a MoE shape names no M,N,K)
            usable = [s for s in shapes or () if keys & set(s)]
            if usable:
                rest_calls = k.calls - sum(oc.calls for oc in k.ops if oc not in mine) - sum(oc.calls for oc in shaped)
                for s in usable:
                    it = _item(card, k, s, "user", None, share / len(usable), index, profile.arch, **ev_kw)
                    odd = _implausible(s, rest_calls, rest_us / len(usable), profile, k)
                    if odd:
                        it.notes.append(odd)
                        plan.warnings.append(odd)
                    if partial:
                        it.notes.append("the trace's shapes (" + "; ".join(",".join(f"{a}={b}" for a, b in oc.shape.items()) for oc in partial[:3])
                                        + ") do not determine this card's problem; using the shape given with --shape")
                    items.append(it)
            else:
                it = _item(card, k, None, "unresolved", None, share, index, profile.arch)
                it.next_command = shape_command(profile.source, problem_keys(card), partial[0].shape if partial else None)
                if partial:
                    it.notes.append("the trace gives " + "; ".join(",".join(f"{a}={b}" for a, b in oc.shape.items()) for oc in partial[:3])
                                    + f", which does not determine {','.join(problem_keys(card))}")
                items.append(it)
    plan.items = _merge(items)
    gains = [it.projected_e2e_gain_pct for it in plan.items if it.projected_e2e_gain_pct is not None]
    if gains:
        plan.projected_gain_pct = round(sum(max(0.0, g) for g in gains), 4)
        plan.projected_gain_all_pct = round(sum(gains), 4)
        plan.measured_gain_pct = round(sum(max(0.0, it.projected_e2e_gain_pct) for it in plan.items
                                           if it.projected_e2e_gain_pct is not None and it.expected_source == "measured"), 4)
        plan.prior_gain_pct = round(sum(max(0.0, it.projected_e2e_gain_pct) for it in plan.items
                                        if it.projected_e2e_gain_pct is not None and it.expected_source == "card_prior"), 4)
    return plan


def _two_d(oc) -> bool:
    """The op's two matrix operands are 2-D ([M,K] and [K,N]): one GEMM per call, not a batch."""
    dims = [d for d in oc.input_dims[:2] if isinstance(d, list)]
    return len(dims) == 2 and all(len(d) == 2 for d in dims)


def shape_command(trace: str, keys: tuple[str, ...], known: Optional[dict[str, int]] = None) -> str:
    """The command that supplies an unresolved shape: the trace's own values where it has them, the
    key's name in capitals where the user must put a number (``--shape batch=BATCH,M=2048,…``), or the
    positional form of the card's problem when the trace gives none (``--shape M,N,K``)."""
    import shlex

    known = {k: v for k, v in (known or {}).items() if k in keys}
    shape = ",".join(f"{k}={known[k]}" if k in known else f"{k}={k.upper()}" for k in keys) if known else ",".join(keys)
    return f"skill-run --profile {shlex.quote(str(trace))} --shape {shape}"


def _implausible(shape: dict[str, int], calls: int, us: float, profile: Profile, k: KernelStat) -> Optional[str]:
    """A user's GEMM shape that would make this kernel's calls faster than the device can compute
    (13 PFLOP/s on a 9 µs kernel) is not its shape: said, not planned on silently."""
    from skillrun.analysis.peaks import DEFAULT_PEAKS

    if calls <= 0 or us <= 0 or not all(isinstance(shape.get(x), int) for x in ("M", "N", "K")):
        return None
    dev = next((d for d in profile.devices if d.name), None)
    peak = DEFAULT_PEAKS.lookup(dev.name if dev else None, profile.arch)
    if peak is None:
        return None
    flops = 2.0 * shape["M"] * shape["N"] * shape["K"] * (shape.get("batch") or 1) * calls
    tflops = flops / (us * 1e-6) / 1e12
    best = max(peak.tflops.values())
    if tflops <= best:
        return None
    given = ",".join(f"{a}={b}" for a, b in shape.items())
    return (f"--shape {given} implies {tflops:,.0f} TFLOP/s for {k.name[:60]} ({calls} call(s), {us / calls:.1f} µs each), "
            f"{tflops / best:.1f}x the {peak.name}'s fastest peak ({best:.0f} TFLOP/s): that cannot be this kernel's shape")


def _name_hit(card: SkillCard, k: KernelStat) -> bool:
    try:
        rx = compile_card_regex(card.regex)
    except RegexRejected:
        return False
    return any(rx.search(f) for f in name_forms(k.name, k.demangled))


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
        if first.projected_e2e_gain_pct is not None:  # None stays None (an untuned prior, an alternative's ratio)
            first.projected_e2e_gain_pct = projected_gain_pct(first.pct_gpu, first.expected_speedup)
        if it.kernel != first.kernel and f"also replaces {it.kernel[:80]}" not in first.notes:
            first.notes.append(f"also replaces {it.kernel[:80]}")
        for n in it.notes:
            if n not in first.notes:
                first.notes.append(n)
    return order


# ------------------------------------------------------------------------------------ text
PLAN_HEADER = ("[bold]Plan[/] (expected speedup: the current GPU measurement of the same card, recipe, shape and device "
               "class where one exists, else the card's prior)")


def _lever_scope(it: PlanItem) -> str:
    shape = ",".join(f"{k}={v}" for k, v in (it.shape or {}).items())
    if not it.lever_measured_on:
        return "no measured shape named"
    if shape in it.lever_measured_on:
        return "measured on this shape" + (f" and {len(it.lever_measured_on) - 1} other(s)" if len(it.lever_measured_on) > 1 else "")
    return "measured on " + "; ".join(it.lever_measured_on[:3]) + (" …" if len(it.lever_measured_on) > 3 else "") + ", not this shape"


def item_lines(i: int, it: PlanItem) -> list[str]:
    """Rich-markup lines for one plan item (the CLI prints them; every dynamic string is escaped)."""
    import json

    from skillrun.io.termtext import safe as x  # controls and markup escaped (card and trace text)
    from skillrun.evidence.verdict import speed_style

    shape = ",".join(f"{k}={v}" for k, v in (it.shape or {}).items()) or "shape unresolved"
    lines = [f"[bold][{i}][/] {x(it.skill_id)}  {x(shape)}  [dim]({x(it.shape_provenance)}, {it.pct_gpu:.2f}% of GPU time)[/]"]
    if it.wrong_results:  # said first: the user's own call is wrong here
        head, _, rest = it.wrong_results.partition(": ")
        lines.append(f"    [bold red]{x(head)}[/]: {x(rest)}")
    if it.recipe:
        tag = " [bold yellow]UNTUNED[/]" if it.untuned else ""
        lines.append(f"    recipe [bold]{x(it.recipe)}[/]{tag} → {x(str(it.kernel_ref))} {x(json.dumps(it.config))}")
        if it.lever:
            lines.append(f"    the card's lever [dim]({x(_lever_scope(it))})[/]: {x(it.lever)}")
        if it.loses:
            lines.append(f"    the card's 'loses' [dim](same shapes)[/]: {x('; '.join(it.loses))}")
    refs = it.references
    base = ", ".join(f"{k}={v}" for k, v in refs.get("baseline", {}).items())
    lines.append(f"    references: oracle {x(str(refs.get('oracle', '—')))}; baseline {x(base or '—')}")
    if it.trace_call:
        tc = it.trace_call
        who = f"reproduced by [bold]{x(tc['reference'])}[/]" if tc.get("reference") else "no reference of the card reproduces it"
        lines.append(f"    the trace's call: {x(tc.get('description') or tc.get('op'))} ({who})")
    if it.expected_speedup:
        gain = f"{it.projected_e2e_gain_pct:.2f}% of GPU time" if it.projected_e2e_gain_pct is not None else "none counted"
        if it.expected_source == "measured" and it.evidence:
            ev = it.evidence
            noise = f"A/A noise {ev['noise_pct']:.2f}%" if ev.get("noise_pct") is not None else "no A/A noise"
            vs = it.versus_trace_call
            # Coloured by what the ratio means (faster green, slower amber, within noise plain), never by where it came from.
            speed = (vs or ev).get("speed") or "not_timed"
            style = " ".join(("bold", speed_style(speed))).strip()
            if vs and vs.get("speedup") is not None:
                against = f"your call {x(vs['name'])}" + (" (which fails the oracle)" if vs.get("passed") is False else "")
            else:
                against = x(str(ev["versus"]))
            lines.append(f"    expected [{style}]{it.expected_speedup:.3f}×[/] measured on {x(ev['device'])} vs {against}"
                         f" ({noise}, {x(speed.replace('_', ' '))}; {x(str(ev.get('timing_mode') or ''))}, commit {x(ev['commit'])})"
                         f" → projected end-to-end gain f·(1−1/s) = {gain}")
            clocks = vs if vs and vs.get("clock_note") else (ev if ev.get("clock_note") else None)
            if clocks:
                e_, k_ = clocks.get("events") or clocks.get("speedup_events"), clocks.get("kernel") or clocks.get("speedup_kernel")
                lines.append(f"    two clocks: events {e_:.3g}×, kernel durations {k_:.3g}× (the smaller counts): {x(clocks['clock_note'])}")
            if vs and vs.get("speedup") is not None and ev.get("versus") != vs["name"] and ev.get("speedup") is not None:
                if ev.get("fastest_production") == ev.get("versus"):
                    what = "the fastest oracle-correct production kernel measured"
                elif ev.get("verdict") == "no_production_reference":
                    what = "an alternative: no production kernel was compared"
                else:
                    what = "the fastest production kernel measured, which fails the oracle"
                lines.append(f"    beside it: {ev['speedup']:.3f}× vs {x(str(ev['versus']))}, {what} (verdict {x(ev['verdict'])})")
            lines.append(f"    evidence: {x(ev['path'])} ({x(ev['age'])}, shape {x(_shape_words(ev['shape'], tuple(ev['shape'])))})")
        else:
            vs = f", a ratio against {x(it.prior_versus)}" if it.prior_versus else ", against no named reference"
            lines.append(f"    expected {it.expected_speedup:.2f}× [yellow]card prior[/] (not measured for this shape and device{vs})"
                         f" → projected end-to-end gain f·(1−1/s) = {gain}")
    if it.next_command:
        lines.append(f"    next: [bold]{x(it.next_command)}[/]")
    for n in it.notes:
        lines.append(f"    [yellow]note:[/] {x(n)}")
    return lines


def plan_lines(plan: Plan) -> list[str]:
    """The plan as rich-markup lines, ending with the coverage (also when nothing was planned)."""
    if not plan.items:
        return _coverage_markup(plan)
    lines = [PLAN_HEADER]
    for i, it in enumerate(plan.items, 1):
        lines += item_lines(i, it)
    if plan.projected_gain_pct is not None:
        measured = sum(it.expected_source == "measured" for it in plan.items)
        prior = len(plan.items) - measured
        lines.append(f"[bold]Projected end-to-end gain[/], keeping the baseline where the port is slower: "
                     f"{plan.measured_gain_pct or 0.0:.2f}% of GPU time from measurements ({measured} item(s)); "
                     f"{plan.prior_gain_pct or 0.0:.2f}% more from card priors ({prior} item(s), not measured here; an untuned "
                     f"fallback adds none); {plan.projected_gain_all_pct:.2f}% if every item were adopted")
    wrong = [(i, it) for i, it in enumerate(plan.items, 1) if it.wrong_results]
    if wrong:
        lines.append(f"[bold red]Your call returns wrong results[/] in {len(wrong)} item(s): "
                     + ", ".join(f"[{i}]" for i, _ in wrong) + " (each says what to do)")
    todo = [it for it in plan.items if it.next_command and it.status == "planned"]
    if todo:
        lines.append(f"{len(todo)} item(s) without a measurement: run the [bold]next:[/] command of each")
    unresolved = [it for it in plan.items if it.status == "unresolved_shape"]
    if unresolved:
        lines.append(f"{len(unresolved)} item(s) with no shape: give it with the [bold]next:[/] command's --shape")
    return lines + _coverage_markup(plan)


def _coverage_markup(plan: Plan) -> list[str]:
    from rich.markup import escape

    from skillrun.analysis.coverage import coverage_lines
    from skillrun.io.termtext import plain

    lines = coverage_lines(plan.coverage)
    return [f"[bold]{escape(plain(ln))}[/]" if i == 0 else escape(plain(ln)) for i, ln in enumerate(lines)]


def answer_line(plan: Plan, matched_cards: int, trace: str = "TRACE") -> str:
    """The one line that answers `skill-run --profile` / `plan`, printed first (rich markup): what
    matched, its share of GPU time, the projected gain (coloured by meaning) and what to do next."""
    from skillrun.io.termtext import safe as x

    if not plan.items:
        nm = plan.coverage.no_match if plan.coverage is not None else None
        if nm is not None:  # why nothing matched and what to do (skillrun.analysis.coverage.no_match)
            return f"[bold]Answer:[/] no skill card matches: {x(nm.reason)}; next: {x(nm.next)}"
        return (f"[bold]Answer:[/] no skill card matches a hot kernel of this profile; "
                f"`skill-run match {x(trace)}` shows each card's criteria and near misses")
    share = sum(it.pct_gpu for it in plan.items)
    measured = sum(it.expected_source == "measured" for it in plan.items)
    gain = plan.projected_gain_pct
    if gain is None:
        gain_text = "projected gain unknown (no expected speedup)"
    else:
        # Measured apart from prior: only the measured part is coloured; a prior never reads as a win.
        mgain = plan.measured_gain_pct or 0.0
        style = "green" if mgain > 0.005 else ("yellow" if mgain < -0.005 else "")
        words = f"projected end-to-end gain {mgain:+.2f}% of GPU time"
        gain_text = (f"[{style}]{words}[/]" if style else words) + f" measured ({measured} item(s))"
        prior_n = len(plan.items) - measured
        if prior_n:
            gain_text += f", card priors {plan.prior_gain_pct or 0.0:+.2f}% more ({prior_n} item(s), not measured)"
    # The user's own call being wrong is said first: it matters more than any speedup.
    wrong = [(i, it) for i, it in enumerate(plan.items, 1) if it.wrong_results]
    lead = ""
    if wrong:
        i, it = wrong[0]
        shape = ",".join(f"{k}={v}" for k, v in (it.shape or {}).items())
        vs = it.versus_trace_call or {}
        lead = (f"[bold red]your call returns wrong results here[/]: [{i}] {x(shape)} ({x(str(vs.get('name')))} fails the fp32 oracle"
                + (f"; {x(vs['do'])}" if vs.get("do") else "") + ")"
                + (f" and in {len(wrong) - 1} more item(s)" if len(wrong) > 1 else "") + "; ")
    todo = [it for it in plan.items if it.next_command and it.status == "planned"]
    unresolved = [it for it in plan.items if it.status == "unresolved_shape" and it.next_command]
    if unresolved:  # no gain can be projected for an item without a shape: that comes first
        from skillrun.ingest.names import short_name

        u = max(unresolved, key=lambda it: it.pct_gpu)
        more = f"; {len(unresolved) - 1} more item(s) need one too" if len(unresolved) > 1 else ""
        nxt = (f"next: give the shape of {x(short_name(u.kernel, 60))} ({u.pct_gpu:.1f}% of GPU time), which the trace "
               f"does not determine: `{x(u.next_command)}`{more}")
    elif todo:
        nxt = f"next: measure the {len(todo)} unmeasured item(s) on a GPU (`{x(todo[0].next_command)}`" + (", …)" if len(todo) > 1 else ")")
    elif gain is not None and (plan.measured_gain_pct or 0.0) <= 0.005:
        nxt = "next: keep the production kernels (the measured ports are not faster here)"
    else:
        nxt = "next: adopt the ports of the items with a gain, or confirm end to end with `skill-run e2e`"
    return (f"[bold]Answer:[/] {lead}{matched_cards} card(s) match {share:.1f}% of GPU time in {len(plan.items)} shape(s); "
            f"{gain_text}; {nxt}")
