"""The first line says what to do, on real traces: the --shape to give for an unresolved kernel, and
for a trace no card matched the reason (an uncovered family, no card for the arch, an --arch override,
a graph capture, no op to identify a GEMM by); a trace with no kernel is bad input. The agent tools
(LangChain and MCP) return the same words; coverage counts only what matched."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import traces_dir
from rich.text import Text

from skillrun import api
from skillrun.analysis.coverage import _family
from skillrun.ingest import ingest
from skillrun.plan.match import op_classes
from skillrun.plan.planner import answer_line

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "runner" / "skillrun" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz"
TRACES = traces_dir() or Path("/nonexistent")
needs_traces = pytest.mark.skipif(traces_dir() is None, reason="../shared/traces is not present (set SKILLRUN_TRACES)")
K = TRACES / "pytorch_kineto"
H200 = K / "nvidia_h200_fp8_scaled_mm_torch2.11.generated.json.gz"
MI300X = K / "amd_mi300x_qwen1.5-0.5b_bf16.tracelens.json.gz"
H100 = K / "nvidia_h100_qwen1.5-0.5b_bf16.tracelens.json.gz"
A100 = K / "nvidia_a100_alexnet_old_int_ts.hta.json.gz"
SGLANG = K / "amd_mi300x_sglang_qwen3-8b_decode_hipgraph.tracelens.json.gz"
NCU = TRACES / "ncu" / "nvidia_h200_fp8_scaled_mm_ncu_details.generated.csv"


@pytest.fixture(scope="module")
def index():
    return api.load_index()


def _answer(a: api.Analysis) -> str:
    return Text.from_markup(answer_line(a.plan, len({m.skill_id for m in a.matches.matches}), str(a.profile.source))).plain


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1", TERM="dumb", COLUMNS="400")
    return subprocess.run([sys.executable, "-m", "skillrun", *args], capture_output=True, text=True, timeout=600, env=env)


# ----------------------------------------------------------------------------- unresolved shapes
@needs_traces
def test_an_unresolved_shape_gets_the_exact_shape_command(index):
    """ncu reports no op shapes: the row-wise card's item is unresolved, and the Answer's next step
    is the --shape of that card's problem for that kernel (not 'adopt the ports')."""
    a = api.analyze(NCU, index=index)
    (it,) = [it for it in a.plan.items if it.status == "unresolved_shape"]
    keys = ("batch", "M", "N", "K")
    assert it.next_command == f"skill-run --profile {NCU} --shape {','.join(keys)}"
    line = _answer(a)
    assert "next: give the shape of" in line and it.next_command in line and "adopt" not in line
    # Filling in the placeholders with numbers resolves the item.
    given = api.analyze(NCU, index=index, shapes=["1,2048,7168,4096"])
    (done,) = [x for x in given.plan.items if x.skill_id == it.skill_id]
    assert done.status == "planned" and done.shape == {"batch": 1, "M": 2048, "N": 7168, "K": 4096}
    assert "give the shape" not in _answer(given)


@needs_traces
def test_a_non_batched_rowwise_scaled_mm_is_a_batch_of_one(index):
    a = api.analyze(H200, index=index)
    prof = a.profile
    (it,) = [it for it in a.plan.items if it.skill_id == "triton_fp8_rowwise_batched_gemm_sm90"]
    k = next(k for k in prof.kernels if k.name == it.kernel)
    (oc,) = [o for o in k.ops if o.scale_recipe == "rowwise"]
    assert [len(d) for d in oc.input_dims[:2]] == [2, 2]  # [M,K] x [K,N]: one GEMM per call
    assert it.status == "planned" and it.shape == {"batch": 1, **oc.shape} and it.shape_provenance == "trace"
    assert any("batch=1" in n for n in it.notes)


