"""a16wi4 MoE layer on sm_90: Triton port (and its decode levers) vs MSLK's CUTLASS
bf16i4bf16_shuffled_grouped (the production kernel) and bf16bf16bf16_grouped_stacked (dense bf16
ceiling), dequantize+bf16 grouped GEMM, bf16 grouped GEMM on pre-dequantized weights, and a bf16
per-expert loop, side by side (time, achieved TB/s and % of this session's measured copy bandwidth,
TFLOP/s, speedup, parity vs the fp32 oracle).

    python benchmarks/bench_moe_a16wi4_sm90.py                       # table with the tuned configs
    python benchmarks/bench_moe_a16wi4_sm90.py --sweep --out r.json  # per-stage config sweep, then table

Timing: benchmarks/sm90_timing.py (interleaved CUDA events, L2 flushed before each call, medians;
eager view, plus CUDA-graph replay for the paths that never wait on the host).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sm90_timing as tm  # noqa: E402

from skillrun_kernels.moe_a16wi4 import problem, references, triton_sm90 as port  # noqa: E402

DEV = "cuda"
HBM_TBPS = 4.8  # H200 datasheet


def _s1(bn, bk, w, s, split=True):
    return {"BLOCK_N1": bn, "BLOCK_K1": bk, "warps1": w, "stages1": s, "split1": split}


def _s2(bn, bk, w, s, split=True):
    return {"BLOCK_N2": bn, "BLOCK_K2": bk, "warps2": w, "stages2": s, "split2": split}


# Per token class: the BLOCK_M values tried and candidate tiles for each stage. Decode streams
# weights (narrow N, deep K, many programs); prefill is tensor-core work on dequantized tiles.
CLASSES = {
    "decode": {"bm": [16], "s1": [_s1(32, 256, 4, 4), _s1(64, 256, 8, 3), _s1(16, 256, 4, 4), _s1(32, 512, 4, 3),
                                  _s1(64, 128, 4, 4), _s1(32, 256, 4, 4, False)],
               "s2": [_s2(64, 256, 4, 4), _s2(128, 128, 4, 4), _s2(32, 256, 4, 4), _s2(128, 256, 8, 3),
                      _s2(64, 128, 4, 4), _s2(64, 256, 4, 4, False)]},
    "mid": {"bm": [16, 32, 64], "s1": [_s1(64, 128, 4, 4), _s1(64, 256, 8, 3), _s1(128, 128, 8, 3), _s1(64, 128, 4, 4, False)],
            "s2": [_s2(128, 128, 4, 4), _s2(64, 128, 4, 4), _s2(128, 256, 8, 3), _s2(128, 128, 4, 4, False)]},
    "prefill": {"bm": [64, 128], "s1": [_s1(64, 64, 4, 4), _s1(64, 128, 4, 3), _s1(128, 64, 8, 3), _s1(64, 128, 8, 3),
                                        _s1(64, 128, 4, 3, False)],
                "s2": [_s2(128, 64, 4, 4), _s2(128, 128, 8, 3), _s2(256, 64, 8, 3), _s2(64, 128, 4, 4), _s2(128, 128, 8, 3, False)]},
}
SWEEP_COMBOS = [(384, 512), (64, 2048)]


def t_class(shape: dict) -> str:
    return port.regime(port.rows_per_expert(shape["tokens"], shape["topk"], shape["experts"]))


def s1_key(c: dict) -> str:
    return f"n{c['BLOCK_N1']}k{c['BLOCK_K1']}w{c['warps1']}s{c['stages1']}{'' if c['split1'] else '_join'}"


def s2_key(c: dict) -> str:
    return f"n{c['BLOCK_N2']}k{c['BLOCK_K2']}w{c['warps2']}s{c['stages2']}{'' if c['split2'] else '_join'}"


def _full_cfg(bm: int, c1: dict, c2: dict, scale_acc: bool = False) -> dict:
    return {"BLOCK_M": bm, **c1, **c2, "scale_acc": scale_acc}


def nearest_config(chosen: dict, shape: dict) -> dict | None:
    """The swept config of the same inter_dim and regime with the closest rows-per-expert."""
    import math

    r = port.rows_per_expert(shape["tokens"], shape["topk"], shape["experts"])
    same = [(abs(math.log(rr / r)), cfg) for (inter, rr), cfg in chosen.items()
            if inter == shape["inter_dim"] and port.regime(rr) == port.regime(r)]
    return min(same, key=lambda x: x[0])[1] if same else None


def _compile_task(task: tuple) -> str:
    """Worker (spawned): compile one (BLOCK_M, stage-1, stage-2) combination on a tiny problem with
    the real model_dim / inter_dim (Triton's cache key depends on constexprs and %16 / ==1
    specialization, not on sizes)."""
    bm, c1, c2, inter, group = task
    try:
        shape = {"tokens": 3, "model_dim": 7168, "inter_dim": inter, "experts": 8, "topk": 2, "group_size": group}
        inp = problem.make_inputs(shape, 0, DEV)
        launch = port.build(shape, _full_cfg(bm, c1, c2), DEV)
        launch.run(launch.prepare(inp), problem.output_like(shape, DEV))
        tm.sync()
        return "ok"
    except Exception as exc:
        return f"bm{bm} {s1_key(c1)} {s2_key(c2)}: {type(exc).__name__}: {str(exc)[:200]}"


def precompile(shapes: list[dict], jobs: int) -> list[str]:
    tasks = []
    for shape in shapes:
        cl = CLASSES[t_class(shape)]
        n = max(len(cl["s1"]), len(cl["s2"]))
        for bm in cl["bm"]:
            for j in range(n):  # pair the lists up: every stage-1 and stage-2 tile gets compiled
                t = (bm, cl["s1"][j % len(cl["s1"])], cl["s2"][j % len(cl["s2"])], shape["inter_dim"], shape["group_size"])
                if t not in tasks:
                    tasks.append(t)
    return tm.run_compile_tasks(_compile_task, tasks, jobs)


def sweep_shape(shape: dict, flush: tm.L2Flush, reps: int) -> dict:
    """Time each stage's candidates separately (routing precomputed per BLOCK_M), then pick the
    BLOCK_M whose best stage-1 + best stage-2 is smallest."""
    t, d, i, e, k, g = problem.dims(shape)
    inp = problem.make_inputs(shape, 0, DEV)
    w1 = port.prepare_weights(inp["w1_q"], inp["w1_scale"])
    w2 = port.prepare_weights(inp["w2_q"], inp["w2_scale"])
    h_ref = problem.oracle_stage1(inp)
    ref = problem.oracle(inp)
    wts = inp["topk_weights"]
    cl = CLASSES[t_class(shape)]
    res: dict = {"shape": shape, "stage1": {}, "stage2": {}, "per_bm": {}}
    for bm in cl["bm"]:
        routing = port.align_by_expert(inp["topk_ids"], e, bm)
        fns1, fns2 = {}, {}
        for c1 in cl["s1"]:
            key = f"bm{bm}_{s1_key(c1)}"
            cfg = _full_cfg(bm, c1, cl["s2"][0])
            try:
                port.check_config(cfg, d, i, g)
                h = port.moe_a16wi4_stage1(inp["x"], w1, routing, k, cfg)
                tm.sync()
                err = float((h.float().view(t, k, i) - h_ref).norm() / h_ref.norm())
                res["stage1"][key] = {"config": c1, "bm": bm, "h_rel_err": err}
                if err < 2e-2:
                    fns1[key] = tm.capture_graph(lambda c=cfg, r=routing: port.moe_a16wi4_stage1(inp["x"], w1, r, k, c)).replay
            except Exception as exc:
                res["stage1"][key] = {"config": c1, "bm": bm, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        h_in = h_ref.reshape(t * k, i).to(torch.bfloat16)
        ref2 = problem.oracle(inp, h=h_in.float().view(t, k, i))
        for c2 in cl["s2"]:
            key = f"bm{bm}_{s2_key(c2)}"
            cfg = _full_cfg(bm, cl["s1"][0], c2)
            try:
                port.check_config(cfg, d, i, g)
                acc = torch.zeros(t, d, dtype=torch.float32, device=DEV)
                port.moe_a16wi4_stage2(h_in, w2, routing, wts, acc, cfg)
                tm.sync()
                err = float((acc - ref2).norm() / ref2.norm())
                res["stage2"][key] = {"config": c2, "bm": bm, "rel_err": err}
                if err < 2e-2:
                    fns2[key] = tm.capture_graph(lambda c=cfg, r=routing, a=acc: port.moe_a16wi4_stage2(h_in, w2, r, wts, a, c)).replay
            except Exception as exc:
                res["stage2"][key] = {"config": c2, "bm": bm, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        for group, fns in (("stage1", fns1), ("stage2", fns2)):
            for key, ts in tm.time_interleaved(fns, reps=reps, warmup=1, flush=flush).items():
                res[group][key]["graph_ms"] = tm.median(ts)
        b1 = min((r["graph_ms"], key) for key, r in res["stage1"].items() if r.get("bm") == bm and "graph_ms" in r)
        b2 = min((r["graph_ms"], key) for key, r in res["stage2"].items() if r.get("bm") == bm and "graph_ms" in r)
        res["per_bm"][bm] = {"stage1": b1[1], "stage2": b2[1], "sum_ms": b1[0] + b2[0]}
    best_bm = min(res["per_bm"], key=lambda b: res["per_bm"][b]["sum_ms"])
    pb = res["per_bm"][best_bm]
    res["best_config"] = _full_cfg(best_bm, res["stage1"][pb["stage1"]]["config"], res["stage2"][pb["stage2"]]["config"])
    # end-to-end check of the chosen combination
    out = torch.full((t, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    port.moe_a16wi4(inp["x"], w1, w2, inp["topk_ids"], wts, out=out, config=res["best_config"])
    res["best_parity"] = tm.parity(out, ref)
    return res


# MSLK's CUTLASS kernels: bf16 x int4 group-wise grouped GEMM (the production peer) and the bf16
# grouped GEMM on pre-dequantized weights (dense ceiling). Absent (no mslk) or refusing a shape, the
# row records the builder's error instead of disappearing.
MSLK_REFS = {"mslk_bf16i4_shuffled_grouped": "build_mslk_bf16i4_shuffled_grouped",
             "mslk_bf16_grouped_stacked": "build_mslk_bf16_grouped_stacked"}


def card_tiles(shape: dict) -> dict | None:
    """At a group the port's measured table is not keyed by (128) and at decode, the group-32 tiles
    where they are valid at this group: what the card's recipes select there (its decode recipes add int4_cvt
    magic: the port_magic row). None keeps the port's own pick (measured table or regime default)."""
    t, d, i, e, k, g = problem.dims(shape)
    cfg, tuned = port.pick_config(t, k, e, i, g)
    if tuned or g == port.TUNED_GROUP or port.regime(port.rows_per_expert(t, k, e)) != "decode":
        return None  # the card selects the group-32 tiles at other groups only at decode
    cfg, tuned = port.pick_config(t, k, e, i, port.TUNED_GROUP)
    try:
        port.check_config(cfg, d, i, g)
    except ValueError:
        return None
    return cfg if tuned else None


