"""Shared timing and parity helpers for the sm_90 benchmark scripts in this folder.

Protocol (facts/measurement_method.md): all candidates of one shape are timed in the same process by
the runner's timing engine (skillrun.execute.timing): interleaved, positions balanced, each round
held on the device until it is queued (no interval starts on an idle GPU), the L2 flushed before
every timed call; we report medians. Two views:

- ``eager``: each call as a user's Python would issue it (launch and host overhead included);
- ``graph``: the call captured once in a CUDA graph and replayed (device time, launch gaps gone).

Only torch is needed here, so the scripts run on the bare GPU image.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

import torch

_FLUSH_BYTES = 256 << 20  # > 4x the H200's 60 MB L2

# Set by a script's --dry-run-cpu: the same code paths run on the CPU (Triton interpreter, host
# clock, no graphs) to check a benchmark's plumbing before spending device time. Numbers from a
# dry run mean nothing.
DRY_RUN_CPU = False


def load_interpreter_fixups() -> None:
    """For dry runs: the bf16 fixes for Triton's CPU interpreter that the CPU tests use."""
    import os
    import sys
    from pathlib import Path

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--dry-run-cpu needs TRITON_INTERPRET=1 in the environment")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import interp_fixups  # noqa: F401


def sync() -> None:
    if not DRY_RUN_CPU:
        torch.cuda.synchronize()


class L2Flush:
    def __init__(self, device: str = "cuda") -> None:
        self.buf = None if DRY_RUN_CPU else torch.empty(_FLUSH_BYTES, dtype=torch.int8, device=device)

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf.zero_()


class CapturedGraph:
    """A captured CUDA graph together with the callable it was captured from.

    The graph replays raw device addresses; keeping the callable (and through it every tensor
    the call reads or writes) alive is what keeps those addresses valid. Dropping the callable
    while keeping only ``graph.replay`` let the caching allocator reuse or release the buffers:
    the first H200 run of the fp8 sweep died with an illegal address that way.
    """

    def __init__(self, graph, fn: Callable[[], Any]) -> None:
        self.graph = graph
        self.fn = fn

    def replay(self) -> None:
        if self.graph is None:
            self.fn()
        else:
            self.graph.replay()


def capture_graph(fn: Callable[[], Any]) -> CapturedGraph:
    """Warm ``fn`` up on a side stream (as capture requires), then capture one call."""
    if DRY_RUN_CPU:
        fn()
        return CapturedGraph(None, fn)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return CapturedGraph(graph, fn)


def engine_times(fns: dict[str, Callable[[], Any]], rounds: int, warmup: int = 2, flush: L2Flush | None = None,
                 budget_s: float | None = None) -> dict[str, Any]:
    """The runner's timing engine (skillrun.execute.timing.time_slots) for the benchmarks: the same
    held rounds, balanced positions and raw samples as every validation artifact, so a bench and the
    runner cannot disagree through their loops. A dry run uses the host clock."""
    from skillrun.execute import timing

    timer = timing.WallTimer() if DRY_RUN_CPU else timing.EventTimer()
    between = flush if flush is not None and not DRY_RUN_CPU else None
    return timing.time_slots(fns, rounds=min(rounds, 2) if DRY_RUN_CPU else rounds, warmup=warmup, timer=timer,
                             between=between, max_seconds=budget_s)


def time_interleaved(
    fns: dict[str, Callable[[], Any]],
    reps: int = 20,
    warmup: int = 2,
    flush: L2Flush | None = None,
    budget_s: float | None = None,
) -> dict[str, list[float]]:
    """Milliseconds per call for every candidate (kept samples of :func:`engine_times`)."""
    return engine_times(fns, reps, warmup, flush, budget_s)["samples"]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def spread_pct(xs: list[float]) -> float:
    """Interquartile range over the median, in percent (a noise indicator per candidate)."""
    if len(xs) < 4:
        return math.nan
    q = statistics.quantiles(xs, n=4)
    return 100.0 * (q[2] - q[0]) / statistics.median(xs)


def parity(out: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-2, atol: float = 1e-2) -> dict[str, float]:
    """Relative Frobenius error, cosine, max abs error and the share of elements out of tolerance."""
    o = out.float().reshape(-1)
    r = ref.float().reshape(-1)
    finite = bool(torch.isfinite(o).all())
    diff = (o - r).abs()
    bad = (diff > atol + rtol * r.abs()).float().mean().item()
    return {
        "rel_fro": ((o - r).norm() / r.norm().clamp_min(1e-30)).item(),
        "cosine": torch.nn.functional.cosine_similarity(o, r, dim=0).item(),
        "max_abs": diff.max().item(),
        "frac_out_of_tol": bad,
        "finite": finite,
    }


