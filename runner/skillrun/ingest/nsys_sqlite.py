"""``nsys export --type sqlite``: CUPTI_ACTIVITY_KIND_KERNEL (ns) with names in StringIds.

Device facts come from TARGET_INFO_GPU (name, compute capability, SM count). No op shapes are
recorded by nsys (NVTX ranges are not linked): every kernel is ``unresolved`` unless its name
carries the shape (DeepGEMM). Environment tables (TARGET_INFO_SYSTEM_ENV …) are never read.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable, Optional

from ..errors import InputError
from ..models import DeviceInfo, Profile
from . import _sqlite
from ._profile import NEGATIVE_DURATION, ProfileBuilder
from .arch import nvidia_arch

# CUPTI kernel-table columns → Profile launch keys.
_LAUNCH_COLS = (("registersPerThread", "registers_per_thread"), ("staticSharedMemory", "static_shared_mem_bytes"),
                ("dynamicSharedMemory", "dynamic_shared_mem_bytes"), ("localMemoryPerThread", "local_mem_per_thread"))


def _launch(values) -> dict[str, int]:
    out = {key: v for (_, key), v in zip(_LAUNCH_COLS, values) if type(v) is int and v >= 0}
    if "static_shared_mem_bytes" in out or "dynamic_shared_mem_bytes" in out:
        out["shared_mem_bytes"] = out.get("static_shared_mem_bytes", 0) + out.get("dynamic_shared_mem_bytes", 0)
    return out


FORMAT = "nsys_sqlite"


def ingest_nsys_sqlite(path: Path, arch: Optional[str] = None,
                       progress: Optional[Callable[[int, int], None]] = None) -> Profile:
    return _sqlite.read(path, "nsys", _read, arch)


def _read(con: sqlite3.Connection, path: Path, arch: Optional[str]) -> Profile:
    tables = _sqlite.names(con)
    kt = tables.get("cupti_activity_kind_kernel")
    if kt is None:
        raise InputError("no CUPTI_ACTIVITY_KIND_KERNEL table", path=str(path))
    cols = set(_sqlite.columns(con, kt))
    name_col = next((c for c in ("demangledName", "shortName", "mangledName") if c in cols), None)
    if name_col is None or not {"start", "end"} <= cols:
        raise InputError("kernel table lacks start/end/name columns", path=str(path), field=kt)
    has_strings = "stringids" in tables
    dev = "deviceId" if "deviceId" in cols else "NULL"
    graph = "graphNodeId" if "graphNodeId" in cols else "NULL"
    grid = ", ".join(c if c in cols else "NULL" for c in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"))
    name_expr = "s.value" if has_strings else f"k.{name_col}"
    join = f'LEFT JOIN "{tables["stringids"]}" s ON s.id = k.{name_col}' if has_strings else ""
    short = "shortName" if "shortName" in cols and name_col != "shortName" else "NULL"
    short_expr = "ss.value" if has_strings and short != "NULL" else (f"k.{short}" if short != "NULL" else "NULL")
    short_join = f'LEFT JOIN "{tables["stringids"]}" ss ON ss.id = k.{short}' if has_strings and short != "NULL" else ""
    launch_sql = ", ".join(f"min(k.{c})" if c in cols else "NULL" for c, _ in _LAUNCH_COLS)
    sql = (f'SELECT {name_expr}, k.{name_col}, {dev}, ({graph} IS NOT NULL) AS g, count(*), '
           f'sum(max(k."end" - k."start", 0)), min({grid.split(", ")[0]}), {grid}, '
           f'min(max(k."end" - k."start", 0)), max(k."end" - k."start"), min({short_expr}), '
           f'sum(k."end" < k."start"), '  # negative durations: counted in Profile.anomalies, not summed
           # total() is a float: a sum of squared ns overflows SQLite's integers on a long trace
           f'total(CAST(max(k."end" - k."start", 0) AS REAL) * max(k."end" - k."start", 0)), '
           f'{launch_sql} '
           f'FROM "{kt}" k {join} {short_join} GROUP BY 2, 3, 4')
    b = ProfileBuilder(str(path), FORMAT)
    b.vendor_hint = "nvidia"
    for row in con.execute(sql):
        name, raw, device, g, n, ns = row[0], row[1], row[2], row[3], row[4], row[5]
        if name is None:
            name = f"<string id {raw}>"
        grid_v = list(row[7:10]) if all(isinstance(v, int) for v in row[7:10]) else None
        block_v = list(row[10:13]) if all(isinstance(v, int) for v in row[10:13]) else None
        lo, hi, short_v = row[13], row[14], row[15]
        b.add(str(name), (ns or 0) / 1000.0, int(n), device=device if isinstance(device, int) else None,
              graph=bool(g), grid=grid_v, block=block_v,
              min_us=lo / 1000.0 if isinstance(lo, (int, float)) else None,
              max_us=hi / 1000.0 if isinstance(hi, (int, float)) else None,
              short_name=str(short_v) if short_v is not None and str(short_v) != str(name) else None,
              sumsq=row[17] / 1e6 if isinstance(row[17], (int, float)) else None,
              launch=_launch(row[18:18 + len(_LAUNCH_COLS)]))
        b.note(NEGATIVE_DURATION, int(row[16] or 0))
    # Busy and idle time per device: one ordered pass, merging intervals as they come.
    cur: dict = {}
    for d, st, en in con.execute(f'SELECT {dev}, k."start", k."end" FROM "{kt}" k ORDER BY 1, 2'):
        if not isinstance(st, (int, float)) or not isinstance(en, (int, float)) or en < st:
            continue
        c = cur.get(d)
        if c is None:
            cur[d] = [0.0, st, en, st, en]  # busy, run start, run end, first start, last end
        elif st > c[2]:
            c[0] += c[2] - c[1]
            c[1], c[2] = st, en
        elif en > c[2]:
            c[2] = en
        if c is not None:
            c[4] = max(c[4], en)
    for d, (busy, rs, re_, first, last) in cur.items():
        b.timeline(d if isinstance(d, int) else None, (busy + re_ - rs) / 1000.0, (last - first) / 1000.0)
    rt = tables.get("cupti_activity_kind_runtime")
    if rt is not None and has_strings and "nameId" in _sqlite.columns(con, rt):
        row = con.execute(f'SELECT count(*) FROM "{rt}" r JOIN "{tables["stringids"]}" s ON s.id = r.nameId '
                          f"WHERE s.value LIKE 'cudaGraphLaunch%' OR s.value LIKE 'cuGraphLaunch%'").fetchone()
        b.graph_launches = int(row[0] or 0)
    gt = tables.get("target_info_gpu")
    if gt is not None:
        gcols = set(_sqlite.columns(con, gt))
        want = [c if c in gcols else "NULL" for c in ("id", "name", "computeMajor", "computeMinor", "smCount",
                                                       "threadsPerWarp")]
        seen = set()
        for gid, name, ma, mi, sms, warp in con.execute(f'SELECT {", ".join(want)} FROM "{gt}" '
                                                                     f'LIMIT {_sqlite.MAX_DEVICE_ROWS}'):
            if gid in seen:
                continue
            seen.add(gid)
            b.devices.append(DeviceInfo(index=gid if isinstance(gid, int) else len(b.devices),
                                        name=name if isinstance(name, str) else None, vendor="nvidia",
                                        arch=nvidia_arch(ma, mi), sm_count=sms if isinstance(sms, int) else None,
                                        warp_size=warp if isinstance(warp, int) else None))
        b.devices.sort(key=lambda d: d.index)
    return b.build(arch)
