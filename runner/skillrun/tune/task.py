"""What every tuning run (sweep, ablation, compile-only prune) shares: the device facts and target
arch, the task context handed to a worker, the recipe a sweep starts from, the command line, and the
tuning artifact's base record and candidate rows."""
from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import Any

from skillrun.evidence.store import machine_path_in_kb
from skillrun.errors import UsageError
from skillrun.execute.backends import Backend
from skillrun.kb import tunable as T
from skillrun.kb.cards import SkillCard, problem_keys
from skillrun.kb.index import SkillIndex
from skillrun.evidence.kernel_sources import source_identity
from skillrun.tune import session as S
from skillrun.evidence.validation import card_revision, file_sha256, runner_info, software_info, utc_now


def device_facts(index: SkillIndex, card: SkillCard, be: Backend, arch: str | None) -> tuple[str | None, dict[str, Any]]:
    target = arch or (be.facts.arch if be.gpu else None) or (card.gens[0] if card.gens else None)
    return target, {**index.device_facts(target), **(be.facts.predicate_facts() if be.gpu else {})}


def _shape_distance(a: dict[str, int], b: dict[str, int]) -> float:
    keys = [k for k in a if k in b]
    if not keys:
        return math.inf
    return sum(abs(math.log2(max(int(a[k]), 1) / max(int(b[k]), 1))) for k in keys)


def _recipe_shapes(card: SkillCard, name: str) -> list[dict[str, int]]:
    keys = problem_keys(card)
    out = []
    for sel in card.data.get("tests", {}).get("selects", []) or []:
        if sel.get("recipe") == name:
            s = sel["shape"]
            out.append(dict(zip(keys, s)) if isinstance(s, list) else dict(s))
    for r in card.data.get("recipes", []):
        if r.get("name") == name:
            for ev in r.get("evidence") or []:
                s = ev.get("shape")
                if isinstance(s, dict):
                    out.append(dict(s))
                elif isinstance(s, list) and len(s) == len(keys):
                    out.append(dict(zip(keys, s)))
    return out


def nearest_recipe(card: SkillCard, shape: dict[str, int], selected: str, untuned: bool) -> tuple[str, str]:
    """(recipe name the sweep starts from, why)."""
    spaced = [r.name for r in card.recipes if T.space_of(card, r.name) or T.kernel_spaces_of(card, r.name)]
    if not untuned:
        if selected in spaced:
            return selected, f"the recipe the card selects for this shape ({selected})"
        raise UsageError(f"recipe {selected!r} (selected for this shape) declares no tunable space",
                         field=f"recipes.{selected}.tunable", hint="add `tunable: {space: {...}}` to the recipe in the card")
    if not spaced:
        raise UsageError(f"card {card.id} declares no tunable space in any recipe", field="recipes.*.tunable")
    best, dist = None, math.inf
    for name in spaced:
        for s in _recipe_shapes(card, name):
            d = _shape_distance(shape, s)
            if d < dist:
                best, dist = name, d
    if best is None:
        name = selected if selected in spaced else spaced[0]
        return name, f"no recipe with a space names a shape; started from {name}"
    return best, f"nearest recipe with a tunable space by log2 shape distance ({dist:.2f}) to its test/evidence shapes"


def task_context(card: SkillCard, shape: dict[str, int], be: Backend, recipe_backend: str, *, seeds: int, timeout_s: float,
         timer: str | None, rounds: int, warmup: int, cold_l2: str, cuda_graph: bool, isolation: str | None,
         sandbox: str = "auto") -> dict[str, Any]:
    tol = {"rtol": 1e-2, "atol": 1e-2, "min_cosine": 0.999, **card.tolerance}
    iso = isolation or ("spawn" if be.gpu else "fork")
    return {"shape": dict(shape), "problem": card.references["problem"], "device": be.torch_device,
            "seeds": list(range(1, 1 + seeds)), "tolerance": tol, "timeout_s": float(timeout_s),
            "env": be.env(recipe_backend), "isolation": iso, "profile_launches": 3 if be.gpu else 1,
            "sandbox": sandbox,  # the untrusted children's confinement (skillrun.io.sandbox)
            "timing": {"timer": timer if timer is not None else be.default_timer(), "warmup": warmup, "cold_l2": cold_l2,
                       "l2_bytes": be.facts.l2_bytes, "cuda_graph": cuda_graph, "max_sets": 32, "max_seconds": 120.0}}


def base_record(kind: str, card: SkillCard, shape: dict[str, int], be: Backend, recipe: dict[str, Any],
                command: str) -> dict[str, Any]:
    identity, problem = source_identity(recipe["kernel"])
    rec = {
        "schema_version": 1, "kind": kind, "created": utc_now(), "command": command,
        "card": {"id": card.id, "revision": card_revision(card.path), "path": machine_path_in_kb(card.path, card.path.parents[2]), "sha256": file_sha256(card.path)},
        "runner": runner_info(), "device": be.facts.artifact(), "software": software_info(), "shape": dict(shape),
        "recipe": {**recipe, "kernel_source_sha256": None, **identity},
    }
    if problem:
        rec["notes"] = [problem]
    return rec


def command_line(default: str) -> str:
    argv = sys.argv
    if argv and Path(argv[0]).name in ("skill-run", "skillrun", "__main__.py"):
        return "skill-run " + " ".join(shlex.quote(a) for a in argv[1:])
    return default


def shape_text(shape: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def candidate_row(cid: str, label: str, cfg: dict, role: str, res: dict[str, Any] | None,
                  status: str | None = None, reason: str | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"id": cid, "label": label, "config": cfg, "role": role}
    if res is not None:
        st, why = S.classify(res)
        row.update(status=status or st, reason=reason or why, lane=res.get("lane"), device=res.get("device"),
                   wall_s=res.get("wall_s"), parity=_parity_summary(res))
    else:
        row.update(status=status, reason=reason, lane=None, device=None, wall_s=None, parity=None)
    return row


def _parity_summary(res: dict[str, Any]) -> dict[str, Any] | None:
    p = res.get("parity")
    if not p:
        return None
    keep = ("passed", "supported", "rel_fro", "max_abs_err", "cosine", "mismatched", "nonfinite", "elements", "error")
    out = {k: p[k] for k in keep if k in p}
    if res.get("build_s") is not None:
        out["build_s"] = res["build_s"]
    return out


def timing_meta(ctx: dict[str, Any], res: dict[str, Any], rounds: int) -> dict[str, Any]:
    t = res.get("timing") or {}
    return {"method": t.get("method", "?"), "rounds": int(t.get("rounds", rounds)), "warmup": int(t.get("warmup", ctx["timing"]["warmup"])),
            "cold_l2": str(res.get("cold_l2"))}
