"""Coverage: what dominates a trace, which of it the knowledge base has cards for, and for each hot
kernel that no card matched, the closest card and the criterion it failed.

A no-match is the common outcome on a real trace (most of a model's time is in kernels no card
ports), so "no card matches" alone tells a reader nothing. This says what the time is (e.g. 85 %
bf16 dense GEMM on gfx942), whether any card covers that family on that arch, and why the nearest
card did not fire. :func:`coverage` is computed in :func:`skillrun.plan.match.match_profile` and carried
by the match report and the plan.
"""
from __future__ import annotations

from typing import Iterable, Optional

from skillrun.kb.index import SkillIndex
from skillrun.models import Coverage, FamilyCoverage, KernelStat, Match, NearestCard, NoMatch, Profile
from skillrun.ingest.names import dtype_from_name, short_name

# The most specific operator class of a GEMM's launching ops names its family.
_CLASS_ORDER = ("moe", "grouped_gemm", "batched_gemm", "scaled_quant_gemm", "dense_gemm")
_TOP_FAMILIES = 8
_TOP_KERNELS = 10


def _family(k: KernelStat, op_classes) -> tuple[str, Optional[str]]:
    """(family, dtype) of a kernel: the operator class of its launching ops for a GEMM, else its
    category; the dtype its ops ran in, by time (None when the trace does not say)."""
    dt_time: dict[str, float] = {}
    classes: set[str] = set()
    for o in k.ops:
        classes |= op_classes(o.op)
        if o.dtype:
            dt_time[o.dtype] = dt_time.get(o.dtype, 0.0) + o.total_us
    dtype = max(dt_time, key=dt_time.get) if dt_time else None
    if k.category == "gemm":
        fam = next((c for c in _CLASS_ORDER if c in classes), "gemm")
        # The op shows the activations only; a name that spells the weights' format (an MXFP4 MoE
        # launched with bf16 inputs) says what the GEMM really is.
        named = dtype_from_name(k.demangled or k.name)
        if named and (dtype is None or named != dtype):
            dtype = named if (dtype is None or "×" in named or named.startswith(dtype)) else f"{dtype}×{named}"
        return fam, dtype
    return k.category, dtype


def _words(family: str) -> str:
    return "uncategorised" if family == "other" else family


def _covers(card, family: str, dtype: Optional[str], arch: Optional[str]) -> list[str]:
    """What a card lacks to cover a family on an arch ([] = covers it)."""
    m = card.match
    lacks = []
    ops = set(m.get("operator", []))
    fam_ops = {family} if family != "gemm" else set(_CLASS_ORDER)  # a GEMM of unknown op: any GEMM card
    if not ops & fam_ops:
        lacks.append(f"operator ({', '.join(sorted(ops)) or 'none'})")
    dts = set(m.get("dtypes", []))
    if dtype and "*" not in dts and dtype not in dts:
        lacks.append(f"dtype ({', '.join(sorted(dts))})")
    gens = set(m.get("gens", []))
    if arch and "*" not in gens and arch not in gens:
        lacks.append(f"arch ({', '.join(sorted(gens))})")
    return lacks


def families(profile: Profile, index: SkillIndex, op_classes, top: int = _TOP_FAMILIES,
             matched: Optional[dict[str, list[str]]] = None,
             unmatched: Optional[list[tuple[KernelStat, list[Match]]]] = None) -> list[FamilyCoverage]:
    """GPU time by (family, dtype), hottest first. Only kernels a card matched count as covered (by
    the cards that matched them); the rest of a family some card is for is a near miss, with the
    criterion that card failed; a family no card is for says so, with the nearest card and what it lacks."""
    total = profile.total_kernel_us or sum(k.total_us for k in profile.kernels)
    matched = matched or {}
    results = {k.name: res for k, res in (unmatched or [])}
    groups: dict[tuple[str, Optional[str]], list[KernelStat]] = {}
    for k in profile.kernels:
        groups.setdefault(_family(k, op_classes), []).append(k)

    def row(fam: str, dtype: Optional[str], ks: list[KernelStat], **kw) -> FamilyCoverage:
        us = sum(k.total_us for k in ks)
        return FamilyCoverage(family=fam, dtype=dtype, arch=profile.arch, kernels=len(ks),
                              pct_gpu=round(100.0 * us / total, 2) if total else 0.0, **kw)

    out = []
    for (fam, dtype), ks in sorted(groups.items(), key=lambda kv: -sum(k.total_us for k in kv[1]))[:top]:
        if fam == "communication":
            out.append(row(fam, dtype, ks, status="not_offered",
                           note="collectives are never offered to cards: no kernel port replaces one"))
            continue
        if fam not in _CLASS_ORDER + ("gemm",):
            out.append(row(fam, dtype, ks, status="not_covered",
                           note=f"no card in this knowledge base is for {_words(fam)} kernels"))
            continue
        hit = [k for k in ks if k.name in matched]
        miss = [k for k in ks if k.name not in matched]
        if hit:
            out.append(row(fam, dtype, hit, status="covered",
                           cards=sorted({c for k in hit for c in matched[k.name]})))
        if not miss:
            continue
        lacks = {c.id: _covers(c, fam, dtype, profile.arch) for c in index.skills.values()}
        able = sorted(cid for cid, lack in lacks.items() if not lack)
        if able and fam == "gemm":
            # The launching op is not in the trace: a GEMM card for this arch may or may not apply.
            out.append(row(fam, dtype, miss, status="unknown", cards=able,
                           note="the launching op is not in the trace, so which GEMM this is is unknown"))
        elif able:
            hot = max(miss, key=lambda k: k.total_us)
            best = _closest([m for m in results.get(hot.name, []) if m.skill_id in able])
            failed = [f"{c.name}: {c.reason}" for c in best.criteria if c.required and c.passed is False] if best else []
            near = best.skill_id if best else able[0]
            out.append(row(fam, dtype, miss, status="near_miss", cards=[near],
                           note=f"{near} is for this family but did not match" + (f" ({'; '.join(failed)})" if failed else "")
                           + ("" if dtype else "; dtype not in the trace")))
        elif lacks:
            near = min(lacks, key=lambda c: (len(lacks[c]), c))
            out.append(row(fam, dtype, miss, status="not_covered", cards=[near],
                           note=f"nearest card {near} differs in " + "; ".join(lacks[near])))
        else:
            out.append(row(fam, dtype, miss, status="not_covered", note="the knowledge base has no cards"))
    out.sort(key=lambda f: -f.pct_gpu)
    return out


