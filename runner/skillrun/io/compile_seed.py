"""A carried Triton compile cache (execute/compile_ahead.py's folder) as the seed of a sandboxed role's own cache.

The sandbox gives each role of untrusted processes a compile cache of its own (skillrun.io.sandbox.cache_dir:
the accused's, the references'), so a port can poison no cache a reference reads. A folder compiled ahead for a
device call holds the ports' kernels; ``SKILLRUN_COMPILE_SEED`` names it, and the accused's processes copy the
entries their cache lacks from it (when they enter the sandbox, and before each task of a card's long-lived
server, so kernels compiled while the GPU measures arrive too). The seed is only ever read from inside; the copy
is the role's own. Triton names an entry's files by absolute path in its group files (``__grp__*.json``), so each
copied entry is relocated.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

SEED_ENV = "SKILLRUN_COMPILE_SEED"


def seed_folder() -> str | None:
    s = os.environ.get(SEED_ENV)
    return s if s and os.path.isdir(s) else None


def relocate(folder: str | Path) -> int:
    """Point every cache group of ``folder`` at the files where they are now (Triton writes absolute
    paths, so a carried folder would miss every entry); returns the groups rewritten."""
    n = 0
    for grp in Path(folder).glob("*/__grp__*.json"):
        n += _relocate_group(grp)
    return n


def _relocate_group(grp: Path) -> int:
    try:
        data = json.loads(grp.read_text())
        paths = data["child_paths"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    moved = {name: str(grp.parent / Path(p).name) for name, p in paths.items() if (grp.parent / Path(p).name).exists()}
    if moved == paths:
        return 0
    tmp = grp.with_name(grp.name + ".tmp")
    tmp.write_text(json.dumps({"child_paths": moved}))
    os.replace(tmp, grp)
    return 1


def seed(dest: str | Path, src: str | None = None) -> int:
    """Copy the entries (a folder per Triton cache key) of ``src`` (default: the seed the environment names) that
    ``dest`` lacks, each relocated and renamed into place whole; returns how many were copied."""
    src = src or seed_folder()
    if not src:
        return 0
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    n = 0
    try:
        entries = list(os.scandir(src))
    except OSError:
        return 0
    for e in entries:
        if not e.is_dir(follow_symlinks=False) or (dest / e.name).exists():
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f".{e.name}-", dir=dest))
        try:
            for f in os.scandir(e.path):
                if f.is_file(follow_symlinks=False):
                    shutil.copyfile(f.path, tmp / f.name)
            for grp in tmp.glob("__grp__*.json"):
                _relocate_group_to(grp, dest / e.name)
            os.rename(tmp, dest / e.name)
            n += 1
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return n


def _relocate_group_to(grp: Path, final: Path) -> None:
    try:
        paths = json.loads(grp.read_text())["child_paths"]
        grp.write_text(json.dumps({"child_paths": {k: str(final / Path(p).name) for k, p in paths.items()}}))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        grp.unlink(missing_ok=True)  # an unreadable group serves nothing; Triton compiles instead
