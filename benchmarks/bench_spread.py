"""Which shapes the clean benches time beside the runner in one device call (benchmarks/device_issue39.sh).

    python3 benchmarks/bench_spread.py --defaults          # card:shape words: the runner's --first shapes
    python3 benchmarks/bench_spread.py --validate $OUT/validate.json --json $WORK/spread.json
        # `targets <card:shape ...>` (every shape picked: the runner's configs for them), then one bench
        # invocation a line: `<family> <bench arguments>`

A bench result is only comparable with a runner row of the same shape from the same call, so the shapes
come from the runner's rows (validate.json) when it measured them: per family the default spread first
(the five large block-scale shapes of issues 35/40, two row-wise batched and two a16wi4 MoE shapes, all
recipe shapes and all long enough to compare, >= 50 us port time), then the other measured shapes the
bench can run, longest port time first. Where the runner measured fewer than a family needs (budget,
error, no runner stage), the default spread fills in and the shape is marked measured=false, so the
comparison lists it as bench-only instead of the bench quietly timing nothing.

Only the standard library: this runs on the device before the benches, and in the CPU tests.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CARDS = {"blockscale": "triton_fp8_blockscale_gemm_sm90",
         "rowwise_batched": "triton_fp8_rowwise_batched_gemm_sm90",
         "moe_a16wi4": "triton_moe_a16wi4_sm90"}
FAMILY_OF = {card: fam for fam, card in CARDS.items()}
# The problem keys of each family in the order the cards write them (recipe_shapes.card_cases text).
KEYS = {"blockscale": ("M", "N", "K"), "rowwise_batched": ("batch", "M", "N", "K"),
        "moe_a16wi4": ("tokens", "model_dim", "inter_dim", "experts", "topk", "group_size")}
LARGE = ["4096,65536,1536", "4096,2048,7168", "16384,1536,7168", "16384,7168,768", "8192,8192,8192"]
DEFAULT = {
    "blockscale": LARGE,
    # mid_m and large_m_1024: both >= 50 us on the H200, and one N so that one bench process times both
    # (the bench's --m/--n filter takes their cross product)
    "rowwise_batched": ["batch=16,M=128,N=1280,K=8192", "batch=16,M=1024,N=1280,K=8192"],
    # the decode and prefill recipes of one expert layout and group, so one bench process times both
    "moe_a16wi4": ["tokens=16,model_dim=7168,inter_dim=2048,experts=64,topk=8,group_size=32",
                   "tokens=1024,model_dim=7168,inter_dim=2048,experts=64,topk=8,group_size=32"],
}
COUNT = {"blockscale": 5, "rowwise_batched": 2, "moe_a16wi4": 2}
# What each bench can time (its own shape lists): the row-wise bench filters problem.SHAPES by --m/--n
# (batch 16; K follows N), the MoE bench builds model_dim 7168, topk 8 shapes from --combos/--tokens.
ROWWISE_NK = {1280: 8192, 8192: 1024}
ROWWISE_M = (1, 32, 128, 512, 1024, 4096)
NOT_MEASURED = ("error", "not run", "already measured")


def parse_shape(shape, family: str) -> dict[str, int] | None:
    """A runner row's shape (a dict, or the text of a row that did not run) as {key: int}."""
    try:
        if isinstance(shape, dict):
            return {k: int(shape[k]) for k in KEYS[family]}
        parts = str(shape).split(",")
        if all("=" in p for p in parts):
            d = dict(p.split("=", 1) for p in parts)
            return {k: int(d[k]) for k in KEYS[family]}
        return dict(zip(KEYS[family], (int(p) for p in parts), strict=True))
    except (KeyError, ValueError, TypeError):
        return None


def shape_text(d: dict[str, int], family: str) -> str:
    """The card's own text for a shape (what validate_recipes and the manifest key targets by)."""
    if family == "blockscale":
        return ",".join(str(d[k]) for k in KEYS[family])
    return ",".join(f"{k}={d[k]}" for k in KEYS[family])


def measured(row: dict) -> bool:
    """The runner timed this shape in this call (a verdict with a port time, not a skip or an error)."""
    return row.get("verdict") not in NOT_MEASURED and isinstance(row.get("port_median_ms"), (int, float))


