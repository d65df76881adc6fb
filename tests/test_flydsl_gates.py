"""Static checks that can fail: every gate catches its defect.

* Parser and gate unit tests on small captured ISA snippets and metadata (fast, no toolchain).
* Real compiles (FlyDSL + lld-19; skipped with a reason when missing): a spilling tile, a
  waves-per-EU hint past the register wall, a kernel variant that feeds data-dependent values to the
  E8M0 scale operands, and a gfx942 compile that lacks the gfx950 opcode must each fail their gate,
  while the recipe's own configuration passes every gate.
"""
from __future__ import annotations

import pytest

from skillrun.check import gates as G
from skillrun_kernels._flydsl import isa
from skillrun_kernels._flydsl import toolchain

# ---------------------------------------------------------------- captured snippets
META = (
    'gpu.binary @kernels [#gpu.object<#rocdl.target<chip = "gfx950">, kernels = <[#gpu.kernel_metadata<"k_0", '
    "!llvm.func<void (ptr<1>, struct<packed (struct<packed (i32)>)>)>, metadata = {agpr_count = 8 : i64, "
    "group_segment_fixed_size = 32768 : i64, max_flat_workgroup_size = 256 : i64, private_segment_fixed_size = 44 : i64, "
    "reqd_workgroup_size = array<i32: 256, 1, 1>, sgpr_count = 41 : i64, sgpr_spill_count = 0 : i64, vgpr_count = 264 : i64, "
    'vgpr_spill_count = 10 : i64, wavefront_size = 64 : i64}>]>, bin = "\\7FELF">]'
)

PINNED = """
	.text
	.globl	k_0
	.type	k_0,@function
k_0:
	s_load_dwordx2 s[4:5], s[0:1], 0x0
	v_mov_b32_e32 v34, 0x7f7f7f7f   ; E8M0 one
	buffer_load_dwordx4 v[104:107], v1, s[4:7], 0 offen
	ds_read_b128 v[88:91], v2
	v_mfma_scale_f32_16x16x128_f8f6f4 v[62:65], v[104:111], v[88:95], 0, v34, v34 op_sel_hi:[0,0,0]
	s_waitcnt vmcnt(0) lgkmcnt(0)
	s_barrier
	v_pk_fma_f32 v[0:1], v[62:63], v[2:3], v[0:1]
	buffer_store_dwordx4 v[62:65], v0, s[8:11], 0 offen
	s_endpgm
.Lfunc_end0:
	.size	k_0, .Lfunc_end0-k_0
	.amdhsa_kernel k_0
		.amdhsa_next_free_vgpr 112
		.amdhsa_accum_offset 112
	.end_amdhsa_kernel
"""


def _fn(text: str, name: str = "k_0") -> isa.Function:
    return isa.functions(text)[name]


def test_metadata_parser_reads_registers_spills_and_lds():
    meta = isa.parse_kernel_metadata(META)["k_0"]
    assert meta["vgpr_count"] == 264 and meta["agpr_count"] == 8
    assert meta["vgpr_spill_count"] == 10 and meta["private_segment_fixed_size"] == 44
    assert meta["group_segment_fixed_size"] == 32768 and meta["sgpr_count"] == 41


def test_waves_per_simd_follows_the_unified_vgpr_granule():
    assert [isa.waves_per_simd(v) for v in (0, 64, 65, 72, 96, 128, 168, 169, 256, 264, 512)] == [8, 8, 7, 7, 5, 4, 3, 2, 2, 1, 1]


def test_function_split_counts_only_instructions():
    fn = _fn(PINNED)
    assert [i.op for i in fn.instrs][:3] == ["s_load_dwordx2", "v_mov_b32_e32", "buffer_load_dwordx4"]
    assert fn.amdhsa["amdhsa_accum_offset"] == 112
    assert isa.mfma_counts(fn) == {"v_mfma_scale_f32_16x16x128_f8f6f4": 1}
    st = isa.isa_stats(fn)
    assert st["instructions"] == 10 and st["s_barrier"] == 1 and st["waitcnt_vmcnt0"] == 1 and st["mfma_scaled"] == 1
    mf = next(i for i in fn.instrs if i.op.startswith("v_mfma"))
    assert mf.operands[4:6] == ["v34", "v34"] and mf.operands[-1] == "op_sel_hi:[0,0,0]"


