"""The tuner on the CPU: seeded tuner defects, the proposal round trip, workers and Ray.

Every case runs the real harness children (parity gate, sessions with slot integrity) on the toy
fp16 GEMM; timing decisions use the deterministic fake timer of tests/defects/tunable.py.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from defects.kb import card, make_defect_kb
from skillrun.errors import SkillRunError
from skillrun.kb.index import SkillIndex
from skillrun.kb.lint import lint
from skillrun.select import select_recipe
from skillrun.tune.ablate import ablate_shape
from skillrun.tune.artifact import load_tuning_artifact
from skillrun.tune.sweep import tune_shape

SHAPE = {"M": 32, "N": 16, "K": 32}
TIMER = "defects.tunable:fake"
ALL = [8, 16, 32, 48, 64, 128]


def tunable_card(card_id: str, tiles: list[int], when: str = "M >= 100000") -> dict:
    c = card(card_id, "defects.tunable:build")
    r = c["recipes"][0]
    r.update(when=when, config={"tile": 16}, lever="tile: 64 -> 16 (test claim)",
             tunable={"space": {"tile": tiles}})
    r["ablations"] = [{"set": {"tile": 32}, "expect": "not_load_bearing", "claim": "tile 32 is a no-op"}]
    return c


def _kb(tmp_path: Path, cards: list[dict]) -> SkillIndex:
    root = make_defect_kb(tmp_path / "kb", cards)
    index = SkillIndex.load(root)
    assert not index.errors, [str(e) for e in index.errors]
    return index


def run_tune(index, card_id, **kw):
    kw.setdefault("timeout_s", 120)
    kw.setdefault("rounds", 20)
    kw.setdefault("warmup", 1)
    kw.setdefault("seeds", 2)
    return tune_shape(index, card_id, SHAPE, backend="cpu", validation_root=index.root / "validation", **kw)


def statuses(rec) -> dict:
    return {c["config"].get("tile"): c["status"] for c in rec["candidates"] if c["role"] == "candidate"}