def lever_variants(cfg: dict) -> dict[str, dict]:
    """The port with the decode levers (triton_sm90 docstring) on, same tiles otherwise: ablation rows."""
    return {"port_magic": {**cfg, "int4_cvt": "magic"}, "port_splitk4": {**cfg, "split_k1": 4},
            "port_magic_splitk4": {**cfg, "int4_cvt": "magic", "split_k1": 4}}


def table_shape(shape: dict, cfg: dict | None, flush: tm.L2Flush, reps: int, with_loop: bool,
                copy_tbps: float | None = None) -> dict:
    t, d, i, e, k, g = problem.dims(shape)
    inp = problem.make_inputs(shape, 1, DEV)  # another seed than the sweep's
    ref = problem.oracle(inp)
    # the bf16 weights are made once and shared by both bf16 references (4x the int4 memory)
    inp["w1_bf16"] = references.dequantize_all_bf16(inp["w1_q"], inp["w1_scale"])
    inp["w2_bf16"] = references.dequantize_all_bf16(inp["w2_q"], inp["w2_scale"])
    active = int(torch.unique(inp["topk_ids"]).numel())
    impls = {"port": (port.build, cfg or {}), "dequant_grouped_bf16": (references.build_dequant_grouped_bf16, {}),
             "bf16_grouped_predequant": (references.build_bf16_grouped_predequant, {})}
    if with_loop:
        impls["per_expert_loop_bf16"] = (references.build_per_expert_loop, {})
    for name, fn_name in MSLK_REFS.items():
        if hasattr(references, fn_name):
            impls[name] = (getattr(references, fn_name), {})
    if t_class(shape) != "prefill":
        base_cfg = cfg or port.pick_config(t, k, e, i, g)[0]
        impls.update({n: (port.build, c) for n, c in lever_variants(base_cfg).items()})
    res: dict = {"shape": shape, "active_experts": active, "impls": {}}
    eager, graph = {}, {}
    for name, (builder, c) in impls.items():
        row: dict = {}
        res["impls"][name] = row
        try:
            launch = builder(shape, c, DEV)
            prepared = launch.prepare(inp)
            out = torch.full((t, d), float("nan"), dtype=torch.bfloat16, device=DEV)
            got = launch.run(prepared, out)
            tm.sync()
            row["parity"] = tm.parity(got, ref)
            if name.startswith("port"):
                row["config"] = launch.describe.get("config")
                row["tuned"] = launch.describe.get("tuned")
            fn = (lambda l=launch, p=prepared, o=out: l.run(p, o))
            eager[name] = fn
            if launch.describe.get("graph_capturable", True):
                try:
                    graph[name] = tm.capture_graph(fn).replay
                except Exception as exc:
                    row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            row["kernels"] = tm.kernel_names(fn)
            if launch.expect_kernels:
                row["unexpected_kernels"] = [n for n in row["kernels"] if not re.search(launch.expect_kernels, n)]
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if "port" in graph:
        graph["port_again"] = graph["port"]  # A/A noise floor
    for mode, fns in (("eager_ms", eager), ("graph_ms", graph)):
        tm.record_times(res["impls"], mode, tm.time_interleaved(fns, reps=reps, warmup=2, flush=flush, budget_s=20))
    int4_bytes = problem.min_bytes(shape, active_experts=active)
    bf16_bytes = active * 3 * i * d * 2 + 4 * t * d
    fl = problem.flops(shape)
    for name, row in res["impls"].items():
        # bf16-weight references stream bf16 bytes ("bf16i4" streams int4)
        nbytes = bf16_bytes if "bf16" in name and "bf16i4" not in name else int4_bytes
        tm.add_roof({name: row}, nbytes, copy_tbps)
        for mode in ("eager_ms", "graph_ms"):
            if row.get(mode):
                row[mode.replace("_ms", "_tflops")] = fl / (row[mode] * 1e-3) / 1e12
    p = res["impls"].get("port", {})
    for base in ("dequant_grouped_bf16", "bf16_grouped_predequant", "per_expert_loop_bf16", *MSLK_REFS):
        tm.add_speedups(res, (base,))
        for lever in lever_variants({}):
            tm.add_speedups(res, (base,), port=lever)
        b = res["impls"].get(base, {})
        if p.get("graph_ms") and b.get("eager_ms") and not b.get("graph_ms"):
            res.setdefault("speedup", {})[f"{base}_eager_vs_port_graph"] = b["eager_ms"] / p["graph_ms"]
    return res