def _closest(results: Iterable[Match]) -> Optional[Match]:
    """The card that came nearest: fewest failed criteria, a name or op hit before a miss."""
    def key(m: Match):
        failed = [c for c in m.criteria if c.required and c.passed is False]
        ident = next((c for c in m.criteria if c.name == "identity"), None)
        return (len(failed), 0 if ident is not None and ident.passed else 1, m.skill_id)

    res = sorted(results, key=key)
    return res[0] if res else None


def nearest_cards(kernels: list[tuple[KernelStat, list[Match]]], index: SkillIndex, op_classes,
                  top: int = _TOP_KERNELS) -> list[NearestCard]:
    """For each unmatched hot kernel (hottest first), the closest card and the criteria it failed;
    a kernel of a family no card is for (attention, elementwise, …) says so instead of naming a
    card that only failed on its name."""
    card_ops = set().union(*[set(c.match.get("operator", [])) for c in index.skills.values()]) if index.skills else set()
    out = []
    for k, results in kernels[:top]:
        fam, _ = _family(k, op_classes)
        if k.category != "gemm" or (fam != "gemm" and fam not in card_ops):
            out.append(NearestCard(kernel=k.name, demangled=k.demangled, pct_gpu=round(k.pct_gpu, 3), category=k.category, card=None,
                                   failed=[f"no card in this knowledge base is for {_words(fam)} kernels"]))
            continue
        best = _closest(results)
        if best is None:
            continue
        failed = [c for c in best.criteria if c.required and c.passed is False]
        out.append(NearestCard(kernel=k.name, demangled=k.demangled, pct_gpu=round(k.pct_gpu, 3), category=k.category, card=best.skill_id,
                               failed=[f"{c.name}: {c.reason}" for c in failed]))
    return out


def coverage(profile: Profile, index: SkillIndex, unmatched: list[tuple[KernelStat, list[Match]]], op_classes,
             matched: Optional[dict[str, list[str]]] = None) -> Coverage:
    """``matched``: kernel name → the cards that matched it (what counts as covered)."""
    cov = Coverage(families=families(profile, index, op_classes, matched=matched, unmatched=unmatched),
                   nearest=nearest_cards(unmatched, index, op_classes), kb_families=kb_families(index))
    if not matched:
        cov.no_match = no_match(profile, index, cov, unmatched)
    return cov


def _trace_words(profile: Profile) -> str:
    return str(profile.source)


