"""The pipeline as typed functions: the one interface shared by the CLI, Python users and agent tools.

    ingest_profile -> match -> plan -> execute -> (validation YAML) -> report

Heavy stages (execution, FlyDSL compile checks, torch) are imported lazily so that analysing a
trace works on any machine, GPU or not.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from skillrun.kb.index import SkillIndex
from skillrun.kb.lint import LintReport, lint
from skillrun.kb.paths import set_kb_root
from skillrun.match import match_profile
from skillrun.models import MatchReport, Plan, Profile
from skillrun.plan import make_plan, problem_keys
from skillrun.select import parse_shape

ProgressFn = Callable[[int, int], None]  # (bytes done, bytes total)


def load_index(kb: str | Path | None = None) -> SkillIndex:
    if kb is not None:
        set_kb_root(kb)
    return SkillIndex.load()


def ingest_profile(path: str | Path, arch: str | None = None, progress: ProgressFn | None = None) -> Profile:
    from skillrun.ingest import ingest

    return ingest(path, arch=arch, progress=progress)


def match(profile: Profile, index: SkillIndex, top: int | None = None) -> MatchReport:
    return match_profile(profile, index, top=top)


def plan(profile: Profile, report: MatchReport, index: SkillIndex, shapes: list[dict[str, int]] | None = None) -> Plan:
    return make_plan(profile, report, index, shapes=shapes)


@dataclass
class Analysis:
    profile: Profile
    matches: MatchReport
    plan: Plan

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        prof = self.profile.model_dump(mode="json")
        if top:
            prof["kernels"] = prof["kernels"][:top]
        return {"profile": prof, "matches": self.matches.model_dump(mode="json"), "plan": self.plan.model_dump(mode="json")}


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
    return [s if isinstance(s, dict) else parse_shape(s, keys) for s in shapes]


def lint_kb(index: SkillIndex) -> LintReport:
    return lint(index)


def execute(plan: Plan, index: SkillIndex, **kw: Any) -> list[dict[str, Any]]:
    from skillrun.execute import execute_plan

    return execute_plan(index, plan, **kw)


def run_skill(index: SkillIndex, skill_id: str, shapes: list[str] | list[dict[str, int]], **kw: Any) -> list[dict[str, Any]]:
    from skillrun.execute import run_skill as _run

    card = index.skill(skill_id)
    keys = problem_keys(card)
    parsed = [s if isinstance(s, dict) else parse_shape(s, keys) for s in shapes]
    return _run(index, skill_id, parsed, **kw)


def check(index: SkillIndex, skill_id: str, arch: str | None = None, shapes: list[str] | list[dict[str, int]] | None = None, write: bool = True):
    from skillrun.check import check_skill

    card = index.skill(skill_id)
    keys = problem_keys(card)
    parsed = [s if isinstance(s, dict) else parse_shape(s, keys) for s in shapes] if shapes else None
    return check_skill(index, skill_id, arch=arch, shapes=parsed, write=write)


def load_plan(path: str | Path) -> Plan:
    """A plan as `skill-run plan --json` prints it (or `skill-run --profile F --json`'s "plan")."""
    import json

    from pydantic import ValidationError

    from skillrun.errors import InputError

    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read the plan: {exc.strerror or exc}", path=str(path)) from None
    except ValueError as exc:
        raise InputError(f"the plan is not JSON: {exc}", path=str(path)) from None
    if isinstance(data, dict) and "plan" in data and "items" not in data:
        data = data["plan"]
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
