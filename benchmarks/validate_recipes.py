"""Run every recipe shape of the sm_90 cards through the runner, within a time budget (device script).

    source .ci/device-env.sh
    python3 benchmarks/validate_recipes.py triton_fp8_blockscale_gemm_sm90:4096,2048,7168 \
        triton_moe_a16wi4_sm90 --budget 540 --manifest $OUT/manifest.json --out $OUT/validate.json \
        --compile-cache .cache/compile

An argument is a card id (every shape its `tests.selects` cases list, untuned ones included) or
``card:shape`` for one shape. Shapes run through ``skillrun.api.run_skill`` (the same code as
`skill-run run`), CUDA-graph replay, artifacts written to validation/; every shape of a card is
served by that card's task servers (one session per card and device, execute/sessions.py), and each
timed session stops on confidence (execute/confidence.py).

**Budget.** ``--budget SECONDS`` bounds the whole call: before each shape, its cost is estimated
(what this card's shapes took so far in this call, else in earlier calls of the manifest, else a
default, plus the card's process start for its first shape) and a shape that would not finish
inside the budget is left for a later call, never half-run; a cheaper one further down may still run.

**Value order.** Shapes run most valuable first: value = share x uncertainty. The share is the
shape's % of GPU time in ``--profile`` traces (the plan's items), else in the profile its current
artifact recorded, else 1 (unknown). The uncertainty is 1 without current evidence on this device
class from the sustained engine (none, stale, older engine, an error), else 1 / (1 + margin), the
margin being how many noise floors (A/A, at least 0.5 %) the measured ratio lies from 1: a close call
is worth re-measuring, a 2x win is not.

**Manifest.** ``--manifest PATH`` records every target (value, status, seconds, verdict, artifact,
cost) and every call (its budget, what ran, its device seconds by phase); it is rewritten after each
shape, and the same command in a later call resumes it: done shapes are skipped, the rest run in
value order. Prints one line per shape and the call's summary; --out gets the rows (as before).

**First.** ``--first CARD:SHAPE`` (repeatable) runs that shape before the value order, re-measured in
this call even when the manifest has it done: a bench run beside the runner in the same device call
(benchmarks/device_issue39.sh) compares against what the runner measured on this machine, not an
earlier call's number. The budget still applies to it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_shapes import card_cases, recipes_first  # noqa: E402


def targets(args: list[str], spread: bool = False, root: Path | None = None) -> list[tuple[str, str]]:
    """(card, shape) per target; ``spread``: a card's shapes one per recipe first (recipes_first)."""
    out = []
    for a in args:
        card, _, shape = a.partition(":")
        if shape:
            out.append((card, shape))
            continue
        cases = card_cases(card, untuned=True, **({"root": root} if root is not None else {}))
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


# Estimates before anything of a card ran in this call (GPU seconds; a call learns its own): the
# card's processes, imports and first compiles, then one warm shape.
FIRST_S = 45.0
SHAPE_S = 15.0
MIN_NOISE_PCT = 0.5


def shares_from_profiles(index, traces: list[str]) -> dict[tuple[str, str], float]:
    """(card, shape key) -> the % of GPU time the plan of these traces gives that item (summed)."""
    from skillrun import api
    from skillrun.evidence.index import shape_key

    out: dict[tuple[str, str], float] = {}
    for tr in traces:
        prof = api.ingest_profile(tr)
        pl = api.plan(prof, api.match(prof, index), index, evidence=False)
        for it in pl.items:
            if it.shape:
                k = (it.skill_id, shape_key(it.shape))
                out[k] = out.get(k, 0.0) + float(it.pct_gpu or 0.0)
    return out


def uncertainty(hit) -> float:
    """1 without usable evidence, else 1 / (1 + margin): margin = |ln ratio| in noise floors."""
    if hit is None or hit.summary.engine != "sustained" or hit.summary.speedup is None or hit.summary.verdict == "error":
        return 1.0
    floor = max(hit.summary.noise_pct or 0.0, MIN_NOISE_PCT) / 100.0
    margin = abs(math.log(max(hit.summary.speedup, 1e-9))) / math.log1p(floor)
    return round(1.0 / (1.0 + margin), 4)


