"""Matching: every hot kernel of a profile against every skill card, each criterion explained.

A card identifies a kernel by its name regex (raw, mangled and demangled forms) *or* by the
launching op and its arguments (e.g. ``aten::_scaled_mm`` whose scale shapes say block-wise).
The other criteria (min % GPU, gen, dtype, operator, regime) then decide. A match that fails
exactly one criterion is reported as a near miss, so a reader sees why a card did not fire.
"""
from __future__ import annotations

from skillrun.analysis.coverage import coverage
from skillrun.kb.cards import SkillCard
from skillrun.kb.index import SkillIndex
from skillrun.kb.regex import RegexRejected, compile_card_regex
from skillrun.models import CardProblem, Criterion, KernelStat, Match, MatchReport, Profile
from skillrun.ingest.names import demangle_many, is_communication, name_forms

DEFAULT_DECODE_MAX_M = 64

# Which card `operator` values a launching op belongs to.
_OP_CLASSES = {
    "aten::mm": {"dense_gemm"},
    "aten::addmm": {"dense_gemm"},
    "aten::linear": {"dense_gemm"},
    "aten::matmul": {"dense_gemm"},
    "aten::bmm": {"batched_gemm", "dense_gemm"},
    "aten::baddbmm": {"batched_gemm", "dense_gemm"},
    "aten::_scaled_mm": {"dense_gemm", "scaled_quant_gemm"},
    "aten::_scaled_grouped_mm": {"batched_gemm", "grouped_gemm", "scaled_quant_gemm"},
    "aten::_grouped_mm": {"grouped_gemm", "moe"},
}


def op_classes(op: str) -> set[str]:
    """The card ``operator`` values an op belongs to (empty: unknown)."""
    return _op_classes(op)


def _op_classes(op: str) -> set[str]:
    if op in _OP_CLASSES:
        return _OP_CLASSES[op]
    low = op.lower()
    out = set()
    if "moe" in low or "expert" in low:
        # a MoE op is a MoE layer, whatever quantization its name spells: cards for dense (scaled)
        # GEMMs must not take the expert GEMMs it launches (ingest links them to the layer op)
        return {"moe", "grouped_gemm"}
    if "gemm" in low or "matmul" in low:
        out |= {"dense_gemm"}
    if "scale" in low or "a8w8" in low or "fp8" in low:
        out |= {"scaled_quant_gemm"}
    return out


def regime_of(shape: dict[str, int] | None, decode_max_m: int = DEFAULT_DECODE_MAX_M) -> str | None:
    if not shape:
        return None
    m = shape.get("tokens", shape.get("M"))
    if m is None:
        return None
    return "decode" if m <= decode_max_m else "prefill"


