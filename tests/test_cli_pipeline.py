"""The main command end to end on CPU: `skill-run --profile` matches, plans, and (with --run) writes
CPU-only evidence that says no GPU timing was possible; bad input gives one line and a documented code."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CK_TRACE = REPO / "tests" / "fixtures" / "kineto_gfx950_ck_blockscale.synthetic.json"
EXAMPLE = REPO / "runner" / "skillrun" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz"


def skill_run(*args: str, kb: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "skillrun"] + (["--kb", str(kb)] if kb else []) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_ck_blockscale_trace_on_gfx950_matches_and_selects_by_shape_class():
    res = skill_run("--profile", str(CK_TRACE), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["profile"]["arch"] == "gfx950"
    matched = {m["skill_id"] for m in data["matches"]["matches"]}
    assert matched == {"flydsl_fp8_blockscale_gemm"}
    recipes = {tuple(sorted(i["shape"].items())): i["recipe"] for i in data["plan"]["items"]}
    assert recipes[(("K", 1536), ("M", 4096), ("N", 65536))] == "wide_n_locality_limited"
    assert recipes[(("K", 768), ("M", 16384), ("N", 7168))] == "k_light_grid_saturated"
    assert recipes[(("K", 7168), ("M", 4096), ("N", 2048))] == "narrow_n_deep_k"
    for item in data["plan"]["items"]:
        s = item["expected_speedup"]
        assert item["projected_e2e_gain_pct"] == pytest.approx(item["pct_gpu"] * (1 - 1 / s), abs=1e-3)


def test_same_trace_on_another_arch_is_a_near_miss_and_says_why():
    res = skill_run("--profile", str(CK_TRACE), "--arch", "gfx942")
    assert res.returncode == 4
    assert "near miss" in res.stdout and "device is gfx942; card is for gfx950" in res.stdout


def test_trace_with_no_match_says_so_plainly(shared_traces):
    res = skill_run("--profile", str(shared_traces / "nsys" / "nvidia_a100_cloverleaf_nsys2024.5_export.sqlite"))
    assert res.returncode == 4
    assert "No skill card matches a hot kernel of this profile." in res.stdout


def test_bundled_example_matches_the_sm90_card():
    res = skill_run("--profile", str(EXAMPLE), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["profile"]["arch"] == "sm_90"
    assert {m["skill_id"] for m in data["matches"]["matches"]} == {"triton_fp8_blockscale_gemm_sm90"}
    shapes = {(i["shape"]["M"], i["shape"]["N"], i["shape"]["K"]) for i in data["plan"]["items"]}
    assert (16384, 7168, 768) in shapes and (4096, 65536, 1536) in shapes


@pytest.mark.parametrize("content, why", [
    (b"", "empty"),
    (b"\x00\x01garbage\xff" * 50, "binary"),
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur"', "truncated"),
    (gzip.compress(b'{"traceEvents": [', mtime=0)[:-6], "truncated gzip"),  # mtime=0: the same bytes (and test id) in every pytest worker
    (b"name,value\nfoo,1\n", "unknown CSV"),
])
def test_bad_input_is_one_line_and_exit_3(tmp_path, content, why):
    f = tmp_path / "trace.json"
    f.write_bytes(content)
    res = skill_run("--profile", str(f))
    assert res.returncode == 3, (why, res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and str(f) in lines[0] and "Traceback" not in res.stderr


def test_missing_file_and_bad_shape_are_usage_or_input_errors(tmp_path):
    assert skill_run("--profile", str(tmp_path / "nope.json")).returncode == 3
    res = skill_run("--profile", str(CK_TRACE), "--shape", "12,abc")
    assert res.returncode == 2 and "--shape" in res.stderr


def _kb_copy(tmp_path: Path) -> Path:
    kb = tmp_path / "kb"
    for d in ("skills", "facts", "schemas"):
        shutil.copytree(REPO / d, kb / d)
    (kb / "validation").mkdir()
    return kb


def test_run_on_cpu_writes_cpu_numerics_evidence_and_says_no_gpu_timing(tmp_path):
    kb = _kb_copy(tmp_path)
    res = skill_run("--profile", str(EXAMPLE), "--run", "--backend", "cpu", "--seeds", "2", "--top", "1", kb=kb)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    arts = sorted((kb / "validation" / "triton_fp8_blockscale_gemm_sm90").glob("*.yaml"))
    assert arts, res.stdout[-2000:]
    rec = yaml.safe_load(arts[0].read_text())
    assert rec["mode"] == "cpu_numerics" and rec["verdict"] == "cpu_numerics_passed"
    assert "no GPU timing" in rec["reason"] and rec["speedup"] is None
    assert rec["parity"]["port"]["passed"] and rec["proxy_shape"] != rec["shape"]
    from skillrun.evidence.validation import load_artifact

    load_artifact(arts[0])  # schema-valid


def test_show_json_returns_the_card_with_recipes_as_data():
    res = skill_run("show", "flydsl_fp8_blockscale_gemm", "--json")
    assert res.returncode == 0
    card = json.loads(res.stdout)
    assert card["id"] == "flydsl_fp8_blockscale_gemm"
    names = [r["name"] for r in card["recipes"]]
    assert {"wide_n_locality_limited", "k_light_grid_saturated", "narrow_n_deep_k"} <= set(names)
    assert card["recipes"][0]["config"]["tile_n"] == 256 and "## When to use" in card["body"]
