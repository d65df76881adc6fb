"""`skill-run lint`: every card, fact and validation artifact checked; each error names file, field, reason."""
from __future__ import annotations

import re
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from skillrun.errors import SkillRunError
from skillrun.kb import expr
from skillrun.kb.cards import SkillCard
from skillrun.kb.index import SkillIndex
from skillrun.kb.tunable import lint_tunable
from skillrun.models import DEVICE_KEYS, SHAPE_KEYS
from skillrun.names import MAX_NAME_LEN
from skillrun.refs import check_module, check_ref
from skillrun.select import select_recipe
from skillrun.tune.artifact import is_tuning_artifact, load_tuning_artifact

# Inputs that make backtracking regexes explode ((a+)+b style): long runs of kernel-name characters
# with no terminating match. A sound card regex handles each in well under a millisecond.
_ADVERSARIAL = ["a" * 3000 + "!", "_" * 3000 + "!", "kernel_" * 500 + "!", "<" * 1000 + "x" * 1000, "0u, " * 800 + "!"]
REGEX_BUDGET_S = 0.5


@dataclass
class LintReport:
    errors: list[SkillRunError] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict:
        return {"ok": self.ok, "checked": self.checked, "errors": [{"path": e.path, "field": e.field, "reason": e.reason} for e in self.errors]}


class _Slow(Exception):
    pass


@contextmanager
def _time_limit(seconds: float):
    # SIGALRM interrupts the regex engine between bytecodes (Python's re releases to signal handlers),
    # so a catastrophic pattern is cut off instead of hanging lint. Main thread only.
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise _Slow()

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check_regex(pattern: str) -> str | None:
    """None if the pattern compiles and stays fast on adversarial inputs; else the reason."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        return f"invalid regex: {exc}"
    try:
        with _time_limit(REGEX_BUDGET_S):
            for s in _ADVERSARIAL:
                rx.search(s[:MAX_NAME_LEN])
    except _Slow:
        return f"regex is catastrophic (backtracking took over {REGEX_BUDGET_S}s on a {len(s)}-character name)"
    return None


def _err(errors: list[SkillRunError], card_or_path, field: str, reason: str) -> None:
    path = card_or_path.path if isinstance(card_or_path, SkillCard) else card_or_path
    errors.append(SkillRunError(reason, path=str(path), field=field))


def lint_card(card: SkillCard, index: SkillIndex) -> list[SkillRunError]:
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
    for field_name, ref in [("references.oracle", refs["oracle"])] + [(f"references.baseline.{k}", v) for k, v in refs["baseline"].items()] + [
        (f"references.alternatives.{i}", a["kernel"]) for i, a in enumerate(refs.get("alternatives", []))
    ]:
        why = check_ref(ref)
        if why:
            _err(errors, card, field_name, why)

    names = [r.name for r in card.recipes]
    for dup in {n for n in names if names.count(n) > 1}:
        _err(errors, card, "recipes", f"duplicate recipe name {dup!r}")
    if card.data["default_recipe"] not in names:
        _err(errors, card, "default_recipe", f"{card.data['default_recipe']!r} is not one of the recipes {names}")
    vocab = set(SHAPE_KEYS) | set(DEVICE_KEYS)
    for i, r in enumerate(card.recipes):
        try:
            unknown = expr.names(r.when) - vocab
            if unknown:
                _err(errors, card, f"recipes.{i}.when", f"unknown name(s) {sorted(unknown)} in `{r.when}` (known: {sorted(vocab)})")
        except expr.ExprError as exc:
            _err(errors, card, f"recipes.{i}.when", str(exc))
        why = check_ref(r.kernel)
        if why:
            _err(errors, card, f"recipes.{i}.kernel", why)

    # The card's own test cases.
    tests = card.data["tests"]
    if not bad:
        rx = re.compile(regex)
        for i, name in enumerate(tests.get("must_match", [])):
            if not rx.search(name[:MAX_NAME_LEN]):
                _err(errors, card, f"tests.must_match.{i}", f"{name[:120]!r} no longer matches /{regex}/")
        for i, name in enumerate(tests.get("must_not_match", [])):
            if rx.search(name[:MAX_NAME_LEN]):
                _err(errors, card, f"tests.must_not_match.{i}", f"{name[:120]!r} matches /{regex}/ but must not")
    from skillrun.plan import problem_keys

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

    for i, art in enumerate(card.data.get("validation", {}).get("artifacts", []) or []):
        if not (index.root / art).exists():
            _err(errors, card, f"validation.artifacts.{i}", f"artifact {art!r} does not exist")
    errors += lint_tunable(card)
    return errors


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
        from skillrun.validation import load_artifact

        for path in sorted(vdir.rglob("*.yaml")):
            n_art += 1
            try:
                if is_tuning_artifact(path, vdir):
                    load_tuning_artifact(path)
                    continue
                load_artifact(path)
            except SkillRunError as exc:
                rep.errors.append(exc)
    rep.checked = {"skills": len(index.skills), "facts": len(index.facts), "artifacts": n_art}
    return rep
