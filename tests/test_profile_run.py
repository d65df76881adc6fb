"""`skill-run profile`: torch.profiler injected through the start-up hook, on CPU.

Each torch run starts a fresh interpreter that imports torch (a few seconds here), so the
workload is tiny and each scenario runs once. Iteration i multiplies an (8+i)x16 by a 16x24
matrix, so the `Input Dims` of the `aten::mm` events say exactly which iterations a trace holds.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from skillrun import profiling
from skillrun.cli.entry import app
from skillrun.errors import EXIT_FAILURE, EXIT_UNAVAILABLE, EXIT_USAGE, SkillRunError, UsageError
from skillrun.profiling.run import WorkloadFailed, parse_steps, profile_workload

pytest.importorskip("torch")

ITERS = 5
WORKLOAD = """\
import json, os, subprocess, sys
import torch
from skillrun import profiling

report, iters = sys.argv[1], int(sys.argv[2])
for i in range(iters):
    a = torch.randn(8 + i, 16)
    b = torch.randn(16, 24)
    with profiling.region(f"iter{i}"):
        torch.mm(a, b)
    torch.sub(a, 1.0)
    profiling.step()
probe = "import os, sys; print(int('SKILLRUN_PROFILE_OUT' in os.environ or any('skillrun-profile-' in p for p in sys.path)))"
grandchild = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
with open(report, "w") as fh:
    json.dump({"active": profiling.active(), "grandchild_profiled": grandchild,
               "user_sitecustomize": os.environ.get("USER_SITECUSTOMIZE_RAN")}, fh)
sys.exit(int(os.environ.get("WORKLOAD_EXIT", "0")))
"""


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    script = tmp_path / "work" / "workload.py"
    script.parent.mkdir()
    script.write_text(WORKLOAD)
    return script


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def _complete_events(trace: dict) -> list[dict]:
    assert isinstance(trace.get("traceEvents"), list) and "schemaVersion" in trace, "not a Kineto trace"
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    for e in events:
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
    return events


def _mm_rows(events: list[dict]) -> list[int]:
    """The M of every aten::mm cpu_op, i.e. which iterations the trace holds (M = 8 + i)."""
    rows = []
    for e in events:
        if e["name"] == "aten::mm" and e.get("cat") == "cpu_op":
            dims = e["args"]["Input Dims"]
            assert dims[0][1] == 16 and dims[1] == [16, 24], dims
            rows.append(dims[0][0])
    return sorted(rows)


def _steps(events: list[dict]) -> set[str]:
    return {e["name"] for e in events if e["name"].startswith("ProfilerStep#")}


def _text(res) -> str:
    """CLI output with rich's line wrapping undone."""
    return " ".join(res.output.split())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_whole_run_through_the_cli_leaves_the_script_untouched(workload: Path, tmp_path: Path):
    # A sitecustomize the user already had must still run: ours chains to it.
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    before_sha, before_files = _sha(workload), sorted(p.name for p in workload.parent.iterdir())
    out, report = tmp_path / "trace.json", tmp_path / "report.json"

    res = CliRunner().invoke(app, ["profile", "--out", str(out), "--activities", "cpu", "--no-analyze", "--",
                                   sys.executable, str(workload), str(report), str(ITERS)],
                             env={"PYTHONPATH": str(user_site)})
    assert res.exit_code == 0, res.output
    assert f"wrote {out}" in _text(res)

    events = _complete_events(_load(out))
    assert _mm_rows(events) == [8 + i for i in range(ITERS)]
    assert any(e["name"] == "aten::sub" for e in events)
    # step() was called ITERS times: steps 0..ITERS-1 plus the tail after the last call.
    assert _steps(events) == {f"ProfilerStep#{i}" for i in range(ITERS + 1)}

    seen = json.loads(report.read_text())
    assert seen["active"] is True  # the script's markers reached the injected profiler
    assert seen["grandchild_profiled"] == "0"  # only the first interpreter is profiled
    assert seen["user_sitecustomize"] == "1"
    assert _sha(workload) == before_sha
    assert sorted(p.name for p in workload.parent.iterdir()) == before_files


def test_steps_window_keeps_only_those_steps_and_gzips(workload: Path, tmp_path: Path):
    out = tmp_path / "sub" / "steps.json.gz"
    got = profile_workload([sys.executable, str(workload), str(tmp_path / "r.json"), str(ITERS)], out,
                           steps="1:3", activities="cpu")
    assert got == out
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    events = _complete_events(_load(out))
    assert _steps(events) == {"ProfilerStep#1", "ProfilerStep#2"}
    assert _mm_rows(events) == [9, 10]  # iterations 1 and 2 only


