"""fp8 block-scale GEMM on sm_90: the Triton and Gluon ports against cuBLAS block-wise and bf16 cuBLAS.

    source .ci/device-env.sh
    python benchmarks/bench_fp8_blockscale_sm90.py --sweep --out $OUT/fp8bs.json

Per shape, in one process: the port, cuBLAS block-wise as a user calls it today (unpadded scale
layout), cuBLAS block-wise with the L4-padded layout, bf16 cuBLAS on pre-dequantized operands, and
(large shapes) an fp8 tensor-wise cuBLAS GEMM as a ceiling for the tensor cores without any
block-scale work. Columns: TFLOP/s, % of the 1979 TF fp8 dense peak, speedups, and parity
(||out - ref|| / ||ref|| against the fp32 dequant oracle, NaN-poisoned outputs).

Timing: every slot is captured in a CUDA graph of R back-to-back calls that rotate over input sets
whose total size is over the 60 MB L2 (so calls read from HBM, as in a model); slots are replayed
interleaved by the runner's timing engine (``skillrun.execute.timing`` through ``sm90_timing.engine_times``:
each round held on the device until it is queued, slot positions balanced); the median over rounds of
(replay time / R) is reported.

``--sweep`` first times a grid of port configs per shape (compile variants are built in parallel
worker processes) and uses the fastest oracle-correct one; every config's result is kept in the
JSON (this is the ablation data the card and NOTES.md quote). ``FP8BS_GRID=run2`` selects the
second, narrower prefill grid (after the store fix); results of both H200 runs are in
``benchmarks/results/`` and summarised in ``kernels/skillrun_kernels/fp8_blockscale_gemm/NOTES.md``.
Gluon (``gluon_sm90.py``, warp-specialized; ``--gluon-module gluon_sm90_ws`` for issue 40's kernel with
DeepGEMM's levers): slot ``gluon`` beside the Triton ``port`` in every table row, with ``--gluon-config``
(JSON, default the design point). ``--gluon-ablations`` adds, on
shapes with M > 256, a second interleaved group of every ``gluon_sm90.ABLATIONS`` variant and
records each one's time relative to the design point in the same session (promote removed, one
consumer warpgroup, async depth 0, stages, tile shape). MSLK's CUTLASS groupwise kernel is timed
as slot ``mslk_groupwise`` when ``references.build_mslk_groupwise`` exists and mslk imports.
``FP8BS_BENCH_DEVICE=cpu`` with ``TRITON_INTERPRET=1`` runs the whole script on small shapes
(``--shapes 272x256x640,1x192x512``) as a smoke test without a GPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[1]
DEV = os.environ.get("FP8BS_BENCH_DEVICE", "cuda")  # "cpu" = smoke test through the Triton interpreter


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()
PEAK_TF = 1979.0  # H200 SXM fp8 dense, datasheet
PARITY_TOL = 5e-3  # fp32 promote + bf16 output lands near 1.7e-3; a wrong scale lands far above

LARGE = [(4096, 65536, 1536), (4096, 2048, 7168), (16384, 1536, 7168), (16384, 7168, 768), (8192, 8192, 8192)]
DECODE = [(m, n, k) for m in (1, 16, 64, 128) for (n, k) in ((7168, 2048), (2112, 7168), (2048, 7168))]


def _imports():
    sys.path.insert(0, str(REPO))
    from skillrun_kernels.fp8_blockscale_gemm import problem, references, triton_sm90

    return problem, references, triton_sm90


KREF = "skillrun_kernels.fp8_blockscale_gemm"


def guarded(sd: dict, variants: dict[str, tuple[str, dict | None]], args) -> dict[str, dict]:
    """The launch watchdog (skillrun.execute.watchdog) over this shape's kernel variants, one
    child process for all: name -> {status, error} for each variant that must not be launched here
    (it hung, crashed or raised in its probe); a variant not in the answer may run. Off with
    --watchdog-s 0."""
    if not args.watchdog_s or not variants:
        return {}
    from skillrun.execute.watchdog import probe_kernels

    slots = [{"slot": n, "ref": ref, "config": cfg or {}} for n, (ref, cfg) in variants.items()]
    t0 = time.time()
    probes = probe_kernels(slots, problem=f"{KREF}.problem", shape=sd, device=DEV, deadline_s=args.watchdog_s)
    bad = {p.slot: {"status": p.status, "error": f"launch watchdog: {p.reason}"[:600]} for p in probes if p.status != "ok"}
    print(f"[watchdog {sd['M']}x{sd['N']}x{sd['K']}] {len(probes)} variants probed in {time.time() - t0:.1f}s; "
          + ("; ".join(f"{n} {w['status']}: {w['error'][:160]}" for n, w in bad.items()) or "all returned"), flush=True)
    return bad


def _gluon_name() -> str:
    """Which Gluon port the ``gluon`` slot runs: gluon_sm90 (default) or gluon_sm90_ws (issue 40's
    levers), by --gluon-module, passed to the compile workers through FP8BS_GLUON_MODULE."""
    return os.environ.get("FP8BS_GLUON_MODULE", "gluon_sm90")


def _gluon():
    """The Gluon port module, or None where it cannot run (no CUDA device, or no Gluon in this triton)."""
    if DEV != "cuda":
        return None
    import importlib

    mod = importlib.import_module(f"{KREF}.{_gluon_name()}")
    return mod if mod.GLUON_IMPORT_ERROR is None else None


# ----------------------------------------------------------------------------------------------
# Config grids (the sweep). Large shapes try the structural levers; skinny shapes try split-K.


def large_grid() -> list[dict]:
    if os.environ.get("FP8BS_GRID") == "run2":
        return large_grid_run2()
    g = []
    P = dict(BM=128, BN=128, num_warps=8, persistent=True)
    for st in (3, 4, 5):
        g.append(dict(P, stages=st))  # persistent, TMA, plain promote (the probe's kernel)
    g.append(dict(P, stages=4, flatten=True))  # persistent with the tile loop flattened (epilogue overlap)
    g.append(dict(P, stages=3, flatten=True))
    g.append(dict(P, stages=2, pair=True))  # promote of block 2j overlaps wgmma of block 2j+1
    g.append(dict(P, stages=3, pair=True))
    g.append(dict(BM=128, BN=128, num_warps=8, persistent=False, stages=4))  # one CTA per tile
    g.append(dict(BM=128, BN=128, num_warps=8, persistent=False, stages=2, pair=True))
    g.append(dict(BM=128, BN=128, num_warps=8, persistent=False, stages=3, pair=True))
    g.append(dict(BM=64, BN=128, num_warps=4, persistent=False, stages=4))  # two CTAs per SM
    g.append(dict(BM=64, BN=128, num_warps=4, persistent=False, stages=2, pair=True))
    g.append(dict(BM=64, BN=128, num_warps=4, persistent=True, stages=4, ctas_per_sm=2))
    g.append(dict(BM=64, BN=128, num_warps=4, persistent=True, stages=2, pair=True, ctas_per_sm=2))
    g.append(dict(BM=128, BN=256, NSUB=2, num_warps=8, persistent=True, stages=3, flatten=True))  # bigger tile
    g.append(dict(BM=128, BN=256, NSUB=2, num_warps=8, persistent=False, stages=3))  # (both spill: compile check)
    g.append(dict(P, stages=4, tma=False))  # pointer loads (cp.async) instead of TMA descriptors
    g.append(dict(BM=128, BN=128, num_warps=8, persistent=False, stages=4, tma=False))  # the naive kernel's shape
    # Diagnostics, never winners: same tiles with the promote removed (scales ignored), i.e. what
    # data movement + wgmma alone reach. The gap to the real kernel is the promote's cost.
    g.append(dict(P, stages=4, diag_nopromote=True))
    g.append(dict(BM=128, BN=256, num_warps=8, persistent=True, stages=3, diag_nopromote=True))
    return g


def large_grid_run2() -> list[dict]:
    """Second H200 call: after the store fix, the structural candidates that were close in run 1,
    more CTAs per SM for the 64x128 tile, and the no-promote ceilings of both tiles."""
    P = dict(BM=128, BN=128, num_warps=8, persistent=True)
    return [
        dict(P, stages=4), dict(P, stages=5), dict(P, stages=4, flatten=True),
        dict(BM=128, BN=128, num_warps=8, persistent=False, stages=4),
        dict(BM=64, BN=128, num_warps=4, persistent=False, stages=4),
        dict(BM=64, BN=128, num_warps=4, persistent=False, stages=3),
        dict(BM=64, BN=128, num_warps=4, persistent=True, stages=4, ctas_per_sm=2),
        dict(BM=64, BN=128, num_warps=4, persistent=True, stages=3, ctas_per_sm=3),
        dict(BM=128, BN=128, num_warps=8, persistent=True, stages=3, pair=True),
        dict(P, stages=4, diag_nopromote=True),
        dict(BM=64, BN=128, num_warps=4, persistent=False, stages=4, diag_nopromote=True),
    ]


GROUP_M_TRIES = (1, 4, 16, 32)


def skinny_grid(M: int) -> list[dict]:
    bms = [16] if M <= 16 else ([32, 64] if M <= 32 else ([64] if M <= 64 else [64, 128]))
    g = []
    for bm in bms:
        for bn in (64, 128):
            if bm == 128 and bn == 128:
                continue  # 4 warps spill at 128x128 (compile check); 8 warps below
            for st in (4, 6):
                for split in (1, 2, 4, 8):
                    g.append(dict(BM=bm, BN=bn, num_warps=4, stages=st, persistent=False, split_k=split, group_m=1))
    if M > 64 and os.environ.get("FP8BS_GRID") == "run2":
        for split in (1, 2):
            g.append(dict(BM=128, BN=128, num_warps=8, stages=4, persistent=False, split_k=split, group_m=8))
    return g


def compile_key(cfg: dict) -> tuple:
    # Fields that change the binary (split_k only through USE_SPLIT; group_m/ctas are runtime).
    c = dict(cfg)
    c["split_k"] = 2 if c.get("split_k", 1) > 1 else 1
    c.pop("group_m", None)
    c.pop("ctas_per_sm", None)
    return tuple(sorted(c.items()))


# ----------------------------------------------------------------------------------------------
# Parallel precompile: each worker runs each config once on a tiny problem. Sizes are not
# specialised in the kernel, so the cached binary is the one the big shapes use.


def _compile_worker(cfgs: list[dict]) -> list[tuple[dict, str | None, float]]:
    problem, _, ts = _imports()
    out = []
    for cfg in cfgs:
        t0 = time.time()
        try:
            shape = {"M": 17, "N": 256, "K": 512}
            x = problem.make_inputs(shape, 0, DEV)
            kl = ts.build(shape, cfg, DEV)
            o = problem.output_like(shape, DEV)
            kl.run(kl.prepare(x), o)
            sync()
            out.append((cfg, None, time.time() - t0))
        except Exception as exc:  # a variant that does not compile is reported, not fatal
            out.append((cfg, f"{type(exc).__name__}: {str(exc)[-300:]}", time.time() - t0))
    return out


def _gluon_compile_worker(cfgs: list[dict]) -> list[tuple[dict, str | None, float]]:
    problem, _, _ = _imports()
    gs = _gluon()
    out = []
    for cfg in cfgs:
        t0 = time.time()
        try:
            shape = {"M": 17, "N": 256, "K": 512}
            kl = gs.build(shape, cfg, DEV)
            kl.run(kl.prepare(problem.make_inputs(shape, 0, DEV)), problem.output_like(shape, DEV))
            sync()
            out.append((cfg, None, time.time() - t0))
        except Exception as exc:
            out.append((cfg, f"{type(exc).__name__}: {str(exc)[-300:]}", time.time() - t0))
    return out


def precompile_gluon(cfgs: list[dict], workers: int) -> dict[str, str | None]:
    """Each Gluon variant compiled once in worker processes (the on-disk Triton cache serves this one)."""
    uniq = {json.dumps({k: v for k, v in c.items() if k != "group_m"}, sort_keys=True): c for c in cfgs}
    todo = list(uniq.values())
    t0 = time.time()
    if workers <= 1 or len(todo) <= 1:
        res = _gluon_compile_worker(todo)
    else:
        import multiprocessing as mp

        chunks = [todo[i::workers] for i in range(workers) if todo[i::workers]]
        with mp.get_context("spawn").Pool(len(chunks)) as pool:
            res = [r for part in pool.map(_gluon_compile_worker, chunks) for r in part]
    bad = [(c, e) for c, e, _ in res if e]
    print(f"[precompile gluon] {len(todo)} variants in {time.time() - t0:.1f}s; {len(bad)} failed", flush=True)
    for c, e in bad:
        print(f"[precompile gluon] FAILED {c}: {e}", flush=True)
    return {json.dumps(c, sort_keys=True): e for c, e, _ in res}


def precompile(cfgs: list[dict], workers: int) -> dict[tuple, str | None]:
    uniq: dict[tuple, dict] = {}
    for c in cfgs:
        uniq.setdefault(compile_key(c), c)
    todo = list(uniq.values())
    t0 = time.time()
    if workers <= 1:
        res = _compile_worker(todo)
    else:
        import multiprocessing as mp

        chunks = [todo[i::workers] for i in range(workers) if todo[i::workers]]
        with mp.get_context("spawn").Pool(len(chunks)) as pool:
            res = [r for part in pool.map(_compile_worker, chunks) for r in part]
    status = {compile_key(c): err for c, err, _ in res}
    bad = [(c, e) for c, e, _ in res if e]
    print(f"[precompile] {len(todo)} variants in {time.time() - t0:.1f}s with {workers} workers; {len(bad)} failed", flush=True)
    for c, e in bad:
        print(f"[precompile] FAILED {c}: {e}", flush=True)
    return status


# ----------------------------------------------------------------------------------------------
# Measurement helpers


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| accumulated in fp64 over row chunks (memory-bounded); inf if non-finite."""
    num = 0.0
    den = 0.0
    step = max(1, (1 << 26) // max(1, ref.shape[1]))
    for i in range(0, ref.shape[0], step):
        o = out[i:i + step].float()
        if not torch.isfinite(o).all():
            return float("inf")
        r = ref[i:i + step].float()
        num += float((o - r).double().pow(2).sum())
        den += float(r.double().pow(2).sum())
    return math.sqrt(num) / max(math.sqrt(den), 1e-30)


def eager_ms(fn: Callable[[], Any], n: int = 5) -> float:
    for _ in range(2):
        fn()
    if DEV == "cpu":
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) * 1e3 / n
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(n):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / n


