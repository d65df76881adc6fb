"""``skill-run check``: compile a card's FlyDSL recipes without a GPU and apply their static gates.

For each selected recipe: compile ``<kernel module>.compile_only(shape, config, arch)`` in a child
process (timeout), read registers/spills/LDS from the kernel metadata and opcode facts from the ISA,
apply the recipe's ``gates:``, and (``write=True``) record a ``compile_verified`` or
``compile_failed`` artifact under ``validation/<card id>/`` (mode ``compile_only``).
"""
from __future__ import annotations

import platform
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skillrun.evidence import validation as V
from skillrun.check import flydsl_env, gates as G
from skillrun.errors import SkillRunError, UsageError
from skillrun.kb.cards import Recipe, SkillCard, problem_keys
from skillrun.kb.index import SkillIndex
from skillrun.evidence.kernel_sources import source_identity
from skillrun.plan.select import select_recipe

DEFAULT_TIMEOUT_S = 600.0


@dataclass
class RecipeCheck:
    recipe: str
    kernel: str
    shape: dict[str, int]
    config: dict[str, Any]
    arch: str
    status: str  # compile_verified | compile_failed | skipped
    reason: str
    seconds: float = 0.0
    gates: list[G.GateResult] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    untuned: bool = False
    artifact: str | None = None
    artifact_error: str | None = None  # why the artifact could not be written (the check itself stands)
    log_tail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "compile_verified"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["gates"] = [g.to_json() for g in self.gates]
        return d

    def row(self) -> dict[str, Any]:
        """One print-friendly table row (first kernel's numbers; MoE rows list both stages)."""
        ks = self.kernels
        def join(key):
            return "/".join(str(k.get(key)) for k in ks) if ks else "-"
        mfma = "; ".join(", ".join(f"{op.removeprefix('v_mfma_')}x{n}" for op, n in k.get("mfma", {}).items()) or "none" for k in ks) or "-"
        failed = [g.name for g in self.gates if not g.passed]
        return {
            "recipe": self.recipe,
            "shape": ",".join(f"{k}={v}" for k, v in self.shape.items()),
            "arch": self.arch,
            "status": self.status,
            "vgpr": join("vgpr"),
            "agpr": join("agpr"),
            "waves/SIMD": join("waves_per_simd"),
            "spill v/s": "/".join(f"{k.get('vgpr_spill')}+{k.get('sgpr_spill')}" for k in ks) if ks else "-",
            "scratch B": join("scratch_bytes"),
            "LDS B": join("lds_bytes"),
            "MFMA": mfma,
            "compile s": round(self.seconds, 1),
            "failed gates": ", ".join(failed) or ("-" if self.status != "compile_failed" else self.reason[:60]),
        }


@dataclass
class CheckReport:
    skill_id: str
    arch: str
    checks: list[RecipeCheck] = field(default_factory=list)
    flydsl: str | None = None

    @property
    def passed(self) -> bool:
        return all(c.status != "compile_failed" for c in self.checks) and any(c.passed for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"skill_id": self.skill_id, "arch": self.arch, "flydsl": self.flydsl, "passed": self.passed,
                "checks": [c.to_json() for c in self.checks]}

    def table(self) -> list[dict[str, Any]]:
        return [c.row() for c in self.checks]


# ---------------------------------------------------------------- shapes
def _named_shape(card: SkillCard, shape: Any) -> dict[str, int]:
    if isinstance(shape, dict):
        return {k: int(v) for k, v in shape.items()}
    keys = problem_keys(card)
    if len(shape) != len(keys):
        raise UsageError(f"shape {shape} has {len(shape)} numbers; {card.id}'s problem takes {keys}", field="shape")
    return dict(zip(keys, (int(v) for v in shape)))


def representative_shape(card: SkillCard, recipe: Recipe, arch: str) -> dict[str, int] | None:
    """The first ``tests.selects`` shape that selects ``recipe`` (on ``arch`` when the entry names one)."""
    fallback = None
    for sel in card.data.get("tests", {}).get("selects", []):
        if sel.get("recipe") != recipe.name:
            continue
        dev_arch = (sel.get("device") or {}).get("arch")
        shape = _named_shape(card, sel["shape"])
        if dev_arch in (None, arch):
            return shape
        fallback = fallback or shape
    if fallback:
        return fallback
    for ev in recipe.evidence:
        if "shape" in ev:
            return _named_shape(card, ev["shape"])
    return None


def _default_arch(card: SkillCard) -> str:
    for g in card.gens:
        if g.startswith("gfx"):
            return g
    raise UsageError(f"card {card.id} targets no gfx architecture ({card.gens}); pass --arch", field="arch")


