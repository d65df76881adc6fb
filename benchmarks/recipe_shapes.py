"""Print `--shape` arguments for every recipe shape a card lists (its tests.selects cases), so a
device script can run the runner on all of them: `skill-run run CARD $(python3 benchmarks/recipe_shapes.py CARD)`.

    python3 benchmarks/recipe_shapes.py triton_moe_a16wi4_sm90 --part 1/2    # first half
    python3 benchmarks/recipe_shapes.py triton_fp8_blockscale_gemm_sm90 --untuned

Untuned cases (the card's default recipe) are left out unless --untuned; --part i/n splits the list
into n contiguous parts so each fits in one device call. Reads the card with PyYAML only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def card_cases(card_id: str, untuned: bool = False, root: Path = REPO) -> list[tuple[str, str]]:
    """(shape text, recipe name) of every distinct shape the card's tests.selects cases list, in card order."""
    path = root / "skills" / card_id / "SKILL.md"
    try:
        front = path.read_text().split("---\n", 2)[1]
        card = yaml.safe_load(front)
    except (OSError, IndexError, yaml.YAMLError) as exc:
        raise SystemExit(f"{path}: cannot read the card's front matter ({exc})")
    out, seen = [], set()
    for case in card.get("tests", {}).get("selects", []):
        if case.get("untuned") and not untuned:
            continue
        shape = case["shape"]
        if isinstance(shape, list):
            text = ",".join(str(int(v)) for v in shape)
        else:
            text = ",".join(f"{k}={int(v)}" for k, v in shape.items())
        if text not in seen:
            seen.add(text)
            out.append((text, str(case.get("recipe"))))
    return out


def card_shapes(card_id: str, untuned: bool = False, root: Path = REPO) -> list[str]:
    return [text for text, _ in card_cases(card_id, untuned, root)]


def recipes_first(cases: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The first case of each recipe (in card order), then the rest: a device call whose budget runs
    out part-way has still run every recipe once."""
    firsts, rest, named = [], [], set()
    for case in cases:
        (rest if case[1] in named else firsts).append(case)
        named.add(case[1])
    return firsts + rest


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("card")
    ap.add_argument("--part", default="1/1", help="i/n: the i-th of n contiguous parts")
    ap.add_argument("--untuned", action="store_true", help="include the card's untuned (default-recipe) cases")
    a = ap.parse_args(argv)
    try:
        i, n = (int(x) for x in a.part.split("/"))
        assert 1 <= i <= n
    except (ValueError, AssertionError):
        ap.error(f"--part must be i/n with 1 <= i <= n, got {a.part!r}")
    shapes = card_shapes(a.card, a.untuned)
    size = -(-len(shapes) // n)
    part = shapes[(i - 1) * size:i * size]
    print(" ".join(f"--shape {s}" for s in part))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
