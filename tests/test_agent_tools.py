"""Agent tools: typed arguments, readable errors for bad input, the read allow-list, bounded results."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from kbfixture import CARD, make_kb, write_card
from skillrun import api
from skillrun.agent import build_tools
from skillrun.agent.results import fit
from skillrun.kb.index import SkillIndex
from skillrun.evidence.validation import write_artifact

pytest.importorskip("langchain_core")


def _call(tools, name, **args):
    out = tools[name].invoke(args)
    assert isinstance(out, str), "tools must return JSON text, never raise"
    return json.loads(out)


@pytest.fixture
def kb(tmp_path):
    return make_kb(tmp_path / "kb")


@pytest.fixture
def user_dir(tmp_path):
    d = tmp_path / "user"
    d.mkdir()
    (d / "trace.json").write_text("{}")
    return d


@pytest.fixture
def tools(kb, user_dir):
    return {t.name: t for t in build_tools(SkillIndex.load(kb), allowed_paths=[user_dir], gpu_probe=lambda: None)}


def test_tool_set_and_schemas(tools):
    assert set(tools) == {"list_skills", "show_skill", "read_fact", "analyze_profile", "run_skill", "check_skill", "read_validation",
                          "tune_skill", "ablate_skill"}
    schema = tools["analyze_profile"].args_schema.model_json_schema()
    assert schema["required"] == ["path"]
    assert schema["properties"]["top"]["maximum"] == 50
    assert "shell" not in " ".join(tools), "no shell tool, ever"


def test_list_and_show_skill(tools):
    listed = _call(tools, "list_skills")
    assert listed["ok"] and [s["id"] for s in listed["skills"]] == ["toy_blockscale"]
    assert {"toy_hw", "gfx950_hardware"} <= {f["id"] for f in listed["facts"]}
    assert _call(tools, "list_skills", gen="sm_90")["skills"] == []
    shown = _call(tools, "show_skill", skill_id="toy_blockscale")
    assert shown["ok"] and shown["front_matter"]["default_recipe"] == "wide_n"
    assert [r["name"] for r in shown["front_matter"]["recipes"]] == ["wide_n", "k_light", "narrow_n"]
    assert "Toy." in shown["body"]
    assert _call(tools, "read_fact", fact_id="toy_hw")["front_matter"]["data"]["cu_count"] == 256


def test_unknown_skill_and_fact_are_readable_errors(tools):
    res = _call(tools, "show_skill", skill_id="no_such_card")
    assert res["ok"] is False and "no_such_card" in res["error"] and "toy_blockscale" in res["hint"]
    res = _call(tools, "read_fact", fact_id="nope")
    assert res["ok"] is False and "unknown fact 'nope'" in res["error"]
    res = _call(tools, "run_skill", skill_id="no_such_card", shapes=["1,2,3"])
    assert res["ok"] is False and "unknown skill" in res["error"]


def test_missing_file_is_a_readable_error(tools, user_dir):
    res = _call(tools, "analyze_profile", path=str(user_dir / "missing.json.gz"))
    assert res["ok"] is False and "no such file" in res["error"] and "missing.json.gz" in res["error"]


def test_paths_outside_the_allow_list_are_refused(tools, tmp_path, user_dir):
    outside = tmp_path / "secret_trace.json"
    outside.write_text("{}")
    for path in (outside, user_dir / ".." / "secret_trace.json", Path("/etc/passwd")):
        res = _call(tools, "analyze_profile", path=str(path))
        assert res["ok"] is False and "outside the paths" in res["error"], res
        assert str(user_dir) in res["hint"]
    # A symlink inside an allowed folder must not lead outside it.
    link = user_dir / "innocent.json"
    os.symlink(outside, link)
    res = _call(tools, "analyze_profile", path=str(link))
    assert res["ok"] is False and "outside the paths" in res["error"]
    res = _call(tools, "read_validation", path=str(outside))
    assert res["ok"] is False and "outside the paths" in res["error"]
    # Nothing about a refused file's existence leaks: a missing outside path gets the same refusal.
    res = _call(tools, "analyze_profile", path=str(tmp_path / "does_not_exist"))
    assert "outside the paths" in res["error"]


def test_wrong_shape_strings_are_readable_errors(tools, user_dir):
    res = _call(tools, "analyze_profile", path=str(user_dir / "trace.json"), shapes=["4096 by 2048"])
    assert res["ok"] is False and "shapes" in res["error"] and "'4096 by 2048'" in res["error"]
    res = _call(tools, "run_skill", skill_id="toy_blockscale", shapes=["4096,2048"])
    assert res["ok"] is False and "takes 3 (M,N,K)" in res["error"] and res["error"].startswith("shapes:")
    res = _call(tools, "check_skill", skill_id="toy_blockscale", shapes=["M=1,Q=2"])
    assert res["ok"] is False and "unknown dimension 'Q'" in res["error"]
    res = _call(tools, "run_skill", skill_id="toy_blockscale", shapes=[])
    assert res["ok"] is False and "shapes" in res["error"]


def test_bad_types_and_unknown_arguments(tools):
    res = _call(tools, "analyze_profile", path="x", top=500)
    assert res["ok"] is False and "top" in res["error"]
    res = _call(tools, "check_skill", skill_id="toy_blockscale", arch="h200")
    assert res["ok"] is False and "arch 'h200'" in res["error"]
    res = _call(tools, "show_skill", skill_id="toy_blockscale", colour="red")
    assert res["ok"] is False and "colour" in res["error"]


def test_run_skill_refuses_politely_without_a_gpu(tools):
    res = _call(tools, "run_skill", skill_id="toy_blockscale", shapes=["4096,2048,7168"])
    assert res["ok"] is False and "no GPU" in res["error"]
    assert "check_skill" in res["hint"] and "backend='cpu'" in res["hint"]


def test_run_skill_cpu_backend_is_not_refused(kb, user_dir, monkeypatch):
    seen = {}

    def fake_run(index, skill_id, shapes, **kw):
        seen.update(skill_id=skill_id, shapes=shapes, **kw)
        return [{"skill_id": skill_id, "recipe": "narrow_n", "shape": shapes[0], "mode": "cpu_numerics",
                 "verdict": "cpu_numerics_passed", "artifact": str(kb / "validation" / "toy" / "a.yaml"), "samples": list(range(5000))}]

    monkeypatch.setattr(api, "run_skill", fake_run)
    tools = {t.name: t for t in build_tools(SkillIndex.load(kb), allowed_paths=[user_dir], gpu_probe=lambda: None)}
    res = _call(tools, "run_skill", skill_id="toy_blockscale", shapes=["64,128,256"], backend="cpu", seeds=2, write=False)
    assert res["ok"] is True and res["results"][0]["verdict"] == "cpu_numerics_passed"
    assert res["results"][0]["samples"] == "5000 values (in the artifact)", "bulky per-sample data stays in the artifact"
    assert res["artifacts"] == ["validation/toy/a.yaml"]
    assert seen == {"skill_id": "toy_blockscale", "shapes": [{"M": 64, "N": 128, "K": 256}], "backend": "cpu", "seeds": 2, "write": False}


def test_check_skill_reports_compile_only(kb, monkeypatch):
    class Rep:
        def to_json(self):
            # CheckReport.to_json's keys: `passed` is the verdict (there is no `ok`)
            return {"passed": True, "skill_id": "toy_blockscale", "checks": [{"name": "wide_n", "gates": {"spills": 0}}]}

    calls = {}
    monkeypatch.setattr(api, "check", lambda index, sid, arch=None, shapes=None, write=True: calls.update(sid=sid, arch=arch, shapes=shapes, write=write) or Rep())
    tools = {t.name: t for t in build_tools(SkillIndex.load(kb))}
    res = _call(tools, "check_skill", skill_id="toy_blockscale", arch="gfx950", shapes=["4096,2048,7168"], write=False)
    assert res["ok"] and res["passed"] is True and res["kind"].startswith("compile_only")
    assert calls == {"sid": "toy_blockscale", "arch": "gfx950", "shapes": [{"M": 4096, "N": 2048, "K": 7168}], "write": False}


def test_exceptions_inside_a_tool_become_results(tools, user_dir, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(api, "analyze", boom)
    res = _call(tools, "analyze_profile", path=str(user_dir / "trace.json"))
    assert res["ok"] is False and "RuntimeError: disk on fire" in res["error"] and "runner bug" in res["hint"]


def test_long_card_body_is_previewed_with_sections(tmp_path):
    card = copy.deepcopy(CARD)
    body = "## When to use\n" + "Use it on wide N. " * 300 + "\n\n## Recipe details\n" + "Tile 64x256. " * 300 + "\n## What loses\nNarrow N.\n"
    kb = make_kb(tmp_path / "kb")
    write_card(kb, card, body=body)
    tools = {t.name: t for t in build_tools(SkillIndex.load(kb))}
    res = _call(tools, "show_skill", skill_id="toy_blockscale")
    assert "body" not in res and res["body_chars"] == len(body)
    assert res["outline"] == ["  When to use", "  Recipe details", "  What loses"]
    assert "section=" in res["more"]
    sec = _call(tools, "show_skill", skill_id="toy_blockscale", section="what loses")
    assert sec["section"] == "What loses" and sec["text"] == "## What loses\nNarrow N."
    bad = _call(tools, "show_skill", skill_id="toy_blockscale", section="Benchmarks")
    assert bad["ok"] is False and "Recipe details" in bad["hint"]


def test_fit_cuts_long_results_and_points_at_the_full_file():
    data = {"ok": True, "rows": [{"kernel": f"k{i}", "text": "x" * 300} for i in range(200)]}
    small = fit(data, 6000, pointer="validation/_analysis/full.json")
    text = json.dumps(small)
    assert len(text) <= 6000 and small["truncated"] is True and small["full_result"] == "validation/_analysis/full.json"
    assert small["rows"][0]["kernel"] == "k0" and small["rows"][-1].endswith("more items")
    assert fit({"ok": True, "a": 1}) == {"ok": True, "a": 1}


def _artifact(card_id: str, created: str, verdict: str) -> dict:
    return {"schema_version": 1, "created": created, "card": {"id": card_id, "revision": "uncommitted"},
            "runner": {"version": "0.1.0", "git_revision": "test"},
            "recipe": {"name": "narrow_n", "kernel": "skillrun_kernels.protocol:KernelLaunch", "config": {}},
            "shape": {"M": 4096, "N": 2048, "K": 7168}, "device": {"kind": "cpu", "name": "x86 CPU"},
            "software": {"python": "3.11"}, "mode": "compile_only", "verdict": verdict, "reason": "test record"}


def test_read_validation_lists_newest_and_reads_one(kb, tools):
    old = write_artifact(_artifact("toy_blockscale", "2026-01-01T00:00:00+00:00", "compile_failed"), root=kb / "validation")
    new = write_artifact(_artifact("toy_blockscale", "2026-02-01T00:00:00+00:00", "compile_verified"), root=kb / "validation")
    listed = _call(tools, "read_validation")
    assert listed["ok"] and listed["total"] == 2
    assert [a["verdict"] for a in listed["artifacts"]] == ["compile_verified", "compile_failed"]
    assert listed["artifacts"][0]["path"] == str(new.relative_to(kb))
    one = _call(tools, "read_validation", path=str(old))
    assert one["ok"] and one["artifact"]["verdict"] == "compile_failed" and one["artifact"]["mode"] == "compile_only"
    assert _call(tools, "read_validation", limit=1)["shown"] == 1
    res = _call(tools, "read_validation", skill_id="ghost")
    assert res["ok"] is False and "unknown skill 'ghost'" in res["error"]


CK = "void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemmMultiD_ABScale_xdl_cshuffle_v3<ck::f8_t, ck::f8_t>>(...)"


def test_analyze_profile_summarizes_real_match_and_plan(kb, user_dir, monkeypatch):
    """Ingestion is stubbed with a hand-made Profile; matching and planning are the real ones."""
    from skillrun.models import KernelStat, OpCall, Profile

    ops = [OpCall(op="aiter::gemm_a8w8_blockscale", shape={"M": 4096, "N": 2048, "K": 7168}, dtype="fp8_e4m3", calls=4,
                  total_us=600.0, provenance="trace", input_dims=[[4096, 7168]] * 200)]
    hot = KernelStat(name=CK, total_us=600.0, calls=4, pct_gpu=60.0, ops=ops, shape_provenance="trace")
    cold = [KernelStat(name=f"elementwise_kernel_{i}", total_us=4.0, calls=1, pct_gpu=0.4) for i in range(100)]
    prof = Profile(source=str(user_dir / "trace.json"), format="kineto_json", arch="gfx950", total_kernel_us=1000.0,
                   kernel_calls=104, kernels=[hot, *cold])
    monkeypatch.setattr(api, "ingest_profile", lambda path, arch=None, progress=None: prof)
    tools = {t.name: t for t in build_tools(SkillIndex.load(kb), allowed_paths=[user_dir])}
    res = _call(tools, "analyze_profile", path=str(user_dir / "trace.json"), top=5)
    # read-only unless asked: the reply says how to get the rest, and nothing was written
    assert "save_full=true" in res["full_result_not_saved"] and not (kb / "validation" / "_analysis").exists()
    res = _call(tools, "analyze_profile", path=str(user_dir / "trace.json"), top=5, save_full=True)
    assert res["ok"] is True
    assert [k["rank"] for k in res["hot_kernels"]] == [1, 2, 3, 4, 5] and res["hot_kernels"][0]["pct_gpu"] == 60.0
    assert res["matches"][0]["skill_id"] == "toy_blockscale"
    assert any(c.startswith("PASS min_pct_gpu") for c in res["matches"][0]["criteria"])
    item = res["plan"][0]
    assert item["recipe"] == "narrow_n" and item["shape"] == {"M": 4096, "N": 2048, "K": 7168} and item["untuned"] is False
    assert "prior, not a measurement" in res["caution"] and "show_skill('toy_blockscale')" in res["next"]
    # The full analysis (all 101 kernels, every op) went to validation/_analysis, not into the reply.
    saved = kb / res["full_result"]
    assert saved.parent == kb / "validation" / "_analysis"
    full = json.loads(saved.read_text())
    assert len(full["profile"]["kernels"]) == 101 and len(full["profile"]["kernels"][0]["ops"][0]["input_dims"]) == 200


def test_read_validation_speaks_the_report_vocabulary(kb, tools):
    """An older file that says `slower` for a ratio inside its A/A noise is listed as within_noise,
    the file's word kept as recorded_verdict (as `skill-run report` shows it)."""
    import shutil

    src = Path(__file__).resolve().parents[1] / "validation" / "triton_fp8_blockscale_gemm_sm90" / \
        "20261129T092709Z_decode_m64_klight_M64xN7168xK2048_gpu_measured.yaml"
    (kb / "validation" / "triton_fp8_blockscale_gemm_sm90").mkdir(parents=True)
    shutil.copy(src, kb / "validation" / "triton_fp8_blockscale_gemm_sm90" / src.name)
    shutil.copy(src.parent / "LEDGER.jsonl", kb / "validation" / "triton_fp8_blockscale_gemm_sm90")  # runner-written evidence
    (row,) = _call(tools, "read_validation")["artifacts"]
    assert row["verdict"] == "within_noise" and row["recorded_verdict"] == "slower"