def bench_can_run(d: dict[str, int], family: str) -> bool:
    if family == "rowwise_batched":
        return d["batch"] == 16 and ROWWISE_NK.get(d["N"]) == d["K"] and d["M"] in ROWWISE_M
    if family == "moe_a16wi4":
        return d["model_dim"] == 7168 and d["topk"] == 8
    return True


def pick(rows: list[dict], family: str, n: int | None = None) -> list[dict]:
    """``n`` shapes of ``family`` for the bench: [{shape, measured, port_ms}] (module doc for the order)."""
    n = COUNT[family] if n is None else n
    port_ms: dict[str, float] = {}
    for r in rows:
        if r.get("card") != CARDS[family] or not measured(r):
            continue
        d = parse_shape(r.get("shape"), family)
        if d is not None and bench_can_run(d, family):
            port_ms.setdefault(shape_text(d, family), float(r["port_median_ms"]))
    order = [s for s in DEFAULT[family] if s in port_ms]
    order += sorted((s for s in port_ms if s not in order), key=lambda s: -port_ms[s])
    out = [{"shape": s, "measured": True, "port_ms": port_ms[s]} for s in order[:n]]
    for s in DEFAULT[family]:
        if len(out) >= n:
            break
        if all(o["shape"] != s for o in out):
            out.append({"shape": s, "measured": False, "port_ms": None})
    return out


def invocations(spread: dict[str, list[dict]]) -> list[list[str]]:
    """The bench command lines (family first) that time exactly these shapes, one process per group the
    bench's arguments can express without timing extra shapes."""
    lines: list[list[str]] = [["targets", *(f"{CARDS[fam]}:{p['shape']}" for fam, ps in spread.items() for p in ps)]]
    bs = [parse_shape(p["shape"], "blockscale") for p in spread.get("blockscale", [])]
    if bs:
        lines.append(["blockscale", "--shapes", ",".join(f"{d['M']}x{d['N']}x{d['K']}" for d in bs)])
    by_n: dict[int, list[int]] = {}
    for p in spread.get("rowwise_batched", []):
        d = parse_shape(p["shape"], "rowwise_batched")
        by_n.setdefault(d["N"], []).append(d["M"])
    for nn, ms in by_n.items():
        lines.append(["rowwise_batched", "--n", str(nn), "--m", *(str(m) for m in ms)])
    by_layout: dict[tuple[int, int, int], list[int]] = {}
    for p in spread.get("moe_a16wi4", []):
        d = parse_shape(p["shape"], "moe_a16wi4")
        by_layout.setdefault((d["group_size"], d["experts"], d["inter_dim"]), []).append(d["tokens"])
    for (g, e, i), toks in by_layout.items():
        lines.append(["moe_a16wi4", "--combos", f"{e}x{i}", "--tokens", *(str(t) for t in toks), "--group-size", str(g)])
    return lines


def default_targets() -> list[str]:
    return [f"{CARDS[fam]}:{s}" for fam in CARDS for s in DEFAULT[fam]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--defaults", action="store_true", help="print the default spread as card:shape words and exit")
    ap.add_argument("--validate", type=Path, help="the runner's rows of this call (missing: the default spread)")
    ap.add_argument("--json", type=Path, help="write the spread (shapes, measured or not) here")
    a = ap.parse_args(argv)
    if a.defaults:
        print(" ".join(default_targets()))
        return 0
    rows: list[dict] = []
    if a.validate is not None and a.validate.is_file():
        try:
            rows = json.loads(a.validate.read_text())
        except json.JSONDecodeError as exc:  # a runner stage cut mid-write: the defaults still bench
            print(f"bench_spread: {a.validate} unreadable ({exc}); the default spread", file=sys.stderr)
    spread = {fam: pick(rows, fam) for fam in CARDS}
    lines = invocations(spread)
    if a.json:
        a.json.write_text(json.dumps({"validate": str(a.validate), "spread": spread, "invocations": lines}, indent=1))
    for fam, ps in spread.items():
        unmeasured = [p["shape"] for p in ps if not p["measured"]]
        if unmeasured:
            print(f"bench_spread: {fam}: not measured by the runner in this call, benched from the default spread: "
                  f"{' '.join(unmeasured)}", file=sys.stderr)
    for line in lines:
        print(" ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