def test_region_mode_keeps_only_region_blocks(workload: Path, tmp_path: Path):
    out = tmp_path / "region.json"
    profile_workload([sys.executable, str(workload), str(tmp_path / "r.json"), "3"], out, region=True, activities="cpu")
    events = _complete_events(_load(out))
    assert _mm_rows(events) == [8, 9, 10]
    assert {e["name"] for e in events if e.get("cat") == "user_annotation"} >= {"iter0", "iter1", "iter2"}
    names = {e["name"] for e in events}
    assert "aten::sub" not in names and "aten::randn" not in names  # outside the regions


def test_failing_workload_reports_its_exit_code(workload: Path, tmp_path: Path):
    out = tmp_path / "fail.json"
    res = CliRunner().invoke(app, ["profile", "--out", str(out), "--activities", "cpu", "--no-analyze", "--",
                                   sys.executable, str(workload), str(tmp_path / "r.json"), "2"],
                             env={"WORKLOAD_EXIT": "3"})
    assert res.exit_code == EXIT_FAILURE, res.output
    assert "exited with code 3" in _text(res)
    # SystemExit still runs the exit handler, so what was recorded is kept and named.
    assert "partial trace" in _text(res) and out.exists()
    assert _mm_rows(_complete_events(_load(out))) == [8, 9]


def test_window_never_reached_says_why(workload: Path, tmp_path: Path):
    out = tmp_path / "never.json"
    with pytest.raises(SkillRunError) as exc:
        profile_workload([sys.executable, str(workload), str(tmp_path / "r.json"), "2"], out, steps="50:60", activities="cpu")
    assert not isinstance(exc.value, WorkloadFailed)
    assert "step() 2 time(s)" in str(exc.value) and "step 50" in str(exc.value)
    assert not out.exists()


def test_missing_tool_exits_5_and_names_it(tmp_path: Path):
    empty = tmp_path / "bin"
    empty.mkdir()
    for tool in ("nsys", "rocprofv3"):
        res = CliRunner().invoke(app, ["profile", "--tool", tool, "--no-analyze", "--", "python", "x.py"], env={"PATH": str(empty)})
        assert res.exit_code == EXIT_UNAVAILABLE, res.output
        assert f"{tool} is not on PATH" in _text(res)


