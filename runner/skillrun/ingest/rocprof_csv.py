"""rocprof CSV outputs: rocprofv3 ``kernel_trace.csv`` (old and new headers), ``rocpd convert``
CSV (leading ``Guid``), rocprofv2 file-plugin CSV, legacy rocprof v1 ``results.csv``, and the
``--stats`` / ``results.stats.csv`` summaries. Headers are matched case-insensitively.

Timestamps are ns; grid sizes are in work-items (converted to workgroups for ``Profile.grid``).
Kernel names may carry a ``.kd`` suffix (code-object symbol): it is kept as written.
"""
from __future__ import annotations

import math
import re
from array import array
from pathlib import Path
from typing import Callable, Optional

from ..errors import InputError
from ..models import DeviceInfo, Profile
from . import _io
from ._profile import NEGATIVE_DURATION, NON_FINITE_DURATION, NON_FINITE_TIMESTAMP, ProfileBuilder, busy_span
from .detect import ROCPROF_STATS_CSV, find_csv_header

_AGENT_NUM = re.compile(r"(\d+)")


def _num(v: Optional[str]) -> Optional[float]:
    if v is None:
        return None
    v = v.strip().replace(",", "")
    if not v:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _col(cols: dict[str, int], *names: str) -> Optional[int]:
    for n in names:
        if n in cols:
            return cols[n]
    return None


def ingest_rocprof_csv(path: Path, fmt: str, arch: Optional[str] = None,
                       progress: Optional[Callable[[int, int], None]] = None) -> Profile:
    found, reader = _io.stream_csv(path, find_csv_header)
    if found is None:
        raise InputError("no rocprof CSV header found", path=str(path))
    header = [h.strip().strip('"').lower() for h in next(reader)]
    cols = {h: i for i, h in enumerate(header)}
    b = ProfileBuilder(str(path), fmt)
    b.vendor_hint = "amd"
    name_i = _col(cols, "kernel_name", "kernelname", "name")
    if name_i is None:
        raise InputError("CSV has no kernel name column", path=str(path), field="Kernel_Name")
    if fmt == ROCPROF_STATS_CSV:
        calls_i, tot_i = _col(cols, "calls"), _col(cols, "totaldurationns")
        min_i, max_i = _col(cols, "minns"), _col(cols, "maxns")
        for row in reader:
            if len(row) <= max(name_i, calls_i or 0, tot_i or 0):
                continue
            tot, calls = _num(row[tot_i]), _num(row[calls_i])
            if tot is None or calls is None:
                continue
            lo = _num(row[min_i]) if min_i is not None and min_i < len(row) else None
            hi = _num(row[max_i]) if max_i is not None and max_i < len(row) else None
            b.add(row[name_i], tot / 1000.0, int(calls), min_us=lo / 1000.0 if lo is not None else None,
                  max_us=hi / 1000.0 if hi is not None else None)
        b.warnings.append("summary CSV: per-call timing and launch shapes are not available")
        return b.build(arch)
    start_i = _col(cols, "start_timestamp", "beginns")
    end_i = _col(cols, "end_timestamp", "endns")
    dur_i = _col(cols, "durationns")
    agent_i = _col(cols, "agent_id", "gpu_id", "gpu-id")
    wg_i = [_col(cols, f"workgroup_size_{c}") for c in "xyz"]
    gr_i = [_col(cols, f"grid_size_{c}") for c in "xyz"]
    wg1, gr1 = _col(cols, "workgroup_size", "wgr"), _col(cols, "grid_size", "grd")
    # Code-object facts per dispatch (rocprofv3, rocpd and rocprof v1 spellings) → Profile launch keys.
    fact_i = [(key, _col(cols, *names)) for key, names in (
        ("vgprs", ("vgpr_count", "arch_vgpr")), ("agprs", ("accum_vgpr_count", "accum_vgpr")),
        ("sgprs", ("sgpr_count", "sgpr")), ("lds_bytes", ("lds_block_size", "group_segment_size", "lds")),
        ("scratch_bytes", ("scratch_size", "private_segment_size", "scr")))]
    fact_i = [(key, i) for key, i in fact_i if i is not None]
    if dur_i is None and (start_i is None or end_i is None):
        raise InputError("CSV has neither start/end timestamps nor a duration column", path=str(path))
    groups: dict[tuple, list] = {}
    spans: dict = {}  # device → (start, end) ns, when the rows have timestamps
    bad = 0
    for row in reader:
        if not row or len(row) <= name_i:
            continue
        s = _num(row[start_i]) if start_i is not None and start_i < len(row) else None
        e = _num(row[end_i]) if end_i is not None and end_i < len(row) else None
        if dur_i is not None and dur_i < len(row) and _num(row[dur_i]) is not None:
            ns = _num(row[dur_i])
        else:
            if s is None or e is None:
                bad += 1
                continue
            if not (math.isfinite(s) and math.isfinite(e)):
                b.note(NON_FINITE_TIMESTAMP)
                continue
            ns = e - s
        if ns is None:
            bad += 1
            continue
        if not math.isfinite(ns):
            b.note(NON_FINITE_DURATION)
            continue
        if ns < 0:
            b.note(NEGATIVE_DURATION)  # reported in Profile.anomalies, not folded into the totals
            continue
        dev = None
        if agent_i is not None and agent_i < len(row):
            m = _AGENT_NUM.search(row[agent_i])
            dev = int(m.group(1)) if m else None
        key = (row[name_i], dev)
        g = groups.get(key)
        if g is None:
            block = grid = None
            try:
                if all(i is not None and i < len(row) for i in wg_i):
                    block = [int(float(row[i])) for i in wg_i]
                    gsz = [int(float(row[i])) for i in gr_i] if all(i is not None and i < len(row) for i in gr_i) else None
                elif wg1 is not None and gr1 is not None and max(wg1, gr1) < len(row):
                    block = [int(float(row[wg1])), 1, 1]
                    gsz = [int(float(row[gr1])), 1, 1]
                else:
                    gsz = None
                if block and gsz and all(v > 0 for v in block):
                    grid = [g_ // b_ for g_, b_ in zip(gsz, block)]
            except ValueError:
                block = grid = None
            launch = {}
            for fk, fi in fact_i:
                v = _num(row[fi]) if fi < len(row) else None
                if v is not None and v.is_integer() and v >= 0:
                    launch[fk] = int(v)
            g = groups[key] = [0.0, 0, grid, block, None, None, array("d"), launch]
        us = ns / 1000.0
        g[0] += us
        g[1] += 1
        g[4] = us if g[4] is None else min(g[4], us)
        g[5] = us if g[5] is None else max(g[5], us)
        g[6].append(us)
        if s is not None and e is not None and e >= s:
            spans.setdefault(dev, []).append((s, e))
    for (name, dev), (us, n, grid, block, lo, hi, samples, launch) in groups.items():
        b.add(name, us, n, device=dev, grid=grid, block=block, min_us=lo, max_us=hi, samples=samples, launch=launch)
    for dev, ivs in spans.items():
        busy, span = busy_span(ivs)
        b.timeline(dev, busy / 1000.0, span / 1000.0)
    if bad:
        b.warnings.append(f"{bad} rows without usable timestamps were skipped")
    devs = sorted({d for (_, d) in groups if d is not None})
    b.devices = [DeviceInfo(index=d, vendor="amd") for d in devs]
    return b.build(arch)
