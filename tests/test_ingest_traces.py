"""Ingestion of every real trace in ../shared/traces: properties measured on these files.

The numbers asserted here were measured by running the readers on the fixtures (see the
report in the ingestion commit); each one breaks if ranking, linking or parsing breaks.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import jsonschema
import pytest

from conftest import traces_dir
from skillrun.ingest import ingest
from skillrun.models import Profile

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "schemas" / "profile.schema.json").read_text())
TRACES = traces_dir()
pytestmark = pytest.mark.skipif(TRACES is None, reason="../shared/traces is not present (set SKILLRUN_TRACES)")


def _all_trace_files() -> list[Path]:
    if TRACES is None:
        return []
    return sorted(p for p in TRACES.rglob("*") if p.is_file() and p.name != "README.md")


@functools.lru_cache(maxsize=None)
def prof(rel: str) -> Profile:
    return ingest(TRACES / rel)


def kernel(p: Profile, prefix: str):
    return next(k for k in p.kernels if k.name.startswith(prefix))


@pytest.mark.parametrize("path", _all_trace_files(), ids=lambda p: p.name)
def test_every_shared_trace_ingests_and_validates(path: Path):
    p = prof(str(path.relative_to(TRACES)))
    assert p.kernels, "no kernels read"
    assert p.kernel_calls == sum(k.calls for k in p.kernels)
    assert abs(sum(k.pct_gpu for k in p.kernels) - 100.0) < 0.05
    assert [k.total_us for k in p.kernels] == sorted((k.total_us for k in p.kernels), reverse=True)
    assert abs(p.total_kernel_us - sum(k.total_us for k in p.kernels)) < 1e-3 * max(1, len(p.kernels))
    jsonschema.validate(p.model_dump(mode="json"), SCHEMA)


def _plain_kernel_sum(rel: str) -> tuple[float, int]:
    import gzip

    doc = json.load(gzip.open(TRACES / rel))
    ks = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    return sum(e["dur"] for e in ks), len(ks)


KINETO = ["pytorch_kineto/" + n for n in (
    "amd_mi250_rocm6.2_minitoy_train.hta.json.gz", "amd_mi300x_qwen1.5-0.5b_bf16.tracelens.json.gz",
    "amd_mi300x_sglang_qwen3-8b_decode_hipgraph.tracelens.json.gz", "amd_mi300x_torch_compile_triton.tracelens.json.gz",
    "nvidia_a100_alexnet_old_int_ts.hta.json.gz", "nvidia_a100_triton_example.hta.json.gz",
    "nvidia_h100_qwen1.5-0.5b_bf16.tracelens.json.gz", "nvidia_h200_fp8_scaled_mm_torch2.11.generated.json.gz")]


@pytest.mark.parametrize("rel", KINETO)
def test_kineto_totals_equal_plain_sum_of_kernel_durations(rel):
    total, n = _plain_kernel_sum(rel)
    p = prof(rel)
    assert p.kernel_calls == n
    assert p.total_kernel_us == pytest.approx(total, abs=1e-3)


def test_mi300x_qwen_top_kernel_and_links():
    p = prof("pytorch_kineto/amd_mi300x_qwen1.5-0.5b_bf16.tracelens.json.gz")
    top = p.kernels[0]
    assert top.name.startswith("Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64")
    assert "ISA942" in top.name
    assert top.pct_gpu == pytest.approx(21.13, abs=0.01)
    # 1053 of 1516 kernel calls reach an op with Input Dims; the other 463 have neither an
    # External id nor a runtime event with their correlation id (launched outside the CPU window).
    assert (p.linked_calls, p.kernel_calls) == (1053, 1516)
    assert p.arch == "gfx942" and any("inferred from the device name" in w for w in p.warnings)
    shapes = {(o.op, tuple(sorted(o.shape.items()))) for o in top.ops if o.shape}
    assert ("aten::addmm", (("K", 1024), ("M", 8944), ("N", 1024))) in shapes
    assert top.shape_provenance == "trace"
    assert all(o.dtype == "bf16" for o in top.ops if o.op in ("aten::mm", "aten::addmm"))


def test_h100_qwen_top_kernel_and_links():
    p = prof("pytorch_kineto/nvidia_h100_qwen1.5-0.5b_bf16.tracelens.json.gz")
    top = p.kernels[0]
    assert top.name.startswith("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64")
    assert top.pct_gpu == pytest.approx(28.15, abs=0.01)
    assert (p.linked_calls, p.kernel_calls) == (1029, 1465)
    assert p.arch == "sm_90" and p.devices[0].name == "NVIDIA H100 80GB HBM3" and p.devices[0].sm_count == 132
    # 168 of its 241 calls link to aten::mm/addmm; 73 ran outside the CPU-traced window.
    assert sum(o.calls for o in top.ops if o.provenance == "trace") == 168 and top.calls == 241
    assert top.unattributed_us == pytest.approx(3935.211, abs=1e-3)
    assert p.unattributed_us == pytest.approx(sum(k.unattributed_us for k in p.kernels), abs=0.01)


def test_h200_scaled_mm_shapes_dtypes_and_recipes():
    p = prof("pytorch_kineto/nvidia_h200_fp8_scaled_mm_torch2.11.generated.json.gz")
    assert p.arch == "sm_90"
    assert (p.linked_calls, p.kernel_calls) == (18, 24)
    tw = kernel(p, "nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT")
    rw = kernel(p, "nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT")
    bf = kernel(p, "nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN")
    mnk = {"M": 2048, "N": 7168, "K": 4096}
    (op_tw,) = [o for o in tw.ops if o.provenance == "trace"]
    assert (op_tw.op, op_tw.shape, op_tw.dtype, op_tw.scale_recipe) == ("aten::_scaled_mm", mnk, "fp8_e4m3", "tensorwise")
    assert op_tw.input_types[:2] == ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn"]
    (op_rw,) = rw.ops
    assert (op_rw.op, op_rw.shape, op_rw.dtype, op_rw.scale_recipe) == ("aten::_scaled_mm", mnk, "fp8_e4m3", "rowwise")
    assert op_rw.input_dims[2:4] == [[2048, 1], [1, 7168]]
    (op_bf,) = bf.ops
    assert (op_bf.op, op_bf.shape, op_bf.dtype) == ("aten::mm", mnk, "bf16")
    # 3 of the 6 tensorwise calls are CUDA-graph replays: counted, never linked, time unattributed.
    assert tw.calls == 6 and tw.graph_replayed_calls == 3 and op_tw.calls == 3
    assert tw.unattributed_us == pytest.approx(272.768, abs=1e-3)
    assert p.graph_replay.detected and p.graph_replay.launches == 3 and p.graph_replay.kernel_calls == 3
    # The user Triton kernel has no External id and its launch lies outside any op: unresolved.
    assert kernel(p, "scale2x_kernel").shape_provenance == "unresolved"
    silu = kernel(p, "triton_poi_fused_mul_silu_0")
    assert silu.ops[0].op == "triton_poi_fused_mul_silu_0" and silu.shape_provenance == "trace"


def test_sglang_hip_graph_replay_detected():
    p = prof("pytorch_kineto/amd_mi300x_sglang_qwen3-8b_decode_hipgraph.tracelens.json.gz")
    assert p.graph_replay.detected and p.graph_replay.launches == 1
    assert p.graph_replay.kernel_calls == 544 and p.kernel_calls == 555
    assert p.linked_calls == 8
    top = p.kernels[0]
    assert top.name.startswith("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64")
    assert top.graph_replayed_calls == top.calls == 36 and top.shape_provenance == "unresolved"
    assert top.unattributed_us == top.total_us
    assert any(k.name.startswith("void paged_attention_ll4mi_QKV_mfma16_kernel") for k in p.kernels[:3])


def test_alexnet_old_trace_links_by_time_nesting():
    # Old Kineto: runtime External ids equal the correlation and match no op, and no op has dims.
    p = prof("pytorch_kineto/nvidia_a100_alexnet_old_int_ts.hta.json.gz")
    assert p.kernel_calls == 79 and p.linked_calls == 0
    top = p.kernels[0]
    assert top.name == "ampere_sgemm_32x32_sliced1x4_tn" and top.pct_gpu == pytest.approx(24.51, abs=0.01)
    assert [o.op for o in top.ops] == ["aten::addmm"] and top.ops[0].provenance == "unresolved"
    assert p.arch == "sm_80"


def test_mi250_arch_from_device_properties_is_flagged():
    # "AMD Radeon Graphics", no gcnArchName: HIP's compute capability 9.0 with 104 CUs says gfx90a
    # (the ISA90a tags in its hipBLASLt kernel names agree), flagged as inferred.
    p = prof("pytorch_kineto/amd_mi250_rocm6.2_minitoy_train.hta.json.gz")
    assert p.arch == "gfx90a"
    assert any("compute capability 9.0" in w and "104 CUs" in w for w in p.warnings)
    assert p.linked_calls == p.kernel_calls == 14


def test_arch_argument_overrides_trace():
    p = ingest(TRACES / "pytorch_kineto/nvidia_h200_fp8_scaled_mm_torch2.11.generated.json.gz", arch="sm_100")
    assert p.arch == "sm_100" and any("overridden" in w for w in p.warnings)


def test_rocprofv3_json_mi350x():
    p = prof("rocprofv3/amd_mi350x_rocprofv3_kernel_trace_results.json.gz")
    assert p.format == "rocprofv3_json" and p.arch == "gfx950"
    assert p.kernel_calls == 43915
    top = p.kernels[0]
    assert top.name.startswith("ncclDevKernel_Generic_1") and top.pct_gpu == pytest.approx(93.63, abs=0.01)
    assert len(p.devices) == 8 and all(d.arch == "gfx950" and d.name == "AMD Instinct MI350X" for d in p.devices)
    # One rank of an 8-GPU node: all dispatches ran on the agent with logical node id 2.
    assert {k.device for k in p.kernels} == {2}


def test_nsys_sqlite_a100_cloverleaf():
    p = prof("nsys/nvidia_a100_cloverleaf_nsys2024.5_export.sqlite")
    assert p.format == "nsys_sqlite" and p.arch == "sm_80"
    assert p.kernel_calls == 1312 and p.total_kernel_us == pytest.approx(294404.54, abs=0.01)
    assert p.kernels[0].name.startswith("void clover::par_ranged2d_kernel<PdV_kernel(")
    assert {d.name for d in p.devices} == {"NVIDIA A100-SXM4-80GB"} and len(p.devices) == 4


def test_ncu_csv_durations():
    p = prof("ncu/nvidia_h200_fp8_scaled_mm_ncu_details.generated.csv")
    assert p.format == "ncu_csv" and p.arch == "sm_90" and p.kernel_calls == 8
    bf = kernel(p, "nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN")
    assert bf.calls == 2 and bf is p.kernels[0]
    # Durations are summed from the "Duration" metric rows ("90,336"-style values, ns → µs).
    assert p.total_kernel_us == pytest.approx(706.624, abs=1e-3)


def test_metadata_is_never_copied():
    for rel in ("pytorch_kineto/nvidia_h100_qwen1.5-0.5b_bf16.tracelens.json.gz",
                "rocprofv3/amd_mi350x_rocprofv3_kernel_trace_results.json.gz",
                "nsys/nvidia_a100_cloverleaf_nsys2024.5_export.sqlite"):
        text = json.dumps(prof(rel).model_dump(mode="json"))
        for needle in ("redacted", "HF_TOKEN", "base_image", "docker.io", "nccl_version", "command", "PMI_"):
            assert needle not in text, (rel, needle)
