"""Per-slot distributions of the raw timing samples a validation artifact carries.

The timing engine records every timed sample (``timing.raw_samples``: per slot, ms, round, position
in the round, input set, kept), the per-position medians it tested for a position effect, the hold,
its warnings and the profiler's second clock. :func:`distributions` reads them into plain values for
``skill-run report`` (a line per slot in the terminal, a strip chart in the HTML page). Artifacts of
earlier engines have none of this and give ``None``, so they show nothing new.

An artifact is untrusted input: lists of the wrong type or length are read as far as they agree,
non-numbers are skipped, and nothing here grows with anything but the samples themselves.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class SlotDist:
    slot: str
    kept_ms: list[float]  # the samples the statistics used, in round order
    total: int  # every timed sample of the slot, kept or not
    p10: float
    median: float
    p90: float
    by_position: list[Optional[float]]  # median ms per position in the round (0 = launched first)
    second_clock_ms: Optional[float] = None  # the profiler's kernel-duration median, when recorded


@dataclass
class Distributions:
    slots: list[SlotDist]
    warnings: list[str] = field(default_factory=list)
    hold: Optional[str] = None  # one line on the hold (or None when the artifact says nothing)


def _quantiles(xs: list[float]) -> tuple[float, float, float]:
    """p10, median, p90 by linear interpolation (the engine's method: numpy's default)."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    d = statistics.quantiles(xs, n=10, method="inclusive")
    return d[0], statistics.median(xs), d[8]


def _number(x: Any) -> Optional[float]:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _slot(name: str, cols: Any, engine_by_position: Any, second: Any) -> Optional[SlotDist]:
    if not isinstance(cols, dict) or not isinstance(cols.get("ms"), list):
        return None
    ms = cols["ms"]
    kept = cols.get("kept") if isinstance(cols.get("kept"), list) and len(cols["kept"]) == len(ms) else [True] * len(ms)
    pos = cols.get("position") if isinstance(cols.get("position"), list) and len(cols["position"]) == len(ms) else None
    keep_ms, keep_pos = [], []
    for i, x in enumerate(ms):
        v = _number(x)
        if v is None or kept[i] is not True:
            continue
        keep_ms.append(v)
        keep_pos.append(pos[i] if pos is not None and isinstance(pos[i], int) and not isinstance(pos[i], bool) else None)
    if not keep_ms:
        return None
    if isinstance(engine_by_position, list):  # the engine's own numbers, the ones its warning is about
        by_pos = [_number(v) for v in engine_by_position]
    else:
        groups: dict[int, list[float]] = {}
        for v, p in zip(keep_ms, keep_pos):
            if p is not None and p >= 0:
                groups.setdefault(p, []).append(v)
        by_pos = [statistics.median(groups[p]) if p in groups else None for p in range(max(groups) + 1)] if groups else []
    p10, med, p90 = _quantiles(keep_ms)
    return SlotDist(slot=str(name), kept_ms=keep_ms, total=len(ms), p10=p10, median=med, p90=p90, by_position=by_pos,
                    second_clock_ms=_number(second))


def _hold_line(hold: Any) -> Optional[str]:
    if not isinstance(hold, dict):
        return None
    if not hold.get("used"):
        return "hold: none (host timer or hold disabled)"
    us = _number(hold.get("final_us"))
    parts = ["hold: device-side spin before each round" + (f", {us:.0f} µs" if us is not None else "")]
    for key, words in (("unheld_rounds", "round(s) not covered, left out"), ("throttled_rounds", "throttled round(s) left out")):
        n = hold.get(key)
        if isinstance(n, int) and n > 0:
            parts.append(f"{n} {words}")
    return "; ".join(parts)


def distributions(rec: dict[str, Any]) -> Optional[Distributions]:
    """The raw-sample distribution of every slot of one artifact, or None when it has no raw samples."""
    t = rec.get("timing") if isinstance(rec, dict) else None
    raw = t.get("raw_samples") if isinstance(t, dict) else None
    if not isinstance(raw, dict) or not raw:
        return None
    pe = t.get("position_effect") if isinstance(t.get("position_effect"), dict) else {}
    by_pos = pe.get("median_ms_by_position") if isinstance(pe.get("median_ms_by_position"), dict) else {}
    sc = t.get("second_clock") if isinstance(t.get("second_clock"), dict) else {}
    sc_ms = sc.get("median_ms") if isinstance(sc.get("median_ms"), dict) else {}
    slots = [d for d in (_slot(name, cols, by_pos.get(name), sc_ms.get(name)) for name, cols in raw.items()) if d]
    if not slots:
        return None
    warnings = [str(w) for w in t.get("warnings") or [] if isinstance(w, str)] if isinstance(t.get("warnings"), list) else []
    return Distributions(slots=slots, warnings=warnings, hold=_hold_line(t.get("hold")))
