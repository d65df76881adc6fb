"""Reading trace files: gzip transparently, bounded memory, one-line errors.

Only stdlib here (plus nothing heavy), because worker processes import this module too.
"""
from __future__ import annotations

import csv
import gzip
import os
import signal
import threading
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from ..errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"
# A decompressed trace larger than this is refused: past it the machine, not the tool, is the limit.
MAX_TRACE_BYTES = 64 << 30


# The csv module refuses fields over 128 KiB by default; a long kernel name or args column is
# valid CSV, and the whole file is already size-capped, so the field limit is lifted to the cap.
_CSV_FIELD_LIMIT = 2**31 - 1


def csv_reader(lines):
    """``csv.reader`` that accepts fields of any length (up to the file's own size cap)."""
    if csv.field_size_limit() < _CSV_FIELD_LIMIT:
        csv.field_size_limit(_CSV_FIELD_LIMIT)
    return csv.reader(lines)


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While reading, SIGTERM unwinds the stack (SystemExit) like Ctrl-C does, so the ``finally``
    blocks that remove decompressed temporary traces run; SIGTERM's default would kill the
    process on the spot and leave gigabytes in /tmp. An application's own handler is left alone."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def _unwind(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:  # missing, permission, a directory …
        raise InputError(f"cannot read file ({exc.strerror or exc})", path=str(path)) from None


def check_readable(path: Path) -> None:
    """A regular, openable file; a FIFO, device or socket is refused at once (it would block or never end)."""
    from ..regular_files import open_regular

    if not os.path.lexists(path):
        raise InputError("file not found", path=str(path))
    if path.is_dir():
        raise InputError("is a directory, expected a trace file", path=str(path))
    os.close(open_regular(path, "trace file"))


def read_head(path: Path, n: int = 65536) -> bytes:
    """First ``n`` bytes of the file as stored (compressed if it is gzip)."""
    with open(path, "rb") as fh:
        return fh.read(n)


def is_gzip(path: Path) -> bool:
    return read_head(path, 2) == GZIP_MAGIC


def gzip_isize(path: Path) -> Optional[int]:
    """Uncompressed size mod 2**32 from the gzip trailer (a size hint, not a promise)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(-4, os.SEEK_END)
            tail = fh.read(4)
    except OSError:
        return None
    if len(tail) != 4:
        return None
    return int.from_bytes(tail, "little")


def content_size_hint(path: Path) -> int:
    """Best guess of the decompressed size, for choosing the small or the streaming path."""
    size = file_size(path)
    if is_gzip(path):
        isize = gzip_isize(path) or 0
        # ISIZE wraps at 4 GiB; a ratio below 1 means it wrapped or the file is odd.
        return max(isize, size * 4) if isize < size else isize
    return size


def iter_decompressed(path: Path, chunk: int = 16 << 20) -> Iterator[bytes]:
    """Decompressed content of a gzip file, chunk by chunk (zlib streaming, multi-member safe)."""
    try:
        with open(path, "rb") as fh:
            d: Optional[zlib._Decompress] = zlib.decompressobj(wbits=31)
            total = 0
            while True:
                raw = fh.read(chunk)
                if not raw:
                    break
                while raw:
                    if d is None:
                        if raw[:2] != GZIP_MAGIC:
                            raw = b""  # trailing bytes after the last member: gzip ignores them too
                            break
                        d = zlib.decompressobj(wbits=31)
                    out = d.decompress(raw)
                    if out:
                        total += len(out)
                        if total > MAX_TRACE_BYTES:
                            raise InputError("decompressed trace is larger than 64 GiB", path=str(path))
                        yield out
                    if d.eof:
                        raw = d.unused_data
                        d = None
                    else:
                        raw = b""
            if d is not None:
                tail = d.flush()
                if tail:
                    yield tail
                raise InputError("gzip stream is truncated (unexpected end of file)", path=str(path))
    except zlib.error as exc:
        raise InputError(f"corrupt gzip data ({exc})", path=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read file ({exc.strerror or exc})", path=str(path)) from None


def iter_content(path: Path, chunk: int = 16 << 20) -> Iterator[bytes]:
    """The file's content, decompressed when it is gzip."""
    if is_gzip(path):
        yield from iter_decompressed(path, min(chunk, 256 << 10))
        return
    try:
        with open(path, "rb") as fh:
            while True:
                b = fh.read(chunk)
                if not b:
                    return
                yield b
    except OSError as exc:
        raise InputError(f"cannot read file ({exc.strerror or exc})", path=str(path)) from None


def read_content(path: Path, limit: int = MAX_TRACE_BYTES) -> bytes:
    """Whole decompressed content (for small files)."""
    parts = []
    total = 0
    for b in iter_content(path):
        total += len(b)
        if total > limit:
            raise InputError(f"file is larger than {limit >> 20} MiB for this reader", path=str(path))
        parts.append(b)
    return b"".join(parts)


def content_head(path: Path, n: int = 1 << 20) -> bytes:
    """First ``n`` decompressed bytes (or fewer)."""
    if not is_gzip(path):
        return read_head(path, n)
    out = bytearray()
    try:
        with gzip.open(path, "rb") as fh:
            while len(out) < n:
                b = fh.read(min(1 << 20, n - len(out)))
                if not b:
                    break
                out += b
    except (OSError, EOFError, zlib.error) as exc:
        if not out:
            raise InputError(f"corrupt gzip data ({exc})", path=str(path)) from None
    return bytes(out)
