"""Traces and outputs: special files refused at once, valid JSON/CSV always parsed, strict JSON out,
secrets scrubbed wherever trace text goes, outputs written atomically, impossible values counted."""
from __future__ import annotations

import copy
import gzip
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kbfixture import make_kb
from skillrun.agent import build_tools
from skillrun.io.atomic import TMP_PREFIX, TMP_SUFFIX, write_atomic
from skillrun.errors import InputError, SkillRunError
from skillrun.ingest import ingest
from skillrun.ingest._jsonhead import walk_stream
from skillrun.kb.index import SkillIndex
from skillrun.lint import lint
from skillrun.io.strict_json import dumps as strict_dumps

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]
CK_TRACE = REPO / "tests" / "fixtures" / "kineto_gfx950_ck_blockscale.synthetic.json"
CSV_TRACE = REPO / "tests" / "fixtures" / "rocprofv3_kernel_trace_new.synthetic.csv"


def skill_run(*args: str, kb: Path | None = None, timeout: int = 60) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "skillrun"] + (["--kb", str(kb)] if kb else []) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _ck() -> dict:
    return json.loads(CK_TRACE.read_text())


def _strict_loads(text: str):
    def no_constant(name):
        raise ValueError(f"non-JSON constant {name}")

    return json.loads(text, parse_constant=no_constant)


# ----------------------------------------------------------------------------- 11. special files
@pytest.fixture
def fifo():
    d = Path(tempfile.mkdtemp(prefix="kbt-"))
    p = d / "trace.json"
    os.mkfifo(p)
    yield p
    p.unlink()
    d.rmdir()


def test_cli_refuses_a_fifo_at_once(fifo):
    res = skill_run("--profile", str(fifo))  # would block forever on open() before the fix
    assert res.returncode == 3 and "FIFO" in res.stderr, res.stderr


def test_cli_refuses_a_device_and_a_socket():
    res = skill_run("--profile", "/dev/zero")  # would read zeros until the 64 GiB cap
    assert res.returncode == 3 and "character device" in res.stderr, res.stderr
    d = Path(tempfile.mkdtemp(prefix="kbt-"))
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(d / "s.json"))
        with pytest.raises(InputError, match="socket"):
            ingest(d / "s.json")
    finally:
        sock.close()
        (d / "s.json").unlink()
        d.rmdir()


def test_agent_analyze_profile_refuses_a_fifo(fifo, tmp_path):
    tools = {t.name: t for t in build_tools(SkillIndex.load(make_kb(tmp_path / "kb")), allowed_paths=[fifo.parent])}
    out = json.loads(tools["analyze_profile"].invoke({"path": str(fifo)}))
    assert out["ok"] is False and "FIFO" in out["error"]


def test_a_fifo_where_a_card_should_be_does_not_hang_lint(tmp_path):
    root = make_kb(tmp_path)
    d = root / "skills" / "pipe_card"
    d.mkdir()
    os.mkfifo(d / "SKILL.md")
    rep = lint(SkillIndex.load(root))
    assert any(e.path == str(d / "SKILL.md") and "FIFO" in e.reason for e in rep.errors)


# ----------------------------------------------------------------------------- 12. valid JSON / CSV parse
def _reader(data: bytes):
    pos = [0]

    def read(n: int) -> bytes:
        out = data[pos[0]:pos[0] + n]
        pos[0] += len(out)
        return out

    return read


def test_header_string_straddling_the_first_read_is_valid():
    # The string starts well inside the first 64 KiB and ends past it.
    doc = b'{"note": "' + b"x" * 70000 + b'", "deviceProperties": [{"id": 0}], "traceEvents": []}'
    top, _ = walk_stream(_reader(doc), {"traceEvents"}, {"deviceProperties"})
    assert top.stop_key == "traceEvents" and top.values["deviceProperties"] == [{"id": 0}]
    key = b'{"' + b"k" * 70000 + b'": 1, "traceEvents": []}'  # the same for a long key
    assert walk_stream(_reader(key), {"traceEvents"}, set())[0].stop_key == "traceEvents"


