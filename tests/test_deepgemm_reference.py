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
    monkeypatch.delitem(sys.modules, "deep_gemm", raising=False)
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
