"""CPU checks of the fp8 block-scale MoE family: the problem's oracle against an independent float64
computation, the references' refusals off-GPU, and the sm_90 Triton port (both stages and the layer)
in the Triton interpreter against the oracle.

Interpreter cases run in one subprocess (TRITON_INTERPRET must be set before triton is imported).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from skillrun_kernels.fp8_blockscale_moe import problem, references, triton_sm90
from skillrun_kernels.protocol import ReferenceUnavailable, UnsupportedShape

TESTS = Path(__file__).resolve().parent
SMALL = {"tokens": 7, "model_dim": 256, "inter_dim": 256, "experts": 6, "topk": 3}


def _oracle_f64(inp: dict) -> torch.Tensor:
    """The layer written out independently: per (token, slot) pair, float64, block scales by index."""
    a = inp["a"].double() * inp["a_scale"].double()[:, torch.arange(inp["a"].shape[1]) // 128]
    ids, wts = inp["topk_ids"], inp["topk_weights"].double()
    inter = inp["w2"].shape[-1]
    rows = []
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            w1, s1 = inp["w1"][e].double(), inp["w1_scale"][e].double()
            w1 = w1 * s1[torch.arange(w1.shape[0]) // 128][:, torch.arange(w1.shape[1]) // 128]
            gu = w1 @ a[t]
            rows.append(torch.nn.functional.silu(gu[:inter]) * gu[inter:])
    h = torch.stack(rows).float()
    hq, hs = problem.quantize_rows_1x128(h)  # the recipe's own stage-2 input quantization
    hd = hq.double() * hs.double()[:, torch.arange(inter) // 128]
    out = torch.zeros(ids.shape[0], inp["w2"].shape[1], dtype=torch.float64)
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            w2, s2 = inp["w2"][e].double(), inp["w2_scale"][e].double()
            w2 = w2 * s2[torch.arange(w2.shape[0]) // 128][:, torch.arange(w2.shape[1]) // 128]
            out[t] += wts[t, j] * (w2 @ hd[t * ids.shape[1] + j])
    return out


@pytest.mark.parametrize("seed", [0, 3])
def test_oracle_equals_independent_float64_layer(seed):
    inp = problem.make_inputs(SMALL, seed)
    ref = problem.oracle(inp)
    assert ref.dtype == torch.float32 and ref.shape == (7, 256)
    exact = _oracle_f64(inp)
    assert float((ref.double() - exact).norm() / exact.norm()) < 1e-5


def test_inputs_follow_the_recipe_layouts_and_routing():
    inp = problem.make_inputs(SMALL, 1)
    assert inp["a"].dtype == inp["w1"].dtype == inp["w2"].dtype == torch.float8_e4m3fn
    assert inp["a_scale"].shape == (7, 2) and inp["w1_scale"].shape == (6, 4, 2) and inp["w2_scale"].shape == (6, 2, 2)
    # per-block scales really differ (a kernel reading the wrong block cannot pass by luck)
    assert len(set(inp["w1_scale"].flatten().tolist())) > 20
    ids, w = inp["topk_ids"], inp["topk_weights"]
    assert ids.dtype == torch.int32 and torch.allclose(w.sum(-1), torch.ones(7))
    assert all(len(set(r)) == 3 for r in ids.tolist())
    out = problem.oracle(inp)
    assert 0.2 < float(out.std()) < 3.0  # O(1) outputs: the card's atol is meaningful


def test_shape_errors_name_the_problem():
    with pytest.raises(ValueError, match="multiples of 128"):
        problem.dims({**SMALL, "inter_dim": 200})
    with pytest.raises(ValueError, match="missing"):
        problem.dims({"tokens": 1})
    with pytest.raises(ValueError, match="topk > experts"):
        problem.dims({**SMALL, "topk": 9})


def test_deepseek_v3_shapes_and_counts():
    s = {"tokens": 1, "model_dim": 7168, "inter_dim": 2048, "experts": 256, "topk": 8}
    assert problem.flops(s) == 2.0 * 8 * (7168 * 4096 + 2048 * 7168)
    assert problem.expected_active_experts(s) == pytest.approx(8.0)
    # 44 MB of fp8 weights per active expert, plus 1/4096 of it in fp32 scales
    assert problem.expert_bytes(s) == pytest.approx(3 * 2048 * 7168 * (1 + 4 / 16384))


def test_oracle_reference_launch_writes_bf16():
    inp = problem.make_inputs(SMALL, 2)
    launch = references.build_oracle(SMALL, {}, "cpu")
    out = torch.full((7, 256), float("nan"), dtype=torch.bfloat16)
    launch.run(launch.prepare(inp), out)
    assert torch.isfinite(out).all()
    assert float((out.float() - problem.oracle(inp)).norm() / problem.oracle(inp).norm()) < 4e-3


def test_production_references_say_why_they_cannot_run_here():
    with pytest.raises(UnsupportedShape, match="CUDA"):
        references.build_cublas_per_expert(SMALL, {}, "cpu")
    for builder in (references.build_deepgemm_contiguous, references.build_deepgemm_masked,
                    references.build_vllm_fused_moe, references.build_sglang_fused_moe):
        try:
            builder(SMALL, {}, "cpu")
        except ReferenceUnavailable as exc:
            assert "not importable" in str(exc) or "has none of" in str(exc)
        else:  # pragma: no cover - only where the package is installed (a CUDA machine)
            assert torch.cuda.is_available()


def test_config_checks_name_the_problem():
    base = dict(triton_sm90.DEFAULT_DECODE)
    triton_sm90.check_config(base, 7168, 2048)
    with pytest.raises(ValueError, match="BLOCK_N1=64 must be a multiple of 128"):
        triton_sm90.check_config({**base, "BLOCK_N1": 64}, 7168, 2048)
    with pytest.raises(ValueError, match="BLOCK_N2=96"):
        triton_sm90.check_config({**base, "BLOCK_N2": 96}, 7168, 2048)
    with pytest.raises(ValueError, match="BLOCK_M=8"):
        triton_sm90.check_config({**base, "BLOCK_M": 8}, 7168, 2048)


def test_operand_checks_name_the_operand():
    inp = problem.make_inputs(SMALL, 0)
    args = [inp[k] for k in ("a", "a_scale", "w1", "w1_scale", "w2", "w2_scale", "topk_ids", "topk_weights")]
    bad = list(args)
    bad[3] = inp["w1_scale"][:, :1]
    with pytest.raises(ValueError, match="w1_scale has shape"):
        triton_sm90.check_operands(*bad)
    bad = list(args)
    bad[0] = inp["a"].float()
    with pytest.raises(TypeError, match="a must be"):
        triton_sm90.check_operands(*bad)


def test_regime_defaults_by_rows_per_expert():
    assert triton_sm90.pick_config(1, 8, 256)["BLOCK_M"] == 16
    assert triton_sm90.pick_config(1024, 8, 256)["BLOCK_M"] == 32
    assert triton_sm90.pick_config(4096, 8, 32)["BLOCK_M"] == 64


_CASES = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import interp_fixups  # noqa: F401
import torch
from skillrun_kernels.fp8_blockscale_moe import problem, triton_sm90 as port
from skillrun_kernels.moe_a16wi4.triton_sm90 import align_by_expert

def cfg(bm, n1, n2):
    return dict(BLOCK_M=bm, BLOCK_N1=n1, warps1=4, stages1=2, BLOCK_N2=n2, warps2=4, stages2=2)

cases = [
    # stage-1 tile = one 128-column scale group; stage-2 tile narrower than a weight scale block
    ({"tokens": 5, "model_dim": 256, "inter_dim": 256, "experts": 6, "topk": 3}, cfg(16, 128, 64)),
    # stage-1 tile spanning two N scale blocks (h quantized per 128 columns inside one tile); wide stage 2
    ({"tokens": 19, "model_dim": 512, "inter_dim": 256, "experts": 4, "topk": 2}, cfg(16, 256, 256)),
    # decode: one token, top-4 of 16 experts, most blocks exit at once; BLOCK_M 32
    ({"tokens": 1, "model_dim": 128, "inter_dim": 128, "experts": 16, "topk": 4}, cfg(32, 128, 128)),
]
for ci, (shape, c) in enumerate(cases):
    for seed in (0, 1):
        inp = problem.make_inputs(shape, seed, "cpu")
        t, d, i, e, k = (shape[x] for x in problem.SHAPE_KEYS)
        routing = align_by_expert(inp["topk_ids"], e, c["BLOCK_M"])
        h, hs = port.stage1(inp["a"], inp["a_scale"], inp["w1"], inp["w1_scale"], routing, k, c)
        h_ref = problem.oracle_stage1(inp).reshape(t * k, i)
        q_ref, s_ref = problem.quantize_rows_1x128(h_ref)
        code_diff = float((h.float() != q_ref.float()).float().mean())
        scale_err = float(((hs - s_ref).abs() / s_ref).max())
        # stage 2 alone, fed the oracle's own quantized intermediate
        acc = torch.zeros(t, d)
        port.stage2(q_ref, s_ref, inp["w2"], inp["w2_scale"], routing, inp["topk_weights"], acc, c)
        ref2 = problem.oracle_stage2(inp, q_ref, s_ref)
        s2_err = float((acc - ref2).norm() / ref2.norm())
        out = torch.full((t, d), float("nan"), dtype=torch.bfloat16)
        res = port.moe_fp8_blockscale(inp["a"], inp["a_scale"], inp["w1"], inp["w1_scale"], inp["w2"], inp["w2_scale"],
                                      inp["topk_ids"], inp["topk_weights"], out=out, config=c)
        ref = problem.oracle(inp)
        err = float((out.float() - ref).norm() / ref.norm())
        # a kernel reading one wrong weight scale block must fail: perturb one block of an active expert
        bad = dict(inp)
        bad["w1_scale"] = inp["w1_scale"].clone()
        bad["w1_scale"][int(inp["topk_ids"][0, 0]), 0, 0] *= 4.0
        err_bad = float((out.float() - problem.oracle(bad)).norm() / problem.oracle(bad).norm())
        print(json.dumps({"case": ci, "seed": seed, "code_diff": code_diff, "scale_err": scale_err, "s2_err": s2_err,
                          "rel_err": err, "err_vs_perturbed": err_bad, "all_written": bool(torch.isfinite(out).all()),
                          "same_tensor": res is out}))
"""


