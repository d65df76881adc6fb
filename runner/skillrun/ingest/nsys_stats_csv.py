"""``nsys stats --report cuda_gpu_kern_sum --format csv`` (and the older ``gpukernsum``).

Already aggregated per kernel: ``Time (%), Total Time (ns), Instances, Avg (ns), …, Name``;
stdout noise such as ``Processing [...]`` lines before the header is skipped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from ..errors import InputError
from ..models import Profile
from . import _io
from ._profile import ProfileBuilder
from .detect import find_csv_header

FORMAT = "nsys_stats_csv"


def _num(v: str) -> Optional[float]:
    v = (v or "").strip().replace(",", "")
    try:
        return float(v)
    except ValueError:
        return None


def ingest_nsys_stats_csv(path: Path, arch: Optional[str] = None,
                          progress: Optional[Callable[[int, int], None]] = None) -> Profile:
    fmt, reader = _io.stream_csv(path, find_csv_header)
    if fmt is None:
        raise InputError("no nsys stats header (Time (%), Total Time (ns), …, Name)", path=str(path))
    header = [h.strip().lower().replace(" ", "") for h in next(reader)]
    idx = {h: i for i, h in enumerate(header)}
    tot_i, n_i, name_i = idx.get("totaltime(ns)"), idx.get("instances"), idx.get("name")
    if tot_i is None or name_i is None:
        raise InputError("missing 'Total Time (ns)' or 'Name' column", path=str(path))
    grid_i, block_i = idx.get("gridxyz"), idx.get("blockxyz")
    min_i, max_i = idx.get("min(ns)"), idx.get("max(ns)")
    med_i, std_i = idx.get("med(ns)"), idx.get("stddev(ns)")
    b = ProfileBuilder(str(path), FORMAT)
    b.vendor_hint = "nvidia"
    for row in reader:
        if len(row) <= max(tot_i, name_i) or not row[name_i].strip():
            continue
        tot = _num(row[tot_i])
        n = _num(row[n_i]) if n_i is not None and n_i < len(row) else 1
        if tot is None:
            continue

        def xyz(i: Optional[int]) -> Optional[list[int]]:
            if i is None or i >= len(row):
                return None
            parts = row[i].split()
            return [int(p) for p in parts] if len(parts) == 3 and all(p.isdigit() for p in parts) else None

        lo = _num(row[min_i]) if min_i is not None and min_i < len(row) else None
        hi = _num(row[max_i]) if max_i is not None and max_i < len(row) else None
        med = _num(row[med_i]) if med_i is not None and med_i < len(row) else None
        std = _num(row[std_i]) if std_i is not None and std_i < len(row) else None
        b.add(row[name_i].strip(), tot / 1000.0, int(n or 1), grid=xyz(grid_i), block=xyz(block_i),
              min_us=lo / 1000.0 if lo is not None else None, max_us=hi / 1000.0 if hi is not None else None,
              median_us=med / 1000.0 if med is not None else None, std_us=std / 1000.0 if std is not None else None)
    b.warnings.append("summary CSV: per-call timing and launch shapes are not available")
    return b.build(arch)
