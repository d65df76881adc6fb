"""Secret-looking strings never reach the model, whichever tool output they ride in."""
from __future__ import annotations

import copy
import json

import pytest

from kbfixture import CARD, make_kb, write_card
from skillrun import api
from skillrun.agent import build_tools
from skillrun.agent.safety import REDACTED, scrub, scrub_text
from skillrun.kb.index import SkillIndex
from skillrun.models import KernelStat, MatchReport, OpCall, Plan, Profile

HF = "hf_AbCdEfGhIjKlMnOpQrStUv"
GH = "ghp_0123456789abcdefghijABCDEFGHIJ"


@pytest.mark.parametrize("text, secret", [
    (f"HF_TOKEN={HF}", HF),
    ("export MY_API_TOKEN=abc123secretvalue", "abc123secretvalue"),
    ("AWS_SECRET_ACCESS_KEY: wJalrXUtnFEMI/K7MDENG", "wJalrXUtnFEMI/K7MDENG"),
    ('db_password="hunter2 with spaces"', "hunter2 with spaces"),
    (f"model downloaded with token {HF} ok", HF),
    (f"git clone https://x:{GH}@github.com/a/b", GH),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "eyJhbGciOiJIUzI1NiJ9"),
    ("OPENAI key sk-proj-abcdefghijklmnopqrstuvwx", "sk-proj-abcdefghijklmnopqrstuvwx"),
])
def test_scrub_text_removes_secrets(text, secret):
    out = scrub_text(text)
    assert secret not in out and REDACTED in out


@pytest.mark.parametrize("text", [
    "tokens=16,experts=8,topk=2",
    "max_tokens=4096",
    "void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemmMultiD_ABScale_xdl_cshuffle_v3<ck::f8_t>>",
    "nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT",
    "M=4096,N=2048,K=7168",
])
def test_scrub_text_keeps_ordinary_text(text):
    assert scrub_text(text) == text


def test_scrub_structure_drops_values_under_secret_keys():
    data = {"env": {"HF_TOKEN": "plain-looking", "PATH": "/usr/bin", "tokens": 16, "client_secret": "x"},
            "list": [f"key={HF}"], "shape": {"tokens": 32}}
    out = scrub(data)
    assert out["env"] == {"HF_TOKEN": REDACTED, "PATH": "/usr/bin", "tokens": 16, "client_secret": REDACTED}
    assert out["list"] == [f"key={REDACTED}"] and out["shape"] == {"tokens": 32}


def test_card_text_with_a_token_is_scrubbed_in_show_skill(tmp_path):
    kb = make_kb(tmp_path / "kb")
    card = copy.deepcopy(CARD)
    card["validation"] = {"status": "unvalidated", "notes": f"rerun with HF_TOKEN={HF}"}
    write_card(kb, card, body=f"## When to use\nDownload weights with `huggingface-cli login --token {HF}`.\n")
    tools = {t.name: t for t in build_tools(SkillIndex.load(kb))}
    out = tools["show_skill"].invoke({"skill_id": "toy_blockscale"})
    assert HF not in out and REDACTED in out
    assert json.loads(out)["ok"] is True


def test_analysis_output_and_saved_file_are_scrubbed(tmp_path, monkeypatch):
    kb = make_kb(tmp_path / "kb")
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    # Many kernels so that the full analysis is saved to validation/_analysis/ as well.
    kernels = [KernelStat(name=f"kernel_{i} launched with SECRET_KEY=s3cr3tvalue{i} {HF}", total_us=10.0, calls=1, pct_gpu=1.0,
                          ops=[OpCall(op="aten::mm", input_dims=[[64, 64], [64, 64]], concrete_inputs=[f"HF_TOKEN={HF}"])])
               for i in range(60)]
    prof = Profile(source=str(trace), format="kineto_json", arch="sm_90", total_kernel_us=600.0, kernel_calls=60, kernels=kernels,
                   warnings=[f"environment had GITHUB_TOKEN={GH}"])
    fake = api.Analysis(profile=prof, matches=MatchReport(profile=str(trace), arch="sm_90"), plan=Plan(profile=str(trace), arch="sm_90"))
    monkeypatch.setattr(api, "analyze", lambda *a, **k: fake)
    tools = {t.name: t for t in build_tools(SkillIndex.load(kb), allowed_paths=[trace])}
    out = tools["analyze_profile"].invoke({"path": str(trace), "top": 50, "save_full": True})
    res = json.loads(out)
    assert res["ok"] and len(out) <= 6000
    for secret in (HF, GH, "s3cr3tvalue"):
        assert secret not in out
    saved = kb / res["full_result"]
    assert saved.parent == kb / "validation" / "_analysis"
    full = saved.read_text()
    assert len(json.loads(full)["profile"]["kernels"]) == 60
    for secret in (HF, GH, "s3cr3tvalue"):
        assert secret not in full
    # The pointer is readable through read_validation, still bounded and still clean.
    back = tools["read_validation"].invoke({"path": str(saved)})
    assert json.loads(back)["ok"] is True and len(back) <= 6000 and HF not in back
