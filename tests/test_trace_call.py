"""The trace's own call is the plan's baseline (issue 34): the plan recovers the call pattern (scale
layout and padding, a loop of calls or one batched call, eager or graph), compares the port against the
reference that reproduces it, and says first when that call returns wrong results, with what to do.
Measured gains and card priors are counted apart."""
from __future__ import annotations

from pathlib import Path

import pytest
from rich.text import Text

from skillrun import api
from skillrun.evidence.index import build_index
from skillrun.kb.index import SkillIndex
from skillrun.models import OpCall
from skillrun.plan.callpattern import call_pattern, trace_reference
from skillrun.plan.planner import answer_line, item_lines, plan_lines

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "runner" / "skillrun" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz"
LOOP_K8192 = REPO / "tests" / "fixtures" / "kineto_h200_rowwise_loop_k8192.synthetic.json"
LOOP = REPO / "tests" / "fixtures" / "kineto_h200_rowwise_loop.synthetic.json"
BLOCK = "triton_fp8_blockscale_gemm_sm90"
ROWWISE = "triton_fp8_rowwise_batched_gemm_sm90"


@pytest.fixture(scope="module")
def index():
    return SkillIndex.load(REPO)


@pytest.fixture(scope="module")
def example(index):
    return api.analyze(EXAMPLE, index=index)


