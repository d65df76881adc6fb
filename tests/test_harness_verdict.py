"""The harness's own verdict is the one every reader gets, and a plan cannot loosen the judge (issue 34's
helper found both in runner/skillrun/execute/harness.py).

1. ``_two_axis`` decided without the second clock, the synchronizing slots and the A/A band, so a record written
   by ``run`` could ignore a clock disagreement that ``judge_record`` (evidence/verdict.py, issue 34's one rule)
   then found on reading it back.
2. ``_base_record`` took a plan item's tolerance as the judge's: a hostile ``--plan`` could loosen it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from defects.kb import card, make_defect_kb
from skillrun.evidence.verdict import judge_record
from skillrun.execute import harness
from skillrun.execute.backends import CudaBackend, DeviceFacts, make_backend
from skillrun.kb.index import SkillIndex

SHAPE = {"M": 48, "N": 32, "K": 64}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    c = card("hv_ok", "defects.kernels:build_port_ok")
    c["references"]["production"] = ["baseline"]
    z = card("hv_zeros", "defects.escape:build_zeros")
    root = make_defect_kb(tmp_path_factory.mktemp("hv_kb"), [c, z])
    idx = SkillIndex.load(root)
    assert not idx.errors, [str(e) for e in idx.errors]
    return idx


def _session(port_ms: float, base_ms: float, port_kernel_ms: float, base_kernel_ms: float) -> dict:
    """A GPU session's result as session.py returns it: 24 rounds of port, baseline and the A/A copy, and three
    profiled rounds whose kernel durations (the second clock) are given."""
    n = 24
    samples = {"port": [port_ms * (1 + 0.001 * (i % 3)) for i in range(n)],
               "baseline": [base_ms * (1 + 0.001 * (i % 2)) for i in range(n)],
               "baseline#aa": [base_ms * (1 + 0.001 * ((i + 1) % 2)) for i in range(n)]}
    raw = {k: {"ms": v, "round": list(range(n)), "position": [i % 3 for i in range(n)], "set": [0] * n, "kept": [True] * n}
           for k, v in samples.items()}
    timing = {"method": "device events around each launch (test)", "repeat": 1, "samples": samples, "rounds": n, "warmup": 3,
              "raw": raw, "round_info": {"held": [True] * n, "clock_mhz": [None] * n, "queue_us": [None] * n, "load_ms": [0] * n},
              "position_effect": {"median_ms_by_position": {}, "max_pct": 0.0, "slot": None}, "unheld_rounds": 0,
              "hold_ineffective": False, "throttled_rounds": 0, "observed": {"port": [port_ms] * 3, "baseline": [base_ms] * 3},
              "observed_positions": {"port": [0, 1, 2], "baseline": [1, 2, 0]}, "held": True, "hold_us": 200.0,
              "sustain_ms": 50.0, "launch_hold": False, "self_syncing": {}, "observed_rounds": 3,
              "profiler_ms": {"port": [port_kernel_ms] * 3, "baseline": [base_kernel_ms] * 3}}
    return {"status": "ok", "timing": timing, "cuda_graph": True, "input_sets": 4, "bytes_per_set": 1 << 20, "slots": {}}


def _write(index, ses: dict) -> dict:
    be = CudaBackend(DeviceFacts(kind="cuda", name="fake H200", arch="sm_90", l2_bytes=50 << 20))
    item = harness.plan_item_for(index, index.skill("hv_ok"), SHAPE, be)
    ctx = harness._Ctx(card=index.skill("hv_ok"), item=item, be=be, opts=harness.ExecOptions(), profile_source=None)
    rec = harness._base_record(ctx)
    rec["mode"] = "gpu_measured"
    port = {"status": "ok", "role": "port", "ref": "defects.kernels:build_port_ok", "parity": {"passed": True},
            "flops": 2 * 48 * 32 * 64, "min_bytes": 2 * (48 * 64 + 64 * 32 + 48 * 32)}
    base = {"status": "ok", "role": "baseline", "name": "baseline", "ref": "defects.kernels:build_baseline", "parity": {"passed": True}}
    rec["parity"] = {"port": {"passed": True}, "baseline": {"passed": True, "kernel": base["ref"]}}
    rec["slot_integrity"] = {"port": {"passed": True}, "baseline": {"passed": True}, "aliasing": {"passed": True}}
    harness._timing(ctx, rec, ses, base, [], SHAPE, port)
    return rec


@pytest.mark.parametrize("clocks,want", [
    # events: the port 1.2x faster; kernel durations: 0.9x (the baseline's interval holds more than its kernels)
    ((1.0, 1.2, 1.0, 0.9), "slower"),
    # the two clocks agree: the events' ratio stands
    ((1.0, 1.2, 1.0, 1.2), "validated"),
])
def test_the_verdict_the_harness_writes_is_the_one_the_record_reads_back(index, clocks, want):
    rec = _write(index, _session(*clocks))
    back = judge_record(rec)
    assert back is not None
    assert rec["verdict"] == back.verdict == want, (rec["verdict"], back.verdict, rec["verdict_text"])
    assert rec["verdict_text"] == back.text
    assert rec["speedup"] == pytest.approx(back.speedup, rel=1e-3)
    assert {e["name"]: (e["speed"], e["speedup"]) for e in rec["references"]} == \
        {k: (v.speed, v.speedup) for k, v in back.speeds.items()}
    if want == "slower":
        assert rec["speedup"] == pytest.approx(0.9, rel=1e-3) and "kernel durations" in rec["verdict_text"]


def test_a_plan_item_cannot_loosen_the_judge(index, tmp_path):
    be = make_backend("cpu")
    card_ = index.skill("hv_zeros")
    item = harness.plan_item_for(index, card_, SHAPE, be)
    honest = harness.execute_item(index, item, backend=be, validation_root=tmp_path, timeout_s=120)
    assert honest["verdict"] == "parity_failed"
    loose = item.model_copy(update={"tolerance": {"rtol": 1e300, "atol": 1e300, "min_cosine": 0.0, "max_rel_fro": 5.0}})
    rec = harness.execute_item(index, loose, backend=be, validation_root=tmp_path, timeout_s=120)
    assert rec["verdict"] == "parity_failed" and not rec["parity"]["port"]["passed"]
    assert rec["tolerance"]["rtol"] == rec["tolerance"]["atol"] == 0.01 and rec["tolerance"]["min_cosine"] == 0.999
    assert rec["tolerance"]["max_rel_fro"] <= 0.01  # a key the card leaves out: the family's ceiling at most
    assert any("looser tolerance than the card's, refused" in n for n in rec["notes"])
    # a tighter one is taken
    tight = item.model_copy(update={"tolerance": {"rtol": 1e-3}})
    assert harness._base_record(harness._Ctx(card=card_, item=tight, be=be, opts=harness.ExecOptions(),
                                             profile_source=None))["tolerance"]["rtol"] == 1e-3
