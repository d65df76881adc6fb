"""rocprofv3 ``--output-format json`` (``{"rocprofiler-sdk-tool": [ … ]}``).

Kernel dispatches are ``buffer_records.kernel_dispatch`` (ns timestamps); names come from
``kernel_symbols`` by ``kernel_id`` (``formatted_kernel_name``, which keeps template arguments);
``agents`` map ``dispatch_info.agent_id.handle`` to a GPU whose ``name`` is the gfx target.
Only those three parts are read: ``metadata`` (command line, environment) is never copied.
"""
from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any, Callable, Optional

import orjson

from ..errors import InputError
from ..models import DeviceInfo, Profile
from . import _io
from ._profile import NEGATIVE_DURATION, NON_FINITE_DURATION, ProfileBuilder, busy_span
from .arch import clean_gfx

FORMAT = "rocprofv3_json"


def _handle(x: Any) -> Any:
    return x.get("handle") if isinstance(x, dict) else x


def _symbol_names(symbols: Any) -> dict[int, tuple[str, Optional[str]]]:
    out: dict[int, tuple[str, Optional[str]]] = {}
    items = symbols.values() if isinstance(symbols, dict) else symbols if isinstance(symbols, list) else []
    for s in items:
        if not isinstance(s, dict):
            continue
        kid = s.get("kernel_id")
        if not isinstance(kid, int):
            continue
        name = s.get("formatted_kernel_name") or s.get("kernel_name") or s.get("truncated_kernel_name")
        if not isinstance(name, str) or not name:
            name = f"<kernel_id {kid}>"
        dem = s.get("demangled_kernel_name") if isinstance(s.get("demangled_kernel_name"), str) else None
        out[kid] = (name, dem if dem and dem != name else None)
    return out


# kernel_symbols fields → Profile launch keys (code-object facts of each kernel).
_SYMBOL_FACTS = (("arch_vgpr_count", "vgprs"), ("accum_vgpr_count", "agprs"), ("sgpr_count", "sgprs"),
                 ("group_segment_size", "lds_bytes"), ("private_segment_size", "scratch_bytes"))


def _launch_facts(symbols: Any) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    items = symbols.values() if isinstance(symbols, dict) else symbols if isinstance(symbols, list) else []
    for s in items:
        if isinstance(s, dict) and isinstance(s.get("kernel_id"), int):
            out[s["kernel_id"]] = {k: s[f] for f, k in _SYMBOL_FACTS if type(s.get(f)) is int and s[f] >= 0}
    return out


def ingest_rocprofv3_json(path: Path, arch: Optional[str] = None,
                          progress: Optional[Callable[[int, int], None]] = None) -> Profile:
    # The whole document is parsed at once (orjson): past a few GiB use rocprofv3's CSV output.
    data = _io.read_content(path, limit=4 << 30)
    if progress:
        progress(len(data), len(data))
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"corrupt or truncated rocprofv3 JSON ({exc})", path=str(path)) from None
    del data
    tool = doc.get("rocprofiler-sdk-tool") if isinstance(doc, dict) else None
    if isinstance(tool, dict):
        tool = [tool]
    if not isinstance(tool, list):
        raise InputError("'rocprofiler-sdk-tool' is not a list", path=str(path), field="rocprofiler-sdk-tool")
    b = ProfileBuilder(str(path), FORMAT)
    b.vendor_hint = "amd"
    devices: dict[Any, DeviceInfo] = {}
    for rec in tool:
        if not isinstance(rec, dict):
            continue
        agent_index: dict[Any, int] = {}
        gpus = [a for a in rec.get("agents") or [] if isinstance(a, dict) and a.get("type") == 2]
        for i, a in enumerate(gpus):
            h = _handle(a.get("id"))
            idx = a.get("logical_node_id") if isinstance(a.get("logical_node_id"), int) else i
            agent_index[h] = idx
            if idx not in devices:
                wf = a.get("wave_front_size")
                devices[idx] = DeviceInfo(index=idx, name=a.get("product_name") if isinstance(a.get("product_name"), str) else None,
                                          vendor="amd", arch=clean_gfx(a.get("name")),
                                          sm_count=a.get("cu_count") if isinstance(a.get("cu_count"), int) else None,
                                          warp_size=wf if isinstance(wf, int) and wf > 0 else None)
        names = _symbol_names(rec.get("kernel_symbols"))
        buf = rec.get("buffer_records")
        dispatches = buf.get("kernel_dispatch") if isinstance(buf, dict) else None
        if dispatches is None:
            continue
        if not isinstance(dispatches, list):
            raise InputError("buffer_records.kernel_dispatch is not a list", path=str(path),
                             field="buffer_records.kernel_dispatch")
        groups: dict[tuple, list] = {}
        spans: dict[Any, list] = {}  # device → (start, end) in ns, for busy/idle time
        for d in dispatches:
            if not isinstance(d, dict):
                continue
            s, e = d.get("start_timestamp"), d.get("end_timestamp")
            info = d.get("dispatch_info") if isinstance(d.get("dispatch_info"), dict) else {}
            if not isinstance(s, (int, float)) or not isinstance(e, (int, float)) or isinstance(s, bool):
                continue
            kid = info.get("kernel_id")
            dev = agent_index.get(_handle(info.get("agent_id")))
            key = (kid, dev)
            g = groups.get(key)
            if g is None:
                wg, gr = info.get("workgroup_size"), info.get("grid_size")
                block = [wg.get(c) for c in "xyz"] if isinstance(wg, dict) else None
                # rocprof grid sizes are in work-items; Profile.grid is in blocks like CUDA's.
                grid = None
                if isinstance(gr, dict) and block and all(isinstance(v, int) and v > 0 for v in block):
                    grid = [(gr.get(c) or 0) // bv for c, bv in zip("xyz", block)]
                g = groups[key] = [0.0, 0, grid, block, None, None, array("d")]
            us = (e - s) / 1000.0
            valid = 0.0 <= us < float("inf")
            if not valid:
                b.note(NEGATIVE_DURATION if us < 0 else NON_FINITE_DURATION)  # counted, not clamped in
                us = 0.0
            g[0] += us
            g[1] += 1
            g[4] = us if g[4] is None else min(g[4], us)
            g[5] = us if g[5] is None else max(g[5], us)
            g[6].append(us)
            if valid:  # an impossible interval would distort busy/idle time
                spans.setdefault(dev, []).append((s, e))
        launch = _launch_facts(rec.get("kernel_symbols"))
        for (kid, dev), (us, n, grid, block, lo, hi, samples) in groups.items():
            name, dem = names.get(kid, (f"<kernel_id {kid}>", None))
            b.add(name, us, n, device=dev, grid=grid, block=block, demangled=dem, min_us=lo, max_us=hi,
                  samples=samples, launch=launch.get(kid))
        for dev, ivs in spans.items():
            busy, span = busy_span(ivs)
            b.timeline(dev, busy / 1000.0, span / 1000.0)
    b.devices = [devices[k] for k in sorted(devices)]
    if not any(True for _ in b._k):
        b.warnings.append("no kernel_dispatch records (was rocprofv3 run with --kernel-trace?)")
    return b.build(arch)
