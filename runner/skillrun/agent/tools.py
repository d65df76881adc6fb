"""The agent's tools: thin wrappers over :mod:`skillrun.api` with typed arguments and JSON results.

Each tool is a :class:`ToolSpec` (name, description, pydantic argument model, implementation).
:func:`build_tools` turns them into LangChain ``StructuredTool`` objects; the MCP server exposes the
same specs. Whatever goes wrong, a tool returns ``{"ok": false, "error": ..., "hint": ...}`` as its
result: the agent loop never sees an exception.

There is deliberately no shell tool and no generic file reader: tools read the knowledge base and
the paths the user allowed, and write only what the runner writes (validation artifacts through
its own writer, full analyses under ``validation/_analysis/``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from pydantic import BaseModel, ValidationError

from skillrun import api
from skillrun.agent import schemas as S
from skillrun.agent.results import MAX_CHARS, UNTRUSTED_NOTE, dumps, error_result, fit, ok, write_analysis_json
from skillrun.agent.safety import PathGuard, scrub
from skillrun.errors import SkillRunError, UsageError
from skillrun.kb.index import SkillIndex
from skillrun.io.regular_files import read_regular
from skillrun.kb.cards import problem_keys
from skillrun.plan.select import parse_shape

BODY_PREVIEW = 2500  # card/fact body characters shown before pointing at sections


def detect_gpu() -> Optional[str]:
    """Name of the CUDA/ROCm device torch sees, or None. torch is imported only when asked."""
    try:
        import torch
    except Exception:  # noqa: BLE001 - torch absent or broken means no usable GPU here
        return None
    try:
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a broken driver is "no GPU" for our purposes
        return None
    return None


@dataclass
class ToolSpec:
    name: str
    description: str
    args_schema: type[BaseModel]
    impl: Callable[..., dict[str, Any]]
    max_chars: int = MAX_CHARS

    def run(self, **kwargs: Any) -> dict[str, Any]:
        """Validate, run, scrub and bound the result; every failure becomes an error result."""
        try:
            args = self.args_schema.model_validate(kwargs)
        except ValidationError as exc:
            return validation_error_result(exc, self.name)
        try:
            result = self.impl(args)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the agent loop must survive anything a tool does
            result = error_result(exc, self.name)
        # The untrusted-data marking is outside the size budget: cutting a result never drops it.
        note = result.pop("untrusted_data", None)
        out = fit(result, self.max_chars, pointer=result.get("full_result"))
        if note:
            out["untrusted_data"] = note
        return out

    def __call__(self, **kwargs: Any) -> str:
        return dumps(self.run(**kwargs))


def validation_error_result(exc: ValidationError, tool: str) -> dict[str, Any]:
    problems = []
    for e in exc.errors():
        field = ".".join(str(p) for p in e.get("loc", ())) or "(arguments)"
        msg = e.get("msg", "invalid").removeprefix("Value error, ")
        problems.append(f"{field}: {msg}")
    return scrub({"ok": False, "error": f"bad arguments for {tool}: " + "; ".join(problems),
                  "hint": "fix the arguments to match the tool's schema and call it again"})


# --------------------------------------------------------------------------- markdown helpers
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _sections(body: str) -> list[tuple[int, str, int, int]]:
    """(level, title, start, end) character spans of each markdown section, outside code fences."""
    heads: list[tuple[int, str, int]] = []
    pos, fenced = 0, False
    for line in body.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else _HEADING.match(line.rstrip("\n"))
        if m:
            heads.append((len(m.group(1)), m.group(2), pos))
        pos += len(line)
    spans = []
    for i, (level, title, start) in enumerate(heads):
        end = len(body)
        for lvl2, _, s2 in heads[i + 1:]:
            if lvl2 <= level:
                end = s2
                break
        spans.append((level, title, start, end))
    return spans


def body_view(body: str, section: Optional[str], where: str) -> dict[str, Any]:
    spans = _sections(body)
    outline = [("  " * (lvl - 1)) + title for lvl, title, _, _ in spans]
    if section:
        want = section.strip().lstrip("#").strip().lower()
        hits = [s for s in spans if s[1].lower() == want] or [s for s in spans if want in s[1].lower()]
        if not hits:
            raise UsageError(f"no section {section!r} in {where}", field="section",
                             hint="sections: " + "; ".join(t for _, t, _, _ in spans) if spans else "the body has no headings")
        _, title, start, end = hits[0]
        return {"section": title, "text": body[start:end].strip()}
    if len(body) <= BODY_PREVIEW:
        return {"body": body.strip()}
    return {"body_preview": body[:BODY_PREVIEW].rstrip() + " …", "body_chars": len(body), "outline": outline,
            "more": f"call again with section=<one of the outline headings> to read the rest of {where}"}


# --------------------------------------------------------------------------- the tools
class AgentTools:
    """State shared by the tools: the knowledge base, the read allow-list and the GPU probe."""

    def __init__(self, index: SkillIndex | None = None, allowed_paths: Iterable[str | Path] = (),
                 gpu_probe: Callable[[], Optional[str]] | None = None, max_chars: int = MAX_CHARS):
        self.index = index if index is not None else api.load_index()
        self.guard = PathGuard(self.index.root, allowed_paths)
        self.gpu_probe = gpu_probe or detect_gpu
        self.max_chars = max_chars

    @property
    def validation_root(self) -> Path:
        return self.index.root / "validation"

    def _rel(self, path: Path) -> str:
        try:
            return str(path.resolve().relative_to(self.index.root))
        except ValueError:
            return str(path)

    def _shapes(self, skill_id: str, shapes: list[str]) -> list[dict[str, int]]:
        keys = problem_keys(self.index.skill(skill_id))
        return [parse_shape(s, keys) for s in shapes]

    # ---- knowledge base
    def list_skills(self, a: S.ListSkillsArgs) -> dict[str, Any]:
        rows = [r for r in api.list_cards(self.index)
                if (not a.gen or a.gen in r["gens"]) and (not a.to_backend or r["to_backend"] == a.to_backend)]
        facts = [{"id": f.id, "title": f.data.get("title")} for f in self.index.facts.values()]
        out = ok(skills=rows, facts=facts)
        if self.index.errors:
            out["load_problems"] = f"{len(self.index.errors)} card/fact files failed to load (run `skill-run lint`)"
        return out

    def show_skill(self, a: S.ShowSkillArgs) -> dict[str, Any]:
        card = self.index.skill(a.skill_id)
        view = body_view(card.body, a.section, f"skill {card.id}")
        if a.section:
            return ok(id=card.id, title=card.data.get("title"), **view)
        front = {k: v for k, v in card.data.items() if k != "id"}
        return ok(id=card.id, path=self._rel(card.path), front_matter=front, **view)

    def read_fact(self, a: S.ReadFactArgs) -> dict[str, Any]:
        fact = self.index.fact(a.fact_id)
        front = {k: v for k, v in fact.data.items() if k != "id"}
        return ok(id=fact.id, path=self._rel(fact.path), front_matter=front, **body_view(fact.body, None, f"fact {fact.id}"))

    # ---- profile → plan
    def analyze_profile(self, a: S.AnalyzeProfileArgs) -> dict[str, Any]:
        with self.guard.opened(a.path, "path") as (pinned, path):
            if path.is_dir():
                raise UsageError(f"{path} is a folder; pass one trace file", field="path")
            # Read through the verified descriptor: a folder swapped for a symlink after the check
            # cannot send the reader elsewhere.
            analysis = api.analyze(pinned, index=self.index, arch=a.arch, top=a.top, shapes=a.shapes or None)
        analysis.profile.source = str(path)
        if getattr(analysis.plan, "profile", None) == str(pinned):
            analysis.plan.profile = str(path)
        # Commands the analysis wrote for the user name the file as the user gave it, not the pinned descriptor.
        nm = analysis.matches.coverage.no_match if analysis.matches.coverage is not None else None
        if nm is not None:
            nm.reason, nm.next = nm.reason.replace(str(pinned), str(path)), nm.next.replace(str(pinned), str(path))
        for it in analysis.plan.items:
            if it.next_command:
                it.next_command = it.next_command.replace(str(pinned), str(path))
        summary = summarize_analysis(analysis, a.top)
        full = analysis.to_json(top=None)
        # An analysis is read-only: it writes into the knowledge base only when asked.
        if len(dumps(full)) > self.max_chars and not a.save_full:
            summary["full_result_not_saved"] = ("the summary above is cut to fit; call again with save_full=true to write "
                                                "the full analysis under validation/_analysis/ and get its path")
        elif len(dumps(full)) > self.max_chars:
            try:
                saved = write_analysis_json(full, self.validation_root, Path(path.name).stem)
                summary["full_result"] = self._rel(saved)
            except OSError as exc:  # a read-only install: the summary still stands
                summary["full_result_not_saved"] = f"could not write under validation/_analysis: {exc.strerror or exc}"
        return summary

    # ---- execution
    def run_skill(self, a: S.RunSkillArgs) -> dict[str, Any]:
        self.index.skill(a.skill_id)
        shapes = self._shapes(a.skill_id, a.shapes)
        if a.backend != "cpu":
            device = self.gpu_probe()
            if not device:
                return {"ok": False,
                        "error": "no GPU device is present on this machine, so run_skill cannot time or validate the port here",
                        "hint": f"call check_skill(skill_id={a.skill_id!r}) for FlyDSL compile-only gates, or "
                                "run_skill with backend='cpu' to check numerics of CPU-runnable ports on small shapes "
                                "(no timing, no speedup); report either as what it is, not as a measured speedup",
                        "alternatives": ["check_skill", "run_skill(backend='cpu')"]}
        results = api.run_skill(self.index, a.skill_id, shapes, backend=a.backend, seeds=a.seeds, write=a.write)
        artifacts = [self._rel(Path(r["artifact"])) for r in results if r.get("artifact")]
        rows = [_result_row(r) for r in results]
        return ok(results=rows, artifacts=artifacts,
                  note="speedups come only from these results; cpu_numerics and compile_only rows carry no speedup")

    def check_skill(self, a: S.CheckSkillArgs) -> dict[str, Any]:
        self.index.skill(a.skill_id)
        shapes = self._shapes(a.skill_id, a.shapes) if a.shapes else None
        rep = api.check(self.index, a.skill_id, arch=a.arch, shapes=shapes, write=a.write)
        data = rep.to_json() if hasattr(rep, "to_json") else rep
        if not isinstance(data, dict):
            data = {"report": data}
        passed = bool(data.get("passed", False))  # the check report's own key (CheckReport.to_json)
        out = {"ok": True, "passed": passed, "kind": "compile_only (no kernel ran; no timing)", "report": data}
        arts = data.get("artifacts") or ([data["artifact"]] if data.get("artifact") else [])
        if arts:
            out["artifacts"] = [self._rel(Path(p)) for p in arts]
        return out

    # ---- evidence
    def read_validation(self, a: S.ReadValidationArgs) -> dict[str, Any]:
        if a.path is None:
            return self._list_artifacts(self.validation_root, a.skill_id, a.limit)
        with self.guard.opened(a.path, "path") as (pinned, path):
            if path.is_dir():
                return self._list_artifacts(path, a.skill_id, a.limit)
            return self._read_one(pinned, path)

    def _read_one(self, pinned: Path, path: Path) -> dict[str, Any]:
        """One saved analysis or artifact, read through ``pinned`` (the verified open file)."""
        # Only analyses this tool set saved are read as JSON: read_validation is not a general file reader.
        if path.suffix == ".json" and path.parent.name == "_analysis":
            try:
                data = json.loads(read_regular(pinned, 64 << 20, "saved analysis"))
            except (OSError, ValueError, SkillRunError) as exc:
                raise SkillRunError(f"cannot read saved analysis: {exc}", path=str(path)) from None
            return ok(path=self._rel(path), kind="saved analysis (not a validation artifact)", data=data,
                      full_result=self._rel(path))
        if path.suffix not in (".yaml", ".yml"):
            raise UsageError(f"{path.name} is not a validation artifact (.yaml) or a saved analysis (validation/_analysis/*.json)", field="path")
        from skillrun.evidence.validation import load_artifact

        if "_tuning" in path.parts:  # tuning / ablation / compile-prune artifacts have their own schema
            from skillrun.evidence.tuning_artifact import load_tuning_artifact

            return ok(path=self._rel(path), artifact=load_tuning_artifact(pinned), full_result=self._rel(path),
                      untrusted_data=UNTRUSTED_NOTE)
        record = load_artifact(pinned)
        return ok(path=self._rel(path), artifact=record, full_result=self._rel(path), untrusted_data=UNTRUSTED_NOTE)

    def _list_artifacts(self, folder: Path, skill_id: Optional[str], limit: int) -> dict[str, Any]:
        if skill_id:
            self.index.skill(skill_id)
        files = [p for p in folder.rglob("*.yaml") if "_analysis" not in p.parts and not p.name.startswith(".")]
        if skill_id:
            files = [p for p in files if p.parent.name == skill_id]
        # Names start with the UTC creation stamp, so name order is age order across card folders.
        files.sort(key=lambda p: p.name, reverse=True)
        # The evidence index says which artifact of each (card, recipe, shape, device, mode) is current
        # and which are superseded or stale, so the model does not quote an outdated run.
        from skillrun.evidence.index import build_index

        ev = build_index(self.index, files[:limit]) if files else None
        rows = []
        for p in files[:limit]:
            e = ev.find(p) if ev else None
            if e is None or e.status in ("invalid", "untrusted"):
                rows.append({"path": self._rel(p), "unreadable": (e.error if e else "not indexed") or "unreadable"})
                continue
            row = _artifact_row(e.record, self._rel(p))
            # The verdict as the report shows it (one vocabulary: a ratio inside the noise reads
            # within_noise even where an older file says slower); the file's word is kept beside it.
            row.update(status=e.status, stale=e.stale, stale_reasons=e.stale_reasons, superseded_by=e.superseded_by,
                       verdict=e.summary.verdict, recorded_verdict=e.summary.recorded_verdict,
                       verdict_text=e.summary.verdict_text, noise_pct=e.summary.noise_pct, versus=e.summary.versus)
            rows.append(row)
        # counted as `report` and `lint` count them: validation artifacts, e2e records, tuning artifacts
        from skillrun.evidence.inventory import counts as evidence_counts

        counts = evidence_counts(build_index(self.index, [folder]), folder) if files and not skill_id else None
        return ok(folder=self._rel(folder), total=len(files), counts=counts, shown=len(rows), artifacts=rows,
                  hint=("read one with read_validation(path=...); quote only status=current, stale=false rows as evidence"
                        if rows else "no validation artifacts yet"))


def _result_row(r: Any) -> Any:
    """A run result as the model should see it: every field kept, long number series replaced by their count."""
    if isinstance(r, dict):
        return {k: _result_row(v) for k, v in r.items()}
    if isinstance(r, list):
        if len(r) > 16 and all(isinstance(v, (int, float)) for v in r):
            return f"{len(r)} values (in the artifact)"
        return [_result_row(v) for v in r]
    return r


def _artifact_row(rec: dict[str, Any], path: str) -> dict[str, Any]:
    card = rec.get("card") or {}
    recipe = rec.get("recipe") or {}
    dev = rec.get("device") or {}
    return {"path": path, "created": rec.get("created"), "card": card.get("id") if isinstance(card, dict) else card,
            "recipe": recipe.get("name") if isinstance(recipe, dict) else recipe, "shape": rec.get("shape"),
            "mode": rec.get("mode") or rec.get("kind"), "verdict": rec.get("verdict"), "speedup": rec.get("speedup"),
            "device": dev.get("name") if isinstance(dev, dict) else dev, "reason": rec.get("reason")}


def summarize_analysis(a: "api.Analysis", top: int) -> dict[str, Any]:
    """What a model needs from an analysis: the hot kernels, the matches with reasons, the plan."""
    p = a.profile
    kernels = []
    for rank, k in enumerate(p.kernels[:top], 1):
        ops = [{"op": o.op, "shape": o.shape, "dtype": o.dtype, "scale_recipe": o.scale_recipe, "calls": o.calls,
                "provenance": o.provenance} for o in k.ops[:3]]
        row = {"rank": rank, "kernel": k.name[:200], "pct_gpu": round(k.pct_gpu, 3), "total_ms": round(k.total_us / 1e3, 4),
               "calls": k.calls, "category": k.category, "shape_provenance": k.shape_provenance, "ops": ops}
        if k.category == "communication":
            row["note"] = "a collective (NCCL/RCCL): not offered to skill cards"
        if len(k.ops) > 3:
            row["more_ops"] = len(k.ops) - 3
        if k.graph_replayed_calls:
            row["graph_replayed_calls"] = k.graph_replayed_calls
        kernels.append(row)

    def _match(m, only_failed: bool) -> dict[str, Any]:
        tag = {"passed": "PASS", "failed": "FAIL", "not_checked": "NOT CHECKED"}
        crit = [f"{tag[c.status]} {c.name}: {c.reason}" for c in m.criteria if not (only_failed and c.passed is not False)]
        return {"skill_id": m.skill_id, "kernel": m.kernel[:200], "pct_gpu": round(m.pct_gpu, 3), "criteria": crit}

    plan = []
    for it in a.plan.items:
        plan.append({"skill_id": it.skill_id, "kernel": it.kernel[:160], "pct_gpu": round(it.pct_gpu, 3), "shape": it.shape,
                     "shape_provenance": it.shape_provenance, "dtype": it.dtype, "recipe": it.recipe, "untuned": it.untuned,
                     "backend": it.backend, "kernel_ref": it.kernel_ref, "status": it.status,
                     "expected_speedup": it.expected_speedup, "expected_source": it.expected_source,
                     "evidence": ({k: it.evidence.get(k) for k in ("path", "age", "speedup", "versus", "noise_pct", "speed",
                                                                    "verdict", "device", "commit")} if it.evidence else None),
                     "lever_measured_on": it.lever_measured_on, "next_command": it.next_command,
                     "projected_e2e_gain_pct_if_expected_holds": it.projected_e2e_gain_pct,
                     "wrong_results": it.wrong_results,
                     "trace_call": ({k: it.trace_call.get(k) for k in ("reference", "description")} if it.trace_call else None),
                     "versus_trace_call": it.versus_trace_call,
                     "notes": it.notes})
    matched = sorted({m.skill_id for m in a.matches.matches})
    cov = a.matches.coverage
    no_match = cov.no_match if cov is not None else None
    if matched:
        nxt = (f"show_skill({matched[0]!r}); then check_skill for a FlyDSL card or run_skill on a GPU for its shapes; "
               "then read_validation for the evidence")
    elif no_match is not None:
        nxt = f"no card matched: {no_match.reason}. Tell the user; what they can do: {no_match.next}"
    else:
        nxt = "no card matched; look at near_misses and coverage for what is missing (often --arch or a shape) and tell the user"
    from rich.text import Text

    from skillrun.plan.planner import answer_line

    # The CLI's first line, word for word (without its colours): the same reasons reach every caller.
    answer = Text.from_markup(answer_line(a.plan, len(matched), str(p.source))).plain
    return ok(
        answer=answer,
        no_match=no_match.model_dump() if no_match is not None else None,
        untrusted_data=UNTRUSTED_NOTE,
        profile={"file": Path(p.source).name, "format": p.format, "arch": p.arch,
                 "devices": [{"name": d.name, "arch": d.arch} for d in p.devices],
                 "total_kernel_ms": round(p.total_kernel_us / 1e3, 4), "kernel_calls": p.kernel_calls,
                 "distinct_kernels": len(p.kernels), "linked_calls": p.linked_calls,
                 "unattributed_ms": round(p.unattributed_us / 1e3, 4),
                 "graph_replay": p.graph_replay.model_dump() if p.graph_replay.detected else None,
                 "warnings": p.warnings[:5], "anomalies": p.anomalies},
        invalid_cards=[c.model_dump() for c in a.matches.card_problems],
        hot_kernels=kernels,
        matches=[_match(m, False) for m in a.matches.matches],
        near_misses=[_match(m, True) for m in a.matches.near_misses],
        unmatched_hot=a.matches.unmatched_hot[:5],
        coverage=({"families": [f.model_dump() for f in cov.families],
                   "nearest": [{"kernel": n.kernel[:160], "pct_gpu": n.pct_gpu, "card": n.card, "failed": n.failed}
                               for n in cov.nearest[:5]]} if cov is not None else None),
        plan=plan,
        plan_warnings=a.plan.warnings,
        projected_gain_pct=a.plan.projected_gain_pct,
        measured_gain_pct=a.plan.measured_gain_pct,
        prior_gain_pct=a.plan.prior_gain_pct,
        caution=("expected_speedup is a measurement only where expected_source is 'measured' (then `evidence` names the "
                 "artifact, and versus_trace_call the reference that reproduces the trace's own call); otherwise it is the "
                 "card's prior, not a measurement (prior_gain_pct, never measured_gain_pct). Say an item's wrong_results "
                 "first. A recipe's lever text is the card's words about the shapes in lever_measured_on"),
        next=nxt,
    )


# --------------------------------------------------------------------------- assembly
_DESCRIPTIONS = {
    "list_skills": "List the skill cards of the knowledge base (id, gens, from→to backend, recipes, validation status) "
                   "and the fact ids. Optional filters: gen, to_backend.",
    "show_skill": "Show one skill card: its front matter (match signature, recipes with predicates, references, "
                  "tolerance, validation status) and its body. Long bodies are previewed with an outline; pass "
                  "section=<heading> to read one section in full.",
    "read_fact": "Read one fact card (hardware, numerics or method facts cited by skills).",
    "analyze_profile": "Analyse a profiler trace the user provided (CPU only, nothing runs on a GPU): rank the hot "
                       "kernels with their % of GPU time and shapes, match skill cards (every criterion with its "
                       "reason, plus near misses) and plan a recipe per shape. Writes nothing; with save_full=true a summary "
                       "cut to fit also saves the full analysis under validation/_analysis/ and returns its path as full_result.",
    "run_skill": "Run a card's port against its references for the given shapes and write a validation artifact "
                 "(parity for port and baseline, interleaved timing, speedup). Needs a GPU; without one it refuses "
                 "and suggests check_skill or backend='cpu' (CPU numerics on small shapes, no timing).",
    "check_skill": "Compile a FlyDSL card's recipes for its target arch WITHOUT a GPU and apply the card's static "
                   "gates (spills, scratch, occupancy, opcodes). Compile-only: proves it builds, not that it is faster.",
    "read_validation": "Read the evidence: with no path, list the newest validation artifacts (card, recipe, shape, "
                       "mode, verdict, speedup); with a path, read one artifact or a saved analysis.",
}


# (name, argument model) of tools defined further down (the tuning tools); their methods live on AgentTools.
EXTRA_TOOLS: list[tuple[str, type[BaseModel]]] = []


def tool_specs(tools: AgentTools) -> list[ToolSpec]:
    entries = [
        ("list_skills", S.ListSkillsArgs, tools.list_skills),
        ("show_skill", S.ShowSkillArgs, tools.show_skill),
        ("read_fact", S.ReadFactArgs, tools.read_fact),
        ("analyze_profile", S.AnalyzeProfileArgs, tools.analyze_profile),
        ("run_skill", S.RunSkillArgs, tools.run_skill),
        ("check_skill", S.CheckSkillArgs, tools.check_skill),
        ("read_validation", S.ReadValidationArgs, tools.read_validation),
    ] + [(name, schema, getattr(tools, name)) for name, schema in EXTRA_TOOLS]
    return [ToolSpec(name, _DESCRIPTIONS[name], schema, impl, tools.max_chars) for name, schema, impl in entries]


def build_tools(index: SkillIndex | None = None, allowed_paths: Iterable[str | Path] = (), *,
                gpu_probe: Callable[[], Optional[str]] | None = None, max_chars: int = MAX_CHARS) -> list:
    """LangChain tools over the runner. `allowed_paths`: files/folders the user lets the tools read."""
    from langchain_core.tools import StructuredTool

    specs = tool_specs(AgentTools(index, allowed_paths, gpu_probe=gpu_probe, max_chars=max_chars))
    out = []
    for spec in specs:
        def _on_bad_args(exc: Exception, _name: str = spec.name) -> str:
            if isinstance(exc, ValidationError):
                return dumps(validation_error_result(exc, _name))
            return dumps({"ok": False, "error": f"bad arguments for {_name}: {exc}", "hint": "fix the arguments and call again"})

        out.append(StructuredTool.from_function(
            func=spec, name=spec.name, description=spec.description, args_schema=spec.args_schema,
            handle_validation_error=_on_bad_args, handle_tool_error=True,
        ))
    return out


# ---------------------------------------------------------------------------------------- tuning tools
# tune_skill / ablate_skill: the same typed api functions as `skill-run tune` / `skill-run ablate`.
from pydantic import Field  # noqa: E402
from typing import Literal  # noqa: E402


class TuneSkillArgs(S._Args):
    skill_id: str = Field(..., min_length=1, description="card id whose recipe declares a tunable space")
    shapes: list[str] = Field(..., min_length=1, max_length=8, description=S.SHAPE_HELP)
    backend: Optional[Literal["cuda", "rocm", "cpu"]] = Field(None, description="default: the GPU present")
    compile_only: bool = Field(False, description="FlyDSL on a CPU: prune the space by the static gates (spills, LDS); nothing is timed")
    arch: Optional[str] = Field(None, description="target arch for --compile-only (default: the card's first gfx gen)")
    rounds: int = Field(100, ge=10, le=1000, description="interleaved rounds per timing session")
    top: int = Field(3, ge=1, le=8, description="finalists re-timed against the incumbent and the baseline")
    apply: bool = Field(False, description="write the proposed recipe into the card (lint must pass); leave False to only see the diff")


class AblateSkillArgs(S._Args):
    skill_id: str = Field(..., min_length=1, description="card id")
    shape: str = Field(..., min_length=1, description="one shape; " + S.SHAPE_HELP)
    set: dict[str, Any] = Field(..., min_length=1, max_length=8, description="knobs to change on the recipe's config, e.g. {'xcd_swizzle': 0}")
    recipe: Optional[str] = Field(None, description="recipe to ablate (default: the one selected for the shape)")
    backend: Optional[Literal["cuda", "rocm", "cpu"]] = Field(None, description="default: the GPU present")
    rounds: int = Field(200, ge=10, le=2000, description="interleaved rounds")


def _tuning_row(r: dict[str, Any], rel: Callable[[Path], str]) -> dict[str, Any]:
    cands = r.get("candidates") or []
    counts: dict[str, int] = {}
    for c in cands:
        if c.get("role") in ("candidate", "ablated"):
            counts[c["status"]] = counts.get(c["status"], 0) + 1
    row = {"card": (r.get("card") or {}).get("id"), "kind": r.get("kind"), "shape": r.get("shape"), "verdict": r.get("verdict"),
           "reason": r.get("reason"), "candidates_by_status": counts, "decision": r.get("decision"),
           "ablation": r.get("ablation"), "artifact": rel(Path(r["artifact"])) if r.get("artifact") else None}
    if r.get("diff"):
        row["diff"] = r["diff"]
    return {k: v for k, v in row.items() if v is not None}


def _tune_skill(self: AgentTools, a: TuneSkillArgs) -> dict[str, Any]:
    self.index.skill(a.skill_id)
    if not a.compile_only and a.backend != "cpu" and not self.gpu_probe():
        return {"ok": False, "error": "no GPU device is present, so tune_skill cannot time candidates here",
                "hint": "use compile_only=True for a FlyDSL card (prunes spilling configs), or backend='cpu' for numerics only"}
    results = api.tune(self.index, a.skill_id, self._shapes(a.skill_id, a.shapes), backend=a.backend,
                       compile_only=a.compile_only, arch=a.arch, rounds=a.rounds, top=a.top, apply=a.apply)
    return ok(results=[_tuning_row(r, self._rel) for r in results],
              note="a recipe is proposed only when it beats the incumbent beyond the A/A noise in a fresh re-check; "
                   "compile_prune results are compile-only facts, not measurements")


def _ablate_skill(self: AgentTools, a: AblateSkillArgs) -> dict[str, Any]:
    self.index.skill(a.skill_id)
    if a.backend != "cpu" and not self.gpu_probe():
        return {"ok": False, "error": "no GPU device is present, so ablate_skill cannot time the A/B here",
                "hint": "an ablation needs a GPU; backend='cpu' only checks that both configs pass the oracle"}
    shape = self._shapes(a.skill_id, [a.shape])[0]
    r = api.ablate(self.index, a.skill_id, shape, dict(a.set), recipe=a.recipe, backend=a.backend, rounds=a.rounds)
    return ok(result=_tuning_row(r, self._rel))


AgentTools.tune_skill = _tune_skill  # type: ignore[attr-defined]
AgentTools.ablate_skill = _ablate_skill  # type: ignore[attr-defined]
_DESCRIPTIONS["tune_skill"] = ("Tune a recipe's declared space for a shape (start from the nearest recipe, parity-gate every "
                               "candidate, time survivors interleaved, re-check the top few against the incumbent and the "
                               "baseline); returns the tuning artifact and, only on a win beyond noise, a SKILL.md diff. "
                               "compile_only=True prunes a FlyDSL space on a CPU.")
_DESCRIPTIONS["ablate_skill"] = ("Ablate a lever: same-session A/B of the recipe against itself with `set` changed; says whether "
                                 "the lever is load-bearing (outside the A/A noise) and whether that agrees with the card.")
EXTRA_TOOLS.extend([("tune_skill", TuneSkillArgs), ("ablate_skill", AblateSkillArgs)])
