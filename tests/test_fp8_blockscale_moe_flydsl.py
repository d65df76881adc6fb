"""The gfx950 FlyDSL port of the fp8 block-scale MoE: its host-side contract on the CPU (contiguous
routing, per-expert windows into the preshuffled weight stack, a CPU emulation of the grouped GEMM
that reads the operands exactly as the kernel addresses them), and compile-only checks of every
recipe of flydsl_moe_fp8_blockscale with the card's static gates (slow; skips without lld-19/FlyDSL).
"""
from __future__ import annotations

import pytest
import torch

from skillrun_kernels._flydsl import toolchain
from skillrun_kernels.fp8_blockscale_gemm import layout as L
from skillrun_kernels.fp8_blockscale_moe import flydsl_gfx950 as F
from skillrun_kernels.fp8_blockscale_moe import problem
from skillrun_kernels.protocol import UnsupportedShape

CARD = "flydsl_moe_fp8_blockscale"
SMALL = {"tokens": 9, "model_dim": 256, "inter_dim": 128, "experts": 5, "topk": 2}


def test_contiguous_routing_pads_each_expert_to_tile_m():
    inp = problem.make_inputs(SMALL, 1)
    ids = inp["topk_ids"]
    dest, be, rows = F.contiguous_routing(ids, 5, 16)
    assert rows % 16 == 0 and be.numel() == rows // 16 and be.dtype == torch.int32
    assert len(set(dest.tolist())) == ids.numel()  # every pair its own row
    flat = ids.reshape(-1)
    assert all(int(be[int(r) // 16]) == int(e) for r, e in zip(dest.tolist(), flat.tolist()))
    assert rows <= F.rows_bound(SMALL, 16)


def _emulate_stage(a_rows, a_scale_rows, w_shuf, w_scale_flat, be, N, K, tm):
    """The grouped GEMM as the kernel addresses it: per M block, expert e's window of the
    preshuffled stack (byte offset e*N*K) and of the flat scales (offset e*(N/128)*(K/128))."""
    w_bytes = w_shuf.view(torch.uint8)
    out = torch.zeros(a_rows.shape[0], N)
    n = torch.arange(N)
    kk = torch.arange(K)
    offs = L.preshuffle_offset(n[:, None], kk[None, :], K)
    nkb = K // 128
    for blk in range(a_rows.shape[0] // tm):
        e = int(be[blk])
        w = w_bytes[e * N * K:(e + 1) * N * K][offs].view(torch.float8_e4m3fn).float()
        sw = w_scale_flat[e * (N // 128) * nkb:(e + 1) * (N // 128) * nkb].view(N // 128, nkb)
        w = w * sw[n // 128][:, kk // 128]
        r = slice(blk * tm, (blk + 1) * tm)
        a = a_rows[r].view(torch.float8_e4m3fn).float() * a_scale_rows[r][:, kk // 128]
        out[r] = a @ w.t()
    return out


def test_per_expert_windows_of_the_prepared_operands_give_the_oracle():
    inp = problem.make_inputs(SMALL, 2)
    t, d, i, e, k = problem.dims(SMALL)
    prep = F.prepare_weights(inp)
    dest, be, rows = F.contiguous_routing(inp["topk_ids"], e, 16)
    tok = torch.arange(t * k) // k
    a = torch.zeros(rows, d, dtype=torch.uint8)
    sa = torch.zeros(rows, d // 128)
    a[dest] = inp["a"].view(torch.uint8)[tok]
    sa[dest] = inp["a_scale"][tok]
    gu = _emulate_stage(a, sa, prep["w1_shuf"], prep["w1_scale"], be, 2 * i, d, 16)
    h = torch.nn.functional.silu(gu[:, :i]) * gu[:, i:]
    hq, hs = problem.quantize_rows_1x128(h)
    y = _emulate_stage(hq.view(torch.uint8), hs, prep["w2_shuf"], prep["w2_scale"], be, d, i, 16)
    out = torch.zeros(t, d)
    out.index_add_(0, tok, y[dest] * inp["topk_weights"].reshape(-1, 1))
    ref = problem.oracle(inp)
    assert float((out - ref).norm() / ref.norm()) < 1e-5


def test_config_rules_name_the_violation():
    F.Config().check(7168, 2048)
    with pytest.raises(UnsupportedShape, match="tile_n"):
        F.Config(tile_n1=96).check(7168, 2048)
    with pytest.raises(UnsupportedShape, match="tile_m"):
        F.Config(tile_m=16, tile_k=128).check(7168, 2048)  # 16 x 128 bytes is half a copy step
    with pytest.raises(ValueError, match="unknown config keys"):
        F.Config.from_dict({"BLOCK_M": 16})


_needs_toolchain = pytest.mark.skipif(toolchain.missing_reason() is not None,
                                      reason=f"FlyDSL compile-only toolchain unavailable: {toolchain.missing_reason()}")


def _recipes():
    from skillrun.kb.index import SkillIndex

    card = SkillIndex.load().skill(CARD)
    return [r.name for r in card.recipes if r.backend == "flydsl"]


@pytest.mark.slow
@_needs_toolchain
@pytest.mark.parametrize("recipe", _recipes())
def test_recipe_compiles_for_gfx950_and_passes_its_gates(recipe, tmp_path):
    """Small model dims (short unrolled K) with each recipe's own config and token class."""
    from skillrun.check import check_skill
    from skillrun.kb.index import SkillIndex

    index = SkillIndex.load()
    tokens = {"decode": 4, "small_batch": 256, "prefill": 4096}.get(recipe, 16)
    shape = {"tokens": tokens, "model_dim": 1024, "inter_dim": 512, "experts": 16, "topk": 4}
    if recipe == "untuned_default":
        shape["inter_dim"] = 384
    report = check_skill(index, CARD, arch="gfx950", shapes=[shape], recipes=[recipe], write=True, timeout_s=900,
                         validation_root=tmp_path)
    (chk,) = report.checks
    detail = "; ".join(f"{g.name}: {g.reason}" for g in chk.gates if not g.passed) or chk.reason
    assert chk.status == "compile_verified", f"{recipe} at {shape}: {detail}\n{chk.log_tail[-1500:]}"
    kernels = {k["name"] for k in chk.facts["kernels"]} if getattr(chk, "facts", None) else None
    if kernels is not None:
        assert {n.split("_gfx950")[0] for n in kernels} == {"moe_fp8bs_g1", "moe_fp8bs_g2"}


@pytest.mark.slow
@_needs_toolchain
def test_gfx942_compiles_with_the_fp8_mfma_chain(tmp_path):
    from skillrun.check import check_skill
    from skillrun.kb.index import SkillIndex

    shape = {"tokens": 256, "model_dim": 512, "inter_dim": 256, "experts": 8, "topk": 2}
    report = check_skill(SkillIndex.load(), CARD, arch="gfx942", shapes=[shape], recipes=["untuned_default"], write=True,
                         timeout_s=900, validation_root=tmp_path)
    (chk,) = report.checks
    assert chk.status == "compile_verified", chk.reason
