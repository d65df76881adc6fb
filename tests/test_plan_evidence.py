"""The plan quotes measurements: the current non-stale artifact of the same card, recipe, shape and device class."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from skillrun import api
from skillrun.evidence.index import build_index
from skillrun.kb.index import SkillIndex
from skillrun.plan.planner import plan_lines

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "runner" / "skillrun" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz"
CARD = "triton_fp8_blockscale_gemm_sm90"


@pytest.fixture(scope="module")
def demo():
    index = SkillIndex.load(REPO)
    return index, api.analyze(DEMO, index=index)


def test_demo_plan_quotes_the_committed_h200_artifacts(demo):
    index, a = demo
    ev = build_index(index)
    items = [it for it in a.plan.items if it.skill_id == CARD]
    assert len(items) >= 5
    for it in items:
        hit = ev.measured(CARD, it.recipe, it.shape, arch="sm_90", device_name="NVIDIA H200")
        assert hit is not None, f"no committed artifact for {it.recipe} {it.shape}"
        assert it.expected_source == "measured"
        assert it.evidence["path"] == hit.path and it.evidence["path"].startswith(f"validation/{CARD}/")
        # the measurement against the trace's own call (the reference that reproduces it), not the card prior
        vs = next(r for r in hit.summary.refs if r.name == it.trace_call["reference"])
        assert it.expected_speedup == vs.speedup and it.versus_trace_call["name"] == vs.name
        assert it.evidence["shape"] == it.shape and "old" in it.evidence["age"]
        assert it.next_command is None
    by_shape = {tuple(it.shape.values()): it for it in items}
    wide = by_shape[(4096, 65536, 1536)]
    card_prior = index.skill(CARD).recipe(wide.recipe).expected_speedup
    # the sustained engine's run (0d3d55c), not the card's rounded prior
    assert card_prior == 0.87 and wide.expected_speedup == pytest.approx(0.8719)
    assert any("keep the baseline" in n for n in wide.notes)
    # 64x7168x2048, re-measured through the session referee (9e50fc8): the newest artifact is quoted
    assert by_shape[(64, 7168, 2048)].expected_speedup == pytest.approx(1.185)
    # Adopting only the winners: the one item measured faster (64x7168x2048) is the whole projected gain.
    winners = [it for it in items if (it.expected_speedup or 0) > 1.0]
    assert [tuple(it.shape.values()) for it in winners] == [(64, 7168, 2048)]
    assert a.plan.projected_gain_pct > 0 and a.plan.projected_gain_pct == pytest.approx(winners[0].projected_e2e_gain_pct, abs=1e-3)
    assert a.plan.projected_gain_all_pct == pytest.approx(sum(it.projected_e2e_gain_pct for it in a.plan.items), abs=1e-3)


def test_demo_plan_text_names_evidence_and_total(demo):
    _, a = demo
    text = "\n".join(plan_lines(a.plan))
    assert "[/] measured on H200 (sm_90)" in text  # the ratio coloured by meaning, "measured" plain
    assert "evidence: validation/triton_fp8_blockscale_gemm_sm90/20261202T035701Z_prefill_very_wide_n" in text
    assert "Projected end-to-end gain" in text
    assert "card prior" not in text.split("Projected")[0].replace("card's prior", "")


def test_cli_plan_prints_measured_expectation():
    from skillrun.cli.entry import app

    res = CliRunner().invoke(app, ["plan", str(DEMO)])
    assert res.exit_code == 0, res.output
    flat = re.sub(r"\s+", " ", res.output)
    assert "expected 0.872× measured on H200 (sm_90)" in flat  # 4096x65536x1536, commit 0d3d55c
    assert "Projected end-to-end gain" in flat


def test_without_evidence_the_plan_says_prior_and_next_command(demo):
    index, a = demo
    bare = api.plan(a.profile, a.matches, index, evidence=False)
    it = next(i for i in bare.items if i.skill_id == CARD and i.shape == {"M": 4096, "N": 2048, "K": 7168})
    assert it.expected_source == "card_prior" and it.evidence is None
    assert it.expected_speedup == index.skill(CARD).recipe(it.recipe).expected_speedup
    assert it.next_command == f"skill-run run {CARD} --shape M=4096,N=2048,K=7168"
    text = "\n".join(plan_lines(bare))
    assert "card prior" in text and "next: [bold]skill-run run" in text


def test_lever_is_scoped_to_the_shapes_it_was_measured_on(demo):
    index, a = demo
    # A shape the K-light recipe covers but was not measured on: its lever words are the card's about 16384x7168x768.
    prof = a.profile
    shapes = [{"M": 4096, "N": 7168, "K": 768}]
    from skillrun.plan.planner import _item

    k = prof.kernels[0]
    it = _item(index.skill(CARD), k, shapes[0], "user", None, 10.0, index, "sm_90")
    assert it.recipe == "prefill_k_light"
    assert it.lever_measured_on == ["M=16384,N=7168,K=768"]
    line = next(l for l in plan_lines(type(a.plan)(profile="x", arch="sm_90", items=[it])) if "lever" in l)
    assert "measured on M=16384,N=7168,K=768, not this shape" in line
    assert it.next_command is not None and it.expected_source == "card_prior"


def test_measurements_say_which_timing_engine_took_them(demo):
    """Artifacts timed before the device hold are marked, and a plan quoting one says so."""
    from skillrun.evidence.index import summarize
    from skillrun.evidence.validation import load_artifact

    root = Path(__file__).resolve().parents[1] / "validation" / CARD
    old = summarize(load_artifact(root / "20261129T092709Z_decode_m64_klight_M64xN7168xK2048_gpu_measured.yaml"))
    held = summarize(load_artifact(root / "20261202T010824Z_prefill_very_wide_n_M4096xN65536xK1536_gpu_measured.yaml"))
    new = summarize(load_artifact(root / "20261202T035701Z_prefill_very_wide_n_M4096xN65536xK1536_gpu_measured.yaml"))
    assert old.engine == "position_biased" and held.engine == "held" and new.engine == "sustained"
    index, a = demo
    # A plan that can only quote the position-biased run says so (the evidence index told to see only it).
    from skillrun.plan.planner import _quote_evidence

    ev = build_index(index)
    entry = ev.find(f"validation/{CARD}/20261129T092709Z_decode_m64_klight_M64xN7168xK2048_gpu_measured.yaml")
    assert entry is not None

    class OnlyTheOldRun:
        def measured(self, *args, **kw):
            return entry

    card = index.skill(CARD)
    item = next(it for it in a.plan.items if it.skill_id == CARD and tuple(it.shape.values()) == (64, 7168, 2048)).model_copy(deep=True)
    item.notes = []
    _quote_evidence(item, card, card.recipe(item.recipe), OnlyTheOldRun(), "sm_90", "NVIDIA H200")
    assert item.evidence["engine"] == "position_biased" and any("position-biased engine" in n for n in item.notes)
    by_shape = {tuple(it.shape.values()): it for it in a.plan.items if it.skill_id == CARD}
    quoted = by_shape[(4096, 65536, 1536)]
    assert quoted.evidence["engine"] == "sustained"  # the newest artifact is the one quoted
    assert not any("position-biased engine" in n or "without the sustained load" in n for n in quoted.notes)


def test_a_saved_plan_json_reads_back_as_the_same_plan_for_e2e(demo, tmp_path):
    """`skill-run plan --json > plan.json` then `skill-run e2e --plan plan.json`: the loader takes the
    printed document (trace named `source`, a schema_version) and gives back the plan that was printed."""
    import json

    from skillrun.cli.entry import app
    from skillrun.errors import InputError

    _, a = demo
    res = CliRunner().invoke(app, ["--json", "plan", str(DEMO)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["schema_version"] == 1 and doc["source"] == str(DEMO) and "profile" not in doc
    saved = tmp_path / "plan.json"
    saved.write_text(res.output)
    back = api.load_plan(saved)
    # what was printed, key for key (compared with the printed document, not with another plan
    # call: an evidence age like "29 min old" may turn over between the two)
    printed = {k: v for k, v in doc.items() if k not in ("schema_version", "source")}
    assert back.model_dump(mode="json") == {"profile": str(DEMO), **printed}
    assert back.profile == str(DEMO) and len(back.items) >= 5 and back.items[0].skill_id == a.plan.items[0].skill_id
    # `skill-run --profile T --json` (the plan under "plan") reads the same
    analysis = tmp_path / "analysis.json"
    analysis.write_text(json.dumps({"schema_version": 1, **a.to_json()}))
    assert api.load_plan(analysis) == a.plan
    # a document of another version is refused by name, not misread
    saved.write_text(json.dumps({**doc, "schema_version": 2}))
    with pytest.raises(InputError) as exc:
        api.load_plan(saved)
    assert exc.value.field == "schema_version" and str(saved) in str(exc.value)
