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
from skillrun.models import Coverage, FamilyCoverage, KernelStat, Match, NearestCard, Profile
from skillrun.ingest.names import short_name

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


def families(profile: Profile, index: SkillIndex, op_classes, top: int = _TOP_FAMILIES) -> list[FamilyCoverage]:
    """GPU time by (family, dtype), hottest first, each with the cards that cover it on the
    profile's arch, or the nearest card and what it lacks."""
    total = profile.total_kernel_us or sum(k.total_us for k in profile.kernels)
    groups: dict[tuple[str, Optional[str]], list[KernelStat]] = {}
    for k in profile.kernels:
        groups.setdefault(_family(k, op_classes), []).append(k)
    out = []
    for (fam, dtype), ks in sorted(groups.items(), key=lambda kv: -sum(k.total_us for k in kv[1]))[:top]:
        us = sum(k.total_us for k in ks)
        row = FamilyCoverage(family=fam, dtype=dtype, arch=profile.arch, kernels=len(ks),
                             pct_gpu=round(100.0 * us / total, 2) if total else 0.0)
        if fam == "communication":
            row.status = "not_offered"
            row.note = "collectives are never offered to cards: no kernel port replaces one"
        elif fam not in _CLASS_ORDER + ("gemm",):
            row.status = "not_covered"
            row.note = f"no card in this knowledge base is for {_words(fam)} kernels"
        else:
            lacks = {c.id: _covers(c, fam, dtype, profile.arch) for c in index.skills.values()}
            covered = sorted(cid for cid, miss in lacks.items() if not miss)
            if covered and fam == "gemm":
                # The launching op is not in the trace: a GEMM card for this arch may or may not apply.
                row.status = "unknown"
                row.cards = covered
                row.note = "the launching op is not in the trace, so which GEMM this is is unknown"
            elif covered:
                row.status = "covered"
                row.cards = covered
                if dtype is None:
                    row.note = "dtype not in the trace: covered if it is one the card takes"
            else:
                row.status = "not_covered"
                if lacks:
                    near = min(lacks, key=lambda c: (len(lacks[c]), c))
                    row.cards = [near]
                    row.note = f"nearest card {near} differs in " + "; ".join(lacks[near])
                else:
                    row.note = "the knowledge base has no cards"
        out.append(row)
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


def coverage(profile: Profile, index: SkillIndex, unmatched: list[tuple[KernelStat, list[Match]]], op_classes) -> Coverage:
    return Coverage(families=families(profile, index, op_classes), nearest=nearest_cards(unmatched, index, op_classes),
                    kb_families=kb_families(index))


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
        state = {"covered": "covered by " + ", ".join(f.cards), "not_covered": "not covered",
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
