"""Runner vs bench on the same shapes, same device run: do the two agree within the A/A noise?

    python3 benchmarks/compare_runner_bench.py --validate $OUT/validate.json \\
        --bench fp8bs.json --bench rowwise_1280.json --bench moe_64x2048.json --out $OUT/runner_vs_bench.json

Each ``--bench`` file is one of benchmarks/bench_fp8_blockscale_sm90.py (block-scale GEMM),
bench_fp8_rowwise_batched_sm90.py (row-wise batched) or bench_moe_a16wi4_sm90.py (a16wi4 MoE); the
family is read from each table row's shape. For every shape either side measured, one row:

- the bench variant: with ``--runner-configs`` (validate_recipes.py --emit-configs) the first port
  variant the bench timed (the port, its levers, the split-K kernel) whose config has every knob of the
  runner's recipe, so both sides time the same kernel; else the port, with ``same_config`` false/null;
- the reference: the first of the runner row's references (its baseline first) with a measured ratio
  that the bench also timed, named in the row (``reference``); the bench's ratio for it is its
  graph-replay ratio (block-scale: ``speedup_vs_<ref>``; row-wise and MoE: ``speedup[<ref>_graph]``,
  else, for a reference that cannot be captured, ``<ref>_eager_vs_port_graph``, named in ``bench_key``).
  Both ratios are reference time / port time. The other references both timed are in ``others``.
- ``diff_pct`` = 100 (runner ratio / bench ratio - 1), and the status:
  ``agree``       |diff| <= the tolerance: 3 %, or the runner's A/A floor (``aa_noise_pct``) where larger;
  ``disagree``    beyond it;
  ``too_short``   the port runs under 50 us (the runner's median, else the bench's): the two harnesses'
                  launch overheads differ by more than 3 % there, so it is not compared, nor passed;
  ``runner_only`` / ``bench_only``  measured by one side only (the other's verdict or error is noted);
  ``no_common_reference``  both measured it, but no reference has a ratio on both sides.
Runner rows of cards no bench covers are listed as ``runner_only`` too; rows the runner did not measure
in this call (not run, already measured, errors) appear only where a bench timed the shape.

Out (``--out``): {"rule", "rows", "summary"}. Exit 1 if any row disagrees, else 0 (missing bench files
are reported in ``summary.missing_inputs``: a bench cut by its time limit leaves runner-only rows).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spread import FAMILY_OF, KEYS, measured, parse_shape, shape_text  # noqa: E402

TOL_PCT = 3.0
MIN_PORT_MS = 0.05
RULE = (f"agree: |runner ratio / bench ratio - 1| <= max({TOL_PCT:g} %, the runner's A/A noise); "
        f"port time < {MIN_PORT_MS * 1e3:g} us: too_short (not compared)")


def bench_family(row: dict) -> str | None:
    s = row.get("shape")
    if isinstance(s, list) and len(s) == 3:
        return "blockscale"
    if isinstance(s, dict):
        return "moe_a16wi4" if "tokens" in s else "rowwise_batched" if "batch" in s else None
    return None


def _num(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def bench_view(row: dict, family: str) -> dict:
    """What the comparison needs from one bench table row: per port variant (the port, and the levers or
    the split-K kernel the bench times beside it) its config, time and ratio to each reference; the A/A."""
    if family == "blockscale":
        slots = row.get("slots") or {}
        ratios = {k[len("speedup_vs_"):]: (v, k) for k, v in row.items() if k.startswith("speedup_vs_") and _num(v)}
        rep = row.get("port_repeat_ratio")
        return {"variants": {"port": {"config": row.get("config"), "port_ms": (slots.get("port") or {}).get("ms"), "ratios": ratios}},
                "error": row.get("error"), "aa_pct": round(abs(rep - 1.0) * 100, 3) if _num(rep) else None}
    sp = row.get("speedup") or {}
    impls = row.get("impls") or {}
    refs = [n for n in impls if not n.startswith("port")]
    variants = {}
    for v in [n for n in impls if n.startswith("port") and n != "port_again"]:
        prefix = "" if v == "port" else f"{v}_vs_"
        ratios: dict[str, tuple[float, str]] = {}
        for ref in refs:
            for k in (f"{prefix}{ref}_graph", *((f"{ref}_eager_vs_port_graph",) if v == "port" else ())):
                if _num(sp.get(k)):  # graph replay as the runner times; an uncapturable reference eagerly
                    ratios[ref] = (sp[k], k)
                    break
        variants[v] = {"config": impls[v].get("config"), "port_ms": impls[v].get("graph_ms"), "ratios": ratios}
    port = impls.get("port") or {}
    again = (impls.get("port_again") or {}).get("graph_ms")
    aa = round(abs(again / port["graph_ms"] - 1.0) * 100, 3) if _num(again) and _num(port.get("graph_ms")) else None
    return {"variants": variants, "error": row.get("error") or port.get("error"), "aa_pct": aa}


def same_config(runner: dict | None, bench: dict | None) -> bool | None:
    """Every knob the runner's recipe sets has the same value in the bench variant's config (the bench's
    describe fills in defaults the recipe leaves out); None when either is unknown."""
    if runner is None or bench is None:
        return None
    return all(bench.get(k) == v for k, v in runner.items())


def pick_variant(b: dict, runner_cfg: dict | None) -> tuple[str, bool | None]:
    """The bench variant that times the runner's kernel: the first whose config matches the runner's
    (the port first), else the port, flagged as another config."""
    for name, v in b["variants"].items():
        if runner_cfg is not None and same_config(runner_cfg, v["config"]):
            return name, True
    return "port", same_config(runner_cfg, (b["variants"].get("port") or {}).get("config"))


def load_bench(paths: list[Path]) -> tuple[dict[tuple[str, str], dict], list[str]]:
    by_shape: dict[tuple[str, str], dict] = {}
    missing = []
    for p in paths:
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            missing.append(f"{p}: {type(exc).__name__}")
            continue
        winners = data.get("winners") or {}  # the block-scale bench's config per MxNxK (--configs: the runner's)
        for row in data.get("table") or []:
            fam = bench_family(row)
            if fam == "blockscale" and "config" not in row:
                row = {**row, "config": winners.get("x".join(map(str, row["shape"])))}
            d = parse_shape(row.get("shape") if fam != "blockscale" else ",".join(map(str, row["shape"])), fam) if fam else None
            if d is None:
                continue
            by_shape[(fam, shape_text(d, fam))] = {**bench_view(row, fam), "file": p.name}
    return by_shape, missing


def runner_ratios(row: dict) -> list[tuple[str, float, bool | None, bool | None]]:
    """(name, ratio, production, parity) of each reference the runner timed, in the row's order."""
    out = []
    for r in row.get("references") or []:
        sp = r.get("speedup")
        if isinstance(sp, (int, float)) and sp > 0 and r.get("status") in (None, "ok"):
            out.append((r.get("name"), float(sp), r.get("production"), r.get("parity")))
    return out


