"""CPU checks of the a16wi4 MoE port: int4 packing, device-side routing, both stages and the full
layer in the Triton interpreter against the fp32 oracle, and the torch references.

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

from skillrun_kernels.moe_a16wi4 import packing, problem, references, triton_sm90

TESTS = Path(__file__).resolve().parent

_CASES = r"""
import json, os, sys
assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, sys.argv[1])
import interp_fixups  # noqa: F401
import torch
from skillrun_kernels.moe_a16wi4 import problem, triton_sm90 as port

def cfg(bm, n1, k1, n2, k2, split, acc):
    return dict(BLOCK_M=bm, BLOCK_N1=n1, BLOCK_K1=k1, warps1=4, stages1=2, split1=split,
                BLOCK_N2=n2, BLOCK_K2=k2, warps2=4, stages2=2, split2=split, scale_acc=acc)

cases = [
    # group 32, weights scaled in registers, split even/odd K halves
    ({"tokens": 5, "model_dim": 128, "inter_dim": 64, "experts": 6, "topk": 3, "group_size": 32}, cfg(16, 32, 64, 32, 64, True, False)),
    # interleaved nibbles (no split), different tiles per stage
    ({"tokens": 5, "model_dim": 128, "inter_dim": 64, "experts": 6, "topk": 3, "group_size": 32}, cfg(16, 32, 64, 64, 32, False, False)),
    # group 64 with the scale applied to the accumulator; more tokens than one block per expert
    ({"tokens": 19, "model_dim": 128, "inter_dim": 64, "experts": 4, "topk": 2, "group_size": 64}, cfg(16, 32, 64, 64, 32, True, True)),
    # one token, top-k over many experts (decode): most blocks exit early
    ({"tokens": 1, "model_dim": 64, "inter_dim": 32, "experts": 16, "topk": 4, "group_size": 32}, cfg(16, 32, 32, 32, 32, True, False)),
]
for ci, (shape, c) in enumerate(cases):
    for seed in (0, 1, 2):
        inp = problem.make_inputs(shape, seed, "cpu")
        t, d, i, e, k = (shape[x] for x in ("tokens", "model_dim", "inter_dim", "experts", "topk"))
        w1 = port.prepare_weights(inp["w1_q"], inp["w1_scale"])
        w2 = port.prepare_weights(inp["w2_q"], inp["w2_scale"])
        routing = port.align_by_expert(inp["topk_ids"], e, c["BLOCK_M"])
        rows = int(routing.num_rows)
        ids = inp["topk_ids"].reshape(-1)
        placed = routing.sorted_ids[:rows].tolist()
        valid = [r for r in range(rows) if r < int(routing.valid_end[int(routing.block_expert[r // c["BLOCK_M"]])])]
        pairs_ok = sorted(placed[r] for r in valid) == list(range(t * k))
        experts_ok = all(int(ids[placed[r]]) == int(routing.block_expert[r // c["BLOCK_M"]]) for r in valid)
        h = port.moe_a16wi4_stage1(inp["x"], w1, routing, k, c)
        h_ref = problem.oracle_stage1(inp)
        h_err = float((h.float().view(t, k, i) - h_ref).norm() / h_ref.norm())
        out = torch.full((t, d), float("nan"), dtype=torch.bfloat16)
        res = port.moe_a16wi4(inp["x"], w1, w2, inp["topk_ids"], inp["topk_weights"], out=out, config=c)
        ref = problem.oracle(inp)
        err = float((out.float() - ref).norm() / ref.norm())
        # stage 2 alone, fed the oracle's own stage-1 intermediate
        acc = torch.zeros(t, d)
        port.moe_a16wi4_stage2(h_ref.reshape(t * k, i).to(torch.bfloat16), w2, routing, inp["topk_weights"], acc, c)
        ref2 = problem.oracle(inp, h=h_ref.to(torch.bfloat16).float())
        s2_err = float((acc - ref2).norm() / ref2.norm())
        print(json.dumps({"case": ci, "seed": seed, "h_err": h_err, "rel_err": err, "s2_err": s2_err,
                          "all_written": bool(torch.isfinite(out).all()), "same_tensor": res is out,
                          "rows": rows, "pairs_ok": pairs_ok, "experts_ok": experts_ok,
                          "rows_aligned": rows % c["BLOCK_M"] == 0}))
"""


@pytest.fixture(scope="module")
def interp_results() -> list[dict]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _CASES, str(TESTS)], env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 12, proc.stdout
    return rows


def test_routing_places_every_pair_once_in_its_experts_block(interp_results):
    for r in interp_results:
        assert r["pairs_ok"] and r["experts_ok"] and r["rows_aligned"], r


def test_stage1_matches_oracle_intermediate(interp_results):
    for r in interp_results:
        # bf16 rounding of the dequantized weights and of h: ~3e-3
        assert r["h_err"] < 1e-2, r


def test_stage2_matches_oracle_on_the_same_intermediate(interp_results):
    for r in interp_results:
        assert r["s2_err"] < 1e-2, r


def test_full_layer_matches_oracle_and_writes_every_element(interp_results):
    for r in interp_results:
        assert r["all_written"] and r["same_tensor"], r
        assert r["rel_err"] < 1e-2, r


def test_pack_unpack_round_trip():
    g = torch.Generator().manual_seed(0)
    for shape in ((2, 3, 8), (5, 64), (1, 2)):
        q = torch.randint(-8, 8, shape, generator=g, dtype=torch.int8)
        p = packing.pack_int4(q)
        assert p.dtype == torch.uint8 and p.shape[-1] == shape[-1] // 2
        assert torch.equal(packing.unpack_int4(p), q)
        assert torch.equal(packing.unpack_int4(p.view(torch.int8)), q)


def test_pack_puts_even_k_in_the_low_nibble():
    q = torch.tensor([[-8, 7, 1, -1, 0, 3]], dtype=torch.int8)
    assert packing.pack_int4(q).tolist() == [[0x78, 0xF1, 0x30]]


def test_pack_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        packing.pack_int4(torch.tensor([8, 0], dtype=torch.int8))
    with pytest.raises(ValueError, match="even"):
        packing.pack_int4(torch.zeros(3, dtype=torch.int8))
    with pytest.raises(TypeError):
        packing.pack_int4(torch.zeros(4))


def test_dequantize_applies_one_scale_per_group():
    q = torch.arange(-8, 8, dtype=torch.int8).reshape(1, 16)
    s = torch.tensor([[2.0, 0.5]])
    w = packing.dequantize(q, s, 8)
    assert torch.equal(w[0, :8], q[0, :8].float() * 2) and torch.equal(w[0, 8:], q[0, 8:].float() * 0.5)
    with pytest.raises(ValueError, match="K/group"):
        packing.dequantize(q, s, 4)


def test_routing_inputs_are_a_real_topk():
    shape = {"tokens": 7, "model_dim": 64, "inter_dim": 32, "experts": 16, "topk": 4, "group_size": 32}
    inp = problem.make_inputs(shape, 0, "cpu")
    ids, w = inp["topk_ids"], inp["topk_weights"]
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.allclose(w.sum(-1), torch.ones(7)) and bool((w[:, :-1] >= w[:, 1:]).all())
    assert all(len(set(row)) == 4 for row in ids.tolist())
    assert int(inp["w1_q"].min()) >= -8 and int(inp["w1_q"].max()) <= 7
    assert problem.group_size_of(inp) == 32


@pytest.mark.parametrize(
    "builder",
    [references.build_dequant_grouped_bf16, references.build_bf16_grouped_predequant, references.build_per_expert_loop],
)
def test_torch_references_match_oracle_on_cpu(builder):
    shape = {"tokens": 6, "model_dim": 64, "inter_dim": 32, "experts": 5, "topk": 2, "group_size": 32}
    inp = problem.make_inputs(shape, 4, "cpu")
    launch = builder(shape, {}, "cpu")
    out = torch.full((6, 64), float("nan"), dtype=torch.bfloat16)
    res = launch.run(launch.prepare(inp), out)
    ref = problem.oracle(inp)
    assert torch.isfinite(res).all()
    assert float((res.float() - ref).norm() / ref.norm()) < 1e-2


def test_config_checks_name_the_problem():
    base = dict(triton_sm90.DEFAULT_DECODE)
    with pytest.raises(ValueError, match="BLOCK_N1=32 must divide 48"):
        triton_sm90.check_config(base, 7168, 48, 32)
    with pytest.raises(ValueError, match="scale_acc"):
        triton_sm90.check_config({**base, "scale_acc": True}, 7168, 512, 32)
    triton_sm90.check_config(base, 7168, 512, 32)


def test_prepare_weights_rejects_mismatched_scales():
    with pytest.raises(ValueError, match="w_scale"):
        triton_sm90.prepare_weights(torch.zeros(2, 4, 64, dtype=torch.int8), torch.zeros(2, 3, 2))
    with pytest.raises(TypeError, match="int8"):
        triton_sm90.prepare_weights(torch.zeros(2, 4, 64), torch.zeros(2, 4, 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_layer_matches_oracle():
    shape = {"tokens": 33, "model_dim": 512, "inter_dim": 256, "experts": 8, "topk": 2, "group_size": 32}
    inp = problem.make_inputs(shape, 5, "cuda")
    launch = triton_sm90.build(shape, {}, "cuda")
    out = torch.full((33, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.run(launch.prepare(inp), out)
    ref = problem.oracle(inp)
    assert torch.isfinite(out).all()
    assert float((out.float() - ref).norm() / ref.norm()) < 2e-2


def _card(name: str) -> dict:
    import yaml

    text = (TESTS.parent / "skills" / name / "SKILL.md").read_text()
    return yaml.safe_load(text.split("---")[1])


def test_card_recipes_equal_the_ports_measured_config_table():
    """The card's recipe for each test shape is the config the port itself picks (one source of truth),
    plus the decode lever the card turns on (int4_cvt magic, bit-identical). Group-128 decode shapes
    run the group-32 tiles (the port's table is keyed by group 32: its K tiles are multiples of 128)."""
    card = _card("triton_moe_a16wi4_sm90")
    recipes = {r["name"]: r for r in card["recipes"]}
    for case in card["tests"]["selects"]:
        s = case["shape"]
        cfg, tuned = triton_sm90.pick_config(s["tokens"], s["topk"], s["experts"], s["inter_dim"], s["group_size"])
        if case.get("untuned"):
            assert not tuned, case
            continue
        if s["group_size"] != triton_sm90.TUNED_GROUP:
            assert s["group_size"] == 128 and case["recipe"].startswith("decode"), case
            cfg, tuned = triton_sm90.pick_config(s["tokens"], s["topk"], s["experts"], s["inter_dim"], triton_sm90.TUNED_GROUP)
            triton_sm90.check_config(cfg, s["model_dim"], s["inter_dim"], s["group_size"])
        if triton_sm90.regime(triton_sm90.rows_per_expert(s["tokens"], s["topk"], s["experts"])) == "decode":
            cfg = {**cfg, "int4_cvt": "magic"}
        assert tuned and cfg == recipes[case["recipe"]]["config"], case


def test_card_offers_no_split_k_and_runs_magic_in_every_decode_recipe():
    """split_k1 failed the oracle on the H200 (NOTES.md, issue 24): no recipe or tunable space offers it."""
    card = _card("triton_moe_a16wi4_sm90")
    for r in card["recipes"]:
        assert "split_k1" not in r.get("config", {}), r["name"]
        assert "split_k1" not in r.get("tunable", {}).get("space", {}), r["name"]
        if r["name"].startswith("decode"):
            assert r["config"]["int4_cvt"] == "magic", r["name"]


def test_regime_follows_rows_per_expert():
    assert triton_sm90.regime(triton_sm90.rows_per_expert(64, 8, 64)) == "decode"
    assert triton_sm90.regime(triton_sm90.rows_per_expert(256, 8, 64)) == "mid"
    assert triton_sm90.regime(triton_sm90.rows_per_expert(1024, 8, 64)) == "prefill"


def test_slot_regexes_cover_the_kernels_recorded_on_the_h200():
    """expect_kernels must accept every kernel each slot launched in the H200 run and nothing foreign."""
    import gzip
    import re

    path = TESTS.parent / "kernels" / "skillrun_kernels" / "moe_a16wi4" / "results" / "h200_f95b066.json.gz"
    rows = json.loads(gzip.decompress(path.read_bytes()))["table"]
    port_re, torch_re = re.compile(triton_sm90.EXPECT_KERNELS), re.compile(references.TORCH_MOE_KERNELS)
    seen_port, seen_torch = set(), set()
    for row in rows:
        seen_port |= set(row["impls"]["port"]["kernels"])
        for name in ("dequant_grouped_bf16", "bf16_grouped_predequant", "per_expert_loop_bf16"):
            seen_torch |= set(row["impls"].get(name, {}).get("kernels", {}))
    assert len(seen_port) == 5 and all(port_re.search(k) for k in seen_port)
    assert seen_torch and all(torch_re.search(k) for k in seen_torch)
    assert not any(port_re.search(k) for k in seen_torch)
    assert not any(torch_re.search(k) for k in seen_port)
