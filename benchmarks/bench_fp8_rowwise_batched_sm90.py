"""Batched fp8 rowwise GEMM on sm_90: Triton port (one-pass and split-K) vs MSLK's CUTLASS
f8f8bf16_rowwise_batched (the production kernel) vs the per-batch torch._scaled_mm loop vs
torch._scaled_grouped_mm, side by side (time, TFLOP/s, TB/s and % of this session's measured copy
bandwidth, speedup, parity vs the fp32 oracle).

    python benchmarks/bench_fp8_rowwise_batched_sm90.py                 # table with the tuned configs
    python benchmarks/bench_fp8_rowwise_batched_sm90.py --sweep --out r.json   # sweep configs, then table
    python benchmarks/bench_fp8_rowwise_batched_sm90.py --m 1 32 128 --splitk-sweep --out d.json  # decode: split-K space

Timing: benchmarks/sm90_timing.py (same-process interleaved CUDA events, L2 flush before each
call, medians; eager and CUDA-graph views). Speedup = baseline time / port time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sm90_timing as tm  # noqa: E402

from skillrun_kernels.fp8_rowwise_batched_gemm import problem, references, triton_sm90 as port  # noqa: E402
from skillrun_kernels.fp8_rowwise_batched_gemm import triton_sm90_splitk as splitk  # noqa: E402


DEV = "cuda"


def _c(bm, bn, bk, gm, w, s, **extra):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": gm, "num_warps": w, "num_stages": s, **extra}


# Candidates per M class. Small M is weight-bandwidth-bound: narrow N tiles and deep K tiles give
# more programs and more bytes in flight; large M is tensor-core-bound: 128-wide wgmma tiles.
CANDIDATES = {
    "small": [_c(16, 64, 256, 1, 4, 4), _c(16, 128, 256, 1, 4, 3), _c(16, 32, 512, 1, 4, 3), _c(16, 64, 512, 1, 4, 3),
              _c(32, 64, 256, 1, 4, 4), _c(64, 64, 256, 1, 4, 3), _c(64, 128, 128, 1, 4, 4),
              _c(16, 64, 256, 1, 4, 4, w_layout="kn")],
    "mid": [_c(64, 128, 128, 8, 4, 4), _c(64, 64, 256, 8, 4, 4), _c(128, 128, 128, 8, 8, 4), _c(64, 128, 256, 8, 4, 3),
            _c(128, 64, 128, 8, 4, 4), _c(32, 64, 256, 8, 4, 4), _c(16, 64, 256, 1, 4, 4),
            _c(64, 128, 128, 8, 4, 4, w_layout="kn")],
    "large": [_c(128, 128, 128, 8, 8, 4), _c(128, 256, 128, 8, 8, 3), _c(128, 128, 128, 8, 4, 4), _c(64, 256, 128, 8, 4, 4),
              _c(256, 128, 128, 8, 8, 3), _c(128, 128, 128, 1, 8, 4), _c(64, 128, 128, 8, 4, 4),
              _c(128, 128, 128, 8, 8, 4, w_layout="kn")],
}


# The split-K variant only where the weights stream (M <= 128); one candidate per split factor
# from its declared space (triton_sm90_splitk.TUNABLE), more with --splitk-sweep.
SPLITK_MAX_M = 128


def splitk_candidates(m: int, full: bool) -> list[dict]:
    """The tile that holds all M rows (16-row mma.sync at decode, else the smallest wgmma tile >= M)
    at 2/4/8 splits; with ``full``, the whole declared space for those M tiles (and 16-row tiles)."""
    import itertools

    t = splitk.TUNABLE
    bm = next((b for b in sorted(t["BLOCK_M"]) if b >= m), max(t["BLOCK_M"]))
    base = {**splitk.DEFAULT, "BLOCK_M": bm}
    if splitk.shared_bytes(base) > splitk.SM90_SMEM_LIMIT:
        base["BLOCK_K"] = 128
    if not full:
        return [{**base, "SPLIT_K": sk} for sk in (2, 4, 8)]
    out = []
    for b_m, bn, bk, sk, w, st in itertools.product(sorted({16, bm}), t["BLOCK_N"], t["BLOCK_K"], t["SPLIT_K"],
                                                    t["num_warps"], t["num_stages"]):
        c = {"BLOCK_M": b_m, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk, "num_warps": w, "num_stages": st}
        if splitk.shared_bytes(c) <= splitk.SM90_SMEM_LIMIT:
            out.append(c)
    return out


def splitk_key(cfg: dict) -> str:
    return f"sk{cfg['SPLIT_K']}_{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']}_w{cfg['num_warps']}_s{cfg['num_stages']}"


def sweep_splitk(shape: dict, flush: tm.L2Flush, reps: int, full: bool) -> dict:
    """Time the split-K candidates of one decode shape interleaved (graph replay); the best one's config."""
    return sweep_candidates(shape, splitk.build, splitk_candidates(shape["M"], full), splitk_key, flush, reps)


