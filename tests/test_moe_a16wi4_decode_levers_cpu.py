"""CPU checks of the a16wi4 MoE port's two decode levers (split-K stage 1, magic int4 conversion).

Interpreter runs in a subprocess (TRITON_INTERPRET must be set before triton is imported). What
must hold: the magic conversion dequantizes every nibble to exactly the value the shift-and-convert
path gives (so h is bit-identical), split-K stage 1 matches the oracle and leaves its workspace zero,
and the whole layer through ``build`` (six launches) matches the fp32 oracle.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skillrun_kernels.moe_a16wi4 import triton_sm90 as port

TESTS = Path(__file__).resolve().parent

_CASES = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import interp_fixups  # noqa: F401
import torch
from skillrun_kernels.moe_a16wi4 import problem, triton_sm90 as port

base = dict(BLOCK_M=16, BLOCK_N1=32, BLOCK_K1=32, warps1=4, stages1=2, split1=True,
            BLOCK_N2=32, BLOCK_K2=32, warps2=4, stages2=2, split2=True, scale_acc=False)
shapes = [
    {"tokens": 1, "model_dim": 128, "inter_dim": 32, "experts": 16, "topk": 4, "group_size": 32},
    {"tokens": 5, "model_dim": 160, "inter_dim": 64, "experts": 6, "topk": 3, "group_size": 32},
]
for si, shape in enumerate(shapes):
    t, d, i, e, k = (shape[x] for x in ("tokens", "model_dim", "inter_dim", "experts", "topk"))
    for seed in (0, 1):
        inp = problem.make_inputs(shape, seed, "cpu")
        w1 = port.prepare_weights(inp["w1_q"], inp["w1_scale"])
        routing = port.align_by_expert(inp["topk_ids"], e, 16)
        h_ref = problem.oracle_stage1(inp)
        h_plain = port.moe_a16wi4_stage1(inp["x"], w1, routing, k, base)
        h_magic = port.moe_a16wi4_stage1(inp["x"], w1, routing, k, {**base, "int4_cvt": "magic"})
        row = {"shape": si, "seed": seed,
               "magic_identical": bool(torch.equal(h_plain.view(torch.int16), h_magic.view(torch.int16)))}
        for sk in (2, 3, 64):
            part = port.split_workspace(t, k, i, "cpu")
            h_sk = port.moe_a16wi4_stage1(inp["x"], w1, routing, k, {**base, "split_k1": sk}, part=part)
            row[f"sk{sk}_err"] = float((h_sk.float().view(t, k, i) - h_ref).norm() / h_ref.norm())
            row[f"sk{sk}_ws_zero"] = bool((part == 0).all())
        launch = port.build(shape, {**base, "split_k1": 2, "int4_cvt": "magic"}, "cpu")
        prep = launch.prepare(inp)
        ref = problem.oracle(inp)
        errs = []
        for _ in range(2):  # the second call reuses the workspace the first re-zeroed
            out = torch.full((t, d), float("nan"), dtype=torch.bfloat16)
            launch.run(prep, out)
            errs.append(float((out.float() - ref).norm() / ref.norm()))
        row.update(layer_err=errs, layer_written=bool(torch.isfinite(out).all()), launches=launch.describe["launches"])
        print(json.dumps(row))
"""


@pytest.fixture(scope="module")
def interp_results() -> list[dict]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _CASES, str(TESTS)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 4, proc.stdout
    return rows


def test_magic_conversion_is_bit_identical(interp_results):
    assert all(r["magic_identical"] for r in interp_results)


def test_split_k_stage1_matches_oracle_and_rezeroes(interp_results):
    for r in interp_results:
        for sk in (2, 3, 64):  # 64 > K steps: clamped to one step per split
            assert r[f"sk{sk}_err"] < 1e-2, r
            assert r[f"sk{sk}_ws_zero"], r


def test_layer_with_both_levers_matches_oracle(interp_results):
    for r in interp_results:
        assert r["layer_written"] and r["launches"] == 6, r
        assert max(r["layer_err"]) < 1e-2, r
        assert abs(r["layer_err"][0] - r["layer_err"][1]) < 1e-3, r


@pytest.mark.parametrize("d,bk,sk,expect", [(7168, 256, 4, (7, 4)), (7168, 128, 3, (19, 3)), (128, 32, 64, (1, 4))])
def test_split_k_steps(d, bk, sk, expect):
    per, used = port.split_k_steps(d, bk, sk)
    assert (per, used) == expect and (used - 1) * per < d // bk <= used * per


@pytest.mark.parametrize("extra,msg", [
    ({"split_k1": 0}, "split_k1"), ({"split_k1": 2.5}, "split_k1"), ({"split_k1": 9}, "exceeds"),
    ({"int4_cvt": "lut"}, "int4_cvt"),
])
def test_bad_lever_values_are_rejected(extra, msg):
    cfg = {**port.DEFAULT_DECODE, **extra}
    with pytest.raises(ValueError, match=msg):
        port.check_config(cfg, 2048, 512, 32)  # 2048 / BLOCK_K1 256 = 8 steps


def test_split_k_without_workspace_is_a_clear_error():
    import torch

    from skillrun_kernels.moe_a16wi4 import problem

    shape = {"tokens": 1, "model_dim": 64, "inter_dim": 32, "experts": 4, "topk": 2, "group_size": 32}
    inp = problem.make_inputs(shape, 0, "cpu")
    w1 = port.prepare_weights(inp["w1_q"], inp["w1_scale"])
    # a routing by hand: the workspace check must fire before any launch (no device here)
    routing = port.Routing(torch.zeros(16, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                           torch.zeros(4, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 1)
    cfg = {**port.DEFAULT_DECODE, "BLOCK_K1": 32, "BLOCK_N1": 32, "split_k1": 2}
    with pytest.raises(ValueError, match="workspace"):
        port.moe_a16wi4_stage1(inp["x"], w1, routing, 2, cfg, part=torch.zeros(3, 3))
