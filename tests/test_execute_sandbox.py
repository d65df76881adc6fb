"""The port's process is sandboxed (issue 36): seeded ports that reach past their process, run end to
end on the CPU backend (real child processes), each stopped.

Every port here scored, or bent a later run, while a port's process could write the knowledge base and
the import path, read the harness's environment, signal the harness and leave processes behind. Where
a second defence holds without the sandbox (the ledger, the pinned problem module, handover files
opened without blocking), the same port is also run with ``sandbox="off"`` to show it.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from defects import escape
from defects.kb import card, make_defect_kb
from skillrun.evidence.index import build_index
from skillrun.evidence.validation import artifact_files, load_artifact, write_artifact
from skillrun.execute import run_skill
from skillrun.io import sandbox
from skillrun.kb.index import SkillIndex

E = "defects.escape"
SHAPE = {"M": 48, "N": 32, "K": 64}
REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(sandbox.support()["level"] != "full",
                                reason="this machine offers no user namespaces or no Landlock: runs here say they are unsandboxed")


def _card(cid: str, ref: str, config: dict | None = None, problem: str | None = None) -> dict:
    c = card(cid, ref)
    c["recipes"][0]["config"] = config or {}
    if problem:
        c["references"]["problem"] = problem
    return c


def _kb(tmp_path: Path, cards: list[dict]) -> tuple[SkillIndex, Path]:
    root = make_defect_kb(tmp_path / "kb", cards)
    index = SkillIndex.load(root)
    assert not index.errors, [str(e) for e in index.errors]
    return index, root / "validation"


def _run(index: SkillIndex, out: Path, cid: str, **kw) -> dict:
    (rec,) = run_skill(index, cid, [SHAPE], backend="cpu", validation_root=out, timeout_s=120, **kw)
    return rec


def _seed_evidence(out: Path) -> list[Path]:
    """Two committed artifacts, written into the run's validation folder by the runner (with ledger lines)."""
    src = sorted((REPO / "validation" / "triton_fp8_blockscale_gemm_sm90").glob("*.yaml"))[:2]
    return [write_artifact(load_artifact(p), out) for p in src]


def _daemons() -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_bytes().strip() == escape.DAEMON_NAME:
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def test_the_run_records_its_sandbox(tmp_path):
    index, out = _kb(tmp_path, [card("esc_ok", "defects.kernels:build_port_ok")])
    rec = _run(index, out, "esc_ok")
    assert rec["verdict"] == "cpu_numerics_passed", rec["reason"]
    assert rec["sandbox"]["level"] == "full" and rec["sandbox"]["pid_namespace"] and rec["sandbox"]["landlock_abi"] >= 1
    assert "unsandboxed" not in rec["sandbox"]
    off = _run(index, out, "esc_ok", sandbox="off")
    assert off["sandbox"]["level"] == "none" and "turned off" in off["sandbox"]["unsandboxed"]


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_port_that_writes_the_evidence_is_stopped_and_what_it_wrote_is_not_evidence(tmp_path, mode):
    index, out = _kb(tmp_path, [_card("esc_evidence", f"{E}:build_writes_evidence", {"validation": "PLACEHOLDER"})])
    seeded = _seed_evidence(out)
    before = {p: p.read_bytes() for p in seeded}
    index.skills["esc_evidence"].recipes[0].config["validation"] = str(out)
    rec = _run(index, out, "esc_evidence", sandbox=mode)
    assert rec["parity"]["port"]["passed"], rec["reason"]
    forged = [p for p in artifact_files(out) if "forged" in p.name]
    ev = build_index(index)
    if mode == "auto":  # the sandbox: nothing outside the task's own folders can be written
        assert not forged and all(p.exists() and p.read_bytes() == b for p, b in before.items())
        assert not ev.untrusted_entries() and not ev.lost
    else:  # without it the port wrote, and the ledger says so
        assert forged and not seeded[1].exists()
        why = {Path(e.path).name: e.error for e in ev.untrusted_entries()}
        assert "not written by the runner" in why[forged[0].name] and "changed since" in why[seeded[0].name]
        assert [Path(x["path"]).name for x in ev.lost] == [seeded[1].name]
        assert all(e.summary.verdict != "validated" for e in ev.current_entries())


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_daemon_left_by_the_port_does_not_outlive_the_run(tmp_path, mode):
    index, out = _kb(tmp_path, [_card("esc_daemon", f"{E}:build_daemon", {"validation": "X", "for_s": 60})])
    index.skills["esc_daemon"].recipes[0].config["validation"] = str(out)
    try:
        rec = _run(index, out, "esc_daemon", sandbox=mode)
        assert rec["verdict"] == "cpu_numerics_passed", rec["reason"]
        art = Path(rec["artifact"])
        end = time.monotonic() + 10  # the daemon looks every 0.2 s
        while time.monotonic() < end and not (mode == "off" and "cpu_numerics_passed" not in art.read_text()):
            time.sleep(0.3)
        left = _daemons()
        entry = build_index(index).find(art)
        if mode == "auto":  # its PID namespace ended with the task (and it had 10 s to strike)
            assert not left, left
            assert load_artifact(art)["verdict"] == "cpu_numerics_passed" and entry.status == "current"
        else:  # it lived on and rewrote the record; the ledger (and the schema) refuse the result
            assert left
            assert entry.status in ("untrusted", "invalid") and "validated" in art.read_text()
    finally:
        for pid in _daemons():
            os.kill(pid, signal.SIGKILL)