def test_e8m0_trace_accepts_the_pinned_constant():
    s = isa.e8m0_summary(_fn(PINNED))
    assert s["scaled_mfma"] == 1 and s["pinned"] == 2 and s["unpinned"] == 0


def test_e8m0_trace_rejects_a_loaded_scale():
    text = PINNED.replace("v_mov_b32_e32 v34, 0x7f7f7f7f   ; E8M0 one", "buffer_load_dword v34, v3, s[12:15], 0 offen")
    s = isa.e8m0_summary(_fn(text))
    assert s["unpinned"] == 2 and "buffer_load_dword v34" in s["first_unpinned"]["reaching"][0]


def test_e8m0_trace_rejects_a_register_overwritten_after_the_constant():
    text = PINNED.replace("ds_read_b128 v[88:91], v2", "ds_read_b128 v[88:91], v2\n\tv_cvt_f32_i32_e32 v34, v7")
    assert isa.e8m0_summary(_fn(text))["unpinned"] == 2


def test_e8m0_trace_rejects_another_constant_and_sgpr_operands():
    other = PINNED.replace("0x7f7f7f7f", "0x7e7e7e7e")
    assert isa.e8m0_summary(_fn(other))["unpinned"] == 2
    sgpr = PINNED.replace("0, v34, v34 op_sel_hi", "0, s4, v34 op_sel_hi")
    s = isa.e8m0_summary(_fn(sgpr))
    assert s["unpinned"] == 1 and "not a single VGPR" in s["first_unpinned"]["reaching"][0]


LOOP = """
	.type	k_1,@function
k_1:
	v_mov_b32_e32 v6, 0x7f7f7f7f
.LBB0_1:
	v_mfma_scale_f32_16x16x128_f8f6f4 v[8:11], v[14:21], v[30:37], 0, v6, v6 op_sel_hi:[0,0,0]
	buffer_load_dword v6, v1, s[4:7], 0 offen
	s_cbranch_scc1 .LBB0_1
	s_endpgm
.Lfunc_end1:
"""


def test_e8m0_trace_follows_the_loop_back_edge():
    # The first trip reads the constant, later trips the loaded value: not pinned.
    s = isa.e8m0_summary(_fn(LOOP, "k_1"))
    assert s["unpinned"] == 2
    fixed = LOOP.replace("buffer_load_dword v6, v1, s[4:7], 0 offen", "buffer_load_dword v7, v1, s[4:7], 0 offen")
    assert isa.e8m0_summary(_fn(fixed, "k_1"))["unpinned"] == 0


def test_e8m0_trace_ignores_stores_of_the_register():
    text = PINNED.replace("s_barrier", "s_barrier\n\tbuffer_store_dword v34, v0, s[8:11], 0 offen\n\tds_write_b32 v1, v34")
    assert isa.e8m0_summary(_fn(text))["unpinned"] == 0


# ---------------------------------------------------------------- gates on synthetic facts
def _facts(**over):
    k = {"name": "k", "vgpr": 242, "agpr": 0, "vgpr_spill": 0, "sgpr_spill": 0, "scratch_bytes": 0, "lds_bytes": 32768,
         "waves_per_simd": 2, "mfma": {"v_mfma_scale_f32_16x16x128_f8f6f4": 192},
         "e8m0": {"scaled_mfma": 192, "scale_operands": 384, "pinned": 384, "unpinned": 0, "first_unpinned": None}}
    k.update(over)
    return {"arch": "gfx950", "kernels": [k]}


