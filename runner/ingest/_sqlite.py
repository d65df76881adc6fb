"""Read-only SQLite helpers shared by the nsys and rocpd readers."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable, Optional, TypeVar

from ..errors import InputError

T = TypeVar("T")


def _text(raw: bytes) -> str:
    # A damaged or foreign database can hold bytes that are not UTF-8; decoding must never raise
    # out of a reader (it would surface as a traceback instead of a one-line InputError).
    return raw.decode("utf-8", errors="replace")


def connect(path: Path) -> sqlite3.Connection:
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        con.text_factory = _text
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return con
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        # SQLite's own error text can quote non-UTF-8 bytes of a damaged schema; Python fails decoding it.
        raise InputError(f"SQLite file cannot be read ({type(exc).__name__}: {str(exc)[:120]})", path=str(path)) from None


def read(path: Path, kind: str, reader: Callable[[sqlite3.Connection, Path, Optional[str]], T], arch: Optional[str]) -> T:
    """Open read-only, run ``reader``, always close; any SQLite failure is one InputError naming the file."""
    con = connect(path)
    try:
        return reader(con, path, arch)
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        raise InputError(f"unexpected {kind} SQLite schema ({type(exc).__name__}: {str(exc)[:120]})", path=str(path)) from None
    finally:
        con.close()


def names(con: sqlite3.Connection) -> dict[str, str]:
    """lower-case name → real name of every table and view."""
    return {r[0].lower(): r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}


def columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
