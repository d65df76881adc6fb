"""Timers and the same-session interleaved A/B loop (runs in the session child).

A timer measures one launch and returns a thunk that yields milliseconds once the device is
synchronized, so a GPU round needs one synchronization, not one per launch. Timers are pluggable
(``timer="event" | "wall" | "module:factory"``) so tests can inject a fake one and prove that the
physical-limit check rejects an impossible time.
"""
from __future__ import annotations

import importlib
import math
import time
from typing import Any, Callable, Protocol


class Timer(Protocol):
    method: str

    def measure(self, fn: Callable[[], Any]) -> Callable[[], float]: ...

    def sync(self) -> None: ...


class EventTimer:
    """Device events around each launch (CUDA and HIP alike through torch.cuda)."""

    method = "device events (torch.cuda.Event) around each launch"

    def __init__(self) -> None:
        import torch

        self._torch = torch

    def measure(self, fn: Callable[[], Any]) -> Callable[[], float]:
        torch = self._torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return lambda: float(start.elapsed_time(end))

    def sync(self) -> None:
        self._torch.cuda.synchronize()


class WallTimer:
    """Host perf_counter around a synchronous launch: CPU only, never GPU evidence."""

    method = "host wall clock (time.perf_counter) around each launch, CPU"

    def __init__(self, synchronize: Callable[[], None] | None = None) -> None:
        self._sync = synchronize or (lambda: None)

    def measure(self, fn: Callable[[], Any]) -> Callable[[], float]:
        t0 = time.perf_counter()
        fn()
        self._sync()
        ms = (time.perf_counter() - t0) * 1e3
        return lambda: ms

    def sync(self) -> None:
        self._sync()


def make_timer(spec: str | None, device: str) -> Timer | None:
    if spec is None:
        return None
    if spec == "event":
        return EventTimer()
    if spec == "wall":
        if device.startswith("cuda"):
            import torch

            return WallTimer(torch.cuda.synchronize)
        return WallTimer()
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"timer {spec!r} is not 'event', 'wall' or 'module:factory'")
    return getattr(importlib.import_module(module), attr)(device)


def rotation_sets(bytes_per_set: int, l2_bytes: int | None, mode: str, max_sets: int, mem_budget: int) -> tuple[int, str]:
    """How many input sets to rotate so each launch reads operands that are not in L2."""
    if mode == "off" or not l2_bytes:
        return 1, "off (warm L2)" if mode == "off" else "off (device L2 size unknown)"
    if mode == "flush":
        return 1, f"flush: {2 * l2_bytes} bytes written between launches (2x L2)"
    need = math.ceil(2 * l2_bytes / max(bytes_per_set, 1)) + 1
    n = max(1, min(need, max_sets, mem_budget // max(bytes_per_set, 1)))
    if n < need:
        return n, f"rotate {n} input sets x {bytes_per_set} bytes (wanted {need} to cover 2x L2 = {2 * l2_bytes} bytes; capped by memory)"
    return n, f"rotate {n} input sets x {bytes_per_set} bytes >= 2x L2 ({2 * l2_bytes} bytes)"


def interleave(slots: dict[str, list[Callable[[], Any]]], timer: Timer, rounds: int, warmup: int,
               between: Callable[[], None] | None = None, max_seconds: float | None = None) -> dict[str, Any]:
    """Time every slot once per round, alternating the slot order each round.

    ``slots`` maps a slot name to one launch callable per input set; launch ``j`` of a slot uses
    set ``j % len(sets)``, so consecutive launches read different operands (cold L2). Warm-up
    rounds run the same pattern untimed. Returns the samples per slot, in milliseconds.
    """
    names = list(slots)
    count = {n: 0 for n in names}

    def launch(n: str) -> Callable[[], Any]:
        fns = slots[n]
        fn = fns[count[n] % len(fns)]
        count[n] += 1
        return fn

    for _ in range(warmup):
        for n in names:
            if between:
                between()
            launch(n)()
    timer.sync()
    samples: dict[str, list[float]] = {n: [] for n in names}
    t0 = time.perf_counter()
    done = 0
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        pending = []
        for n in order:
            if between:
                between()
            pending.append((n, timer.measure(launch(n))))
        timer.sync()
        for n, read in pending:
            samples[n].append(read())
        done += 1
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds and done >= 10:
            break
    return {"samples": samples, "rounds": done, "warmup": warmup}