CARD_GATES = {"max_vgpr_spill": 0, "max_sgpr_spill": 0, "max_scratch_bytes": 0, "min_waves_per_simd": 2,
              "max_lds_bytes": 163840, "mfma_opcodes": ["v_mfma_scale_f32_16x16x128_f8f6f4"], "e8m0_scale_pinned": True}


def _failed(facts, arch="gfx950", gates=CARD_GATES):
    return sorted(g.name for g in G.evaluate(gates, facts, arch) if not g.passed)


def test_clean_facts_pass_every_gate():
    assert _failed(_facts()) == []


@pytest.mark.parametrize("over,gate", [
    ({"vgpr_spill": 51}, "max_vgpr_spill"),
    ({"sgpr_spill": 2}, "max_sgpr_spill"),
    ({"scratch_bytes": 96}, "max_scratch_bytes"),
    ({"vgpr": 264, "waves_per_simd": 1}, "min_waves_per_simd"),
    ({"lds_bytes": 196608}, "max_lds_bytes"),
    ({"mfma": {"v_mfma_f32_16x16x32_fp8_fp8": 576}}, "mfma_opcodes"),
    ({"e8m0": {"scaled_mfma": 4, "scale_operands": 8, "pinned": 6, "unpinned": 2,
               "first_unpinned": {"line": 9, "instruction": "v_mfma_scale...", "operand": "v3", "reaching": ["line 7: buffer_load_dword v3"]}}},
     "e8m0_scale_pinned"),
])
def test_each_gate_catches_its_defect(over, gate):
    assert _failed(_facts(**over)) == [gate]


def test_lds_gate_is_capped_at_the_arch_budget():
    res = {g.name: g for g in G.evaluate({"max_lds_bytes": 163840}, _facts(lds_bytes=98304), "gfx942")}
    assert not res["max_lds_bytes"].passed and res["max_lds_bytes"].limit == 65536 and "capped" in res["max_lds_bytes"].reason
    assert G.evaluate({"max_lds_bytes": 163840}, _facts(lds_bytes=98304), "gfx950")[0].passed


def test_multi_kernel_facts_report_the_worst_kernel():
    f = _facts()
    f["kernels"].append(dict(f["kernels"][0], name="stage2", vgpr_spill=3, mfma={}))
    res = {g.name: g for g in G.evaluate(CARD_GATES, f, "gfx950")}
    assert not res["max_vgpr_spill"].passed and "stage2" in res["max_vgpr_spill"].reason
    assert not res["mfma_opcodes"].passed and "stage2" in res["mfma_opcodes"].reason


def test_e8m0_gate_without_scaled_mfma_is_vacuously_true_and_says_so():
    g = G.evaluate({"e8m0_scale_pinned": True}, _facts(e8m0={"scaled_mfma": 0, "scale_operands": 0, "pinned": 0, "unpinned": 0,
                                                             "first_unpinned": None}), "gfx950")[0]
    assert g.passed and "no v_mfma_scale" in g.reason


# ---------------------------------------------------------------- real compiles
requires_toolchain = pytest.mark.skipif(toolchain.missing_reason() is not None,
                                        reason=f"FlyDSL compile-only toolchain unavailable: {toolchain.missing_reason()}")


def _compile_check(kernel: str, shape: dict, config: dict, arch: str, gates: dict = CARD_GATES):
    from skillrun.check.core import check_recipe
    from skillrun.kb.cards import Recipe

    recipe = Recipe.from_dict({"name": "gate_probe", "when": "True", "kernel": kernel, "backend": "flydsl",
                               "config": config, "lever": "test", "gates": gates})
    chk = check_recipe(None, recipe, shape, arch, timeout_s=900)
    assert chk.kernels, f"compile failed: {chk.reason}\n{chk.log_tail}"
    return chk


FOUR_WAVE = "skillrun_kernels.fp8_blockscale_gemm.flydsl_4wave:build"
SHAPE = {"M": 512, "N": 1024, "K": 512}
RECIPE_CFG = {"tile_m": 64, "tile_n": 256, "tile_k": 128, "waves_per_eu": 2, "xcd_swizzle": 8}


