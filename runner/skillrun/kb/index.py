"""The SkillIndex: every card and fact of a knowledge base, loaded once and typed."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skillrun.errors import SkillRunError, UsageError
from skillrun.kb.cards import FactCard, SkillCard, read_fact, read_skill
from skillrun.kb.paths import kb_root


def device_fact_id(arch: str) -> str:
    """gfx950 -> gfx950_hardware, sm_90 -> sm90_hardware."""
    return arch.replace("_", "") + "_hardware"


@dataclass
class SkillIndex:
    """Every usable card of a knowledge base, and every problem that kept a card out.

    A card that fails to read, to match the schema, to carry its folder's id, or (after
    :func:`skillrun.lint.check_cards`) to lint is *not* usable: it is left out of ``skills`` and its file and
    reasons are in ``errors`` and ``rejected``, so that match/plan can report it (and exit 1)
    instead of silently matching without it. A duplicate id is an error; the first card keeps
    the id, the later one is rejected, never an override.
    """

    root: Path
    skills: dict[str, SkillCard] = field(default_factory=dict)
    facts: dict[str, FactCard] = field(default_factory=dict)
    errors: list[SkillRunError] = field(default_factory=list)  # every problem found, in file order
    rejected: dict[str, list[SkillRunError]] = field(default_factory=dict)  # card/fact file -> why it is not used
    card_files: int = 0  # SKILL.md files seen (usable or not)
    fact_files: int = 0
    checked: bool = False  # skillrun.lint.check_cards has run

    def reject(self, path: Path, errs: list[SkillRunError]) -> None:
        self.errors += errs
        self.rejected.setdefault(str(path), []).extend(errs)

    @classmethod
    def load(cls, root: Path | None = None) -> "SkillIndex":
        root = Path(root) if root is not None else kb_root()
        idx = cls(root=root)
        for path in sorted((root / "facts").glob("*.md")):
            idx.fact_files += 1
            fact, errs = read_fact(path)
            if fact is not None and fact.id in idx.facts:
                errs = errs + [SkillRunError(f"duplicate fact id {fact.id!r} (also {idx.facts[fact.id].path}); "
                                             "this file is not used", path=str(path), field="id")]
            if errs or fact is None:
                idx.reject(path, errs)
                continue
            idx.facts[fact.id] = fact
        for path in sorted((root / "skills").glob("*/SKILL.md")):
            idx.card_files += 1
            card, errs = read_skill(path)
            if card is not None and card.id in idx.skills:
                errs = errs + [SkillRunError(f"duplicate skill id {card.id!r} (also {idx.skills[card.id].path}); "
                                             "this card is not used", path=str(path), field="id")]
            if errs or card is None:
                idx.reject(path, errs)
                continue
            idx.skills[card.id] = card
        return idx

    @property
    def problems(self) -> list[SkillRunError]:
        """Problems of cards and facts that are not used (what match/plan report, exit 1)."""
        return [e for errs in self.rejected.values() for e in errs]

    def skill(self, skill_id: str) -> SkillCard:
        if skill_id not in self.skills:
            for path, errs in self.rejected.items():
                if Path(path).parent.name == skill_id:
                    raise SkillRunError(f"card {skill_id!r} is invalid and not used: {errs[0].reason}"
                                        + (f" (and {len(errs) - 1} more problems; run `skill-run lint`)" if len(errs) > 1 else ""),
                                        path=path, field=errs[0].field)
            raise UsageError(f"unknown skill {skill_id!r}" + _did_you_mean(skill_id, self.skills), field="skill_id",
                             hint="known skills: " + (", ".join(sorted(self.skills)) or "none"))
        return self.skills[skill_id]

    def fact(self, fact_id: str) -> FactCard:
        if fact_id not in self.facts:
            raise UsageError(f"unknown fact {fact_id!r}" + _did_you_mean(fact_id, self.facts), field="fact_id",
                             hint="known facts: " + (", ".join(sorted(self.facts)) or "none"))
        return self.facts[fact_id]

    def device_facts(self, arch: str | None) -> dict[str, Any]:
        """Machine-readable device facts (cu_count/sm_count, xcds, l2_mb, …) for a recipe predicate."""
        if not arch:
            return {}
        fact = self.facts.get(device_fact_id(arch))
        return dict(fact.data.get("data", {})) if fact else {}


def _did_you_mean(name: str, known: Any) -> str:
    """'; did you mean X?' for a near miss of a card or fact id (a typo, a missing _sm90), else ''."""
    import difflib

    close = difflib.get_close_matches(str(name)[:200], sorted(known), n=2, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
