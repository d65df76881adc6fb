"""Loading skill cards and fact cards (YAML front matter + markdown body) into typed models."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from skillrun.errors import SkillRunError
from skillrun.kb import bounded_yaml
from skillrun.kb.paths import load_schema
from skillrun.kb.refs import module_constant
from skillrun.io.regular_files import read_regular

# Real cards are under 60 KiB; a card far past that is a mistake or an attack, not knowledge.
MAX_CARD_BYTES = 512 << 10

_FRONT = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)(.*)\Z", re.S)


def split_front_matter(text: str, path: Path) -> tuple[dict[str, Any], str]:
    m = _FRONT.match(text)
    if not m:
        raise SkillRunError("no YAML front matter (the file must start with a '---' line and close it with another)", path=str(path))
    try:
        data = bounded_yaml.load(m.group(1))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 2}" if mark is not None else "front matter"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SkillRunError(f"bad YAML at {where}: {problem}", path=str(path)) from None
    if not isinstance(data, dict):
        raise SkillRunError("front matter is not a YAML mapping", path=str(path))
    bad = first_nonfinite(data)
    if bad is not None:
        # `.nan` compares false with everything (a `min_pct_gpu: .nan` never matches, a NaN
        # tolerance never fails) and `.inf` makes any bound vacuous: neither is knowledge.
        raise SkillRunError("a non-finite number (.nan/.inf) is not allowed in a card", path=str(path), field=bad)
    return data, m.group(2)


def first_nonfinite(data: Any, where: str = "") -> str | None:
    """The dotted field of the first NaN or infinite float in ``data`` (iterative: depth is not a risk)."""
    stack: list[tuple[Any, str]] = [(data, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return at or "(top level)"
        if isinstance(value, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((v, f"{at}.{i}" if at else str(i)) for i, v in reversed(list(enumerate(value))))
    return None


@lru_cache(maxsize=8)
def _validator(name: str):
    import jsonschema

    return jsonschema.Draft202012Validator(load_schema(name))


def schema_errors(name: str, data: dict[str, Any], path: Path) -> list[SkillRunError]:
    """Every schema violation as an error naming file, field and reason."""
    out = []
    try:
        found = sorted(_validator(name).iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    except RecursionError:
        return [SkillRunError("front matter nests too deeply to check", path=str(path))]
    for e in found:
        field = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        msg = e.message
        if e.validator == "required":
            msg = f"missing required field: {msg.split(' is a required')[0]}"
        out.append(SkillRunError(msg, path=str(path), field=field))
    return out


@dataclass
class Recipe:
    name: str
    when: str
    kernel: str
    backend: str
    config: dict[str, Any]
    lever: str
    gens: list[str] = field(default_factory=list)
    loses: list[str] = field(default_factory=list)
    gates: dict[str, Any] = field(default_factory=dict)
    expected_speedup: float | None = None
    evidence: list[dict[str, Any]] = field(default_factory=list)
    compiled: dict[str, Any] = field(default_factory=dict)
    notes: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Recipe":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class SkillCard:
    id: str
    path: Path
    data: dict[str, Any]  # the whole front matter, as written
    body: str
    recipes: list[Recipe]

    @property
    def match(self) -> dict[str, Any]:
        return self.data["match"]

    @property
    def gens(self) -> list[str]:
        return list(self.match.get("gens", []))

    @property
    def regex(self) -> str:
        return self.match["profile_signature"]["op_name_regex"]

    @property
    def min_pct_gpu(self) -> float:
        return float(self.match["profile_signature"].get("min_pct_gpu", 0.0))

    @property
    def tolerance(self) -> dict[str, float]:
        return dict(self.data.get("tolerance", {}))

    @property
    def references(self) -> dict[str, Any]:
        return dict(self.data.get("references", {}))

    @property
    def facts(self) -> list[str]:
        return list(self.data.get("facts", []))

    def recipe(self, name: str) -> Recipe:
        for r in self.recipes:
            if r.name == name:
                return r
        raise SkillRunError(f"card has no recipe named {name!r}", path=str(self.path), field="recipes")

    @property
    def default_recipe(self) -> Recipe:
        return self.recipe(self.data["default_recipe"])

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "path": str(self.path), **self.data, "body": self.body}


@dataclass
class FactCard:
    id: str
    path: Path
    data: dict[str, Any]
    body: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "path": str(self.path), **self.data, "body": self.body}


def read_card_text(path: Path, what: str = "card") -> str:
    """A card's text: a regular file (never a FIFO or device), at most MAX_CARD_BYTES, UTF-8."""
    try:
        return read_regular(path, MAX_CARD_BYTES, what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SkillRunError(f"cannot read {what}: not UTF-8 ({exc.reason} at byte {exc.start})", path=str(path)) from None
    except SkillRunError as exc:
        raise SkillRunError(f"cannot read {what}: {exc.reason}", path=str(path)) from None


def read_skill(path: Path) -> tuple[SkillCard | None, list[SkillRunError]]:
    """Parse and schema-check one SKILL.md; returns the card (None if unusable) and all errors."""
    try:
        text = read_card_text(path)
        data, body = split_front_matter(text, path)
    except SkillRunError as exc:
        return None, [exc]
    errors = schema_errors("skill", data, path)
    if errors:
        return None, errors
    if data["id"] != path.parent.name:
        errors.append(SkillRunError(f"id {data['id']!r} differs from its folder name {path.parent.name!r}", path=str(path), field="id"))
    recipes = [Recipe.from_dict(r) for r in data["recipes"]]
    card = SkillCard(id=data["id"], path=path, data=data, body=body, recipes=recipes)
    return card, errors


def read_fact(path: Path) -> tuple[FactCard | None, list[SkillRunError]]:
    try:
        text = read_card_text(path, "fact card")
        data, body = split_front_matter(text, path)
    except SkillRunError as exc:
        return None, [exc]
    errors = schema_errors("fact", data, path)
    if errors:
        return None, errors
    if data["id"] != path.stem:
        errors.append(SkillRunError(f"id {data['id']!r} differs from its file name {path.stem!r}", path=str(path), field="id"))
    return FactCard(id=data["id"], path=path, data=data, body=body), errors


def problem_keys(card: SkillCard) -> tuple[str, ...]:
    """The names of a card's shape dimensions, in order: its problem module's SHAPE_KEYS (read
    without importing it), else M, N, K."""
    problem = card.references.get("problem")
    keys = module_constant(problem, "SHAPE_KEYS") if problem else None
    return tuple(keys) if keys else ("M", "N", "K")