# ---------------------------------------------------------------- artifact
def _record(card: SkillCard, chk: RecipeCheck, recipe: Recipe, flydsl_version: str) -> dict[str, Any]:
    kernels = [{k: v for k, v in kern.items() if k != "isa_path"} for kern in chk.kernels]
    rec: dict[str, Any] = {
        "schema_version": 1,
        "created": V.utc_now(),
        "command": "skill-run check " + " ".join(shlex.quote(a) for a in [card.id, "--arch", chk.arch,
                                                                        "--shape", ",".join(f"{k}={v}" for k, v in chk.shape.items())]),
        "card": {"id": card.id, "revision": V.card_revision(card.path), "path": str(card.path.relative_to(V.kb_root()))
                 if card.path.is_relative_to(V.kb_root()) else str(card.path), "sha256": V.file_sha256(card.path)},
        "runner": V.runner_info(),
        "recipe": {"name": recipe.name, "untuned": chk.untuned, "kernel": recipe.kernel, "backend": recipe.backend,
                   "config": dict(recipe.config)},
        "shape": dict(chk.shape),
        "device": {"kind": "cpu", "name": f"compile-only on {platform.machine()} CPU (no GPU)", "arch": chk.arch},
        "software": V.software_info(),
        "mode": "compile_only",
        "verdict": chk.status,
        "reason": chk.reason,
        # The FlyDSL release that produced these facts (the child runs this interpreter's flydsl).
        "compile": {"arch": chk.arch, "flydsl": flydsl_version, "kernels": kernels, "gates": [g.to_json() for g in chk.gates]},
        "notes": [f"FlyDSL {flydsl_version} compiled for {chk.arch} with COMPILE_ONLY=1 and lld-19 on a CPU-only machine; "
                  "nothing was executed, no timing or numerics are implied",
                  f"compile wall time {chk.seconds:.1f} s (child process, includes Python start-up)"],
    }
    identity, problem = source_identity(recipe.kernel)
    rec["recipe"].update(identity)
    if problem:
        rec["notes"].append(problem)
    return rec


# ---------------------------------------------------------------- main entry
def check_recipe(card: SkillCard | None, recipe: Recipe, shape: dict[str, int], arch: str, *, untuned: bool = False,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> RecipeCheck:
    base = dict(recipe=recipe.name, kernel=recipe.kernel, shape=shape, config=dict(recipe.config), arch=arch, untuned=untuned)
    if recipe.backend != "flydsl":
        return RecipeCheck(**base, status="skipped", reason=f"backend {recipe.backend!r}: only FlyDSL recipes compile here")
    if recipe.gens and arch not in recipe.gens and "*" not in recipe.gens:
        return RecipeCheck(**base, status="skipped", reason=f"recipe is for {recipe.gens}, not {arch}")
    res = flydsl_env.compile_in_child(recipe.kernel, shape, dict(recipe.config), arch, timeout_s=timeout_s)
    if not res.ok:
        return RecipeCheck(**base, status="compile_failed", reason=res.error, seconds=res.seconds, log_tail=res.log_tail)
    results = G.evaluate(recipe.gates or {}, res.facts, arch)
    failed = [g for g in results if not g.passed]
    if failed:
        reason = "gate(s) failed: " + "; ".join(f"{g.name}: {g.reason}" for g in failed)
        status = "compile_failed"
    else:
        reason = (f"compiled for {arch}; {len(results)} gate(s) passed" if results
                  else f"compiled for {arch}; the recipe declares no gates")
        status = "compile_verified"
    return RecipeCheck(**base, status=status, reason=reason, seconds=res.seconds, gates=results, kernels=res.facts["kernels"])


def check_skill(index: SkillIndex, skill_id: str, arch: str | None = None, shapes: list[dict] | None = None,
                write: bool = True, recipes: list[str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                validation_root: Path | None = None) -> CheckReport:
    """Compile-check a card's FlyDSL recipes for ``arch`` and apply their gates.

    * no ``shapes``: every recipe (or those named in ``recipes``) at its representative shape, the
      first ``tests.selects`` entry that selects it;
    * ``shapes``: each shape with the recipe the card selects for it on ``arch`` (or, with
      ``recipes``, each named recipe at each shape).

    ``write`` records one artifact per compiled recipe under ``validation/<card id>/``.
    Raises ``UnavailableError`` when lld-19 or flydsl is missing, ``UsageError`` for a bad id/shape.
    """
    card = index.skill(skill_id)
    arch = arch or _default_arch(card)
    version = flydsl_env.require_toolchain()
    report = CheckReport(skill_id=card.id, arch=arch, flydsl=version)
    by_name = {r.name: r for r in card.recipes}
    for name in recipes or []:
        if name not in by_name:
            raise UsageError(f"card {card.id} has no recipe {name!r}", field="recipe", hint=f"recipes: {', '.join(by_name)}")
    plan: list[tuple[Recipe, dict[str, int], bool]] = []
    if shapes:
        named = [_named_shape(card, s) for s in shapes]
        for shape in named:
            if recipes:
                plan += [(by_name[n], shape, False) for n in recipes]
            else:
                sel = select_recipe(card, shape, index.device_facts(arch), arch)
                plan.append((sel.recipe, shape, sel.untuned))
    else:
        for r in card.recipes:
            if recipes and r.name not in recipes:
                continue
            shape = representative_shape(card, r, arch)
            if shape is None:
                report.checks.append(RecipeCheck(recipe=r.name, kernel=r.kernel, shape={}, config=dict(r.config), arch=arch,
                                                 status="skipped", reason="no tests.selects or evidence shape for this recipe; pass --shape"))
                continue
            plan.append((r, shape, False))
    for recipe, shape, untuned in plan:
        chk = check_recipe(card, recipe, shape, arch, untuned=untuned, timeout_s=timeout_s)
        if write and chk.status != "skipped":
            try:
                chk.artifact = str(V.write_artifact(_record(card, chk, recipe, version), root=validation_root))
            except SkillRunError as exc:  # a read-only or full folder must not lose a finished check
                chk.artifact_error = str(exc)
        report.checks.append(chk)
    return report


def print_table(rows: list[dict[str, Any]], out=sys.stdout) -> None:
    """Plain fixed-width table (the CLI may use rich instead)."""
    if not rows:
        return
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    out.write("  ".join(c.ljust(width[c]) for c in cols) + "\n")
    for r in rows:
        out.write("  ".join(str(r[c]).ljust(width[c]) for c in cols) + "\n")