def test_deep_nesting_before_and_after_the_events_is_valid(tmp_path):
    deep = "[" * 20000 + "]" * 20000
    top, _ = walk_stream(_reader(f'{{"deep": {deep}, "traceEvents": []}}'.encode()), {"traceEvents"}, {"deep"})
    assert top.stop_key == "traceEvents" and "deep" not in top.values  # skipped, never decoded
    doc = _ck()
    text = json.dumps(doc)
    for name, patched in [("before", text.replace('"traceEvents":', f'"deep": {deep}, "traceEvents":', 1)),
                          ("after", text[:-1] + f', "deep": {deep}}}')]:
        p = tmp_path / f"deep_{name}.json"
        p.write_text(patched)
        res = skill_run("--profile", str(p), "--json")
        assert res.returncode == 0, (name, res.stderr)
        assert _strict_loads(res.stdout)["matches"]["matches"], name


def test_csv_field_longer_than_the_csv_module_default(tmp_path):
    lines = CSV_TRACE.read_text().splitlines()
    row = lines[1].split('","')
    row[7] = "Cijk_" + "L" * 300_000  # Kernel_Name: 300 KB, over csv's 128 KiB default
    p = tmp_path / "long.csv"
    p.write_text("\n".join([lines[0], '","'.join(row)] + lines[2:]) + "\n")
    prof = ingest(p)
    # Read (not refused), but kept only to the per-name cap, and the cut is counted.
    long = [k for k in prof.kernels if k.name.startswith("Cijk_LLL")]
    assert long and all(len(k.name) < 9000 for k in long) and "more characters" in long[0].name
    assert prof.anomalies.get("name_truncated")


def test_strict_json_never_emits_nan_or_infinity():
    data = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": {"d": (math.nan,)}, "k": "v"}
    text = strict_dumps(data)
    assert _strict_loads(text) == {"a": None, "b": [None, None, 1.5], "c": {"d": [None]}, "k": "v"}
    assert list(_strict_loads(strict_dumps({"z": 1, "a": 2}))) == ["z", "a"]  # key order kept


# ----------------------------------------------------------------------------- 13. secrets
SECRETS = ["hf_q", "ghp_7", "github_pat_1", "sk-ant-x", "xoxb-1", "AKIA12", "glpat-z", "nvapi-k"]


@pytest.mark.parametrize("token", SECRETS)
def test_prefixed_tokens_of_any_length_are_scrubbed(token):
    from skillrun.io.redact import REDACTED, scrub_text

    assert scrub_text(f"arg {token} end") == f"arg {REDACTED} end"
    assert scrub_text(f"['{token}X9YZ']") == f"['{REDACTED}']"


def test_trace_free_text_is_scrubbed_in_json_and_agent_results(tmp_path):
    doc = _ck()
    op = next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {}))
    op["args"]["Concrete Inputs"] = ["hf_q", "ghp_7", "", "", "token=sk-ant-x"]
    op["args"]["Input type"] = [t if i else "c10::Float8_e4m3fn github_pat_1" for i, t in enumerate(op["args"]["Input type"])]
    doc["deviceProperties"][0]["name"] = "AMD Instinct MI355X glpat-z"
    p = tmp_path / "secret.json"
    p.write_text(json.dumps(doc))
    res = skill_run("--profile", str(p), "--json")
    assert res.returncode in (0, 4), res.stderr
    for s in SECRETS[:4] + ["glpat-z"]:
        assert s not in res.stdout, s
    assert "<redacted>" in res.stdout
    tools = {t.name: t for t in build_tools(SkillIndex.load(make_kb(tmp_path / "kb")), allowed_paths=[tmp_path])}
    out = tools["analyze_profile"].invoke({"path": str(p)})
    for s in SECRETS[:4] + ["glpat-z"]:
        assert s not in out, s