def m_class(m: int) -> str:
    return "small" if m <= 32 else "mid" if m <= 256 else "large"


def cfg_key(cfg: dict) -> str:
    lay = cfg.get("w_layout", "nk")
    return f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']}_g{cfg['GROUP_M']}_w{cfg['num_warps']}_s{cfg['num_stages']}_{lay}"


def _compile_task(task: tuple[dict, int, int, int]) -> str:
    """Worker (spawned process): compile one config by running it once on a small batch.

    Triton keys its cache on constexprs and on integer/pointer specialization (==1, %16), not on
    the sizes, so a 2-batch problem with the real N, K and M=1 or M=16 fills the on-disk cache for
    the real shapes of the same class.
    """
    cfg, m, n, k = task
    try:
        shape = {"batch": 2, "M": m, "N": n, "K": k}
        inp = problem.make_inputs(shape, 0, DEV)
        launch = port.build(shape, cfg, DEV)
        launch.run(launch.prepare(inp), problem.output_like(shape, DEV))
        tm.sync()
        return "ok"
    except Exception as exc:  # a config that cannot compile is reported, not fatal
        return f"{cfg_key(cfg)}: {type(exc).__name__}: {str(exc)[:200]}"


def precompile(shapes: list[dict], jobs: int) -> list[str]:
    tasks = []
    for shape in shapes:
        m = 1 if shape["M"] == 1 else 16
        for cfg in CANDIDATES[m_class(shape["M"])]:
            t = (cfg, m, shape["N"], shape["K"])
            if t not in tasks:
                tasks.append(t)
    return tm.run_compile_tasks(_compile_task, tasks, jobs)


def sweep_shape(shape: dict, flush: tm.L2Flush, reps: int) -> dict:
    return sweep_candidates(shape, port.build, CANDIDATES[m_class(shape["M"])], cfg_key, flush, reps)