def _fake_rocprofv3(bin_dir: Path, exit_code: int) -> None:
    """Stands in for rocprofv3's file layout (DIR/<host>/<pid>_kernel_trace.csv) to test discovery."""
    fake = bin_dir / "rocprofv3"
    fake.write_text(f"""#!{sys.executable}
import os, subprocess, sys
args = sys.argv[1:]
assert "--kernel-trace" in args and args[args.index("--output-format") + 1] == "csv", args
folder = os.path.join(args[args.index("-d") + 1], "host")
os.makedirs(folder)
rc = subprocess.call(args[args.index("--") + 1:])
with open(os.path.join(folder, "4242_kernel_trace.csv"), "w") as fh:
    fh.write('"Kind","Agent_Id","Kernel_Name"\\n"KERNEL_DISPATCH","Agent 1","gemm"\\n')
with open(os.path.join(folder, "4242_agent_info.csv"), "w") as fh:
    fh.write("not this one\\n")
sys.exit(rc or {exit_code})
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)


def test_rocprofv3_output_is_found_and_copied(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_rocprofv3(bin_dir, 0)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    out = profile_workload([sys.executable, "-c", "pass"], tmp_path / "k.csv", tool="rocprofv3", env=env)
    assert out.read_text().startswith('"Kind","Agent_Id"')

    _fake_rocprofv3(bin_dir, 7)
    with pytest.raises(WorkloadFailed) as exc:
        profile_workload([sys.executable, "-c", "pass"], tmp_path / "k2.csv", tool="rocprofv3", env=env)
    assert exc.value.returncode == 7 and "exited with code 7" in str(exc.value)


def test_steps_parsing_and_usage_errors(tmp_path: Path):
    assert parse_steps("2:5") == (2, 5)
    assert parse_steps("3") == (3, 4)
    assert parse_steps(":2") == (0, 2)
    assert parse_steps("4:") == (4, None)
    assert parse_steps(None) is None
    for bad in ("5:2", "3:3", "-1:4", "a:b", "1.5"):
        with pytest.raises(UsageError):
            parse_steps(bad)
    res = CliRunner().invoke(app, ["profile", "--steps", "1:2", "--region", "--no-analyze", "--", "python", "x.py"])
    assert res.exit_code == EXIT_USAGE and "--steps" in _text(res)
    res = CliRunner().invoke(app, ["profile", "--tool", "nsys", "--steps", "1:2", "--no-analyze", "--", "python", "x.py"])
    assert res.exit_code == EXIT_USAGE and "--tool torch" in _text(res)
    res = CliRunner().invoke(app, ["profile", "--activities", "tpu", "--no-analyze", "--", "python", "x.py"])
    assert res.exit_code == EXIT_USAGE and "tpu" in _text(res)


def test_markers_do_nothing_outside_skill_run_profile():
    assert profiling.active() is False
    assert profiling.step() is None
    with profiling.region("x"):
        pass

    @profiling.region("decorated")
    def f(v: int) -> int:
        return v + 1

    assert f(1) == 2
    with pytest.raises(KeyError):  # exceptions pass through the region unchanged
        with profiling.region("boom"):
            raise KeyError("k")


def test_profile_then_analyse_prints_json(workload: Path, tmp_path: Path):
    try:
        from skillrun.ingest import ingest  # noqa: F401
    except ImportError:
        pytest.skip("trace ingestion (skillrun.ingest.ingest) is not in this checkout yet")
    out = tmp_path / "a.json"
    res = CliRunner().invoke(app, ["profile", "--out", str(out), "--activities", "cpu", "--json", "--",
                                   sys.executable, str(workload), str(tmp_path / "r.json"), "2"])
    # A CPU-only trace has no GPU kernel to rank or match: bad input (exit 3) that says why, not an
    # empty table read as "no card matched" (exit 4). The trace itself was written.
    assert res.exit_code == 3, res.output
    assert "no GPU kernel executions" in res.output and str(out) in res.output
    assert out.is_file()


def test_parent_side_needs_only_the_standard_library():
    # `python -m skillrun.profiling.run` must work on a bare GPU image without the CLI's dependencies.
    import subprocess

    probe = ("import sys, skillrun.profiling.run, skillrun.profiling; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic','typer','rich','jsonschema','ijson','yaml','torch')))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def _bare_python() -> str | None:
    """An interpreter with neither torch nor skillrun installed, if this machine has one."""
    import shutil
    import subprocess

    for cand in ("/usr/bin/python3", shutil.which("python3")):
        if cand and Path(cand).exists() and Path(cand).resolve() != Path(sys.executable).resolve():
            ok = subprocess.run([cand, "-c", "import importlib.util as u, sys; "
                                 "sys.exit(0 if u.find_spec('torch') is None and u.find_spec('skillrun') is None else 1)"],
                                capture_output=True).returncode == 0
            if ok:
                return cand
    return None


def test_interpreter_without_torch_gets_markers_and_exit_5(tmp_path: Path, capfd):
    bare = _bare_python()
    if bare is None:
        pytest.skip("no interpreter without torch and skillrun on this machine")
    script = tmp_path / "plain.py"
    script.write_text("from skillrun import profiling\nprofiling.step()\nwith profiling.region('r'):\n    pass\n"
                      "print('markers-ok', profiling.active())\n")
    res = CliRunner().invoke(app, ["profile", "--out", str(tmp_path / "t.json"), "--no-analyze", "--", bare, str(script)])
    assert res.exit_code == EXIT_UNAVAILABLE, res.output
    assert "torch is not importable" in _text(res)
    # The hook loaded its copy of skillrun.profiling, so the script's import worked (and did nothing).
    assert "markers-ok False" in capfd.readouterr().out


LOOP_FOREVER = """\
import sys, time
import torch
from skillrun import profiling

ready = sys.argv[1]
i = 0
while True:
    torch.mm(torch.randn(8, 16), torch.randn(16, 24))
    profiling.step()
    if i == 2:
        open(ready, "w").close()
    i += 1
    time.sleep(0.01)
"""


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_stopping_a_long_run_still_writes_the_trace(tmp_path: Path, how: str):
    """A server or endless loop is ended with SIGTERM or Ctrl-C; the trace of what ran must survive."""
    import signal
    import subprocess
    import time

    script, ready, out = tmp_path / "loop.py", tmp_path / "ready", tmp_path / "loop.json"
    script.write_text(LOOP_FOREVER)
    parent = subprocess.Popen([sys.executable, "-m", "skillrun.profiling.run", "--out", str(out), "--activities", "cpu", "--",
                               sys.executable, str(script), str(ready)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert parent.poll() is None, parent.communicate()
            assert time.monotonic() < deadline, "workload never got going"
            time.sleep(0.05)
        if how == "sigterm":
            parent.send_signal(signal.SIGTERM)  # to skill-run only: it must pass it on
        else:
            os.killpg(parent.pid, signal.SIGINT)  # what a terminal does: the whole group
        stdout, stderr = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    if how == "sigterm":
        assert parent.returncode == EXIT_FAILURE, stderr
        assert "exited with code 143" in stderr and "partial trace" in stderr
    else:
        assert parent.returncode == 0, stderr
        assert f"wrote {out}" in stdout
    assert len(_mm_rows(_complete_events(_load(out)))) >= 3
