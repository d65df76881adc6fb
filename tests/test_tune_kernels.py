"""A recipe's ``tunable_kernels``: another kernel swept from the same shape class, in the same
sessions as the recipe's own space (the Gluon kernel beside the Triton recipes of the sm_90
block-scale card). CPU, the toy problem and the deterministic fake timer of tests/defects/tunable.py."""
from __future__ import annotations

import itertools
from pathlib import Path

from test_tune import SHAPE, TIMER, _kb, run_tune, tunable_card

from skillrun.kb.index import SkillIndex
from skillrun.lint import lint
from skillrun.kb.tunable import enumerate_candidates, kernel_spaces_of, lint_tunable
from skillrun.plan.select import select_recipe
from skillrun.evidence.tuning_artifact import load_tuning_artifact

REPO = Path(__file__).resolve().parents[1]


def _with_other(card_id: str, tiles: list[int], backend: str = "torch") -> dict:
    c = tunable_card(card_id, [16, 64])
    c["recipes"][0]["tunable_kernels"] = [{"kernel": "defects.tunable:build_other", "backend": backend,
                                           "config": {"tile": 16}, "space": {"tile": tiles}}]
    return c


def test_the_other_kernel_competes_in_the_same_sweep_and_its_win_proposes_that_kernel(tmp_path):
    index = _kb(tmp_path, [_with_other("toy_other", [16, 32])])
    rec = run_tune(index, "toy_other", timer=TIMER, apply=True)
    rows = {c["id"]: c for c in rec["candidates"]}
    other = [c for c in rows.values() if c.get("kernel") == "defects.tunable:build_other"]
    assert sorted(c["config"]["tile"] for c in other) == [16, 32]
    assert all(c["label"].startswith("tunable:build_other: ") for c in other)
    assert rec["verdict"] == "proposed", rec["reason"]
    win = rows[rec["decision"]["winner"]]
    assert win["kernel"] == "defects.tunable:build_other" and win["config"] == {"tile": 32}
    assert rec["decision"]["speedup_vs_incumbent"] > 1.6  # 1.0 / 0.6; the own space's best is 1 / 0.7
    assert rec["space"]["kernels"][0]["knobs"] == {"tile": [16, 32]}
    load_tuning_artifact(Path(rec["artifact"]))
    fresh = SkillIndex.load(index.root)
    assert lint(fresh).ok, [str(e) for e in lint(fresh).errors]
    sel = select_recipe(fresh.skill("toy_other"), SHAPE, {})
    assert sel.recipe.kernel == "defects.tunable:build_other" and sel.recipe.config == {"tile": 32}


def test_an_other_kernel_that_cannot_run_here_is_pruned_with_the_reason(tmp_path):
    index = _kb(tmp_path, [_with_other("toy_gluon", [16, 32], backend="gluon")])
    rec = run_tune(index, "toy_gluon", timer=TIMER)
    other = [c for c in rec["candidates"] if c.get("kernel") == "defects.tunable:build_other"]
    assert len(other) == 2 and all(c["status"] == "pruned" for c in other)
    assert all("not run here" in c["reason"] and "Gluon has no interpreter" in c["reason"] for c in other)
    assert rec["decision"]["winner"] and {c["id"]: c for c in rec["candidates"]}[rec["decision"]["winner"]]["config"] == {"tile": 64}


def test_lint_checks_an_other_kernels_space_against_its_own_schema(tmp_path):
    bad = _with_other("toy_bad_other", [16, 24])
    bad["recipes"][0]["tunable_kernels"][0]["constraints"] = ["tile * warps <= 64"]
    bad["recipes"][0]["tunable_kernels"][0]["config"] = {"tile": 7}
    index = _kb(tmp_path, [bad])
    errs = {e.field: e.reason for e in lint_tunable(index.skill("toy_bad_other"))}
    assert "24" in errs["recipes.0.tunable_kernels.0.space.tile"]
    assert "7" in errs["recipes.0.tunable_kernels.0.config.tile"]
    assert "warps" in errs["recipes.0.tunable_kernels.0.constraints.0"]


def test_the_block_scale_cards_gluon_spaces_only_hold_configs_the_kernel_accepts_and_the_prune_keeps():
    import json

    from skillrun_kernels.fp8_blockscale_gemm import gluon_sm90_ws as g

    card = SkillIndex.load(REPO).skill("triton_fp8_blockscale_gemm_sm90")
    assert lint_tunable(card) == []
    results = Path(g.__file__).parent / "results"
    prunes = sorted(results.glob("gluon_sm90_ws_*_prune.json"), key=lambda p: p.stat().st_mtime)
    assert prunes, "benchmarks/prune_gluon_sm90_ws.py --card triton_fp8_blockscale_gemm_sm90 writes it"
    kept_by_cpu = {name: {json.dumps(c, sort_keys=True) for c in sp["kept"]}
                   for sp in json.loads(prunes[-1].read_text())["spaces"] for name in [sp["recipe"]]}
    seen = 0
    for name in ("prefill_narrow_n_big_m", "prefill_very_wide_n", "prefill_k_light", "prefill_default"):
        assert card.recipe(name).backend == "triton"  # no recipe switched to Gluon without measurements
        (ks,) = kernel_spaces_of(card, name)
        assert ks.kernel.endswith("gluon_sm90_ws:build") and ks.backend == "gluon"
        kept, pruned = enumerate_candidates(ks.config, ks.space, {"M": 4096, "N": 4096, "K": 4096}, {})
        assert all("max_candidates" not in why for _, why in pruned)
        for cfg in kept:
            g.Config.from_dict(cfg).check()  # nothing the tuner would build fails the kernel's own rules
            # ... and the CPU prune (spills, wgmma serialisation, lost overlap) kept it before device time
            assert json.dumps(cfg, sort_keys=True) in kept_by_cpu[name], (name, cfg)
        seen += len(kept)
        knobs = ks.space.knobs
        assert set(knobs) == {"cluster_m", "epilogue_overlap", "stages", "BN", "async_depth"}
        assert len(list(itertools.product(*knobs.values()))) == ks.space.size
    assert seen > 0