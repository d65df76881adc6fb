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
# Real traces compress 7-25x (JSON and CSV alike); a file that expands past this ratio is a gzip
# bomb, not a profile. The slack lets tiny files expand freely (headers compress very well).
MAX_GZIP_RATIO = 100
GZIP_RATIO_SLACK = 64 << 20


class ContentTooLarge(InputError):
    """The content is larger than the reader's limit (a caller may fall back to a streaming path)."""


def available_memory() -> Optional[int]:
    """Bytes of memory the kernel says can be had without swapping (Linux), else None."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def disk_budget(folder: str) -> int:
    """How much may be decompressed into ``folder``: most of its free space, at most MAX_TRACE_BYTES."""
    import shutil

    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return MAX_TRACE_BYTES
    return max(0, min(MAX_TRACE_BYTES, free - (1 << 30), int(free * 0.8)))


def memory_budget(limit: int) -> int:
    """``limit`` lowered to half of the memory available now (content read whole is held in memory)."""
    avail = available_memory()
    return limit if avail is None else max(64 << 20, min(limit, avail // 2))


# The csv module refuses fields over 128 KiB by default; a long kernel name or args column is
# valid CSV, so the limit is raised, but not without bound: a field past this is refused (one line
# error) rather than held whole. Names kept from it are cut further (_profile.MAX_KEPT_NAME).
_CSV_FIELD_LIMIT = 64 << 20


def csv_reader(lines):
    """``csv.reader`` that accepts fields of any length (up to the file's own size cap)."""
    if csv.field_size_limit() != _CSV_FIELD_LIMIT:
        csv.field_size_limit(_CSV_FIELD_LIMIT)
    return csv.reader(lines)


def stream_csv(path: Path, find_header, head_lines: int = 2000):
    """(format, rows) of a CSV trace read as a stream: ``find_header(text)`` locates the header in
    the first ``head_lines`` lines (it returns (format, line index)); ``rows`` starts at the header
    row. Memory is one row at a time, not the file (nor its decompressed copy)."""
    import itertools

    lines = iter_lines(path)
    head = list(itertools.islice(lines, head_lines))
    fmt, idx = find_header("".join(head))
    if fmt is None:
        return None, iter(())
    return fmt, csv_reader(itertools.chain(head[idx:], lines))


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
    from skillrun.io.regular_files import open_regular

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


_STEP = 64 << 20  # most bytes one zlib call may produce


def iter_decompressed(path: Path, chunk: int = 16 << 20, budget: Optional[int] = None) -> Iterator[bytes]:
    """Decompressed content of a gzip file, chunk by chunk (zlib streaming, multi-member safe).

    Bounded twice: by ratio to the compressed size (MAX_GZIP_RATIO, a gzip bomb) and by ``budget``
    (the caller's absolute allowance: free disk for a temporary copy, memory for content held
    whole), whichever comes first; each ends the read with an InputError naming the bound.
    """
    size = file_size(path)
    by_ratio = MAX_GZIP_RATIO * size + GZIP_RATIO_SLACK
    cap = min(MAX_TRACE_BYTES, by_ratio, budget if budget is not None else MAX_TRACE_BYTES)
    try:
        with open(path, "rb") as fh:
            d: Optional[zlib._Decompress] = zlib.decompressobj(wbits=31)
            total = 0
            while True:
                raw = fh.read(chunk)
                if not raw:
                    break
                pending = False
                while raw or pending:
                    if d is None:
                        if raw[:2] != GZIP_MAGIC:
                            raw = b""  # trailing bytes after the last member: gzip ignores them too
                            break
                        d = zlib.decompressobj(wbits=31)
                    # max_length: one small block of a bomb must not expand to gigabytes in one call;
                    # a full output block may leave more to come for the same input (``pending``).
                    out = d.decompress(raw, _STEP)
                    raw = d.unconsumed_tail
                    pending = len(out) == _STEP and not d.eof
                    if out:
                        total += len(out)
                        if total > cap:
                            if cap == by_ratio:
                                why = f"expands more than {MAX_GZIP_RATIO}x its compressed size (a gzip bomb?)"
                            elif budget is not None and cap == budget:
                                why = f"is larger than the {_human(budget)} that can be spared for it here (free disk or memory)"
                            else:
                                why = f"is larger than {_human(MAX_TRACE_BYTES)}"
                            raise InputError(f"decompressed trace {why}", path=str(path))
                        yield out
                    if d.eof:
                        raw = d.unused_data
                        d = None
                        pending = False
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


def _human(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


def read_content(path: Path, limit: int = MAX_TRACE_BYTES) -> bytes:
    """Whole decompressed content (for small files), at most ``limit`` bytes and at most half of
    the memory available (ContentTooLarge past either)."""
    limit = memory_budget(limit)
    parts = []
    total = 0
    chunks = iter_decompressed(path, 256 << 10, budget=limit + 1) if is_gzip(path) else iter_content(path)
    try:
        for b in chunks:
            total += len(b)
            if total > limit:
                raise ContentTooLarge(f"file is larger than {_human(limit)} for this reader", path=str(path))
            parts.append(b)
    except InputError as exc:
        if "can be spared" in exc.reason:
            raise ContentTooLarge(f"file is larger than {_human(limit)} for this reader", path=str(path)) from None
        raise
    return b"".join(parts)


def iter_lines(path: Path) -> Iterator[str]:
    """The file's (decompressed) text line by line, never whole in memory (UTF-8, bad bytes replaced)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    rest = ""
    for b in iter_content(path, 4 << 20):
        text = rest + decoder.decode(b)
        lines = text.splitlines(keepends=True)
        # The last piece may be cut mid-line (or between the \r and \n of one line ending).
        rest = lines.pop() if lines and (not lines[-1].endswith(("\n", "\r")) or lines[-1].endswith("\r")) else ""
        yield from lines
    tail = rest + decoder.decode(b"", final=True)
    if tail:
        yield tail


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