def test_real_kernel_names_are_not_scrubbed():
    from skillrun.io.redact import scrub_text

    for f in (CK_TRACE, CSV_TRACE, REPO / "tests" / "fixtures" / "nsys_cuda_gpu_kern_sum.synthetic.csv"):
        for k in ingest(f).kernels:
            assert "<redacted>" not in k.name, k.name
    for name in ("void at::native::(anonymous namespace)::mask_kernel<float>", "task-queue-kernel",
                 "triton_per_fused_sk_add_0", "nvjet_hsh_64x8_64x16_2x1_v_bz_TNN"):
        assert scrub_text(name) == name


# ----------------------------------------------------------------------------- 14. files we write
def test_planted_symlink_at_the_old_temporary_name_redirects_nothing(tmp_path):
    from skillrun.output.report import write_html

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "report.html"
    (tmp_path / "report.html.tmp").symlink_to(victim)  # the fixed name the report used to write through
    write_html([], out)
    assert victim.read_text() == "precious"
    assert out.is_file() and not out.is_symlink() and "<!DOCTYPE html>" in out.read_text()
    # A symlink planted at the target itself is replaced, not followed.
    out2 = tmp_path / "r2.html"
    out2.symlink_to(victim)
    write_atomic(out2, "new")
    assert victim.read_text() == "precious" and not out2.is_symlink() and out2.read_text() == "new"


def _record(tmp_path: Path) -> dict:
    from skillrun.evidence.validation import load_artifact

    # a validation record (tuning artifacts and e2e records have their own schemas)
    src = next(p for p in sorted((REPO / "validation").rglob("*.yaml")) if not {"_tuning", "e2e"} & set(p.parts))
    return load_artifact(src)


def test_no_evidence_written_through_a_symlinked_card_folder(tmp_path):
    from skillrun.evidence.store import slug as _slug
    from skillrun.evidence.validation import write_artifact

    rec = _record(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base = tmp_path / "validation"
    base.mkdir()
    (base / _slug(rec["card"]["id"])).symlink_to(elsewhere)
    with pytest.raises(SkillRunError, match="symlink"):
        write_artifact(copy.deepcopy(rec), root=base)
    assert list(elsewhere.iterdir()) == []


def test_leftover_temporaries_are_ignored_by_lint_and_cleaned_by_the_writer(tmp_path):
    from skillrun.evidence.store import slug as _slug
    from skillrun.evidence.validation import write_artifact

    rec = _record(tmp_path)
    root = make_kb(tmp_path / "kb")
    folder = root / "validation" / _slug(rec["card"]["id"])
    folder.mkdir(parents=True)
    (folder / ".tmp-abc123.yaml").write_text("half: [written")  # an older writer's leftover
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = folder / f"{TMP_PREFIX}{dead.pid}-0123abcd{TMP_SUFFIX}"
    stale.write_text("half")
    live = folder / f"{TMP_PREFIX}{os.getpid()}-feedbeef{TMP_SUFFIX}"  # a write in progress
    live.write_text("in progress")
    rep = lint(SkillIndex.load(root))
    assert not any(".tmp-" in (e.path or "") for e in rep.errors), [str(e) for e in rep.errors]
    written = write_artifact(copy.deepcopy(rec), root=root / "validation")
    assert written.exists() and not stale.exists() and live.exists()


def test_sigterm_during_a_gzip_read_removes_the_decompressed_temporary(tmp_path):
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(CK_TRACE.read_bytes()))
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    ready = tmp_path / "ready"
    script = f"""
import time
from pathlib import Path
from skillrun.ingest import _io, torch_trace
real = _io.iter_decompressed
def slow(path, chunk, **kw):
    for b in real(path, chunk, **kw):
        yield b
    Path({str(ready)!r}).write_text("x")
    time.sleep(60)  # stands for a long decompression
_io.iter_decompressed = slow
torch_trace.ingest_kineto(Path({str(gz)!r}), small_limit=0, workers=1)
"""
    env = dict(os.environ, TMPDIR=str(tmpdir))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert ready.exists(), proc.stderr.read().decode() if proc.poll() is not None else "never got ready"
    assert [p.name for p in tmpdir.iterdir() if p.name.startswith("skillrun-trace-")]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert not [p for p in tmpdir.iterdir() if p.name.startswith("skillrun-trace-")]


