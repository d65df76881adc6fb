"""Keep one card's items of a plan (`skill-run plan --json`), for `skill-run e2e --plan`.

    python3 benchmarks/plan_filter.py plan.json --card triton_moe_fp8_blockscale_sm90 --out plan_moe.json

A workload's trace can match several cards (a MoE layer's glue beside its GEMMs); an e2e run meant to
show one card's effect routes only that card's items. Exit 0 with the filtered plan written when the
card has at least one item with a recipe and a shape, 4 (the runner's "no card matched") when it has
none, 3 when the plan cannot be read. Prints one line saying which.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def only_card(plan: dict, card: str) -> dict:
    """The plan with only ``card``'s runnable items (a recipe and a shape), otherwise as it came:
    ``skill-run e2e --plan`` (skillrun.api.load_plan) reads `plan --json` and the analysis's plan alike."""
    if isinstance(plan, dict) and "plan" in plan and "items" not in plan:
        plan = plan["plan"]  # `skill-run --profile T --json`
    if not isinstance(plan, dict) or not isinstance(plan.get("items"), list):
        raise ValueError("not a plan: no 'items' list")
    items = [it for it in plan["items"] if isinstance(it, dict) and it.get("skill_id") == card
             and it.get("recipe") and it.get("shape")]
    return {**plan, "items": items}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("--card", required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        kept = only_card(json.loads(a.plan.read_text()), a.card)
    except (OSError, ValueError) as exc:
        print(f"{a.plan}: cannot read the plan ({exc})")
        return 3
    if not kept["items"]:
        print(f"{a.plan}: no runnable item of {a.card} (the trace did not match it, or no shape was resolved)")
        return 4
    a.out.write_text(json.dumps(kept, indent=1) + "\n")
    shapes = [it["shape"] for it in kept["items"]]
    print(f"{a.out}: {len(shapes)} item(s) of {a.card}: {shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