def sweep_candidates(shape: dict, builder, configs: list[dict], key_of, flush: tm.L2Flush, reps: int) -> dict:
    """Gate each config on the oracle, time the survivors interleaved (graph replay), pick the best.

    A config that raises or fails parity is kept with its reason, never dropped."""
    inp = problem.make_inputs(shape, 0, DEV)
    ref = problem.oracle(inp)
    fns, rows = {}, {}
    for cfg in configs:
        key = key_of(cfg)
        try:
            launch = builder(shape, cfg, DEV)
            prepared = launch.prepare(inp)
            out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device=DEV)
            launch.run(prepared, out)
            par = tm.parity(out, ref)
            rows[key] = {"config": cfg, "parity": par}
            if par["finite"] and par["rel_fro"] < 2e-2:
                fns[key] = tm.capture_graph(lambda l=launch, p=prepared, o=out: l.run(p, o)).replay
            else:
                rows[key]["rejected"] = "parity"
        except Exception as exc:
            rows[key] = {"config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    if not fns:  # nothing to time: say why instead of timing an empty set
        return {"shape": shape, "candidates": rows, "best": None, "best_config": None,
                "no_candidate": no_candidate_reason(configs, rows)}
    times = tm.time_interleaved(fns, reps=reps, warmup=1, flush=flush)
    for key, ts in times.items():
        rows[key]["graph_ms"] = tm.median(ts)
        rows[key]["spread_pct"] = tm.spread_pct(ts)
    best = min(times, key=lambda k: tm.median(times[k])) if times else None
    return {"shape": shape, "candidates": rows, "best": best, "best_config": rows[best]["config"] if best else None}


def no_candidate_reason(configs: list[dict], rows: dict) -> str:
    """Why a sweep has nothing to time: no configs at all, or each one raised or failed the oracle."""
    if not configs:
        return "no candidate config for this shape"
    errors = [r["error"] for r in rows.values() if "error" in r]
    failed = [r for r in rows.values() if r.get("rejected") == "parity"]
    parts = []
    if errors:
        parts.append(f"{len(errors)} raised (first: {errors[0][:160]})")
    if failed:
        p = failed[0].get("parity") or {}
        parts.append(f"{len(failed)} failed the oracle (first: rel_fro {p.get('rel_fro')}, finite {p.get('finite')})")
    return f"none of {len(configs)} candidate configs survived: " + "; ".join(parts)


def acc_variants(shape: dict, cfg: dict | None) -> dict[str, dict]:
    """Port configs that isolate the cost of precise accumulation at this shape: the chosen config
    with promotion off and every 128 of K, plus 256x128 (no register spill when promoting) where the
    chosen tile is 128x256."""
    base = dict(cfg) if cfg else port.pick_config(shape["batch"], shape["M"], shape["N"], shape["K"])[0]
    out = {"port_acc_off": {**base, "precise_acc": None}, "port_acc_128": {**base, "precise_acc": 128}}
    if (base["BLOCK_M"], base["BLOCK_N"]) == (128, 256):
        out["port_256x128_acc_128"] = {**base, "BLOCK_M": 256, "BLOCK_N": 128, "precise_acc": 128}
    return out


def table_shape(shape: dict, cfg: dict | None, flush: tm.L2Flush, reps: int, ablation: bool = False,
                splitk_cfg: dict | None = None, copy_tbps: float | None = None) -> dict:
    inp = problem.make_inputs(shape, 1, DEV)  # a different seed from the sweep's
    ref = problem.oracle(inp)
    impls = {"port": (port.build, cfg or {}), "scaled_mm_loop": (references.build_scaled_mm_loop, {}),
             "scaled_grouped_mm": (references.build_scaled_grouped_mm, {})}
    # MSLK's CUTLASS batched kernel is what users run; absent (no mslk) or refusing the shape, its
    # row says so (the builder raises) instead of disappearing.
    mslk = getattr(references, "build_mslk_rowwise_batched", None)
    if mslk is not None:
        impls["mslk_rowwise_batched"] = (mslk, {})
    if shape["M"] <= SPLITK_MAX_M:
        impls["port_splitk"] = (splitk.build, splitk_cfg or splitk.DEFAULT)
    if ablation:
        impls.update({name: (port.build, c) for name, c in acc_variants(shape, cfg).items()})
    res: dict = {"shape": shape, "impls": {}}
    eager, graph = {}, {}
    for name, (builder, c) in impls.items():
        row: dict = {}
        res["impls"][name] = row
        try:
            launch = builder(shape, c, DEV)
            prepared = launch.prepare(inp)
            out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device=DEV)
            got = launch.run(prepared, out)
            tm.sync()
            row["parity"] = tm.parity(got, ref)
            row["describe"] = {k: v for k, v in launch.describe.items() if k != "config"}
            if name.startswith("port"):
                row["config"] = launch.describe.get("config")
            if name == "port_splitk":
                # precise accumulation costs the same in both kernels; keep it comparable
                row["precise_acc"] = (launch.describe.get("config") or {}).get("precise_acc")
            fn = (lambda l=launch, p=prepared, o=out: l.run(p, o))
            eager[name] = fn
            try:
                graph[name] = tm.capture_graph(fn).replay
            except Exception as exc:
                row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            row["kernels"] = tm.kernel_names(fn)
            if launch.expect_kernels:
                import re

                row["expect_kernels"] = launch.expect_kernels
                row["unexpected_kernels"] = [k for k in row["kernels"] if not re.search(launch.expect_kernels, k)]
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if "port" in graph:
        graph["port_again"] = graph["port"]  # A/A: the noise floor of this shape
    for mode, fns in (("eager_ms", eager), ("graph_ms", graph)):
        tm.record_times(res["impls"], mode, tm.time_interleaved(fns, reps=reps, warmup=2, flush=flush))
    fl = problem.flops(shape)
    for name, row in res["impls"].items():
        for mode in ("eager_ms", "graph_ms"):
            if row.get(mode):
                row[mode.replace("_ms", "_tflops")] = fl / (row[mode] * 1e-3) / 1e12
    tm.add_roof(res["impls"], problem.min_bytes(shape), copy_tbps)
    bases = ("mslk_rowwise_batched", "scaled_mm_loop", "scaled_grouped_mm")
    tm.add_speedups(res, bases)
    tm.add_speedups(res, bases, port="port_splitk")
    return res