def no_match(profile: Profile, index: SkillIndex, cov: Coverage, unmatched: list[tuple[KernelStat, list[Match]]]) -> NoMatch:
    """Why nothing matched, in the order a reader should fix it: a capture trace, an --arch override
    that hides the trace's own arch, an unknown arch, no card for this arch, then the hottest family
    and why no card took it."""
    trace = _trace_words(profile)
    match_cmd = f"`skill-run match {trace}` lists every card's criteria"
    cap = profile.graph_capture
    if cap.detected:
        ms = profile.total_kernel_us / 1e3
        return NoMatch(kind="graph_capture",
                       reason=f"this is a graph-capture trace: {cap.captured_launches} kernel launch(es) were captured into a "
                              f"graph and never ran, so the {len(profile.kernels)} kernel(s) that did run ({ms:.3f} ms) are "
                              "not the workload",
                       next="profile the steps that replay the graph (`skill-run profile --steps a:b -- python workload.py`)")
    own = profile.arch_from_trace
    if own and profile.arch:
        for k, results in unmatched:
            for m in results:
                gen = next((c for c in m.criteria if c.name == "gen"), None)
                card = index.skills.get(m.skill_id)
                if gen is not None and gen.passed is False and card is not None and own in card.gens:
                    others = [c for c in m.criteria if c.required and c.passed is False and c.name != "gen"]
                    tail = "" if not others else f" (it also fails {', '.join(c.name for c in others)})"
                    return NoMatch(kind="arch_override",
                                   reason=f"--arch {profile.arch} overrides the trace's own {own}, and card {m.skill_id} "
                                          f"is for {own}{tail}",
                                   next=f"drop --arch: `skill-run --profile {trace}`")
    gens = sorted({g for c in index.skills.values() for g in c.gens})
    if not index.skills:
        return NoMatch(kind="no_cards", reason="the knowledge base has no cards", next="check --kb / $SKILLRUN_KB")
    if profile.arch is None and "*" not in gens:
        return NoMatch(kind="arch_unknown", reason="the trace does not say which GPU it ran on, so no card's generation "
                                                   "can be checked",
                       next=f"pass --arch ({', '.join(gens)}): `skill-run --profile {trace} --arch ARCH`")
    top = next((f for f in cov.families if f.status != "not_offered"), None)
    what = (f"{top.pct_gpu:.1f}% of GPU time is {top.dtype + ' ' if top.dtype else ''}{_words(top.family)}"
            if top else "no kernel here is offered to cards")
    coll = sum(f.pct_gpu for f in cov.families if f.status == "not_offered")
    if top is not None and coll > top.pct_gpu:  # most of the time is collectives: say so before the rest
        what = f"{coll:.1f}% of GPU time is collectives (never offered to cards) and {what[0].lower()}{what[1:]}"
    if profile.arch and "*" not in gens and profile.arch not in gens:
        dev = next((d.name for d in profile.devices if d.name), None)
        return NoMatch(kind="no_card_for_arch",
                       reason=f"no card is for {profile.arch}" + (f" ({dev})" if dev else "")
                              + f": the cards cover {', '.join(gens)}; {what}",
                       next="`skill-run list` shows what each card covers; `skill-run kernels TRACE` ranks the time")
    if top is None:
        return NoMatch(kind="nothing_offered", reason=what + " (collectives are never offered)",
                       next="`skill-run kernels TRACE` ranks the time")
    if top.status == "near_miss":
        return NoMatch(kind="near_miss", reason=f"{what} on {top.arch}: {top.note}", next=match_cmd)
    if top.status == "unknown":
        return NoMatch(kind="op_unknown",
                       reason=f"{what} whose launching op is not in the trace (graph replay, or a profiler without "
                              "op shapes), so no card can tell which GEMM it is",
                       next="profile with torch.profiler (record_shapes=True) outside graph replay, or "
                            f"{match_cmd}")
    return NoMatch(kind="not_covered", reason=f"{what}, which no card covers: {top.note}",
                   next=f"`skill-run list` shows what is covered; {match_cmd}")


def kb_families(index: SkillIndex) -> list[str]:
    """One line per card: the family, dtypes and arches it covers (what the README lists up front)."""
    out = []
    for c in sorted(index.skills.values(), key=lambda c: c.id):
        m = c.match
        out.append(f"{c.id}: {'/'.join(m.get('operator', []))} · {', '.join(m.get('dtypes', []))} · "
                   f"{', '.join(m.get('gens', []))}")
    return out


def coverage_lines(cov: Optional[Coverage]) -> list[str]:
    """Coverage as plain text lines (no markup): families, then the closest card per unmatched kernel."""
    if cov is None or not (cov.families or cov.nearest):
        return []
    lines = ["Coverage: what this trace spends GPU time on, and whether a card covers it"]
    for f in cov.families:
        what = f"{f.dtype + ' ' if f.dtype else ''}{f.family}" + (f" on {f.arch}" if f.arch else "")
        state = {"covered": "matched by " + ", ".join(f.cards), "not_covered": "not covered",
                 "near_miss": "near miss",
                 "not_offered": "not offered to cards",
                 "unknown": "coverage unknown (GEMM cards for this arch: " + ", ".join(f.cards) + ")"}[f.status]
        lines.append(f"  {f.pct_gpu:5.1f}%  {what} ({f.kernels} kernel{'s' if f.kernels != 1 else ''}): {state}"
                     + (f"; {f.note}" if f.note else ""))
    if cov.nearest:
        lines.append("Closest card per unmatched hot kernel:")
        for n in cov.nearest:
            lines.append(f"  {n.pct_gpu:5.2f}%  {short_name(n.demangled or n.kernel, 120)}")
            lines.append("          " + (f"nearest {n.card}: " if n.card else "") + (" | ".join(n.failed) or "no criterion failed"))
    return lines