@pytest.fixture(scope="module")
def interp_results() -> list[dict]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _CASES, str(TESTS)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 6, proc.stdout
    return rows


def test_stage1_quantized_intermediate_matches_the_recipe(interp_results):
    for r in interp_results:
        # same fp32 h up to summation order: the fp8 codes and 1x128 scales agree (a code may flip
        # at a rounding boundary, hence a small fraction rather than zero)
        assert r["code_diff"] < 0.01 and r["scale_err"] < 1e-4, r


def test_stage2_matches_oracle_on_the_same_intermediate(interp_results):
    for r in interp_results:
        assert r["s2_err"] < 1e-5, r


def test_full_layer_matches_oracle_and_writes_every_element(interp_results):
    for r in interp_results:
        assert r["all_written"] and r["same_tensor"], r
        assert r["rel_err"] < 1e-2, r


def test_a_wrong_weight_scale_is_visible(interp_results):
    # the check above could not pass with one 128x128 scale block read from the wrong place
    assert max(r["err_vs_perturbed"] for r in interp_results if r["case"] != 2) > 3e-2


# ---------------------------------------------------------------------------------------------
# e2e routing (route.py): the baseline layer's launch is the routed call


def test_route_reads_the_layer_and_refuses_what_is_not_one():
    from skillrun_kernels.fp8_blockscale_moe import route

    inp = problem.make_inputs(SMALL, 0)
    out = problem.output_like(SMALL)
    call = route.layer_call(inp, out)
    assert call.shape == SMALL and call.static == route._WEIGHTS and call.out is out
    assert "missing" in route.layer_call({k: v for k, v in inp.items() if k != "w2"}, out)
    assert "not torch.float8_e4m3fn" in route.layer_call(dict(inp, a=inp["a"].float()), out)
    bad = dict(inp, w2=inp["w2"][:, :, :200])
    assert "multiples of 128" in route.layer_call(bad, out)