def print_roof_table(rows: list[dict], copy_tbps: float | None) -> None:
    """Per shape and candidate: graph time, TB/s, % of the measured copy roof, x MSLK, parity."""
    roof = f"{copy_tbps:.2f} TB/s" if copy_tbps else "not measured"
    print(f"\nweight-streaming view (graph replay; copy roof this session: {roof}; x mslk = MSLK time / this time; "
          "A/A = the port timed twice)")
    for r in rows:
        s, im = r["shape"], r["impls"]
        ms_ref = im.get("mslk_rowwise_batched", {}).get("graph_ms")
        aa = im.get("port_again", {}).get("graph_ms")
        pt = im.get("port", {}).get("graph_ms")
        noise = f"{abs(aa / pt - 1) * 100:.1f}%" if aa and pt else "-"
        for name, row in im.items():
            if name == "port_again":
                continue
            t = row.get("graph_ms")
            x = f"{ms_ref / t:.2f}" if t and ms_ref else "-"
            par = row.get("parity", {})
            ok = "-" if not par else ("pass" if par.get("frac_out_of_tol", 1) == 0 and par.get("finite") else "FAIL")
            print(f"  M={s['M']:>5} N={s['N']:>5} K={s['K']:>5} {name:<22} {tm.fmt_us(t):>8} "
                  f"{row.get('graph_tbps', float('nan')):>5.2f} TB/s {row.get('graph_pct_copy', float('nan')):>5.1f}% "
                  f"x mslk {x:>5} A/A {noise:>5} oracle {ok:<4} {row.get('error', '')[:80]}")


