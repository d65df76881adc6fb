"""CI compile checks: every FlyDSL recipe of every card in the knowledge base compiles for gfx950
and passes its own static gates (spills, scratch, occupancy, LDS, MFMA opcodes, E8M0 pinning).

Compile-only (no GPU). Each recipe compiles at its family's CI shape (``problem.ci_shape``, see
kernels/skillrun_kernels/protocol.py): the recipe's configuration at small dimensions, so the unrolled kernels compile
in seconds; the recipes' representative shapes are checked by ``skill-run check`` and recorded under
``validation/``. A new card or port is picked up here without editing this file. Skips with a reason
when lld-19 or flydsl is missing (CI installs both).
"""
from __future__ import annotations

import pytest

from skillrun_kernels._flydsl import toolchain

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(toolchain.missing_reason() is not None,
                       reason=f"FlyDSL compile-only toolchain unavailable: {toolchain.missing_reason()}"),
]

# Cards the two behaviour tests at the end use.
BS = "flydsl_fp8_blockscale_gemm"
MOE = "flydsl_moe_a16wi4"


@pytest.fixture(scope="module")
def index():
    from skillrun.kb.index import SkillIndex

    return SkillIndex.load()


def _flydsl_recipes(card):
    return [r for r in card.recipes if r.backend == "flydsl" and (not r.gens or "gfx950" in r.gens)]


def _ci_shape(card, recipe):
    """The family's CI shape for this recipe (its representative shape when the family gives none)."""
    import importlib

    from skillrun.check.core import representative_shape

    shape = representative_shape(card, recipe, "gfx950")
    ci = getattr(importlib.import_module(card.references["problem"]), "ci_shape", None)
    return ci(shape) if ci else shape


def _params():
    from skillrun.kb.index import SkillIndex

    idx = SkillIndex.load()
    return [pytest.param(card.id, r.name, id=f"{card.id}:{r.name}")
            for card in idx.skills.values() for r in _flydsl_recipes(card)]


@pytest.mark.parametrize("card_id,recipe", _params())
def test_recipe_compiles_for_gfx950_and_passes_its_gates(index, card_id, recipe, tmp_path):
    from skillrun.check import check_skill

    card = index.skill(card_id)
    r = card.recipe(recipe)
    shape = _ci_shape(card, r)
    report = check_skill(index, card_id, arch="gfx950", shapes=[shape], recipes=[recipe], write=True,
                         timeout_s=900, validation_root=tmp_path)
    (chk,) = report.checks
    detail = "; ".join(f"{g.name}: {g.reason}" for g in chk.gates if not g.passed) or chk.reason
    assert chk.status == "compile_verified", f"{card_id}/{recipe} at {shape}: {detail}\n{chk.log_tail[-1500:]}"
    assert chk.kernels and all(k["vgpr"] > 0 for k in chk.kernels)
    for k in chk.kernels:
        assert k["mfma"], f"{k['name']} has no MFMA"
    # The artifact is schema-valid evidence of exactly this compile.
    from skillrun.evidence.validation import load_artifact

    art = load_artifact(chk.artifact)
    assert art["mode"] == "compile_only" and art["verdict"] == "compile_verified"
    assert art["recipe"]["name"] == recipe and art["shape"] == shape
    assert [k["name"] for k in art["compile"]["kernels"]] == [k["name"] for k in chk.kernels]


def test_check_skill_reports_a_failing_gate_as_compile_failed(index, tmp_path):
    """A recipe whose gate cannot hold is recorded as compile_failed (not silently passed)."""
    from skillrun.check.core import check_recipe
    from skillrun.kb.cards import Recipe

    card = index.skill(BS)
    r = card.recipe("k_light_grid_saturated")
    strict = Recipe.from_dict({**{k: getattr(r, k) for k in ("name", "when", "kernel", "backend", "lever")},
                               "config": dict(r.config), "gates": {**r.gates, "min_waves_per_simd": 4}})
    chk = check_recipe(card, strict, {"M": 512, "N": 2048, "K": 256}, "gfx950", timeout_s=900)
    assert chk.status == "compile_failed"
    assert [g.name for g in chk.gates if not g.passed] == ["min_waves_per_simd"]


def test_moe_fallback_also_compiles_for_gfx942(index, tmp_path):
    """The MoE card sends every gfx942 shape to its fallback recipe: it must build there too."""
    from skillrun.check import check_skill

    if MOE not in index.skills:
        pytest.skip(f"card {MOE} not in the knowledge base")
    from skillrun_kernels.moe_a16wi4.problem import ci_shape

    shape = ci_shape(None)
    report = check_skill(index, MOE, arch="gfx942", shapes=[shape], recipes=["untuned_fallback"], write=False, timeout_s=900)
    (chk,) = report.checks
    assert chk.status == "compile_verified", chk.reason
    assert all(set(k["mfma"]) == {"v_mfma_f32_16x16x16_bf16"} for k in chk.kernels)
