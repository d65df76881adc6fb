"""The warp-specialized Gluon fp8 block-scale kernel for sm_90a (kernels/skillrun_kernels/fp8_blockscale_gemm/gluon_sm90.py).

Gluon kernels do not run in Triton's CPU interpreter, so on a CPU this file tests what can be
tested there: the host side (config validation with its reasons, resource estimates, the raster
order, the A-scale layout the TMA reads, the build protocol) and the compiled kernel itself
(compiled for sm_90a with the wheel's ptxas: no spills, the promote scheduled while the next wgmma
runs, register reallocation present, shared memory as estimated). The GPU tests (``gpu`` marker,
skipped without a device) check parity against the fp32 oracle on the card's shapes, M = 1 and
K = 768 included, and that the ablation twins run (the no-promote twin must NOT match).
"""
from __future__ import annotations

import pytest
import torch
from gluon_gpu import assert_lever_holds, assert_matches_oracle, run_twice
from gluon_gpu import seed as _seed

from skillrun_kernels.fp8_blockscale_gemm import gluon_sm90 as g
from skillrun_kernels.fp8_blockscale_gemm import problem
from skillrun_kernels.protocol import UnsupportedShape


# ---------------------------------------------------------------------------------------------
# Host side (plain Python)


def test_every_ablation_is_a_valid_config_and_differs_from_the_design_in_its_named_knob():
    design = g.ablation_config("design")
    assert (design.BM, design.BN, design.consumers, design.async_depth, design.promote) == (128, 128, 2, 1, True)
    for name, knobs in g.ABLATIONS.items():
        cfg = g.ablation_config(name)
        cfg.check()
        for k, v in knobs.items():
            assert getattr(cfg, k) == v and getattr(design, k) != v, (name, k)


@pytest.mark.parametrize("knobs,needle", [
    ({"consumers": 3}, "consumers=3"),
    ({"BN": 192}, "BN=192"),
    ({"async_depth": 2}, "async_depth=2"),
    ({"BN": 256}, "needs async_depth=0"),  # two 128-wide partials in flight: over the register budget
    ({"stages": 1}, "stages=1"),
    ({"stages": 6}, "exceed the sm_90 limit"),  # 6 x 32.5 KB ring + 32 KB staging > 227 KB
    ({"group_m": 0}, "group_m=0"),
    ({"consumer_regs": 236}, "multiple of 8"),
    ({"consumer_regs": 200}, "needs about"),  # 64 acc + 2 x 64 partials + addressing
    ({"consumer_regs": 256}, "leaves the producer"),
    ({"ctas_per_sm": 2}, "ctas_per_sm"),
    ({"a_scales": "smem"}, "a_scales='smem'"),
])
def test_bad_configs_are_rejected_with_the_reason(knobs, needle):
    with pytest.raises(ValueError, match="gluon_sm90 config") as err:
        g.Config.from_dict(knobs).check()
    assert needle in str(err.value)


def test_unknown_or_mistyped_config_keys_are_named():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['BM'\]"):
        g.Config.from_dict({"BM": 128})
    with pytest.raises(ValueError, match="stages='4' must be an integer"):
        g.Config.from_dict({"stages": "4"})
    with pytest.raises(ValueError, match="a_scales=1 must be a string"):
        g.Config.from_dict({"a_scales": 1})
    with pytest.raises(ValueError, match="promote=1 must be true or false"):
        g.Config.from_dict({"promote": 1})
    with pytest.raises(ValueError, match="unknown ablation"):
        g.ablation_config("no_such")


def test_shared_memory_estimate_counts_ring_staging_and_barriers():
    cfg = g.Config()  # 128x128, 5 stages, 2 consumers
    ring = 5 * (128 * 128 + 128 * 128 + 4 * 128)
    staging = 2 * 64 * 128 * 2
    assert cfg.smem_bytes() == ring + staging + 2 * 5 * 8
    wide = g.Config(BN=256, async_depth=0, stages=3)
    assert wide.NSUB == 2 and wide.SUB_N == 128
    assert wide.smem_bytes() == 3 * (128 * 128 + 256 * 128 + 512) + 2 * 2 * 64 * 128 * 2 + 48


def test_register_pool_fits_the_sm_and_the_producer_keeps_enough():
    for name in g.ABLATIONS:
        cfg = g.ablation_config(name)
        threads = 128 * (cfg.consumers + 1)
        assert cfg.maxnreg * threads <= g.REGISTER_FILE, name
        assert cfg.maxnreg % 8 == 0
    two = g.Config()
    assert (two.maxnreg, two.regs, two.producer_regs) == (168, 232, 40)  # DeepGEMM's split: 2 x 232 + 40


def test_problem_checks_name_the_dimension():
    assert g.check_problem({"M": 1, "N": 2112, "K": 7168}) == (1, 2112, 7168)
    with pytest.raises(UnsupportedShape, match="N=100 must be a multiple of 8"):
        g.check_problem({"M": 4, "N": 100, "K": 256})
    with pytest.raises(ValueError, match="K=200"):
        g.check_problem({"M": 4, "N": 128, "K": 200})
    with pytest.raises(ValueError, match="M=0"):
        g.build({"M": 0, "N": 128, "K": 256}, None, "cpu")


