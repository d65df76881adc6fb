"""Tuning / ablation / compile-prune artifacts: schema-checked YAML under ``validation/_tuning/<card>/``.

They live beside the validation artifacts (evidence, committed) but in their own folder and schema
(``schemas/tuning.schema.json``): a tuning run is not a validation of one recipe. Like validation
artifacts they are validated before anything touches the disk, written to a temporary file, fsync'd
and linked into place, and never overwritten.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from skillrun.errors import InputError, SkillRunError
from skillrun.kb.paths import kb_root, load_schema

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


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:80]


def _folder(record: dict[str, Any], root: Path | None) -> Path:
    base = Path(root) if root is not None else kb_root() / "validation"
    folder = base / FOLDER / _slug(record["card"]["id"])
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _name(record: dict[str, Any]) -> str:
    shape = "x".join(f"{k}{v}" for k, v in record["shape"].items())
    stamp = record["created"].replace(":", "").replace("-", "").replace("+0000", "Z")
    return _slug(f"{stamp}_{record['kind']}_{record['recipe']['name']}_{shape}")[:120] + ".yaml"


def reserve_path(record: dict[str, Any], root: Path | None = None) -> Path:
    """Claim a fresh artifact name now (an empty placeholder, created exclusively) so that a card
    change can cite the artifact before it is written."""
    folder, name = _folder(record, root), _name(record)
    target, n = folder / name, 1
    while True:
        try:
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return target
        except FileExistsError:
            target = folder / name.replace(".yaml", f"_{n}.yaml")
            n += 1


def write_tuning(record: dict[str, Any], root: Path | None = None, path: Path | None = None) -> Path:
    """Validate and atomically write; returns the path. ``root`` is the validation folder; ``path`` a
    name claimed with :func:`reserve_path` (replaced atomically), else a fresh name is chosen."""
    from skillrun.atomic import write_atomic
    from skillrun.redact import scrub

    record = scrub(record)
    validate_tuning(record)
    text = yaml.safe_dump(record, sort_keys=False, allow_unicode=True, width=110)
    if path is not None:
        return write_atomic(Path(path), text, replace=True, no_symlink_folder=True)  # our own placeholder
    folder, name = _folder(record, root), _name(record)
    n = 0
    while True:
        target = folder / (name if n == 0 else name.replace(".yaml", f"_{n}.yaml"))
        try:  # one temporary + rename path for every file we write (skillrun.atomic); never clobbers
            return write_atomic(target, text, replace=False, no_symlink_folder=True)
        except FileExistsError:
            n += 1


def load_tuning_artifact(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"cannot read tuning artifact: {str(exc).splitlines()[0]}", path=str(path)) from None
    if not isinstance(data, dict):
        raise InputError("tuning artifact is not a mapping", path=str(path))
    validate_tuning(data, where=str(path))
    return data


def relative(path: Path, root: Path | None = None) -> str:
    """Artifact paths are written relative to the knowledge-base root when they lie inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path(root or kb_root()).resolve()))
    except ValueError:
        return str(path)