@pytest.mark.slow
@requires_toolchain
def test_real_compile_recipe_config_passes_every_gate():
    chk = _compile_check(FOUR_WAVE, SHAPE, RECIPE_CFG, "gfx950")
    assert chk.status == "compile_verified", chk.reason
    assert {g.name for g in chk.gates} == set(CARD_GATES)


@pytest.mark.slow
@requires_toolchain
@pytest.mark.parametrize("over", [{"tile_m": 128}, {"waves_per_eu": 3}], ids=["t128x256", "wpe3"])
def test_real_compile_spilling_configs_fail_the_spill_gates(over):
    chk = _compile_check(FOUR_WAVE, SHAPE, {**RECIPE_CFG, **over}, "gfx950")
    failed = {g.name for g in chk.gates if not g.passed}
    assert chk.status == "compile_failed"
    assert {"max_vgpr_spill", "max_scratch_bytes"} <= failed
    assert chk.kernels[0]["vgpr_spill"] > 0 and chk.kernels[0]["isa_stats"]["scratch_ops"] > 0


@pytest.mark.slow
@requires_toolchain
def test_real_compile_data_dependent_e8m0_scale_fails_the_pinning_gate():
    chk = _compile_check(FOUR_WAVE, SHAPE, {**RECIPE_CFG, "tile_n": 128, "debug_data_scale": True}, "gfx950")
    failed = {g.name for g in chk.gates if not g.passed}
    assert failed == {"e8m0_scale_pinned"}, chk.reason
    e = chk.kernels[0]["e8m0"]
    assert e["unpinned"] == e["scale_operands"] > 0
    assert any("load" in r for r in e["first_unpinned"]["reaching"])


@pytest.mark.slow
@requires_toolchain
def test_real_compile_for_gfx942_lacks_the_gfx950_opcode():
    chk = _compile_check(FOUR_WAVE, SHAPE, {**RECIPE_CFG, "tile_n": 128}, "gfx942")
    res = {g.name: g for g in chk.gates}
    assert not res["mfma_opcodes"].passed and "v_mfma_f32_16x16x32_fp8_fp8" in res["mfma_opcodes"].reason
    # gfx942 path: four chained 16x16x32 fp8 MFMAs per 128-deep block and accumulator (unrolled K).
    blocks = SHAPE["K"] // 128 * (64 // 16) * (128 // 64)
    assert chk.kernels[0]["mfma"] == {"v_mfma_f32_16x16x32_fp8_fp8": 4 * blocks}


def test_missing_lld_is_a_clear_unavailable_error(monkeypatch):
    from skillrun.check import flydsl_env
    from skillrun.errors import EXIT_UNAVAILABLE, UnavailableError

    monkeypatch.setattr(toolchain, "find_lld", lambda: None)
    with pytest.raises(UnavailableError) as exc:
        flydsl_env.require_toolchain()
    assert exc.value.exit_code == EXIT_UNAVAILABLE and "lld-19" in str(exc.value)
    with pytest.raises(toolchain.ToolchainUnavailable):
        toolchain.ensure_rocm_shim()


@requires_toolchain
def test_rocm_shim_links_ld_lld_to_lld19(tmp_path):
    import os

    root = toolchain.ensure_rocm_shim(tmp_path)
    link = root / "llvm" / "bin" / "ld.lld"
    assert link.is_symlink() and os.readlink(link) == str(toolchain.find_lld())
    assert toolchain.ensure_rocm_shim(tmp_path) == root  # idempotent
    env = toolchain.compile_env("gfx950", cache_dir=tmp_path)
    assert env["ROCM_PATH"] == str(root) and env["COMPILE_ONLY"] == "1" and env["FLYDSL_GPU_ARCH"] == "gfx950"
    with pytest.raises(ValueError):
        toolchain.compile_env("gfx1100", cache_dir=tmp_path)
