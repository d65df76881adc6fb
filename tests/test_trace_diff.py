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
