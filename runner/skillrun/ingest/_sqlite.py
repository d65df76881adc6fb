"""Read-only SQLite helpers shared by the nsys and rocpd readers."""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from urllib.parse import quote
from typing import Callable, Optional, TypeVar

from ..errors import InputError

T = TypeVar("T")


def _text(raw: bytes) -> str:
    # A damaged or foreign database can hold bytes that are not UTF-8; decoding must never raise
    # out of a reader (it would surface as a traceback instead of a one-line InputError).
    return raw.decode("utf-8", errors="replace")


# Bounds on reading a database we did not write. A recursive VIEW named like the kernel table
# never ends and an infinite one grows without bound: a deadline (checked by SQLite's progress
# handler, so also inside one long statement), a heap limit while reading, and caps on the rows we
# keep end both with a one-line error instead of a hang or an exhausted machine.
DEADLINE_S = 300.0
HEAP_LIMIT_BYTES = 2 << 30
MAX_DEVICE_ROWS = 4096  # rows read from a device/agent table (real ones have a few)
_PROGRESS_STEPS = 20_000  # SQLite VM steps between deadline checks


def uri_for(path: Path) -> str:
    """A read-only ``file:`` URI for ``path`` with every special character escaped.

    Unescaped, a ``#`` in the file name starts the URI's fragment (dropping ``mode=ro``, so SQLite
    may create an empty database beside it) and a ``?`` starts its query (another database).
    """
    return "file:" + quote(str(Path(path).resolve()), safe="/") + "?mode=ro"


def connect(path: Path) -> sqlite3.Connection:
    try:
        con = sqlite3.connect(uri_for(path), uri=True)
    except (sqlite3.Error, UnicodeDecodeError, OSError) as exc:
        raise InputError(f"SQLite file cannot be opened ({type(exc).__name__}: {str(exc)[:120]})", path=str(path)) from None
    try:
        con.text_factory = _text
        con.execute("PRAGMA query_only = 1")
        deadline = time.monotonic() + DEADLINE_S
        con.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, _PROGRESS_STEPS)
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return con
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        con.close()
        # SQLite's own error text can quote non-UTF-8 bytes of a damaged schema; Python fails decoding it.
        raise InputError(f"SQLite file cannot be read ({type(exc).__name__}: {str(exc)[:120]})", path=str(path)) from None


def _heap_limit(n: int) -> int:
    """Set SQLite's process-wide hard heap limit (0: none); returns the previous one."""
    probe = sqlite3.connect(":memory:")
    try:
        row = probe.execute(f"PRAGMA hard_heap_limit = {int(n)}").fetchone()
        return int(row[0]) if row else 0
    except sqlite3.Error:
        return 0
    finally:
        probe.close()


def read(path: Path, kind: str, reader: Callable[[sqlite3.Connection, Path, Optional[str]], T], arch: Optional[str]) -> T:
    """Open read-only, run ``reader``, always close; any SQLite failure is one InputError naming the file."""
    con = connect(path)
    previous = _heap_limit(HEAP_LIMIT_BYTES)
    try:
        return reader(con, path, arch)
    except sqlite3.OperationalError as exc:
        if "interrupted" in str(exc):
            raise InputError(f"reading the {kind} database took longer than {DEADLINE_S:g} s (a recursive or "
                             "endless VIEW?)", path=str(path)) from None
        if "out of memory" in str(exc).lower():
            raise InputError(f"reading the {kind} database needed more than {HEAP_LIMIT_BYTES >> 20} MiB of "
                             "SQLite memory (an endless VIEW?)", path=str(path)) from None
        raise InputError(f"unexpected {kind} SQLite schema ({type(exc).__name__}: {str(exc)[:120]})", path=str(path)) from None
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        raise InputError(f"unexpected {kind} SQLite schema ({type(exc).__name__}: {str(exc)[:120]})", path=str(path)) from None
    except MemoryError:
        raise InputError(f"the {kind} database is too large to read", path=str(path)) from None
    finally:
        con.close()
        _heap_limit(previous)


def names(con: sqlite3.Connection) -> dict[str, str]:
    """lower-case name → real name of every table and view."""
    return {r[0].lower(): r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}


def columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
