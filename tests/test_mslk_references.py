"""MSLK reference builders on the CPU, without the real package.

* Unavailable: with ``mslk`` not importable every builder raises ReferenceUnavailable naming the
  import error (the harness records ``unavailable``), never falls back to another kernel.
* Argument shaping: a test double of MSLK's ops (tests/fixtures/fake_mslk, MSLK v1.1.0's op schemas
  registered through torch.library on the CPU) records every call; the tests check dtypes, shapes,
  layouts and that results match the fp32 oracle, i.e. that the operands mean what MSLK reads.
* Unsupported: an op that raises for a shape becomes UnsupportedShape with MSLK's text; a device
  fault is re-raised as it is.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from skillrun.execute import parity  # noqa: E402
from skillrun_kernels import _mslk  # noqa: E402
from skillrun_kernels.fp8_blockscale_gemm import problem as bs_problem  # noqa: E402
from skillrun_kernels.fp8_blockscale_gemm import references as bs_refs  # noqa: E402
from skillrun_kernels.fp8_rowwise_batched_gemm import problem as rw_problem  # noqa: E402
from skillrun_kernels.fp8_rowwise_batched_gemm import references as rw_refs  # noqa: E402
from skillrun_kernels.moe_a16wi4 import problem as moe_problem  # noqa: E402
from skillrun_kernels.moe_a16wi4 import references as moe_refs  # noqa: E402
from skillrun_kernels.protocol import ReferenceUnavailable, UnsupportedShape  # noqa: E402

FAKE = Path(__file__).parent / "fixtures" / "fake_mslk"
TOL = {"rtol": 1e-2, "atol": 1e-2, "min_cosine": 0.999}

RW = {"batch": 2, "M": 3, "N": 32, "K": 64}
BS = {"M": 5, "N": 200, "K": 256}  # ragged N: two 128-row scale blocks, the last one partial
MOE = {"tokens": 5, "model_dim": 64, "inter_dim": 32, "experts": 4, "topk": 2, "group_size": 32}
# The int4 ops serve a group that is a multiple of 64 or the whole K (here 64 = the down GEMM's K).
MOE_I4 = {"tokens": 5, "model_dim": 128, "inter_dim": 64, "experts": 4, "topk": 2, "group_size": 64}

BUILDERS = [
    (rw_refs.build_mslk_rowwise_batched, RW),
    (rw_refs.build_mslk_rowwise_batched_pad16, RW),
    (rw_refs.build_ck_rowwise_batched, RW),
    (bs_refs.build_mslk_groupwise, BS),
    (moe_refs.build_mslk_bf16i4_shuffled_grouped, MOE_I4),
    (moe_refs.build_mslk_bf16i4_rowwise_batched, MOE_I4),
    (moe_refs.build_mslk_bf16_grouped_stacked, MOE),
]


@pytest.mark.parametrize("builder,shape", BUILDERS, ids=[b.__name__ for b, _ in BUILDERS])
def test_without_mslk_every_builder_is_unavailable_with_the_import_error(monkeypatch, builder, shape):
    monkeypatch.setitem(sys.modules, "mslk", None)  # `import mslk` raises ImportError, installed or not
    with pytest.raises(ReferenceUnavailable) as exc:
        builder(dict(shape), {}, "cpu")
    text = str(exc.value)
    assert "mslk is not importable here (ModuleNotFoundError: import of mslk halted" in text and "mslk-cuda==1.1.0" in text
    assert isinstance(exc.value, ImportError)  # the worker reports it as "ReferenceUnavailable: ..."


def test_aiter_reference_is_unavailable_without_aiter(monkeypatch):
    monkeypatch.setitem(sys.modules, "aiter", None)
    with pytest.raises(ReferenceUnavailable, match="aiter.batched_gemm_a8w8"):
        rw_refs.build_aiter_batched_a8w8(dict(RW), {}, "cpu")


@pytest.fixture(scope="module")
def fake():
    """The MSLK test double, imported once (its torch.library registrations last for the process)."""
    real = sys.modules.get("mslk")
    if real is not None and not hasattr(real, "CALLS"):
        pytest.skip("a real mslk is imported in this process")
    sys.path.insert(0, str(FAKE))
    try:
        import mslk
    finally:
        sys.path.remove(str(FAKE))
    if not hasattr(mslk, "CALLS"):
        pytest.skip("a real mslk is installed here; these tests need the CPU test double")
    return mslk


def _check(problem, launch, shape, seed=3):
    inputs = problem.make_inputs(shape, seed, "cpu")
    out = problem.output_like(shape, "cpu")
    parity.poison(out)
    res = launch.run(launch.prepare(inputs), out)
    m = parity.compare(res, problem.oracle(inputs).float(), TOL)
    assert m["passed"], m
    return inputs, out, res


def _calls(fake, op):
    return [c for c in fake.CALLS if c["op"] == op]


def test_rowwise_batched_gets_contiguous_fp8_operands_fp32_row_scales_and_writes_into_out(fake):
    fake.CALLS.clear()
    launch = rw_refs.build_mslk_rowwise_batched(dict(RW), {}, "cpu")
    assert launch.expect_kernels == _mslk.MSLK_KERNELS and launch.describe["use_fast_accum"] is True
    inputs, out, res = _check(rw_problem, launch, RW)
    (c,) = _calls(fake, "f8f8bf16_rowwise_batched")
    b, m, n, k = RW["batch"], RW["M"], RW["N"], RW["K"]
    assert c["XQ"] == {**c["XQ"], "dtype": "torch.float8_e4m3fn", "shape": (b, m, k), "contiguous": True}
    assert c["WQ"]["dtype"] == "torch.float8_e4m3fn" and c["WQ"]["shape"] == (b, n, k) and c["WQ"]["contiguous"]
    assert c["x_scale"]["dtype"] == "torch.float32" and c["x_scale"]["shape"] == (b, m) and c["x_scale"]["contiguous"]
    assert c["w_scale"]["dtype"] == "torch.float32" and c["w_scale"]["shape"] == (b, n)
    assert c["bias"] is None and c["use_fast_accum"] is True
    assert c["output"]["ptr"] == out.data_ptr() and c["output"]["shape"] == (b, m, n)  # no padding: MSLK writes `out`


def test_rowwise_pad16_pads_m_once_in_prepare_and_copies_the_real_rows(fake):
    fake.CALLS.clear()
    launch = rw_refs.build_mslk_rowwise_batched_pad16(dict(RW), {}, "cpu")
    inputs, out, res = _check(rw_problem, launch, RW)
    assert res is out  # the real rows were copied into the poisoned output
    (c,) = _calls(fake, "f8f8bf16_rowwise_batched")
    assert c["XQ"]["shape"] == (RW["batch"], 16, RW["K"]) and c["x_scale"]["shape"] == (RW["batch"], 16)
    assert c["output"]["shape"] == (RW["batch"], 16, RW["N"]) and c["output"]["ptr"] != out.data_ptr()
    assert launch.describe["pad_m_to"] == 16
    assert re.search(launch.expect_kernels, "void at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)")


def test_groupwise_scales_are_mslk_layout_k_blocks_by_m_and_k_blocks_by_n_blocks(fake):
    inputs = bs_problem.make_inputs(BS, 5, "cpu")
    xs, ws = bs_refs.mslk_groupwise_scales(inputs["a_scale"], inputs["b_scale"])
    kb, nb = BS["K"] // 128, -(-BS["N"] // 128)
    assert xs.shape == (kb, BS["M"]) and xs.is_contiguous() and xs.dtype == torch.float32
    assert ws.shape == (kb, nb) and ws.is_contiguous()
    assert torch.equal(xs[1, 4], inputs["a_scale"][4, 1]) and torch.equal(ws[1, 1], inputs["b_scale"][1, 1])
    fake.CALLS.clear()
    _check(bs_problem, bs_refs.build_mslk_groupwise(dict(BS), {}, "cpu"), BS)
    (c,) = _calls(fake, "f8f8bf16_groupwise")
    assert c["XQ"]["shape"] == (BS["M"], BS["K"]) and c["WQ"]["shape"] == (BS["N"], BS["K"])
    assert c["x_scale"]["shape"] == (kb, BS["M"]) and c["w_scale"]["shape"] == (kb, nb)


def test_the_problem_row_major_scales_handed_over_as_is_give_wrong_results(fake):
    """Positive control for the layout test above: the 'naive layout' must not pass the oracle."""
    inputs = bs_problem.make_inputs(BS, 5, "cpu")
    with pytest.raises(RuntimeError, match="groupwise scales must be"):
        torch.ops.mslk.f8f8bf16_groupwise(inputs["a"], inputs["b"], inputs["a_scale"], inputs["b_scale"])


def test_int4_operands_are_signed_nibbles_even_k_low_with_k_group_major_scales_and_zero_points(fake):
    inputs = moe_problem.make_inputs(MOE_I4, 7, "cpu")
    packed, scale, zero = moe_refs.mslk_int4_operands(inputs["w1_q"], inputs["w1_scale"])
    e, n, k = inputs["w1_q"].shape
    assert packed.dtype == torch.int8 and packed.shape == (e, n, k // 2)
    q = inputs["w1_q"].to(torch.int16)
    # MSLK's pack_int4: low = q[..., ::2] & 0xF, high = q[..., 1::2] << 4 (CUTLASS int4b_t order)
    want = ((q[..., 0::2] & 0xF) | ((q[..., 1::2] & 0xF) << 4)).to(torch.uint8)
    assert torch.equal(packed.view(torch.uint8), want)
    assert scale.shape == (e, k // MOE_I4["group_size"], n) and scale.dtype == torch.bfloat16 and scale.is_contiguous()
    assert torch.equal(scale[2, 1, 5], inputs["w1_scale"][2, 5, 1])
    assert zero.shape == scale.shape and not zero.any()  # symmetric int4 = zero-point form with z = 0


def test_shuffled_grouped_moe_preshuffles_copies_and_passes_int64_m_sizes(fake):
    fake.CALLS.clear()
    launch = moe_refs.build_mslk_bf16i4_shuffled_grouped(dict(MOE_I4), {}, "cpu")
    inputs = moe_problem.make_inputs(MOE_I4, 3, "cpu")
    prepared = launch.prepare(inputs)
    pre = _calls(fake, "preshuffle_i4")
    assert len(pre) == 2 * MOE_I4["experts"]  # per expert, for w1 and w2
    assert all(c["WQ"]["dtype"] == "torch.int8" and c["WQ"]["contiguous"] and c["w_scale"]["dtype"] == "torch.bfloat16"
               for c in pre)
    assert pre[0]["WQ"]["shape"] == (2 * MOE_I4["inter_dim"], MOE_I4["model_dim"] // 2)
    assert pre[0]["w_scale"]["shape"] == (MOE_I4["model_dim"] // MOE_I4["group_size"], 2 * MOE_I4["inter_dim"])
    # in-place on its argument in the real op: it must never see the problem's own tensors
    assert all(c["WQ"]["ptr"] not in (inputs["w1_q"].data_ptr(), inputs["w2_q"].data_ptr()) for c in pre)
    fake.CALLS.clear()
    out = moe_problem.output_like(MOE_I4, "cpu")
    parity.poison(out)
    res = launch.run(prepared, out)
    assert parity.compare(res, moe_problem.oracle(inputs).float(), TOL)["passed"]
    g1, g2 = _calls(fake, "bf16i4bf16_shuffled_grouped")
    pairs = MOE_I4["tokens"] * MOE_I4["topk"]
    assert g1["X"] == {**g1["X"], "dtype": "torch.bfloat16", "shape": (pairs, MOE_I4["model_dim"])}
    assert g1["WQ"]["shape"] == (MOE_I4["experts"], 2 * MOE_I4["inter_dim"], MOE_I4["model_dim"] // 2)
    assert g1["w_scale_group"]["shape"] == (MOE_I4["experts"], MOE_I4["model_dim"] // MOE_I4["group_size"], 2 * MOE_I4["inter_dim"])
    assert g1["w_zero_group"]["shape"] == g1["w_scale_group"]["shape"]
    assert g1["M_sizes"]["dtype"] == "torch.int64" and g1["M_sizes"]["shape"] == (MOE_I4["experts"],)
    assert g2["X"]["shape"] == (pairs, MOE_I4["inter_dim"]) and g2["WQ"]["shape"] == (MOE_I4["experts"], MOE_I4["model_dim"], MOE_I4["inter_dim"] // 2)


def test_rowwise_batched_moe_pads_rows_per_active_expert(fake):
    fake.CALLS.clear()
    inputs, _, _ = _check(moe_problem, moe_refs.build_mslk_bf16i4_rowwise_batched(dict(MOE_I4), {}, "cpu"), MOE_I4)
    g1, g2 = _calls(fake, "bf16i4bf16_rowwise_batched")
    active = torch.unique(inputs["topk_ids"]).numel()
    m_max = int(torch.bincount(inputs["topk_ids"].reshape(-1).long()).max())
    assert g1["X"]["shape"] == (active, m_max, MOE_I4["model_dim"]) and g1["X"]["contiguous"]
    assert g1["WQ"]["shape"] == (active, 2 * MOE_I4["inter_dim"], MOE_I4["model_dim"] // 2)
    assert g1["w_scale"]["shape"] == (active * MOE_I4["model_dim"] // MOE_I4["group_size"], 2 * MOE_I4["inter_dim"]) == g1["w_zp"]["shape"]
    assert g2["X"]["shape"] == (active, m_max, MOE_I4["inter_dim"])


def test_grouped_stacked_ceiling_gets_bf16_weights(fake):
    fake.CALLS.clear()
    _check(moe_problem, moe_refs.build_mslk_bf16_grouped_stacked(dict(MOE), {}, "cpu"), MOE)
    g1, _ = _calls(fake, "bf16bf16bf16_grouped_stacked")
    assert g1["W"]["dtype"] == "torch.bfloat16" and g1["W"]["shape"] == (MOE["experts"], 2 * MOE["inter_dim"], MOE["model_dim"])
    assert g1["M_sizes"]["dtype"] == "torch.int64"


@pytest.mark.parametrize("builder", [moe_refs.build_mslk_bf16i4_shuffled_grouped, moe_refs.build_mslk_bf16i4_rowwise_batched])
@pytest.mark.parametrize("group,model_dim,inter_dim,served", [
    (32, 128, 64, False),    # the seed's group: neither a multiple of 64 nor either GEMM's K
    (32, 64, 32, False),     # equals the down GEMM's K only; the gate/up GEMM (K=64) cannot take it
    (96, 192, 96, False),    # the same with a group above the K tile
    (32, 32, 32, True),      # one group spans each whole K
    (64, 128, 64, True),
    (128, 256, 128, True),
])
def test_int4_builders_refuse_group_sizes_mslk_cannot_serve_before_running(fake, builder, group, model_dim, inter_dim, served):
    shape = {"tokens": 3, "model_dim": model_dim, "inter_dim": inter_dim, "experts": 4, "topk": 2, "group_size": group}
    fake.CALLS.clear()
    if served:
        _check(moe_problem, builder(dict(shape), {}, "cpu"), shape)
        return
    with pytest.raises(UnsupportedShape) as exc:
        builder(dict(shape), {}, "cpu")
    text = str(exc.value)
    assert f"group {group} is neither" in text and "multiple of 64 or equals K" in text and "not run" in text
    assert "torch.ops.mslk.bf16i4bf16_" in text and f"model_dim={model_dim}" in text
    assert not fake.CALLS  # refused at build time: MSLK never saw the shape


def test_an_op_that_refuses_the_shape_is_unsupported_with_its_text(fake, monkeypatch):
    def refuse(*a, **k):
        raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul\nmore detail")

    monkeypatch.setattr(_mslk, "op", lambda name: refuse)
    launch = rw_refs.build_mslk_rowwise_batched(dict(RW), {}, "cpu")
    inputs = rw_problem.make_inputs(RW, 1, "cpu")
    with pytest.raises(UnsupportedShape) as exc:
        launch.run(launch.prepare(inputs), rw_problem.output_like(RW, "cpu"))
    text = str(exc.value)
    assert "torch.ops.mslk.f8f8bf16_rowwise_batched raised for batch=2, M=3, N=32, K=64" in text
    assert "CUBLAS_STATUS_NOT_SUPPORTED" in text and "more detail" in text


def test_a_device_fault_is_not_called_unsupported():
    def fault():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        _mslk.guarded("f8f8bf16_groupwise", {"M": 1}, fault)


def test_a_missing_op_is_unavailable_and_names_it(fake):
    with pytest.raises(ReferenceUnavailable, match="no torch.ops.mslk.f8f8bf16_not_an_op"):
        _mslk.op("f8f8bf16_not_an_op")


def test_mslk_slot_regex_is_broad_for_cutlass_and_ck_names_and_never_matches_the_ports():
    """Names as mslk-cuda 1.1.0's mslk.so spells its kernels (string table), UNVERIFIED against a device
    trace (none recorded with MSLK yet); torch's own CUTLASS/cuBLAS GEMMs must not pass for MSLK."""
    from skillrun_kernels.fp8_rowwise_batched_gemm import triton_sm90 as rw_port
    from skillrun_kernels.moe_a16wi4 import triton_sm90 as moe_port

    rx = re.compile(_mslk.MSLK_KERNELS)
    plausible = [
        "void cutlass_mslk::device_kernel<cutlass_mslk::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
        "cutlass_mslk::gemm::collective::CollectiveMma<...> > >(cutlass_mslk::gemm::kernel::GemmUniversal<...>::Params)",
        "_ZN12cutlass_mslk13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEE",
        "void mslk::gemm::set_kernel_args<cute::tuple<int, int, int>, cutlass_mslk::bfloat16_t>(int, int)",
        "void mslk::gemm::set_stacked_kernel_args_kernel<long>(int, int, int)",
        "_ZN2ck27kernel_gemm_xdl_cshuffle_v3INS_40GridwiseGemm",
    ]
    assert all(rx.search(n) for n in plausible)
    ports = ["_fp8_rowwise_bmm_kernel"] + [f"_moe_a16wi4_{s}_kernel" for s in ("align", "scatter", "gate_up", "down", "cast")]
    assert not any(rx.search(n) for n in ports)
    torch_gemms = ["void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<...> >(...)",
                   "_ZN7cutlass13device_kernelIN49_GLOBAL__N__scaled_grouped_mm", "nvjet_sm90_tst_128x128_64x4_1x2_h_bz_TNT",
                   "nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT"]
    assert not any(rx.search(n) for n in torch_gemms)
    assert not any(re.search(moe_refs.MSLK_MOE_KERNELS, n) for n in torch_gemms)
    assert not any(re.search(rw_port.EXPECT_KERNELS, n) for n in plausible)
    assert not any(re.search(moe_port.EXPECT_KERNELS, n) for n in plausible)
    # the MoE slot also accepts the torch routing kernels around MSLK's GEMMs
    assert re.search(moe_refs.MSLK_MOE_KERNELS, "void at::native::(anonymous namespace)::indexSelectLargeIndex<float>")
    # torch.bincount's histogram kernel (M_sizes) ran inside the MSLK MoE slot on the H200
    assert re.search(moe_refs.MSLK_MOE_KERNELS, "void at::cuda::kernelHistogram1D<long, long, long, 1, 2, -1, "
                                                "(at::cuda::CUDAHistogramMemoryType)0, at::cuda::(anonymous namespace)::"
                                                "kernelHistogram1D_getBin<long, long, 1>>(at::cuda::detail::TensorInfo<long, long>)")
