"""MSLK's production ops on a GPU (skipped without a CUDA/ROCm device or without the real mslk).

What the CPU tests cannot show: that the operands the builders shape mean to the real kernels what
the fp32 oracle says (parity), that a group size the builders serve (128) is right on the device
(group 32 is refused by the builders: MSLK runs it with wrong scales), and which device kernel
names its slots launch (routing kernels such as at::cuda::kernelHistogram1D included).
Run on the H200: `python3 -m pytest -q tests/test_mslk_gpu.py` with the mslk-cuda wheel installed.
"""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
mslk = pytest.importorskip("mslk")
if not hasattr(torch.ops.mslk, "f8f8bf16_rowwise_batched") or hasattr(mslk, "CALLS"):
    pytest.skip("the real mslk is needed (not the CPU test double)", allow_module_level=True)

from skillrun.execute import parity  # noqa: E402
from skillrun_kernels import _mslk  # noqa: E402
from skillrun_kernels.fp8_blockscale_gemm import problem as bs_problem  # noqa: E402
from skillrun_kernels.fp8_blockscale_gemm import references as bs_refs  # noqa: E402
from skillrun_kernels.fp8_rowwise_batched_gemm import problem as rw_problem  # noqa: E402
from skillrun_kernels.fp8_rowwise_batched_gemm import references as rw_refs  # noqa: E402
from skillrun_kernels.moe_a16wi4 import problem as moe_problem  # noqa: E402
from skillrun_kernels.moe_a16wi4 import references as moe_refs  # noqa: E402
from skillrun_kernels.protocol import UnsupportedShape  # noqa: E402

pytestmark = pytest.mark.gpu
TOL = {"rtol": 1e-2, "atol": 1e-2, "min_cosine": 0.999}


def _run(problem, builder, shape, seed=1):
    launch = builder(dict(shape), {}, "cuda")
    inputs = problem.make_inputs(shape, seed, "cuda")
    out = problem.output_like(shape, "cuda")
    parity.poison(out)
    prepared = launch.prepare(inputs)
    res = launch.run(prepared, out)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        launch.run(prepared, out)
        torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    return launch, parity.compare(res, problem.oracle(inputs).float(), TOL), names


def _kernels_match(launch, names):
    kernels = [n for n in names if not re.search(r"(?i)memset|memcpy|fill", n)]
    assert kernels, names
    unexpected = [n for n in kernels if not re.search(launch.expect_kernels, n)]
    assert not unexpected, f"slot regex misses the recorded names {unexpected}"


def test_rowwise_batched_matches_the_oracle_at_shallow_k_and_its_kernels_match_the_slot_regex():
    launch, m, names = _run(rw_problem, rw_refs.build_mslk_rowwise_batched, {"batch": 4, "M": 128, "N": 1280, "K": 1024})
    assert m["passed"], m
    _kernels_match(launch, names)


def test_rowwise_batched_padded_serves_the_decode_shape():
    launch, m, names = _run(rw_problem, rw_refs.build_mslk_rowwise_batched_pad16, {"batch": 4, "M": 1, "N": 1280, "K": 1024})
    assert m["passed"], m
    _kernels_match(launch, names)


def test_groupwise_with_mslk_scale_layout_matches_the_oracle():
    launch, m, names = _run(bs_problem, bs_refs.build_mslk_groupwise, {"M": 512, "N": 1024, "K": 2048})
    assert m["passed"], m
    _kernels_match(launch, names)


MOE = {"tokens": 64, "model_dim": 1024, "inter_dim": 512, "experts": 8, "topk": 2}


@pytest.mark.parametrize("builder", [moe_refs.build_mslk_bf16i4_shuffled_grouped, moe_refs.build_mslk_bf16i4_rowwise_batched])
def test_int4_ops_are_refused_by_us_at_group_32_and_match_the_oracle_at_group_128(builder):
    # MSLK itself does not refuse group 32 (it runs with wrong scales): the builder must, before any run.
    with pytest.raises(UnsupportedShape, match="group 32 is neither .* not run"):
        builder({**MOE, "group_size": 32}, {}, "cuda")
    launch, m, names = _run(moe_problem, builder, {**MOE, "group_size": 128})
    assert m["passed"], m
    _kernels_match(launch, names)


def test_grouped_stacked_ceiling_matches_the_oracle():
    launch, m, names = _run(moe_problem, moe_refs.build_mslk_bf16_grouped_stacked, {**MOE, "group_size": 32})
    assert m["passed"], m
    _kernels_match(launch, names)


def test_version_is_recorded():
    assert _mslk.version() and "mslk" in _mslk.version()
