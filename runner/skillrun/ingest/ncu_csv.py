"""``ncu --csv`` (long format: one row per kernel instance × metric).

The kernel time is the ``Duration`` metric (unit ns/us/ms or nsecond/usecond/msecond/second,
values may use thousands separators). ``CC`` gives the compute capability. Leading non-CSV lines
(``==PROF==``, application output) are skipped.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Optional

from ..errors import InputError
from ..models import DeviceInfo, Profile
from . import _io
from ._profile import ProfileBuilder
from .arch import nvidia_arch
from .detect import find_csv_header

FORMAT = "ncu_csv"
_UNIT_US = {"ns": 1e-3, "nsecond": 1e-3, "nanosecond": 1e-3, "us": 1.0, "usecond": 1.0, "microsecond": 1.0,
            "ms": 1e3, "msecond": 1e3, "millisecond": 1e3, "s": 1e6, "second": 1e6}
_XYZ = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)")


def _xyz(v: str) -> Optional[list[int]]:
    m = _XYZ.search(v or "")
    return [int(x) for x in m.groups()] if m else None


# "Launch Statistics" metrics → Profile launch keys.
_LAUNCH_METRICS = {"Registers Per Thread": "registers_per_thread",
                   "Static Shared Memory Per Block": "static_shared_mem_bytes",
                   "Dynamic Shared Memory Per Block": "dynamic_shared_mem_bytes"}


def ingest_ncu_csv(path: Path, arch: Optional[str] = None,
                   progress: Optional[Callable[[int, int], None]] = None) -> Profile:
    fmt, reader = _io.stream_csv(path, find_csv_header)
    if fmt is None:
        raise InputError("no ncu CSV header", path=str(path))
    header = [h.strip().lower() for h in next(reader)]
    idx = {h: i for i, h in enumerate(header)}
    need = ("id", "kernel name", "metric name", "metric unit", "metric value")
    if any(k not in idx for k in need):
        raise InputError("ncu CSV lacks ID/Kernel Name/Metric columns", path=str(path))
    i_id, i_name, i_metric, i_unit, i_val = (idx[k] for k in need)
    i_dev, i_cc, i_grid, i_block = idx.get("device"), idx.get("cc"), idx.get("grid size"), idx.get("block size")
    inst: dict[str, tuple] = {}
    ccs: dict[int, str] = {}
    bad_units: set[str] = set()
    facts: dict[str, dict[str, int]] = {}  # profiled launch ID → Launch Statistics facts
    metrics: dict[str, dict[str, float]] = {}  # profiled launch ID → every numeric metric ncu reported
    i_sec = idx.get("section name")
    for row in reader:
        if len(row) <= max(i_id, i_name, i_metric, i_unit, i_val):
            continue
        metric = row[i_metric].strip()
        _keep_metric(metrics, row[i_id], row[i_sec] if i_sec is not None and i_sec < len(row) else "", metric,
                     row[i_unit], row[i_val])
        key = _LAUNCH_METRICS.get(metric)
        if key is not None:
            v = row[i_val].replace(",", "").strip()
            if v.isdigit():
                facts.setdefault(row[i_id], {})[key] = int(v)
            continue
        if metric != "Duration":
            continue
        unit = row[i_unit].strip().lower()
        scale = _UNIT_US.get(unit)
        try:
            val = float(row[i_val].replace(",", "").strip())
        except ValueError:
            continue
        if scale is None:
            bad_units.add(unit)
            continue
        dev = None
        if i_dev is not None and i_dev < len(row) and row[i_dev].strip().isdigit():
            dev = int(row[i_dev])
            if i_cc is not None and i_cc < len(row):
                ccs[dev] = row[i_cc].strip()
        inst[row[i_id]] = (row[i_name], val * scale, dev,
                           _xyz(row[i_grid]) if i_grid is not None and i_grid < len(row) else None,
                           _xyz(row[i_block]) if i_block is not None and i_block < len(row) else None)
    if not inst and bad_units:
        raise InputError(f"Duration metric has an unknown unit ({', '.join(sorted(bad_units))})", path=str(path))
    b = ProfileBuilder(str(path), FORMAT)
    b.vendor_hint = "nvidia"
    for lid, (name, us, dev, grid, block) in inst.items():
        f = facts.get(lid, {})
        if "static_shared_mem_bytes" in f or "dynamic_shared_mem_bytes" in f:
            f["shared_mem_bytes"] = f.get("static_shared_mem_bytes", 0) + f.get("dynamic_shared_mem_bytes", 0)
        b.add(name, us, 1, device=dev, grid=grid, block=block, launch=f)
    for dev, cc in sorted(ccs.items()):
        ma, _, mi = cc.partition(".")
        b.devices.append(DeviceInfo(index=dev, vendor="nvidia", arch=nvidia_arch(ma, mi)))
    prof_metrics = _per_kernel(inst, metrics)
    if not inst:
        b.warnings.append("no 'Duration' metric rows (collect with --section SpeedOfLight or --metrics gpu__time_duration)")
    b.warnings.append("ncu serializes and replays kernels: durations are per-kernel isolated, not in-application timing")
    prof = b.build(arch)
    for k in prof.kernels:
        k.metrics = prof_metrics.get(k.name, {})
    return prof


MAX_METRICS = 256  # per kernel: ncu's full set is a few hundred; a hostile file cannot grow a profile past this
MAX_METRIC_KEY = 120


def _keep_metric(out: dict[str, dict[str, float]], lid: str, section: str, metric: str, unit: str, value: str) -> None:
    """Every numeric metric of a profiled launch, keyed ``Section: Metric [unit]`` (SOL %, occupancy,
    waves per SM, …: what the user ran ncu for); text values (policies, ID lists) are left out."""
    if not metric:
        return
    try:
        v = float(value.replace(",", "").strip())
    except ValueError:
        return
    if v != v or v in (float("inf"), float("-inf")):
        return
    unit = unit.strip()
    key = f"{section.strip()}: {metric}" if section.strip() else metric
    key = (key + (f" [{unit}]" if unit else ""))[:MAX_METRIC_KEY]
    m = out.setdefault(lid, {})
    if key in m or len(m) < MAX_METRICS:
        m[key] = v


def _per_kernel(inst: dict[str, tuple], metrics: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each kernel's metrics, the mean over its profiled launches."""
    sums: dict[str, dict[str, list[float]]] = {}
    for lid, (name, *_rest) in inst.items():
        acc = sums.setdefault(name, {})
        for key, v in metrics.get(lid, {}).items():
            acc.setdefault(key, []).append(v)
    return {name: {k: round(sum(vs) / len(vs), 4) for k, vs in acc.items()} for name, acc in sums.items()}