@needs_traces
def test_a_user_shape_that_implies_an_impossible_rate_is_flagged(index):
    a = api.analyze(H200, index=index, shapes=["batch=64,M=16384,N=16384,K=16384"])
    (it,) = [it for it in a.plan.items if it.skill_id == "triton_fp8_rowwise_batched_gemm_sm90"]
    k = next(k for k in a.profile.kernels if k.name == it.kernel)
    implied = 2.0 * 64 * 16384 ** 3 * k.calls / (k.total_us * 1e-6) / 1e12
    assert implied > 1979  # far past the H200's fastest peak ...
    (note,) = [n for n in it.notes if "cannot be this kernel's shape" in n]
    assert f"{implied:,.0f} TFLOP/s" in note and note in a.plan.warnings
    # ... while a shape the trace itself recorded is not flagged
    ok = api.analyze(H200, index=index, shapes=["batch=1,M=2048,N=7168,K=4096"])
    assert not any("cannot be" in w for w in ok.plan.warnings)


# ----------------------------------------------------------------------------- no match: the reason
@needs_traces
@pytest.mark.parametrize("trace, kind, words", [
    (MI300X, "not_covered", ["bf16 dense_gemm", "which no card covers"]),
    (A100, "no_card_for_arch", ["no card is for sm_80", "A100"]),
    (SGLANG, "op_unknown", ["launching op is not in the trace"]),
])
def test_every_no_match_answer_names_its_reason(index, trace, kind, words):
    a = api.analyze(trace, index=index)
    assert not a.matches.matches
    nm = a.matches.coverage.no_match
    assert nm.kind == kind and all(w in nm.reason for w in words), nm
    line = _answer(a)
    assert line.startswith("Answer: no skill card matches: ") and nm.reason in line and f"next: {nm.next}" in line
    # the top family the reason names is the hottest one the coverage lists (not offered ones aside)
    top = next(f for f in a.matches.coverage.families if f.status != "not_offered")
    assert f"{top.pct_gpu:.1f}%" in nm.reason or kind == "no_card_for_arch" and f"{top.pct_gpu:.1f}%" in line


@needs_traces
def test_an_arch_override_that_explains_the_miss_says_so(index):
    """The bundled H200 trace read as gfx942: the block-scale card fails only on the arch the override
    gave; the Answer says so and how to undo it."""
    a = api.analyze(EXAMPLE, index=index, arch="gfx942")
    assert not a.matches.matches and a.profile.arch_from_trace == "sm_90"
    nm = a.matches.coverage.no_match
    assert nm.kind == "arch_override" and "--arch gfx942" in nm.reason and "sm_90" in nm.reason
    assert "triton_fp8_blockscale_gemm_sm90" in nm.reason and nm.next.startswith("drop --arch")


@needs_traces
def test_an_arch_override_against_the_isa_tags_is_warned():
    prof = ingest(MI300X, arch="gfx950")
    tagged = sum(1 for k in prof.kernels[:200] if "_ISA942" in k.name)
    assert tagged and prof.arch == "gfx950" and prof.arch_from_trace == "gfx942"
    (w,) = [w for w in prof.warnings if w.startswith("--arch gfx950 contradicts")]
    assert f"{tagged} kernel names carry the ISA tag of gfx942" in w
    assert not any("contradicts" in w for w in ingest(MI300X, arch="gfx942").warnings)
    # NVIDIA names give a floor: sm90 kernels cannot have run on an sm_80
    assert any("contradicts" in w for w in ingest(H100, arch="sm_80").warnings)


@needs_traces
def test_a_graph_capture_trace_gets_its_own_answer(index, tmp_path):
    from test_graph_capture import _capture_trace

    path, _, inside = _capture_trace(tmp_path)
    a = api.analyze(path, index=index, arch="gfx942")
    nm = a.matches.coverage.no_match
    assert nm.kind == "graph_capture" and f"{inside} kernel launch(es) were captured" in nm.reason
    assert "replay" in nm.next and nm.reason in _answer(a)