def print_table(rows: list[dict]) -> None:
    print("\nB=16 fp8 rowwise batched GEMM on", "cpu" if DEV == "cpu" else torch.cuda.get_device_name(), "| times in us (median), TF = 2BMNK/t")
    hdr = f"{'M':>5} {'N':>5} {'K':>5} | {'port g':>8} {'eager':>8} {'TF':>6} {'TB/s':>5} | {'loop g':>8} {'eager':>8} | {'grp g':>8} {'eager':>8} | {'x loop g':>8} {'x loop e':>8} {'x grp g':>7} | {'A/A':>5} | port err  loop err  grp err"
    print(hdr)
    for r in rows:
        s, im, sp = r["shape"], r["impls"], r.get("speedup", {})
        p, lp, gp = im.get("port", {}), im.get("scaled_mm_loop", {}), im.get("scaled_grouped_mm", {})
        aa = im.get("port_again", {}).get("graph_ms")
        aa_txt = f"{aa / p['graph_ms']:.3f}" if aa and p.get("graph_ms") else "-"
        err = lambda d: f"{d['parity']['rel_fro']:.1e}" if "parity" in d else "n/a"
        print(f"{s['M']:>5} {s['N']:>5} {s['K']:>5} | {tm.fmt_us(p.get('graph_ms')):>8} {tm.fmt_us(p.get('eager_ms')):>8} "
              f"{p.get('graph_tflops', float('nan')):>6.0f} {p.get('graph_tbps', float('nan')):>5.2f} | "
              f"{tm.fmt_us(lp.get('graph_ms')):>8} {tm.fmt_us(lp.get('eager_ms')):>8} | "
              f"{tm.fmt_us(gp.get('graph_ms')):>8} {tm.fmt_us(gp.get('eager_ms')):>8} | "
              f"{sp.get('scaled_mm_loop_graph', float('nan')):>8.2f} {sp.get('scaled_mm_loop_eager', float('nan')):>8.2f} "
              f"{sp.get('scaled_grouped_mm_graph', float('nan')):>7.2f} | {aa_txt:>5} | {err(p):>8} {err(lp):>8} {err(gp):>8}")


def print_ablation(rows: list[dict]) -> None:
    print("\nprecise accumulation (graph replay, us; x port = variant time / port time; oot = fraction of outputs outside rtol=atol=1e-2)")
    for r in rows:
        s, im = r["shape"], r["impls"]
        base = im.get("port", {}).get("graph_ms")
        for name, row in im.items():
            if not name.startswith("port") or name == "port_again":
                continue
            par = row.get("parity", {})
            t = row.get("graph_ms")
            ratio = f"{t / base:.3f}" if t and base else "-"
            cfg = row.get("config") or (row.get("describe") or {}).get("config") or {}
            print(f"  M={s['M']:>5} N={s['N']:>5} K={s['K']:>5} {name:<22} {tm.fmt_us(t):>8} x port {ratio:>6} "
                  f"rel_fro {par.get('rel_fro', float('nan')):.2e} oot {par.get('frac_out_of_tol', float('nan')):.1e} "
                  f"max_abs {par.get('max_abs', float('nan')):.3f} precise_acc={cfg.get('precise_acc', '?')} {row.get('error', '')}")


