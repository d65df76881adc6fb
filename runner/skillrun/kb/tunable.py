"""Tunable spaces and ablation claims as card data (recipe ``tunable:`` / ``ablations:``).

A recipe may declare the knobs a tuner sweeps from it and the values each may take::

    tunable:
      space: {BLOCK_M: [128, 256], num_warps: [4, 8]}
      constraints: ["BLOCK_M * BLOCK_N <= 32768"]     # the safe expression language (kb/expr.py)
      max_candidates: 64
    tunable_kernels:                                   # other kernels swept from the same shape class
      - {kernel: pkg.mod:build, backend: gluon, config: {BN: 128}, space: {BN: [128, 256]}}
    ablations:
      - {set: {xcd_swizzle: 0}, expect: load_bearing, claim: "xcd0 -> xcd8 = 1.23x"}

The kernel a recipe names declares what a config may hold: a literal ``CONFIG_SCHEMA`` (a JSON
Schema object) at the top of its module, read without importing it (lint must not need torch).
Prose in ``lever``/``loses`` may also name an ablation as ``knob: A -> B`` (or ``→``).

Everything here is pure data handling: the tuner (``skillrun.tune``) and lint share it.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from skillrun.errors import SkillRunError
from skillrun.kb import expr
from skillrun.kb.cards import SkillCard
from skillrun.models import DEVICE_KEYS, SHAPE_KEYS
from skillrun.kb.refs import module_constant, split_ref

# A hostile card must not make the tuner enumerate billions of configs: the product of the value
# lists is capped before anything is built.
MAX_SPACE = 4096
DEFAULT_MAX_CANDIDATES = 256


@dataclass
class Space:
    knobs: dict[str, list[Any]]
    constraints: list[str] = field(default_factory=list)
    max_candidates: int = DEFAULT_MAX_CANDIDATES

    @property
    def size(self) -> int:
        n = 1
        for v in self.knobs.values():
            n *= max(len(v), 1)
        return n


@dataclass
class KernelSpace:
    """A ``tunable_kernels`` entry: another kernel swept from the recipe's shape class."""

    kernel: str
    backend: str
    config: dict[str, Any]
    space: Space
    why: str = ""


@dataclass
class Ablation:
    set: dict[str, Any]
    expect: str  # load_bearing | not_load_bearing
    claim: str
    source: str  # "ablations.<i>" | "lever" | "loses.<i>"


def raw_recipe(card: SkillCard, name: str) -> dict[str, Any]:
    for r in card.data.get("recipes", []):
        if r.get("name") == name:
            return r
    raise SkillRunError(f"card has no recipe named {name!r}", path=str(card.path), field="recipes")


def space_of(card: SkillCard, recipe_name: str) -> Space | None:
    t = raw_recipe(card, recipe_name).get("tunable")
    if not t:
        return None
    return Space(knobs={k: list(v) for k, v in t["space"].items()}, constraints=list(t.get("constraints") or []),
                 max_candidates=int(t.get("max_candidates", DEFAULT_MAX_CANDIDATES)))


def kernel_spaces_of(card: SkillCard, recipe_name: str) -> list[KernelSpace]:
    out = []
    for t in raw_recipe(card, recipe_name).get("tunable_kernels") or []:
        out.append(KernelSpace(kernel=t["kernel"], backend=t["backend"], config=dict(t.get("config") or {}),
                               space=Space(knobs={k: list(v) for k, v in t["space"].items()},
                                           constraints=list(t.get("constraints") or []),
                                           max_candidates=int(t.get("max_candidates", DEFAULT_MAX_CANDIDATES))),
                               why=str(t.get("why") or "")))
    return out


def config_schema(kernel_ref: str) -> dict[str, Any] | None:
    """The literal ``CONFIG_SCHEMA`` of the kernel module or of its ``<module>_config`` sidecar, or None.

    The sidecar is where a measured kernel keeps its schema: artifacts record the kernel source's
    sha256, and adding a schema to the kernel file itself would mark every measurement stale.
    """
    try:
        module, _ = split_ref(kernel_ref)
    except SkillRunError:
        return None
    for mod in (module, f"{module}_config"):
        schema = module_constant(mod, "CONFIG_SCHEMA")
        if isinstance(schema, dict):
            return schema
    return None


