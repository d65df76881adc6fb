"""The pipeline as typed functions: the one interface shared by the CLI, Python users and agent tools.

    ingest_profile -> match -> plan -> execute -> (validation YAML) -> report

Heavy stages (execution, FlyDSL compile checks, torch) are imported lazily so that analysing a
trace works on any machine, GPU or not.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from skillrun.kb.cards import problem_keys
from skillrun.kb.index import SkillIndex
from skillrun.kb.paths import set_kb_root
from skillrun.lint import LintReport, check_cards, lint
from skillrun.plan.match import match_profile
from skillrun.models import MatchReport, Plan, Profile
from skillrun.options import FLYDSL_ARCHS, check_arch
from skillrun.plan.planner import make_plan
from skillrun.plan.select import check_shape_values, parse_shape

if TYPE_CHECKING:
    from skillrun.evidence.index import EvidenceIndex

ProgressFn = Callable[[int, int], None]  # (bytes done, bytes total)


def load_index(kb: str | Path | None = None, check: bool = True) -> SkillIndex:
    """The knowledge base; with ``check`` every card is linted and a failing one is left out of
    matching and listed in ``index.problems`` (match and plan reports carry them as ``card_problems``)."""
    if kb is not None:
        set_kb_root(kb)
    index = SkillIndex.load()
    return check_cards(index) if check else index


def ingest_profile(path: str | Path, arch: str | None = None, progress: ProgressFn | None = None) -> Profile:
    """The trace as a :class:`Profile`; a trace with no GPU kernel execution is an InputError (exit 3)."""
    from skillrun.ingest import ingest, require_kernels

    return require_kernels(ingest(path, arch=check_arch(arch), progress=progress))


def match(profile: Profile, index: SkillIndex, top: int | None = None) -> MatchReport:
    return match_profile(profile, index, top=top)


def plan(profile: Profile, report: MatchReport, index: SkillIndex, shapes: list[dict[str, int]] | None = None,
         evidence: "EvidenceIndex | None | bool" = True) -> Plan:
    """Plan items for the matches; ``evidence=True`` (default) quotes the KB's current measurements, False the card priors only."""
    if evidence is True:
        evidence = _kb_evidence(index) if report.matches else None
    out = make_plan(profile, report, index, shapes=shapes, evidence=evidence or None)
    out.card_problems = list(report.card_problems)
    return out


def _kb_evidence(index: SkillIndex) -> "EvidenceIndex | None":
    from skillrun.errors import SkillRunError
    from skillrun.evidence.index import build_index

    if not (index.root / "validation").is_dir():
        return None
    try:
        return build_index(index)
    except SkillRunError:
        return None


@dataclass
class Analysis:
    profile: Profile
    matches: MatchReport
    plan: Plan

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        prof = self.profile.model_dump(mode="json")
        if top:
            prof["kernels"] = prof["kernels"][:top]
        return {"profile": prof, "hot_kernels": hot_kernels(self.profile, top),
                "matches": self.matches.model_dump(mode="json"), "plan": self.plan.model_dump(mode="json")}


def hot_kernels(profile: Profile, top: int | None = 20) -> dict[str, Any]:
    """The hot-kernel table as data: per kernel op, shape, dtype, calls, mean/min/max, achieved
    throughput vs the device peak, category; GPU time by category; per-device totals and idle time."""
    from skillrun.analysis.hot_table import hot_kernels as _hot

    return _hot(profile, top)


def compare_profiles(a: Profile, b: Profile, by: str = "kernel") -> dict[str, Any]:
    """Trace B against trace A per (kernel, launching op, shape, dtype): time, calls, time per call
    and rate in each, their deltas, and the rows that appeared or disappeared (`skill-run kernels A B`);
    ``by="op"`` pairs (op, shape, dtype) rows across kernel names (two vendors, one model)."""
    from skillrun.analysis.trace_diff import compare

    return compare(a, b, by=by)


def doctor(flydsl_timeout_s: float = 120.0) -> dict[str, Any]:
    """What this machine can do: device, library versions, FlyDSL compile targets, references."""
    from skillrun.doctor import diagnose

    return diagnose(flydsl_timeout_s=flydsl_timeout_s)


def analyze(path: str | Path, *, index: SkillIndex, arch: str | None = None, top: int | None = 20,
            shapes: list[str] | list[dict[str, int]] | None = None, progress: ProgressFn | None = None) -> Analysis:
    """Ingest + match + plan (CPU only): what `skill-run --profile FILE` prints."""
    profile = ingest_profile(path, arch=arch, progress=progress)
    report = match(profile, index, top=top)
    parsed = parse_shapes_for(report, index, shapes)
    return Analysis(profile=profile, matches=report, plan=plan(profile, report, index, shapes=parsed))


