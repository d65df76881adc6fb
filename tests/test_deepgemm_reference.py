"""DeepGEMM as the sm_90 block-scale card's production reference, on the CPU.

* Unavailable: without ``deep_gemm`` the builder raises ReferenceUnavailable naming the import
  error and how to build it (the harness records status ``unavailable``, never another kernel).
* Argument shaping, against a test double of DeepGEMM's API (tests/fixtures/fake_deep_gemm): the
  operands, the scale layouts and the call order match DeepGEMM 2.x, and the activation scales are
  brought into DeepGEMM's layout once in ``prepare``, not on every timed call.
* A shape DeepGEMM's host code refuses is ``unsupported`` with its text; its JIT failing is
  ``unavailable`` (the toolchain, not the shape).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from skillrun.execute import parity
from skillrun.kb.index import SkillIndex
from skillrun_kernels import _deepgemm
from skillrun_kernels.fp8_blockscale_gemm import problem
from skillrun_kernels.fp8_blockscale_gemm import references as refs
from skillrun_kernels.protocol import ReferenceUnavailable, UnsupportedShape

FAKE = Path(__file__).parent / "fixtures" / "fake_deep_gemm"
SHAPE = {"M": 70, "N": 200, "K": 384}  # ragged M and N (TMA alignment, a partial 128-row weight block)
TOL = {"rtol": 1e-2, "atol": 1e-2, "min_cosine": 0.999, "max_rel_fro": 0.005}


def test_without_deep_gemm_the_reference_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    with pytest.raises(ReferenceUnavailable) as exc:
        refs.build_deepgemm(dict(SHAPE), {}, "cuda")
    text = str(exc.value)
    assert "deep_gemm is not importable here (ModuleNotFoundError" in text and "device_deepgemm_build.sh" in text


@pytest.fixture()
def fake(monkeypatch):
    real = sys.modules.get("deep_gemm")
    if real is not None and not hasattr(real, "CALLS"):
        pytest.skip("a real deep_gemm is imported in this process")
    monkeypatch.syspath_prepend(str(FAKE))
    # setitem first records what sys.modules held (nothing, on CPU); the delitem's undo runs
    # before it, so the double is gone after the test. A bare delitem would leave it imported,
    # and later tests would find a deep_gemm that "works" on a machine without CUDA.
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    monkeypatch.delitem(sys.modules, "deep_gemm")
    import deep_gemm

    if not hasattr(deep_gemm, "CALLS"):
        pytest.skip("a real deep_gemm is installed here; these tests need the CPU test double")
    deep_gemm.CALLS.clear()
    return deep_gemm


def test_operands_and_scale_layouts_follow_deepgemm_and_sfa_is_aligned_once_in_prepare(fake):
    launch = refs.build_deepgemm(dict(SHAPE), {}, "cpu")
    assert launch.expect_kernels == _deepgemm.DEEPGEMM_KERNELS
    inputs = problem.make_inputs(SHAPE, 5, "cpu")
    prep = launch.prepare(inputs)
    out = problem.output_like(SHAPE, "cpu")
    parity.poison(out)
    res = launch.run(prep, out)
    assert res is out  # DeepGEMM writes into d
    m = parity.compare(res, problem.oracle(inputs).float(), TOL)
    assert m["passed"], m
    (call,) = fake.CALLS
    assert call["shape"] == (70, 200, 384)
    assert not call["sfa_transposed_in_call"], "the timed call would transpose sfa on every launch"
    assert call["sfa_strides"] == (1, 72)  # MN-major, M padded to 16 bytes of fp32
    launch.run(prep, out)
    assert len(fake.CALLS) == 2 and not fake.CALLS[1]["sfa_transposed_in_call"]


def test_a_shape_deepgemm_refuses_is_unsupported_with_its_text(fake):
    shape = {"M": 64, "N": 128, "K": 128}
    launch = refs.build_deepgemm(dict(shape), {}, "cpu")
    inputs = problem.make_inputs(shape, 1, "cpu")
    prep = launch.prepare(inputs)
    prep["a"] = prep["a"][:, :100]  # what a K that is not a multiple of 128 would hand DeepGEMM
    prep["a"] = prep["a"].contiguous()
    with pytest.raises(UnsupportedShape, match=r"k % 128 == 0"):
        launch.run(prep, problem.output_like(shape, "cpu"))


def test_jit_failure_is_unavailable_not_unsupported():
    def boom():
        raise RuntimeError("Assertion error (csrc/jit/compiler.hpp:230): false and \"NVCC compilation failed\"")

    with pytest.raises(ReferenceUnavailable, match="JIT compiler failed"):
        _deepgemm.guarded("fp8_gemm_nt", SHAPE, boom)

    def refuse():
        raise RuntimeError("Assertion error (csrc/apis/gemm.hpp:90): n % 64 == 0")

    with pytest.raises(UnsupportedShape, match=r"deep_gemm.fp8_gemm_nt raised for M=70, N=200, K=384: RuntimeError: Assertion"):
        _deepgemm.guarded("fp8_gemm_nt", SHAPE, refuse)


def test_the_sm90_card_names_deepgemm_as_a_production_reference():
    index = SkillIndex.load(Path(__file__).resolve().parents[1])
    card = index.skill("triton_fp8_blockscale_gemm_sm90")
    alts = {a["name"]: a for a in card.references["alternatives"]}
    assert alts["deepgemm"]["kernel"] == "skillrun_kernels.fp8_blockscale_gemm.references:build_deepgemm"
    assert "deepgemm" in card.references["production"]


# ---------------------------------------------------------------------------------------------
# The fp8 block-scale MoE card's grouped DeepGEMM references (contiguous: prefill, masked: decode)

from skillrun_kernels.fp8_blockscale_moe import problem as moe_problem  # noqa: E402
from skillrun_kernels.fp8_blockscale_moe import references as moe_refs  # noqa: E402

MOE = {"tokens": 7, "model_dim": 256, "inter_dim": 256, "experts": 6, "topk": 3}
MOE_TOL = {"rtol": 0.05, "atol": 0.05, "min_cosine": 0.999, "max_rel_fro": 0.02}  # the MoE card's


@pytest.mark.parametrize("builder", [moe_refs.build_deepgemm_contiguous, moe_refs.build_deepgemm_masked])
def test_without_deep_gemm_the_grouped_references_are_unavailable_with_the_reason(monkeypatch, builder):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    with pytest.raises(ReferenceUnavailable, match=r"deep_gemm is not importable here .*device_deepgemm_build\.sh"):
        builder(dict(MOE), {}, "cuda")


def _bf16_gate_up_oracle(inputs: dict) -> torch.Tensor:
    """The oracle with gate/up rounded to bf16 before SiLU, as a DeepGEMM layer (bf16 d) computes it.
    Against the fp32 oracle such a layer flips a few fp8 codes of h (the MoE card's tolerance note);
    against this one only the bf16 rounding of the outputs remains, so a layout error cannot hide."""
    from skillrun_kernels._moe.routing import expert_rows

    ids = inputs["topk_ids"]
    x = moe_problem.dequant_rows(inputs["a"], inputs["a_scale"])
    inter = inputs["w2"].shape[-1]
    h = torch.zeros(ids.shape[0], ids.shape[1], inter)
    for e, tok, slot in expert_rows(ids):
        gu = (x[tok] @ moe_problem.dequant_weight(inputs["w1"][e], inputs["w1_scale"][e]).t()).to(torch.bfloat16).float()
        h[tok, slot] = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
    hq, hs = moe_problem.quantize_rows_1x128(h.reshape(-1, inter))
    return moe_problem.oracle_stage2(inputs, hq, hs)


def _moe_check(res: torch.Tensor, inputs: dict) -> None:
    m = parity.compare(res, moe_problem.oracle(inputs).float(), MOE_TOL)
    assert m["rel_fro"] < MOE_TOL["max_rel_fro"] and m["cosine"] > MOE_TOL["min_cosine"], m  # the card's bounds
    tight = parity.compare(res, _bf16_gate_up_oracle(inputs), {"rtol": 2e-2, "atol": 2e-2, "min_cosine": 0.9999,
                                                               "max_rel_fro": 5e-3})
    assert tight["passed"], tight


def _moe_run(builder, seed: int):
    launch = builder(dict(MOE), {}, "cpu")
    inputs = moe_problem.make_inputs(MOE, seed, "cpu")
    out = moe_problem.output_like(MOE, "cpu")
    parity.poison(out)
    res = launch.run(launch.prepare(inputs), out)
    return launch, inputs, res


def test_grouped_contiguous_layout_and_parity_against_the_fake(fake):
    launch, inputs, res = _moe_run(moe_refs.build_deepgemm_contiguous, 3)
    _moe_check(res, inputs)
    assert launch.describe["m_alignment"] == 128  # DeepGEMM 2.6's _C.get_mk_alignment_for_contiguous_layout
    stage1, stage2 = fake.CALLS
    counts = torch.bincount(inputs["topk_ids"].reshape(-1).long(), minlength=MOE["experts"])
    total = int(((counts + 127) // 128 * 128).sum())
    assert stage1["shape"] == (total, 2 * MOE["inter_dim"], MOE["model_dim"]) and stage1["groups"] == MOE["experts"]
    assert stage2["shape"] == (total, MOE["model_dim"], MOE["inter_dim"])
    assert stage1["padding_rows"] == total - MOE["tokens"] * MOE["topk"]
    # the scales arrive in the layout DeepGEMM reads: no transpose of its own inside the timed layer
    assert not stage1["sfa_transposed_in_call"] and not stage2["sfa_transposed_in_call"]


def test_grouped_masked_layout_and_parity_against_the_fake(fake):
    launch, inputs, res = _moe_run(moe_refs.build_deepgemm_masked, 4)
    _moe_check(res, inputs)
    stage1, stage2 = fake.CALLS
    counts = torch.bincount(inputs["topk_ids"].reshape(-1).long(), minlength=MOE["experts"]).tolist()
    assert stage1["masked_m"] == counts == stage2["masked_m"]
    assert stage1["shape"] == (MOE["experts"], 64, 2 * MOE["inter_dim"], MOE["model_dim"])  # max_m = tokens -> 64
    assert stage1["expected_m"] == launch.describe["expected_m"] >= 1
    assert not stage1["sfa_transposed_in_call"] and not stage2["sfa_transposed_in_call"]


def test_a_grouped_call_deepgemm_refuses_is_unsupported_with_its_text(fake, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("Assertion error (csrc/apis/gemm.hpp:274): expected_m > 0 and m > 0 and n > 0")

    monkeypatch.setattr(fake, "m_grouped_fp8_gemm_nt_masked", refuse)
    launch = moe_refs.build_deepgemm_masked(dict(MOE), {}, "cpu")
    inputs = moe_problem.make_inputs(MOE, 1, "cpu")
    with pytest.raises(UnsupportedShape, match=r"deep_gemm.m_grouped_fp8_gemm_nt_masked raised for tokens=7"):
        launch.run(launch.prepare(inputs), moe_problem.output_like(MOE, "cpu"))


def test_the_grouped_references_expect_deepgemm_kernels_and_its_layout_kernel():
    import re

    rx = re.compile(moe_refs.DEEPGEMM_GROUPED_KERNELS)
    assert rx.search("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(cute::UMMA::Major)0, 0u, 7168u, 2048u, 32u, 64u, "
                     "128u, 128u, 128u, 128u, 128u, 5u, 128u, 256u, 1u, false, 132u, (deep_gemm::GemmType)1, "
                     "deep_gemm::epilogue::transform::EpilogueIdentity>(float*, int*)")
    assert rx.search("void deep_gemm::transpose_fp32<128u, 64u, 56u>(float const*, float*, unsigned int)")
    assert not rx.search("void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 0u, 0u, 1u, (deep_gemm::GemmType)0>(float*)")


def test_the_moe_card_names_the_grouped_deepgemm_references():
    index = SkillIndex.load(Path(__file__).resolve().parents[1])
    card = index.skill("triton_moe_fp8_blockscale_sm90")
    alts = {a["name"]: a["kernel"] for a in card.references["alternatives"]}
    assert alts["deepgemm_m_grouped_contiguous"].endswith("references:build_deepgemm_contiguous")
    assert alts["deepgemm_m_grouped_masked"].endswith("references:build_deepgemm_masked")
    assert {"deepgemm_m_grouped_contiguous", "deepgemm_m_grouped_masked"} <= set(card.references["production"])


def test_the_test_double_does_not_outlive_its_test(fake):
    # Run inside the fixture: the double is imported now. What matters is what the next test
    # sees, checked by the module-level test below (pytest runs a file's tests in order).
    assert hasattr(sys.modules["deep_gemm"], "CALLS")


def test_after_the_double_s_tests_deep_gemm_is_not_left_imported():
    leaked = sys.modules.get("deep_gemm")
    assert leaked is None or not hasattr(leaked, "CALLS"), "the CPU double of deep_gemm leaked into sys.modules"
