"""Where evidence files live and how they are named, written and read back: validation artifacts,
tuning records and e2e records all go through here, so each promise is kept once.

- A file's name is a slug of what it records (time stamp, recipe, shape …), never free text.
- A record is never overwritten: a name already taken gets ``_1``, ``_2`` … (at most
  :data:`MAX_SAME_NAME` of them, so a full folder is an error, not an endless loop).
- It is written through :mod:`skillrun.io.atomic` (complete or absent), into a folder that may not be
  a symlink (a planted link there could send evidence anywhere).
- Paths inside a record are relative to the knowledge-base root (:func:`kb_relative`), never this
  machine's checkout.
- Every file written here gets its line in the folder's ledger (:mod:`skillrun.evidence.ledger`):
  the evidence index trusts only files the runner wrote and nobody changed since.
- Reading one back is bounded: a regular file of at most :data:`MAX_RECORD_BYTES`, YAML whose
  aliases cannot expand past the node budget.

What a record holds and its schema stay with its writer (:mod:`skillrun.evidence.validation`,
:mod:`skillrun.evidence.tuning_artifact`, :mod:`skillrun.e2e.record`).
"""
from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from skillrun.evidence import ledger
from skillrun.io.atomic import write_atomic
from skillrun.errors import SkillRunError
from skillrun.kb import bounded_yaml
from skillrun.io.regular_files import read_regular

# A record is a few dozen KiB; one far past this is not evidence we wrote.
MAX_RECORD_BYTES = 4 << 20
MAX_SAME_NAME = 1000
# The folders of a knowledge base: an absolute path from another checkout is cut back to the first one.
KB_FOLDERS = ("skills", "kernels", "validation", "facts", "schemas", "runner", "benchmarks", "tests")


def slug(text: str, limit: int = 80) -> str:
    """``text`` as a file-name part: runs of anything but letters, digits, ``_.-`` become one ``-``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:limit]


def stamp(created: str) -> str:
    """A record's ``created`` time (ISO 8601, UTC) as it opens a file name: 20261129T092451Z."""
    return created.replace(":", "").replace("-", "").replace("+0000", "Z")


def kb_relative(path: str | Path, root: Path | None = None) -> str:
    """A path as it should be written in a record: relative to the knowledge-base root.

    Absolute paths under ``root`` (default: the knowledge base in use) become relative to it;
    absolute paths from another checkout are cut back to their first knowledge-base folder; anything
    else, a relative path included (records hold KB-relative paths), is returned as written. A writer
    holding a path relative to the working folder resolves it first (:func:`machine_path_in_kb`).
    """
    text = str(path)
    p = Path(text)
    if not p.is_absolute():
        return PurePosixPath(p.as_posix()).as_posix()
    if root is None:
        try:
            from skillrun.kb.paths import kb_root

            root = kb_root()
        except SkillRunError:
            root = None
    if root is not None:
        try:
            return p.resolve().relative_to(Path(root).resolve()).as_posix()
        except (ValueError, OSError):
            pass
    parts = p.parts
    for i, part in enumerate(parts):
        if part in KB_FOLDERS and i + 1 < len(parts):
            return PurePosixPath(*parts[i:]).as_posix()
    return text


def machine_path_in_kb(path: str | Path, root: Path | None = None) -> str:
    """A path on this machine (relative ones read from the working folder, as `--kb ./kb` gives
    them) as a record writes it: :func:`kb_relative` of the absolute path."""
    return kb_relative(Path(path).absolute(), root)


def record_path(path: str | Path, root: Path | None = None) -> str:
    """A path on this machine as a record may carry it: KB-relative (:func:`machine_path_in_kb`), and a
    path that stays absolute (outside the knowledge base: a working folder, a /tmp plan) redacted to
    ``<redacted>/<its file name>``, so no record names this machine's folders."""
    from skillrun.io.redact import REDACTED

    rel = machine_path_in_kb(path, root)
    if not Path(rel).is_absolute():
        return rel
    name = Path(rel).name
    return f"{REDACTED}/{name}" if name else REDACTED


def record_command(words: list[str] | str, root: Path | None = None) -> list[str] | str:
    """A command line for a record: every absolute path in it (a word, or the value of ``--opt=PATH``)
    passed through :func:`record_path`; other words as written."""
    def one(w: str) -> str:
        head, eq, tail = w.partition("=")
        if eq and tail.startswith("/"):
            return f"{head}={record_path(tail, root)}"
        return record_path(w, root) if w.startswith("/") else w

    if isinstance(words, str):
        return " ".join(one(w) for w in words.split(" "))
    return [one(str(w)) for w in words]


def record_folder(folder: Path) -> Path:
    """``folder``, created if missing; a symlink there is refused."""
    folder = Path(folder)
    if folder.is_symlink():
        raise SkillRunError("refusing to write evidence through a symlinked folder", path=str(folder))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SkillRunError(f"cannot create the evidence folder ({exc.strerror or exc})", path=str(folder)) from None
    return folder


def _numbered(name: str, n: int) -> str:
    return name if n == 0 else name.replace(".yaml", f"_{n}.yaml")


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


def dump(record: dict[str, Any]) -> str:
    """A record's text: block style, except long scalar lists (samples), which stay on one line."""
    return yaml.dump(_flow(record), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110)


def write_new(folder: Path, name: str, record: dict[str, Any]) -> Path:
    """Write ``record`` as YAML under ``name`` in ``folder`` (or the first free numbered name);
    returns the path. Never replaces a file."""
    folder = record_folder(folder)
    text = dump(record)
    for n in range(MAX_SAME_NAME):
        target = folder / _numbered(name, n)
        if os.path.lexists(target):
            continue
        try:
            # replace=False: os.link fails if the name appeared meanwhile, so evidence is never clobbered.
            written = write_atomic(target, text, replace=False, no_symlink_folder=True)
        except FileExistsError:
            continue
        ledger.record(written, text.encode("utf-8"))  # what the runner wrote (skillrun.evidence.ledger)
        return written
    raise SkillRunError(f"more than {MAX_SAME_NAME} records with the same name", path=str(folder / name))


def reserve(folder: Path, name: str) -> Path:
    """Claim a fresh name now (an empty placeholder, created exclusively) so that other text can cite
    the record before it exists; :func:`fill_reserved` writes it."""
    folder = record_folder(folder)
    for n in range(MAX_SAME_NAME):
        target = folder / _numbered(name, n)
        try:
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o644))
            return target
        except FileExistsError:
            continue
    raise SkillRunError(f"more than {MAX_SAME_NAME} records with the same name", path=str(folder / name))


def fill_reserved(path: Path, record: dict[str, Any]) -> Path:
    """Write ``record`` over the placeholder that :func:`reserve` claimed (our own file: replaced atomically)."""
    text = dump(record)
    written = write_atomic(Path(path), text, replace=True, no_symlink_folder=True)
    ledger.record(written, text.encode("utf-8"))
    return written


def load_mapping(path: Path, what: str, error: type[SkillRunError] = SkillRunError) -> dict[str, Any]:
    """Read one record: a regular file of bounded size, YAML without alias bombs, a mapping. Failures
    raise ``error`` naming the file and saying "cannot read {what}"; the schema is the caller's."""
    try:
        text = read_regular(Path(path), MAX_RECORD_BYTES, what).decode("utf-8")
        data = bounded_yaml.load(text)
    except SkillRunError as exc:
        raise error(f"cannot read {what}: {exc.reason}", path=str(path)) from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"cannot read {what}: {problem}", path=str(path)) from None
    if not isinstance(data, dict):
        raise error(f"{what} is not a mapping", path=str(path))
    return data