def valued(index, todo: list[tuple[str, str]], traces: list[str] | None = None, device_name: str | None = None) -> list[dict]:
    """One row per target with share, uncertainty and value, most valuable first (stable)."""
    from skillrun import api
    from skillrun.evidence.index import shape_key

    shares = shares_from_profiles(index, traces) if traces else {}
    try:
        ev = api.evidence(index)
    except Exception:  # noqa: BLE001 - no readable evidence: every shape is uncertain
        ev = None
    rows = []
    for card, shape, sd, item in plan_items(index, todo):
        hit = ev.measured(card, item.recipe, sd, arch="sm_90", device_name=device_name) if ev is not None else None
        share = shares.get((card, shape_key(sd)))
        if share is None and traces:
            share = 0.0  # not in the traces given: after every traced shape
        if share is None:
            pct = ((hit.record.get("profile") or {}).get("pct_gpu") if hit is not None else None)
            share = float(pct) if isinstance(pct, (int, float)) and pct > 0 else 1.0
        u = uncertainty(hit)
        rows.append({"card": card, "shape": shape, "recipe": item.recipe, "share": round(share, 4), "uncertainty": u,
                     "value": round((share + 1e-3) * u, 6), "current": hit.path if hit is not None else None})
    return sorted(rows, key=lambda r: -r["value"])