def compare(rows: list[dict], bench: dict[tuple[str, str], dict],
            configs: dict[tuple[str, str], dict] | None = None) -> tuple[list[dict], int]:
    """The rows (module doc) and how many disagree. ``configs``: (family, shape) -> the runner's recipe
    config (validate_recipes.py --emit-configs), to find the bench variant that times the same kernel."""
    configs = configs or {}
    runner: dict[tuple[str, str], dict] = {}
    not_measured: dict[tuple[str, str], dict] = {}
    for r in rows:
        card = r.get("card")
        fam = FAMILY_OF.get(card, card)
        d = parse_shape(r.get("shape"), fam) if fam in KEYS else None
        raw = r.get("shape")
        text = ",".join(f"{k}={v}" for k, v in raw.items()) if isinstance(raw, dict) else str(raw)  # a card no bench covers
        key = (fam, shape_text(d, fam) if d is not None else text)
        (runner if measured(r) else not_measured)[key] = r
    out: list[dict] = []
    for key, r in runner.items():
        fam, shape = key
        row = {"family": fam, "card": r.get("card"), "shape": shape, "recipe": r.get("recipe"),
               "aa_noise_pct": r.get("aa_noise_pct"), "port_ms": r.get("port_median_ms"),
               "port_spread_pct": r.get("port_spread_pct"), "runner_verdict": r.get("verdict")}
        b = bench.get(key)
        if b is None or not any(v["ratios"] for v in b["variants"].values()):
            note = ("no bench of this card in this comparison" if fam not in KEYS else
                    f"the bench failed on this shape: {str(b['error'])[:200]}" if b is not None else "the bench did not time this shape")
            out.append({**row, "status": "runner_only", "agree": None, "note": note})
            continue
        variant, same = pick_variant(b, configs.get(key))
        v = b["variants"].get(variant) or {"ratios": {}, "port_ms": None, "config": None}
        row.update(bench_variant=variant, same_config=same, runner_config=configs.get(key), bench_config=v["config"],
                   bench_port_ms=v["port_ms"], bench_aa_pct=b["aa_pct"], bench_file=b["file"])
        common = [(n, rr, prod, par) for n, rr, prod, par in runner_ratios(r) if n in v["ratios"]]
        if not common:
            out.append({**row, "status": "no_common_reference", "agree": None,
                        "runner_references": [x[0] for x in runner_ratios(r)], "bench_references": sorted(v["ratios"])})
            continue
        diffs = [{"reference": n, "production": prod, "runner_parity": par, "runner_ratio": rr,
                  "bench_ratio": round(v["ratios"][n][0], 4), "bench_key": v["ratios"][n][1],
                  "diff_pct": round(100.0 * (rr / v["ratios"][n][0] - 1.0), 2)} for n, rr, prod, par in common]
        first = diffs[0]
        tol = max(TOL_PCT, float(r.get("aa_noise_pct") or 0.0))
        port_ms = r.get("port_median_ms") if _num(r.get("port_median_ms")) else v["port_ms"]
        if not _num(port_ms) or port_ms < MIN_PORT_MS:
            status, agree = "too_short", None
        else:
            agree = abs(first["diff_pct"]) <= tol
            status = "agree" if agree else "disagree"
        out.append({**row, **first, "tolerance_pct": round(tol, 3), "status": status, "agree": agree, "others": diffs[1:]})
    for key, b in bench.items():
        if key in runner:
            continue
        fam, shape = key
        r = not_measured.get(key) or {}
        why = (f"runner: {r.get('verdict')}" + (f" ({r.get('reason')})" if r.get("reason") else "")) if r else \
            "not among the runner's rows of this call"
        port = b["variants"].get("port") or {"ratios": {}, "port_ms": None}
        out.append({"family": fam, "card": next((c for c, f in FAMILY_OF.items() if f == fam), None), "shape": shape,
                    "status": "bench_only", "agree": None, "bench_port_ms": port["port_ms"], "bench_aa_pct": b["aa_pct"],
                    "bench_file": b["file"], "bench_ratios": {n: round(x, 4) for n, (x, _) in port["ratios"].items()},
                    "bench_error": b["error"], "note": why})
    bad = sum(1 for o in out if o["status"] == "disagree")
    return out, bad