@pytest.mark.parametrize("M,N,BM,BN,group", [(1000, 2112, 128, 128, 8), (4096, 65536, 128, 128, 8), (300, 512, 64, 256, 3)])
def test_grouped_raster_visits_every_tile_once_in_groups(M, N, BM, BN, group):
    order = g.tile_order(M, N, BM, BN, group)
    num_m, num_n = -(-M // BM), -(-N // BN)
    assert sorted(order) == [(m, n) for m in range(num_m) for n in range(num_n)]
    # Consecutive tiles stay inside one band of `group` row-tiles until the band's columns are done.
    for t in range(len(order) - 1):
        (m0, n0), (m1, n1) = order[t], order[t + 1]
        if m0 // group == m1 // group:
            assert n1 >= n0
        else:
            assert m1 // group == m0 // group + 1


@pytest.mark.parametrize("M", [1, 3, 4, 130])
def test_a_scales_are_transposed_and_padded_to_a_16_byte_pitch(M):
    L = 6
    sa = torch.rand(M, L) + 0.5
    t = g.prepared_a_scales(sa, M)
    assert t.shape == (L, g.a_scale_rows(M)) and t.is_contiguous() and t.dtype == torch.float32
    assert (t.shape[1] * 4) % 16 == 0 and t.shape[1] >= M and t.shape[1] - M < 4
    assert torch.equal(t[:, :M], sa.t())
    assert torch.all(t[:, M:] == 0)  # rows past M read zero scales (their A rows are zero-filled too)


def test_build_returns_the_protocol_slot_with_the_kernel_name():
    kl = g.build({"M": 64, "N": 256, "K": 512}, {"stages": 4}, "cuda")
    assert kl.name == "gluon_sm90" and kl.expect_kernels == g.KERNEL_NAME
    assert kl.describe["config"]["stages"] == 4 and kl.describe["backend"] == "gluon"
    twin = g.build({"M": 64, "N": 256, "K": 512}, {"promote": False}, "cuda")
    assert "wrong numbers" in twin.describe["numerics"]
    with pytest.raises(ValueError, match="needs async_depth=0"):
        g.build({"M": 64, "N": 256, "K": 512}, {"BN": 256}, "cuda")


# ---------------------------------------------------------------------------------------------
# Compiled for sm_90a on this machine (no GPU)


def _compile(knobs: dict) -> dict:
    if g.GLUON_IMPORT_ERROR is not None:
        pytest.skip(f"this triton has no Gluon: {g.GLUON_IMPORT_ERROR}")
    try:
        return g.compile_only(None, knobs)
    except Exception as exc:  # noqa: BLE001 - a triton that cannot compile Gluon without a GPU
        if "driver" in str(exc).lower() and "cuda" in str(exc).lower():
            pytest.skip(f"this triton cannot compile Gluon without a GPU: {exc}")
        raise


def test_design_point_compiles_without_spills_and_overlaps_promote_with_wgmma():
    f = _compile({})
    assert f["spill_store_bytes"] == 0 and f["stack_bytes"] == 0 and f["sass_local_ld_st"] == 0, f
    assert f["ptxas_wgmma_serialized"] == [], f["ptxas_warnings"]
    # 4 fp8 m64n128k32 wgmma per 128-deep block, 4 issue sites (prologue, 2 in the pair loop, tail),
    # in each of the two consumer partitions.
    assert f["wgmma"] == 32 and f["sass_qgmma"] == 32
    # ptxas's final schedule: of the 5 promote sites per partition (2 in the pair loop, 2 in the
    # even-L tail, 1 in the odd-L tail) the 3 that have a next block issue all 64 FFMAs while that
    # block's QGMMA group runs, behind waits down to 1 outstanding, not 0.
    assert f["sass_ffma_while_qgmma_pending"] == 2 * 3 * 64
    assert f["sass_depbar"].get("1", 0) >= 6
    # register reallocation: consumers up to 232, the producer down to 40, from a 168 x 384 pool
    assert any(x.endswith("232") for x in f["setmaxnreg_ptx"]) and any(x.endswith("40") for x in f["setmaxnreg_ptx"])
    assert any("0xe8" in x for x in f["sass_setmaxnreg"]) and any("0x28" in x for x in f["sass_setmaxnreg"])
    assert f["regs"] == f["maxnreg"] == 168 and f["num_warps_total"] == 12
    # the estimate the host validation uses is within 1 KB of what the compiler allocated
    assert f["fits_smem"] and abs(f["shared_bytes"] - f["shared_estimate"]) < 1024
    assert f["sass_utmaldg"] == 3 and f["sass_utmastg"] == 2  # A, B, A-scale loads; one C store per consumer
    assert f["loop_barrier_ops"] > 0 and f["loop_invariant_barrier_ops"] == []


def test_no_promote_twin_releases_the_slot_of_each_block_not_the_tiles_first():
    """The H200 hang of the no_promote twin (async depth 1): its slot release inside the K loop
    indexed the barrier with a value the frontend did not carry through the loop (gluon_sm90._prev_slot),
    so every arrive of a tile hit the tile's first slot. Static check on the compiled TTGIR."""
    f = _compile(g.ABLATIONS["no_promote"])
    assert f["loop_barrier_ops"] >= 6, f  # per consumer: the ready wait and the release in the K loop (+ producer)
    assert f["loop_invariant_barrier_ops"] == []


def test_the_ring_index_check_flags_a_barrier_indexed_from_outside_its_loop():
    ttgir = """
      %r:2 = scf.for %tile = %a to %b step %c iter_args(%slot = %z, %phase = %z) -> (i32, i32)  : i32 {
        %acc:3 = scf.for %kb = %a to %L step %c iter_args(%slot_1 = %slot, %phase_2 = %phase, %x = %cst) -> (i32, i32, f32)  : i32 {
          %9 = ttg.memdesc_index %ready[%slot_1] : x
          ttng.wait_barrier %9, %phase_2, %true : x
          %10 = ttg.memdesc_index %empty[%slot] : x
          ttng.arrive_barrier %10, 1, %true : x
          %n = arith.addi %slot_1, %c : i32
          %11 = ttg.memdesc_index %empty[%n] : x
          ttng.arrive_barrier %11, 1, %true : x
          scf.yield %n, %phase_2, %x : i32, i32, f32
        } loc(#l1)
        %12 = ttg.memdesc_index %empty[%slot] : x
        ttng.arrive_barrier %12, 1, %true : x
        scf.yield %acc#0, %acc#1 : i32, i32
      } loc(#l2)
    """
    f = g.ring_index_facts(ttgir)
    assert f["loop_barrier_ops"] == 4  # the ready wait, the two arrives in the K loop, the tile-loop arrive
    assert len(f["loop_invariant_barrier_ops"]) == 1 and "%slot," in f["loop_invariant_barrier_ops"][0] + ","
    assert "line 7" in f["loop_invariant_barrier_ops"][0]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in g.ABLATIONS if n != "design"])
