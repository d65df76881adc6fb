"""Run every recipe shape of the sm_90 cards through the runner, within a time budget (device script).

    source .ci/device-env.sh
    python3 benchmarks/validate_recipes.py triton_fp8_blockscale_gemm_sm90:4096,2048,7168 \
        triton_moe_a16wi4_sm90 --rounds 40 --budget-s 420 --out $OUT/validate.json

An argument is a card id (every shape its `tests.selects` cases list, untuned ones included) or
``card:shape`` for one shape. Shapes run one after another through ``skillrun.api.run_skill`` (the
same code as `skill-run run`), CUDA-graph replay, artifacts written to validation/. The budget is
checked before each shape: a shape that would start past it is listed as not run, never half-run.
Prints one line per shape (verdict, ratio against the headline reference, A/A noise, port spread,
wall seconds) and writes them all to --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_shapes import card_cases, recipes_first  # noqa: E402


def targets(args: list[str], spread: bool = False) -> list[tuple[str, str]]:
    """(card, shape) per target; ``spread``: a card's shapes one per recipe first (recipes_first)."""
    out = []
    for a in args:
        card, _, shape = a.partition(":")
        if shape:
            out.append((card, shape))
            continue
        cases = card_cases(card, untuned=True)
        out += [(card, s) for s, _ in (recipes_first(cases) if spread else cases)]
    return out


def summary(rec: dict, seconds: float) -> dict:
    t = rec.get("timing") or {}
    port = t.get("port_ms") or {}
    return {"card": rec.get("card", {}).get("id"), "shape": rec.get("shape"), "recipe": (rec.get("recipe") or {}).get("name"),
            "verdict": rec.get("verdict"), "speedup": rec.get("speedup"), "versus": t.get("versus"),
            "aa_noise_pct": t.get("aa_noise_pct"), "port_median_ms": port.get("median"), "port_spread_pct": port.get("spread_pct"),
            "position_effect_pct": (t.get("position_effect") or {}).get("max_pct"), "unheld": (t.get("hold") or {}).get("unheld_rounds"),
            "warnings": t.get("warnings"), "verdict_text": rec.get("verdict_text"), "artifact": rec.get("artifact"),
            "references": [{k: r.get(k) for k in ("name", "production", "status", "speedup", "speed", "median_ms")}
                           | {"parity": (r.get("parity") or {}).get("passed")} for r in rec.get("references") or []],
            "seconds": round(seconds, 1)}


def plan_items(index, todo: list[tuple[str, str]]):
    """(card, shape text, parsed shape, the plan item the runner would run) for each target: the recipe
    and config `skill-run run` picks for it on sm_90."""
    from skillrun.execute.backends import make_backend
    from skillrun.execute.harness import plan_item_for
    from skillrun.kb.cards import problem_keys
    from skillrun.plan.select import parse_shape

    be = make_backend(None)
    for card, shape in todo:
        skill = index.skill(card)
        sd = parse_shape(shape, problem_keys(skill))
        yield card, shape, sd, plan_item_for(index, skill, sd, be, "sm_90")


def pending(index, todo: list[tuple[str, str]], device_name: str | None = None) -> tuple[list[tuple[str, str]], list[dict]]:
    """Split ``todo`` into the shapes still to run and rows for those whose current artifact on this
    device class was timed by the sustained engine (so repeated device calls work through a card's
    shapes, and a shape is re-run only when its evidence is older, biased or stale)."""
    from skillrun import api

    if device_name is None:
        try:
            import torch

            device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        except Exception:
            device_name = None
    ev = api.evidence(index)
    left, done = [], []
    for card, shape, sd, item in plan_items(index, todo):
        hit = ev.measured(card, item.recipe, sd, arch="sm_90", device_name=device_name)
        if hit is not None and hit.summary.engine == "sustained":
            done.append({"card": card, "shape": shape, "verdict": "already measured", "artifact": hit.path,
                         "speedup": hit.summary.speedup})
        else:
            left.append((card, shape))
    return left, done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="+")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--isolation", choices=("spawn", "fork"), default="spawn",
                    help="spawn (a fresh interpreter per task) is the GPU default; fork children failed CUDA init on the H200")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--skip-current", action="store_true",
                    help="skip shapes whose current artifact on this device class was timed by the sustained engine "
                         "(re-run the same command in later device calls until every shape is covered)")
    ap.add_argument("--recipes-first", action="store_true",
                    help="run one shape of each recipe of a card before its other shapes (a short budget still covers every recipe)")
    ap.add_argument("--emit-bench-configs", type=Path, metavar="JSON",
                    help="only write {MxNxK: config} of the recipes the runner selects for the block-scale targets "
                         "(for bench_fp8_blockscale_sm90.py --configs), then exit")
    a = ap.parse_args(argv)
    from skillrun import api

    index = api.load_index()
    if a.emit_bench_configs:
        blockscale = [t for t in targets(a.targets) if t[0] == "triton_fp8_blockscale_gemm_sm90"]
        cfgs = {f"{sd['M']}x{sd['N']}x{sd['K']}": item.config for _, _, sd, item in plan_items(index, blockscale)}
        a.emit_bench_configs.write_text(json.dumps(cfgs, indent=1))
        print(json.dumps(cfgs))
        return 0
    isolation = a.isolation
    t0 = time.time()
    rows, todo = [], targets(a.targets, a.recipes_first)
    if a.skip_current:
        todo, done = pending(index, todo)
        rows += done
        print(f"skip-current: {len(done)} shape(s) already measured by the sustained engine, {len(todo)} to run", flush=True)
    for i, (card, shape) in enumerate(todo):
        left = a.budget_s - (time.time() - t0)
        avg = (time.time() - t0) / i if i else 0.0
        if left < max(avg * 1.2, 20.0):
            rows += [{"card": c, "shape": s, "verdict": "not run", "reason": "device-call budget"} for c, s in todo[i:]]
            print(f"budget: {len(todo) - i} shape(s) not run", flush=True)
            break
        ts = time.time()
        try:
            (rec,) = api.run_skill(index, card, [shape], rounds=a.rounds, seeds=a.seeds, cuda_graph=True,
                                   isolation=isolation, timeout_s=min(240.0, left),
                                   command=f"benchmarks/validate_recipes.py {card}:{shape} --rounds {a.rounds}")
            row = summary(rec, time.time() - ts)
        except Exception as exc:  # one shape's failure is its own row
            row = {"card": card, "shape": shape, "verdict": "error", "reason": f"{type(exc).__name__}: {str(exc)[:400]}",
                   "seconds": round(time.time() - ts, 1)}
        rows.append(row)
        sp, aa, spr = row.get("speedup"), row.get("aa_noise_pct"), row.get("port_spread_pct")
        print(f"{card} {shape}: {row['verdict']} x{sp} aa={aa} spread={spr} pos={row.get('position_effect_pct')} "
              f"port_ms={row.get('port_median_ms')} {row['seconds']}s", flush=True)
        if a.out:
            a.out.write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