def print_roof_table(rows: list[dict], copy_tbps: float | None) -> None:
    """Per shape and candidate: graph time, TB/s and % of the session's copy roof, x MSLK int4, parity."""
    roof = f"{copy_tbps:.2f} TB/s" if copy_tbps else "not measured"
    print(f"\nweight-streaming view (graph replay, eager where a row cannot be captured; copy roof this session: {roof}; "
          "x mslk = MSLK bf16i4bf16_shuffled_grouped time / this time)")
    for r in rows:
        s, im = r["shape"], r["impls"]
        ref = im.get("mslk_bf16i4_shuffled_grouped", {})
        for name, row in im.items():
            if name == "port_again":
                continue
            mode = "graph" if row.get("graph_ms") else "eager"
            t = row.get(f"{mode}_ms")
            rt = ref.get(f"{mode}_ms")
            x = f"{rt / t:.2f}" if t and rt else "-"
            par = row.get("parity", {})
            ok = "-" if not par else ("pass" if par.get("frac_out_of_tol", 1) == 0 and par.get("finite") else "FAIL")
            print(f"  E={s['experts']:>4} I={s['inter_dim']:>5} T={s['tokens']:>5} {name:<30} {mode:<5} {tm.fmt_us(t):>9} "
                  f"{row.get(f'{mode}_tbps', float('nan')):>5.2f} TB/s {row.get(f'{mode}_pct_copy', float('nan')):>5.1f}% "
                  f"x mslk {x:>5} oracle {ok:<4} {row.get('error', '')[:80]}")