def test_ablation_variants_compile_without_spills(name):
    f = _compile(g.ABLATIONS[name])
    assert f["spill_store_bytes"] == 0 and f["sass_local_ld_st"] == 0, f
    assert f["ptxas_wgmma_serialized"] == [] and f["fits_smem"]
    assert f["loop_invariant_barrier_ops"] == []  # every ring barrier in a loop moves with the loop
    cfg = g.ablation_config(name)
    if not cfg.promote or cfg.async_depth == 0:
        assert f["sass_ffma_while_qgmma_pending"] == 0  # nothing to overlap (or nothing promoted)
    else:
        assert f["sass_ffma_while_qgmma_pending"] > 0


# ---------------------------------------------------------------------------------------------
# On a CUDA device (skipped here)

GPU_SHAPES = [
    (1, 7168, 2048), (1, 2112, 7168), (16, 2048, 7168), (64, 7168, 2048), (128, 2112, 7168),
    (300, 2048, 768), (1000, 2112, 1536), (2048, 7168, 768), (4096, 2048, 7168), (4096, 7168, 384),
]


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", GPU_SHAPES)
def test_gluon_matches_oracle_on_gpu(M, N, K):
    assert_matches_oracle(g, {"M": M, "N": N, "K": K}, None, _seed())


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in g.ABLATIONS if n != "design"])
def test_ablation_variants_on_gpu(name):
    # ragged M and N, K/128 = 6 (the tail of the pair loop); the twin ignores the scales: it must run
    # and write every element, and must NOT pass
    assert_lever_holds(g, name, {"M": 1000, "N": 2112, "K": 768}, _seed())


@pytest.mark.gpu
@pytest.mark.parametrize("K", [128, 384, 640])  # L = 1, 3 (odd), 5: every path of the unrolled K loop
def test_short_and_odd_k_on_gpu(K):
    seed = _seed()
    first, out, ref = run_twice(g, {"M": 200, "N": 384, "K": K}, None, seed)
    assert problem.rel_error(out, ref) < 3e-3, f"seed {seed}"


@pytest.mark.gpu
def test_one_wrong_block_scale_is_caught_on_gpu():
    seed = _seed()
    sd = {"M": 256, "N": 512, "K": 1024}
    x = problem.make_inputs(sd, seed, "cuda")
    kl = g.build(sd, None, "cuda")
    out = kl.run(kl.prepare(x), problem.output_like(sd, "cuda"))
    x["b_scale"][1, 3] *= 1.5  # the oracle now disagrees on one 128x128 block only
    assert problem.rel_error(out, problem.oracle(x)) > 3e-3, f"seed {seed}"


def test_config_schema_sidecar_names_exactly_the_config_fields():
    from dataclasses import fields

    import jsonschema

    from skillrun_kernels.fp8_blockscale_gemm import gluon_sm90_config as side

    assert set(side.CONFIG_SCHEMA["properties"]) == {f.name for f in fields(g.Config)}
    for name, knobs in g.ABLATIONS.items():  # every twin is a config the schema accepts
        jsonschema.validate({**g.Config().as_dict(), **knobs}, side.CONFIG_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"BN": 96}, side.CONFIG_SCHEMA)
