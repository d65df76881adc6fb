"""rocprofv3 rocpd SQLite (default output from ROCm 7.0).

Tables carry a UUID suffix (``rocpd_kernel_dispatch_<uuid>``) with unsuffixed views over them;
one file may hold several suffixes (merged runs). Dispatches join their kernel symbol and agent;
the agent ``name`` is the gfx target. Process tables (command line, environment) are not read.
"""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Callable, Optional

from ..errors import InputError
from ..models import DeviceInfo, Profile
from . import _sqlite
from ._profile import NEGATIVE_DURATION, ProfileBuilder
from .arch import clean_gfx

FORMAT = "rocpd_sqlite"
_SUFFIX = re.compile(r"^[_0-9a-f-]*$")


def _family(tables: dict[str, str], base: str) -> list[tuple[str, str]]:
    """(suffix, real name) of ``base`` tables; the unsuffixed view alone when it exists."""
    if base in tables:
        return [("", tables[base])]
    out = []
    for low, real in tables.items():
        if low.startswith(base) and _SUFFIX.match(low[len(base):]):
            out.append((low[len(base):], real))
    return sorted(out)


def ingest_rocpd_sqlite(path: Path, arch: Optional[str] = None,
                        progress: Optional[Callable[[int, int], None]] = None) -> Profile:
    return _sqlite.read(path, "rocpd", _read, arch)


def _read(con: sqlite3.Connection, path: Path, arch: Optional[str]) -> Profile:
    tables = _sqlite.names(con)
    dispatch = _family(tables, "rocpd_kernel_dispatch")
    symbols = dict(_family(tables, "rocpd_info_kernel_symbol"))
    agents = dict(_family(tables, "rocpd_info_agent"))
    b = ProfileBuilder(str(path), FORMAT)
    b.vendor_hint = "amd"
    if not dispatch and "kernels" in tables:
        for name, n, ns, neg in con.execute('SELECT name, count(*), sum(max("end" - "start", 0)), '
                                            'sum("end" < "start") FROM kernels GROUP BY name'):
            b.add(str(name), (ns or 0) / 1000.0, int(n))
            b.note(NEGATIVE_DURATION, int(neg or 0))
        return b.build(arch)
    if not dispatch:
        raise InputError("no rocpd_kernel_dispatch table (was the kernel trace enabled?)", path=str(path))
    devices: dict[int, DeviceInfo] = {}
    for suffix, dt in dispatch:
        st = symbols.get(suffix) or symbols.get("")
        at = agents.get(suffix) or agents.get("")
        if st is None:
            raise InputError("no rocpd_info_kernel_symbol table for the dispatches", path=str(path))
        scols = set(_sqlite.columns(con, st))
        name_expr = "coalesce(s.display_name, s.kernel_name)" if "display_name" in scols else "s.kernel_name"
        agent_join = f'LEFT JOIN "{at}" a ON a.id = d.agent_id' if at else ""
        agent_idx = "coalesce(a.absolute_index, a.logical_index, d.agent_id)" if at else "d.agent_id"
        sql = (f'SELECT {name_expr}, {agent_idx}, count(*), sum(max(d."end" - d."start", 0)), '
               f"min(d.workgroup_size_x), min(d.workgroup_size_y), min(d.workgroup_size_z), "
               f"min(d.grid_size_x), min(d.grid_size_y), min(d.grid_size_z), "
               f'min(max(d."end" - d."start", 0)), max(d."end" - d."start"), sum(d."end" < d."start") '
               f'FROM "{dt}" d LEFT JOIN "{st}" s ON s.id = d.kernel_id {agent_join} GROUP BY 1, 2')
        for name, dev, n, ns, wx, wy, wz, gx, gy, gz, lo, hi, neg in con.execute(sql):
            b.note(NEGATIVE_DURATION, int(neg or 0))  # left out of the sum above, reported instead
            block = [wx, wy, wz] if all(isinstance(v, int) and v > 0 for v in (wx, wy, wz)) else None
            grid = [gx // wx, gy // wy, gz // wz] if block and all(isinstance(v, int) for v in (gx, gy, gz)) else None
            b.add(str(name) if name is not None else "<unnamed kernel>", (ns or 0) / 1000.0, int(n),
                  device=dev if isinstance(dev, int) else None, grid=grid, block=block,
                  min_us=lo / 1000.0 if isinstance(lo, (int, float)) else None,
                  max_us=hi / 1000.0 if isinstance(hi, (int, float)) else None)
        if at:
            acols = set(_sqlite.columns(con, at))
            want = [c if c in acols else "NULL" for c in ("absolute_index", "logical_index", "name", "product_name")]
            for ab, lo, name, product in con.execute(f'SELECT {", ".join(want)} FROM "{at}" WHERE type = \'GPU\' '
                                                   f'LIMIT {_sqlite.MAX_DEVICE_ROWS}'):
                idx = ab if isinstance(ab, int) else lo if isinstance(lo, int) else len(devices)
                devices.setdefault(idx, DeviceInfo(index=idx, name=product if isinstance(product, str) else None,
                                                   vendor="amd", arch=clean_gfx(name)))
    b.devices = [devices[k] for k in sorted(devices)]
    return b.build(arch)
