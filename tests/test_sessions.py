"""One measurement session, many shapes (runner/skillrun/execute/sessions.py), on the CPU backend.

Spawned children are what GPUs use (a fork of the zygote cannot initialize CUDA): there a card's
shapes share three task servers (the port's, the references', the judge's) instead of starting
a process for every task. Each shape still gets its own inputs, judge task, referee and artifact;
a shape whose port takes its process down is recorded, and the next shape gets a fresh one.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from defects.kb import K, card, make_defect_kb
from skillrun.evidence.validation import load_artifact
from skillrun.execute import run_skill
from skillrun.execute.cost import PHASES
from skillrun.execute.sessions import SessionPool, role_of
from skillrun.kb.index import SkillIndex

SHAPES = [{"M": 16, "N": 32, "K": 64}, {"M": 40, "N": 32, "K": 64}, {"M": 64, "N": 32, "K": 64}]


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    root = make_defect_kb(tmp_path_factory.mktemp("sessions_kb"),
                          [card("session_ok", f"{K}:build_port_ok"),
                           card("session_crash_at_m40", f"{K}:build_port_segfault_at_m40")])
    index = SkillIndex.load(root)
    assert not index.errors, [str(e) for e in index.errors]
    return index, root / "validation"


def _run(kb, card_id, shapes, **kw):
    index, out = kb
    return run_skill(index, card_id, shapes, backend="cpu", validation_root=out, timeout_s=120, timer="wall",
                     rounds=6, warmup=1, **kw)


def test_a_cards_shapes_share_its_processes_and_each_is_judged_on_its_own(kb):
    recs = _run(kb, "session_ok", SHAPES, isolation="spawn")  # per-card servers: the default for spawned children
    assert [r["verdict"] for r in recs] == ["cpu_numerics_passed"] * 3, [r.get("reason") for r in recs]
    # the port's, the references' and the judge's servers start for the first shape and serve the others
    assert [r["cost"]["processes_started"] for r in recs] == [3, 0, 0]
    assert all(r["cost"]["processes"].startswith("per-card") for r in recs)
    first, later = recs[0]["cost"]["device_seconds"], recs[2]["cost"]["device_seconds"]
    # (a later shape's "imports" is its already-loaded modules looked up again: a millisecond or so)
    assert first["imports"] > 1.0 and later.get("imports", 0.0) < 0.1 and "process_start" not in later
    for r in recs:
        c = r["cost"]
        assert set(c["device_seconds"]) <= set(PHASES) and c["device_seconds"]["rounds"] > 0
        assert sum(c["device_seconds"].values()) == pytest.approx(c["total_s"], abs=0.05)
        # its own judgement: its shape, its seeds judged, its referee's sampled checks, its own artifact
        assert r["shape"] == r["proxy_shape"]
        assert r["parity"]["port"]["passed"] and len(r["parity"]["port"]["seeds"]) == 3
        assert r["slot_integrity"]["port"]["sampled_timed_outputs"]["checked"] >= 1
        assert load_artifact(Path(r["artifact"]))["cost"] == c
    assert len({r["artifact"] for r in recs}) == 3
    # the canary's cost: taken once, when the references' server started (before the card's accused server did)
    assert len({r["timing"]["canary"]["before_ms"] for r in recs}) == 1
    assert all("references' process started, before the card's port process" in r["timing"]["canary"]["what"] for r in recs)


def test_a_process_per_task_is_still_there_and_counted(kb):
    (rec,) = _run(kb, "session_ok", SHAPES[:1], isolation="fork", processes="per-task")
    assert rec["verdict"] == "cpu_numerics_passed"
    # port + its judge, baseline + its judge, the session's two children (the accused's, the references')
    assert rec["cost"]["processes_started"] == 6 and rec["cost"]["processes"] == "a process per task"
    assert "before the port was imported anywhere" in rec["timing"]["canary"]["what"]


def test_a_shape_that_kills_its_process_is_recorded_and_the_next_shape_gets_a_new_one(kb):
    recs = _run(kb, "session_crash_at_m40", SHAPES, isolation="spawn")
    ok1, crashed, ok2 = recs
    assert ok1["verdict"] == "cpu_numerics_passed" and ok2["verdict"] == "cpu_numerics_passed", ok2.get("reason")
    assert crashed["verdict"] == "error" and crashed["parity"]["port"]["fault"] == "crash"
    assert "SIGSEGV" in crashed["reason"]
    # the port's server died with that shape; the next shape started a fresh one (and only that one)
    assert ok1["cost"]["processes_started"] == 3 and ok2["cost"]["processes_started"] == 1
    assert ok2["slot_integrity"]["port"]["passed"]


def test_tasks_go_to_the_server_of_their_role():
    assert role_of({"kind": "judge"}) == "judge"
    assert role_of({"kind": "candidate", "role": "baseline"}) == "references"
    assert role_of({"kind": "candidate", "role": "alternative"}) == "references"
    for t in ({"kind": "candidate", "role": "port"}, {"kind": "probe"}, {"kind": "session"}):
        assert role_of(t) == "accused"
    with SessionPool() as pool:
        a, b = pool.for_card("a"), pool.for_card("b")
        env = {"TRITON_INTERPRET": "1"}
        # ports of different cards never share a process
        assert a.server_for({"kind": "session"}, env) is not b.server_for({"kind": "session"}, env)
        assert a.server_for({"kind": "session"}, env) is a.server_for({"kind": "probe"}, env)
        assert a.server_for({"kind": "session"}, env) is not a.server_for({"kind": "judge"}, env)


def test_the_references_server_starts_and_times_the_canary_before_the_cards_accused_server(kb):
    from skillrun.execute.backends import make_backend
    from skillrun.execute.harness import ExecOptions

    be = make_backend("cpu")
    with ExecOptions.from_kw({"timer": "wall"}).pool(be) as pool:
        (rec,) = _run(kb, "session_ok", SHAPES[:1], isolation="spawn", pool=pool)
        assert rec["verdict"] == "cpu_numerics_passed", rec.get("reason")
        by_role = {role: srv for (card_id, role, *_), srv in pool.servers.items() if card_id == "session_ok"}
        assert by_role["references"].first_start < by_role["accused"].first_start
        assert by_role["references"].canary_ms and len(by_role["references"].canary_ms) == 9
        assert rec["timing"]["canary"]["before_ms"] == pytest.approx(sorted(by_role["references"].canary_ms)[4], rel=1e-3)