def test_a_port_finds_no_credential_in_its_environment_or_in_other_processes(tmp_path, monkeypatch):
    marker = "hf_skillrunCanary9f3e1a"
    monkeypatch.setenv("HF_TOKEN", marker)
    monkeypatch.setenv("SKILLRUN_TEST_CANARY", marker)
    # a process whose start-up environment holds the secret (the shell that started skill-run, say)
    holder = subprocess.Popen(["sleep", "120"], env={**os.environ, "HF_TOKEN": marker})
    try:
        index, out = _kb(tmp_path, [_card("esc_secrets", f"{E}:build_reads_secrets", {"marker": marker})])
        rec = _run(index, out, "esc_secrets")
        assert rec["parity"]["port"]["passed"], rec["reason"]  # it raises if it finds the canary anywhere
        off = _run(index, out, "esc_secrets", sandbox="off")
        # without the PID namespace the holder's /proc/<pid>/environ is there to read; the scrubbed
        # environment of the port's own process still holds nothing
        err = off["parity"]["port"].get("error") or ""
        assert "found the canary" in err and "env " not in err and f"/proc/{holder.pid}/environ" in err
    finally:
        holder.kill()
        holder.wait()


def test_a_sitecustomize_cannot_be_dropped_on_the_import_path_for_a_later_run(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))  # a writable folder on the import path (children get it too)
    index, out = _kb(tmp_path, [_card("esc_site", f"{E}:build_drops_sitecustomize", {"dirs": [str(site)]}),
                                _card("esc_zeros", f"{E}:build_zeros")])
    rec = _run(index, out, "esc_site")
    assert rec["parity"]["port"]["passed"], rec["reason"]
    assert not (site / "sitecustomize.py").exists()
    later = _run(index, out, "esc_zeros", isolation="spawn")  # fresh interpreters, which would import it
    assert not later["parity"]["port"]["passed"] and later["verdict"] == "parity_failed"


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_code_appended_to_the_problem_module_never_reaches_the_judge(tmp_path, monkeypatch, mode):
    from skillrun.execute import parity

    pkg = tmp_path / "pkgs" / "escprob"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(REPO / "tests" / "defects" / "problem.py", pkg / "problem.py")
    original = (pkg / "problem.py").read_bytes()
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    index, out = _kb(tmp_path, [_card("esc_problem", f"{E}:build_edits_problem",
                                      {"problem_file": str(pkg / "problem.py"), "restore_after_s": 4},
                                      problem="escprob.problem")])
    real = parity.compare
    try:
        rec = _run(index, out, "esc_problem", sandbox=mode, timer="wall", rounds=8, warmup=1)
        assert rec["verdict"] in ("parity_failed", "error") and rec.get("speedup") is None, rec["reason"]
        assert not rec["parity"]["port"]["passed"]
        assert parity.compare is real  # the parent's comparison is its own
        if mode == "auto":
            assert (pkg / "problem.py").read_bytes() == original
        else:  # it did write the file: the judge refused to judge with it (or judged with the pinned bytes)
            err = rec["parity"]["port"].get("error") or ""
            assert "changed while the candidates ran" in err or "outside rtol" in err, err
    finally:
        time.sleep(0.1)
        (pkg / "problem.py").write_bytes(original)


