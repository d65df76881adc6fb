"""`skill-run kernels A B`: per (kernel, shape) time and rate deltas, and what appeared or
disappeared, on a real trace and an edited copy of it whose changes are known."""
from __future__ import annotations

import csv
import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import traces_dir

from skillrun import api
from skillrun.ingest import ingest

TRACES = traces_dir() or Path("/nonexistent")
pytestmark = pytest.mark.skipif(traces_dir() is None, reason="../shared/traces is not present (set SKILLRUN_TRACES)")
H100 = TRACES / "pytorch_kineto" / "nvidia_h100_qwen1.5-0.5b_bf16.tracelens.json.gz"


@pytest.fixture(scope="module")
def edited(tmp_path_factory):
    """B = A with the aten::mm 8944×2816×1024 calls of the top GEMM 1.5× slower, the flash-attention
    kernel gone, and a new kernel in its place."""
    doc = json.loads(gzip.decompress(H100.read_bytes()))
    a = ingest(H100)
    gemm = a.kernels[0]
    mm = next(o for o in gemm.ops if o.shape == {"M": 8944, "N": 2816, "K": 1024})
    attn = next(k for k in a.kernels if k.category == "attention")
    # Correlate the GEMM's kernel events to that op through External id (as the ingester does).
    ext_of_op = {e["args"]["External id"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op"
                 and e.get("name") == mm.op and e.get("args", {}).get("Input Dims") == mm.input_dims}
    ext_by_corr = {e["args"].get("correlation"): e["args"].get("External id") for e in doc["traceEvents"]
                   if e.get("cat") == "cuda_runtime"}
    slowed = 0
    out = []
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e.get("name") == attn.name:
            e = dict(e, name="my_new_attention_kernel")
        elif e.get("cat") == "kernel" and e.get("name") == gemm.name and \
                ext_by_corr.get(e["args"].get("correlation")) in ext_of_op:
            e = dict(e, dur=e["dur"] * 1.5)
            slowed += 1
        out.append(e)
    assert slowed == mm.calls
    doc["traceEvents"] = out
    p = tmp_path_factory.mktemp("diff") / "b.json"
    p.write_text(json.dumps(doc))
    return a, ingest(p), mm, attn


def test_slowed_shape_removed_and_added_kernels(edited):
    a, b, mm, attn = edited
    d = api.compare_profiles(a, b)
    row = next(r for r in d["rows"] if r["shape"] == "M=8944,N=2816,K=1024" and r["kernel"] == a.kernels[0].name)
    assert row["status"] == "both" and row["a_calls"] == row["b_calls"] == mm.calls
    assert row["delta_ms"] == pytest.approx(0.5 * mm.total_us / 1e3, rel=1e-3)
    assert row["delta_pct"] == pytest.approx(50.0, abs=0.1)
    assert row["rate_unit"] == "TFLOP/s" and row["rate_delta_pct"] == pytest.approx(100 * (1 / 1.5 - 1), abs=0.2)
    # The other shapes of the same kernel did not move.
    same = [r for r in d["rows"] if r["kernel"] == a.kernels[0].name and r is not row]
    assert same and all(r["delta_ms"] == pytest.approx(0.0, abs=1e-3) for r in same)
    gone = [r for r in d["rows"] if r["kernel"] == attn.name]
    new = [r for r in d["rows"] if r["kernel"] == "my_new_attention_kernel"]
    assert gone and all(r["status"] == "disappeared" and r["b_ms"] is None for r in gone)
    assert new and all(r["status"] == "appeared" and r["a_ms"] is None for r in new)
    assert d["appeared"] == len(new) and d["disappeared"] == len(gone)
    assert d["delta_ms"] == pytest.approx((b.total_kernel_us - a.total_kernel_us) / 1e3, abs=1e-3)
    # Largest change first.
    assert abs(d["rows"][0]["delta_ms"]) == max(abs(r["delta_ms"]) for r in d["rows"])


def test_a_trace_against_itself_changes_nothing():
    p = ingest(H100)
    d = api.compare_profiles(p, p)
    assert d["appeared"] == d["disappeared"] == 0 and d["delta_ms"] == 0
    assert all(r["status"] == "both" and r["delta_ms"] == 0 for r in d["rows"])


def test_cli_compare_csv_and_table():
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    run = [sys.executable, "-m", "skillrun", "kernels", str(H100), str(H100)]
    res = subprocess.run(run + ["--format", "csv"], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert rows and {r["status"] for r in rows} == {"both"} and {r["kernel"] for r in rows} >= {ingest(H100).kernels[0].name}
    res = subprocess.run(run + ["--top", "3"], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0 and "GPU kernel time: A " in res.stdout and "Largest changes (top 3 of" in res.stdout


# ------------------------------------------------------------ calls, time per call, --by op (#38)
MI300X = TRACES / "pytorch_kineto" / "amd_mi300x_qwen1.5-0.5b_bf16.tracelens.json.gz"


@pytest.fixture(scope="module")
def fewer_calls(tmp_path_factory):
    """B = A with every second call of the top GEMM's 8944×2816×1024 shape dropped: its total halves,
    its time per call does not move."""
    doc = json.loads(gzip.decompress(H100.read_bytes()))
    a = ingest(H100)
    gemm = a.kernels[0]
    mm = next(o for o in gemm.ops if o.shape == {"M": 8944, "N": 2816, "K": 1024})
    ext_of_op = {e["args"]["External id"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op"
                 and e.get("name") == mm.op and e.get("args", {}).get("Input Dims") == mm.input_dims}
    ext_by_corr = {e["args"].get("correlation"): e["args"].get("External id") for e in doc["traceEvents"]
                   if e.get("cat") == "cuda_runtime"}
    n, out = 0, []
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e.get("name") == gemm.name and ext_by_corr.get(e["args"].get("correlation")) in ext_of_op:
            n += 1
            if n % 2 == 0:
                continue
        out.append(e)
    doc["traceEvents"] = out
    p = tmp_path_factory.mktemp("calls") / "b.json"
    p.write_text(json.dumps(doc))
    return a, ingest(p), mm


def test_calls_and_time_per_call_tell_more_calls_from_slower_calls(fewer_calls, edited):
    a, b, mm = fewer_calls
    d = api.compare_profiles(a, b)
    row = next(r for r in d["rows"] if r["shape"] == "M=8944,N=2816,K=1024" and r["kernel"] == a.kernels[0].name)
    kept = (mm.calls + 1) // 2
    assert row["a_calls"] == mm.calls and row["b_calls"] == kept and row["calls_delta"] == kept - mm.calls
    assert row["delta_pct"] < -40  # the total fell by about half ...
    assert row["a_mean_us"] == pytest.approx(mm.total_us / mm.calls, rel=1e-3)
    assert abs(row["mean_delta_pct"]) < 0.5 * abs(row["delta_pct"])  # ... while a call's time barely moved
    # the slowed trace: the same calls, each 1.5x
    a2, b2, mm2, _ = edited
    slow = next(r for r in api.compare_profiles(a2, b2)["rows"] if r["shape"] == "M=8944,N=2816,K=1024"
                and r["kernel"] == a2.kernels[0].name)
    assert slow["calls_delta"] == 0 and slow["mean_delta_pct"] == pytest.approx(50.0, abs=0.1)


def _diff_table(a: Path, b: Path, columns: int, *extra: str) -> str:
    env = dict(os.environ, COLUMNS=str(columns), NO_COLOR="1", TERM="dumb")
    res = subprocess.run([sys.executable, "-m", "skillrun", "kernels", str(a), str(b), *extra], capture_output=True,
                         text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _table_rows(text: str) -> list[list[str]]:
    """The table's rows as lists of lines (a row starts where the first column holds a number)."""
    lines = text.splitlines()
    rule = next(i for i, ln in enumerate(lines) if ln.startswith("─"))
    rows: list[list[str]] = []
    for ln in lines[rule + 1:]:
        if ln[:10].strip()[:1] in ("+", "-") or ln[:10].strip()[:1].isdigit() or ln[:10].strip() == "—":
            rows.append([ln])
        elif rows and ln.strip():
            rows[-1].append(ln)
    return rows


def test_at_80_columns_every_row_shows_the_kernel_calls_and_the_change_per_call():
    text = _diff_table(H100, MI300X, 80, "--top", "12")
    assert max(len(ln) for ln in text.splitlines()) <= 80
    d = api.compare_profiles(ingest(H100), ingest(MI300X))
    rows = _table_rows(text)
    assert len(rows) == 12
    names = {(r["demangled"] or r["kernel"]).removeprefix("void ") for r in d["rows"][:12]}
    for r, lines in zip(d["rows"][:12], rows):
        block = "\n".join(lines)
        head = lines[0].split()
        # Δ ms, Δ %, Δ per call, then the kernel: each one there
        assert head[0] == f"{r['delta_ms']:+.3f}"
        assert head[2] == ("—" if r["mean_delta_pct"] is None else f"{r['mean_delta_pct']:+.1f}")
        shown = lines[0][lines[0].index(head[3]):].strip()
        assert shown.split("…")[0] and any((n.startswith(shown.split("…")[0])) for n in names)
        if r["status"] == "both":
            assert f"{r['a_calls']} calls" in block or f"{r['a_calls']} → {r['b_calls']} calls" in block
        else:
            assert f"{r['status']}:" in block


def test_by_op_pairs_an_mi300x_and_an_h100_trace_of_one_model():
    """TraceLens' paired Qwen1.5-0.5B traces: hipBLASLt `Cijk_…` on MI300X, cuBLAS `sm90_xmma_…` on
    H100. By kernel name nothing pairs; by (op, shape, dtype) every op both traces ran pairs."""
    a, b = ingest(MI300X), ingest(H100)
    by_kernel = api.compare_profiles(a, b)
    assert not any(r["status"] == "both" and r["category"] == "gemm" for r in by_kernel["rows"])
    d = api.compare_profiles(a, b, by="op")
    from skillrun.analysis.hot_table import hot_kernels

    def keys(p):
        from skillrun.analysis.trace_diff import _rows

        return {k for k in _rows(hot_kernels(p, None), "op") if k[0]}

    common = keys(a) & keys(b)
    paired = {(r["op"], r["shape"] or "", r["dtype"] or "") for r in d["rows"] if r["status"] == "both" and r["op"]}
    assert common and paired == common
    gemms = [r for r in d["rows"] if r["status"] == "both" and r["category"] == "gemm" and r["op"]]
    assert gemms
    for r in gemms:
        # hipBLASLt on one side, a cuBLAS/CUTLASS kernel on the other: no name in common
        assert all(k.startswith("Cijk_") for k in r["a_kernels"]) and not set(r["a_kernels"]) & set(r["b_kernels"])
        assert r["a_mean_us"] and r["b_mean_us"] and r["mean_delta_pct"] is not None
    # and the CLI at 80 columns names the op, both sides' kernels and the change per call
    text = _diff_table(MI300X, H100, 80, "--by", "op", "--top", "6")
    top = next(r for r in d["rows"] if r["op"] == gemms[0]["op"] and r["shape"] == gemms[0]["shape"])
    assert f"{top['op']} {top['shape']}" in text and "A Cijk" in text and "B sm90" in text
    assert "paired rows hold" in text
