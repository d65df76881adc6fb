"""`skill-run --profile` on the fp8 block-scale MoE fixtures (tests/fixtures/make_fp8_moe_fixtures.py):
a gfx950 rocprofv3 CSV of aiter's block-scale MoE kernels, an H200 torch.profiler trace of
DeepGEMM's grouped kernels and one of the bundled sm_90 workload (the cuBLAS per-expert layer run
as one custom op; all synthetic around real kernel names) match this family's cards, every
criterion passes, and a recipe is picked per shape; the dense block-scale cards stay off the
grouped kernels and off the expert GEMMs of a MoE layer op, and keep the dense calls beside them.
"""
from __future__ import annotations

from pathlib import Path

import gzip
import json
import shutil

import pytest

from skillrun import api
from skillrun.ingest import _kineto_shard, torch_trace
from skillrun.ingest.shapes import op_shape

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
    assert "mfma_moe1_bs_fp8_f16_cshuffle_t16x256x128_wpe2_abi8" in names  # FlyDSL upstream's stage 1
    assert not any("MoeSortingKernel" in n for n in names)
    # FlyDSL's block-scale stage 2 shares its name form with other fp8 MoE stage-2 modules: not by name
    assert "mfma_moe2_fp8_bf16_cshuffle_t32x256x128_wpe2_abi6" not in names
    for m in hits:
        assert all(c.passed for c in m.criteria if c.required), m.criteria
        assert all(c.reason for c in m.criteria)
    # the dense CK block-scale GEMM in the same step stays with the dense card
    dense = _matched(rep, "flydsl_fp8_blockscale_gemm")
    assert dense and all("blockscale_b_preshuffle" in m.kernel for m in dense)
    for tokens, recipe in ((1, "decode"), (256, "small_batch"), (4096, "prefill")):
        plan = api.plan(prof, rep, index, shapes=[{"tokens": tokens, **DSV3}])
        items = [i for i in plan.items if i.skill_id == "flydsl_moe_fp8_blockscale"]
        assert len(items) == 1 and items[0].recipe == recipe and items[0].shape_provenance == "user"
        # the MoE --shape is not handed to the dense card (its problem is M,N,K): it stays unresolved
        dense_items = [i for i in plan.items if i.skill_id == "flydsl_fp8_blockscale_gemm"]
        assert dense_items and all(i.shape is None and i.shape_provenance == "unresolved" for i in dense_items)


def test_gfx950_moe_kernels_of_other_quantizations_do_not_match(index):
    """Per-token fp8 (aiter ASM, FlyDSL stage 1), bf16 (CK GridwiseMoeGemm) and int4-weight (a16wi4)
    MoE kernels: none is this card's; the a16wi4 one is the a16wi4 card's."""
    prof = api.ingest_profile(FIX / "rocprofv3_gfx950_moe_near_misses.synthetic.csv", arch="gfx950")
    rep = api.match(prof, index)
    assert len(prof.kernels) == 5
    assert not _matched(rep, "flydsl_moe_fp8_blockscale")
    a16wi4 = {m.kernel for m in _matched(rep, "flydsl_moe_a16wi4")}
    assert a16wi4 == {"flydsl_moe1_abf16_wint4_bf16_t16x64x128_kb4"}
    from skillrun.plan.match import match_kernel

    card = index.skill("flydsl_moe_fp8_blockscale")
    for k in prof.kernels:  # each fails on identity alone: the name says another quantization
        crit = {c.name: c for c in match_kernel(card, k, "gfx950").criteria}
        assert crit["identity"].passed is False and "does not match" in crit["identity"].reason, k.name


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


LAYER_TRACE = FIX / "kineto_h200_cublas_moe_layer.synthetic.json"
LAYER_OP = "skillrun::fused_moe_fp8_blockscale"
MOE = "triton_moe_fp8_blockscale_sm90"
DENSE = "triton_fp8_blockscale_gemm_sm90"


def _layer_trace_with(tmp_path, edit) -> str:
    """The bundled-workload fixture with ``edit(args)`` applied to every layer op's args."""
    doc = json.loads(LAYER_TRACE.read_text())
    for ev in doc["traceEvents"]:
        if ev.get("cat") == "cpu_op" and ev["name"] == LAYER_OP:
            edit(ev["args"])
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(doc))
    return str(out)


