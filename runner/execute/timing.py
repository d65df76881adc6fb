"""Timers and the same-session interleaved A/B loop (runs in the session child).

A timer measures one launch and returns a thunk that yields milliseconds once the device is
synchronized, so a GPU round needs one synchronization, not one per launch. Timers are pluggable
(``timer="event" | "wall" | "module:factory"``) so tests can inject a fake one and prove that the
physical-limit check rejects an impossible time.
"""
from __future__ import annotations

import importlib
import math
import random
import time
from typing import Any, Callable, ContextManager, Protocol


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
               between: Callable[[], None] | None = None, max_seconds: float | None = None, *,
               observe: int = 0, observer: Callable[[str], ContextManager[Any]] | None = None,
               after_round: Callable[[dict[str, Any]], None] | None = None,
               rng: random.Random | None = None) -> dict[str, Any]:
    """Time every slot once per round, alternating the slot order each round.

    ``slots`` maps a slot name to one launch callable per input set (every slot the same number);
    round ``g`` (warm-up included) launches set ``g % sets`` in every slot, so consecutive launches
    read different operands (cold L2). Warm-up rounds run the same pattern untimed.

    ``observe`` extra rounds, at positions drawn from ``rng`` among the timed ones, run each slot's
    launch inside ``observer(slot)`` (the profiler, see integrity.RoundObserver). Their times go to
    ``observed``, never into ``samples``: the profiler's cost cannot reach the statistics, and a port
    cannot tell from the call count which launches are observed.

    ``after_round(info)`` runs after every round, once the round's launches are finished
    (``timer.sync``) and their times read, so whatever it does (checksums, output checks, new
    input content) lies outside every measured interval. ``info``: ``set`` (index), ``kind``
    (warmup | timed | observed), ``index`` (timed/observed rounds, counted together), ``last``.
    Returns the samples per slot in milliseconds, the observed ones, and the observed round indices.
    """
    names = list(slots)
    sizes = {len(v) for v in slots.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every slot needs the same, non-zero number of input sets (got {sorted(sizes)})")
    n_sets = sizes.pop()
    rng = rng or random.SystemRandom()
    total = rounds + max(0, observe)
    observed_at = set(rng.sample(range(total), max(0, min(observe, total)))) if observer is not None else set()
    g = 0  # rounds run so far, warm-up included

    def one_round(order: list[str], wrap: Callable[[str], ContextManager[Any]] | None, measure: bool) -> list:
        j = g % n_sets
        pending = []
        for n in order:
            if between:
                between()
            fn = slots[n][j]
            if not measure:
                fn()
            elif wrap is None:
                pending.append((n, timer.measure(fn)))
            else:
                with wrap(n):
                    pending.append((n, timer.measure(fn)))
        timer.sync()
        return pending

    for w in range(warmup):
        one_round(names, None, False)
        if after_round:
            after_round({"set": g % n_sets, "kind": "warmup", "index": w, "last": False})
        g += 1
    timer.sync()
    samples: dict[str, list[float]] = {n: [] for n in names}
    observed: dict[str, list[float]] = {n: [] for n in names}
    t0 = time.perf_counter()
    done, seen = 0, []
    for i in range(total):
        order = names if i % 2 == 0 else names[::-1]
        obs = i in observed_at
        if obs and hasattr(observer, "round"):
            observer.round = i  # type: ignore[union-attr]
        pending = one_round(order, observer if obs else None, True)
        for n, read in pending:
            (observed if obs else samples)[n].append(read())
        if obs:
            seen.append(i)
        else:
            done += 1
        over = max_seconds is not None and time.perf_counter() - t0 > max_seconds and done >= 10
        last = i == total - 1 or (over and (seen or not observed_at))
        if after_round:
            after_round({"set": g % n_sets, "kind": "observed" if obs else "timed", "index": i, "last": last})
        g += 1
        if last:
            break
        if over:  # out of time, but no round was observed yet: observe the next one, then stop
            observed_at = {i + 1}
    return {"samples": samples, "rounds": done, "warmup": warmup, "observed": observed, "observed_rounds": seen}
