"""The rolled-K-loop guard of the FlyDSL a16wi4 MoE kernel (seed 004, aiter PR #4646).

The seed found the rolled ``scf.for`` computes wrong results for k_wave == 1 (four N-waves) with one
N accumulator per wave and TILE_K >= 256 (e.g. t16x64x256), while the unrolled body is right. Our
kernel rolls every tile_m <= 16 stage, and stage 2 of every BM-16 recipe is exactly t16x64x256 kw1.
Plan-level tests run everywhere; the compile-only test (FlyDSL + lld-19 on the CPU, no GPU) checks the
guarded stage really is built unrolled and a neighbouring safe stage still rolls. Nothing here ran on
a GPU: the guard's correctness claim is the seed's, not a measurement of ours.
"""
from __future__ import annotations

import pytest

from skillrun_kernels._flydsl import toolchain
from skillrun_kernels.moe_a16wi4 import flydsl_gfx950 as K

SHAPE = {"tokens": 1, "model_dim": 1024, "inter_dim": 512, "experts": 16, "topk": 4, "group_size": 32}
TOK1 = {"tile_m": 16, "tile_n": 16, "tile_k": 256, "k_wave": 4, "b_nt": 0}  # the decode_tok1 recipe's stage 1


@pytest.mark.parametrize("tile_n,tile_k,k_wave,safe", [
    (64, 256, 1, False),   # the seed's failing combo: kw1, one accumulator (64 / 4 waves / 16), TILE_K 256
    (64, 512, 1, False),
    (64, 128, 1, True),    # kw1 with TILE_K 128: correct rolled
    (128, 256, 1, True),   # kw1 with two accumulators: correct rolled
    (32, 256, 2, True),    # kw2 TILE_K 256: correct rolled
    (16, 256, 4, True),
])
def test_roll_is_safe_matches_the_seed(tile_n, tile_k, k_wave, safe):
    assert K.roll_is_safe(K.StageConfig(tile_n, tile_k, k_wave)) is safe


def test_guarded_stage_falls_back_to_the_unrolled_body():
    p = K.make_plan(SHAPE, TOK1)
    assert (p.s2.tile_n, p.s2.tile_k, p.s2.k_wave) == (64, 256, 1)
    assert p.rolled and not p.rolled2
    assert "_roll_" in K._kernel_name(p, 1, "gfx950") and "_unroll_" in K._kernel_name(p, 2, "gfx950")
    # Asking for a rolled loop does not override the correctness guard.
    forced = K.make_plan(SHAPE, {**TOK1, "k_loop": "rolled"})
    assert forced.rolled and not forced.rolled2
    # A safe stage-2 tile still rolls.
    assert K.make_plan(SHAPE, {**TOK1, "stage2_tile_k": 128}).rolled2


def test_stage2_weight_loads_are_l2_cached_by_default():
    # The seed's int4 stage 2 ran b_nt=0 (it never registered b_nt); stage 1 keeps the recipe's b_nt.
    p = K.make_plan(SHAPE, {**TOK1, "b_nt": 2})
    assert (p.b_nt, p.b_nt2) == (2, 0)
    assert "_nt2_" in K._kernel_name(p, 1, "gfx950") and "_nt0_" in K._kernel_name(p, 2, "gfx950")
    assert K.make_plan(SHAPE, {**TOK1, "stage2_b_nt": 2}).b_nt2 == 2
    with pytest.raises(ValueError, match="stage2_b_nt"):
        K.make_plan(SHAPE, {**TOK1, "stage2_b_nt": 1})


@pytest.mark.slow
@pytest.mark.skipif(toolchain.missing_reason() is not None,
                    reason=f"FlyDSL compile-only toolchain unavailable: {toolchain.missing_reason()}")
def test_guarded_combination_compiles_unrolled_for_gfx950():
    from skillrun.check.core import check_recipe
    from skillrun.kb.cards import Recipe
    from skillrun.kb.index import SkillIndex

    card = SkillIndex.load().skill("flydsl_moe_a16wi4")
    base = card.recipe("decode_tok1")

    def compiled(config):
        r = Recipe.from_dict({**{k: getattr(base, k) for k in ("name", "when", "kernel", "backend", "lever", "gates")},
                              "config": config})
        chk = check_recipe(card, r, SHAPE, "gfx950", timeout_s=900)
        assert chk.status == "compile_verified", chk.reason
        return {("g1" if "_g1_" in k["name"] else "g2"): k for k in chk.kernels}

    ks = compiled(dict(TOK1))
    g1, g2 = ks["g1"], ks["g2"]
    assert "_roll_" in g1["name"] and g1["isa_stats"]["branches"] >= 2  # stage 1: loop back-edge present
    assert "_t16x64x256_kw1_nt0_unroll_" in g2["name"]
    # Unrolled: no loop back-edge, and one MFMA block per K tile (inter_dim 512 / 256 = 2 tiles) in the code.
    assert g2["isa_stats"]["branches"] == 1
    per_tile = 1 * 1 * 8  # m_rep (16/16) x accumulators x K32 steps per 256-deep tile
    assert g2["mfma"]["v_mfma_f32_16x16x32_bf16"] == 2 * per_tile
    # The same stage with a safe TILE_K rolls: the guard is specific to the failing combination.
    safe = compiled({**TOK1, "stage2_tile_k": 128})["g2"]
    assert "_unroll_" not in safe["name"] and safe["isa_stats"]["branches"] >= 2