def test_bundled_workload_trace_matches_the_moe_card_through_its_layer_op(index):
    prof = api.ingest_profile(LAYER_TRACE)
    rep = api.match(prof, index)
    hits = _matched(rep, MOE)
    # the expert GEMMs (both cuBLAS kernels) and the layer's glue, all linked to the layer op
    assert {m.kernel for m in hits} >= {k.name for k in prof.kernels if k.name.startswith("nvjet_")}
    for m in hits:
        assert all(c.passed for c in m.criteria if c.required), m.criteria
        assert all(c.reason for c in m.criteria)
        ident = next(c for c in m.criteria if c.name == "identity")
        assert ident.reason.startswith(f"launching op {LAYER_OP} with blockwise_1x128_128x128"), ident.reason
    # the dense card matches the kernel by name, but only the dense call outside the layer is planned for it
    plan = api.plan(prof, rep, index)
    dense = [i for i in plan.items if i.skill_id == DENSE]
    assert [i.shape for i in dense] == [{"M": 16, "N": 4096, "K": 7168}]
    moe = {i.shape["tokens"]: i for i in plan.items if i.skill_id == MOE}
    assert set(moe) == {16, 4096}
    for tokens, recipe in ((16, "decode"), (4096, "prefill")):
        it = moe[tokens]
        assert it.recipe == recipe and it.shape_provenance == "trace" and not it.untuned
        assert it.shape == {"tokens": tokens, **DSV3}
    # the down-GEMM kernel runs only inside the layer: the dense card does not take it
    down = next(k.name for k in prof.kernels if k.name.endswith("_4x1_v_bz_coopA_algo2_Ablk128_Bvec128_TNN"))
    assert not any(m.kernel == down for m in _matched(rep, DENSE))
    assert all(i.skill_id != DENSE or i.kernel != down for i in plan.items)


def test_layer_op_of_another_quantization_is_a_near_miss(index, tmp_path):
    def per_tensor(args):  # W1/W2 scales one per expert: not block-scale
        args["Input Dims"][6] = [args["Input Dims"][1][0]]
        args["Input Dims"][7] = [args["Input Dims"][1][0]]

    def bf16(args):
        args["Input type"][0:3] = ["c10::BFloat16"] * 3

    for edit, why in ((per_tensor, "scale recipe unknown"), (bf16, "dtype bf16")):
        rep = api.match(api.ingest_profile(_layer_trace_with(tmp_path, edit)), index)
        assert not _matched(rep, MOE), edit.__name__
        near = [m for m in rep.near_misses if m.skill_id == MOE]
        assert near and all(why in next(c.reason for c in m.criteria if c.name == "identity") for m in near), edit.__name__
        # still the layer's: the dense card does not take the expert GEMMs it launched
        assert all(i.skill_id != DENSE or i.shape == {"M": 16, "N": 4096, "K": 7168}
                   for i in api.plan(api.ingest_profile(_layer_trace_with(tmp_path, edit)), rep, index).items)


def test_layer_op_without_a_moe_shape_links_nothing(index, tmp_path):
    def no_dims(args):  # a layer op recorded without shapes (record_shapes off): kernels stay with their aten ops
        args.pop("Input Dims")

    prof = api.ingest_profile(_layer_trace_with(tmp_path, no_dims))
    ops = {oc.op for k in prof.kernels for oc in k.ops}
    assert LAYER_OP not in ops and "aten::_scaled_mm" in ops
    assert not _matched(api.match(prof, index), MOE)


