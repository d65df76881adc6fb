"""CPU checks of the batched fp8 rowwise GEMM port: Triton interpreter vs the fp32 oracle.

The interpreter cases run in a subprocess because TRITON_INTERPRET must be set before triton is
imported, and the rest of the test session must keep the normal (compiling) triton.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from skillrun_kernels.fp8_rowwise_batched_gemm import problem, references, triton_sm90
from skillrun_kernels.protocol import UnsupportedShape

TESTS = Path(__file__).resolve().parent

_CASES = r"""
import json, os, sys
assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, sys.argv[1])
import interp_fixups  # noqa: F401  (bf16 fixes for the interpreter)
import torch
from skillrun_kernels.fp8_rowwise_batched_gemm import problem, triton_sm90 as port

cases = [
    # (shape, config, layout): M=1 decode row, ragged M and N, a K tail (EVEN_K False), grouped raster.
    ({"batch": 2, "M": 1, "N": 32, "K": 64}, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1), "nk"),
    ({"batch": 3, "M": 20, "N": 48, "K": 96}, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, GROUP_M=2), "nk"),
    ({"batch": 3, "M": 20, "N": 48, "K": 96}, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, GROUP_M=2), "kn"),
    ({"batch": 2, "M": 40, "N": 64, "K": 128}, dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=64, GROUP_M=4), "nk"),
    # precise accumulation on: promotion interval below BLOCK_K (split inside the dot) and above it
    # (served at BLOCK_K), with a K tail; indexing must be unchanged (the interpreter accumulates in fp32)
    ({"batch": 2, "M": 20, "N": 48, "K": 160}, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, GROUP_M=2, precise_acc=32), "nk"),
    ({"batch": 2, "M": 20, "N": 48, "K": 160}, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, GROUP_M=2, precise_acc=4096), "nk"),
]
for ci, (shape, cfg, layout) in enumerate(cases):
    for seed in (0, 1, 2):
        inp = problem.make_inputs(shape, seed, "cpu")
        ref = problem.oracle(inp)
        out = torch.full((shape["batch"], shape["M"], shape["N"]), float("nan"), dtype=torch.bfloat16)
        w = port.prepare_weights(inp["wq"], layout)
        res = port.fp8_rowwise_batched_gemm(inp["xq"], w, inp["x_scale"], inp["w_scale"], out=out, config=cfg)
        err = float((out.float() - ref).norm() / ref.norm())
        print(json.dumps({"case": ci, "seed": seed, "layout": layout, "rel_err": err,
                          "all_written": bool(torch.isfinite(out).all()), "same_tensor": res is out}))