def kernel_names(fn: Callable[[], Any]) -> dict[str, int]:
    """Device kernel names one call launches (torch.profiler, CUDA activity), with counts."""
    from torch.profiler import ProfilerActivity, profile

    if DRY_RUN_CPU:
        return {}
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names: dict[str, int] = {}
    for ev in prof.events():
        if getattr(ev, "device_type", None) is not None and str(ev.device_type).endswith("CUDA"):
            names[ev.name] = names.get(ev.name, 0) + 1
    return names


def fmt_us(ms: float) -> str:
    return "-" if ms is None or math.isnan(ms) else f"{ms * 1000:.1f}"


def run_compile_tasks(compile_task: Callable[[Any], str], tasks: list, jobs: int) -> list[str]:
    """Run ``compile_task`` over ``tasks`` (in ``jobs`` spawned processes when ``jobs > 1``) and
    return the failures: every result that is not ``"ok"``. ``compile_task`` must be a module-level
    function so a spawned worker can import it."""
    if jobs <= 1:
        return [r for r in map(compile_task, tasks) if r != "ok"]
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(jobs) as pool:
        return [r for r in pool.map(compile_task, tasks, chunksize=1) if r != "ok"]


def record_times(impls: dict[str, dict], mode: str, times: dict[str, list[float]]) -> None:
    """Store each candidate's median (``mode``, e.g. ``graph_ms``) and its spread under ``impls``."""
    for name, ts in times.items():
        tgt = impls.setdefault(name, {})
        tgt[mode] = median(ts)
        tgt[mode.replace("_ms", "_spread_pct")] = spread_pct(ts)


def add_speedups(res: dict, bases: tuple[str, ...], port: str = "port") -> None:
    """``res["speedup"][f"{base}_{eager|graph}"]``: each baseline's time over the port's, where both ran
    (``port`` names the candidate; a non-default one prefixes its keys with ``{port}_vs_``)."""
    p = res["impls"].get(port, {})
    prefix = "" if port == "port" else f"{port}_vs_"
    for base in bases:
        b = res["impls"].get(base, {})
        for mode in ("eager_ms", "graph_ms"):
            if p.get(mode) and b.get(mode):
                res.setdefault("speedup", {})[f"{prefix}{base}_{mode[:-3]}"] = b[mode] / p[mode]


def copy_bandwidth_tbps(nbytes: int = 2 << 30, reps: int = 10) -> float | None:
    """The memory roof measured in this session: a device-to-device copy of ``nbytes``, counted as
    bytes read plus bytes written over the median time (TB/s). Memory-bound kernels are reported
    as a percentage of this, not of the datasheet's 4.8 TB/s. None on a dry run."""
    if DRY_RUN_CPU:
        return None
    src = torch.empty(nbytes, dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    ts = time_interleaved({"copy": lambda: dst.copy_(src)}, reps=reps, warmup=2, flush=None)["copy"]
    del src, dst
    return 2 * nbytes / (median(ts) * 1e-3) / 1e12


def add_roof(impls: dict[str, dict], nbytes: float, copy_tbps: float | None) -> None:
    """Per candidate and view: achieved TB/s over the problem's fewest bytes, and its % of the copy roof."""
    for row in impls.values():
        for mode in ("eager_ms", "graph_ms"):
            if row.get(mode):
                tbps = nbytes / (row[mode] * 1e-3) / 1e12
                row[mode.replace("_ms", "_tbps")] = tbps
                if copy_tbps:
                    row[mode.replace("_ms", "_pct_copy")] = 100.0 * tbps / copy_tbps


def run_header(dry_run_cpu: bool) -> dict[str, Any]:
    """The versions and commit a results JSON starts with."""
    import os

    return {"device": "cpu (dry run)" if dry_run_cpu else torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "commit": os.environ.get("GIT_COMMIT", "unknown")}


def save_json(path: Any, result: dict) -> None:
    """Write ``result`` to ``path`` (a ``Path`` or None: nothing is written)."""
    if path:
        import json

        path.write_text(json.dumps(result, indent=1, default=str))


def timed_precompile(result: dict, compile_all: Callable[[], list[str]]) -> None:
    """Run ``compile_all()``; record its failures and wall time in ``result`` and print them."""
    tc = time.perf_counter()
    result["compile_failures"] = compile_all()
    result["precompile_s"] = time.perf_counter() - tc
    print(f"precompiled in {result['precompile_s']:.1f}s; failures: {result['compile_failures']}", flush=True)