class Manifest:
    """The resumable record of a budgeted run (module doc); written atomically after every change."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data = {"version": 1, "targets": [], "calls": []}
        if path is not None and path.exists():
            self.data = json.loads(path.read_text())

    def merge(self, rows: list[dict]) -> list[dict]:
        """The targets to run in this call, most valuable first: new ones added, done ones kept done."""
        have = {(t["card"], t["shape"]): t for t in self.data["targets"]}
        for r in rows:
            t = have.get((r["card"], r["shape"]))
            if t is None:
                t = {**r, "status": "pending", "attempts": 0}
                self.data["targets"].append(t)
                have[(r["card"], r["shape"])] = t
            elif t.get("status") != "done":
                t.update({k: r[k] for k in ("share", "uncertainty", "value", "current")})
        wanted = {(r["card"], r["shape"]) for r in rows}
        todo = [t for t in self.data["targets"] if (t["card"], t["shape"]) in wanted and t.get("status") != "done"]
        return sorted(todo, key=lambda t: -float(t.get("value") or 0.0))

    def reopen(self, keys: list[tuple[str, str]]) -> None:
        """Mark these targets pending again (``--first``: re-measured in this call whatever an earlier one did)."""
        want = set(keys)
        for t in self.data["targets"]:
            if (t["card"], t["shape"]) in want and t.get("status") == "done":
                t.update(status="pending", reopened="--first")

    def seconds_of(self, card: str) -> list[float]:
        return [float(t["seconds"]) for t in self.data["targets"] if t["card"] == card and t.get("status") == "done"
                and isinstance(t.get("seconds"), (int, float)) and not t.get("first_of_call")]

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.path)


def measure(index, card: str, shape: str, *, pool, a, left: float) -> dict:
    """One shape through the runner (the default; tests inject their own)."""
    from skillrun import api

    kw = {"backend": a.backend} if a.backend else {}
    if a.timer:
        kw["timer"] = a.timer
    if a.sandbox != "auto":
        kw["sandbox"] = a.sandbox
    (rec,) = api.run_skill(index, card, [shape], rounds=a.rounds, seeds=a.seeds, cuda_graph=not a.no_graph,
                           isolation=a.isolation, timeout_s=max(30.0, min(240.0, left)), pool=pool,
                           command=f"benchmarks/validate_recipes.py {card}:{shape} --rounds {a.rounds}", **kw)
    return rec


def estimate(card: str, seen: dict[str, list[float]], manifest: Manifest, a) -> float:
    """What the next shape of ``card`` will cost: this call's warm shapes, else earlier calls', else the
    default; plus the card's start when none of its shapes has run in this call."""
    warm = seen.get(card) or manifest.seconds_of(card)
    shape_s = sorted(warm)[len(warm) // 2] if warm else a.estimate_shape_s
    return shape_s + (0.0 if card in seen else a.estimate_first_s)


def compile_in_background(index, todo: list[dict], cache: str, log) -> tuple[dict, threading.Thread]:
    """Compile ahead (execute/compile_ahead.py) on every host core while the GPU measures; the state
    says which jobs are done, so a shape can wait for its own kernels."""
    from skillrun.execute import compile_ahead
    from skillrun.plan.select import parse_shape
    from skillrun.kb.cards import problem_keys

    targets = [(t["card"], parse_shape(t["shape"], problem_keys(index.skill(t["card"])))) for t in todo]
    jobs = compile_ahead.jobs_for(index, targets)
    state: dict = {"jobs": {j["key"]: j for j in jobs}, "by_target": {}, "done": set(), "summary": None}
    for (card, sd), t in zip(targets, todo):
        key = next((j["key"] for j in jobs if j["card"] == card and j["shape"] == sd), None)
        state["by_target"][(t["card"], t["shape"])] = key
    folder = compile_ahead.cache_dir(cache)
    if folder.is_dir():
        compile_ahead.relocate(folder)  # a carried folder: Triton's entries name their files by absolute path
    # The children find the compiles there: a sandboxed port's process copies what its own cache lacks from this
    # seed (skillrun.io.compile_seed; before each task of its card's server, so compiles done while the GPU
    # measures arrive too); an unsandboxed one (sandbox=off) reads the folder itself.
    os.environ["SKILLRUN_COMPILE_SEED"] = str(folder)
    os.environ["TRITON_CACHE_DIR"] = str(folder)

    def work() -> None:
        try:
            state["summary"] = compile_ahead.compile_ahead(jobs, cache, log=log,
                                                           on_done=lambda key, res: state["done"].add(key))
        except Exception as exc:  # noqa: BLE001 - the GPU measures anyway, compiling as it goes
            state["summary"] = {"error": f"{type(exc).__name__}: {exc}"}
        state["done"].update(state["jobs"])

    th = threading.Thread(target=work, name="compile-ahead", daemon=True)
    th.start()
    return state, th


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="+")
    ap.add_argument("--rounds", type=int, default=40, help="the cap on timed rounds per shape (the session stops on confidence)")
    ap.add_argument("--budget", "--budget-s", dest="budget", type=float, default=420.0,
                    help="seconds for the whole call; shapes that would not finish inside it are left for a later call")
    ap.add_argument("--manifest", type=Path, help="resumable record of the targets and calls (module doc)")
    ap.add_argument("--profile", action="append", default=[], help="a trace whose plan gives each shape its share of GPU time")
    ap.add_argument("--compile-cache", help="compile every target's kernels ahead into this carried folder, while measuring")
    ap.add_argument("--isolation", choices=("spawn", "fork"), default="spawn",
                    help="spawn (a fresh interpreter per task) is the GPU default; fork children failed CUDA init on the H200")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--skip-current", action="store_true",
                    help="skip shapes whose current artifact on this device class was timed by the sustained engine "
                         "(re-run the same command in later device calls until every shape is covered)")
    ap.add_argument("--first", action="append", default=[], metavar="CARD:SHAPE",
                    help="run this shape before the value order, re-measured even when the manifest has it done "
                         "(the shapes a bench beside the runner compares; repeatable)")
    ap.add_argument("--recipes-first", action="store_true",
                    help="one shape of each recipe of a card before its other shapes, as the base order the value order sorts")
    ap.add_argument("--emit-bench-configs", type=Path, metavar="JSON",
                    help="only write {MxNxK: config} of the recipes the runner selects for the block-scale targets "
                         "(for bench_fp8_blockscale_sm90.py --configs), then exit")
    ap.add_argument("--emit-configs", type=Path, metavar="JSON",
                    help="only write [{card, shape, recipe, kernel, config}] of the recipe the runner selects for each "
                         "target (compare_runner_bench.py --runner-configs: which bench variant is the runner's kernel), then exit")
    ap.add_argument("--kb", help="knowledge base (default: the checkout's)")
    ap.add_argument("--backend", help="cuda (default: the device present) or cpu (tests)")
    ap.add_argument("--timer", help="timer spec for the session (tests: wall)")
    ap.add_argument("--sandbox", choices=("auto", "require", "off"), default=os.environ.get("SKILLRUN_SANDBOX", "auto"),
                    help="the ports' confinement (auto: the strongest the device survives; off: recorded as such)")
    ap.add_argument("--no-graph", action="store_true", help="eager launches instead of CUDA-graph replay")
    ap.add_argument("--estimate-first-s", type=float, default=FIRST_S, help="a card's first shape, before anything is known")
    ap.add_argument("--estimate-shape-s", type=float, default=SHAPE_S, help="a warm shape, before anything is known")
    a = ap.parse_args(argv)
    from skillrun import api
    from skillrun.execute.cost import summary as cost_summary

    index = api.load_index(a.kb)
    if a.emit_configs:
        picked = [{"card": card, "shape": shape, "recipe": item.recipe, "kernel": item.kernel_ref, "config": item.config}
                  for card, shape, _, item in plan_items(index, targets(a.targets))]
        a.emit_configs.write_text(json.dumps(picked, indent=1, default=str))
        print(json.dumps(picked, default=str))
        if not a.emit_bench_configs:
            return 0
    if a.emit_bench_configs:
        blockscale = [t for t in targets(a.targets) if t[0] == "triton_fp8_blockscale_gemm_sm90"]
        cfgs = {f"{sd['M']}x{sd['N']}x{sd['K']}": item.config for _, _, sd, item in plan_items(index, blockscale)}
        a.emit_bench_configs.write_text(json.dumps(cfgs, indent=1))
        print(json.dumps(cfgs))
        return 0
    t0 = time.time()
    rows, todo = [], targets(a.targets, a.recipes_first, index.root)
    first = targets(a.first)
    if a.skip_current:
        todo, done = pending(index, [t for t in todo if t not in first])
        rows += done
        print(f"skip-current: {len(done)} shape(s) already measured by the sustained engine, {len(todo)} to run", flush=True)
    todo += [t for t in first if t not in todo]
    manifest = Manifest(a.manifest)
    manifest.reopen(first)
    queue = manifest.merge(valued(index, todo, a.profile, _device_name()))
    # the --first shapes lead, in the order given (a card's shapes together share its processes' start)
    rank = {t: i for i, t in enumerate(first)}
    queue.sort(key=lambda t: rank.get((t["card"], t["shape"]), len(rank)))
    call = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "budget_s": a.budget, "ran": [], "not_run": []}
    manifest.data["calls"].append(call)
    manifest.save()
    print(f"budget {a.budget:g} s: {len(queue)} shape(s) to run, most valuable first", flush=True)
    compiling = None
    if a.compile_cache and queue:
        compiling = compile_in_background(index, queue, a.compile_cache, log=lambda m: print(m, flush=True))
    seen: dict[str, list[float]] = {}
    costs = []
    from skillrun.execute.backends import make_backend
    from skillrun.execute.harness import ExecOptions

    # One pool for the call: each card's sandboxed servers serve all its shapes, and its references' server times
    # the canary when it starts, before the card's accused server does (sessions.py).
    be = make_backend(a.backend)
    with ExecOptions.from_kw({**({"timer": a.timer} if a.timer else {}), "sandbox": a.sandbox}).pool(be) as pool:
        for t in queue:
            elapsed = time.time() - t0
            need = estimate(t["card"], seen, manifest, a)
            if elapsed + need > a.budget:
                t.update(status="not_run", reason=f"budget: {need:.0f} s estimated, {a.budget - elapsed:.0f} s left")
                call["not_run"].append([t["card"], t["shape"]])
                rows.append({"card": t["card"], "shape": t["shape"], "verdict": "not run", "reason": "device-call budget"})
                manifest.save()
                continue
            if compiling is not None:
                _wait_for_compile(compiling[0], (t["card"], t["shape"]), deadline=t0 + a.budget - need)
            ts = time.time()
            t["attempts"] = int(t.get("attempts") or 0) + 1
            try:
                rec = measure(index, t["card"], t["shape"], pool=pool, a=a, left=a.budget - elapsed)
                row = summary(rec, time.time() - ts)
                row["cost"] = rec.get("cost")
                t.update(status="error" if rec.get("verdict") == "error" else "done", verdict=rec.get("verdict"),
                         speedup=rec.get("speedup"), artifact=rec.get("artifact"), cost=rec.get("cost"))
            except Exception as exc:  # one shape's failure is its own row
                row = {"card": t["card"], "shape": t["shape"], "verdict": "error", "reason": f"{type(exc).__name__}: {str(exc)[:400]}",
                       "seconds": round(time.time() - ts, 1)}
                t.update(status="error", reason=row["reason"])
            t["seconds"] = round(time.time() - ts, 2)
            t["first_of_call"] = t["card"] not in seen
            if not t["first_of_call"]:
                seen[t["card"]].append(t["seconds"])
            else:
                seen[t["card"]] = []
            if row.get("cost"):
                costs.append(row["cost"])
            call["ran"].append([t["card"], t["shape"]])
            rows.append(row)
            manifest.save()
            sp, aa, spr = row.get("speedup"), row.get("aa_noise_pct"), row.get("port_spread_pct")
            print(f"{t['card']} {t['shape']}: {row['verdict']} x{sp} aa={aa} spread={spr} pos={row.get('position_effect_pct')} "
                  f"port_ms={row.get('port_median_ms')} {row['seconds']}s value={t.get('value')}", flush=True)
            if a.out:
                a.out.write_text(json.dumps(rows, indent=1, default=str))
    call["seconds"] = round(time.time() - t0, 2)
    call["summary"] = cost_summary(costs)
    if compiling is not None:
        compiling[1].join(timeout=1.0)
        call["compile_ahead"] = compiling[0]["summary"]
    manifest.save()
    left = sum(1 for t in manifest.data["targets"] if t.get("status") != "done")
    print(f"call: {call['seconds']:.0f} s of {a.budget:g}; {len(call['ran'])} shape(s) run, {len(call['not_run'])} left for "
          f"a later call ({left} not done in the manifest); device seconds by phase {json.dumps(call['summary']['device_seconds'])}",
          flush=True)
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1, default=str))
    return 0


def _device_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


def _wait_for_compile(state: dict, target: tuple[str, str], deadline: float) -> None:
    """Let the shape's own kernels finish compiling ahead (the host compiles the next ones meanwhile)."""
    key = state["by_target"].get(target)
    while key is not None and key not in state["done"] and time.time() < deadline:
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