@needs_traces
def test_a_trace_with_no_kernel_is_bad_input_not_no_match(tmp_path):
    doc = json.loads(gzip.decompress(H100.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "kernel"]
    p = tmp_path / "host_only.json"
    p.write_text(json.dumps(doc))
    for args in (("--profile", str(p)), ("kernels", str(p)), ("match", str(p))):
        res = _cli(*args)
        assert res.returncode == 3, (args, res.stdout, res.stderr)
        assert "no GPU kernel executions" in res.stderr and "Hot kernels" not in res.stdout
    res = _cli("--profile", str(p), "--json")
    assert res.returncode == 3 and json.loads(res.stdout)["error"]["exit_code"] == 3


# ----------------------------------------------------------------------------- the same to agents
@needs_traces
@pytest.mark.parametrize("trace", [MI300X, A100, NCU])
def test_cli_langchain_and_mcp_carry_the_same_answer(index, trace):
    res = _cli("--profile", str(trace))
    first = res.stdout.splitlines()[0]
    pytest.importorskip("langchain_core")
    from skillrun.agent import build_tools

    lc = {t.name: t for t in build_tools(index, allowed_paths=[trace.parent], gpu_probe=lambda: None)}
    out = json.loads(lc["analyze_profile"].invoke({"path": str(trace)}))
    assert out["answer"] == first
    if out["no_match"] is not None:
        assert out["no_match"]["reason"] in first and out["no_match"]["reason"] in out["next"]
        assert out["coverage"]["families"] and out["coverage"]["nearest"]


@needs_traces
def test_mcp_server_returns_the_no_match_reason(index, tmp_path):
    """Over stdio, with the official MCP client, as a user's agent sees it."""
    pytest.importorskip("mcp")
    from test_mcp import _run_session, _text

    _, results = _run_session(REPO, [MI300X.parent], [("analyze_profile", {"path": str(MI300X)})], tmp_path)
    out = _text(results[0])
    nm = api.analyze(MI300X, index=index).matches.coverage.no_match
    assert out["no_match"]["kind"] == nm.kind and out["no_match"]["reason"] == nm.reason
    assert out["answer"] == _cli("--profile", str(MI300X)).stdout.splitlines()[0]
    assert out["coverage"]["families"][0]["status"] == "not_covered" and out["coverage"]["nearest"]


# ----------------------------------------------------------------------------- coverage
@needs_traces
def test_coverage_counts_only_what_matched(index):
    """The H200 trace: a tensor-wise _scaled_mm (39.7%) that no card matched was listed 'covered' by
    three cards while the Answer said 19.9% matched; covered now means matched."""
    a = api.analyze(H200, index=index)
    cov = a.matches.coverage
    matched = {m.kernel for m in a.matches.matches}
    by_name = {k.name: k for k in a.profile.kernels}
    covered = [f for f in cov.families if f.status == "covered"]
    assert covered
    share = sum(by_name[n].pct_gpu for n in matched)
    assert sum(f.pct_gpu for f in covered) == pytest.approx(share, abs=0.02)
    assert set().union(*[f.cards for f in covered]) == {m.skill_id for m in a.matches.matches}
    near = [f for f in cov.families if f.status == "near_miss"]
    assert near and all("did not match" in f.note for f in near)
    answer = _answer(a)
    assert f"match {sum(it.pct_gpu for it in a.plan.items):.1f}% of GPU time" in answer
    assert not any(c.startswith("triton_moe") for f in covered for c in f.cards)


@needs_traces
def test_dtype_is_read_from_the_kernel_name_where_the_op_shows_only_activations():
    """A real GEMM kernel of the MI300X trace, renamed as a triton_kernels MoE whose name spells
    MXFP8 activations x MXFP4 weights and launched by a MoE op with bf16 inputs: the family's dtype is
    the one the name spells, not the activations'."""
    k = ingest(MI300X).kernels[0]
    assert {o.dtype for o in k.ops if o.dtype} == {"bf16"}
    moe = k.model_copy(update={"name": "_matmul_ogs_NNT_mxfp8xmxfp4_128x128x128x1_swiglu", "demangled": None,
                               "ops": [o.model_copy(update={"op": "vllm::moe_forward"}) for o in k.ops]})
    assert _family(moe, op_classes) == ("moe", "mxfp8×mxfp4")
    w4 = moe.model_copy(update={"name": "_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1_swiglu"})
    assert _family(w4, op_classes) == ("moe", "bf16×mxfp4")
    assert _family(k, op_classes) == ("dense_gemm", "bf16")  # a name that says nothing changes nothing
