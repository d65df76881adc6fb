"""Validation artifacts: schema-checked YAML evidence written atomically under ``validation/``.

Re-running never destroys earlier evidence: every artifact gets a new, unique file name
(UTC time + card + recipe + shape + mode), is validated against the schema *before* anything
touches the disk, written to a fresh temporary file in the same folder, fsync'd and linked into place.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from skillrun import __version__
from skillrun.evidence.store import MAX_RECORD_BYTES, kb_relative, load_mapping, slug, stamp, write_new
from skillrun.io.atomic import is_temp_name
from skillrun.errors import SkillRunError
from skillrun.kb.paths import kb_root, load_schema
from skillrun.io.redact import scrub


@lru_cache(maxsize=4)
def _validator(name: str = "validation"):
    import jsonschema

    schema = load_schema(name)
    return jsonschema.Draft202012Validator(schema)


def schema_of(record: dict[str, Any]) -> str:
    """Which schema a record follows: e2e records (`skill-run e2e`) say so in `kind`."""
    return "e2e" if record.get("kind") == "e2e_validation" else "validation"


# How far ahead of this machine's clock a record's ``created`` may be (clock skew between machines).
FUTURE_SKEW = _dt.timedelta(hours=1)


def validate_record(record: dict[str, Any], where: str = "<artifact>") -> None:
    name = schema_of(record)
    try:
        errors = sorted(_validator(name).iter_errors(record), key=lambda e: [str(p) for p in e.absolute_path])
    except RecursionError:
        raise SkillRunError("validation artifact nests too deeply to check", path=where) from None
    if errors:
        e = errors[0]
        field = "/".join(str(p) for p in e.absolute_path) or "(top)"
        if list(e.absolute_path) == ["verdict"] and e.validator == "not":
            raise SkillRunError("validation artifact claims 'validated' on a CPU record (CPU numerics or compile-only "
                                "runs are never GPU evidence)", path=where, field="verdict")
        raise SkillRunError(f"validation artifact does not match schemas/{name}.schema.json: {e.message}", path=where, field=field)
    created = record.get("created")
    if isinstance(created, str):
        try:
            t = _dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
        except ValueError:
            raise SkillRunError(f"validation artifact's created time {created[:40]!r} is not an ISO-8601 time", path=where,
                                field="created") from None
        t = t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)
        if t > _dt.datetime.now(_dt.timezone.utc) + FUTURE_SKEW:
            raise SkillRunError(f"validation artifact is dated {created[:40]}, in the future: no run wrote it", path=where,
                                field="created")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _git(*args: str, cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd or kb_root(), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def runner_info() -> dict[str, Any]:
    """The commit the code came from. A device copy of the tree can carry an older ``.git`` under a
    newer working tree (seen on the lent H200: HEAD b3bfb7f, "dirty", for a run of a later commit),
    so ``SKILLRUN_GIT_REVISION``, set by whoever shipped the tree, wins; what git said is kept beside it."""
    head = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    env = os.environ.get("SKILLRUN_GIT_REVISION")
    out: dict[str, Any] = {"version": __version__, "git_revision": env or head or "unknown", "dirty": dirty}
    if env and head and not head.startswith(env) and not env.startswith(head):
        out["git_head_seen"] = head
        out["dirty"] = False  # relative to a HEAD that is not the stated commit: meaningless
    return out


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


def artifact_name(record: dict[str, Any]) -> str:
    shape = "x".join(f"{k}{v}" for k, v in record.get("shape", {}).items())
    # The mode stays visible even when a long MoE shape has to be shortened.
    return slug(f"{stamp(record['created'])}_{record['recipe']['name']}_{shape}")[:100] + "_" + record["mode"] + ".yaml"


def _relative_paths(record: dict[str, Any]) -> None:
    """Paths inside an artifact are relative to the knowledge-base root, never this machine's checkout."""
    for block, key in (("card", "path"), ("profile", "source")):
        sub = record.get(block)
        if isinstance(sub, dict) and isinstance(sub.get(key), str) and sub[key]:
            sub[key] = kb_relative(sub[key])


MAX_ARTIFACT_BYTES = MAX_RECORD_BYTES


def write_artifact(record: dict[str, Any], root: Path | None = None) -> Path:
    """Validate and atomically write one artifact under ``validation/<card>/``; returns its path.
    Never overwrites (see :mod:`skillrun.evidence.store`)."""
    # Trace-derived text (kernel/op names, the command line) is scrubbed once more before it
    # becomes evidence that reports and agents will show.
    record = scrub(record)
    _relative_paths(record)
    validate_record(record)
    base = Path(root) if root is not None else kb_root() / "validation"
    return write_new(base / slug(record["card"]["id"]), artifact_name(record), record)


def artifact_files(folder: Path) -> list[Path]:
    """Every artifact under ``folder`` (sorted), leaving out temporary files of interrupted writes."""
    return sorted(p for p in Path(folder).rglob("*.yaml") if not is_temp_name(p.name))


def load_artifact(path: Path) -> dict[str, Any]:
    """Read one artifact: a regular file of bounded size, YAML without alias bombs, schema-valid."""
    data = load_mapping(Path(path), "validation artifact")
    validate_record(data, where=str(path))
    return scrub(data)  # what reports and agents show of it
