"""fp8 block-scale GEMM: the problem definition, the cuBLAS scale layouts, and the sm_90 Triton port.

The port runs on the CPU through Triton's interpreter. TRITON_INTERPRET must be set before triton
is imported, so those cases run in one child process (this process and other tests keep the
compiled Triton); the child prints one JSON line per case. Fresh random seeds every run; the seed
of a failing case is in its message.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from skillrun_kernels.fp8_blockscale_gemm import problem
from skillrun_kernels.fp8_blockscale_gemm.references import build_oracle, cublas_scale_layouts


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little") % 1_000_000


# ---------------------------------------------------------------------------------------------
# problem.py


def _oracle_f64(x: dict) -> torch.Tensor:
    """Independent reference: gather each element's scale by index arithmetic, sum in float64."""
    a, b = x["a"].double(), x["b"].double()
    M, K = a.shape
    N = b.shape[0]
    kblk = torch.arange(K) // 128
    nblk = torch.arange(N) // 128
    a_deq = a * x["a_scale"].double()[:, kblk]
    b_deq = b * x["b_scale"].double()[nblk][:, kblk]
    return torch.einsum("mk,nk->mn", a_deq, b_deq)


@pytest.mark.parametrize("shape", [(33, 192, 384), (1, 128, 256), (70, 300, 512)])
def test_oracle_equals_independent_float64_dequant(shape):
    M, N, K = shape
    seed = _seed()
    x = problem.make_inputs({"M": M, "N": N, "K": K}, seed)
    ref = problem.oracle(x)
    assert ref.dtype == torch.float32 and ref.shape == (M, N)
    exact = _oracle_f64(x)
    err = float((ref.double() - exact).norm() / exact.norm())
    assert err < 1e-5, f"seed {seed}: oracle vs float64 rel err {err}"


