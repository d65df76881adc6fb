"""The launch watchdog (runner/skillrun/execute/watchdog.py) on the CPU, with deliberately deadlocking stand-ins.

The stand-ins (tests/defects/kernels.py ``_relaunch_deadlock``) pass the candidate gate and deadlock
on their second launch on the same prepared operands, as a timed session makes them do: without the
watchdog the session would wait for the overall timeout and lose every slot's timing.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from defects.kb import make_defect_kb
from skillrun.execute import run_skill
from skillrun.execute.watchdog import probe_kernels
from skillrun.kb.index import SkillIndex
from skillrun.evidence.validation import load_artifact

K = "defects.kernels"
SHAPE = {"M": 48, "N": 32, "K": 64}
DEADLINE = 3.0


@pytest.fixture(scope="module")
def kb(tmp_path_factory) -> tuple[SkillIndex, Path]:
    root = make_defect_kb(tmp_path_factory.mktemp("watchdog_kb"))
    index = SkillIndex.load(root)
    assert not index.errors, [str(e) for e in index.errors]
    return index, root / "validation"


def test_probe_names_the_hanging_and_the_crashing_slot_and_probes_the_rest():
    slots = [{"slot": "a", "ref": f"{K}:build_port_ok", "config": {}},
             {"slot": "hang", "ref": f"{K}:build_port_relaunch_deadlock", "config": {"tile": 7}},
             {"slot": "segv", "ref": f"{K}:build_port_segfault", "config": {}},
             {"slot": "b", "ref": f"{K}:build_baseline", "config": {}}]
    t0 = time.monotonic()
    got = probe_kernels(slots, problem="defects.problem", shape=SHAPE, device="cpu", deadline_s=DEADLINE)
    wall = time.monotonic() - t0
    assert [p.slot for p in got] == ["a", "hang", "segv", "b"]
    assert [p.status for p in got] == ["ok", "timeout", "crashed", "ok"], [p.reason for p in got]
    hang = got[1]
    assert "build_port_relaunch_deadlock" in hang.reason and "tile=7" in hang.reason
    assert f"within {DEADLINE:g} s" in hang.reason
    assert "SIGSEGV" in got[2].reason
    # One deadline for the hang plus three interpreter starts: bounded, whatever the host's load.
    assert wall < DEADLINE + 90


def test_a_deadlocking_reference_is_recorded_timeout_and_the_others_are_timed(kb):
    index, out = kb
    (rec,) = run_skill(index, "defect_alt_deadlock", [SHAPE], backend="cpu", validation_root=out, timeout_s=120,
                       launch_timeout_s=DEADLINE, timer="wall", rounds=5, warmup=1)
    assert rec["artifact"]
    back = load_artifact(Path(rec["artifact"]))  # schema-valid with the new statuses and block
    assert back["watchdog"]["dropped"]["alt:deadlocks"]["status"] == "timeout"
    refs = {r["name"]: r for r in rec["references"]}
    dead = refs["deadlocks"]
    assert dead["status"] == "timeout" and dead["speed"] == "not_timed"
    assert "build_alt_relaunch_deadlock" in dead["error"] and "deadlock" in dead["error"]
    # The run went on: the port and the other references were timed in the session.
    assert refs["padded"]["status"] == "ok" and refs["padded"]["median_ms"] is not None
    # 5 rounds, in whole blocks of 5 slots (port, baseline, padded, the A/A copy, the references' canary)
    assert rec["timing"]["port_ms"]["samples"] == 5
    assert rec["verdict"] == "cpu_numerics_passed", rec["reason"]
    assert "deadlocks" in rec["verdict_text"] and "timed out" in rec["verdict_text"]
    assert rec["watchdog"]["probes"]["port"]["status"] == "ok"


def test_a_deadlocking_port_is_an_error_naming_it_and_no_session_runs(kb):
    index, out = kb
    t0 = time.monotonic()
    (rec,) = run_skill(index, "defect_port_deadlock", [SHAPE], backend="cpu", validation_root=out, timeout_s=600,
                       launch_timeout_s=DEADLINE, timer="wall", rounds=5, warmup=1)
    assert time.monotonic() - t0 < 300  # the 600 s session timeout was never waited for
    assert rec["verdict"] == "error"
    assert "build_port_relaunch_deadlock" in rec["reason"] and f"within {DEADLINE:g} s" in rec["reason"]
    assert rec["watchdog"]["dropped"]["port"]["status"] == "timeout"
    assert "timing" not in rec
    load_artifact(Path(rec["artifact"]))


def test_the_tuner_records_a_deadlocking_candidate_as_timeout_and_times_the_rest(tmp_path):
    from test_tune import TIMER, tunable_card
    from skillrun.evidence.tuning_artifact import load_tuning_artifact
    from skillrun.tune.sweep import tune_shape

    root = make_defect_kb(tmp_path / "kb", [tunable_card("toy_deadlock", [16, 40, 64])])
    index = SkillIndex.load(root)
    assert not index.errors, [str(e) for e in index.errors]
    rec = tune_shape(index, "toy_deadlock", {"M": 32, "N": 16, "K": 32}, backend="cpu", timer=TIMER, rounds=12,
                     seeds=2, timeout_s=120, launch_timeout_s=DEADLINE, validation_root=tmp_path / "validation")
    rows = {r["config"].get("tile"): r for r in rec["candidates"] if r["role"] == "candidate"}
    assert rows[40]["status"] == "timeout", rows[40]
    assert "defects.tunable:build (tile=40)" in rows[40]["reason"] and "did not return" in rows[40]["reason"]
    assert rows[64]["status"] == "survivor" and rows[64]["sweep"]["speedup_vs_incumbent"] > 1.2
    assert rec["verdict"] == "proposed" and rec["decision"]["winner"] == rows[64]["id"]
    load_tuning_artifact(Path(rec["artifact"]))


def test_a_port_that_hangs_in_its_first_launch_is_ended_at_the_launch_deadline_not_the_task_timeout(kb):
    index, out = kb
    t0 = time.monotonic()
    (rec,) = run_skill(index, "defect_hang", [SHAPE], backend="cpu", validation_root=out, timeout_s=600,
                       launch_timeout_s=DEADLINE, isolation="spawn")
    assert time.monotonic() - t0 < 300  # the 600 s task timeout was never reached
    assert rec["verdict"] == "error" and rec["parity"]["port"]["fault"] == "timeout"
    reason = rec["reason"]
    assert "build_port_hang (default config)" in reason and "launch for seed 1" in reason
    assert f"did not return within {DEADLINE:g} s" in reason and "launch watchdog" in reason
