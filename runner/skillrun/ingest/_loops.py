"""Per-batch loops: a run of identical-shape launches of one op, read as the batch of a batched problem.

A batched GEMM written as ``for b in range(B): torch._scaled_mm(x[b], w[b].t(), ...)`` shows in a
trace as B consecutive ``aten::_scaled_mm`` calls with the same argument shapes; no single call
carries B. Here the launching ops of each thread are put in time order, cut at profiler-step
boundaries, and run-length encoded by op identity (name + recorded shapes/types). Any other op
that launched a kernel in between ends a run.

An op identity gets a batch only when every one of its runs (in every step, on every thread) has
the same length L >= 2: that is a loop of L repeated step after step. A key that also appears
alone, or in runs of different lengths, is left alone (a layer that happens to repeat is not a
loop, and guessing between two lengths would be a guess).
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, Hashable, Iterable, Optional


def _step_index(steps: dict[Any, list[tuple[float, float]]], all_steps: list[tuple[float, float]], tid: Any,
                ts: float) -> Optional[int]:
    for lst in (steps.get(tid), all_steps):
        if not lst:
            continue
        i = bisect_right([s for s, _ in lst], ts) - 1
        if i >= 0 and lst[i][0] <= ts <= lst[i][1]:
            return i if lst is all_steps else -(i + 1)
    return None


def loop_batches(instances: Iterable[tuple[Any, float, Hashable]],
                 steps: Iterable[tuple[Any, float, float]] = ()) -> dict[Hashable, int]:
    """``{op key: L}`` for op keys whose every run of consecutive launches has length L >= 2.

    ``instances``: one (thread, start time, op key) per launching op call (duplicates — one op that
    launched several kernels — count once). ``steps``: (thread, start, end) of ProfilerStep ranges.
    """
    by_tid_steps: dict[Any, list[tuple[float, float]]] = {}
    all_steps: list[tuple[float, float]] = []
    for tid, a, b in steps:
        by_tid_steps.setdefault(tid, []).append((a, b))
        all_steps.append((a, b))
    for lst in by_tid_steps.values():
        lst.sort()
    all_steps.sort()
    seqs: dict[tuple, list[tuple[float, Hashable]]] = {}
    for tid, ts, key in set(instances):
        seg = _step_index(by_tid_steps, all_steps, tid, ts)
        seqs.setdefault((tid, seg), []).append((ts, key))
    runs: dict[Hashable, set[int]] = {}
    for seq in seqs.values():
        seq.sort(key=lambda x: x[0])
        prev, n = None, 0
        for _, key in seq + [(0.0, object())]:
            if key == prev:
                n += 1
                continue
            if prev is not None:
                runs.setdefault(prev, set()).add(n)
            prev, n = key, 1
    return {key: next(iter(lengths)) for key, lengths in runs.items() if len(lengths) == 1 and next(iter(lengths)) >= 2}
