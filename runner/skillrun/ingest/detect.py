"""Tell a trace's format from its content (never from its file name)."""
from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path
from typing import Optional

from ..errors import InputError
from . import _io, _sqlite
from ._jsonhead import BadJSON, walk_stream

KINETO = "kineto_json"
ROCPROFV3_JSON = "rocprofv3_json"
ROCPROFV3_CSV = "rocprofv3_csv"
ROCPD_CSV = "rocpd_csv"
ROCPROF_V2_CSV = "rocprof_v2_csv"
ROCPROF_V1_CSV = "rocprof_v1_csv"
ROCPROF_STATS_CSV = "rocprof_stats_csv"
ROCPD_SQLITE = "rocpd_sqlite"
NSYS_SQLITE = "nsys_sqlite"
NSYS_STATS_CSV = "nsys_stats_csv"
NCU_CSV = "ncu_csv"

FORMATS = (KINETO, ROCPROFV3_JSON, ROCPROFV3_CSV, ROCPD_CSV, ROCPROF_V2_CSV, ROCPROF_V1_CSV,
           ROCPROF_STATS_CSV, ROCPD_SQLITE, NSYS_SQLITE, NSYS_STATS_CSV, NCU_CSV)


def _norm_cols(cols: list[str]) -> list[str]:
    return [c.strip().strip('"').strip().lower() for c in cols]


def csv_format(cols: list[str]) -> Optional[str]:
    """Which CSV flavour a header row belongs to (case-insensitive), or None."""
    c = _norm_cols(cols)
    s = set(c)
    if c[:2] == ["guid", "kind"] and "kernel_name" in s:
        return ROCPD_CSV
    if c[:2] == ["kind", "agent_id"] and "kernel_name" in s:
        return ROCPROFV3_CSV
    if {"kernel_name", "start_timestamp", "end_timestamp"} <= s:
        return ROCPROF_V2_CSV if "dispatch_id" in s and "kind" not in s else ROCPROFV3_CSV
    if "kernelname" in s and ({"beginns", "endns"} <= s or "durationns" in s):
        return ROCPROF_V1_CSV
    if {"name", "calls", "totaldurationns"} <= s:
        return ROCPROF_STATS_CSV
    if "name" in s and any(x.replace(" ", "") in ("totaltime(ns)",) for x in c) and any(
            x.replace(" ", "").startswith("time(%)") for x in c):
        return NSYS_STATS_CSV
    if {"kernel name", "metric name", "metric value"} <= s and "id" in s:
        return NCU_CSV
    return None


def find_csv_header(text: str, max_lines: int = 2000) -> tuple[Optional[str], int]:
    """(format, line index of the header) in a CSV that may have leading log lines."""
    lines = text.splitlines()
    for idx, line in enumerate(lines[:max_lines]):
        stripped = line.strip()
        if not stripped or stripped.startswith("==") or stripped.lower().startswith("processing ["):
            continue
        if "," not in stripped:
            continue
        try:
            cols = next(_io.csv_reader(io.StringIO(stripped)))
        except (csv.Error, StopIteration):
            continue
        fmt = csv_format(cols)
        if fmt:
            return fmt, idx
    return None, -1


def sqlite_tables(path: Path) -> set[str]:
    con = _sqlite.connect(path)
    try:
        return set(_sqlite.names(con).values())
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        raise InputError(f"SQLite file cannot be read ({type(exc).__name__}: {str(exc)[:120]})", path=str(path)) from None
    finally:
        con.close()


def sqlite_format(path: Path) -> str:
    names = sqlite_tables(path)
    lower = {n.lower() for n in names}
    if "cupti_activity_kind_kernel" in lower:
        return NSYS_SQLITE
    if any(n.startswith("rocpd_kernel_dispatch") for n in lower) or (
            "kernels" in lower and any(n.startswith("rocpd_") for n in lower)):
        return ROCPD_SQLITE
    if {"rocpd_op", "rocpd_api"} <= lower:
        raise InputError("rocmProfileData (RPD) SQLite is not supported", path=str(path),
                         hint="export with rocprofv3 (rocpd) or torch.profiler instead")
    if "target_info_gpu" in lower or "stringids" in lower:
        raise InputError("Nsight Systems export has no CUPTI_ACTIVITY_KIND_KERNEL table (no CUDA kernels traced)",
                         path=str(path))
    raise InputError("SQLite database is not an nsys or rocpd profile (no kernel table)", path=str(path))


def detect(path: str | Path) -> str:
    """Format name (one of :data:`FORMATS`) or :class:`InputError`."""
    p = Path(path)
    _io.check_readable(p)
    if _io.file_size(p) == 0:
        raise InputError("file is empty", path=str(p))
    raw = _io.read_head(p, 16)
    if raw.startswith(_io.SQLITE_MAGIC):
        return sqlite_format(p)
    head = _io.content_head(p, 1 << 20)
    if not head.strip():
        raise InputError("file is empty" + (" after decompression" if raw[:2] == _io.GZIP_MAGIC else ""),
                         path=str(p))
    if head.startswith(_io.SQLITE_MAGIC):
        raise InputError("gzip-compressed SQLite is not supported; decompress it first", path=str(p))
    lead = head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1]
    if lead in (b"{", b"["):
        return _json_format(p)
    if b"\x00" in head[:65536]:
        raise InputError("binary data that is neither gzip, SQLite nor text", path=str(p))
    text = head.decode("utf-8", errors="replace")
    fmt, _ = find_csv_header(text)
    if fmt:
        return fmt
    if lead == b"<":
        raise InputError("looks like XML/HTML, not a profiler trace", path=str(p))
    raise InputError("not a recognized profiler trace (expected Kineto JSON, rocprof CSV/JSON, rocpd or "
                     "nsys SQLite, nsys stats CSV or ncu CSV)", path=str(p))


def _json_format(p: Path) -> str:
    stream = _io.iter_content(p, 1 << 20)
    pending = bytearray()

    def read(n: int) -> bytes:
        while len(pending) < n:
            try:
                pending.extend(next(stream))
            except StopIteration:
                break
        out = bytes(pending[:n])
        del pending[:n]
        return out

    try:
        top, _ = walk_stream(read, {"traceEvents", "rocprofiler-sdk-tool"}, set())
    except BadJSON as exc:
        raise InputError(f"invalid JSON near byte {exc.pos}: {exc.msg}", path=str(p)) from None
    if top.kind == "array":
        return KINETO  # a bare Chrome-trace event array
    if top.stop_key == "traceEvents":
        return KINETO
    if top.stop_key == "rocprofiler-sdk-tool":
        return ROCPROFV3_JSON
    # Key names only (never values), escaped so that odd keys cannot break the one-line message.
    shown = ", ".join(json.dumps(k[:40]) for k in top.keys[:6]) or "none"
    raise InputError(f"JSON document is not a profiler trace (no 'traceEvents' or 'rocprofiler-sdk-tool'; "
                     f"top-level keys: {shown})", path=str(p))