def test_route_wraps_the_baseline_layer_and_reuses_prepared_weights(monkeypatch):
    from skillrun.profiling import routing as child

    # The baseline (cuBLAS block-wise) needs CUDA: a CPU stand-in with the same call signature is
    # wrapped instead (the oracle, which is not what the item routes to, so a routed call is visible).
    def cpu_baseline(shape, config, device):
        return references.build_oracle(shape, config, device)

    monkeypatch.setattr(references, "build_cublas_per_expert", cpu_baseline)
    items = [{"id": "i0", "card": "c", "recipe": "r", "route": "skillrun_kernels.fp8_blockscale_moe.route", "shape": SMALL,
              "kernel_ref": "skillrun_kernels.fp8_blockscale_moe.references:build_oracle", "config": {}}]
    ctl = child.Controller({"items": items}, "B", "", "")
    ctl.load_routes()
    ctl.patch_python_targets()
    launch = references.build_cublas_per_expert(SMALL, {}, "cpu")
    x = problem.make_inputs(SMALL, 0)
    out = problem.output_like(SMALL)
    y = launch.run(launch.prepare(x), out)
    ref = problem.oracle(x)
    assert float((y.float() - ref).norm() / ref.norm()) < 4e-3
    x2 = dict(x, a=problem.make_inputs(SMALL, 5)["a"])
    launch.run(launch.prepare(x2), out)
    assert ctl.item_calls == {"i0": 2}
    assert len(ctl._prepared) == 1  # same weights: prepared once, the activations refreshed
    ref2 = problem.oracle(x2)
    assert float((out.float() - ref2).norm() / ref2.norm()) < 4e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or getattr(torch.version, "hip", None) is not None,
                    reason="needs a CUDA device")