def print_table(rows: list[dict]) -> None:
    name = "cpu" if DEV == "cpu" else torch.cuda.get_device_name()
    print(f"\na16wi4 MoE (model_dim 7168, top-8) on {name} | us (median); TB/s = int4 (port) or bf16 (refs) weight bytes / t vs {HBM_TBPS}")
    print(f"{'E':>4} {'I':>5} {'tok':>5} {'act':>4} | {'port g':>8} {'eager':>8} {'TB/s':>5} {'TF':>5} | {'dq+bf16 e':>9} | "
          f"{'bf16 g':>8} {'eager':>8} {'TB/s':>5} | {'loop e':>8} | {'x dq e/e':>8} {'x bf16 g':>8} {'x bf16 e':>8} | {'A/A':>5} | port err  dq err  bf16 err")
    for r in rows:
        s, im, sp = r["shape"], r["impls"], r.get("speedup", {})
        p, dq, bf, lp = (im.get(n, {}) for n in ("port", "dequant_grouped_bf16", "bf16_grouped_predequant", "per_expert_loop_bf16"))
        aa = im.get("port_again", {}).get("graph_ms")
        aa_txt = f"{aa / p['graph_ms']:.3f}" if aa and p.get("graph_ms") else "-"
        err = lambda d: f"{d['parity']['rel_fro']:.1e}" if "parity" in d else "n/a"
        print(f"{s['experts']:>4} {s['inter_dim']:>5} {s['tokens']:>5} {r['active_experts']:>4} | "
              f"{tm.fmt_us(p.get('graph_ms')):>8} {tm.fmt_us(p.get('eager_ms')):>8} {p.get('graph_tbps', float('nan')):>5.2f} "
              f"{p.get('graph_tflops', float('nan')):>5.0f} | {tm.fmt_us(dq.get('eager_ms')):>9} | "
              f"{tm.fmt_us(bf.get('graph_ms')):>8} {tm.fmt_us(bf.get('eager_ms')):>8} {bf.get('graph_tbps', float('nan')):>5.2f} | "
              f"{tm.fmt_us(lp.get('eager_ms')):>8} | {sp.get('dequant_grouped_bf16_eager', float('nan')):>8.2f} "
              f"{sp.get('bf16_grouped_predequant_graph', float('nan')):>8.2f} {sp.get('bf16_grouped_predequant_eager', float('nan')):>8.2f} | "
              f"{aa_txt:>5} | {err(p):>8} {err(dq):>7} {err(bf):>8}")


