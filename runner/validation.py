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
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from skillrun import __version__
from skillrun.atomic import is_temp_name, write_atomic
from skillrun.errors import SkillRunError
from skillrun.kb import bounded_yaml
from skillrun.kb.paths import kb_root, load_schema
from skillrun.redact import scrub
from skillrun.regular_files import read_regular


@lru_cache(maxsize=4)
def _validator(name: str = "validation"):
    import jsonschema

    schema = load_schema(name)
    return jsonschema.Draft202012Validator(schema)


def schema_of(record: dict[str, Any]) -> str:
    """Which schema a record follows: e2e records (`skill-run e2e`) say so in `kind`."""
    return "e2e" if record.get("kind") == "e2e_validation" else "validation"


def validate_record(record: dict[str, Any], where: str = "<artifact>") -> None:
    name = schema_of(record)
    try:
        errors = sorted(_validator(name).iter_errors(record), key=lambda e: [str(p) for p in e.absolute_path])
    except RecursionError:
        raise SkillRunError("validation artifact nests too deeply to check", path=where) from None
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


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:80]


def artifact_name(record: dict[str, Any]) -> str:
    shape = "x".join(f"{k}{v}" for k, v in record.get("shape", {}).items())
    stamp = record["created"].replace(":", "").replace("-", "").replace("+0000", "Z")
    # The mode stays visible even when a long MoE shape has to be shortened.
    return _slug(f"{stamp}_{record['recipe']['name']}_{shape}")[:100] + "_" + record["mode"] + ".yaml"


def _relative_paths(record: dict[str, Any]) -> None:
    """Paths inside an artifact are relative to the knowledge-base root, never this machine's checkout."""
    from skillrun.evidence import kb_relative

    for block, key in (("card", "path"), ("profile", "source")):
        sub = record.get(block)
        if isinstance(sub, dict) and isinstance(sub.get(key), str) and sub[key]:
            sub[key] = kb_relative(sub[key])


# An artifact is a few dozen KiB; one far past this is not evidence we wrote.
MAX_ARTIFACT_BYTES = 4 << 20


class _FlowList(list):
    """A long list of scalars (raw timing samples): one line in the YAML, not one line per value."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_FlowList, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def _flow(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _flow(v) for k, v in obj.items()}
    if isinstance(obj, list):
        if len(obj) > 8 and all(x is None or isinstance(x, (int, float, bool)) for x in obj):
            return _FlowList(obj)
        return [_flow(v) for v in obj]
    return obj


def dump_yaml(record: dict[str, Any]) -> str:
    """The artifact text: block style, except long scalar lists (samples), which stay on one line."""
    return yaml.dump(_flow(record), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110)


def write_artifact(record: dict[str, Any], root: Path | None = None) -> Path:
    """Validate and atomically write one artifact; returns its path. Never overwrites.

    The card's folder under ``validation/`` must be a real folder (a symlink there could send
    evidence anywhere); the file appears under its final name only once complete (see
    :mod:`skillrun.atomic`), and leftovers of killed writers in that folder are removed.
    """
    # Trace-derived text (kernel/op names, the command line) is scrubbed once more before it
    # becomes evidence that reports and agents will show.
    record = scrub(record)
    _relative_paths(record)
    validate_record(record)
    base = Path(root) if root is not None else kb_root() / "validation"
    folder = base / _slug(record["card"]["id"])
    if folder.is_symlink():
        raise SkillRunError("refusing to write evidence through a symlinked folder", path=str(folder))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SkillRunError(f"cannot create the evidence folder ({exc.strerror or exc})", path=str(folder)) from None
    name = artifact_name(record)
    text = dump_yaml(record)
    for n in range(1000):
        target = folder / (name if n == 0 else name.replace(".yaml", f"_{n}.yaml"))
        if os.path.lexists(target):
            continue
        try:
            # replace=False: os.link fails if the name appeared meanwhile, so evidence is never clobbered.
            return write_atomic(target, text, replace=False, no_symlink_folder=True)
        except FileExistsError:
            continue
    raise SkillRunError("more than 1000 artifacts with the same name", path=str(folder))


def artifact_files(folder: Path) -> list[Path]:
    """Every artifact under ``folder`` (sorted), leaving out temporary files of interrupted writes."""
    return sorted(p for p in Path(folder).rglob("*.yaml") if not is_temp_name(p.name))


def load_artifact(path: Path) -> dict[str, Any]:
    """Read one artifact: a regular file of bounded size, YAML without alias bombs, schema-valid."""
    try:
        text = read_regular(Path(path), MAX_ARTIFACT_BYTES, "validation artifact").decode("utf-8")
        data = bounded_yaml.load(text)
    except SkillRunError as exc:
        raise SkillRunError(f"cannot read validation artifact: {exc.reason}", path=str(path)) from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SkillRunError(f"cannot read validation artifact: {problem}", path=str(path)) from None
    if not isinstance(data, dict):
        raise SkillRunError("validation artifact is not a mapping", path=str(path))
    validate_record(data, where=str(path))
    return scrub(data)  # what reports and agents show of it