def test_layer_linking_is_the_same_on_the_large_file_path(tmp_path, monkeypatch):
    monkeypatch.setattr(_kineto_shard, "READ_SIZE", 8 << 10)
    monkeypatch.setattr(_kineto_shard, "TAIL_MARGIN", 4 << 10)
    plain = tmp_path / "trace.json"
    shutil.copy(LAYER_TRACE, plain)
    simple = torch_trace.ingest_kineto(plain)
    fast = torch_trace.ingest_kineto(plain, small_limit=0, workers=2)
    assert torch_trace.LAST_STATS["shards"] == 2 and torch_trace.LAST_STATS["fast_chunks"] > 0
    def dump(p):
        return {k: v for k, v in p.model_dump(mode="json").items() if k != "source"}

    assert dump(fast) == dump(simple)
    assert any(oc.op == LAYER_OP for k in fast.kernels for oc in k.ops)
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert dump(torch_trace.ingest_kineto(gz, small_limit=0, workers=2)) == dump(simple)


def test_moe_layer_op_shape_reads_the_block_scale_grid():
    t, d, i, e, k = 64, 7168, 2048, 256, 8
    dims = [[t, d], [e, 2 * i, d], [e, d, i], [t, k], [t, k], [t, d // 128], [e, 2 * i // 128, d // 128],
            [e, d // 128, i // 128], [t, d]]
    got = op_shape(LAYER_OP, dims, ["c10::Float8_e4m3fn"] * 3 + ["float"] * 6)
    assert got.shape == {"tokens": t, "model_dim": d, "experts": e, "inter_dim": i, "topk": k}
    assert got.scale_recipe == "blockwise_1x128_128x128" and got.dtype == "fp8_e4m3"
    assert op_shape(LAYER_OP, dims[:5], ["c10::BFloat16"] * 3).scale_recipe is None  # no scales: not block-scale
    per_expert = dims[:6] + [[e], [e], [t, d]]
    assert op_shape(LAYER_OP, per_expert, ["c10::Float8_e4m3fn"] * 3).scale_recipe is None


def test_fixtures_are_reproducible(tmp_path, monkeypatch):
    import importlib.util
    import sys

    monkeypatch.syspath_prepend(str(FIX))
    spec = importlib.util.spec_from_file_location("make_fp8_moe_fixtures", FIX / "make_fp8_moe_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import make_fixtures

    monkeypatch.setattr(make_fixtures, "HERE", tmp_path)
    for fn in (mod.rocprofv3_gfx950_moe, mod.rocprofv3_gfx950_moe_near_misses, mod.kineto_h200_deepgemm_moe,
               mod.kineto_h200_cublas_moe_layer):
        p = fn()
        assert p.parent == tmp_path and p.read_bytes() == (FIX / p.name).read_bytes(), p.name
    sys.modules.pop("make_fixtures", None)


H200_TRACE = (Path(__file__).resolve().parents[1] / "kernels" / "skillrun_kernels" / "fp8_blockscale_moe" / "traces"
              / "h200_cublas_per_expert_baseline.trace.json.gz")


def test_real_h200_trace_of_the_bundled_workload_matches_the_moe_card_and_picks_a_recipe_per_shape(index):
    """The workload profiled on the H200 (commit 0249008; one profiler step kept): every expert GEMM and
    the layer's glue are taken by the MoE card with every criterion explained, the dense card only near-misses
    them (its operator criterion), and the plan picks decode for 16 tokens and prefill for 4096."""
    prof = api.ingest_profile(H200_TRACE)
    assert prof.arch == "sm_90" and any("H200" in (d.name or "") for d in prof.devices)
    rep = api.match(prof, index)
    hits = _matched(rep, MOE)
    nvjet = {k.name for k in prof.kernels if k.name.startswith("nvjet_")}
    assert nvjet and {m.kernel for m in hits} >= nvjet
    for m in hits:
        assert all(c.passed and c.reason for c in m.criteria if c.required), m.criteria
    assert not _matched(rep, DENSE)
    dense_miss = [m for m in rep.near_misses if m.skill_id == DENSE and m.kernel in nvjet]
    assert dense_miss and all(not next(c for c in m.criteria if c.name == "operator").passed for m in dense_miss)
    plan = api.plan(prof, rep, index)
    moe = {i.shape["tokens"]: i for i in plan.items if i.skill_id == MOE}
    assert {t: i.recipe for t, i in moe.items()} == {16: "decode", 4096: "prefill"}
    assert all(i.shape == {"tokens": t, **DSV3} and i.shape_provenance == "trace" for t, i in moe.items())
