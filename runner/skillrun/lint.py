"""`skill-run lint`: every card, fact and validation artifact checked; each error names file, field, reason.

A stage above the loader: :func:`check_cards` takes the cards lint refuses out of a loaded index
(``api.load_index`` runs it before anything matches).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from skillrun.errors import SkillRunError
from skillrun.kb import expr
from skillrun.kb.cards import SkillCard, problem_keys
from skillrun.kb.index import SkillIndex
from skillrun.kb.regex import check_regex, compile_card_regex
from skillrun.kb.tolerance import lint_tolerance
from skillrun.kb.tunable import lint_tunable
from skillrun.models import DEVICE_KEYS, SHAPE_KEYS
from skillrun.ingest.names import MAX_NAME_LEN
from skillrun.kb.refs import check_module, check_ref
from skillrun.plan.select import select_recipe
from skillrun.evidence.tuning_artifact import is_tuning_artifact, load_tuning_artifact

__all__ = ["LintReport", "check_regex", "lint", "lint_card"]


@dataclass
class LintReport:
    errors: list[SkillRunError] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    # Things a maintainer should fix that do not make a card unsafe to use: a citation of a
    # superseded run, a claimed ratio the current evidence refutes. They never fail lint, so
    # writing new evidence (skill-run check, run) can never turn a clean knowledge base red.
    warnings: list[SkillRunError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict:
        def rows(xs):
            return [{"path": e.path, "field": e.field, "reason": e.reason} for e in xs]

        return {"ok": self.ok, "checked": self.checked, "errors": rows(self.errors), "warnings": rows(self.warnings)}


# A plausible large GEMM; device keys come from the card's first generation's fact card.
PROBE_SHAPE = {"M": 8192, "N": 8192, "K": 8192, "batch": 64, "tokens": 8192, "experts": 256, "topk": 8,
               "model_dim": 8192, "inter_dim": 8192, "group_size": 128}


def _probe(text: str, env: dict) -> None:
    """Evaluate on the probe env; only a bound violation is a lint error (values may be out of domain)."""
    try:
        expr.evaluate(text, env)
    except expr.BoundExceeded:
        raise
    except expr.ExprError:
        pass


def _err(errors: list[SkillRunError], card_or_path, field: str, reason: str) -> None:
    path = card_or_path.path if isinstance(card_or_path, SkillCard) else card_or_path
    errors.append(SkillRunError(reason, path=str(path), field=field))


def _lint_reference_names(errors: list[SkillRunError], card: SkillCard, refs: dict) -> None:
    """Reference names are what artifacts' ``references`` entries and verdict texts are keyed by:
    unique per device, and every ``production`` name must be one of them."""
    bnames = refs.get("baseline_names") or {}
    for dev in sorted(set(bnames) - set(refs["baseline"])):
        _err(errors, card, f"references.baseline_names.{dev}", f"names a {dev} baseline, but references.baseline has no {dev} entry")
    alts = refs.get("alternatives") or []
    known = set(bnames.values()) | {a["name"] for a in alts}
    if any(dev not in bnames for dev in refs["baseline"]):
        known.add("baseline")
    for dev in ("cuda", "rocm", "cpu"):
        here = ([bnames.get(dev, "baseline")] if dev in refs["baseline"] else []) + \
               [a["name"] for a in alts if a.get("device") in (None, dev)]
        for dup in sorted({n for n in here if here.count(n) > 1}):
            _err(errors, card, "references", f"reference name {dup!r} is used twice on {dev}")
    for i, name in enumerate(refs.get("production") or []):
        if name not in known:
            _err(errors, card, f"references.production.{i}", f"{name!r} is not a reference of this card (known: {sorted(known)})")
    for i, tc in enumerate(refs.get("trace_calls") or []):
        if tc.get("name") not in known:
            _err(errors, card, f"references.trace_calls.{i}.name", f"{tc.get('name')!r} is not a reference of this card (known: {sorted(known)})")


def lint_card(card: SkillCard, index: SkillIndex, evidence: bool = True) -> list[SkillRunError]:
    """Every problem of one card. ``evidence=False`` leaves out the check that the files listed
    under ``validation.artifacts`` exist: those live outside the card (an installed wheel ships
    no kernels/*/results), and a missing one does not make the card unsafe to match with."""
    errors: list[SkillRunError] = []
    regex = card.regex
    bad = check_regex(regex)
    if bad:
        _err(errors, card, "match.profile_signature.op_name_regex", bad)

    for i, fid in enumerate(card.facts):
        if fid not in index.facts:
            _err(errors, card, f"facts.{i}", f"cites fact {fid!r}, which does not exist in facts/")

    refs = card.references
    why = check_module(refs["problem"])
    if why:
        _err(errors, card, "references.problem", why)
    errors += lint_tolerance(str(card.path), card.tolerance, refs["problem"], card.data.get("tolerance_reason"),
                             index.root if evidence else None)
    for field_name, ref in [("references.oracle", refs["oracle"])] + [(f"references.baseline.{k}", v) for k, v in refs["baseline"].items()] + [
        (f"references.alternatives.{i}", a["kernel"]) for i, a in enumerate(refs.get("alternatives", []))
    ]:
        why = check_ref(ref)
        if why:
            _err(errors, card, field_name, why)
    _lint_reference_names(errors, card, refs)

    names = [r.name for r in card.recipes]
    for dup in {n for n in names if names.count(n) > 1}:
        _err(errors, card, "recipes", f"duplicate recipe name {dup!r}")
    if card.data["default_recipe"] not in names:
        _err(errors, card, "default_recipe", f"{card.data['default_recipe']!r} is not one of the recipes {names}")
    vocab = set(SHAPE_KEYS) | set(DEVICE_KEYS)
    probe = {k: PROBE_SHAPE.get(k, 1) for k in SHAPE_KEYS}
    probe.update({k: v for k, v in index.device_facts(card.gens[0] if card.gens else None).items() if k in DEVICE_KEYS})
    for i, r in enumerate(card.recipes):
        try:
            unknown = expr.names(r.when) - vocab
            if unknown:
                _err(errors, card, f"recipes.{i}.when", f"unknown name(s) {sorted(unknown)} in `{r.when}` (known: {sorted(vocab)})")
            else:
                # The same bounded evaluator as matching, on a probe shape: a predicate that blows a
                # bound ((9**64)**64, "x" * N) is refused here rather than at the first real profile.
                _probe(r.when, probe)
        except expr.BoundExceeded as exc:
            _err(errors, card, f"recipes.{i}.when", f"exceeds a safety bound on the probe shape: {exc}")
        except expr.ExprError as exc:
            _err(errors, card, f"recipes.{i}.when", str(exc))
        why = check_ref(r.kernel)
        if why:
            _err(errors, card, f"recipes.{i}.kernel", why)

    # The card's own test cases.
    tests = card.data["tests"]
    if not bad:
        rx = compile_card_regex(regex)
        for i, name in enumerate(tests.get("must_match", [])):
            if not rx.search(name[:MAX_NAME_LEN]):
                _err(errors, card, f"tests.must_match.{i}", f"{name[:120]!r} no longer matches /{regex}/")
        for i, name in enumerate(tests.get("must_not_match", [])):
            if rx.search(name[:MAX_NAME_LEN]):
                _err(errors, card, f"tests.must_not_match.{i}", f"{name[:120]!r} matches /{regex}/ but must not")
    keys = problem_keys(card)
    for i, case in enumerate(tests.get("selects", [])):
        shape = case["shape"]
        if isinstance(shape, list):
            if len(shape) != len(keys):
                _err(errors, card, f"tests.selects.{i}.shape", f"{shape} has {len(shape)} dims; the problem takes {list(keys)}")
                continue
            shape = dict(zip(keys, shape))
        facts = dict(index.device_facts(card.gens[0] if card.gens else None))
        facts.update(case.get("device", {}))
        arch = case.get("device", {}).get("arch") or (card.gens[0] if card.gens else None)
        try:
            sel = select_recipe(card, shape, facts, arch)
        except SkillRunError as exc:
            _err(errors, card, f"tests.selects.{i}", str(exc))
            continue
        if sel.recipe.name != case["recipe"]:
            _err(errors, card, f"tests.selects.{i}", f"shape {shape} selects {sel.recipe.name!r}, expected {case['recipe']!r} ({'; '.join(sel.reasons) or 'first recipe held'})")
        if "untuned" in case and bool(case["untuned"]) != sel.untuned:
            _err(errors, card, f"tests.selects.{i}.untuned", f"shape {shape} untuned={sel.untuned}, expected {case['untuned']}")

    for i, art in enumerate((card.data.get("validation", {}).get("artifacts", []) or []) if evidence else []):
        if not (index.root / art).exists():
            _err(errors, card, f"validation.artifacts.{i}", f"artifact {art!r} does not exist")
    errors += lint_tunable(card)
    return errors


def check_cards(index: SkillIndex) -> SkillIndex:
    """Lint every usable card of ``index``; one with any lint error leaves ``skills`` (reported, not used).

    Matching must never run on a card lint refuses (a regex RE2 rejects, a predicate past the
    bounds, a kernel reference that does not exist), and must never drop it silently either.
    (Whether the evidence files a card lists exist is :func:`lint`'s business alone: see lint_card.)
    """
    for cid, card in list(index.skills.items()):
        errs = lint_card(card, index, evidence=False)
        if errs:
            del index.skills[cid]
            index.reject(card.path, errs)
    index.checked = True
    return index


def lint(index: SkillIndex, validation_dir: Path | None = None) -> LintReport:
    rep = LintReport(errors=list(index.errors))
    for card in index.skills.values():
        rep.errors += lint_card(card, index)
    for fact in index.facts.values():
        for i, fid in enumerate(fact.data.get("facts", []) or []):
            if fid not in index.facts:
                _err(rep.errors, fact.path, f"facts.{i}", f"cites fact {fid!r}, which does not exist")
    vdir = validation_dir or (index.root / "validation")
    n_art = 0
    if vdir.is_dir():
        from skillrun.evidence.index import build_index
        from skillrun.evidence.validation import artifact_files

        # Tuning artifacts (validation/_tuning/) have their own schema; every other file is evidence.
        for path in artifact_files(vdir):
            if is_tuning_artifact(path, vdir):
                n_art += 1
                try:
                    load_tuning_artifact(path)
                except SkillRunError as exc:
                    rep.errors.append(exc)
        ev = build_index(index, [vdir])
        from skillrun.evidence.inventory import counts as evidence_counts

        inv = evidence_counts(ev, vdir)  # the same counts as `report` and the agent's read_validation
        n_art = inv["validation_artifacts"]
        for e in ev.invalid_entries():
            rep.errors.append(SkillRunError(e.error or "not a validation artifact", path=str(e.abs_path)))
        # A card may cite an older run (as history), but should also cite the run that replaced it.
        # A warning, not an error: a new run (skill-run check, run) supersedes cited ones by design.
        from skillrun.evidence.claims import refuted_claims

        for card in index.skills.values():
            cited = [str(a) for a in card.data.get("validation", {}).get("artifacts", []) or []]
            for i, art in enumerate(cited):
                e = ev.find(index.root / art) if art.startswith("validation/") else None
                if e is not None and e.status == "superseded" and e.superseded_by not in cited:
                    _err(rep.warnings, card, f"validation.artifacts.{i}",
                         f"cites {art}, which is superseded by {e.superseded_by}: add `- {e.superseded_by}` "
                         f"to validation.artifacts (keep the older one as history if it is still quoted)")
            for r in refuted_claims(card, ev, problem_keys(card)):
                _err(rep.warnings, card, r.field, r.reason)
    rep.checked = {"skills": max(index.card_files, len(index.skills)), "facts": max(index.fact_files, len(index.facts)),
                   "artifacts": n_art}
    if vdir.is_dir():
        rep.checked.update(e2e_records=inv["e2e_records"], tuning_artifacts=inv["tuning_artifacts"])
    return rep
