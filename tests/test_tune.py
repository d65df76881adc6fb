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
from skillrun.lint import lint
from skillrun.plan.select import select_recipe
from skillrun.tune.ablate import ablate_shape
from skillrun.evidence.tuning_artifact import load_tuning_artifact
from skillrun.tune.sweep import tune_shape

SHAPE = {"M": 32, "N": 16, "K": 32}
TIMER = "defects.tunable:fake"
ALL = [8, 16, 32, 48, 64, 96, 128]


def tunable_card(card_id: str, tiles: list[int], when: str = "M >= 100000") -> dict:
    c = card(card_id, "defects.tunable:build")
    r = c["recipes"][0]
    r.update(when=when, config={"tile": 16}, lever="tile: 16 -> 64 is load-bearing (test claim)",
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


# ---------------------------------------------------------------------------------------- seeded defects

@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One sweep over every seeded defect with two local workers (one is killed by a candidate). The
    sandbox keeps a candidate from killing its worker (it cannot see it): this sweep runs without it, to
    exercise the recovery from a worker that dies under a candidate (an OOM kill, a driver crash)."""
    index = _kb(tmp_path_factory.mktemp("tune"), [tunable_card("toy_tune", ALL)])
    rec = run_tune(index, "toy_tune", timer=TIMER, workers=2, apply=True, sandbox="off")
    return index, rec


def test_every_defect_is_kept_with_its_reason_and_none_counts_as_a_loss(swept):
    _, rec = swept
    st = statuses(rec)
    assert st[8] == "parity_failed"  # fast (cost 0.2) but wrong: never timed, never the winner
    assert st[48] == "raised" and "seeded: a candidate that raises" in _row(rec, 48)["reason"]
    assert st[128] == "worker_died" and "rebuilt" in _row(rec, 128)["reason"]
    assert st[96] == "crashed" and "SIGSEGV" in _row(rec, 96)["reason"]
    assert st[64] == "survivor" and st[32] == "survivor"
    assert rec["workers"]["engine"] == "local" and len(rec["workers"]["lanes"]) == 2
    assert rec["workers"]["rebuilt"] >= 1
    # The candidates after the dead worker still ran: both lanes produced results.
    assert {_row(rec, t)["lane"] for t in (16, 32, 64)} <= {0, 1}
    assert all(_row(rec, t).get("sweep") is None for t in (8, 48, 96, 128))  # failures are not timed


def test_winner_beats_the_incumbent_beyond_noise_in_a_fresh_recheck(swept):
    _, rec = swept
    assert rec["verdict"] == "proposed", rec["reason"]
    win = {c["id"]: c for c in rec["candidates"]}[rec["decision"]["winner"]]
    assert win["config"] == {"tile": 64}
    assert rec["decision"]["speedup_vs_incumbent"] == pytest.approx(1 / 0.7, rel=1e-3)
    assert rec["decision"]["noise_pct"] > 2.0  # the fake A/A floor
    assert rec["recheck"]["aa_slot"] == "incumbent" and "baseline" in rec["recheck"]["slots"]
    assert rec["recheck"]["integrity"][win["id"]]["passed"]
    back = load_tuning_artifact(Path(rec["artifact"]))
    assert back["decision"]["winner"] == rec["decision"]["winner"]
    assert len(back["candidates"]) == len(rec["candidates"])


def test_applied_proposal_passes_lint_and_the_plan_selects_it(swept):
    index, rec = swept
    assert rec["proposal"]["applied"] and rec["diff"].startswith("--- a/skills/toy_tune/SKILL.md")
    assert "validation/_tuning/toy_tune/" in rec["diff"]  # the recipe cites its evidence
    fresh = SkillIndex.load(index.root)
    rep = lint(fresh)
    assert rep.ok, [str(e) for e in rep.errors]
    sel = select_recipe(fresh.skill("toy_tune"), SHAPE, {})
    assert sel.recipe.name == rec["proposal"]["recipe_name"] and not sel.untuned
    assert sel.recipe.config == {"tile": 64}


def test_a_win_inside_the_noise_floor_is_not_proposed(tmp_path):
    index = _kb(tmp_path, [tunable_card("toy_noise", [16, 32])])
    before = Path(index.skill("toy_noise").path).read_text()
    rec = run_tune(index, "toy_noise", timer=TIMER, apply=True)
    assert rec["verdict"] == "no_win", rec["reason"]
    assert "within noise" in rec["reason"] and rec["diff"] is None and rec["proposal"] is None
    assert Path(index.skill("toy_noise").path).read_text() == before


def test_without_a_timer_nothing_is_proposed_and_failures_are_still_recorded(tmp_path):
    index = _kb(tmp_path, [tunable_card("toy_untimed", [8, 16, 64])])
    rec = run_tune(index, "toy_untimed")
    assert rec["verdict"] == "not_timed" and rec["timing"] is None
    assert statuses(rec) == {8: "parity_failed", 16: "survivor", 64: "survivor"}


def _row(rec, tile):
    return next(c for c in rec["candidates"] if c["role"] == "candidate" and c["config"].get("tile") == tile)


# ---------------------------------------------------------------------------------------- ablate

def test_ablation_within_noise_confirms_a_no_op_claim(tmp_path):
    index = _kb(tmp_path, [tunable_card("toy_abl", [16])])
    rec = ablate_shape(index, "toy_abl", SHAPE, ["tile=32"], backend="cpu", timer=TIMER, rounds=20, warmup=1, seeds=2,
                       timeout_s=120, validation_root=index.root / "validation")
    ab = rec["ablation"]
    assert rec["verdict"] == "not_load_bearing" and ab["direction"] == "within_noise"
    assert ab["claim"]["expect"] == "not_load_bearing" and ab["agrees_with_card"] is True
    load_tuning_artifact(Path(rec["artifact"]))


def test_ablation_outside_noise_refutes_a_wrong_claim(tmp_path):
    index = _kb(tmp_path, [tunable_card("toy_abl2", [16])])
    # The lever text claims `tile: 16 -> 64` is load-bearing (64 slower); measured: 64 is faster, the claim is refuted.
    rec = ablate_shape(index, "toy_abl2", SHAPE, {"tile": 64}, backend="cpu", timer=TIMER, rounds=20, warmup=1, seeds=2,
                       timeout_s=120, validation_root=index.root / "validation")
    ab = rec["ablation"]
    assert ab["load_bearing"] is True and ab["direction"] == "ablated_faster"
    assert ab["ratio_ablated_over_recipe"] == pytest.approx(0.7, rel=1e-3)
    assert ab["claim"]["source"] == "lever" and ab["agrees_with_card"] is False and "REFUTES" in rec["reason"]


def test_ablating_to_a_config_that_fails_parity_is_reported_not_timed(tmp_path):
    index = _kb(tmp_path, [tunable_card("toy_abl3", [16])])
    rec = ablate_shape(index, "toy_abl3", SHAPE, {"tile": 8}, backend="cpu", timer=TIMER, rounds=10, warmup=1, seeds=2,
                       timeout_s=120, write=False)
    assert rec["verdict"] == "ablated_failed" and rec["ablation"]["direction"] == "not_timed"


def test_ablate_on_the_cpu_runs_the_proxy_shape_like_run(tmp_path):
    """A production shape in the interpreter takes hours; ablate, like run, shrinks it and says so."""
    index = _kb(tmp_path, [tunable_card("toy_abl4", [16])])
    big = {"M": 65536, "N": 16, "K": 32}
    rec = ablate_shape(index, "toy_abl4", big, {"tile": 8}, backend="cpu", timer=TIMER, rounds=10, warmup=1, seeds=1,
                       timeout_s=120, validation_root=index.root / "validation")
    assert rec["shape"] == big and rec["proxy_shape"] == {"M": 256, "N": 16, "K": 32}
    assert any("proxy shape M=256" in n for n in rec["notes"])
    assert load_tuning_artifact(Path(rec["artifact"]))["proxy_shape"] == rec["proxy_shape"]  # schema-valid on disk


# ---------------------------------------------------------------------------------------- lint

def test_lint_checks_the_space_against_the_kernel_config_schema(tmp_path):
    bad = tunable_card("toy_badspace", [16, 24])
    bad["recipes"][0]["tunable"]["constraints"] = ["tile * warps <= 64"]
    bad["recipes"][0]["ablations"] = [{"set": {"tiles": 8}, "expect": "load_bearing"}]
    index = _kb(tmp_path, [bad])
    errs = {e.field: e.reason for e in lint(index).errors}
    assert "24" in errs["recipes.0.tunable.space.tile"]
    assert "warps" in errs["recipes.0.tunable.constraints.0"]
    assert "not a config key" in errs["recipes.0.ablations.0.set"]


def test_the_real_cards_spaces_lint_clean():
    from skillrun.kb.tunable import lint_tunable

    index = SkillIndex.load()
    for cid in ("triton_fp8_rowwise_batched_gemm_sm90", "triton_fp8_blockscale_gemm_sm90", "flydsl_fp8_blockscale_gemm"):
        assert lint_tunable(index.skill(cid)) == []


# ---------------------------------------------------------------------------------------- Triton interpreter

def test_sweep_of_a_triton_space_in_the_interpreter(tmp_path):
    c = card("toy_triton_tune", "defects.toy_triton:build", backend="triton")
    c["recipes"][0].update(config={"BM": 16, "BN": 16, "BK": 16, "num_warps": 1, "num_stages": 1},
                           tunable={"space": {"BN": [16, 32], "BK": [16, 32]}, "constraints": ["BN * BK <= 512"]})
    (tmp_path / "kb").mkdir()
    index = _kb(tmp_path, [c])
    # The Triton toy declares no CONFIG_SCHEMA: lint says so (the tuner still runs, the space is the card's word).
    assert any("declares no literal CONFIG_SCHEMA" in e.reason for e in lint(index).errors)
    rec = tune_shape(index, "toy_triton_tune", {"M": 16, "N": 32, "K": 32}, backend="cpu", seeds=1, timeout_s=300,
                     validation_root=index.root / "validation")
    rows = {tuple(sorted(r["config"].items())): r for r in rec["candidates"] if r["role"] == "candidate"}
    assert len(rows) == 4
    pruned = [r for r in rows.values() if r["status"] == "pruned"]
    assert len(pruned) == 1 and "BN * BK <= 512" in pruned[0]["reason"]
    assert all(r["status"] == "survivor" for r in rows.values() if r["status"] != "pruned")
    assert rec["verdict"] == "not_timed"


# ---------------------------------------------------------------------------------------- Ray

def test_ray_pool_with_a_worker_killed_mid_sweep(tmp_path):
    ray = pytest.importorskip("ray")
    index = _kb(tmp_path, [tunable_card("toy_ray", [16, 128, 32, 64])])
    ray.init(num_cpus=2, resources={"tune_slot": 2}, include_dashboard=False, log_to_driver=False)
    try:
        rec = run_tune(index, "toy_ray", timer=TIMER, ray_address="local", ray_resources={"tune_slot": 1}, ray_num_gpus=0,
                       sandbox="off")  # (a candidate kills its worker: see `swept`)
    finally:
        ray.shutdown()
    assert rec["workers"]["engine"] == "ray"
    st = statuses(rec)
    assert st[128] == "worker_died" and "Ray" in _row(rec, 128)["reason"], _row(rec, 128)["reason"]
    assert st[16] == st[32] == st[64] == "survivor"  # candidates after the dead worker still ran
    assert rec["verdict"] == "proposed" and _row(rec, 64)["id"] == rec["decision"]["winner"]


# ---------------------------------------------------------------------------------------- CLI

def test_cli_tune_apply_then_lint_and_ablate(tmp_path):
    import json

    from click.testing import CliRunner

    from skillrun.cli.entry import build_cli

    app = build_cli()  # the real command group: every registered command, --kb/--json anywhere
    index = _kb(tmp_path, [tunable_card("toy_cli", [16, 48, 64])])
    root = str(index.root)
    r = CliRunner().invoke(app, ["--kb", root, "tune", "toy_cli", "--shape", "32,16,32", "--backend", "cpu", "--timer", TIMER,
                                 "--rounds", "20", "--seeds", "1", "--timeout", "120", "--apply", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    import jsonschema

    jsonschema.validate(doc, json.loads((Path(__file__).resolve().parents[1] / "schemas" / "cli-results.schema.json").read_text()))
    (rec,) = doc["results"]
    assert rec["verdict"] == "proposed" and rec["proposal"]["applied"]
    assert {c["status"] for c in rec["candidates"] if c["config"] == {"tile": 48}} == {"raised"}
    assert CliRunner().invoke(app, ["--kb", root, "lint"]).exit_code == 0
    # A bad --set is a usage error (exit 2) with one line naming the problem.
    r = CliRunner().invoke(app, ["--kb", root, "ablate", "toy_cli", "--shape", "32,16,32", "--backend", "cpu", "--set", "tile"])
    assert r.exit_code == 2 and "knob=value" in r.output


def test_many_candidates_raising_the_same_error_is_flagged_as_a_tuner_bug(tmp_path):
    index = _kb(tmp_path, [tunable_card("toy_same", [16, 48])])
    rec = run_tune(index, "toy_same", seeds=1)
    assert statuses(rec)[48] == "raised"
    assert any("suspect the tuner" in n for n in rec.get("notes", []))


# ---------------------------------------------------------------------------------------- --from-plan

def test_from_plan_tunes_only_the_untuned_items(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import skillrun.api as api_mod
    from skillrun.models import PlanItem
    from skillrun.tune import sweep

    def item(shape, untuned):
        return PlanItem(skill_id="toy", kernel="k", pct_gpu=10.0, shape=shape, shape_provenance="trace", recipe="only",
                        untuned=untuned, kernel_ref="m:f", backend="torch", config={}, lever="x", loses=[],
                        references={}, tolerance={}, expected_speedup=1.0, notes=[])

    items = [item({"M": 1, "N": 2, "K": 3}, True), item({"M": 4, "N": 5, "K": 6}, False), item({"M": 1, "N": 2, "K": 3}, True),
             item({"M": 7, "N": 8, "K": 9}, True)]
    monkeypatch.setattr(api_mod, "analyze", lambda *a, **k: SimpleNamespace(plan=SimpleNamespace(items=items)))
    calls = []
    monkeypatch.setattr(sweep, "tune_shape", lambda index, sid, shape, **kw: calls.append((sid, shape)) or {"verdict": "x"})
    out = api_mod.tune_from_plan(None, tmp_path / "trace.json")
    assert calls == [("toy", {"M": 1, "N": 2, "K": 3}), ("toy", {"M": 7, "N": 8, "K": 9})] and len(out) == 2


def test_a_timed_out_candidate_is_classified_as_timeout_not_as_a_loss():
    from skillrun.tune.session import classify

    st, why = classify({"status": "error", "error": "timed out after 5 s (hang?); child killed", "fault": "timeout"})
    assert st == "timeout" and "timed out" in why
    assert classify({"status": "error", "error": "CompilationError: at 3:4: bad"})[0] == "compile_failed"
    st, why = classify({"status": "error", "error": "AcceleratorError: CUDA error: an illegal memory access was encountered"})
    assert st == "crashed" and why.startswith("GPU fault")


# ---------------------------------------------------------------------------------------- agent tools

def test_agent_tools_tune_and_ablate_call_the_same_api(tmp_path):
    from skillrun.agent.tools import AgentTools, tool_specs

    index = _kb(tmp_path, [tunable_card("toy_agent", [16, 8])])
    specs = {s.name: s for s in tool_specs(AgentTools(index, gpu_probe=lambda: None))}
    # No GPU and no backend='cpu': the tool says why instead of running.
    res = specs["tune_skill"].run(skill_id="toy_agent", shapes=["32,16,32"])
    assert res["ok"] is False and "no GPU" in res["error"]
    res = specs["tune_skill"].run(skill_id="toy_agent", shapes=["32,16,32"], backend="cpu", rounds=10)
    assert res["ok"], res
    (row,) = res["results"]
    assert row["verdict"] == "not_timed" and row["candidates_by_status"] == {"survivor": 1, "parity_failed": 1}
    assert row["artifact"].startswith("validation/_tuning/toy_agent/")
    bad = specs["ablate_skill"].run(skill_id="toy_agent", shape="32,16,32", set={"tile": 24}, backend="cpu")
    assert bad["ok"] is False and "24" in bad["error"]


# ---------------------------------------------------------------------------------------- real card text

def test_proposal_inserts_into_the_real_rowwise_card_and_applies_cleanly(tmp_path):
    """The text insertion on a real card (2-space indents, comments, flow maps) keeps lint green and
    makes selection pick the new recipe for exactly that shape; the record is a hand-made decision."""
    import shutil

    from skillrun.tune import proposal as P

    repo = Path(__file__).resolve().parents[1]
    root = tmp_path / "kb"
    for sub in ("skills", "schemas", "facts", "validation", "kernels"):
        shutil.copytree(repo / sub, root / sub)
    index = SkillIndex.load(root)
    cid = "triton_fp8_rowwise_batched_gemm_sm90"
    c = index.skill(cid)
    shape = {"batch": 16, "M": 8192, "N": 8192, "K": 1024}
    assert select_recipe(c, shape, {}, "sm_90").untuned
    win = {"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 16, "num_warps": 8, "num_stages": 3,
           "precise_acc": None, "w_layout": "nk"}
    rec = {"shape": shape, "device": {"name": "test"}, "runner": {"git_revision": "0" * 40},
           "recipe": {"name": "untuned_regime_default", "config": {},
                      "why": "the card's default (UNTUNED shape); sweep starts from wide_n_prefill_keep_baseline: nearest"},
           "candidates": [{"id": "c3", "label": "GROUP_M=16", "config": win}],
           "decision": {"winner": "c3", "speedup_vs_incumbent": 1.2, "speedup_vs_baseline": None, "noise_pct": 1.5},
           "recheck": {"slots": ["incumbent", "c3"], "ratio_vs_incumbent": {"c3": 1.2}, "stats": {}},
           "timing": {"method": "test"}}
    prop = P.propose(index, c, rec, "validation/_tuning/x.yaml", {}, "sm_90")
    diff = P.unified_diff(c, prop)
    assert diff.count("\n+  - name: ") == 1
    # The one removed line is the case that pinned this shape as untuned; it now expects the new recipe.
    removed = [ln for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert removed == ["-    - {shape: {batch: 16, M: 8192, N: 8192, K: 1024}, recipe: untuned_regime_default, untuned: true}"]
    P.apply(index, c, prop, shape, {}, "sm_90")
    from skillrun.lint import lint_card

    fresh = SkillIndex.load(root)
    assert not fresh.errors and lint_card(fresh.skill(cid), fresh) == []
    sel = select_recipe(fresh.skill(cid), shape, {}, "sm_90")
    assert sel.recipe.name == prop.recipe_name and sel.recipe.config == win and not sel.untuned
    other = dict(shape, M=4096)
    assert select_recipe(fresh.skill(cid), other, {}, "sm_90").recipe.name == "wide_n_prefill_keep_baseline"


def test_tune_starts_from_a_compile_prune_artifact(tmp_path):
    from skillrun.evidence.tuning_artifact import write_tuning
    from skillrun.tune.task import base_record
    from skillrun.execute.backends import make_backend

    index = _kb(tmp_path, [tunable_card("toy_from", ALL)])
    c = index.skill("toy_from")
    pr = base_record("compile_prune", c, SHAPE, make_backend("cpu"),
                     {"name": "only", "untuned": True, "kernel": "defects.tunable:build", "backend": "torch", "config": {"tile": 16}},
                     "test")
    pr.update(verdict="pruned", reason="hand-made for the test", candidates=[
        {"id": "incumbent", "config": {"tile": 16}, "status": "compile_verified", "reason": "ok"},
        {"id": "c1", "config": {"tile": 64}, "status": "compile_verified", "reason": "ok"},
        {"id": "c2", "config": {"tile": 8}, "status": "gate_failed", "reason": "VGPR spills 12 > 0"}])
    path = write_tuning(pr, index.root / "validation")
    rec = run_tune(index, "toy_from", timer=TIMER, start_from=path)
    assert sorted(r["config"]["tile"] for r in rec["candidates"] if r["role"] == "candidate") == [16, 64]
    assert rec["space"]["from"].startswith("validation/_tuning/toy_from/")
    assert rec["verdict"] == "proposed"
    with pytest.raises(SkillRunError, match="artifact was pruned for shape"):
        tune_shape(index, "toy_from", {"M": 8, "N": 16, "K": 32}, backend="cpu", start_from=path, write=False)


def test_a_timer_that_misses_the_work_is_a_measurement_error_not_a_winner(tmp_path):
    from skillrun.analysis.peaks import DevicePeak, PeakTable

    index = _kb(tmp_path, [tunable_card("toy_floor", [16, 64])])
    tiny = PeakTable([DevicePeak(name="test (tiny peak)", match=".", tflops={"fp16": 1e-9}, gbps=1e-9, source="tests")])
    rec = run_tune(index, "toy_floor", timer=TIMER, peaks=tiny)
    assert rec["verdict"] == "error" and "physical floor" in rec["reason"] and rec["proposal"] is None


def test_real_cards_tunable_kernels_declare_a_schema_outside_the_measured_source():
    # Every recipe with a tunable space names a kernel whose CONFIG_SCHEMA lint can read, and the
    # schema lives in the <module>_config sidecar, so the measured kernel file (whose sha256 the
    # artifacts record) did not change when the schema was added.
    from skillrun.kb.index import SkillIndex
    from skillrun.kb.tunable import config_schema
    from skillrun.kb.refs import module_constant, split_ref

    index = SkillIndex.load(Path(__file__).resolve().parents[1])  # this checkout's cards, not a test KB
    seen = 0
    for card in index.skills.values():
        for r in card.data.get("recipes", []):
            if not r.get("tunable"):
                continue
            seen += 1
            assert config_schema(r["kernel"]), (card.id, r["name"])
            module, _ = split_ref(r["kernel"])
            assert module_constant(module, "CONFIG_SCHEMA") is None, f"{module} keeps its schema in the kernel file"
    assert seen >= 3


def test_the_hidden_start_aa_makes_a_biased_session_unreliable():
    from skillrun.tune.sweep import START_CHECK, start_check

    # What the position-biased engine reported on the H200: the start config (the incumbent's own)
    # at 1.457x the incumbent. Such a session must not propose anything.
    bad = start_check({"ratio_vs_incumbent": {START_CHECK: 1.457}, "noise_pct": 0.8}, identical=True)
    assert bad["unreliable"] and "not trustworthy" in bad["text"]
    ok = start_check({"ratio_vs_incumbent": {START_CHECK: 1.004}, "noise_pct": 0.8}, identical=True)
    assert ok["within_noise"] and not ok.get("unreliable")
    # A start config that is another recipe's is reported, never used to distrust the session.
    other = start_check({"ratio_vs_incumbent": {START_CHECK: 1.3}, "noise_pct": 0.8}, identical=False)
    assert not other.get("unreliable") and other["within_noise"] is False