def parse_shapes_for(report: MatchReport, index: SkillIndex, shapes) -> list[dict[str, int]] | None:
    """--shape strings are read in the key order of the matched card's problem (M,N,K unless it says otherwise)."""
    if not shapes:
        return None
    keys = ("M", "N", "K")
    if report.matches:
        keys = problem_keys(index.skill(report.matches[0].skill_id))
    return [check_shape_values(dict(s)) if isinstance(s, dict) else parse_shape(s, keys) for s in shapes]


def evidence(index: SkillIndex, paths: list[str | Path] | None = None) -> "EvidenceIndex":
    """The evidence index over validation artifacts: current / superseded / stale per (card, recipe, shape, device class, mode)."""
    from skillrun.evidence.index import build_index

    return build_index(index, [Path(p) for p in paths] if paths else None)


def list_cards(index: SkillIndex) -> list[dict[str, Any]]:
    """One row per card for `skill-run list`, the agent's list_skills and MCP: the validation status
    is computed from the evidence (skillrun.evidence.index.card_status, the function `report` and the
    README read too); what the card declares is kept as ``validation_declared``."""
    from skillrun.evidence.index import card_status

    ev = _kb_evidence(index)
    rows = []
    for c in index.skills.values():
        declared = str(c.data.get("validation", {}).get("status") or "unvalidated")
        status, why = ev.card_status(c.id) if ev is not None else card_status(c.id, declared, None)
        rows.append({"id": c.id, "title": c.data.get("title"), "gens": list(c.gens), "operator": c.match.get("operator"),
                     "from_backend": c.match.get("from_backend"), "to_backend": c.match.get("to_backend"),
                     "recipes": [r.name for r in c.recipes], "validation": status, "validation_declared": declared,
                     "validation_note": why or None})
    return rows


def lint_kb(index: SkillIndex) -> LintReport:
    return lint(index)


def execute(plan: Plan, index: SkillIndex, **kw: Any) -> list[dict[str, Any]]:
    from skillrun.execute import execute_plan

    return execute_plan(index, plan, **kw)


def run_skill(index: SkillIndex, skill_id: str, shapes: list[str] | list[dict[str, int]], **kw: Any) -> list[dict[str, Any]]:
    from skillrun.execute import run_skill as _run

    card = index.skill(skill_id)
    keys = problem_keys(card)
    parsed = [check_shape_values(dict(s)) if isinstance(s, dict) else parse_shape(s, keys) for s in shapes]
    return _run(index, skill_id, parsed, **kw)


def check(index: SkillIndex, skill_id: str, arch: str | None = None, shapes: list[str] | list[dict[str, int]] | None = None, write: bool = True):
    from skillrun.check import check_skill
    from skillrun.errors import UsageError

    card = index.skill(skill_id)
    # `check` compiles FlyDSL for AMD targets without a GPU; anything else is a usage error that
    # says what `check` takes and what to use instead.
    if str(card.match.get("to_backend")) != "flydsl":
        flydsl = sorted(c.id for c in index.skills.values() if str(c.match.get("to_backend")) == "flydsl")
        raise UsageError(f"card {card.id} ports to {card.match.get('to_backend')}, not FlyDSL; check compiles FlyDSL cards only",
                         field="skill_id", hint=f"FlyDSL cards: {', '.join(flydsl)}; for {card.id} use "
                         f"`skill-run run {card.id} --shape M,N,K --backend cpu` (numerics) or a GPU")
    arch = check_arch(arch, FLYDSL_ARCHS, why="check compiles FlyDSL for AMD targets only; ")
    keys = problem_keys(card)
    parsed = [s if isinstance(s, dict) else parse_shape(s, keys) for s in shapes] if shapes else None
    return check_skill(index, skill_id, arch=arch, shapes=parsed, write=write)


def tune(index: SkillIndex, skill_id: str | None = None, shapes: list[str] | list[dict[str, int]] | None = None, *,
         from_plan: str | Path | None = None, **kw: Any) -> list[dict[str, Any]]:
    """Sweep a recipe's tunable space for each shape (or every UNTUNED item of ``from_plan``'s plan).

    One record per shape: the tuning artifact's content plus ``artifact`` (path) and ``diff`` (the
    proposed SKILL.md change, or None). Options: see :func:`skillrun.tune.sweep.tune_shape`
    (timer, rounds, top, workers, ray_address, compile_only, arch, start_from, apply, ...).
    """
    from skillrun.errors import UsageError
    from skillrun.tune.sweep import tune_shape

    if from_plan is not None:
        if skill_id or shapes:
            raise UsageError("--from-plan takes the cards and shapes from the trace's plan; drop SKILL/--shape", field="from_plan")
        return tune_from_plan(index, from_plan, **kw)
    if not skill_id or not shapes:
        raise UsageError("tune needs SKILL and at least one --shape (or --from-plan TRACE)", field="shape")
    keys = problem_keys(index.skill(skill_id))
    parsed = [check_shape_values(dict(s)) if isinstance(s, dict) else parse_shape(s, keys) for s in shapes]
    return [tune_shape(index, skill_id, s, **kw) for s in parsed]


