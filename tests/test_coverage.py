"""Coverage on real traces: what the time is, which families a card covers, and for each unmatched
hot kernel the closest card with the criterion it failed; carried by match reports and every plan."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import traces_dir

from skillrun import api
from skillrun.analysis.coverage import coverage_lines
from skillrun.plan.planner import plan_lines

REPO = Path(__file__).resolve().parents[1]
TRACES = traces_dir() or Path("/nonexistent")
needs_traces = pytest.mark.skipif(traces_dir() is None, reason="../shared/traces is not present (set SKILLRUN_TRACES)")
EXAMPLE = REPO / "runner" / "skillrun" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz"
MI300 = TRACES / "pytorch_kineto" / "amd_mi300x_qwen1.5-0.5b_bf16.tracelens.json.gz"
MI350 = TRACES / "rocprofv3" / "amd_mi350x_rocprofv3_kernel_trace_results.json.gz"


@pytest.fixture(scope="module")
def index():
    return api.load_index()


def _analyse(path, index):
    prof = api.ingest_profile(path)
    rep = api.match(prof, index)
    return prof, rep, api.plan(prof, rep, index, evidence=False)


@needs_traces
def test_no_match_says_what_dominates_and_that_no_card_covers_it(index):
    prof, rep, plan = _analyse(MI300, index)
    assert not rep.matches
    fam = rep.coverage.families[0]
    assert (fam.family, fam.dtype, fam.arch, fam.status) == ("dense_gemm", "bf16", "gfx942", "not_covered")
    # Its share is the time of the bf16 aten::mm/addmm GEMM kernels, recomputed from the profile.
    gemm_us = sum(k.total_us for k in prof.kernels if k.category == "gemm"
                  and {o.dtype for o in k.ops if o.dtype} == {"bf16"})
    assert fam.pct_gpu == pytest.approx(100 * gemm_us / prof.total_kernel_us, abs=0.01)
    assert "operator" in fam.note and fam.cards  # the nearest card and what it lacks
    attn = next(f for f in rep.coverage.families if f.family == "attention")
    assert attn.status == "not_covered" and "attention" in attn.note
    # Every unmatched hot kernel gets a reason: the top GEMM's nearest card with its failed criteria.
    top = rep.coverage.nearest[0]
    assert top.kernel == prof.kernels[0].name and top.card
    assert any(f.startswith("operator:") for f in top.failed) and any(f.startswith("identity:") for f in top.failed)
    assert next(n for n in rep.coverage.nearest if n.category == "attention").card is None
    # The plan carries it, and its text ends with it although nothing was planned.
    assert plan.coverage == rep.coverage and not plan.items
    text = "\n".join(plan_lines(plan))
    assert "Coverage:" in text and "bf16 dense_gemm on gfx942" in text and "not covered" in text
    # The JSON of match has the reasons unmatched_hot lacks.
    dumped = rep.model_dump(mode="json")
    assert dumped["coverage"]["nearest"][0]["failed"]


@needs_traces
def test_collectives_are_not_offered_in_coverage(index):
    _, rep, _ = _analyse(MI350, index)
    fam = rep.coverage.families[0]
    assert fam.family == "communication" and fam.status == "not_offered" and fam.pct_gpu > 90
    assert all(n.category != "communication" for n in rep.coverage.nearest)


def test_every_plan_ends_with_coverage_also_when_it_plans(index):
    _, rep, plan = _analyse(EXAMPLE, index)
    assert plan.items and plan.coverage is not None
    fam = plan.coverage.families[0]
    assert fam.status == "covered" and "triton_fp8_blockscale_gemm_sm90" in fam.cards and fam.arch == "sm_90"
    lines = plan_lines(plan)
    assert any(ln.startswith("[bold]Coverage:") for ln in lines)
    assert coverage_lines(plan.coverage)[1].lstrip().startswith("100.0%")


def test_kb_families_name_every_card(index):
    _, rep, _ = _analyse(EXAMPLE, index)
    assert {ln.split(":")[0] for ln in rep.coverage.kb_families} == set(index.skills)
    # The README says up front which families the knowledge base covers: every card is named there.
    readme = (REPO / "README.md").read_text()
    head = readme[: readme.index("## Commands")]
    for cid in index.skills:
        assert cid in head, cid
