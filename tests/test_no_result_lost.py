"""No result lost: an artifact that cannot be written still leaves the verdict on stdout (and in
--json), with an error naming the folder and the cause; every failing --json call prints a JSON
error object; absurd shapes are usage errors."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from defects.kb import card, make_defect_kb
from skillrun.io import atomic
from skillrun.errors import EXIT_USAGE, SkillRunError, UsageError
from skillrun.plan.select import parse_shape

pytestmark = pytest.mark.timeout(300)

TESTS = Path(__file__).resolve().parent


def skill_run(*args: str, kb: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "skillrun", *(("--kb", str(kb)) if kb else ()), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)


@pytest.fixture(scope="module")
def blocked_kb(tmp_path_factory) -> Path:
    """A knowledge base whose validation/ is a plain file: no artifact can be written under it."""
    root = make_defect_kb(tmp_path_factory.mktemp("blocked"), [card("defect_ok", "defects.kernels:build_port_ok")])
    (root / "validation").write_text("not a folder\n")
    return root


def test_a_finished_run_keeps_its_verdict_in_json_when_the_artifact_cannot_be_written(blocked_kb):
    r = skill_run("run", "defect_ok", "--shape", "48,32,64", "--backend", "cpu", "--seeds", "1", "--json", kb=blocked_kb)
    assert r.returncode == 1, r.stderr
    (rec,) = json.loads(r.stdout)["results"]
    assert rec["verdict"] not in (None, "error") and rec["artifact"] is None
    assert str(blocked_kb / "validation") in rec["artifact_error"]
    assert "not saved" in r.stderr and "internal error" not in r.stderr


def test_a_finished_run_prints_its_verdict_when_the_artifact_cannot_be_written(blocked_kb):
    r = skill_run("run", "defect_ok", "--shape", "48,32,64", "--backend", "cpu", "--seeds", "1", kb=blocked_kb)
    assert r.returncode == 1, r.stderr
    assert "defect_ok" in r.stdout or "only" in r.stdout  # the result table reached stdout
    assert "not saved" in r.stderr and str(blocked_kb / "validation") in r.stderr.replace("\n", "")


def test_atomic_write_names_the_folder_and_cause_when_it_is_full(tmp_path, monkeypatch):
    real_open = os.open

    def full(path, flags, *a, **kw):
        if flags & os.O_EXCL:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(atomic.os, "open", full)
    with pytest.raises(SkillRunError) as exc:
        atomic.write_atomic(tmp_path / "x.yaml", "a: 1\n")
    assert exc.value.path == str(tmp_path) and "No space left" in exc.value.reason
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("text", ["18446744073709551617,1,128", "M=4096,N=2147483648,K=128", "4096,1,1" + "0" * 5000])
def test_absurd_shapes_are_usage_errors(text):
    with pytest.raises(UsageError):
        parse_shape(text, ("M", "N", "K"))


@pytest.mark.parametrize("args", [
    ("--json", "show", "no_such_card"),
    ("list", "--json", "--no-such-option"),
    ("--json", "--run"),
    ("--json", "run", "triton_fp8_blockscale_gemm_sm90", "--shape", "18446744073709551617,7168,2048", "--backend", "cpu"),
    ("--json", "--profile", "/nonexistent/trace.json"),
])
def test_every_failing_json_call_prints_a_json_error_object(args):
    r = skill_run(*args)
    assert r.returncode != 0
    data = json.loads(r.stdout)
    assert data["error"]["reason"] and data["error"]["exit_code"] == r.returncode


def test_absurd_shape_exits_2_before_running():
    r = skill_run("run", "triton_fp8_blockscale_gemm_sm90", "--shape", "18446744073709551617,7168,2048", "--backend", "cpu")
    assert r.returncode == EXIT_USAGE and "larger than any real problem" in r.stderr


@pytest.mark.slow
def test_a_finished_compile_check_keeps_its_verdict_when_the_artifact_cannot_be_written(tmp_path):
    """`check` (a real FlyDSL compile of one recipe) into a validation root that is a plain file."""
    from skillrun.check import check_skill
    from skillrun.check.flydsl_env import require_toolchain
    from skillrun.kb.index import SkillIndex

    try:
        require_toolchain()
    except SkillRunError as exc:
        pytest.skip(f"FlyDSL toolchain not here: {exc.reason}")
    blocked = tmp_path / "validation"
    blocked.write_text("not a folder\n")
    index = SkillIndex.load(TESTS.parent)
    card = index.skill("flydsl_fp8_blockscale_gemm")
    recipe = card.recipes[0].name
    report = check_skill(index, card.id, arch="gfx950", recipes=[recipe], write=True, timeout_s=900,
                         validation_root=blocked)
    (chk,) = report.checks
    assert chk.status in ("compile_verified", "compile_failed") and chk.artifact is None
    assert str(blocked) in chk.artifact_error