def test_inputs_are_quantized_per_block_with_realistic_scales():
    M, N, K = 40, 200, 512
    seed = _seed()
    x = problem.make_inputs({"M": M, "N": N, "K": K}, seed)
    assert x["a"].dtype == torch.float8_e4m3fn and x["b"].dtype == torch.float8_e4m3fn
    assert x["a"].shape == (M, K) and x["b"].shape == (N, K)
    assert x["a_scale"].shape == (M, K // 128) and x["b_scale"].shape == (math.ceil(N / 128), K // 128)
    assert x["a_scale"].dtype == torch.float32 and x["b_scale"].dtype == torch.float32
    # amax scaling: every 1x128 block of A and every 128x128 block of B reaches the fp8 max exactly.
    a_blocks = x["a"].float().abs().reshape(M, K // 128, 128).amax(dim=2)
    assert torch.all(a_blocks == problem.FP8_MAX), f"seed {seed}"
    b_pad = torch.zeros(256, K)
    b_pad[:N] = x["b"].float().abs()
    b_blocks = b_pad.reshape(2, 128, K // 128, 128).amax(dim=(1, 3))
    assert torch.all(b_blocks == problem.FP8_MAX), f"seed {seed}"
    # Scales differ block to block and are not powers of two (so e8m0-style shortcuts would show).
    for s in (x["a_scale"], x["b_scale"]):
        assert s.min() > 0 and s.max() / s.min() > 4
        mant, _ = torch.frexp(s)
        assert (mant != 0.5).float().mean() > 0.9


def test_seeds_give_fresh_data_and_repeat():
    sd = {"M": 8, "N": 128, "K": 256}
    x1, x2, x3 = problem.make_inputs(sd, 1), problem.make_inputs(sd, 1), problem.make_inputs(sd, 2)
    assert torch.equal(x1["a"].float(), x2["a"].float()) and torch.equal(x1["b_scale"], x2["b_scale"])
    assert not torch.equal(x1["a"].float(), x3["a"].float())


def test_quantization_round_trip_is_close():
    w = torch.randn(256, 384)
    q, s = problem.quantize_128x128(w)
    back = problem.dequant_b(q, s)
    assert float((back - w).norm() / w.norm()) < 0.05  # e4m3 has a 3-bit mantissa
    x = torch.randn(5, 256) * 3
    q, s = problem.quantize_1x128(x)
    assert float((problem.dequant_a(q, s) - x).norm() / x.norm()) < 0.05


def test_expand_helpers_index_by_block():
    sa = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    e = problem.expand_a_scale(sa, 384)
    assert e.shape == (2, 384) and e[1, 129].item() == sa[1, 1].item() and e[0, 383].item() == sa[0, 2].item()
    sb = torch.arange(6, dtype=torch.float32).reshape(2, 3)  # N = 200: the second row-block is partial
    e = problem.expand_b_scale(sb, 200, 384)
    assert e.shape == (200, 384) and e[199, 0].item() == sb[1, 0].item() and e[127, 256].item() == sb[0, 2].item()


def test_shape_checks_name_the_dimension():
    with pytest.raises(ValueError, match="K=100"):
        problem.check_shape({"M": 1, "N": 128, "K": 100})
    with pytest.raises(ValueError, match="M=0"):
        problem.check_shape({"M": 0, "N": 128, "K": 128})
    with pytest.raises(ValueError, match="missing 'N'"):
        problem.check_shape({"M": 1, "K": 128})


def test_flops_and_min_bytes():
    sd = {"M": 4, "N": 256, "K": 384}
    assert problem.flops(sd) == 2 * 4 * 256 * 384
    assert problem.min_bytes(sd) == 4 * 384 + 256 * 384 + 4 * (4 * 3 + 2 * 3) + 2 * 4 * 256
    assert problem.output_like(sd).dtype == torch.bfloat16


def test_oracle_kernel_slot_writes_bf16_out():
    sd = {"M": 3, "N": 128, "K": 256}
    x = problem.make_inputs(sd, _seed())
    kl = build_oracle(sd)
    out = problem.output_like(sd).fill_(float("nan"))
    ref = kl.run(kl.prepare(x), out)
    assert ref.dtype == torch.float32 and torch.isfinite(out.float()).all()
    assert torch.equal(out, ref.to(torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# cuBLAS scale layouts (the padded-vs-unpadded difference behind the silent K = 768 error)


@pytest.mark.parametrize("K,L,L4", [(768, 6, 8), (1024, 8, 8), (1536, 12, 12), (640, 5, 8)])
def test_cublas_scale_layouts(K, L, L4):
    M, N = 33, 384
    x = problem.make_inputs({"M": M, "N": N, "K": K}, _seed())
    sa, sb = cublas_scale_layouts(x["a_scale"], x["b_scale"], pad_k_blocks=False)
    assert sa.shape == (M, L) and sa.stride() == (1, M) and torch.equal(sa, x["a_scale"])
    assert sb.shape == (L, 3) and sb.stride() == (1, L) and torch.equal(sb, x["b_scale"].t())
    sa_p, sb_p = cublas_scale_layouts(x["a_scale"], x["b_scale"], pad_k_blocks=True)
    assert sa_p.shape == (M, L) and sa_p.stride() == (1, M)
    assert sb_p.shape == (L4, 3) and sb_p.stride() == (1, L4)
    assert torch.equal(sb_p[:L], x["b_scale"].t()) and torch.all(sb_p[L:] == 0)
    if L == L4:  # a multiple of 4 already: the two layouts hold the same values
        assert torch.equal(sb_p, sb)


def test_cublas_scale_layouts_reject_mismatched_blocks():
    with pytest.raises(ValueError, match="a_scale"):
        cublas_scale_layouts(torch.ones(4, 3), torch.ones(2, 4), pad_k_blocks=True)


# ---------------------------------------------------------------------------------------------
# The Triton port through the interpreter (one child process for all cases)

_CASES = [
    # (M, N, K, config): ragged M and N, odd and even K-block counts, every structural variant.
    (1, 128, 256, {"BM": 16, "BN": 64, "num_warps": 4, "stages": 4, "persistent": False, "split_k": 2, "group_m": 1}),
    (1, 192, 384, {"BM": 16, "BN": 64, "num_warps": 4, "stages": 4, "persistent": False, "split_k": 1}),
    (33, 256, 384, {"BM": 64, "BN": 128, "num_warps": 4, "stages": 2, "persistent": False, "pair": True}),
    (33, 256, 256, {"BM": 128, "BN": 128, "num_warps": 8, "stages": 2, "persistent": True, "pair": True, "group_m": 1}),
    (64, 256, 384, {"BM": 64, "BN": 256, "NSUB": 2, "num_warps": 8, "stages": 3, "persistent": True}),
    (64, 128, 384, {"BM": 64, "BN": 64, "num_warps": 4, "stages": 4, "persistent": False, "split_k": 3, "group_m": 1}),
    (64, 256, 256, {"BM": 64, "BN": 128, "num_warps": 4, "stages": 3, "persistent": False, "tma": False}),
    (130, 256, 384, {"BM": 64, "BN": 128, "num_warps": 4, "stages": 4, "persistent": True, "ctas_per_sm": 2, "group_m": 2}),
    (33, 256, 384, {"BM": 128, "BN": 128, "num_warps": 8, "stages": 4, "persistent": True, "flatten": True}),
    (16, 2112 // 8, 256, None),  # the shape default (decode recipe), N = 264 (not a multiple of 128)
]

_CHILD = textwrap.dedent(
    """
    import json, os, sys
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    from skillrun_kernels.fp8_blockscale_gemm import problem, triton_sm90
    cases = json.loads(sys.argv[1])
    for i, (M, N, K, cfg, seed) in enumerate(cases):
        sd = {"M": M, "N": N, "K": K}
        x = problem.make_inputs(sd, seed)
        kl = triton_sm90.build(sd, cfg, "cpu")
        prep = kl.prepare(x)
        out = problem.output_like(sd).fill_(float("nan"))
        kl.run(prep, out)
        first = out.clone()
        out.fill_(float("nan"))
        kl.run(prep, out)
        ref = problem.oracle(x)
        torch.save({"out": out, "ref": ref, "deterministic": torch.equal(first, out)}, sys.argv[2] + f"/case{i}.pt")
        print(json.dumps({"i": i, "config": kl.describe["config"]}), flush=True)
    """
)


def _bf16_elementwise_ok(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    # Within one bf16 ulp of the fp32 result (GPU rounds to nearest; the interpreter truncates),
    # plus a tiny absolute term for fp32 summation-order noise on values near zero.
    return (out.float() - ref).abs() <= ref.abs() * 2.0**-7 + 1e-5 * ref.abs().max()


@pytest.fixture(scope="module")
def interpreter_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fp8bs")
    cases = [[M, N, K, cfg, _seed()] for (M, N, K, cfg) in _CASES]
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cases), str(tmp)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"interpreter child failed:\n{proc.stderr[-3000:]}"
    return cases, tmp


@pytest.mark.parametrize("idx", range(len(_CASES)))
def test_port_matches_oracle_in_interpreter(interpreter_results, idx):
    cases, tmp = interpreter_results
    M, N, K, cfg, seed = cases[idx]
    got = torch.load(tmp / f"case{idx}.pt")
    out, ref = got["out"], got["ref"]
    where = f"M={M} N={N} K={K} config={cfg} seed={seed}"
    assert torch.isfinite(out.float()).all(), f"unwritten (NaN) or non-finite outputs: {where}"
    assert problem.rel_error(out, ref) < 5e-3, where
    ok = _bf16_elementwise_ok(out, ref)
    assert ok.all(), f"{int((~ok).sum())} elements off by more than one bf16 ulp: {where}"
    assert got["deterministic"], f"two runs differ bitwise (split-K order must be fixed): {where}"


def test_elementwise_check_catches_one_wrong_block_scale(interpreter_results):
    """The per-element check above is not vacuous: one 128x128 B scale off by 1.5x fails it."""
    cases, tmp = interpreter_results
    M, N, K, cfg, seed = cases[4]
    got = torch.load(tmp / "case4.pt")
    x = problem.make_inputs({"M": M, "N": N, "K": K}, seed)
    x["b_scale"][1, 2] *= 1.5
    assert not _bf16_elementwise_ok(got["out"], problem.oracle(x)).all()


# ---------------------------------------------------------------------------------------------
# Compiled for sm_90 on this machine (no GPU): the structure the performance depends on.


def test_pair_variant_keeps_one_wgmma_group_in_flight():
    ts = pytest.importorskip("skillrun_kernels.fp8_blockscale_gemm.triton_sm90")
    plain = ts.compile_only(None, {"BM": 128, "BN": 128, "num_warps": 8, "stages": 4, "persistent": True})
    pair = ts.compile_only(None, {"BM": 128, "BN": 128, "num_warps": 8, "stages": 2, "persistent": True, "pair": True})
    # plain: one 4-instruction wgmma group per K block, waited on before its promote.
    assert plain["wgmma"] == 4 and plain["fma_while_wgmma_pending"] == 0
    # pair: the second K block's group is committed and, before any wait, the first block's
    # 64 promote FMAs per thread (128x128 fp32 over 256 threads) are issued: the overlap exists.
    assert pair["wgmma"] == 12 and pair["fma_while_wgmma_pending"] >= 64
    # ... which ptxas then serialises (the reason no recipe uses it; see the kernel's comment).
    # The plain loop must stay free of that verdict: it is what the recipes ship.
    assert plain["ptxas_wgmma_serialized"] == []
    assert pair["ptxas_wgmma_serialized"] != []
    for facts in (plain, pair):
        assert facts["shared_bytes"] <= 232448  # the sm_90 per-block limit
        if "local" in facts:
            assert facts["sass_local_ld_st"] == 0, f"spills: {facts}"


# ---------------------------------------------------------------------------------------------
# On a CUDA device (skipped here): the port and the references on reduced bench shapes.


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(1, 2112, 768), (64, 7168, 1024), (300, 2048, 768), (512, 1024, 1536)])
def test_port_on_gpu_matches_oracle(M, N, K):
    from skillrun_kernels.fp8_blockscale_gemm import triton_sm90

    from gluon_gpu import run_twice  # the run-twice-on-one-prepare helper the Gluon GPU tests use

    sd = {"M": M, "N": N, "K": K}
    seed = _seed()
    first, out, ref = run_twice(triton_sm90, sd, None, seed)
    assert problem.rel_error(out, ref) < 3e-3, f"seed {seed}"
    assert torch.equal(first, out), f"seed {seed}: not deterministic"


@pytest.mark.gpu
def test_padded_cublas_is_correct_where_supported():
    from skillrun_kernels.fp8_blockscale_gemm.references import build_cublas_blockwise_padded
    from skillrun_kernels.protocol import UnsupportedShape

    sd = {"M": 256, "N": 1024, "K": 768}
    x = problem.make_inputs(sd, _seed(), "cuda")
    kl = build_cublas_blockwise_padded(sd)
    try:
        prep = kl.prepare(x)
    except UnsupportedShape as exc:
        pytest.skip(str(exc))
    got = kl.run(prep, problem.output_like(sd, "cuda"))
    assert problem.rel_error(got, problem.oracle(x)) < 3e-3, kl.describe