SHAPE_ORDER = ("tokens", "model_dim", "inter_dim", "experts", "topk", "group_size")


def runner_configs(path: Path) -> dict[tuple, dict]:
    """{shape tuple: config} from validate_recipes.py --emit-configs, for this card's shapes whose recipe
    runs this bench's port kernel (the runner's pick, levers included, e.g. int4_cvt magic at decode)."""
    import json

    out = {}
    for e in json.loads(Path(path).read_text()):
        if e.get("card") != "triton_moe_a16wi4_sm90" or not str(e.get("kernel") or "").endswith("moe_a16wi4.triton_sm90:build"):
            continue
        d = dict(p.split("=", 1) for p in str(e["shape"]).split(","))
        out[tuple(int(d[k]) for k in SHAPE_ORDER)] = dict(e["config"])
    return out


def main(argv: list[str] | None = None) -> int:
    global DEV
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tokens", type=int, nargs="*", default=None)
    ap.add_argument("--combos", default="384x512,64x2048,384x2048,64x512", help="experts x inter_dim pairs for the table")
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--sweep-reps", type=int, default=5)
    ap.add_argument("--sweep-tokens", default="1,64,256,1024,4096", help="token counts swept (others reuse the nearest)")
    ap.add_argument("--loop-max-tokens", type=int, default=256, help="time the per-expert loop only up to this many tokens")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1))
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--configs", type=Path, default=None,
                    help="validate_recipes.py --emit-configs JSON: the runner's selected config for each shape, timed as the "
                         "port instead of this bench's pick (the lever rows then vary the runner's config)")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="plumbing check on the CPU with tiny shapes (run with TRITON_INTERPRET=1); numbers mean nothing")
    args = ap.parse_args(argv)
    combos = [tuple(int(v) for v in c.split("x")) for c in args.combos.split(",") if c]
    toks = args.tokens or [1, 16, 64, 256, 1024, 4096]
    shapes = [{"tokens": t, "model_dim": 7168, "inter_dim": i, "experts": e, "topk": 8, "group_size": args.group_size}
              for (e, i) in combos for t in toks]
    sweep_toks = [int(v) for v in args.sweep_tokens.split(",") if v]
    # alternate the two swept combos so a budget cut-off costs both the same shapes
    sweep_shapes = sorted((s for s in shapes if (s["experts"], s["inter_dim"]) in SWEEP_COMBOS and s["tokens"] in sweep_toks),
                          key=lambda s: (s["tokens"], SWEEP_COMBOS.index((s["experts"], s["inter_dim"]))))
    if args.dry_run_cpu:
        DEV, tm.DRY_RUN_CPU, args.jobs = "cpu", True, 1
        tm.load_interpreter_fixups()
        shapes = [{"tokens": t, "model_dim": 512, "inter_dim": 256, "experts": 8, "topk": 2, "group_size": 32} for t in (1, 80, 600)]
        sweep_shapes = shapes
        for cl in CLASSES.values():
            cl["bm"] = [min(b, 32) for b in cl["bm"]][:1]
            cl["s1"], cl["s2"] = cl["s1"][:2], cl["s2"][:2]
    elif not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 5
    t0 = time.perf_counter()
    result: dict = tm.run_header(args.dry_run_cpu)
    flush = tm.L2Flush(DEV)
    result["copy_tbps"] = copy_tbps = tm.copy_bandwidth_tbps()
    chosen: dict[tuple, dict] = {}
    if args.sweep:
        tm.timed_precompile(result, lambda: precompile(sweep_shapes, args.jobs))
        result["sweep"] = []
        for shape in sweep_shapes:
            if time.perf_counter() - t0 > args.budget_s * 0.6:
                print("sweep budget reached", flush=True)
                break
            try:
                sw = sweep_shape(shape, flush, args.sweep_reps)
            except Exception as exc:
                print(f"sweep failed for {shape}: {type(exc).__name__}: {exc}", flush=True)
                result["sweep"].append({"shape": shape, "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
                continue
            result["sweep"].append(sw)
            chosen[(shape["inter_dim"], port.rows_per_expert(shape["tokens"], shape["topk"], shape["experts"]))] = sw["best_config"]
            pb = sw["per_bm"]
            print(f"sweep E={shape['experts']} I={shape['inter_dim']} T={shape['tokens']}: " +
                  "; ".join(f"bm{b}: {v['stage1']} + {v['stage2']} = {v['sum_ms'] * 1000:.1f}us" for b, v in pb.items()) +
                  f" | e2e rel err {sw['best_parity']['rel_fro']:.1e}", flush=True)
            tm.save_json(args.out, result)
    picked = runner_configs(args.configs) if args.configs else {}
    rows = []
    for shape in shapes:
        if time.perf_counter() - t0 > args.budget_s:
            print("budget reached; table stopped", flush=True)
            break
        cfg = picked.get(tuple(shape[k] for k in SHAPE_ORDER)) or nearest_config(chosen, shape) or card_tiles(shape)
        try:
            rows.append(table_shape(shape, cfg, flush, args.reps, with_loop=shape["tokens"] <= args.loop_max_tokens,
                                    copy_tbps=copy_tbps))
        except Exception as exc:
            print(f"table failed for {shape}: {type(exc).__name__}: {exc}", flush=True)
            rows.append({"shape": shape, "error": f"{type(exc).__name__}: {str(exc)[:400]}", "impls": {}, "active_experts": -1})
        torch.cuda.empty_cache() if DEV == "cuda" else None
        result["table"] = rows
        tm.save_json(args.out, result)
    print_table(rows)
    print_roof_table(rows, copy_tbps)
    result["elapsed_s"] = time.perf_counter() - t0
    tm.save_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