"""


@pytest.fixture(scope="module")
def interp_results() -> list[dict]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _CASES, str(TESTS)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 18, proc.stdout
    return rows


def test_interpreter_port_matches_oracle(interp_results):
    for r in interp_results:
        assert r["all_written"], f"unwritten (NaN) output elements: {r}"
        assert r["same_tensor"], "the port must write into the caller's out tensor"
        # fp8 products are exact; the only rounding is the bf16 output (rel. error ~2e-3).
        assert r["rel_err"] < 1e-2, r


def test_weight_layouts_agree(interp_results):
    nk = {r["seed"]: r["rel_err"] for r in interp_results if r["case"] == 1}
    kn = {r["seed"]: r["rel_err"] for r in interp_results if r["case"] == 2}
    assert nk == pytest.approx(kn, abs=1e-6)


def _tiny_inputs():
    return problem.make_inputs({"batch": 2, "M": 3, "N": 16, "K": 32}, 0, "cpu")


def test_bias_raises_not_implemented():
    inp = _tiny_inputs()
    with pytest.raises(NotImplementedError, match="bias"):
        triton_sm90.fp8_rowwise_batched_gemm(
            inp["xq"], inp["wq"], inp["x_scale"], inp["w_scale"], bias=torch.zeros(2, 16)
        )


def test_bad_operands_are_rejected_with_clear_errors():
    inp = _tiny_inputs()
    with pytest.raises(ValueError, match="layout"):
        triton_sm90.prepare_weights(inp["wq"], "shuffled")
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        triton_sm90.prepare_weights(inp["wq"].float())
    with pytest.raises(ValueError, match="x_scale"):
        triton_sm90.fp8_rowwise_batched_gemm(inp["xq"], inp["wq"], inp["x_scale"][:, :2], inp["w_scale"])


def test_prepare_weights_kn_layout_keeps_logical_shape():
    inp = _tiny_inputs()
    pw = triton_sm90.prepare_weights(inp["wq"], "kn")
    assert tuple(pw.data.shape) == (2, 32, 16) and pw.n == 16 and pw.k == 32
    b, n, k = pw.strides()
    # element (b, n, k) of the logical weight lives at b*sb + n*sn + k*sk
    flat = pw.data.view(torch.uint8).reshape(-1)
    assert flat[1 * b + 5 * n + 7 * k] == inp["wq"].view(torch.uint8)[1, 5, 7]


def test_rowwise_quantization_reconstructs_data():
    x = torch.randn(4, 7, 64) * torch.rand(4, 7, 1) * 10
    q, s = problem.quantize_rowwise(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (4, 7)
    back = q.float() * s.unsqueeze(-1)
    assert float((back - x).norm() / x.norm()) < 0.05  # e4m3 has 3 mantissa bits
    assert float(q.float().abs().amax()) == pytest.approx(448.0)


def test_oracle_matches_float64_dequant():
    inp = _tiny_inputs()
    ref = (inp["xq"].double() * inp["x_scale"].double().unsqueeze(-1)) @ (
        inp["wq"].double() * inp["w_scale"].double().unsqueeze(-1)
    ).transpose(1, 2)
    assert torch.allclose(problem.oracle(inp).double(), ref, rtol=1e-5, atol=1e-6)


def test_metrics_count_what_the_problem_moves():
    shape = {"batch": 16, "M": 1, "N": 1280, "K": 8192}
    assert problem.flops(shape) == 2 * 16 * 1280 * 8192
    assert problem.min_bytes(shape) > 16 * 1280 * 8192  # the fp8 weights dominate at M=1


def test_pad_rows_appends_zero_rows_with_unit_scale():
    inp = _tiny_inputs()  # M = 3
    xp, sp = references.pad_rows(inp["xq"], inp["x_scale"], 16)
    assert xp.shape == (2, 16, 32) and xp.dtype == torch.float8_e4m3fn and sp.shape == (2, 16)
    assert torch.equal(xp[:, :3].view(torch.uint8), inp["xq"].view(torch.uint8))
    assert int(xp[:, 3:].view(torch.uint8).abs().sum()) == 0 and bool((sp[:, 3:] == 1).all())
    same, _ = references.pad_rows(inp["xq"], inp["x_scale"], 1)
    assert same is inp["xq"]


def test_cuda_references_refuse_cpu():
    shape = {"batch": 2, "M": 4, "N": 16, "K": 32}
    with pytest.raises(UnsupportedShape):
        references.build_scaled_mm_loop(shape, {}, "cpu")
    with pytest.raises(UnsupportedShape):
        references.build_scaled_grouped_mm(shape, {}, "cpu")


def test_precise_accumulation_default_and_bounds():
    # deep K promotes by default, shallow K keeps the hardware accumulation
    assert triton_sm90.pick_config(16, 4096, 777, 8192)[0]["precise_acc"] == triton_sm90.PRECISE_ACC_DEFAULT
    assert triton_sm90.pick_config(16, 4096, 777, 1024)[0]["precise_acc"] is None
    launch = triton_sm90.build({"batch": 1, "M": 64, "N": 64, "K": 4096}, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128}, "cpu")
    assert launch.describe["config"]["precise_acc"] == triton_sm90.PRECISE_ACC_DEFAULT
    # Triton needs the bound <= BLOCK_K; larger requests are served at BLOCK_K, 0/None mean off
    assert triton_sm90._precise_acc_constexpr(4096, 128) == 128
    assert triton_sm90._precise_acc_constexpr(64, 128) == 64
    assert triton_sm90._precise_acc_constexpr(None, 128) == 0
    with pytest.raises(ValueError, match="precise_acc"):
        triton_sm90.build({"batch": 1, "M": 64, "N": 64, "K": 4096},
                          {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "precise_acc": -1}, "cpu")


def test_config_table_prefers_measured_entries(monkeypatch):
    cfg, tuned = triton_sm90.pick_config(16, 1, 12345, 678)
    assert not tuned and cfg["BLOCK_M"] >= 16
    monkeypatch.setitem(triton_sm90.TUNED, (12345, 678), [(64, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128})])
    cfg, tuned = triton_sm90.pick_config(16, 8, 12345, 678)
    assert tuned and cfg["BLOCK_N"] == 32
    assert not triton_sm90.pick_config(16, 4096, 12345, 678)[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_port_matches_oracle():
    shape = {"batch": 4, "M": 33, "N": 256, "K": 512}
    inp = problem.make_inputs(shape, 3, "cuda")
    launch = triton_sm90.build(shape, {}, "cuda")
    out = torch.full((4, 33, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.run(launch.prepare(inp), out)
    ref = problem.oracle(inp)
    assert torch.isfinite(out).all()
    assert float((out.float() - ref).norm() / ref.norm()) < 2e-2


def test_card_recipes_equal_the_ports_measured_config_table():
    import yaml

    text = (TESTS.parent / "skills" / "triton_fp8_rowwise_batched_gemm_sm90" / "SKILL.md").read_text()
    card = yaml.safe_load(text.split("---")[1])
    recipes = {r["name"]: r for r in card["recipes"]}
    cases = list(card["tests"]["selects"])
    # bucket edges too: the card's M classes and the port's table must agree everywhere
    cases += [{"shape": {"batch": 16, "M": m, "N": 1280, "K": 8192}, "recipe": r} for m, r in
              ((16, "decode_weight_stream"), (17, "small_m_wgmma"), (64, "small_m_wgmma"), (65, "mid_m"),
               (256, "mid_m"), (257, "large_m_512"), (768, "large_m_512"), (769, "large_m_1024"),
               (1024, "large_m_1024"), (1025, "large_m_4096"), (4096, "large_m_4096"))]
    cases += [{"shape": {"batch": 16, "M": m, "N": 8192, "K": 1024}, "recipe": r} for m, r in
              ((1, "wide_n_decode_weight_stream"), (16, "wide_n_decode_weight_stream"), (17, "wide_n_small_m_wgmma"),
               (64, "wide_n_small_m_wgmma"), (65, "wide_n_mid_m"), (256, "wide_n_mid_m"), (257, "wide_n_large_m"),
               (1024, "wide_n_large_m"), (1025, "wide_n_prefill_keep_baseline"), (4096, "wide_n_prefill_keep_baseline"))]
    for case in cases:
        s = case["shape"]
        cfg, tuned = triton_sm90.pick_config(s["batch"], s["M"], s["N"], s["K"])
        if case.get("untuned"):
            assert not tuned, case
        else:
            want = {k: v for k, v in recipes[case["recipe"]]["config"].items() if k != "w_layout"}
            assert tuned and cfg == want, case
