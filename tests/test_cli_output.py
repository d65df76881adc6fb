"""Output that survives a pipe: nothing wrapped or cut when stdout is not a terminal, and
`--format csv|tsv|json` on kernels, match, plan, list and report that reads back whole."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import traces_dir

REPO = Path(__file__).resolve().parents[1]
TRACES = traces_dir() or Path("/nonexistent")
needs_traces = pytest.mark.skipif(traces_dir() is None, reason="../shared/traces is not present (set SKILLRUN_TRACES)")
EXAMPLE = REPO / "runner" / "skillrun" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz"
ROCPROF = REPO / "tests" / "fixtures" / "rocprofv3_mi350x_subset.real.json.gz"
MI300 = TRACES / "pytorch_kineto" / "amd_mi300x_qwen1.5-0.5b_bf16.tracelens.json.gz"


def _run(*args: str, ok=(0, 4)) -> str:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # piped, no width asked for
    env.update(NO_COLOR="1", TERM="dumb")
    res = subprocess.run([sys.executable, "-m", "skillrun", *args], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode in ok, res.stderr
    return res.stdout


def test_piped_profile_keeps_every_evidence_path_and_kernel_name_whole():
    text = _run("--profile", str(EXAMPLE))
    plan = json.loads(_run("plan", str(EXAMPLE), "--format", "json"))
    paths = [it["evidence"]["path"] for it in plan["items"] if it.get("evidence")]
    assert len(paths) == 5
    lines = text.splitlines()
    for p in paths:
        assert any(p in ln for ln in lines), p  # `| grep 'validation/.*\.yaml'` finds each, on one line
    for it in plan["items"]:
        assert any(it["kernel"] in ln for ln in lines), it["kernel"]
    assert sum("validation/" in ln and ".yaml" in ln for ln in lines) >= 5


def test_piped_kernels_print_long_template_names_whole():
    from skillrun.ingest import ingest

    text = _run("kernels", str(ROCPROF), "--top", "14")
    for k in ingest(ROCPROF).kernels:
        full = (k.demangled or k.name).removesuffix(" [clone .kd]").removesuffix(".kd")
        assert any(full in ln for ln in text.splitlines()), full
    assert "(--wide: whole names)" not in text  # nothing to widen: the names are whole already


def test_piped_tables_carry_no_padding_to_the_widest_name():
    """Names stay whole when piped, but the other rows are not padded out to the longest one (a
    hot-kernel table of the H200 MoE trace carried ~800 trailing spaces per line), and the header
    rule stops at the header."""
    text = _run("kernels", str(ROCPROF), "--top", "14")
    lines = text.splitlines()
    assert lines and not any(ln.endswith(" ") for ln in lines)
    longest_name = max(len(ln) for ln in lines if ".kd" in ln or "<" in ln)
    rules = [ln for ln in lines if ln and not ln.strip("─━═ ")]
    assert rules and all(len(r) < longest_name for r in rules)


def test_piped_list_keeps_card_ids_whole():
    from skillrun import api

    lines = _run("list").splitlines()
    for cid in api.load_index().skills:
        assert any(cid in ln for ln in lines), cid


@pytest.mark.parametrize("trace", [EXAMPLE, ROCPROF], ids=lambda p: p.name)
def test_kernels_csv_round_trips_through_a_csv_reader(trace):
    data = json.loads(_run("kernels", str(trace), "--top", "10", "--json"))
    rows = list(csv.DictReader(io.StringIO(_run("kernels", str(trace), "--top", "10", "--format", "csv"))))
    kernel_rows = [r for r in rows if r["row"] == "kernel"]
    assert [r["kernel"] for r in kernel_rows] == [k["name"] for k in data["kernels"]]  # commas, quotes, <> intact
    for r, k in zip(kernel_rows, data["kernels"]):
        assert float(r["total_ms"]) == k["total_ms"] and int(r["calls"]) == k["calls"]
        assert r["category"] == k["category"]
        shape_rows = [x for x in rows if x["row"] == "shape" and x["rank"] == r["rank"]]
        assert len(shape_rows) == len(k["shapes"])
    # TSV: the same records, one line each, the same number of fields on every line.
    tsv = _run("kernels", str(trace), "--top", "10", "--format", "tsv").splitlines()
    assert len(tsv) == len(rows) + 1 and len({ln.count("\t") for ln in tsv}) == 1


def test_per_shape_csv_rows_of_the_bundled_example():
    rows = list(csv.DictReader(io.StringIO(_run("kernels", str(EXAMPLE), "--format", "csv"))))
    shapes = [r for r in rows if r["row"] == "shape" and r["rank"] == "1"]
    assert [r["shape"] for r in shapes] == ["M=4096,N=65536,K=1536", "M=16384,N=1536,K=7168",
                                             "M=16384,N=7168,K=768", "M=4096,N=2048,K=7168"]
    assert all(r["bound"] == "compute" and float(r["tflops"]) > 0 for r in shapes)


@needs_traces
def test_match_plan_list_report_formats():
    rows = list(csv.DictReader(io.StringIO(_run("match", str(MI300), "--format", "csv"))))
    unmatched = [r for r in rows if r["kind"] == "unmatched"]
    assert unmatched and all(r["failed"] for r in unmatched[:5])  # every unmatched hot kernel says why
    plan = list(csv.DictReader(io.StringIO(_run("plan", str(EXAMPLE), "--format", "csv"))))
    assert len(plan) == 5 and all(r["evidence"].startswith("validation/") for r in plan)
    cards = list(csv.reader(io.StringIO(_run("list", "--format", "tsv")), delimiter="\t"))
    assert cards[0][:2] == ["id", "title"] and len(cards) > 1
    report = list(csv.DictReader(io.StringIO(_run("report", "--format", "csv"))))
    assert report and all(r["path"].endswith(".yaml") and (REPO / r["path"]).is_file() for r in report)
    assert json.loads(_run("list", "--format", "json"))["cards"][0]["id"]


def test_csv_neutralises_spreadsheet_formulas():
    from skillrun.output.tabular import write

    buf = io.StringIO()
    write(["kernel", "pct"], [{"kernel": "=HYPERLINK(\"x\")", "pct": -1.5}, {"kernel": "a,b\"c", "pct": None}], "csv", buf)
    back = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert back[0]["kernel"] == "'=HYPERLINK(\"x\")" and back[0]["pct"] == "-1.5"
    assert back[1]["kernel"] == "a,b\"c" and back[1]["pct"] == ""


def test_a_reader_that_leaves_early_gets_no_traceback():
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    p = subprocess.Popen([sys.executable, "-m", "skillrun", "kernels", str(ROCPROF), "--format", "csv"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.readline()
    p.stdout.close()
    _, err = p.communicate(timeout=300)
    assert p.returncode in (0, 141) and b"Traceback" not in err and b"error" not in err
