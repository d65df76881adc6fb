"""No process or temporary file outlives `skill-run`: after SIGKILL of the parent its zygote and
task children die with it (parent-death signal and watch), after SIGTERM the CLI unwinds, and
stale temporary folders of killed runs are removed on the next start."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from skillrun.io import lifeline

pytestmark = pytest.mark.timeout(240)

TESTS = Path(__file__).resolve().parent


def _tagged(tag: str) -> list[int]:
    """Live processes whose environment carries ``tag`` (our whole tree: env is inherited)."""
    needle = f"SKILLRUN_TEST_TAG={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env.split(b"\0") and state != "Z":
            found.append(int(entry))
    return found


def _wait_for(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def _env(tag: str, tmp: Path) -> dict[str, str]:
    return dict(os.environ, SKILLRUN_TEST_TAG=tag, TMPDIR=str(tmp),
                PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


HANG = textwrap.dedent("""
    import sys
    from pathlib import Path
    from defects.kb import card, make_defect_kb
    from skillrun.execute import run_skill
    from skillrun.kb.index import SkillIndex

    root = make_defect_kb(Path(sys.argv[1]), [card("defect_hang", "defects.kernels:build_port_hang")])
    run_skill(SkillIndex.load(root), "defect_hang", [{"M": 48, "N": 32, "K": 64}], backend="cpu",
              validation_root=root / "validation", timeout_s=600, seeds=1)
""")


def _start_and_wait_for_hang(cmd: list[str], env: dict, tmp: Path, tag: str) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # The harness, its zygote and the forked task child (the hanging port) are all up, and the
    # task's temporary folder exists.
    _wait_for(lambda: len(_tagged(tag)) >= 3 and list(tmp.glob("skillrun-child-*")), 150, "the hanging task")
    return proc


def test_sigkill_of_the_parent_leaves_no_process_no_temporary_and_the_next_run_says_what_was_lost(tmp_path, monkeypatch):
    from skillrun.io import janitor

    tag = uuid.uuid4().hex
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**_env(tag, tmp), "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = _start_and_wait_for_hang([sys.executable, "-c", HANG, str(tmp_path / "kb")], env, tmp, tag)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _wait_for(lambda: not _tagged(tag), 15, "every helper process to die after the parent's SIGKILL")
    # SIGKILL runs no cleanup in the harness, but its janitor sees the harness go and removes its folders ...
    _wait_for(lambda: not list(tmp.glob(f"skillrun-*-{proc.pid}-*")), 15, "the killed run's folders to be removed")
    # ... and leaves a note the next run reads out, once
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _wait_for(lambda: janitor.lost_runs(consume=False), 15, "the janitor's note")
    (said,) = janitor.lost_runs()
    assert f"pid {proc.pid}" in said and "card defect_hang" in said and "results were lost" in said
    assert janitor.lost_runs() == []
    # a folder whose janitor was killed too is still removed by the next start (the older net)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp / f"skillrun-child-{dead.pid}-x").mkdir()
    assert lifeline.sweep_stale("child", base=str(tmp)) == [f"skillrun-child-{dead.pid}-x"]


def test_sigterm_of_the_cli_leaves_no_process_and_no_temporary(tmp_path):
    from defects.kb import card, make_defect_kb

    tag = uuid.uuid4().hex
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    root = make_defect_kb(tmp_path / "kb", [card("defect_hang", "defects.kernels:build_port_hang")])
    cmd = [sys.executable, "-m", "skillrun", "--kb", str(root), "run", "defect_hang", "--shape", "48,32,64",
           "--backend", "cpu", "--seeds", "1"]
    proc = _start_and_wait_for_hang(cmd, _env(tag, tmp), tmp, tag)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    _wait_for(lambda: not _tagged(tag), 15, "every helper process to end after SIGTERM")
    assert not list(tmp.glob("skillrun-child-*"))
    assert not list((root / "validation").rglob("*.part")) if (root / "validation").exists() else True


def test_a_child_whose_parent_is_already_gone_exits_at_once(tmp_path):
    """The race: the parent dies between starting the child and the child's first instruction."""
    code = "from skillrun import lifeline; lifeline.die_with_parent(1); import time; time.sleep(30)"
    r = subprocess.run([sys.executable, "-c", code], timeout=20)
    assert r.returncode == 1


def test_sweep_keeps_folders_of_live_processes(tmp_path):
    mine = tmp_path / f"skillrun-child-{os.getpid()}-x"
    live = tmp_path / f"skillrun-child-{os.getppid()}-y"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / f"skillrun-child-{dead.pid}-z"
    other = tmp_path / "skillrun-trace-1-q"
    for d in (mine, live, gone, other):
        d.mkdir()
    assert lifeline.sweep_stale("child", base=str(tmp_path)) == [gone.name]
    assert mine.exists() and live.exists() and other.exists()
    # Files too (a tuning lane's stderr log), never a symlink planted under our name.
    lane = tmp_path / f"skillrun-lane-{dead.pid}-0-x.err"
    lane.write_text("log")
    planted = tmp_path / f"skillrun-lane-{dead.pid}-1-y.err"
    planted.symlink_to(tmp_path / "elsewhere")
    assert lifeline.sweep_stale("lane", base=str(tmp_path)) == [lane.name]
    assert planted.is_symlink()