class GraphSlot:
    """R back-to-back calls rotating over the input sets, captured once and replayed.
    If capture fails, the same R calls are issued eagerly (``graph`` False: launch gaps included)."""

    def __init__(self, calls: list[Callable[[], Any]], target_ms: float):
        self.calls = calls
        self.graph = None
        if DEV == "cpu":  # smoke-test mode: no graphs, host clock
            self.R = len(calls)
            return
        est = eager_ms(lambda: [c() for c in calls], n=2) / len(calls)
        reps = max(len(calls), min(400, int(target_ms / max(est, 1e-3))))
        self.R = -(-reps // len(calls)) * len(calls)
        try:
            self._capture()
        except Exception as exc:
            self.graph = None
            self.capture_error = f"{type(exc).__name__}: {str(exc)[:200]}"
            torch.cuda.synchronize()

    def _capture(self) -> None:
        calls = self.calls
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for c in calls:
                c()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for i in range(self.R):
                calls[i % len(calls)]()
        torch.cuda.synchronize()
        self.graph.replay()
        torch.cuda.synchronize()

    def launch(self) -> None:
        """One timed unit: the captured replay (or the same R calls eagerly)."""
        if self.graph is not None:
            self.graph.replay()
        else:
            for i in range(self.R):
                self.calls[i % len(self.calls)]()


def interleaved(slots: dict[str, GraphSlot], rounds: int, clocks: dict[str, list] | None = None) -> dict[str, list[float]]:
    """Milliseconds per call for every slot, from the runner's timing engine (skillrun.execute.timing:
    each round held on the device until queued, positions balanced); a slot's sample is one replay of
    its R calls, divided by R."""
    import sm90_timing as tm

    tm.DRY_RUN_CPU = DEV == "cpu"
    t = tm.engine_times({n: s.launch for n, s in slots.items()}, rounds, warmup=1)
    if clocks is not None:
        # One SM clock reading per round (NVML, read by the engine while the round runs); no power reading.
        per_round = [(c, float("nan")) for c in t["round_info"]["clock_mhz"] if c]
        for n in slots:
            clocks[n] = per_round
    return {n: [ms / slots[n].R for ms in v] for n, v in t["samples"].items()}


def isolated(slot: GraphSlot, reps: int = 3) -> float:
    """The sweep's way: a short burst after the GPU sat idle (boost clocks, no power cap yet)."""
    sync()
    time.sleep(0.05)
    return statistics.median(interleaved({"x": slot}, reps)["x"])


def kernel_names(fn: Callable[[], Any]) -> list[str]:
    """Device kernels one call launches (torch.profiler), for the card's regex tests."""
    if DEV == "cpu":
        return []
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = []
        for evt in prof.events():
            if str(getattr(evt, "device_type", "")).endswith("CUDA"):
                if evt.name not in names and not evt.name.startswith(("Memset", "Memcpy")):
                    names.append(evt.name)
        return names
    except Exception as exc:  # names are evidence for the card, not needed for timing
        return [f"<profiler failed: {type(exc).__name__}: {str(exc)[:120]}>"]


def n_sets(shape: tuple[int, int, int]) -> int:
    if DEV == "cpu":
        return 2
    M, N, K = shape
    per = M * K + N * K + 2 * M * N
    return int(min(12, max(2, math.ceil(150e6 / per))))


# ----------------------------------------------------------------------------------------------


def bench_shape(shape: tuple[int, int, int], args, status: dict, results: dict) -> None:
    problem, refs, ts = _imports()
    M, N, K = shape
    key = f"{M}x{N}x{K}"
    sd = {"M": M, "N": N, "K": K}
    flops = problem.flops(sd)
    t_shape = time.time()
    nset = n_sets(shape)
    sets = [problem.make_inputs(sd, args.seed + 1000 * i, DEV) for i in range(nset)]
    outs = [problem.output_like(sd, DEV) for _ in range(nset)]
    ref = problem.oracle(sets[0])
    sync()
    row: dict[str, Any] = {"shape": [M, N, K], "sets": nset, "seed": args.seed, "slots": {}}

    def port_calls(cfg: dict):
        kl = ts.build(sd, cfg, DEV)
        preps = [kl.prepare(x) for x in sets]
        return kl, [(lambda p=p, o=o: kl.run(p, o)) for p, o in zip(preps, outs)], preps

    def check_port(kl, preps) -> tuple[float, bool]:
        outs[0].fill_(float("nan"))
        kl.run(preps[0], outs[0])
        sync()
        e1 = rel_err(outs[0], ref)
        first = outs[0].clone()
        outs[0].fill_(float("nan"))
        kl.run(preps[0], outs[0])
        sync()
        return e1, bool(torch.equal(first, outs[0]))

    # ---- sweep
    chosen = ts.default_config(sd).as_dict()
    if args.sweep:
        grid = large_grid() if M > 256 else skinny_grid(M)
        tried = []
        for cfg in grid:
            if time.time() > args.deadline:
                print(f"[sweep {key}] budget reached; stopping the sweep", flush=True)
                break
            if status.get(compile_key(cfg)):
                tried.append({"config": cfg, "error": "compile: " + status[compile_key(cfg)]})
                continue
            ent: dict[str, Any] = {"config": cfg}
            try:
                kl, calls, preps = port_calls(cfg)
                err, det = check_port(kl, preps)
                ent.update(rel_err=err, deterministic=det)
                if err <= PARITY_TOL or cfg.get("diag_nopromote"):
                    ms = statistics.median(interleaved({"p": GraphSlot(calls, args.sweep_target_ms)}, 3)["p"])
                    ent.update(ms=ms, tflops=flops / ms / 1e9)
                    if cfg.get("diag_nopromote"):
                        ent["diag"] = True
                del calls, preps
            except Exception as exc:
                ent["error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
            tried.append(ent)
            print(f"[sweep {key}] {json.dumps(ent)}", flush=True)
        ok = [t for t in tried if "ms" in t and not t.get("diag")]
        # Runtime-only knob: the raster group for the best two persistent/grouped configs.
        if M > 256 and ok:
            for base in sorted(ok, key=lambda t: t["ms"])[:2]:
                for gm in GROUP_M_TRIES:
                    if time.time() > args.deadline:
                        break
                    cfg = dict(base["config"], group_m=gm)
                    ent = {"config": cfg}
                    try:
                        kl, calls, preps = port_calls(cfg)
                        err, det = check_port(kl, preps)
                        ent.update(rel_err=err, deterministic=det)
                        if err <= PARITY_TOL:
                            ms = statistics.median(interleaved({"p": GraphSlot(calls, args.sweep_target_ms)}, 3)["p"])
                            ent.update(ms=ms, tflops=flops / ms / 1e9)
                    except Exception as exc:
                        ent["error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
                    tried.append(ent)
                    print(f"[sweep {key}] {json.dumps(ent)}", flush=True)
            ok = [t for t in tried if "ms" in t and not t.get("diag")]
        results["sweep"][key] = tried
        if ok:
            best = min(ok, key=lambda t: t["ms"])
            chosen = dict(ts.Config().as_dict(), **best["config"])
    elif args.configs and key in args.configs:
        chosen = args.configs[key]
    results["winners"][key] = chosen

    # ---- table: every slot, same session, interleaved
    builders = {
        "port": lambda: ts.build(sd, chosen, DEV),
        "port_repeat": lambda: ts.build(sd, chosen, DEV),  # same kernel again: the noise floor
        "cublas_blockwise": lambda: refs.build_cublas_blockwise(sd, None, DEV),
        "cublas_blockwise_padded": lambda: refs.build_cublas_blockwise_padded(sd, None, DEV),
        "bf16_cublas": lambda: refs.build_bf16_cublas(sd, None, DEV),
    }
    gs = _gluon()
    if gs is not None and not args.no_gluon:
        builders["gluon"] = lambda: gs.build(sd, args.gluon_config, DEV)
    if hasattr(refs, "build_mslk_groupwise"):  # added by the references work; absent in older trees
        builders["mslk_groupwise"] = lambda: refs.build_mslk_groupwise(sd, None, DEV)
    if hasattr(refs, "build_deepgemm") and DEV == "cuda":  # built on the device (device_deepgemm_build.sh)
        builders["deepgemm"] = lambda: refs.build_deepgemm(sd, None, DEV)
    slots: dict[str, GraphSlot] = {}
    blocked = guarded(sd, {"port": (f"{KREF}.triton_sm90:build", chosen),
                           **({"gluon": (f"{KREF}.{_gluon_name()}:build", args.gluon_config)} if "gluon" in builders else {})}, args)
    for name, mk in builders.items():
        info: dict[str, Any] = {}
        why = blocked.get("port" if name == "port_repeat" else name)
        if why:  # never launched in this process: a hung launch would take every other slot down
            row["slots"][name] = dict(why)
            continue
        try:
            kl = mk()
            preps = [kl.prepare(x) for x in sets]
            res_outs = [problem.output_like(sd, DEV) for _ in range(nset)] if name != "port" else outs
            calls = [(lambda p=p, o=o, kl=kl: kl.run(p, o)) for p, o in zip(preps, res_outs)]
            res_outs[0].fill_(float("nan"))
            got = kl.run(preps[0], res_outs[0])
            sync()
            info["rel_err"] = rel_err(got, ref)
            info["parity_ok"] = info["rel_err"] <= PARITY_TOL
            if name in ("port", "gluon"):
                first = got.clone()
                kl.run(preps[0], res_outs[0])
                sync()
                info["deterministic"] = bool(torch.equal(first, res_outs[0]))
                del first
            info["kernels"] = kernel_names(calls[0])
            info["describe"] = {k: v for k, v in kl.describe.items() if isinstance(v, (str, int, float, bool, dict))}
            slots[name] = GraphSlot(calls, args.target_ms)
            info["R"] = slots[name].R
            info["graph"] = slots[name].graph is not None or DEV == "cpu"
            if getattr(slots[name], "capture_error", None):
                info["capture_error"] = slots[name].capture_error
        except Exception as exc:
            kind = type(exc).__name__
            info["status"] = {"UnsupportedShape": "unsupported", "ReferenceUnavailable": "unavailable"}.get(kind, "error")
            info["error"] = f"{type(exc).__name__}: {str(exc)[-400:]}"
        row["slots"][name] = info
    if M > 256:  # tensor-core ceiling without block scales (different numerics: reference only)
        try:
            one = torch.ones((), device=DEV, dtype=torch.float32)
            tw_outs = [problem.output_like(sd, DEV) for _ in range(nset)]
            tw = [(lambda x=x, o=o: torch._scaled_mm(x["a"], x["b"].t(), one, one, out_dtype=torch.bfloat16, out=o)) for x, o in zip(sets, tw_outs)]
            slots["fp8_tensorwise_ceiling"] = GraphSlot(tw, args.target_ms)
            row["slots"]["fp8_tensorwise_ceiling"] = {"kernels": kernel_names(tw[0]), "note": "no block scales; not the same numerics"}
        except Exception as exc:
            row["slots"]["fp8_tensorwise_ceiling"] = {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[-300:]}"}
    iso = {name: isolated(sl) for name, sl in slots.items()}
    clk: dict[str, list] = {}
    times = interleaved(slots, args.rounds, clk)
    for name, ts_ms in times.items():
        med = statistics.median(ts_ms)
        info = row["slots"][name]
        info.update(ms=med, ms_min=min(ts_ms), ms_max=max(ts_ms), tflops=flops / med / 1e9, pct_peak=100.0 * flops / med / 1e9 / PEAK_TF)
        info.update(ms_isolated=iso[name], tflops_isolated=flops / iso[name] / 1e9)
        if clk.get(name):
            info["sm_mhz_median"] = statistics.median(c[0] for c in clk[name])
            info["sm_mhz_min"] = min(c[0] for c in clk[name])
            info["power_w_median"] = statistics.median(c[1] for c in clk[name])
        info.setdefault("status", "ok")
    p = row["slots"].get("port", {})
    for base in ("cublas_blockwise", "cublas_blockwise_padded", "bf16_cublas", "fp8_tensorwise_ceiling", "mslk_groupwise", "deepgemm"):
        b = row["slots"].get(base, {})
        if "ms" in p and "ms" in b:
            row[f"speedup_vs_{base}"] = b["ms"] / p["ms"]
    gl_slot = row["slots"].get("gluon", {})
    for base in ("cublas_blockwise", "cublas_blockwise_padded", "port", "mslk_groupwise", "deepgemm", "fp8_tensorwise_ceiling"):
        b = row["slots"].get(base, {})
        if "ms" in gl_slot and "ms" in b:
            row[f"gluon_speedup_vs_{base}"] = b["ms"] / gl_slot["ms"]
    for base in ("cublas_blockwise", "cublas_blockwise_padded"):
        b = row["slots"].get(base, {})
        if "ms_isolated" in p and "ms_isolated" in b:
            row[f"speedup_isolated_vs_{base}"] = b["ms_isolated"] / p["ms_isolated"]
    if "ms" in p and "ms" in row["slots"].get("port_repeat", {}):
        row["port_repeat_ratio"] = row["slots"]["port_repeat"]["ms"] / p["ms"]
    del slots
    if gs is not None and args.gluon_ablations and M > 256:
        row["gluon_ablations"] = gluon_ablations(gs, sd, sets, ref, args)
    row["seconds"] = time.time() - t_shape
    results["table"].append(row)
    del sets, outs, ref
    if DEV == "cuda":
        torch.cuda.empty_cache()


def gluon_ablations(gs, sd: dict, sets: list, ref: torch.Tensor, args) -> dict:
    """Every Gluon ablation variant and the design point, one interleaved group, same inputs:
    ``time_vs_design`` = variant time / design time (> 1: the design's knob helps by that factor)."""
    problem, _, _ = _imports()
    flops = problem.flops(sd)
    nset = len(sets)
    out: dict[str, Any] = {}
    slots: dict[str, GraphSlot] = {}
    blocked = guarded(sd, {name: (f"{KREF}.{_gluon_name()}:build", knobs) for name, knobs in gs.ABLATIONS.items()}, args)
    for name, knobs in gs.ABLATIONS.items():
        info: dict[str, Any] = {"config": knobs}
        if name in blocked:
            out[name] = {**info, **blocked[name]}
            continue
        try:
            kl = gs.build(sd, knobs, DEV)
            preps = [kl.prepare(x) for x in sets]
            outs = [problem.output_like(sd, DEV) for _ in range(nset)]
            outs[0].fill_(float("nan"))
            got = kl.run(preps[0], outs[0])
            sync()
            info["rel_err"] = rel_err(got, ref)
            info["parity_ok"] = info["rel_err"] <= PARITY_TOL
            if not gs.ablation_config(name).promote:
                info["note"] = "ceiling twin: scales ignored, wrong numbers by design"
            slots[name] = GraphSlot([(lambda p=p, o=o, kl=kl: kl.run(p, o)) for p, o in zip(preps, outs)], args.target_ms)
        except Exception as exc:
            info["error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
        out[name] = info
    times = interleaved(slots, args.ablation_rounds)
    for name, ts_ms in times.items():
        med = statistics.median(ts_ms)
        out[name].update(ms=med, ms_min=min(ts_ms), ms_max=max(ts_ms), tflops=flops / med / 1e9)
    d = out.get("design", {})
    for name, info in out.items():
        if "ms" in info and "ms" in d:
            info["time_vs_design"] = info["ms"] / d["ms"]
    print("[gluon ablations %sx%sx%s] " % (sd["M"], sd["N"], sd["K"]) + ", ".join(
        f"{n} {i['time_vs_design']:.3f}" for n, i in out.items() if "time_vs_design" in i), flush=True)
    return out


def fmt_row(row: dict) -> str:
    M, N, K = row["shape"]
    s = row["slots"]

    def tf(name):
        x = s.get(name, {})
        if "tflops" in x:
            return f"{x['tflops']:7.1f}"
        return f"{x.get('status', '-')[:7]:>7}"

    def err(name):
        x = s.get(name, {})
        return f"{x['rel_err']:.1e}" if "rel_err" in x else "   -   "

    sp = row.get("speedup_vs_cublas_blockwise")
    spp = row.get("speedup_vs_cublas_blockwise_padded")
    pk = s.get("port", {}).get("pct_peak")
    return (f"{M:>6}x{N:>6}x{K:>5} | port {tf('port')} ({pk:4.1f}%)" if pk is not None else f"{M:>6}x{N:>6}x{K:>5} | port {tf('port')} (  - )") + (
        f" | cuBLAS {tf('cublas_blockwise')} pad {tf('cublas_blockwise_padded')} bf16 {tf('bf16_cublas')} tw {tf('fp8_tensorwise_ceiling')}"
        f" | x{sp:5.2f}" if sp else f" | cuBLAS {tf('cublas_blockwise')} pad {tf('cublas_blockwise_padded')} bf16 {tf('bf16_cublas')} tw {tf('fp8_tensorwise_ceiling')} |   -   ") + (
        f" xpad {spp:5.2f}" if spp else " xpad   -  ") + f" | err port {err('port')} cuBLAS {err('cublas_blockwise')} pad {err('cublas_blockwise_padded')}" + (
        f" | iso x{row['speedup_isolated_vs_cublas_blockwise_padded']:.2f}" if "speedup_isolated_vs_cublas_blockwise_padded" in row else "") + (
        f" | MHz p{s.get('port', {}).get('sm_mhz_median', 0):.0f}/c{s.get('cublas_blockwise_padded', {}).get('sm_mhz_median', 0):.0f}") + (
        f" | rep {row['port_repeat_ratio']:.3f}" if "port_repeat_ratio" in row else "") + (
        f" | gluon {tf('gluon')} x{row['gluon_speedup_vs_cublas_blockwise']:5.2f} err {err('gluon')}"
        if "gluon_speedup_vs_cublas_blockwise" in row else (f" | gluon {tf('gluon')} err {err('gluon')}" if "gluon" in s else "")) + (
        f" | mslk {tf('mslk_groupwise')} err {err('mslk_groupwise')}" if "mslk_groupwise" in s else "")


def summarize(results: dict) -> dict:
    sp = []
    for row in results["table"]:
        cb = row["slots"].get("cublas_blockwise", {})
        if "speedup_vs_cublas_blockwise" in row and cb.get("parity_ok"):
            sp.append(row["speedup_vs_cublas_blockwise"])
    summ = {
        "shapes": len(results["table"]),
        "cublas_correct_shapes": len(sp),
        "geomean_speedup_vs_cublas_where_correct": math.exp(sum(map(math.log, sp)) / len(sp)) if sp else None,
        "min_speedup_vs_cublas_where_correct": min(sp) if sp else None,
        "port_parity_all_ok": all(r["slots"].get("port", {}).get("parity_ok") for r in results["table"]),
    }
    gsp = [r["gluon_speedup_vs_cublas_blockwise"] for r in results["table"]
           if "gluon_speedup_vs_cublas_blockwise" in r and r["slots"].get("cublas_blockwise", {}).get("parity_ok")
           and r["slots"].get("gluon", {}).get("parity_ok")]
    ran = [r for r in results["table"] if "gluon" in r.get("slots", {})]
    if ran:
        summ.update(
            gluon_shapes=len(ran),
            gluon_parity_all_ok=all(r["slots"]["gluon"].get("parity_ok") for r in ran),
            gluon_geomean_vs_cublas_where_correct=math.exp(sum(map(math.log, gsp)) / len(gsp)) if gsp else None,
            gluon_min_vs_cublas_where_correct=min(gsp) if gsp else None,
        )
    return summ


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file for all results")
    ap.add_argument("--sweep", action="store_true", help="time a config grid per shape and use the winner")
    ap.add_argument("--shapes", default="all", help="all | large | decode | MxNxK[,MxNxK...]")
    ap.add_argument("--configs", default=None, help="JSON of {MxNxK: config} to use instead of defaults (no --sweep)")
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--target-ms", type=float, default=4.0, help="graph length per timed replay (table)")
    ap.add_argument("--sweep-target-ms", type=float, default=2.0)
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop sweeping after this; the table still runs")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--commit", default=os.environ.get("COMMIT", "unknown"))
    ap.add_argument("--gluon-config", default=None, help="JSON dict of gluon_sm90.Config fields for the gluon slot")
    ap.add_argument("--gluon-ablations", action="store_true", help="time every gluon_sm90.ABLATIONS variant (M > 256)")
    ap.add_argument("--ablation-rounds", type=int, default=9)
    ap.add_argument("--no-gluon", action="store_true", help="leave the Gluon kernel out")
    ap.add_argument("--gluon-module", default=None, choices=["gluon_sm90", "gluon_sm90_ws"],
                    help="the Gluon port in the gluon slot and its --gluon-ablations (default gluon_sm90)")
    ap.add_argument("--watchdog-s", type=float, default=60.0,
                    help="probe each shape's port variants in a child first; one that does not return in this many "
                         "seconds (compile included) is recorded as timeout and not run here (0: off)")
    args = ap.parse_args(argv)
    if args.gluon_module:
        os.environ["FP8BS_GLUON_MODULE"] = args.gluon_module  # before the spawned compile workers start
    args.gluon_config = json.loads(args.gluon_config) if args.gluon_config else None
    t0 = time.time()
    args.deadline = t0 + args.budget_s
    args.configs = json.loads(Path(args.configs).read_text()) if args.configs else None
    if DEV == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (FP8BS_BENCH_DEVICE=cpu with TRITON_INTERPRET=1 runs a smoke test)", file=sys.stderr)
        return 5
    import triton

    if args.shapes == "all":
        shapes = LARGE + DECODE
    elif args.shapes == "large":
        shapes = LARGE
    elif args.shapes == "decode":
        shapes = DECODE
    else:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    props = torch.cuda.get_device_properties(0) if DEV == "cuda" else None
    results: dict[str, Any] = {
        "meta": {
            "device": props.name if props else "cpu (interpreter smoke test)",
            "sm_count": props.multi_processor_count if props else None,
            "l2_bytes": getattr(props, "L2_cache_size", None), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "commit": args.commit, "peak_tf": PEAK_TF, "argv": sys.argv[1:],
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "parity_tol": PARITY_TOL, "gluon_module": _gluon_name(),
        },
        "sweep": {}, "winners": {}, "table": [], "precompile": {},
    }
    print(json.dumps(results["meta"]), flush=True)
    _, _, ts = _imports()
    cfgs = [ts.default_config({"M": m, "N": n, "K": k}).as_dict() for m, n, k in shapes]
    if args.sweep:
        if any(m > 256 for m, _, _ in shapes):
            cfgs += large_grid()
        for m in sorted({m for m, _, _ in shapes if m <= 256}):
            cfgs += skinny_grid(m)
    if args.configs:
        cfgs += list(args.configs.values())
    status = precompile(cfgs, args.workers) if DEV == "cuda" else {}
    gs = _gluon()
    if gs is not None and not args.no_gluon:
        gcfgs = [args.gluon_config or {}]
        if args.gluon_ablations:
            gcfgs += list(gs.ABLATIONS.values())
        results["precompile_gluon"] = precompile_gluon(gcfgs, args.workers)
    results["precompile"] = {str(dict(k)): v for k, v in status.items()}
    out_path = Path(args.out)
    for shape in shapes:
        try:
            bench_shape(shape, args, status, results)
            print(fmt_row(results["table"][-1]), flush=True)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            results["table"].append({"shape": list(shape), "error": f"{type(exc).__name__}: {exc}"})
        results["summary"] = summarize(results)
        results["meta"]["elapsed_s"] = time.time() - t0
        out_path.write_text(json.dumps(results, indent=1, default=str))
    print("\n=== fp8 block-scale GEMM, H200: ports vs cuBLAS block-wise (TFLOP/s; xN = cuBLAS time / port time) ===")
    for row in results["table"]:
        if "slots" in row:
            print(fmt_row(row))
        else:
            print(row)
    print(json.dumps(results["summary"]))
    print(json.dumps({"winners": results["winners"]}))
    print(f"elapsed {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
