"""The judge is not the accused's process: the isolated parity gate (phase A) is decided by a judge
process that never imports a port, from output bytes the port's process hands over.

Each seeded port of tests/defects/reach.py passed the parity gate while the oracle, the comparison
and the result file lived beside it; run end to end on the CPU backend (real child processes).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from defects.kb import card, make_defect_kb
from skillrun.execute import run_skill
from skillrun.kb.index import SkillIndex

R = "defects.reach"
SHAPE = {"M": 48, "N": 32, "K": 64}
CHEATS = {
    "reach_lazy_subclass": f"{R}:build_lazy_subclass",
    "reach_forges_result": f"{R}:build_forges_result",
    "reach_patches_compare": f"{R}:build_patches_compare",
    "reach_patches_oracle": f"{R}:build_patches_oracle",
    "reach_patches_matmul": f"{R}:build_patches_matmul",
}
SESSION_CHEATS = {"reach_zeroes_baseline_copy": f"{R}:build_zeroes_baseline_copy",
                  "reach_lazy_when_timed": f"{R}:build_lazy_when_timed",
                  "reach_zeroes_counters": f"{R}:build_zeroes_counters",
                  "reach_session_patches_compare": f"{R}:build_session_patches_compare",
                  "reach_patches_round_choice": f"{R}:build_patches_round_choice",
                  "reach_fixes_checked_outputs": f"{R}:build_fixes_checked_outputs"}


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    cards = [card(cid, ref) for cid, ref in {**CHEATS, **SESSION_CHEATS}.items()] + [card("reach_ok", "defects.kernels:build_port_ok")]
    root = make_defect_kb(tmp_path_factory.mktemp("reach_kb"), cards)
    index = SkillIndex.load(root)
    assert not index.errors, [str(e) for e in index.errors]
    return index, root / "validation"


def run(kb, card_id: str, **kw) -> dict:
    index, out = kb
    (rec,) = run_skill(index, card_id, [SHAPE], backend="cpu", validation_root=out, timeout_s=120,
                       timer="wall", **{"rounds": 12, "warmup": 2, **kw})
    return rec


def test_an_honest_port_still_passes_with_parity_from_the_judge(kb):
    rec = run(kb, "reach_ok")
    # (the session's observer-effect check is about timing on a loaded machine, not this gate)
    assert rec["verdict"] != "parity_failed", rec["reason"]
    p = rec["parity"]["port"]
    assert p["passed"] and p["cosine"] > 0.999 and len(p["seeds"]) == 3
    assert p["judge"].startswith("a separate process")


@pytest.mark.parametrize("card_id", sorted(CHEATS))
def test_a_port_that_reaches_for_the_judge_fails_the_parity_gate(kb, card_id):
    rec = run(kb, card_id)
    p = rec["parity"]["port"]
    assert not p["passed"], (card_id, p)
    assert rec["verdict"] in ("parity_failed", "error") and rec.get("speedup") is None, rec["reason"]


def test_the_lazy_subclass_is_refused_by_name(kb):
    rec = run(kb, "reach_lazy_subclass")
    assert "not a plain torch.Tensor" in rec["parity"]["port"]["error"]


def test_the_forged_result_hands_over_no_output(kb):
    rec = run(kb, "reach_forges_result")
    assert "no output was handed over" in rec["parity"]["port"]["error"]


def test_handover_reader_rebuilds_an_exact_tensor_and_refuses_bad_metadata(tmp_path):
    from skillrun.execute.judge import read_output, write_output

    t = torch.randn(5, 7).to(torch.bfloat16)
    write_output(tmp_path, 3, t, {"run_s": 0.1})
    back, meta = read_output(tmp_path, 3, max_bytes=1 << 20)
    assert type(back) is torch.Tensor and back.dtype == torch.bfloat16 and torch.equal(back, t)
    assert meta["run_s"] == 0.1
    meta_path = Path(tmp_path) / "seed_3.json"
    for bad, why in (({"dtype": "object"}, "dtype"), ({"shape": [5, 8]}, "bytes"), ({"shape": [-1, 7]}, "shape")):
        m = json.loads(meta_path.read_text())
        m.update(bad)
        meta_path.write_text(json.dumps(m))
        with pytest.raises(ValueError, match=why):
            read_output(tmp_path, 3, max_bytes=1 << 20)
        write_output(tmp_path, 3, t, {"run_s": 0.1})
    with pytest.raises(ValueError, match="larger than"):
        read_output(tmp_path, 3, max_bytes=16)


def test_a_port_cannot_reach_the_baselines_input_copy(kb):
    # It zeroed the baseline's input copy (found through gc) so that the baseline was blamed for writing
    # its inputs. The references run in a process that never imports the port (execute/session.py):
    # there is no baseline copy in the port's process to find.
    rec = run(kb, "reach_zeroes_baseline_copy")
    assert rec["parity"]["port"]["passed"] and rec["verdict"] == "cpu_numerics_passed", rec["reason"]
    base = rec["slot_integrity"]["baseline"]
    assert base["passed"] and base["input_checksums"]["mutated"] == 0 and "written_by_another_slot" not in base["input_checksums"]
    assert base["sampled_timed_outputs"]["failed"] == 0


def test_a_port_returning_a_lazy_subclass_only_when_timed_fails_the_sampled_checks(kb):
    rec = run(kb, "reach_lazy_when_timed")
    assert rec["parity"]["port"]["passed"]  # a plain tensor in the judged gate
    g = rec["slot_integrity"]["port"]
    assert not g["passed"] and g["sampled_timed_outputs"]["failed"] == g["sampled_timed_outputs"]["checked"] > 0
    assert "not a plain torch.Tensor" in g["reason"] and rec["verdict"] == "error"


# Each passed with every gate green while the timed session's checks lived in the port's process:
# stale answers in the timed rounds, and the session's own counters, comparison or round choice
# bent to hide them (or, for the last, the answer fixed once the round was known to be checked).
REFEREED = ("reach_zeroes_counters", "reach_session_patches_compare", "reach_patches_round_choice",
            "reach_fixes_checked_outputs")


@pytest.mark.parametrize("card_id", REFEREED)
def test_a_port_bending_the_timed_sessions_checks_is_caught_by_the_referee(kb, card_id):
    # 5 of 60 timed rounds checked: a port honest in its last 12 rounds only (9 timed, 3 observed) is
    # missed by a fair draw with probability C(9,5)/C(60,5) < 3e-5; always, when the draw is its own
    # process's (the forced checks fall in the last rounds)
    rec = run(kb, card_id, **({"rounds": 60, "check_timed": 5} if card_id == "reach_patches_round_choice" else {}))
    assert rec["parity"]["port"]["passed"]  # honest in the judged gate
    g = rec["slot_integrity"]["port"]
    s = g["sampled_timed_outputs"]
    assert not g["passed"] and s["failed"] > 0 and s["judged_by"].startswith("the referee"), g
    assert rec["verdict"] == "error" and rec.get("speedup") is None, rec["reason"]
    if card_id == "reach_fixes_checked_outputs":
        assert "not the one the session committed to" in s["failures"][0]
    # the references were judged on the same rounds, and pass
    assert rec["slot_integrity"]["baseline"]["sampled_timed_outputs"]["failed"] == 0