def load_configs(path: Path | None) -> dict[tuple[str, str], dict]:
    if path is None:
        return {}
    try:
        entries = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    out = {}
    for e in entries:
        fam = FAMILY_OF.get(e.get("card"))
        d = parse_shape(e.get("shape"), fam) if fam else None
        if d is not None and isinstance(e.get("config"), dict):
            out[(fam, shape_text(d, fam))] = e["config"]
    return out


def summarize(out: list[dict], missing: list[str], not_in_call: int) -> dict:
    by: dict[str, dict[str, int]] = {}
    for o in out:
        fam = by.setdefault(o["family"], {})
        fam[o["status"]] = fam.get(o["status"], 0) + 1
    counts: dict[str, int] = {}
    for o in out:
        counts[o["status"]] = counts.get(o["status"], 0) + 1
    return {"counts": counts, "by_family": by, "missing_inputs": missing, "runner_rows_not_measured": not_in_call}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--validate", type=Path, required=True, help="the runner's rows (validate_recipes.py --out)")
    ap.add_argument("--bench", type=Path, action="append", default=[], help="a bench's JSON (repeatable; any of the three)")
    ap.add_argument("--runner-configs", type=Path,
                    help="validate_recipes.py --emit-configs JSON: the runner's config per shape (which bench variant to compare)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    missing: list[str] = []
    try:
        rows = json.loads(a.validate.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        rows, missing = [], [f"{a.validate}: {type(exc).__name__}"]
    bench, miss = load_bench(a.bench)
    out, bad = compare(rows, bench, load_configs(a.runner_configs))
    summary = summarize(out, missing + miss, sum(1 for r in rows if not measured(r)))
    for o in out:
        s = o["shape"]
        if "reference" in o:
            print(f"{o['family']} {s}: vs {o['reference']} runner {o['runner_ratio']:.4f}x bench {o['bench_ratio']:.4f}x "
                  f"({o['bench_variant']}, same config: {o['same_config']}) diff {o['diff_pct']:+.2f}% "
                  f"(tol {o['tolerance_pct']:.2f}%, port {o['port_ms']} ms) {o['status'].upper()}")
        else:
            print(f"{o['family']} {s}: {o['status'].upper()} {o.get('note', '')}")
    print(json.dumps(summary))
    if a.out:
        a.out.write_text(json.dumps({"rule": RULE, "rows": out, "summary": summary}, indent=1, default=str))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