@pytest.mark.parametrize("tokens", [3, 200])
def test_gpu_port_and_cublas_fallback_match_oracle(tokens):
    shape = {"tokens": tokens, "model_dim": 512, "inter_dim": 256, "experts": 8, "topk": 2}
    inp = problem.make_inputs(shape, 5, "cuda")
    ref = problem.oracle(inp)
    for launch in (triton_sm90.build(shape, {}, "cuda"), references.build_cublas_per_expert(shape, {}, "cuda")):
        out = torch.full((tokens, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        launch.run(launch.prepare(inp), out)
        assert torch.isfinite(out).all(), launch.name
        assert float((out.float() - ref).norm() / ref.norm()) < 1e-2, launch.name


def test_layer_wrapper_offers_the_call_with_the_original_as_arm_a_thunk():
    """kernels/skillrun_kernels/_moe/routing.wrap_layer_builder: a call the route takes returns the route's value; one it
    passes runs the original run; the thunk it is handed runs the original (what arm A times)."""
    from skillrun_kernels._moe.routing import wrap_layer_builder
    from skillrun_kernels.protocol import KernelLaunch

    ran = []

    def original(shape, config, device):
        return KernelLaunch(name="orig", run=lambda p, out: ran.append("orig") or "orig-result")

    seen = []

    def route(target, call, thunk):
        seen.append((target, call))
        return (True, thunk()) if call == "take" else (False, None)

    build = wrap_layer_builder("t:build", lambda p, out: p["decision"])(original, route)
    assert build.__name__ == "original" and build.__wrapped__ is original
    launch = build(SMALL, {}, "cpu")
    assert launch.run({"decision": "take"}, None) == "orig-result" and ran == ["orig"]
    assert launch.run({"decision": "not a layer"}, None) == "orig-result" and ran == ["orig", "orig"]
    assert seen == [("t:build", "take"), ("t:build", "not a layer")]
