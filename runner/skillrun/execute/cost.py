"""What a measurement costs: seconds by phase, for the artifact and for a device call's summary.

A lent GPU is held for a whole call, so every second the runner spends on a shape is a device
second, whatever the device is doing in it. The harness adds up, per shape, the seconds each step
took, by what it was for:

=================  ====================================================================
process_start      starting a helper process (interpreter and the runner's own modules)
imports            torch, the problem module and the kernel modules
compile            building the port and its references and their first launches (JIT
                   compiles), the watchdog's probe launches
reference_setup    the references' parity gate (build, seeds, runs)
inputs             making the input sets (the session's rotating sets, the referee's copies)
warmup             untimed warm-up rounds and CUDA-graph capture
rounds             timed rounds, the sustained load before each and the hold
checks             the port's parity gate and its judge, aliasing and kernel-name checks,
                   the work between timed rounds (checksums, commitments, the referee's
                   sampled checks, new input content), profiled rounds, the post-timing check
other              what none of the above covers (the parent's own work, waiting)
=================  ====================================================================

Pure Python: the worker children import it.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

PHASES = ("process_start", "imports", "compile", "reference_setup", "inputs", "warmup", "rounds", "checks", "other")


class PhaseClock:
    """Seconds by phase. ``mark(name)`` starts charging the time from now on to ``name`` (and ends the
    phase before it), so instrumenting a long function takes one line per change of phase;
    ``phase(name)`` times a block; ``add`` takes seconds measured elsewhere."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._open: tuple[str, float] | None = None

    def mark(self, name: str | None) -> str | None:
        """Close the open phase, open ``name`` (None: none); returns the phase that was open."""
        now = time.perf_counter()
        prev = self._open
        if prev is not None:
            self.add(prev[0], now - prev[1])
        self._open = (name, now) if name else None
        return prev[0] if prev else None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        prev = self.mark(name)
        try:
            yield
        finally:
            self.mark(prev)

    def add(self, name: str, seconds: float | None) -> None:
        if name not in PHASES:
            raise ValueError(f"unknown cost phase {name!r} (one of {', '.join(PHASES)})")
        if seconds and seconds > 0:
            self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)

    def move(self, src: str, dst: str, seconds: float) -> float:
        """Charge up to ``seconds`` of what ``src`` holds to ``dst`` instead (time first counted as waiting, then
        known to be a process's start); returns the seconds moved."""
        self.mark(self._open[0] if self._open else None)
        n = max(0.0, min(float(seconds or 0.0), self.seconds.get(src, 0.0)))
        if n > 0:
            self.seconds[src] -= n
            self.add(dst, n)
        return n

    def merge(self, phases: dict[str, Any] | None) -> float:
        """Add another clock's ``to_json()`` (a child's); returns the seconds added. Unknown names (a
        child of another version) go to ``other``."""
        total = 0.0
        for k, v in (phases or {}).items():
            if isinstance(v, (int, float)) and v > 0:
                self.add(k if k in PHASES else "other", float(v))
                total += float(v)
        return total

    def total(self) -> float:
        return sum(self.seconds.values())

    def reset(self) -> None:
        self.seconds.clear()
        self._open = None

    def to_json(self) -> dict[str, float]:
        self.mark(self._open[0] if self._open else None)  # the open phase counted up to now
        return {k: round(self.seconds[k], 3) for k in PHASES if self.seconds.get(k)}


# The task this process runs (a task child, or a task server between tasks): worker.main resets it per
# task and returns its ``to_json()`` as the result's ``phases``; launch._build and the tasks mark it.
TASK = PhaseClock()


def summary(costs: list[dict[str, Any]]) -> dict[str, Any]:
    """A device call's summary from its shapes' ``cost`` blocks: seconds by phase summed, shapes, and
    the seconds per shape (mean)."""
    by: dict[str, float] = {}
    total, n = 0.0, 0
    for c in costs:
        if not isinstance(c, dict):
            continue
        n += 1
        total += float(c.get("total_s") or 0.0)
        for k, v in (c.get("device_seconds") or {}).items():
            if isinstance(v, (int, float)):
                by[k] = by.get(k, 0.0) + float(v)
    return {"shapes": n, "total_s": round(total, 2), "per_shape_s": round(total / n, 2) if n else None,
            "device_seconds": {k: round(by[k], 2) for k in PHASES if k in by}}


# Triton's compiles in this process (its compilation listener): cache hits say the carried cache
# (compile_ahead.py) served a launch, misses that the device waited for a compile.
_COMPILES = {"hits": 0, "misses": 0, "compile_s": 0.0}
_WATCHING = {"on": False}


def watch_compiles() -> None:
    """Count Triton's compiles from now on, if Triton is loaded in this process (never imports it)."""
    import sys

    triton = sys.modules.get("triton")
    knobs = getattr(triton, "knobs", None) if triton is not None else None
    if knobs is None or _WATCHING["on"]:
        return

    def listener(*, cache_hit: bool = False, times: Any = None, **_: Any) -> None:
        _COMPILES["hits" if cache_hit else "misses"] += 1
        total = getattr(times, "total", None)
        if not cache_hit and isinstance(total, (int, float)):
            _COMPILES["compile_s"] += total / 1e6

    try:
        knobs.compilation.listener = listener
        _WATCHING["on"] = True
    except Exception:  # noqa: BLE001 - a Triton without the listener: nothing is counted
        pass


def take_compiles() -> dict[str, Any] | None:
    """This task's Triton cache hits and misses (and the seconds the misses compiled), then zero."""
    if not (_COMPILES["hits"] or _COMPILES["misses"]):
        return None
    out = {"hits": _COMPILES["hits"], "misses": _COMPILES["misses"], "compile_s": round(_COMPILES["compile_s"], 3)}
    _COMPILES.update(hits=0, misses=0, compile_s=0.0)
    return out