def value_error(schema: dict[str, Any], knob: str, value: Any) -> str | None:
    import jsonschema

    props = schema.get("properties") or {}
    if knob not in props:
        if schema.get("additionalProperties", True) is False:
            return f"{knob!r} is not a config key of the kernel (known: {sorted(props)})"
        return None
    errs = list(jsonschema.Draft202012Validator(props[knob]).iter_errors(value))
    return f"{knob}={value!r}: {errs[0].message}" if errs else None


# `knob: A -> B` / `knob: A → B` / `knob=A -> B` in prose.
_ABL_TEXT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*[:=]\s*([^\s,;()]+)\s*(?:->|→)\s*([^\s,;()]+)")
_NO_OP = re.compile(r"(?i)no-?op|non-?load-?bearing|not load-?bearing")


def literal(text: str) -> Any:
    """A CLI/prose value as the config would hold it: int, float, bool, None, else the string."""
    t = text.strip()
    low = t.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def ablations_of(card: SkillCard, recipe_name: str) -> list[Ablation]:
    """Every ablation the card claims for a recipe: structured entries first, then prose mentions."""
    r = raw_recipe(card, recipe_name)
    out = [Ablation(set=dict(a["set"]), expect=a["expect"], claim=a.get("claim", ""), source=f"ablations.{i}")
           for i, a in enumerate(r.get("ablations") or [])]
    texts = [("lever", r.get("lever") or "")] + [(f"loses.{i}", t) for i, t in enumerate(r.get("loses") or [])]
    for src, text in texts:
        for m in _ABL_TEXT.finditer(text):
            knob, _old, new = m.groups()
            if knob not in (r.get("config") or {}) and knob not in ((r.get("tunable") or {}).get("space") or {}):
                continue  # "74.8% -> 83.0%" style prose without a config key is not an ablation
            # A lever is load-bearing by definition; a "loses" entry says the changed value is slower;
            # either may say explicitly that the change measured as a no-op.
            expect = "not_load_bearing" if _NO_OP.search(text) else "load_bearing"
            out.append(Ablation(set={knob: literal(new)}, expect=expect, claim=text.strip(), source=src))
    return out


def claim_for(card: SkillCard, recipe_name: str, changes: dict[str, Any]) -> Ablation | None:
    for a in ablations_of(card, recipe_name):
        if a.set == changes:
            return a
    return None


def enumerate_candidates(base: dict[str, Any], space: Space, shape: dict[str, Any],
                         facts: dict[str, Any]) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """(configs to try, [(config, why pruned)]) for the space around ``base``; base itself comes first.

    Constraints see the candidate's config, the shape and the device facts. A constraint that fails
    to evaluate prunes the candidate with that reason (never silently).
    """
    if space.size > MAX_SPACE:
        raise SkillRunError(f"tunable space has {space.size} points (cap {MAX_SPACE}); narrow it")
    env0 = {k: facts.get(k) for k in DEVICE_KEYS}
    env0.update(shape)
    keep: list[dict[str, Any]] = []
    pruned: list[tuple[dict[str, Any], str]] = []
    seen: set[str] = set()
    names = list(space.knobs)
    combos = [dict(zip(names, vals)) for vals in itertools.product(*(space.knobs[k] for k in names))]
    for combo in [{}] + combos:
        cfg = {**base, **combo}
        key = config_key(cfg)
        if key in seen:
            continue
        seen.add(key)
        env = {**env0, **{k: v for k, v in cfg.items() if isinstance(v, (int, float, bool)) or v is None}}
        why = None
        for c in space.constraints:
            try:
                if not expr.evaluate(c, env):
                    why = f"constraint `{c}` is false"
            except (expr.ExprError, ArithmeticError, TypeError) as exc:
                why = f"constraint `{c}` did not evaluate: {exc}"
            if why:
                break
        if why is not None and combo:  # the incumbent itself is always kept (it is what we compare against)
            pruned.append((cfg, why))
        else:
            keep.append(cfg)
    if len(keep) > space.max_candidates:
        for cfg in keep[space.max_candidates:]:
            pruned.append((cfg, f"beyond max_candidates={space.max_candidates} (space order)"))
        keep = keep[:space.max_candidates]
    return keep, pruned


