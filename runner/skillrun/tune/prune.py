"""`skill-run tune --compile-only`: prune a FlyDSL space on a CPU with the static gates.

Every candidate of the recipe's space is compiled for the target arch (``skill-run check``'s child
compile) and held to the recipe's gates plus the tuner's own floor (no VGPR spills, no scratch,
LDS within the arch's budget): a config that spills would only waste MI355X time. The artifact
(kind ``compile_prune``) lists every config with its compile facts and the failing gate's reason;
a later ``skill-run tune --start-from ARTIFACT`` on a ROCm device sweeps only the configs kept.
These are compile-only facts, not measurements.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from skillrun.errors import InputError, UsageError
from skillrun.execute.backends import DeviceFacts
from skillrun.kb import tunable as T
from skillrun.kb.cards import SkillCard
from skillrun.kb.index import SkillIndex
from skillrun.plan.select import select_recipe
from skillrun.tune.task import base_record, command_line, nearest_recipe, shape_text
from skillrun.evidence.tuning_artifact import load_tuning_artifact, write_tuning

# The tuner's floor on top of the recipe's own gates (a recipe may be stricter, never looser here).
FLOOR_GATES = {"max_vgpr_spill": 0, "max_sgpr_spill": 0, "max_scratch_bytes": 0}


def _gates(recipe_gates: dict[str, Any], arch: str) -> dict[str, Any]:
    from skillrun.check.gates import LDS_BUDGET

    g = dict(FLOOR_GATES)
    if arch in LDS_BUDGET:
        g["max_lds_bytes"] = LDS_BUDGET[arch]
    for k, v in (recipe_gates or {}).items():
        g[k] = min(v, g[k]) if k in FLOOR_GATES or k == "max_lds_bytes" else v
    return g


def prune_shape(index: SkillIndex, card: SkillCard, shape: dict[str, int], *, arch: str | None = None,
                timeout_s: float = 600.0, write: bool = True, validation_root: Path | None = None,
                command: str | None = None) -> dict[str, Any]:
    from skillrun.check.core import check_recipe
    from skillrun.check.flydsl_env import require_toolchain

    validation_root = Path(validation_root) if validation_root is not None else index.root / "validation"

    arch = arch or next((g for g in card.gens if g.startswith("gfx")), None)
    if arch is None:
        raise UsageError(f"--compile-only needs a gfx target: card {card.id} names {card.gens}; pass --arch", field="arch")
    facts = index.device_facts(arch)
    sel = select_recipe(card, shape, facts, arch)
    start_name, why = nearest_recipe(card, shape, sel.recipe.name, sel.untuned)
    start = card.recipe(start_name)
    if start.backend != "flydsl":
        raise UsageError(f"--compile-only prunes FlyDSL spaces; recipe {start_name} is {start.backend}", field="compile_only")
    version = require_toolchain()
    space = T.space_of(card, start_name)
    assert space is not None
    configs, pruned = T.enumerate_candidates(dict(start.config), space, shape, facts)
    gates = _gates(start.gates, arch)
    dev = DeviceFacts(kind="cpu", name=f"compile-only for {arch} (no GPU)", arch=arch)
    be = type("_CompileOnly", (), {"facts": dev})()
    rec = base_record("compile_prune", card, shape, be,  # type: ignore[arg-type]
                      {"name": start_name, "untuned": sel.untuned, "kernel": start.kernel, "backend": start.backend,
                       "config": dict(start.config), "why": f"sweep starts from {start_name}: {why}"},
                      command or command_line(f"tune {card.id} --shape {shape_text(shape)} --compile-only --arch {arch}"))
    rec["software"]["flydsl"] = version
    rec["space"] = {"knobs": space.knobs, "constraints": space.constraints}
    rec["workers"] = {"engine": "inline", "lanes": [{"lane": 0, "device": None}], "ray_address": None, "rebuilt": 0}
    rows = []
    for i, cfg in enumerate(configs):
        r = dataclasses.replace(start, config=cfg, gates=gates)
        chk = check_recipe(card, r, shape, arch, timeout_s=timeout_s)
        kernels = [{k: v for k, v in kern.items() if k in ("name", "vgpr", "agpr", "vgpr_spill", "sgpr_spill", "scratch_bytes",
                                                           "lds_bytes", "waves_per_simd")} for kern in chk.kernels]
        if chk.status == "compile_verified":
            status = "compile_verified"
        elif chk.gates:
            status = "gate_failed"
        else:
            status = "compile_failed"
        rows.append({"id": "incumbent" if i == 0 else f"c{i}", "label": T.config_label(cfg, start.config), "config": cfg,
                     "role": "incumbent" if i == 0 else "candidate", "status": status, "reason": chk.reason[:800],
                     "lane": 0, "device": None, "wall_s": round(chk.seconds, 2),
                     "compile": {"arch": arch, "kernels": kernels, "gates": [g.to_json() for g in chk.gates]}})
    rows += [{"id": f"p{i}", "label": T.config_label(cfg, start.config), "config": cfg, "role": "candidate", "status": "pruned",
              "reason": why, "lane": None, "device": None, "wall_s": None} for i, (cfg, why) in enumerate(pruned)]
    rec["candidates"] = rows
    kept = [r for r in rows if r["status"] == "compile_verified"]
    failed = [r for r in rows if r["status"] in ("gate_failed", "compile_failed")]
    rec["timing"] = None
    rec["verdict"] = "pruned"
    rec["reason"] = (f"compile-only for {arch} (not a measurement): {len(kept)} of {len(configs)} configs compile clean "
                     f"under gates {gates}; {len(failed)} pruned by the gates or the compiler"
                     + (f", {len(pruned)} by constraints" if pruned else "")
                     + (": " + "; ".join(f"{r['label']}: {r['reason'][:120]}" for r in failed[:4]) if failed else ""))
    path = write_tuning(rec, validation_root) if write else None
    return {**rec, "artifact": str(path) if path else None, "diff": None}


def kept_configs(path: str | Path, card: SkillCard, start_name: str, shape: dict[str, int]) -> list[dict[str, Any]]:
    """The configs a compile_prune artifact kept, for a tune on a device (the incumbent first)."""
    art = load_tuning_artifact(Path(path))
    where = str(path)
    if art["kind"] != "compile_prune":
        raise InputError(f"--start-from needs a compile_prune artifact, this one is {art['kind']}", path=where)
    if art["card"]["id"] != card.id or art["recipe"]["name"] != start_name:
        raise InputError(f"artifact is for {art['card']['id']}/{art['recipe']['name']}, not {card.id}/{start_name}", path=where)
    if dict(art["shape"]) != dict(shape):
        raise InputError(f"artifact was pruned for shape {art['shape']}, not {shape}", path=where)
    kept = [dict(c["config"]) for c in art["candidates"] if c["status"] == "compile_verified"]
    if not kept:
        raise InputError("the compile_prune artifact kept no config", path=where)
    return kept