def tune_from_plan(index: SkillIndex, trace: str | Path, *, arch: str | None = None, **kw: Any) -> list[dict[str, Any]]:
    """Tune every UNTUNED item of the trace's plan; an item that cannot be tuned is its own error row."""
    from skillrun.errors import SkillRunError
    from skillrun.tune.sweep import tune_shape

    an = analyze(trace, index=index, arch=arch, top=None)
    out = []
    seen = set()
    for item in an.plan.items:
        if not item.untuned or not item.shape:
            continue
        key = (item.skill_id, tuple(sorted(item.shape.items())))
        if key in seen:
            continue
        seen.add(key)
        try:
            out.append(tune_shape(index, item.skill_id, dict(item.shape), arch=arch, **kw))
        except SkillRunError as exc:
            out.append({"card": {"id": item.skill_id}, "shape": item.shape, "verdict": "error", "reason": str(exc), "artifact": None})
    return out


def ablate(index: SkillIndex, skill_id: str, shape: str | dict[str, int], sets: list[str] | dict[str, Any],
           **kw: Any) -> dict[str, Any]:
    """Same-session A/B of a recipe against itself with ``sets`` (knob=value) changed: is the lever load-bearing?"""
    from skillrun.tune.ablate import ablate_shape

    parsed = shape if isinstance(shape, dict) else parse_shape(shape, problem_keys(index.skill(skill_id)))
    return ablate_shape(index, skill_id, parsed, sets, **kw)


def load_plan(path: str | Path) -> Plan:
    """A plan as `skill-run plan --json` prints it (or `skill-run --profile F --json`'s "plan").

    `plan --json` is the plan model with the trace's path named ``source`` (the name it has in every
    printed document) and a ``schema_version``; the model calls it ``profile``. Both spellings are
    read here, and nowhere else, so a saved `plan --json` goes straight to `skill-run e2e --plan`.
    """
    import json

    from pydantic import ValidationError

    from skillrun.errors import InputError
    from skillrun.models import JSON_SCHEMA_VERSION

    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read the plan: {exc.strerror or exc}", path=str(path)) from None
    except ValueError as exc:
        raise InputError(f"the plan is not JSON: {exc}", path=str(path)) from None
    if isinstance(data, dict) and "plan" in data and "items" not in data:
        data = data["plan"]  # `skill-run --profile F --json`: the plan is one key of the analysis
    if isinstance(data, dict):
        data = dict(data)
        version = data.pop("schema_version", JSON_SCHEMA_VERSION)
        if version != JSON_SCHEMA_VERSION:
            raise InputError(f"the plan's schema_version is {version!r}; this runner reads {JSON_SCHEMA_VERSION}",
                             path=str(path), field="schema_version", hint="write the plan again with this skill-run")
        if "source" in data and "profile" not in data:
            data["profile"] = data.pop("source")
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(f"not a plan: {first['msg']}", path=str(path), field="/".join(str(p) for p in first["loc"])) from None


def e2e(command: list[str], *, index: SkillIndex, plan: Plan | None = None, plan_file: str | Path | None = None,
        profile: str | Path | None = None, arch: str | None = None, shapes: list[str] | list[dict[str, int]] | None = None,
        backend: str | None = None, alternations: int = 5, skip_steps: int = 1, check: str | None = None,
        gpu_time: bool | None = None, timeout: float | None = None, write: bool = True,
        command_line: str | None = None, progress: Callable[[str], None] | None = None,
        include_slower: bool = False) -> dict[str, Any]:
    """Rerun a workload as-is and with the planned ports routed in; the e2e record (written unless write=False).

    The plan comes from exactly one of ``plan``, ``plan_file`` (JSON) or ``profile`` (a trace, analysed
    like ``skill-run --profile``, ``shapes`` filling what the trace cannot give). Items whose card expects a
    slowdown are left out unless ``include_slower``.
    """
    from skillrun.e2e.run import run_e2e
    from skillrun.errors import UsageError

    given = [x is not None for x in (plan, plan_file, profile)]
    if sum(given) != 1:
        raise UsageError("give exactly one of --profile TRACE or --plan PLAN.json", field="--profile")
    source = None
    if plan_file is not None:
        plan, source = load_plan(plan_file), str(plan_file)
    elif profile is not None:
        plan, source = analyze(profile, index=index, arch=arch, shapes=shapes).plan, str(profile)
    return run_e2e(list(command), plan, index, backend=backend, alternations=alternations, skip_steps=skip_steps,
                   check_cmd=check, gpu_time=gpu_time, timeout=timeout, plan_source=source, command_line=command_line,
                   write=write, progress=progress, include_slower=include_slower)