def test_a_port_cannot_stop_the_harness(tmp_path):
    index, out = _kb(tmp_path, [_card("esc_stop", f"{E}:build_stops_the_harness")])
    t0 = time.monotonic()
    rec = _run(index, out, "esc_stop", timer="wall", rounds=8, warmup=1)
    assert rec["verdict"] == "cpu_numerics_passed", rec["reason"]
    assert time.monotonic() - t0 < 90


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_fifo_handed_over_for_an_output_neither_blocks_the_judge_nor_passes(tmp_path, mode):
    index, out = _kb(tmp_path, [_card("esc_fifo", f"{E}:build_fifo_handover")])
    t0 = time.monotonic()
    rec = _run(index, out, "esc_fifo", sandbox=mode)
    assert time.monotonic() - t0 < 90
    p = rec["parity"]["port"]
    assert not p["passed"] and rec["verdict"] in ("parity_failed", "error")
    assert ("not a regular file" if mode == "off" else "no output was handed over") in p["error"], p["error"]


def test_the_sandbox_probe_says_what_holds_here():
    rep = sandbox.probe()
    assert rep["support"]["level"] == "full" and not rep["problems"], rep
    assert set(rep["held"]["checks"]) >= {"environment scrubbed", "import path read-only", "harness invisible", "private /proc"}


def test_the_environment_handed_to_children_keeps_device_settings_and_drops_credentials():
    env = sandbox.scrub_env({"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "1", "TRITON_INTERPRET": "1", "HF_TOKEN": "hf_x",
                             "AWS_SECRET_ACCESS_KEY": "abc", "MY_APP_SETTING": "1", "TRITON_API_KEY": "k",
                             "PYTHONPATH": "/x", "LC_ALL": "C.UTF-8", "CUDA_HOME": "ghp_" + "a" * 36})
    assert env == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "1", "TRITON_INTERPRET": "1", "PYTHONPATH": "/x",
                   "LC_ALL": "C.UTF-8"}


def test_inside_the_sandbox_no_special_file_can_be_made_and_nothing_outside_written(tmp_path):
    """FIFOs, sockets and links (a hand-over a reader would block on, or a path sent elsewhere) are
    refused in the task's own folder; the import path and the temporary folder are not writable."""
    import json as _json

    code = f"""
import json, os, socket, sys
from skillrun.io import sandbox
sandbox.enter([{str(tmp_path / "own")!r}], mode="require")
res = {{}}
def tryit(name, fn):
    try:
        fn(); res[name] = "made"
    except OSError:
        res[name] = "refused"
tryit("fifo", lambda: os.mkfifo({str(tmp_path / "own" / "f")!r}))
tryit("symlink", lambda: os.symlink("/etc/passwd", {str(tmp_path / "own" / "l")!r}))
tryit("socket", lambda: socket.socket(socket.AF_UNIX).bind({str(tmp_path / "own" / "s")!r}))
tryit("file", lambda: open({str(tmp_path / "own" / "ok")!r}, "w").write("x"))
tryit("import path", lambda: open(os.path.join(sys.path[-1] if os.path.isdir(sys.path[-1]) else sys.prefix, "x.py"), "w"))
tryit("tmp", lambda: open({str(tmp_path / "elsewhere")!r}, "w"))
print(json.dumps(res))
"""
    (tmp_path / "own").mkdir()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    res = _json.loads(out.stdout.strip().splitlines()[-1])
    assert res == {"fifo": "refused", "symlink": "refused", "socket": "refused", "file": "made",
                   "import path": "refused", "tmp": "refused"}, (res, out.stderr[-500:])
