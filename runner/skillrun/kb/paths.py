"""Where the knowledge base lives.

Resolution order: an explicit path (``--kb PATH``) > ``$SKILLRUN_KB`` > the source checkout that
holds this package (runner/skillrun/ sits two folders below skills/ and schemas/) > the copy installed with the wheel
(the ``skillrun_kb`` data package).
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from skillrun.errors import SkillRunError

_override: Path | None = None
# runner/skillrun/kb/paths.py: the checkout's root is three folders up.
_CHECKOUT = Path(__file__).resolve().parents[3]


def _looks_like_kb(p: Path) -> bool:
    return (p / "skills").is_dir() and (p / "schemas").is_dir()


def set_kb_root(path: str | Path | None) -> None:
    """Pin the knowledge base for this process (the CLI's ``--kb``)."""
    global _override
    if path is None:
        _override = None
        return
    p = Path(path).expanduser().resolve()
    if not _looks_like_kb(p):
        raise SkillRunError("not a knowledge base (needs skills/ and schemas/ folders)", path=str(p), exit_code=2)
    _override = p


def kb_root() -> Path:
    if _override is not None:
        return _override
    env = os.environ.get("SKILLRUN_KB")
    if env:
        p = Path(env).expanduser().resolve()
        if not _looks_like_kb(p):
            raise SkillRunError("SKILLRUN_KB does not point at a knowledge base (needs skills/ and schemas/)", path=str(p), exit_code=2)
        return p
    checkout = _CHECKOUT
    if _looks_like_kb(checkout):
        return checkout
    spec = importlib.util.find_spec("skillrun_kb")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if _looks_like_kb(Path(loc)):
            return Path(loc)
    raise SkillRunError("no knowledge base found; pass --kb PATH or set SKILLRUN_KB", exit_code=2)


def _engine_kb() -> Path | None:
    """The knowledge base that ships with this package (the checkout, else the installed data)."""
    checkout = _CHECKOUT
    if (checkout / "schemas").is_dir():
        return checkout
    spec = importlib.util.find_spec("skillrun_kb")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / "schemas").is_dir():
            return Path(loc)
    return None


def schema_path(name: str) -> Path:
    """The JSON Schema ``name`` as shipped with the engine, never the one in ``--kb``.

    The schemas are the rules cards and artifacts are judged by; a knowledge base is untrusted
    input, and its own ``schemas/`` could loosen them (``true``), hang the checker (a backtracking
    ``pattern``), or point elsewhere (a ``file://`` ``$ref``, a symlink to ``/dev/zero``).
    """
    root = _engine_kb()
    if root is None:
        raise SkillRunError("the package's schemas/ folder is missing (a broken install?)", exit_code=5)
    return root / "schemas" / f"{name}.schema.json"


MAX_SCHEMA_BYTES = 1 << 20  # ours are under 20 KiB


def load_schema(name: str) -> dict:
    """The parsed engine schema ``name`` (a regular file, size-capped)."""
    import json

    from skillrun.io.regular_files import read_regular

    path = schema_path(name)
    return json.loads(read_regular(path, MAX_SCHEMA_BYTES, "schema"))