def config_key(cfg: dict[str, Any]) -> str:
    return ",".join(f"{k}={cfg[k]!r}" for k in sorted(cfg))


def config_label(cfg: dict[str, Any], base: dict[str, Any]) -> str:
    diff = {k: v for k, v in cfg.items() if base.get(k, object()) != v}
    return ",".join(f"{k}={v}" for k, v in diff.items()) or "start config"


def lint_tunable(card: SkillCard) -> list[SkillRunError]:
    """Tunable spaces and ablations checked against the kernel's CONFIG_SCHEMA and the predicate language."""
    errors: list[SkillRunError] = []

    def err(fld: str, reason: str) -> None:
        errors.append(SkillRunError(reason, path=str(card.path), field=fld))

    for i, r in enumerate(card.data.get("recipes", [])):
        t, abls = r.get("tunable"), r.get("ablations") or []
        if not t and not abls:
            continue
        schema = config_schema(r.get("kernel", ""))
        if schema is None:
            err(f"recipes.{i}.tunable" if t else f"recipes.{i}.ablations",
                f"kernel {r.get('kernel')!r} declares no literal CONFIG_SCHEMA, so knobs cannot be checked")
        if t:
            space = t.get("space") or {}
            n = 1
            for knob, values in space.items():
                n *= max(len(values), 1)
                for v in values if schema else []:
                    why = value_error(schema, knob, v)
                    if why:
                        err(f"recipes.{i}.tunable.space.{knob}", why)
            if n > MAX_SPACE:
                err(f"recipes.{i}.tunable.space", f"{n} points (cap {MAX_SPACE})")
            vocab = set(SHAPE_KEYS) | set(DEVICE_KEYS) | set(space) | set(r.get("config") or {}) \
                | set((schema or {}).get("properties") or {})
            for j, c in enumerate(t.get("constraints") or []):
                try:
                    unknown = expr.names(c) - vocab
                except expr.ExprError as exc:
                    err(f"recipes.{i}.tunable.constraints.{j}", str(exc))
                    continue
                if unknown:
                    err(f"recipes.{i}.tunable.constraints.{j}", f"unknown name(s) {sorted(unknown)} in `{c}`")
            if schema:
                for knob, v in (r.get("config") or {}).items():
                    why = value_error(schema, knob, v)
                    if why:
                        err(f"recipes.{i}.config.{knob}", why)
        for j, a in enumerate(abls):
            for knob, v in (a.get("set") or {}).items():
                why = value_error(schema, knob, v) if schema else None
                if why:
                    err(f"recipes.{i}.ablations.{j}.set", why)
    for i, r in enumerate(card.data.get("recipes", [])):
        for k, t in enumerate(r.get("tunable_kernels") or []):
            _lint_kernel_space(t, f"recipes.{i}.tunable_kernels.{k}", err)
    return errors


def _lint_kernel_space(t: dict[str, Any], where: str, err) -> None:
    """One ``tunable_kernels`` entry: its kernel's schema, its start config, its space, its constraints."""
    schema = config_schema(t.get("kernel", ""))
    if schema is None:
        err(f"{where}.kernel", f"kernel {t.get('kernel')!r} declares no literal CONFIG_SCHEMA, so knobs cannot be checked")
        return
    for knob, v in (t.get("config") or {}).items():
        why = value_error(schema, knob, v)
        if why:
            err(f"{where}.config.{knob}", why)
    space = t.get("space") or {}
    n = 1
    for knob, values in space.items():
        n *= max(len(values), 1)
        for v in values:
            why = value_error(schema, knob, v)
            if why:
                err(f"{where}.space.{knob}", why)
    if n > MAX_SPACE:
        err(f"{where}.space", f"{n} points (cap {MAX_SPACE})")
    vocab = set(SHAPE_KEYS) | set(DEVICE_KEYS) | set(space) | set(t.get("config") or {}) | set(schema.get("properties") or {})
    for j, c in enumerate(t.get("constraints") or []):
        try:
            unknown = expr.names(c) - vocab
        except expr.ExprError as exc:
            err(f"{where}.constraints.{j}", str(exc))
            continue
        if unknown:
            err(f"{where}.constraints.{j}", f"unknown name(s) {sorted(unknown)} in `{c}`")
