"""Formats with no public sample: synthetic fixtures (tests/fixtures/make_fixtures.py) built
around real kernel names, plus format sniffing from content."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from skillrun.errors import InputError
from skillrun.ingest import detect_format, ingest

FIX = Path(__file__).resolve().parent / "fixtures"
REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "schemas" / "profile.schema.json").read_text())
CIJK = "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64"

AMD_CSVS = {
    "rocprofv3_kernel_trace_new.synthetic.csv": "rocprofv3_csv",
    "rocprofv3_kernel_trace_old.synthetic.csv": "rocprofv3_csv",
    "rocpd_convert.synthetic.csv": "rocpd_csv",
    "rocprof_v1_results.synthetic.csv": "rocprof_v1_csv",
    "rocprof_kernel_stats.synthetic.csv": "rocprof_stats_csv",
}


@pytest.mark.parametrize("name,fmt", sorted(AMD_CSVS.items()))
def test_amd_csv_flavours_rank_the_same(name, fmt, tmp_path):
    # Copy under a misleading name: detection must not look at the file name.
    p = tmp_path / "trace.json"
    shutil.copy(FIX / name, p)
    assert detect_format(p) == fmt
    prof = ingest(p)
    assert prof.format == fmt
    assert prof.kernel_calls == 10
    assert prof.total_kernel_us == pytest.approx(357.0)  # 4×52 + 4×31 + 2×12.5 µs
    top = prof.kernels[0]
    assert top.name.startswith(CIJK) and top.calls == 4
    assert top.pct_gpu == pytest.approx(100 * 208 / 357, abs=1e-3)
    assert prof.kernels[2].name.startswith("attn_fwd")
    jsonschema.validate(prof.model_dump(mode="json"), SCHEMA)


def test_rocprof_trace_csv_grid_is_converted_to_workgroups():
    prof = ingest(FIX / "rocprofv3_kernel_trace_new.synthetic.csv")
    top = prof.kernels[0]
    assert top.block == [256, 1, 1] and top.grid == [256, 1, 1]  # 65536 work-items / 256
    assert prof.devices[0].index == 4  # "Agent 4"
    assert prof.arch == "gfx942" and any("ISA tags" in w for w in prof.warnings)


def test_rocpd_sqlite_uuid_tables():
    p = FIX / "rocpd.synthetic.db"
    assert detect_format(p) == "rocpd_sqlite"
    prof = ingest(p)
    assert prof.arch == "gfx950" and not prof.warnings
    assert prof.devices[0].name == "AMD Instinct MI350X" and prof.devices[0].index == 2
    assert prof.kernels[0].name.startswith(CIJK) and prof.kernels[0].device == 2
    assert prof.total_kernel_us == pytest.approx(357.0)
    jsonschema.validate(prof.model_dump(mode="json"), SCHEMA)


def test_nsys_stats_csv_with_processing_lines():
    p = FIX / "nsys_cuda_gpu_kern_sum.synthetic.csv"
    assert detect_format(p) == "nsys_stats_csv"
    prof = ingest(p)
    assert [k.name for k in prof.kernels] == ["nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN",
                                             "nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT",
                                             "triton_poi_fused_mul_silu_0"]
    assert prof.kernels[0].calls == 3 and prof.kernels[0].total_us == pytest.approx(455.04)
    assert prof.kernels[1].pct_gpu == pytest.approx(35.127, abs=1e-3)
    jsonschema.validate(prof.model_dump(mode="json"), SCHEMA)


def test_ck_blockscale_kineto_on_gfx950():
    prof = ingest(FIX / "kineto_gfx950_ck_blockscale.synthetic.json")
    assert prof.arch == "gfx950" and prof.devices[0].name == "AMD Instinct MI355X" and not prof.warnings
    top = prof.kernels[0]
    assert top.name.startswith("void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemmMultiD_ABScale_xdl_cshuffle_v3<")
    assert top.shape_provenance == "trace" and top.unattributed_us == 0
    got = {(o.shape["M"], o.shape["N"], o.shape["K"]) for o in top.ops}
    assert got == {(4096, 65536, 1536), (16384, 7168, 768)}
    assert all(o.op == "aiter::gemm_a8w8_blockscale" and o.dtype == "fp8_e4m3"
               and o.scale_recipe == "blockwise_1x128_128x128" and o.calls == 3 for o in top.ops)
    pre = prof.kernels[1]
    assert pre.name.startswith("_ZN2ck59kernel_gemm_xdl_cshuffle_v3_multi_d_blockscale_b_preshuffle")
    assert [(o.shape, o.dtype) for o in pre.ops] == [({"M": 4096, "N": 2048, "K": 7168}, "fp8_e4m3")]
    assert prof.linked_calls == prof.kernel_calls == 12
    jsonschema.validate(prof.model_dump(mode="json"), SCHEMA)


def test_fixture_generator_is_deterministic(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_fixtures", FIX / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "HERE", tmp_path)
    mod.main()
    for f in tmp_path.iterdir():
        if f.suffix == ".db":
            continue  # SQLite pages may differ byte-wise; its content is checked by ingestion tests
        assert f.read_bytes() == (FIX / f.name).read_bytes(), f.name


def test_kineto_detected_without_trace_extension(tmp_path):
    p = tmp_path / "results.csv"
    shutil.copy(FIX / "kineto_gfx950_ck_blockscale.synthetic.json", p)
    assert detect_format(p) == "kineto_json"


def test_deepgemm_shape_from_kernel_name(tmp_path):
    name = "void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 7168u, 2048u, 1u, 128u, 160u, 128u, 128u, 5u, 5u>(float*)"
    doc = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 1.0, "dur": 50.0,
                            "args": {"device": 0, "stream": 7, "correlation": 9}}]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    prof = ingest(p)
    k = prof.kernels[0]
    assert k.shape_provenance == "kernel-name" and k.unattributed_us == 0
    assert k.ops[0].shape == {"N": 7168, "K": 2048} and k.ops[0].provenance == "kernel-name"
    assert k.ops[0].dtype == "fp8_e4m3"


def test_bare_event_array_is_a_kineto_trace(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps([{"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 0, "ts": 0, "dur": 3},
                             {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 0, "ts": 5, "dur": 1}]))
    prof = ingest(p)
    assert [k.name for k in prof.kernels] == ["k1", "k2"] and prof.kernels[0].pct_gpu == 75.0


def test_unknown_json_is_refused_with_its_keys(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"foo": 1, "bar": [1, 2]}))
    with pytest.raises(InputError) as e:
        ingest(p)
    assert '"foo", "bar"' in str(e.value) and str(p) in str(e.value)


def test_csv_headers_are_case_insensitive(tmp_path):
    src = (FIX / "rocprofv3_kernel_trace_new.synthetic.csv").read_text().splitlines()
    p = tmp_path / "k.csv"
    p.write_text("\n".join([src[0].upper()] + src[1:]) + "\n")
    assert detect_format(p) == "rocprofv3_csv"
    assert ingest(p).total_kernel_us == pytest.approx(357.0)


def test_rocprofv2_csv(tmp_path):
    p = tmp_path / "results.csv"
    p.write_text("Dispatch_ID,GPU_ID,Queue_ID,PID,TID,Grid_Size,Workgroup_Size,LDS_Per_Workgroup,Scratch_Per_Workitem,"
                 "Arch_VGPR,Accum_VGPR,SGPR,Wave_Size,Kernel_Name,Start_Timestamp,End_Timestamp,Correlation_ID\n"
                 f'1,2,0,9,9,65536,256,0,0,128,0,64,64,"{CIJK}.kd",1000,51000,1\n'
                 f'2,2,0,9,9,65536,256,0,0,128,0,64,64,"{CIJK}.kd",60000,90000,2\n'
                 '3,2,0,9,9,4096,128,0,0,64,0,32,64,"attn_fwd.kd",100000,120000,3\n')
    assert detect_format(p) == "rocprof_v2_csv"
    prof = ingest(p)
    assert prof.kernels[0].name == CIJK + ".kd" and prof.kernels[0].total_us == pytest.approx(80.0)
    assert prof.kernels[0].grid == [256, 1, 1] and prof.kernels[0].device == 2


def test_ncu_units_and_thousands_separators(tmp_path):
    head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
            '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
    rows = ['"0","1","p","h","k_ms","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","SOL","Duration","msecond","1.5"',
            '"0","1","p","h","k_ms","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","SOL","DRAM Frequency","hz","3,198,488"',
            '"1","1","p","h","k_ns","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","SOL","Duration","nsecond","90,336"',
            '"2","1","p","h","k_us","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","SOL","Duration","usecond","12.25"']
    p = tmp_path / "ncu.csv"
    p.write_text("==PROF== Connected to process 1\nsome app output\n" + head + "\n" + "\n".join(rows) + "\n")
    assert detect_format(p) == "ncu_csv"
    prof = ingest(p)
    got = {k.name: k.total_us for k in prof.kernels}
    assert got == {"k_ms": pytest.approx(1500.0), "k_ns": pytest.approx(90.336), "k_us": pytest.approx(12.25)}
    assert prof.arch == "sm_90" and prof.kernels[0].block == [128, 1, 1]


def test_kernels_with_graph_id_count_as_graph_replays(tmp_path):
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": i * 10.0, "dur": 2.0,
           "args": {"device": 0, "correlation": 100 + i, "graph id": 3, "graph node id": i}} for i in range(4)]
    p = tmp_path / "g.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    prof = ingest(p)
    assert prof.graph_replay.detected and prof.graph_replay.kernel_calls == 4 and prof.graph_replay.launches == 0
    assert prof.kernels[0].graph_replayed_calls == 4 and prof.kernels[0].unattributed_us == pytest.approx(8.0)
