"""What a ``validation/`` folder holds, counted one way for every reader (`report`, `lint`, the agent's
read_validation): validation artifacts (the evidence index's entries, invalid files included), e2e
records and tuning artifacts. Each used to count its own subset of the same folder (89, 90 and 91
files for one checkout), so none of them could be checked against another.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from skillrun.io.atomic import is_temp_name


def tuning_files(folder: Path) -> list[Path]:
    """Tuning, ablation and compile-prune records (``validation/_tuning/``, their own schema)."""
    sub = Path(folder) / "_tuning"
    if not sub.is_dir():
        return []
    return sorted(f for f in sub.rglob("*.yaml") if not f.name.startswith(".") and not is_temp_name(f.name))


def counts(ev: Any, folder: Path | None = None) -> dict[str, int]:
    """``validation_artifacts`` (as the report counts them), ``e2e_records``, ``tuning_artifacts`` and ``files``."""
    c = {"validation_artifacts": len(ev.entries), "e2e_records": len(ev.e2e),
         "tuning_artifacts": len(tuning_files(folder)) if folder is not None else 0}
    c["files"] = sum(c.values())
    return c


def counts_text(c: dict[str, int]) -> str:
    """``89 validation artifacts, 1 e2e record, 1 tuning artifact``: the same words everywhere."""
    def n(k: int, word: str) -> str:
        return f"{k} {word}{'' if k == 1 else 's'}"

    parts = [n(c["validation_artifacts"], "validation artifact")]
    if c.get("e2e_records"):
        parts.append(n(c["e2e_records"], "e2e record"))
    if c.get("tuning_artifacts"):
        parts.append(n(c["tuning_artifacts"], "tuning artifact"))
    return ", ".join(parts)
