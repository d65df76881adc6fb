"""Validation artifacts: schema-checked YAML evidence written atomically under ``validation/``.

Re-running never destroys earlier evidence: every artifact gets a new, unique file name
(UTC time + card + recipe + shape + mode), is validated against the schema *before* anything
touches the disk, written to a temporary file in the same folder, fsync'd and renamed into place.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import re
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from skillrun import __version__
from skillrun.errors import SkillRunError
from skillrun.kb.paths import kb_root, schema_path


@lru_cache(maxsize=4)
def _validator(name: str = "validation"):
    import jsonschema

    schema = json.loads(schema_path(name).read_text())
    return jsonschema.Draft202012Validator(schema)


def schema_of(record: dict[str, Any]) -> str:
    """Which schema a record follows: e2e records (`skill-run e2e`) say so in `kind`."""
    return "e2e" if record.get("kind") == "e2e_validation" else "validation"


def validate_record(record: dict[str, Any], where: str = "<artifact>") -> None:
    name = schema_of(record)
    errors = sorted(_validator(name).iter_errors(record), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        field = "/".join(str(p) for p in e.absolute_path) or "(top)"
        raise SkillRunError(f"validation artifact does not match schemas/{name}.schema.json: {e.message}", path=where, field=field)


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _git(*args: str, cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd or kb_root(), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def runner_info() -> dict[str, Any]:
    rev = _git("rev-parse", "HEAD") or os.environ.get("SKILLRUN_GIT_REVISION") or "unknown"
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {"version": __version__, "git_revision": rev, "dirty": dirty}


def card_revision(card_path: Path) -> str:
    rev = _git("log", "-1", "--format=%H", "--", str(card_path))
    if not rev:
        return os.environ.get("SKILLRUN_GIT_REVISION", "uncommitted")
    if _git("status", "--porcelain", "--", str(card_path)):
        return rev + "+modified"
    return rev


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def software_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": None, "triton": None, "flydsl": None}
    from importlib import metadata

    for name in ("torch", "triton", "flydsl"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return info


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:80]


def artifact_name(record: dict[str, Any]) -> str:
    shape = "x".join(f"{k}{v}" for k, v in record.get("shape", {}).items())
    stamp = record["created"].replace(":", "").replace("-", "").replace("+0000", "Z")
    # The mode stays visible even when a long MoE shape has to be shortened.
    return _slug(f"{stamp}_{record['recipe']['name']}_{shape}")[:100] + "_" + record["mode"] + ".yaml"


def write_artifact(record: dict[str, Any], root: Path | None = None) -> Path:
    """Validate and atomically write one artifact; returns its path. Never overwrites."""
    validate_record(record)
    base = Path(root) if root is not None else kb_root() / "validation"
    folder = base / _slug(record["card"]["id"])
    folder.mkdir(parents=True, exist_ok=True)
    name = artifact_name(record)
    target = folder / name
    n = 1
    while target.exists():
        target = folder / name.replace(".yaml", f"_{n}.yaml")
        n += 1
    text = yaml.safe_dump(record, sort_keys=False, allow_unicode=True, width=110)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".yaml", dir=folder)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        # os.link fails if the target appeared meanwhile: evidence is never clobbered.
        os.link(tmp, target)
    except FileExistsError:
        target = folder / name.replace(".yaml", f"_{os.getpid()}.yaml")
        os.link(tmp, target)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    return target


def load_artifact(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SkillRunError(f"cannot read validation artifact: {exc}", path=str(path)) from None
    if not isinstance(data, dict):
        raise SkillRunError("validation artifact is not a mapping", path=str(path))
    validate_record(data, where=str(path))
    return data
