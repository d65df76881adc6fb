"""Per-batch loops: identical _scaled_mm calls inside one profiler step give the row-wise card its `batch`."""
from __future__ import annotations

from pathlib import Path

import pytest

from skillrun import api
from skillrun.ingest._loops import loop_batches
from skillrun.ingest.torch_trace import ingest_kineto
from skillrun.kb.index import SkillIndex

REPO = Path(__file__).resolve().parents[1]
LOOP = REPO / "tests" / "fixtures" / "kineto_h200_rowwise_loop.synthetic.json"
CARD = "triton_fp8_rowwise_batched_gemm_sm90"


@pytest.mark.parametrize("small_limit", [None, 0], ids=["whole-document", "chunked-fast-path"])
def test_ingest_records_the_loop_length(small_limit):
    kw = {} if small_limit is None else {"small_limit": small_limit, "workers": 1}
    prof = ingest_kineto(LOOP, **kw)
    k = prof.kernels[0]
    assert "ovscale" in k.name and k.calls == 48
    op = next(o for o in k.ops if o.op == "aten::_scaled_mm")
    assert op.shape == {"M": 128, "N": 8192, "K": 1024} and op.scale_recipe == "rowwise"
    assert op.loop_batch == 16
    # The elementwise op after each loop runs once per step: no loop.
    other = next(kk for kk in prof.kernels if kk.name != k.name)
    assert all(o.loop_batch is None for o in other.ops)


def test_plan_infers_batch_with_provenance():
    index = SkillIndex.load(REPO)
    a = api.analyze(LOOP, index=index)
    items = [it for it in a.plan.items if it.skill_id == CARD]
    assert len(items) == 1
    it = items[0]
    assert it.shape == {"batch": 16, "M": 128, "N": 8192, "K": 1024}
    assert it.shape_provenance == "inferred_loop"
    assert it.status == "planned" and it.recipe == "wide_n_mid_m"
    assert any("batch=16 inferred from runs of 16 identical aten::_scaled_mm calls" in n for n in it.notes)
    from skillrun.plan.planner import plan_lines

    assert "(inferred_loop, " in "\n".join(plan_lines(a.plan))


def test_user_shape_overrides_the_inferred_batch():
    index = SkillIndex.load(REPO)
    a = api.analyze(LOOP, index=index, shapes=["batch=8,M=128,N=8192,K=1024"])
    items = [it for it in a.plan.items if it.skill_id == CARD]
    assert [(it.shape, it.shape_provenance) for it in items] == [({"batch": 8, "M": 128, "N": 8192, "K": 1024}, "user")]


def test_runs_are_cut_at_profiler_steps():
    a, b, c = "mm", "add", "other"
    # Two steps of [a a a a] back to back on one thread: without the step bounds this is one run of 8.
    inst = [(1, float(t), a) for t in range(8)]
    assert loop_batches(inst) == {a: 8}
    assert loop_batches(inst, steps=[(1, 0.0, 3.5), (1, 3.6, 8.0)]) == {a: 4}
    # Different run lengths for one op, or a single call somewhere: no inference.
    mixed = [(1, 0.0, a), (1, 1.0, a), (1, 2.0, b), (1, 3.0, a), (1, 4.0, a), (1, 5.0, a)]
    assert a not in loop_batches(mixed)
    lone = [(1, 0.0, a), (1, 1.0, a), (1, 2.0, b), (1, 3.0, a)]
    assert loop_batches(lone) == {}
    # One op launching two kernels is one call; another thread has its own sequence.
    dup = [(1, 0.0, a), (1, 0.0, a), (1, 1.0, a), (2, 0.5, a), (2, 0.7, a), (1, 2.0, c)]
    assert loop_batches(dup) == {a: 2}


def test_fast_scanner_reads_profiler_steps():
    import json

    from skillrun.ingest._kineto_shard import Shard, detect_prefixes

    events = json.loads(LOOP.read_text())["traceEvents"]
    # The device-side copy of a step annotation must not count as a host step.
    events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#0", "pid": 0, "tid": 7, "ts": 1.0, "dur": 5.0})
    buf = json.dumps(events)[1:-1].encode()
    shard = Shard()
    shard.scan_chunk(buf, detect_prefixes(buf))
    assert shard.fast_chunks == 1 and shard.slow_chunks == 0
    assert [s[0] for s in shard.steps] == [5150, 5150, 5150]
    slow = Shard()
    slow.add_events(events)
    assert slow.steps == shard.steps


def test_card_prior_says_which_reference_it_is_a_ratio_against():
    # The row-wise card's priors were measured against the per-batch loop, while its baseline is now
    # MSLK's batched kernel: the plan must say what the prior's ratio is against, never leave it to
    # read as a ratio against today's baseline.
    from skillrun.plan.planner import plan_lines

    idx = SkillIndex.load(REPO)
    a = api.analyze(LOOP, index=idx)
    item = next(it for it in a.plan.items if it.skill_id == "triton_fp8_rowwise_batched_gemm_sm90")
    assert item.expected_source == "card_prior" and "loop" in (item.prior_versus or "")
    text = "\n".join(plan_lines(a.plan))
    assert "a ratio against per-batch torch._scaled_mm loop" in text
