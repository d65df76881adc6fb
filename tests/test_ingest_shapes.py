"""skillrun.ingest.shapes: op dims/types → problem shape, dtype and scale recipe (pure functions)."""
from __future__ import annotations

import pytest

from skillrun.ingest import shapes
from skillrun.ingest.shapes import dtype_from_kernel_name, normalize_dtype, op_shape, shape_from_kernel_name

FP8 = "c10::Float8_e4m3fn"


def test_mm_addmm_bmm_linear():
    assert op_shape("aten::mm", [[8, 16], [16, 32]], ["c10::BFloat16"] * 2).shape == {"M": 8, "N": 32, "K": 16}
    assert op_shape("aten::addmm", [[32], [8, 16], [16, 32], [], []], ["c10::Half"] * 3).shape == {"M": 8, "N": 32, "K": 16}
    s = op_shape("aten::bmm", [[4, 8, 16], [4, 16, 32]], ["float", "float"])
    assert s.shape == {"batch": 4, "M": 8, "N": 32, "K": 16} and s.dtype == "fp32"
    s = op_shape("aten::linear", [[2, 5, 64], [128, 64], [128]], ["c10::BFloat16"] * 3)
    assert s.shape == {"M": 10, "N": 128, "K": 64} and s.dtype == "bf16"


def test_mismatched_inner_dims_give_no_shape():
    assert op_shape("aten::mm", [[8, 16], [17, 32]], ["float"] * 2).shape is None
    assert op_shape("aten::mm", [[8, 16]], ["float"]).shape is None
    assert op_shape("aten::mm", "garbage", None).shape is None


@pytest.mark.parametrize("sa,sb,recipe", [
    ([], [], "tensorwise"),
    ([1], [1, 1], "tensorwise"),
    ([2048, 1], [1, 7168], "rowwise"),
    ([2048, 32], [32, 56], "blockwise_1x128_128x128"),
    ([2048, 7], [3, 3], None),
])
def test_scaled_mm_recipes(sa, sb, recipe):
    s = op_shape("aten::_scaled_mm", [[2048, 4096], [4096, 7168], sa, sb, [], [], [], []],
                 [FP8, FP8, "float", "float", "", "", "Scalar", "Scalar"], ["", "", "", "", "", "", "15", "False"])
    assert s.shape == {"M": 2048, "N": 7168, "K": 4096}
    assert s.scale_recipe == recipe and s.dtype == "fp8_e4m3" and s.out_dtype == "bf16"


def test_fnuz_and_other_types():
    assert normalize_dtype("c10::Float8_e4m3fnuz") == "fp8_e4m3_fnuz"
    assert normalize_dtype("c10::Float8_e5m2") == "fp8_e5m2"
    assert normalize_dtype("c10::BFloat16") == "bf16"
    assert normalize_dtype("long int") == "int64"
    assert normalize_dtype("Scalar") is None and normalize_dtype("") is None and normalize_dtype(None) is None


def test_scaled_grouped_mm_batch():
    s = op_shape("aten::_scaled_grouped_mm", [[8, 128, 512], [8, 512, 256], [8, 128], [8, 256]], [FP8, FP8])
    assert s.shape == {"batch": 8, "M": 128, "N": 256, "K": 512} and s.scale_recipe == "rowwise"
    s = op_shape("aten::_scaled_grouped_mm", [[1000, 512], [8, 512, 256], [1000], [8, 256]], [FP8, FP8])
    assert s.shape == {"M": 1000, "N": 256, "K": 512, "experts": 8}


def test_aiter_blockscale_and_moe_rules():
    s = op_shape("aiter::gemm_a8w8_blockscale", [[4096, 1536], [65536, 1536], [4096, 12], [512, 12], [4096, 65536]],
                 [FP8, FP8, "float", "float", "c10::BFloat16"])
    assert s.shape == {"M": 4096, "N": 65536, "K": 1536} and s.scale_recipe == "blockwise_1x128_128x128"
    s = op_shape("vllm::fused_moe", [[64, 7168], [256, 4096, 7168], [256, 7168, 2048], [64, 8]], ["c10::BFloat16"] * 4)
    assert s.shape == {"tokens": 64, "model_dim": 7168, "experts": 256, "inter_dim": 2048, "topk": 8}
    assert op_shape("vllm::fused_moe", [[64, 7168], [256, 4096, 7000]], ["c10::BFloat16"] * 2).shape is None


def test_extension_point():
    @shapes.register_op_rule("mylib::gemm")
    def _rule(dims, types, concrete):
        return shapes.OpShape(shape={"M": dims[0][0], "N": 1, "K": 1}, dtype="int8")

    assert op_shape("mylib::gemm", [[5, 3]], []).shape == {"M": 5, "N": 1, "K": 1}


def test_unknown_op_keeps_first_tensor_dtype():
    s = op_shape("aten::mul", [[], [3, 4]], ["Scalar", "c10::Half"])
    assert s.shape is None and s.dtype == "fp16"


@pytest.mark.parametrize("name,dt", [
    ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1", "fp8_e4m3"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "bf16"),
    ("void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemmMultiD_ABScale_xdl_cshuffle_v3<ck::f8_fnuz_t, ck::f8_fnuz_t>>",
     "fp8_e4m3_fnuz"),
    ("nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT", "fp8"),
    ("nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN", None),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64", None),
    ("triton_poi_fused_mul_silu_0", None),
])
def test_dtype_from_kernel_name(name, dt):
    assert dtype_from_kernel_name(name) == dt


def test_deepgemm_names():
    assert shape_from_kernel_name("void deep_gemm::fp8_gemm_kernel<4096u, 7168u, 128u, 128u>(x)").shape == {"N": 4096, "K": 7168}
    s = shape_from_kernel_name("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(cute::UMMA::Major)0, 0u, 4096u, 7168u, 1u>(f)")
    assert s.shape == {"N": 4096, "K": 7168}
    assert shape_from_kernel_name("void deep_gemm::sm90_fp8_gemm_1d2d_impl<512u, 4096u, 7168u, 1u>(f)").shape == \
        {"M": 512, "N": 4096, "K": 7168}
    assert shape_from_kernel_name("nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN") is None