def _blockwise_op(k: int, scale_b_dims, scale_b_strides) -> OpCall:
    m, n = 16384, 7168
    return OpCall(op="aten::_scaled_mm", input_dims=[[m, k], [k, n], [m, k // 128], scale_b_dims, [], []],
                  input_strides=[[k, 1], [1, k], [1, m], scale_b_strides, [], []], shape={"M": m, "N": n, "K": k},
                  dtype="fp8_e4m3", scale_recipe="blockwise_1x128_128x128", calls=3, total_us=540.0)


def test_the_scale_layout_of_the_trace_picks_the_reference_that_reproduces_it(index):
    calls = index.skill(BLOCK).references["trace_calls"]
    unpadded = call_pattern(_blockwise_op(768, [6, 56], [1, 6]))
    assert unpadded["scale_b_padded"] is False and "K/128 = 6, not padded to a multiple of 4" in unpadded["description"]
    assert trace_reference(calls, unpadded)["name"] == "cublas_blockwise"
    padded = call_pattern(_blockwise_op(768, [6, 56], [1, 8]))  # the (N/128, 8) tensor, sliced and transposed
    assert padded["scale_b_padded"] is True and trace_reference(calls, padded)["name"] == "cublas_blockwise_padded"
    aligned = call_pattern(_blockwise_op(1536, [12, 56], [1, 12]))  # K/128 = 12: padding changes nothing
    assert aligned["scale_b_padded"] is None and trace_reference(calls, aligned)["name"] == "cublas_blockwise"
    loop = call_pattern(OpCall(op="aten::_scaled_mm", scale_recipe="rowwise", loop_batch=16, shape={"M": 1, "N": 2, "K": 3}))
    assert loop["loop"] and loop["calls_per_step"] == 16
    assert trace_reference(index.skill(ROWWISE).references["trace_calls"], loop)["name"] == "scaled_mm_loop"
    one_call = call_pattern(OpCall(op="aten::_scaled_mm", scale_recipe="rowwise", shape={"M": 1, "N": 2, "K": 3}))
    assert trace_reference(index.skill(ROWWISE).references["trace_calls"], one_call) is None


def test_bundled_example_k768_says_the_traces_call_returns_wrong_results_and_what_to_do(example):
    items = {tuple(it.shape.values()): it for it in example.plan.items}
    k768 = items[(16384, 7168, 768)]
    assert k768.trace_call["reference"] == "cublas_blockwise" and k768.trace_call["scale_b_padded"] is False
    vs = k768.versus_trace_call
    assert vs["name"] == "cublas_blockwise" and vs["passed"] is False and vs["path"] == k768.evidence["path"]
    assert k768.expected_speedup == vs["speedup"]  # the port against what the trace runs
    assert k768.wrong_results.startswith("your call returns wrong results here: cublas_blockwise, which reproduces the trace's call")
    assert "do: switch to cublas_blockwise_padded (pad the 128x128 weight scales' K-block axis" in k768.wrong_results
    assert not any("keep the baseline" in n for n in k768.notes)  # the baseline is wrong here: no such advice
    lines = [Text.from_markup(line).plain for line in item_lines(3, k768)]
    assert lines[1].strip().startswith("your call returns wrong results here:")  # said first, before the recipe
    assert any("beside it: 0.920× vs cublas_blockwise_padded, the fastest oracle-correct production kernel" in ln for ln in lines)
    # every other shape's K/128 is a multiple of 4: the same call is oracle-correct, and nothing is said
    assert [it for it in example.plan.items if it.wrong_results] == [k768]
    answer = Text.from_markup(answer_line(example.plan, 1)).plain
    assert answer.startswith("Answer: your call returns wrong results here: [3] M=16384,N=7168,K=768 "
                             "(cublas_blockwise fails the fp32 oracle; switch to cublas_blockwise_padded)")
    assert "Your call returns wrong results in 1 item(s): [3]" in "\n".join(Text.from_markup(x).plain for x in plan_lines(example.plan))


def test_a_padded_call_is_compared_with_the_padded_reference_and_is_not_wrong(index):
    from skillrun.plan.planner import _item
    from skillrun.ingest.torch_trace import ingest_kineto

    prof = ingest_kineto(EXAMPLE)
    k = prof.kernels[0]
    ev = build_index(index)
    oc = _blockwise_op(768, [6, 56], [1, 8])
    it = _item(index.skill(BLOCK), k, oc.shape, "trace", oc.dtype, 14.5, index, "sm_90", evidence=ev, device="NVIDIA H200", oc=oc)
    assert it.versus_trace_call["name"] == "cublas_blockwise_padded" and it.versus_trace_call["passed"] is True
    assert it.wrong_results is None and it.expected_speedup == pytest.approx(0.9197)


def test_a_loop_of_rowwise_calls_is_compared_against_that_loop_which_fails_the_oracle(index):
    a = api.analyze(LOOP_K8192, index=index)
    (it,) = [x for x in a.plan.items if x.skill_id == ROWWISE]
    assert it.shape == {"batch": 16, "M": 128, "N": 1280, "K": 8192} and it.shape_provenance == "inferred_loop"
    assert it.trace_call["loop"] and it.trace_call["reference"] == "scaled_mm_loop"
    vs = it.versus_trace_call
    assert vs["name"] == "scaled_mm_loop" and vs["passed"] is False
    # the item's ratio is against the loop the trace runs, not MSLK's batched kernel (the headline, 0.756x)
    assert it.expected_speedup == vs["speedup"] and it.expected_speedup > 1.0 > it.evidence["speedup"]
    assert it.projected_e2e_gain_pct > 0
    assert "scaled_mm_loop, which reproduces the trace's call" in it.wrong_results and "fails the fp32 oracle" in it.wrong_results
    assert "do: adopt the port" in it.wrong_results
    assert any("timed as CUDA-graph replays" in n for n in it.notes)  # the trace's loop is eager
    answer = Text.from_markup(answer_line(a.plan, 1)).plain
    assert answer.startswith("Answer: your call returns wrong results here: [1] batch=16,M=128,N=1280,K=8192 (scaled_mm_loop fails the fp32 oracle; adopt the port)")


def test_measured_gain_and_card_priors_are_shown_apart(index):
    a = api.analyze(LOOP, index=index)  # the evidence for this shape is stale: the item quotes the card's prior
    (it,) = a.plan.items
    assert it.expected_source == "card_prior" and it.projected_e2e_gain_pct > 0
    assert a.plan.measured_gain_pct == 0.0 and a.plan.prior_gain_pct == pytest.approx(it.projected_e2e_gain_pct)
    line = answer_line(a.plan, 1)
    plain = Text.from_markup(line).plain
    assert "projected end-to-end gain +0.00% of GPU time measured (0 item(s))" in plain
    assert f"card priors +{it.projected_e2e_gain_pct:.2f}% more (1 item(s), not measured)" in plain
    spans = {plain[s.start:s.end]: str(s.style) for s in Text.from_markup(line).spans}
    assert not any("priors" in k or "44." in k for k, st in spans.items() if "green" in st)  # a prior never reads as a win


def test_an_untuned_fallbacks_prior_contributes_no_gain(index):
    a = api.analyze(LOOP, index=index, shapes=["batch=16,M=8192,N=8192,K=1024"])
    (it,) = [x for x in a.plan.items if x.skill_id == ROWWISE]
    assert it.untuned and it.expected_source == "card_prior" and it.expected_speedup
    assert it.projected_e2e_gain_pct is None and any("untuned fallback" in n for n in it.notes)
    assert (a.plan.prior_gain_pct or 0.0) == 0.0
