"""Tuning / ablation / compile-prune artifacts: schema-checked YAML under ``validation/_tuning/<card>/``.

They live beside the validation artifacts (evidence, committed) but in their own folder and schema
(``schemas/tuning.schema.json``): a tuning run is not a validation of one recipe. Like validation
artifacts they are validated before anything touches the disk, written to a temporary file, fsync'd
and linked into place, and never overwritten.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from skillrun.evidence.store import fill_reserved, load_mapping, reserve, slug, stamp, write_new
from skillrun.errors import InputError, SkillRunError
from skillrun.kb.paths import kb_root, load_schema
from skillrun.io.redact import scrub

FOLDER = "_tuning"


@lru_cache(maxsize=1)
def _validator():
    import jsonschema

    return jsonschema.Draft202012Validator(load_schema("tuning"))


def validate_tuning(record: dict[str, Any], where: str = "<tuning artifact>") -> None:
    errors = sorted(_validator().iter_errors(record), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        field = "/".join(str(p) for p in e.absolute_path) or "(top)"
        raise SkillRunError(f"tuning artifact does not match schemas/tuning.schema.json: {e.message}", path=where, field=field)


def is_tuning_artifact(path: Path, validation_dir: Path) -> bool:
    try:
        return Path(path).relative_to(validation_dir).parts[0] == FOLDER
    except (ValueError, IndexError):
        return False


def _folder(record: dict[str, Any], root: Path | None) -> Path:
    base = Path(root) if root is not None else kb_root() / "validation"
    return base / FOLDER / slug(record["card"]["id"])


def _name(record: dict[str, Any]) -> str:
    shape = "x".join(f"{k}{v}" for k, v in record["shape"].items())
    return slug(f"{stamp(record['created'])}_{record['kind']}_{record['recipe']['name']}_{shape}")[:120] + ".yaml"


def reserve_path(record: dict[str, Any], root: Path | None = None) -> Path:
    """Claim a fresh artifact name now so that a card change can cite the artifact before it is written."""
    return reserve(_folder(record, root), _name(record))


def write_tuning(record: dict[str, Any], root: Path | None = None, path: Path | None = None) -> Path:
    """Validate and atomically write; returns the path. ``root`` is the validation folder; ``path`` a
    name claimed with :func:`reserve_path` (replaced atomically), else a fresh name is chosen."""
    record = scrub(record)
    validate_tuning(record)
    if path is not None:
        return fill_reserved(Path(path), record)
    return write_new(_folder(record, root), _name(record), record)


def load_tuning_artifact(path: Path) -> dict[str, Any]:
    data = load_mapping(Path(path), "tuning artifact", error=InputError)
    validate_tuning(data, where=str(path))
    return data
