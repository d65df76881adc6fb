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
    root: Path
    skills: dict[str, SkillCard] = field(default_factory=dict)
    facts: dict[str, FactCard] = field(default_factory=dict)
    errors: list[SkillRunError] = field(default_factory=list)  # load-time problems (lint reports them)

    @classmethod
    def load(cls, root: Path | None = None) -> "SkillIndex":
        root = Path(root) if root is not None else kb_root()
        idx = cls(root=root)
        for path in sorted((root / "facts").glob("*.md")):
            fact, errs = read_fact(path)
            idx.errors += errs
            if fact is not None:
                if fact.id in idx.facts:
                    idx.errors.append(SkillRunError(f"duplicate fact id {fact.id!r}", path=str(path), field="id"))
                idx.facts[fact.id] = fact
        for path in sorted((root / "skills").glob("*/SKILL.md")):
            card, errs = read_skill(path)
            idx.errors += errs
            if card is not None:
                if card.id in idx.skills:
                    idx.errors.append(SkillRunError(f"duplicate skill id {card.id!r}", path=str(path), field="id"))
                idx.skills[card.id] = card
        return idx

    def skill(self, skill_id: str) -> SkillCard:
        if skill_id not in self.skills:
            known = ", ".join(sorted(self.skills)) or "none"
            raise UsageError(f"unknown skill {skill_id!r}", field="skill_id", hint=f"known skills: {known}")
        return self.skills[skill_id]

    def fact(self, fact_id: str) -> FactCard:
        if fact_id not in self.facts:
            known = ", ".join(sorted(self.facts)) or "none"
            raise UsageError(f"unknown fact {fact_id!r}", field="fact_id", hint=f"known facts: {known}")
        return self.facts[fact_id]

    def device_facts(self, arch: str | None) -> dict[str, Any]:
        """Machine-readable device facts (cu_count/sm_count, xcds, l2_mb, …) for a recipe predicate."""
        if not arch:
            return {}
        fact = self.facts.get(device_fact_id(arch))
        return dict(fact.data.get("data", {})) if fact else {}