def match_kernel(card: SkillCard, k: KernelStat, arch: str | None) -> Match:
    m = card.match
    crit: list[Criterion] = []

    # Identification: name regex, or launching op + arguments.
    forms = name_forms(k.name, k.demangled)
    try:
        rx = compile_card_regex(card.regex)  # RE2: linear time on any name, the same check as lint
        hit = next((f for f in forms if rx.search(f)), None)
    except RegexRejected:
        hit = None  # such a card never reaches matching (the index rejects it); defence in depth
    ops_spec = m["profile_signature"].get("ops", [])
    op_hit = None
    op_near = None
    for spec in ops_spec:
        for oc in k.ops:
            if oc.op != spec["name"]:
                continue
            recipes = spec.get("scale_recipe")
            if recipes and oc.scale_recipe not in recipes:
                op_near = f"{oc.op} launched it, but with scale recipe {oc.scale_recipe or 'unknown'} (card wants {', '.join(recipes)})"
                continue
            dts = spec.get("dtypes")
            if dts and oc.dtype not in dts:
                op_near = f"{oc.op} launched it with dtype {oc.dtype or 'unknown'} (card wants {', '.join(dts)})"
                continue
            op_hit = oc
            break
        if op_hit:
            break
    if hit:
        which = "raw" if hit == forms[0] else ("demangled" if k.demangled and hit == k.demangled[: len(hit)] else "alternate")
        crit.append(Criterion(name="identity", passed=True, reason=f"kernel name ({which} form) matches /{card.regex}/"))
    elif op_hit:
        crit.append(Criterion(name="identity", passed=True, reason=f"launching op {op_hit.op} with {op_hit.scale_recipe or 'matching'} arguments (name regex did not match)"))
    else:
        why = f"kernel name does not match /{card.regex}/"
        if op_near:
            why += f"; {op_near}"
        crit.append(Criterion(name="identity", passed=False, reason=why))

    # % of GPU time.
    need = card.min_pct_gpu
    crit.append(Criterion(name="min_pct_gpu", passed=k.pct_gpu >= need, reason=f"{k.pct_gpu:.2f}% of GPU kernel time (card needs ≥ {need}%)"))

    # Generation.
    gens = m.get("gens", [])
    if "*" in gens:
        crit.append(Criterion(name="gen", passed=True, reason="card applies to any generation"))
    elif not arch:
        crit.append(Criterion(name="gen", passed=False, reason=f"device arch unknown (card is for {', '.join(gens)}); pass --arch"))
    else:
        crit.append(Criterion(name="gen", passed=arch in gens, reason=f"device is {arch}; card is for {', '.join(gens)}"))

    # dtype: from the op's Input type; else unknown (reported, not held against the card).
    dtypes = {oc.dtype for oc in k.ops if oc.dtype}
    card_dt = set(m.get("dtypes", []))
    if not dtypes:
        crit.append(Criterion(name="dtype", passed=None, required=False, reason="dtype not recoverable from the trace; not checked"))
    elif "*" in card_dt or dtypes & card_dt:
        crit.append(Criterion(name="dtype", passed=True, reason=f"inputs {', '.join(sorted(dtypes))}; card takes {', '.join(sorted(card_dt))}"))
    else:
        crit.append(Criterion(name="dtype", passed=False, reason=f"inputs {', '.join(sorted(dtypes))}; card takes {', '.join(sorted(card_dt))}"))

    # Operator class of the launching op(s).
    classes = set().union(*[_op_classes(oc.op) for oc in k.ops]) if k.ops else set()
    card_ops = set(m.get("operator", []))
    if not classes:
        crit.append(Criterion(name="operator", passed=None, required=False, reason="launching op unknown; not checked"))
    else:
        ok = bool(classes & card_ops)
        crit.append(Criterion(name="operator", passed=ok, reason=f"launched by {', '.join(sorted({oc.op for oc in k.ops}))} ({', '.join(sorted(classes))}); card is for {', '.join(sorted(card_ops))}"))

    # Regime from M / tokens of the recovered shapes.
    decode_max = int(m.get("decode_max_m", DEFAULT_DECODE_MAX_M))
    regimes = {regime_of(oc.shape, decode_max) for oc in k.ops} - {None}
    card_reg = set(m.get("regimes", []))
    if not regimes:
        crit.append(Criterion(name="regime", passed=None, required=False, reason="no shape recovered; regime not checked"))
    else:
        ok = bool(regimes & card_reg)
        crit.append(Criterion(name="regime", passed=ok, reason=f"{', '.join(sorted(regimes))} (decode means M ≤ {decode_max}); card covers {', '.join(sorted(card_reg))}"))

    failed = [c for c in crit if c.required and c.passed is False]
    matched = not failed
    near = len(failed) == 1 and (failed[0].name != "identity" or op_near is not None)
    return Match(skill_id=card.id, kernel=k.name, pct_gpu=k.pct_gpu, matched=matched, near_miss=(not matched) and near, criteria=crit)


def card_problems(index: SkillIndex) -> list[CardProblem]:
    """The cards this match ran without (failed to load or lint): reported, never silently dropped."""
    return [CardProblem(path=e.path, field=e.field, reason=e.reason) for e in index.problems]


def match_profile(profile: Profile, index: SkillIndex, top: int | None = None) -> MatchReport:
    kernels = profile.kernels[:top] if top else profile.kernels
    missing = [k.name for k in kernels if k.demangled is None]
    dem = demangle_many(missing) if missing else {}
    report = MatchReport(profile=profile.source, arch=profile.arch, card_problems=card_problems(index))
    unmatched: list = []  # (kernel, its result against every card) for the coverage report
    for k in kernels:
        if k.demangled is None and dem.get(k.name, k.name) != k.name:
            k = k.model_copy(update={"demangled": dem[k.name]})
        # A collective (NCCL/RCCL) is time the network and the other ranks decide: no kernel port
        # replaces it, so no card is offered for it, whatever its regex would say.
        if k.category == "communication" or is_communication(k.name, k.demangled):
            report.communication.append(k.name)
            continue
        touched = False
        results = []
        for card in index.skills.values():
            res = match_kernel(card, k, profile.arch)
            results.append(res)
            if res.matched:
                report.matches.append(res)
                touched = True
            elif res.near_miss:
                report.near_misses.append(res)
        if not touched:
            report.unmatched_hot.append(k.name)
            unmatched.append((k, results))
    matched: dict[str, list[str]] = {}
    for m in report.matches:
        matched.setdefault(m.kernel, []).append(m.skill_id)
    report.coverage = coverage(profile, index, unmatched, _op_classes, matched=matched)
    return report
