"""`skill-run --profile` on the fp8 block-scale MoE fixtures (tests/fixtures/make_fp8_moe_fixtures.py):
a gfx950 rocprofv3 CSV of aiter's block-scale MoE kernels and an H200 torch.profiler trace of
DeepGEMM's grouped kernels (both synthetic around real kernel names) match this family's cards,
every criterion passes, and a recipe is picked per shape; the dense block-scale cards stay off the
grouped kernels.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from skillrun import api

FIX = Path(__file__).resolve().parent / "fixtures"
DSV3 = {"model_dim": 7168, "inter_dim": 2048, "experts": 256, "topk": 8}


@pytest.fixture(scope="module")
def index():
    return api.load_index()


def _matched(report, card_id):
    return [m for m in report.matches if m.skill_id == card_id and m.matched]


def test_gfx950_rocprofv3_csv_matches_the_flydsl_card_with_every_criterion(index):
    prof = api.ingest_profile(FIX / "rocprofv3_gfx950_fp8_blockscale_moe.synthetic.csv", arch="gfx950")
    rep = api.match(prof, index)
    hits = _matched(rep, "flydsl_moe_fp8_blockscale")
    names = {m.kernel for m in hits}
    assert any("GridwiseMoeGemmBlockScale" in n for n in names)
    assert any("fmoe_bf16_blockscaleFp8" in n for n in names)
    assert not any("MoeSortingKernel" in n for n in names)
    for m in hits:
        assert all(c.passed for c in m.criteria if c.required), m.criteria
        assert all(c.reason for c in m.criteria)
    # the dense CK block-scale GEMM in the same step stays with the dense card
    dense = _matched(rep, "flydsl_fp8_blockscale_gemm")
    assert dense and all("blockscale_b_preshuffle" in m.kernel for m in dense)
    for tokens, recipe in ((1, "decode"), (256, "small_batch"), (4096, "prefill")):
        items = [i for i in api.plan(prof, rep, index, shapes=[{"tokens": tokens, **DSV3}]).items
                 if i.skill_id == "flydsl_moe_fp8_blockscale"]
        assert len(items) == 1 and items[0].recipe == recipe and items[0].shape_provenance == "user"


def test_h200_kineto_trace_matches_the_sm90_card_and_not_the_dense_one(index):
    prof = api.ingest_profile(FIX / "kineto_h200_deepgemm_moe.synthetic.json")
    assert prof.arch == "sm_90"
    rep = api.match(prof, index)
    hits = _matched(rep, "triton_moe_fp8_blockscale_sm90")
    assert len(hits) == 2 and all("GemmType)1" in m.kernel for m in hits)
    assert not _matched(rep, "triton_fp8_blockscale_gemm_sm90")  # grouped GEMMs are not dense GEMMs
    items = [i for i in api.plan(prof, rep, index).items if i.skill_id == "triton_moe_fp8_blockscale_sm90"]
    assert items and items[0].status == "unresolved_shape"  # (N, K) off the name do not give tokens/top-k
    for tokens, recipe in ((16, "decode"), (2048, "small_batch"), (4096, "prefill")):
        items = [i for i in api.plan(prof, rep, index, shapes=[{"tokens": tokens, **DSV3}]).items
                 if i.skill_id == "triton_moe_fp8_blockscale_sm90"]
        assert len(items) == 1 and items[0].recipe == recipe


def test_fixtures_are_reproducible(tmp_path, monkeypatch):
    import importlib.util
    import sys

    monkeypatch.syspath_prepend(str(FIX))
    spec = importlib.util.spec_from_file_location("make_fp8_moe_fixtures", FIX / "make_fp8_moe_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import make_fixtures

    monkeypatch.setattr(make_fixtures, "HERE", tmp_path)
    for fn in (mod.rocprofv3_gfx950_moe, mod.kineto_h200_deepgemm_moe):
        p = fn()
        assert p.parent == tmp_path and p.read_bytes() == (FIX / p.name).read_bytes(), p.name
    sys.modules.pop("make_fixtures", None)
