"""The sandbox on a machine whose GPU stack does not survive part of it (the first H200 run inside the full
sandbox failed every CUDA call with cudaErrorOperatingSystem): the harness finds the strongest sandbox under
which the device works, its children leave out only those pieces, and every artifact says what was left out.
The device is simulated: ``fail-with=<pieces>`` is a device check that fails while those pieces are in force."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skillrun.execute.harness import ExecOptions, _Ctx
from skillrun.io import sandbox

pytestmark = pytest.mark.skipif(sandbox.support()["level"] != "full",
                                reason="needs user namespaces and Landlock (the sandbox's full level)")


@pytest.mark.parametrize("broken, expected", [
    ("", []),
    ("private_mounts", ["private_mounts"]),
    ("ipc", ["ipc"]),
    ("private_mounts+ipc", ["private_mounts", "ipc"]),
    ("landlock", ["landlock"]),
    ("namespaces", ["namespaces"]),
])
def test_the_strongest_sandbox_the_device_survives_is_chosen(broken, expected):
    fit = sandbox.gpu_fit(f"fail-with={broken}", refresh=True)
    assert fit["without"] == expected and not fit["none_worked"]
    tried = {tuple(t["without"]): t for t in fit["tried"]}
    assert tried[()]["ok"] is (broken == "")
    if broken:  # the full sandbox's failure is kept with the device's own words
        assert "simulated device failure" in tried[()]["error"]


def test_a_device_broken_everywhere_leaves_nothing_out():
    fit = sandbox.gpu_fit("no-such-check", refresh=True)
    assert fit["none_worked"] and fit["without"] == []
    assert all("unknown device check" in t["error"] for t in fit["tried"])


def test_a_child_told_to_leave_a_piece_out_does_so_and_nothing_more(tmp_path):
    """The variable the harness sets reaches the child through the scrubbed environment; the child keeps
    every other piece (here: with Landlock left out it can write beside its folder, and it still sees only
    its own PID namespace)."""
    own, other = tmp_path / "own", tmp_path / "other"
    own.mkdir()
    other.mkdir()
    code = (
        "import json, os, sys\n"
        "from skillrun.io import sandbox\n"
        f"info = sandbox.enter([{str(own)!r}], role='probe', mode='auto')\n"
        "try:\n"
        f"    open(os.path.join({str(other)!r}, 'x'), 'w').write('x'); wrote = True\n"
        "except OSError:\n"
        "    wrote = False\n"
        "print(json.dumps({'info': info, 'wrote': wrote, 'pid': os.getpid()}))\n"
    )

    def child(without: str | None) -> dict:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        env.pop(sandbox.WITHOUT_ENV, None)
        if without is not None:
            env[sandbox.WITHOUT_ENV] = without
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        import json

        return json.loads(out.stdout.strip().splitlines()[-1])

    full = child(None)
    assert full["info"]["level"] == "full" and not full["wrote"] and full["info"]["pid_namespace"]
    no_ll = child("landlock")
    assert no_ll["wrote"] and no_ll["info"]["left_out"] == ["landlock"] and no_ll["info"]["level"] == "partial"
    assert no_ll["info"]["pid_namespace"] and no_ll["pid"] <= 8  # still its own PID namespace
    no_ipc = child("ipc,nonsense")  # unknown names are ignored
    assert no_ipc["info"]["left_out"] == ["ipc"] and not no_ipc["info"]["ipc_namespace"] and not no_ipc["wrote"]


class _GpuBackend:
    gpu = True
    kind = "cuda"


def test_the_harness_tells_its_children_and_the_artifact_says_what_was_left_out(monkeypatch):
    monkeypatch.delenv(sandbox.WITHOUT_ENV, raising=False)
    fit = {"check": "cuda", "without": ["private_mounts"], "none_worked": False,
           "tried": [{"without": [], "ok": False, "error": "AcceleratorError: CUDA error: OS call failed"},
                     {"without": ["private_mounts"], "ok": True, "error": None}]}
    monkeypatch.setattr(sandbox, "_GPU_FIT", fit)
    ex = _Ctx.__new__(_Ctx)
    ex.be, ex.opts = _GpuBackend(), ExecOptions.from_kw({})
    assert ex.sandbox_mode() == "auto"  # not "require": the children take what the machine offers, minus that
    assert os.environ[sandbox.WITHOUT_ENV] == "private_mounts"
    rec = sandbox.record("auto", gpu=True)
    assert rec["level"] == "partial" and rec["left_out"] == ["private_mounts"]
    assert "private_mounts was left out" in rec["unsandboxed"] and "OS call failed" in rec["unsandboxed"]
    assert sandbox.record("auto", gpu=False)["level"] == "full"  # a CPU run leaves nothing out

    monkeypatch.setattr(sandbox, "_GPU_FIT", {**fit, "without": []})
    assert ex.sandbox_mode() == "require" and sandbox.WITHOUT_ENV not in os.environ
    assert sandbox.record("auto", gpu=True)["level"] == "full"
