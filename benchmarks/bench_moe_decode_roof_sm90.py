"""MoE decode at the memory roof (issue 41): every decode lever against the incumbent recipe and the
production references, as % of the copy roof measured in the same process.

    python benchmarks/bench_moe_decode_roof_sm90.py --family a16wi4 --tokens 1 16 --out a16.json
    python benchmarks/bench_moe_decode_roof_sm90.py --family fp8 --tokens 1 16 --out fp8.json
    TRITON_INTERPRET=1 python benchmarks/bench_moe_decode_roof_sm90.py --family fp8 --dry-run-cpu   # plumbing only

Per shape, in one process: fresh inputs, the fp32 oracle, every candidate built, checked against the
oracle with the card's tolerance (a candidate that fails is timed but flagged FAIL and never ranked),
then timed together by the runner's timing engine (benchmarks/sm90_timing.py: interleaved, balanced
positions, held rounds, L2 flushed before every call), CUDA-graph replay where the candidate can be
captured, eager otherwise. Candidates:

- ``incumbent``: the card's recipe kernel with the recipe this shape selects (what the H200 measured);
- ``v:<name>``: each named variant of the family's decode module (``ABLATIONS``: one lever at a time
  and the combinations), and ``--config`` JSON ones;
- references: a16wi4 -> MSLK ``bf16i4bf16_shuffled_grouped`` (the production int4 MoE path, group 128)
  and ``bf16bf16bf16_grouped_stacked`` (bf16 weights, 4x the memory); fp8 -> DeepGEMM's grouped masked
  and contiguous layers (issue 40 names them ``deepgemm_grouped_masked`` / ``deepgemm_grouped_contiguous``;
  the builder is looked up under those names first, then under the card's
  ``build_deepgemm_masked`` / ``build_deepgemm_contiguous``) and the cuBLAS per-expert fallback. A
  reference that cannot load or refuses the shape is recorded with its reason, never replaced.

Bytes: the family's traffic model (``traffic.bytes_moved``) with the exact touched experts of the
inputs' routing; ``pct_copy`` = (those bytes / time) / copy bandwidth measured here
(``sm90_timing.copy_bandwidth_tbps``: a 2 GiB device-to-device copy, read + written bytes over time).
The issue's bars: a16wi4 >= 60 % and >= 1.0x MSLK at 1 and 16 tokens; fp8 >= 75 % and a ratio to
DeepGEMM grouped.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sm90_timing as tm  # noqa: E402

DEV = "cuda"
FAMILIES = {
    "a16wi4": {
        "card": "triton_moe_a16wi4_sm90", "pkg": "skillrun_kernels.moe_a16wi4",
        "shapes": [(64, 2048), (384, 512)], "extra": {"model_dim": 7168, "topk": 8, "group_size": 128},
        "refs": [("mslk_bf16i4_shuffled_grouped", ["build_mslk_bf16i4_shuffled_grouped"]),
                 ("mslk_bf16_grouped_stacked", ["build_mslk_bf16_grouped_stacked"])],
        "production": "mslk_bf16i4_shuffled_grouped",
        "tol": {"rtol": 0.01, "atol": 0.01, "max_rel_fro": 0.01, "min_cosine": 0.999},
        "cpu": {"model_dim": 256, "inter_dim": 128, "experts": 8, "topk": 2, "group_size": 64},
        "cpu_tiles": {"BLOCK_N1": 32, "BLOCK_K1": 64, "BLOCK_N2": 32, "BLOCK_K2": 64, "stages1": 2, "stages2": 2},
    },
    "fp8": {
        "card": "triton_moe_fp8_blockscale_sm90", "pkg": "skillrun_kernels.fp8_blockscale_moe",
        "shapes": [(256, 2048)], "extra": {"model_dim": 7168, "topk": 8},
        "refs": [("deepgemm_grouped_masked", ["build_deepgemm_grouped_masked", "build_deepgemm_masked"]),
                 ("deepgemm_grouped_contiguous", ["build_deepgemm_grouped_contiguous", "build_deepgemm_contiguous"]),
                 ("cublas_blockwise_per_expert", ["build_cublas_per_expert"])],
        "production": "deepgemm_grouped_masked",
        "tol": {"rtol": 0.05, "atol": 0.05, "max_rel_fro": 0.02, "min_cosine": 0.999},
        "cpu": {"model_dim": 512, "inter_dim": 256, "experts": 8, "topk": 2},
        "cpu_tiles": {"stages1": 2, "stages2": 2},
    },
}


def _mod(fam: dict, name: str):
    return importlib.import_module(f"{fam['pkg']}.{name}")


def incumbent_config(fam: dict, shape: dict) -> tuple[str, dict]:
    """The recipe the card selects for this shape, and its config (what the H200 measured)."""
    from skillrun.kb.index import SkillIndex
    from skillrun.plan.select import select_recipe

    sel = select_recipe(SkillIndex.load().skill(fam["card"]), shape, {"sm_count": 132}, arch="sm_90")
    return sel.recipe.name + (" (untuned)" if sel.untuned else ""), dict(sel.recipe.config)


def reference_builder(fam: dict, names: list[str]):
    refs = _mod(fam, "references")
    for n in names:
        fn = getattr(refs, n, None)
        if fn is not None:
            return n, fn
    return None, None


def passes(par: dict, tol: dict) -> bool:
    return (par.get("finite", False) and par["rel_fro"] <= tol["max_rel_fro"] and par["cosine"] >= tol["min_cosine"]
            and par["frac_out_of_tol"] == 0.0)


def active_experts(inputs: dict) -> int:
    return int(torch.unique(inputs["topk_ids"]).numel())


def run_shape(fam_name: str, shape: dict, variants: list[str], extra_cfgs: list[dict], flush, reps: int,
              copy_tbps: float | None, budget_s: float) -> dict:
    fam = FAMILIES[fam_name]
    problem, dec, traffic = _mod(fam, "problem"), _mod(fam, "triton_sm90_decode"), _mod(fam, "traffic")
    port = _mod(fam, "triton_sm90")
    inp = problem.make_inputs(shape, 1, DEV)
    ref = problem.oracle(inp)
    act = active_experts(inp)
    recipe, inc_cfg = incumbent_config(fam, shape)
    tol = {**fam["tol"]}
    if tm.DRY_RUN_CPU:  # the tiny proxy shape needs tiles that divide it
        inc_cfg.update(fam["cpu_tiles"])
    cands: dict[str, tuple] = {"incumbent": (port.build, inc_cfg)}
    for v in variants:
        cfg = dict(dec.ABLATIONS[v])
        if tm.DRY_RUN_CPU:
            cfg.update(fam["cpu_tiles"])
        cands[f"v:{v}"] = (dec.build, cfg)
    for j, c in enumerate(extra_cfgs):
        cands[f"cfg{j}"] = (dec.build, c)
    res: dict = {"shape": shape, "active_experts": act, "incumbent_recipe": recipe, "copy_tbps": copy_tbps, "rows": {}}
    for name, names in fam["refs"]:
        found, fn = reference_builder(fam, names)
        if fn is None:
            res["rows"][name] = {"error": f"no builder named {names} in {fam['pkg']}.references"}
            continue
        cands[name] = (fn, {})
        res["rows"].setdefault(name, {})["builder"] = found
    eager, graph = {}, {}
    t_start = time.perf_counter()
    for name, (builder, cfg) in cands.items():
        row = res["rows"].setdefault(name, {})
        if time.perf_counter() - t_start > budget_s:
            row["error"] = "skipped: shape budget spent before it was built"
            continue
        try:
            launch = builder(shape, cfg, DEV)
            prepared = launch.prepare(inp)
            out = torch.full((shape["tokens"], shape["model_dim"]), float("nan"), dtype=torch.bfloat16, device=DEV)
            got = launch.run(prepared, out)
            tm.sync()
            row["parity"] = par = tm.parity(got, ref, rtol=tol["rtol"], atol=tol["atol"])
            row["passes"] = passes(par, tol)
            row["config"] = launch.describe.get("config", cfg)
            row["launches"] = launch.describe.get("launches")
            fn = (lambda lc=launch, p=prepared, o=out: lc.run(p, o))
            eager[name] = fn
            if launch.describe.get("graph_capturable", True):
                try:
                    graph[name] = tm.capture_graph(fn).replay
                except Exception as exc:  # noqa: BLE001 - recorded, the row stays eager
                    row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        except Exception as exc:  # noqa: BLE001 - every candidate is untrusted: record and keep going
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if "incumbent" in graph:
        graph["incumbent#aa"] = graph["incumbent"]  # A/A: the noise floor of these rounds
    for mode, fns in (("graph_ms", graph), ("eager_ms", {k: v for k, v in eager.items() if k not in graph})):
        if fns:
            tm.record_times(res["rows"], mode, tm.time_interleaved(fns, reps=reps, warmup=2, flush=flush, budget_s=60))
    aa = res["rows"].get("incumbent#aa", {})
    if aa.get("graph_ms") and res["rows"]["incumbent"].get("graph_ms"):
        res["aa_noise_pct"] = 100.0 * abs(aa["graph_ms"] / res["rows"]["incumbent"]["graph_ms"] - 1.0)
    prod = res["rows"].get(fam["production"], {})
    prod_ms = prod.get("graph_ms") or prod.get("eager_ms")
    inc = res["rows"].get("incumbent", {})
    inc_ms = inc.get("graph_ms")
    for name, row in res["rows"].items():
        ms = row.get("graph_ms") or row.get("eager_ms")
        if not ms:
            continue
        cfg = row.get("config") if name.startswith(("v:", "cfg")) else None
        tr = traffic.bytes_moved(shape, cfg, active_experts=act)
        row["hbm_bytes"] = tr.hbm_bytes
        row["roof_us"] = tr.as_dict(copy_tbps or 4.25)["roof_us"]
        row["time_us"] = ms * 1e3
        row["tbps"] = tr.hbm_bytes / (ms * 1e-3) / 1e12
        if copy_tbps:
            row["pct_copy"] = 100.0 * row["tbps"] / copy_tbps
        if prod_ms:
            row["x_production"] = prod_ms / ms
        if inc_ms:
            row["x_incumbent"] = inc_ms / ms
    return res


def print_table(fam_name: str, results: list[dict]) -> None:
    fam = FAMILIES[fam_name]
    for r in results:
        s = r["shape"]
        print(f"\n{fam_name} T={s['tokens']} E={s['experts']} I={s['inter_dim']} (active {r['active_experts']}, "
              f"incumbent recipe {r['incumbent_recipe']}, copy roof {r['copy_tbps'] or float('nan'):.2f} TB/s, "
              f"A/A {r.get('aa_noise_pct', float('nan')):.1f}%)")
        print(f"  {'candidate':<30} {'L':>2} {'us':>9} {'roof us':>8} {'TB/s':>6} {'% copy':>7} "
              f"{'x ' + fam['production'][:14]:>17} {'x incumbent':>11} parity")
        rows = sorted(r["rows"].items(), key=lambda kv: kv[1].get("time_us", 1e18))
        for name, row in rows:
            if name == "incumbent#aa":
                continue
            if "error" in row and "time_us" not in row:
                print(f"  {name:<30} {row['error'][:110]}")
                continue
            if "time_us" not in row:
                continue
            ok = "pass" if row.get("passes") else "FAIL"
            mode = "g" if row.get("graph_ms") else "e"
            print(f"  {name:<30} {row.get('launches') or '-':>2} {row['time_us']:>8.1f}{mode} {row['roof_us']:>8.1f} "
                  f"{row['tbps']:>6.2f} {row.get('pct_copy', float('nan')):>6.1f}% {row.get('x_production', float('nan')):>17.2f} "
                  f"{row.get('x_incumbent', float('nan')):>11.2f} {ok} rel_fro {row['parity']['rel_fro']:.1e}"
                  if "parity" in row else f"  {name:<30} (timed without parity)")


def main(argv: list[str] | None = None) -> int:
    global DEV
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), required=True)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--combos", default=None, help="experts x inter_dim pairs, e.g. 64x2048,384x512 (default per family)")
    ap.add_argument("--variant", action="append", default=None, help="decode variants to time (default: all ABLATIONS)")
    ap.add_argument("--config", type=json.loads, action="append", default=[], help="extra decode config (JSON)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new shapes after this many seconds")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--dry-run-cpu", action="store_true", help="plumbing check on the CPU (TRITON_INTERPRET=1); numbers mean nothing")
    args = ap.parse_args(argv)
    fam = FAMILIES[args.family]
    dec = _mod(fam, "triton_sm90_decode")
    variants = args.variant or list(dec.ABLATIONS)
    combos = ([tuple(int(v) for v in c.split("x")) for c in args.combos.split(",")] if args.combos else fam["shapes"])
    shapes = [{"tokens": t, "inter_dim": i, "experts": e, **fam["extra"]} for (e, i) in combos for t in args.tokens]
    if args.dry_run_cpu:
        DEV, tm.DRY_RUN_CPU = "cpu", True
        tm.load_interpreter_fixups()
        import interp_ptx_model  # noqa: F401  (tests/: runs the lop3 PTX block on numpy)
        shapes = [{**fam["extra"], **fam["cpu"], "tokens": t} for t in (1, 3)]
        # route 'one' and split_k bounds at the tiny shape: drop variants the tiny shape cannot hold
        ok = []
        for v in variants:
            try:
                dec.resolve_config(shapes[0], {**dec.ABLATIONS[v], **fam["cpu_tiles"]})
                ok.append(v)
            except ValueError:
                pass
        variants = ok
    elif not torch.cuda.is_available():
        print("needs a CUDA device (or --dry-run-cpu)", file=sys.stderr)
        return 5
    t0 = time.perf_counter()
    result: dict = {**tm.run_header(args.dry_run_cpu), "family": args.family, "variants": variants}
    flush = tm.L2Flush(DEV)
    result["copy_tbps"] = copy_tbps = tm.copy_bandwidth_tbps()
    print(f"copy roof this session: {copy_tbps if copy_tbps else 'not measured (dry run)'} TB/s", flush=True)
    result["shapes"] = []
    for shape in shapes:
        left = args.budget_s - (time.perf_counter() - t0)
        if left <= 0:
            print(f"budget spent: {shape} not run", flush=True)
            result["shapes"].append({"shape": shape, "error": "budget spent before this shape"})
            continue
        try:
            r = run_shape(args.family, shape, variants, args.config, flush, args.reps, copy_tbps, left)
        except Exception as exc:  # noqa: BLE001 - one shape failing must not lose the others
            r = {"shape": shape, "error": f"{type(exc).__name__}: {str(exc)[:400]}", "rows": {}, "active_experts": -1,
                 "incumbent_recipe": "-", "copy_tbps": copy_tbps}
            print(f"shape failed {shape}: {r['error']}", flush=True)
        result["shapes"].append(r)
        tm.save_json(args.out, result)
        if DEV == "cuda":
            torch.cuda.empty_cache()
    print_table(args.family, [r for r in result["shapes"] if "rows" in r])
    result["elapsed_s"] = time.perf_counter() - t0
    tm.save_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