def runner_configs(path: Path) -> dict[str, tuple[str, dict]]:
    """{"M,N,K": ("port" | "splitk", config)} from validate_recipes.py --emit-configs, for this card's shapes
    whose recipe runs one of this bench's two port kernels."""
    import json

    out = {}
    for e in json.loads(Path(path).read_text()):
        if e.get("card") != "triton_fp8_rowwise_batched_gemm_sm90":
            continue
        d = dict(p.split("=", 1) for p in str(e["shape"]).split(","))
        key = f"{d['M']},{d['N']},{d['K']}"
        kernel = str(e.get("kernel") or "")
        if kernel.endswith("fp8_rowwise_batched_gemm.triton_sm90:build"):
            out[key] = ("port", dict(e["config"]))
        elif kernel.endswith("fp8_rowwise_batched_gemm.triton_sm90_splitk:build"):
            out[key] = ("splitk", dict(e["config"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="time every candidate config per shape and use the best")
    ap.add_argument("--out", type=Path, default=None, help="write all results as JSON")
    ap.add_argument("--m", type=int, nargs="*", default=None, help="only these M")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sweep-reps", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="parallel compile processes")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="plumbing check on the CPU with tiny shapes (run with TRITON_INTERPRET=1); numbers mean nothing")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new shapes after this many seconds")
    ap.add_argument("--acc-ablation", action="store_true",
                    help="also time the port with precise accumulation off / every 128 of K (same session)")
    ap.add_argument("--n", type=int, nargs="*", default=None, help="only these N")
    ap.add_argument("--configs", type=Path, default=None,
                    help="validate_recipes.py --emit-configs JSON: the runner's selected config for each shape, timed as "
                         "the port (or port_splitk, where the recipe's kernel is the split-K one) instead of this bench's pick")
    ap.add_argument("--splitk-sweep", action="store_true",
                    help="sweep the split-K variant's declared space at M <= 128 and table its best (else 3 split factors)")
    args = ap.parse_args(argv)
    global DEV
    shapes = [s for s in problem.SHAPES if (args.m is None or s["M"] in args.m) and (args.n is None or s["N"] in args.n)]
    if args.dry_run_cpu:
        DEV, tm.DRY_RUN_CPU, args.jobs = "cpu", True, 1
        tm.load_interpreter_fixups()
        shapes = [{"batch": 2, "M": m, "N": 64, "K": 512} for m in (1, 40, 600)]
        for cands in CANDIDATES.values():
            for c in cands:
                c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"] = min(c["BLOCK_M"], 32), min(c["BLOCK_N"], 32), min(c["BLOCK_K"], 128)
    elif not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 5
    t0 = time.perf_counter()
    result: dict = tm.run_header(args.dry_run_cpu)
    flush = tm.L2Flush()
    result["copy_tbps"] = copy_tbps = tm.copy_bandwidth_tbps()
    chosen: dict[str, dict] = {}
    chosen_splitk: dict[str, dict] = {}
    for shape in [s for s in shapes if s["M"] <= SPLITK_MAX_M]:
        sw = sweep_splitk(shape, flush, args.sweep_reps, args.splitk_sweep)
        result.setdefault("splitk_sweep", []).append(sw)
        chosen_splitk[f"{shape['M']},{shape['N']},{shape['K']}"] = sw["best_config"]
        print(f"split-K M={shape['M']:>5} N={shape['N']:>5} K={shape['K']:>5}: "
              + (f"best {sw['best']}" if sw["best"] else f"no split-K config to use ({sw['no_candidate']})"), flush=True)
        tm.save_json(args.out, result)
    if args.sweep:
        tm.timed_precompile(result, lambda: precompile(shapes, args.jobs))
        result["sweep"] = []
        for shape in shapes:
            if time.perf_counter() - t0 > args.budget_s:
                print("budget reached; sweep stopped", flush=True)
                break
            sw = sweep_shape(shape, flush, args.sweep_reps)
            result["sweep"].append(sw)
            chosen[f"{shape['M']},{shape['N']},{shape['K']}"] = sw["best_config"]
            tops = sorted(((r.get("graph_ms", 1e9), k) for k, r in sw["candidates"].items()), key=lambda x: x[0])[:3]
            print(f"sweep M={shape['M']:>5} N={shape['N']:>5} K={shape['K']:>5}: " +
                  ", ".join(f"{k} {ms * 1000:.1f}us" for ms, k in tops), flush=True)
            tm.save_json(args.out, result)
    if args.configs:  # after any sweep: the runner's pick is what a comparison with the runner must time
        for key, (which, cfg) in runner_configs(args.configs).items():
            (chosen_splitk if which == "splitk" else chosen)[key] = cfg
    rows = []
    for shape in shapes:
        if time.perf_counter() - t0 > args.budget_s:
            print("budget reached; table stopped", flush=True)
            break
        cfg = chosen.get(f"{shape['M']},{shape['N']},{shape['K']}")
        sk_cfg = chosen_splitk.get(f"{shape['M']},{shape['N']},{shape['K']}")
        rows.append(table_shape(shape, cfg, flush, args.reps, args.acc_ablation, sk_cfg, copy_tbps))
        result["table"] = rows
        tm.save_json(args.out, result)
    print_table(rows)
    print_roof_table(rows, copy_tbps)
    if args.acc_ablation:
        print_ablation(rows)
    result["elapsed_s"] = time.perf_counter() - t0
    tm.save_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