# ----------------------------------------------------------------------------- 15. impossible values
def test_negative_durations_and_absurd_shapes_are_counted_not_clamped_or_planned(tmp_path):
    doc = _ck()
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[0]["dur"] = -50.0
    op = [e for e in doc["traceEvents"] if e.get("name") == "aiter::gemm_a8w8_blockscale"][-1]
    for i in (0, 2, 4):  # M = 10^12 rows, consistently in A, its scales and the output
        op["args"]["Input Dims"][i][0] = 10**12
    p = tmp_path / "odd.json"
    p.write_text(json.dumps(doc))
    prof = ingest(p)
    assert prof.anomalies["negative_duration"] == 1
    assert prof.anomalies["absurd_shape"] >= 1
    assert any("cannot mean" in w for w in prof.warnings)
    res = skill_run("--profile", str(p), "--json")
    data = _strict_loads(res.stdout)
    assert data["profile"]["anomalies"] == prof.anomalies
    for item in data["plan"]["items"]:
        assert all(v < 2**31 for v in (item["shape"] or {}).values()), item


def test_non_finite_and_negative_csv_timestamps_are_counted(tmp_path):
    lines = CSV_TRACE.read_text().splitlines()
    rows = [r.split('","') for r in lines[1:4]]
    rows[0][9] = "nan"  # Start_Timestamp
    rows[1][10] = "inf"  # End_Timestamp
    rows[2][9], rows[2][10] = "2000", "1000"  # ends before it starts
    p = tmp_path / "odd.csv"
    p.write_text("\n".join([lines[0]] + ['","'.join(r) for r in rows] + lines[4:]) + "\n")
    prof = ingest(p)
    assert prof.anomalies == {"negative_duration": 1, "non_finite_timestamp": 2}, prof.anomalies
    assert math.isfinite(prof.total_kernel_us)


def test_evidence_and_the_html_report_carry_no_token(tmp_path):
    from skillrun.output.report import load_artifacts, write_html
    from skillrun.evidence.validation import write_artifact

    rec = _record(tmp_path)
    rec["command"] = "skill-run --profile run_hf_q.json  # with HF_TOKEN=abc and nvapi-k"
    rec["reason"] = "kernel void gemm<ghp_7> ran"
    art = write_artifact(copy.deepcopy(rec), root=tmp_path / "validation")
    text = art.read_text()
    assert "nvapi-k" not in text and "ghp_7" not in text and "abc" not in text.split("HF_TOKEN=")[1][:5]
    # An artifact edited by hand to carry a token is scrubbed when read for the report.
    art.write_text(text.replace("<redacted>", "glpat-zz", 1))
    page = write_html(load_artifacts([tmp_path / "validation"]), tmp_path / "r.html").read_text()
    assert "glpat-zz" not in page and "ghp_7" not in page


def test_negative_sqlite_durations_are_counted_not_summed(tmp_path):
    import shutil
    import sqlite3

    db = tmp_path / "neg.db"
    shutil.copy(REPO / "tests" / "fixtures" / "rocpd.synthetic.db", db)
    before = ingest(db).total_kernel_us
    con = sqlite3.connect(db)
    table = con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'rocpd_kernel_dispatch%'"
                        ).fetchone()[0]
    one = con.execute(f'SELECT rowid, "end" - "start" FROM "{table}" ORDER BY rowid LIMIT 1').fetchone()
    con.execute(f'UPDATE "{table}" SET "end" = "start" - 1000000 WHERE rowid = ?', (one[0],))
    con.commit()
    con.close()
    prof = ingest(db)
    assert prof.anomalies == {"negative_duration": 1}
    assert prof.total_kernel_us == pytest.approx(before - one[1] / 1000.0)  # not before - 1000 µs
