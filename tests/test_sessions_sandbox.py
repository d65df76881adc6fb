"""A card's long-lived processes are sandboxed like task children, and a shape leaves nothing for the next
(issue 35's per-card servers on issue 36's engine: runner/skillrun/execute/sessions.py, serve.py).

On the CPU backend with spawned children, where a card's shapes share three servers (the accused's, the
references', the judge's): each enters the sandbox before it imports anything a card names, writes only its
own folder, and ends when a task leaves a process or a thread behind; the guard's baseline is taken when the
accused's server starts; a shape whose port did not pass cleanly retires the accused's server."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from defects import escape
from defects.kb import card, make_defect_kb
from skillrun.evidence.index import build_index
from skillrun.evidence.validation import artifact_files, load_artifact
from skillrun.execute import run_skill
from skillrun.io import sandbox
from skillrun.kb.index import SkillIndex

pytestmark = pytest.mark.skipif(sandbox.support()["level"] != "full",
                                reason="this machine offers no user namespaces or no Landlock")

S = "defects.served"
E = "defects.escape"
SHAPES = [{"M": 16, "N": 32, "K": 64}, {"M": 40, "N": 32, "K": 64}]


def _card(cid: str, ref: str, config: dict | None = None) -> dict:
    c = card(cid, ref)
    c["recipes"][0]["config"] = config or {}
    return c


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    root = make_defect_kb(tmp_path_factory.mktemp("served_kb"), [
        _card("srv_patch", f"{S}:build_patches_at_m16"), _card("srv_thread", f"{S}:build_leaves_thread_at_m16"),
        _card("srv_evidence", f"{E}:build_writes_evidence", {"validation": "PLACEHOLDER"}),
        _card("srv_daemon", f"{E}:build_daemon", {"validation": "PLACEHOLDER", "for_s": 60})])
    index = SkillIndex.load(root)
    assert not index.errors, [str(e) for e in index.errors]
    out = root / "validation"
    for cid in ("srv_evidence", "srv_daemon"):
        index.skills[cid].recipes[0].config["validation"] = str(out)
    return index, out


def _run(kb, cid, shapes=SHAPES, **kw):
    index, out = kb
    return run_skill(index, cid, shapes, backend="cpu", validation_root=out, timeout_s=120, isolation="spawn",
                     timer="wall", rounds=6, warmup=1, **kw)


def test_a_function_replaced_in_the_parity_task_is_found_by_the_session_and_the_next_shape_starts_clean(kb):
    first, second = _run(kb, "srv_patch")
    assert first["cost"]["processes"].startswith("per-card")
    assert first["verdict"] == "error" and "harness function(s) replaced: time.perf_counter" in first["reason"]
    assert any("accused process was ended" in n for n in first.get("notes") or [])
    # a fresh accused process for the next shape (its port patches nothing there), which passes
    assert second["verdict"] == "cpu_numerics_passed", second.get("reason")
    assert second["cost"]["processes_started"] == 1 and second["slot_integrity"]["port"]["passed"]


def test_a_thread_left_by_a_task_ends_its_server(kb):
    first, second = _run(kb, "srv_thread")
    # the parity task left a thread: its server ended; the session's accused process started afresh, where the
    # port (built again at M = 16) started it again, and the guard found it between rounds
    assert first["verdict"] == "error" and "new thread(s) running between rounds: port-leftover" in first["reason"]
    assert second["verdict"] == "cpu_numerics_passed", second.get("reason")


def test_a_card_server_writes_nothing_outside_its_folder(kb):
    index, out = kb
    (rec,) = _run(kb, "srv_evidence", shapes=SHAPES[:1])
    assert rec["cost"]["processes"].startswith("per-card") and rec["parity"]["port"]["passed"], rec.get("reason")
    assert not [p for p in artifact_files(out) if "forged" in p.name]
    assert not build_index(index).untrusted_entries()


def _daemons() -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                alive = (d / "stat").read_bytes().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
                if alive and (d / "comm").read_bytes().strip() == escape.DAEMON_NAME:
                    pids.append(int(d.name))
            except (OSError, IndexError):
                pass
    return pids


def _settled() -> list[int]:
    """The daemons still running once the kernel has had a moment to empty an ended namespace."""
    end = time.monotonic() + 5
    while _daemons() and time.monotonic() < end:
        time.sleep(0.2)
    return _daemons()


def test_a_daemon_left_in_a_card_server_ends_with_its_task(kb):
    index, _ = kb
    between: list[list[int]] = []

    def on_item(event, i, n, item, result=None):
        if event == "done":
            between.append(_settled())  # the card's servers serve the next shape: is the daemon still there?

    try:
        recs = _run(kb, "srv_daemon", on_item=on_item)
        assert [r["verdict"] for r in recs] == ["cpu_numerics_passed"] * 2, [r.get("reason") for r in recs]
        # every task that built the port left the daemon in its server's PID namespace, and that server ended
        # with the task: none was there between the shapes (the servers live on), none is left now, the records stand
        assert between == [[], []]
        assert not _settled()
        for r in recs:
            assert load_artifact(Path(r["artifact"]))["verdict"] == "cpu_numerics_passed"
            assert build_index(index).find(Path(r["artifact"])).status == "current"
    finally:
        for pid in _daemons():
            os.kill(pid, signal.SIGKILL)


def test_the_guard_baseline_is_what_the_process_was_before_any_port_ran():
    """Why the baseline is the process's, not the session's: a Guard taken after a port replaced a function
    records the replacement as the harness's own."""
    import time as _time

    from skillrun.execute import guard

    base = guard.baseline()
    real = _time.perf_counter
    try:
        _time.perf_counter = lambda: real()
        late = guard.Guard()
        assert not [p for p in late.check() if "replaced" in p]
        assert any("time.perf_counter" in p for p in base.check())
        assert guard.baseline() is base
    finally:
        _time.perf_counter = real
