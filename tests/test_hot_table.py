"""The hot-kernel table: snapshots at 80 and 160 columns on a real trace slice with long C++ template
names, names that never look alike, throughput from recovered shapes, categories, idle time, and
per-device shares on multi-GPU traces."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import traces_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from skillrun.analysis.peaks import DEFAULT_PEAKS
from skillrun.analysis.hot_table import hot_kernels, render
from skillrun.ingest import ingest
from skillrun.ingest.names import demangle_many, display_names, kernel_category

REPO = Path(__file__).resolve().parents[1]
SLICE = REPO / "tests" / "fixtures" / "rocprofv3_mi350x_subset.real.json.gz"
EXAMPLE = REPO / "runner" / "skillrun" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz"
SNAP = REPO / "tests" / "snapshots"


def _kernels_table(path: Path, columns: int, *extra: str) -> str:
    env = dict(os.environ, COLUMNS=str(columns), NO_COLOR="1", TERM="dumb")
    res = subprocess.run([sys.executable, "-m", "skillrun", "kernels", str(path), "--top", "14", *extra],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize("columns", [80, 160])
def test_hot_table_snapshot(columns):
    text = _kernels_table(SLICE, columns)
    snap = SNAP / f"hot_table_rocprofv3_{columns}.txt"
    if os.environ.get("SKILLRUN_UPDATE_SNAPSHOTS"):
        snap.parent.mkdir(exist_ok=True)
        snap.write_text(text)
    assert text == snap.read_text(), f"table changed; rerun with SKILLRUN_UPDATE_SNAPSHOTS=1 if intended\n{text}"
    lines = text.splitlines()
    rule = [i for i, ln in enumerate(lines) if ln.startswith("─")][0]
    col = lines[rule - 1].index("kernel")
    table = lines[rule + 1:]
    assert all(len(ln) <= columns for ln in table), max(table, key=len)
    names = [ln[col:].strip() for ln in table if ln[:3].strip().isdigit()]
    assert len(names) == 14 and len(set(names)) == 14  # different kernels never look alike


def test_wide_prints_names_whole():
    text = _kernels_table(SLICE, 80, "--wide")
    prof = ingest(SLICE)
    for k in prof.kernels:
        full = (k.demangled or k.name).removesuffix(" [clone .kd]").removesuffix(".kd")
        assert full in text, full


def test_slice_breakdown_says_communication_and_idle():
    prof = ingest(SLICE)
    data = hot_kernels(prof, 14)
    cats = {c["category"]: c for c in data["categories"]}
    assert set(cats) >= {"communication", "gemm", "elementwise", "memcpy"}
    nccl = next(r for r in data["kernels"] if r["name"].startswith("ncclDevKernel"))
    assert nccl["category"] == "communication" and not nccl["offered_to_cards"]
    # Idle = span - union of intervals, recomputed here from the raw dispatches.
    import gzip

    doc = json.loads(gzip.decompress(SLICE.read_bytes()))
    ivs = sorted((d["start_timestamp"], d["end_timestamp"]) for d in doc["rocprofiler-sdk-tool"][0]["buffer_records"]["kernel_dispatch"])
    busy, cur_s, cur_e = 0, *ivs[0]
    for s, e in ivs[1:]:
        if s > cur_e:
            busy, cur_s, cur_e = busy + cur_e - cur_s, s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = max(e for _, e in ivs) - ivs[0][0]
    (dev,) = data["devices"]
    assert dev["idle_ms"] == pytest.approx((span - busy) / 1e6, rel=1e-6)
    assert dev["span_ms"] == pytest.approx(span / 1e6, rel=1e-6)
    for r in data["kernels"]:
        assert r["min_us"] <= r["mean_us"] <= r["max_us"]


def test_achieved_tflops_from_the_recovered_gemm_shape_and_the_device_peak():
    prof = ingest(EXAMPLE)
    data = hot_kernels(prof, None)
    gemm = [r for r in data["kernels"] if r["category"] == "gemm" and r["achieved"].get("tflops")]
    assert gemm, [(r["op"], r["category"]) for r in data["kernels"]]
    r = gemm[0]
    k = next(k for k in prof.kernels if k.name == r["name"])
    flops = sum(2 * o.shape["M"] * o.shape["N"] * o.shape["K"] * o.calls for o in k.ops if o.shape)
    secs = sum(o.total_us for o in k.ops if o.shape) * 1e-6
    assert r["achieved"]["tflops"] == pytest.approx(flops / secs / 1e12, rel=1e-3)
    peak, key = DEFAULT_PEAKS.lookup("NVIDIA H200", "sm_90").flops_peak(r["dtype"])
    assert key == "fp8" and r["dtype"].startswith("fp8")  # _scaled_mm on e4m3 inputs: the fp8 peak
    assert r["achieved"]["pct_peak"] == pytest.approx(100 * r["achieved"]["tflops"] / peak, abs=0.1)


def _two_gpu_trace(tmp_path: Path) -> Path:
    """Rank 0 spends 900 µs in a GEMM and 100 µs in NCCL; rank 1 spends 100 µs in the GEMM and
    300 µs in a norm, with a 600 µs gap."""
    ev = []

    def k(name, dev, ts, dur, corr):
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": dev, "tid": 7, "ts": ts, "dur": dur,
                   "args": {"device": dev, "correlation": corr, "stream": 7}})

    k("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_kernel", 0, 0.0, 900.0, 1)
    k("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 0, 900.0, 100.0, 2)
    k("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_kernel", 1, 0.0, 100.0, 3)
    k("void at::native::layer_norm_kernel<float>(int)", 1, 700.0, 300.0, 4)
    p = tmp_path / "two_gpu.json"
    p.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [
        {"id": 0, "name": "NVIDIA H200", "computeMajor": 9, "computeMinor": 0, "numSms": 132},
        {"id": 1, "name": "NVIDIA H200", "computeMajor": 9, "computeMinor": 0, "numSms": 132}], "traceEvents": ev}))
    return p


def test_multi_gpu_shares_are_per_device_not_pooled(tmp_path):
    prof = ingest(_two_gpu_trace(tmp_path))
    by = {k.name: k for k in prof.kernels}
    norm = by["void at::native::layer_norm_kernel<float>(int)"]
    # 300 µs of rank 1's 400 µs: 75 %, although it is 300/1400 = 21 % of the pooled time.
    assert norm.pct_gpu == pytest.approx(75.0)
    gemm = by["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_kernel"]
    assert gemm.device_pct == {0: pytest.approx(90.0), 1: pytest.approx(25.0)} and gemm.pct_gpu == pytest.approx(90.0)
    data = hot_kernels(prof, None)
    devs = {d["device"]: d for d in data["devices"]}
    assert devs[0]["kernel_ms"] == pytest.approx(1.0) and devs[1]["kernel_ms"] == pytest.approx(0.4)
    assert devs[0]["idle_ms"] == pytest.approx(0.0) and devs[1]["idle_ms"] == pytest.approx(0.6)
    assert devs[1]["idle_pct"] == pytest.approx(60.0)
    assert {c["category"] for c in data["categories"]} == {"gemm", "communication", "reduction"}
    from skillrun.analysis.hot_table import breakdown_lines

    lines = breakdown_lines(data)
    assert any("GPU0: 1.000 ms" in ln for ln in lines) and any("GPU1: 0.400 ms" in ln and "idle 0.600" in ln for ln in lines)


def test_communication_kernels_are_never_offered_to_cards(tmp_path):
    from skillrun import api
    from skillrun.plan.match import match_kernel

    idx = api.load_index()
    card = idx.skill("flydsl_fp8_blockscale_gemm")
    # A collective whose name happens to contain what the card's regex looks for.
    ev = [{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_gemm_a8w8_blockscale_AllGather", "pid": 0, "tid": 1,
           "ts": 0.0, "dur": 1000.0, "args": {"device": 0, "correlation": 1}}]
    p = tmp_path / "nccl.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    prof = api.ingest_profile(p, arch="gfx950")
    k = prof.kernels[0]
    assert k.category == "communication"
    assert match_kernel(card, k, "gfx950").criteria[0].passed  # the regex alone would have matched
    rep = api.match(prof, idx)
    assert not rep.matches and not rep.near_misses and rep.communication == [k.name]


# ---------------------------------------------------------------------------------------- names
def test_demangles_in_process():
    out = demangle_many(["_ZN5aiter24add_rmsnorm_quant_kernelEv", "not_mangled", "_Zgarbage"])
    assert out["_ZN5aiter24add_rmsnorm_quant_kernelEv"] == "aiter::add_rmsnorm_quant_kernel()"
    assert out["not_mangled"] == "not_mangled" and out["_Zgarbage"] == "_Zgarbage"


@pytest.mark.parametrize("name, cat", [
    ("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("__amd_rocclr_copyBuffer", "memcpy"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1", "gemm"),
    ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "reduction"),
    ("triton_poi_fused_mul_silu_0", "elementwise"),
    ("clover::par_ranged2d_kernel<PdV_kernel>", "other"),
])
def test_categories(name, cat):
    assert kernel_category(name) == cat


_part = st.text(alphabet="abcdefghij_:<>, 0123456789", min_size=0, max_size=60)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_part, _part, _part), min_size=2, max_size=8, unique=True), st.integers(min_value=8, max_value=90))
def test_display_names_never_collide_and_fit(parts, width):
    prefix = "void at::native::vectorized_elementwise_kernel<4, at::native::"
    names = list(dict.fromkeys(prefix + a + "<" + b + ">(" + c + ")" for a, b, c in parts))
    shown = display_names(names, width)
    assert len(set(shown)) == len(names)
    assert all(len(s) <= max(8, width) for s in shown)


def test_render_fits_the_width_it_is_given():
    from rich.console import Console

    prof = ingest(SLICE)
    data = hot_kernels(prof, 14)
    for width in (60, 80, 100, 160, 240):
        c = Console(width=width, record=True, file=open(os.devnull, "w"))
        c.print(render(data, width))
        assert max(len(ln) for ln in c.export_text().splitlines()) <= width


# ------------------------------------------------------------------------- per-shape rows (#27)
def test_bundled_example_gets_a_row_per_shape_with_its_own_rate():
    prof = ingest(EXAMPLE)
    data = hot_kernels(prof, None)
    top = data["kernels"][0]
    shapes = [(s["shape"]["M"], s["shape"]["N"], s["shape"]["K"]) for s in top["shapes"]]
    assert shapes == [(4096, 65536, 1536), (16384, 1536, 7168), (16384, 7168, 768), (4096, 2048, 7168)]
    # % of GPU time per shape: the split the plan reports for the same trace.
    assert [round(s["pct_gpu"], 1) for s in top["shapes"]] == [55.7, 21.5, 14.5, 7.4]
    # The kernel's total is kept and the shape rows add up to it.
    assert sum(s["total_ms"] for s in top["shapes"]) == pytest.approx(top["total_ms"], abs=1e-3)
    assert sum(s["calls"] for s in top["shapes"]) == top["calls"]
    k = prof.kernels[0]
    for s, o in zip(top["shapes"], sorted(k.ops, key=lambda o: -o.total_us)):
        flops = 2 * o.shape["M"] * o.shape["N"] * o.shape["K"] * o.calls
        assert s["achieved"]["tflops"] == pytest.approx(flops / (o.total_us * 1e-6) / 1e12, rel=1e-3)
        assert s["achieved"]["bound"] == "compute"  # thousands of FLOP/byte against H200's ~412 ridge
    rates = {s["achieved"]["tflops"] for s in top["shapes"]}
    assert len(rates) == 4 and min(rates) < top["achieved"]["tflops"] < max(rates)
    # A decode-sized GEMM (M=64) sits below the ridge point: memory-bound.
    small = data["kernels"][1]["achieved"]
    assert small["bound"] == "memory" and small["flop_per_byte"] < small["ridge_flop_per_byte"]
    assert small["ridge_flop_per_byte"] == pytest.approx(1979e12 / 4800e9, rel=1e-3)


def test_split_kernel_prints_one_row_per_shape():
    env = dict(os.environ, COLUMNS="160", NO_COLOR="1", TERM="dumb")
    res = subprocess.run([sys.executable, "-m", "skillrun", "kernels", str(EXAMPLE)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    rows = [ln for ln in res.stdout.splitlines() if "↳ aten::_scaled_mm" in ln]
    assert len(rows) == 4 and "4096×65536×1536" in rows[0] and "4096×2048×7168" in rows[3]
    assert all("TF/s" in r and "cmp" in r for r in rows)


def test_rate_above_the_device_peak_is_flagged_model_na_not_shown():
    fixture = REPO / "tests" / "fixtures" / "kineto_h200_rowwise_loop.synthetic.json"
    data = hot_kernels(ingest(fixture), None)
    flagged = [r for r in data["kernels"] if r["achieved"].get("model_na")]
    assert flagged, [(r["op"], r["achieved"]) for r in data["kernels"]]
    a = flagged[0]["achieved"]
    # The model's number is kept for the curious but never as a rate, a share of peak or a bound.
    assert "tbps" not in a and "tflops" not in a and "pct_peak" not in a and "bound" not in a
    assert a["model_value"] > a["peak_tbps"] and "peak" in a["reason"]
    from skillrun.analysis.hot_table import _fmt_achieved

    assert _fmt_achieved(a) == "model n/a"
    for r in data["kernels"]:
        for x in [r["achieved"]] + [s["achieved"] for s in r["shapes"]]:
            assert x.get("pct_peak") is None or x["pct_peak"] <= 100.0


# ------------------------------------------------------------------- categories, demangling (#27)
_TRACES = traces_dir() or Path("/nonexistent")
SGLANG = _TRACES / "pytorch_kineto" / "amd_mi300x_sglang_qwen3-8b_decode_hipgraph.tracelens.json.gz"
needs_traces = pytest.mark.skipif(traces_dir() is None, reason="../shared/traces is not present (set SKILLRUN_TRACES)")


@pytest.mark.parametrize("name, cat", [
    # B200 trace: torch symmetric-memory all-reduce (19.5 % of GPU time there), kernel and op spellings.
    ("void c10d::symmetric_memory::multimem_all_reduce_kernel<float, 4>(float*, unsigned long)", "communication"),
    ("symm_mem::multimem_all_reduce_", "communication"),
    ("void vllm::cross_device_reduce_1stage<__hip_bfloat16, 8>(vllm::RankData*)", "communication"),
    ("oneShotAllReduceKernel", "communication"),
    ("void small_reduce_kernel<float>(float*)", "reduction"),  # 'all_reduce' inside a word is not a collective
    # MoE and grouped GEMMs, whatever activation they fuse.
    ("_ZN5aiter48fmoe_bf16_pertokenFp8_g1u1_vs_silu_1tg_ps_32x256E", "gemm"),
    ("mfma_moe1_bs_fp8_t64_n128", "gemm"),
    ("fused_moe_kernel", "gemm"),
    ("cutlass_grouped_mm_sm90_kernel", "gemm"),
    ("ck_moe_stage1_bf16", "gemm"),
    # MoE routing helpers are not GEMMs.
    ("moe_align_block_size_kernel", "other"),
    ("void vllm::moe::topkGatingSoftmax<4>(float const*)", "reduction"),
])
def test_collective_and_moe_categories(name, cat):
    assert kernel_category(name) == cat


def test_collectives_by_launching_op_are_communication():
    assert kernel_category("some_custom_kernel_v2", None, ["symm_mem::multimem_all_reduce_"]) == "communication"
    assert kernel_category("some_custom_kernel_v2", None, ["_c10d_functional::all_to_all_single"]) == "communication"


@needs_traces
def test_real_traces_keep_their_categories():
    """The wider rules change nothing on the real traces: their top kernels keep the category they had."""
    by = {k.name: k.category for k in ingest(SGLANG).kernels}
    assert by["_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb1ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib"] == "reduction"
    assert sum(c == "communication" for c in by.values()) == 0
    assert {k.category for k in ingest(SLICE).kernels if k.name.startswith("ncclDevKernel")} == {"communication"}


@needs_traces
@pytest.mark.skipif(not (__import__("shutil").which("c++filt") or __import__("shutil").which("llvm-cxxfilt")),
                    reason="no c++filt on this machine")
def test_aiter_bf16_kernel_is_demangled_by_the_cxxfilt_fallback():
    name = "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb1ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib"
    data = hot_kernels(ingest(SGLANG), None)
    row = next(r for r in data["kernels"] if r["name"] == name)
    assert row["demangled"].startswith("void aiter::add_rmsnorm_quant_kernel<")
    assert "256, 16, true, false, true, 1>" in row["demangled"]
    # Per name: one unknown symbol among them does not stop the others from being demangled.
    out = demangle_many([name, "_Zgarbage", "_ZN5aiter24add_rmsnorm_quant_kernelEv"])
    assert out["_Zgarbage"] == "_Zgarbage" and out[name].startswith("void aiter::")
    assert out["_ZN5aiter24add_rmsnorm_quant_kernelEv"] == "aiter::add_rmsnorm_quant_kernel()"


# --------------------------------------------------------- totals, spread, launch facts (#27)
H100 = SGLANG.parent / "nvidia_h100_qwen1.5-0.5b_bf16.tracelens.json.gz"


@needs_traces
def test_median_and_std_dev_match_the_raw_kernel_events():
    import gzip
    import statistics

    doc = json.loads(gzip.decompress(H100.read_bytes()))
    prof = ingest(H100)
    data = hot_kernels(prof, 5)
    for r in data["kernels"][:3]:
        durs = [e["dur"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("name") == r["name"]]
        assert len(durs) == r["calls"]
        assert r["median_us"] == pytest.approx(statistics.median(durs), abs=1e-3)
        assert r["std_us"] == pytest.approx(statistics.stdev(durs), abs=1e-3)
        ev = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("name") == r["name"])
        assert r["launch"]["registers_per_thread"] == ev["args"]["registers per thread"]
        assert r["launch"]["shared_mem_bytes"] == ev["args"]["shared memory"]
    # The denominator is printed: total kernel time and calls.
    from skillrun.analysis.hot_table import breakdown_lines

    total_us = sum(e["dur"] for e in doc["traceEvents"] if e.get("cat") == "kernel")
    line = breakdown_lines(data)[0]
    assert line.startswith("GPU kernel time: ") and f"{total_us / 1e3:.3f} ms" in line
    assert f"in {prof.kernel_calls} calls" in line


@needs_traces
def test_launch_facts_from_rocprofv3_kernel_symbols_and_nsys():
    import gzip
    import sqlite3

    from skillrun.analysis.hot_table import launch_text

    trace = SGLANG.parents[1] / "rocprofv3" / "amd_mi350x_rocprofv3_kernel_trace_results.json.gz"
    doc = json.loads(gzip.decompress(trace.read_bytes()))["rocprofiler-sdk-tool"][0]
    top = hot_kernels(ingest(trace), 1)["kernels"][0]
    sym = next(s for s in doc["kernel_symbols"] if s.get("formatted_kernel_name") == top["name"])
    assert top["launch"] == {"vgprs": sym["arch_vgpr_count"], "agprs": sym["accum_vgpr_count"],
                             "sgprs": sym["sgpr_count"], "lds_bytes": sym["group_segment_size"],
                             "scratch_bytes": sym["private_segment_size"]}
    assert f"VGPRs {sym['arch_vgpr_count']}" in launch_text(top) and "block 256×1×1" in launch_text(top)

    db = SGLANG.parents[1] / "nsys" / "nvidia_a100_cloverleaf_nsys2024.5_export.sqlite"
    k = hot_kernels(ingest(db), 1)["kernels"][0]
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute('SELECT k."end" - k."start", k.registersPerThread, k.staticSharedMemory FROM '
                       'CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName WHERE s.value = ?',
                       (k["name"],)).fetchall()
    import statistics

    assert len(rows) == k["calls"] and k["median_us"] is None  # nsys SQLite: aggregated in SQL, no median
    assert k["std_us"] == pytest.approx(statistics.stdev(r[0] / 1e3 for r in rows), abs=1e-3)
    assert k["launch"]["registers_per_thread"] == rows[0][1]
    assert k["launch"]["static_shared_mem_bytes"] == rows[0][2]


@needs_traces
def test_details_prints_launch_facts_under_each_kernel():
    from rich.console import Console

    data = hot_kernels(ingest(H100), 2)
    c = Console(width=200, record=True, file=open(os.devnull, "w"))
    c.print(render(data, 200, details=True))
    text = c.export_text()
    r = data["kernels"][0]
    assert f"regs/thread {r['launch']['registers_per_thread']}" in text and "grid " in text
    c2 = Console(width=200, record=True, file=open(os.devnull, "w"))
    c2.print(render(data, 200))
    assert "regs/thread" not in c2.export_text()


@needs_traces
def test_launch_facts_from_ncu_launch_statistics():
    import csv
    import io

    path = _TRACES / "ncu" / "nvidia_h200_fp8_scaled_mm_ncu_details.generated.csv"
    text = path.read_text()
    head = next(i for i, ln in enumerate(text.splitlines()) if ln.startswith('"ID"'))
    rows = list(csv.DictReader(io.StringIO("\n".join(text.splitlines()[head:]))))
    data = hot_kernels(ingest(path), None)
    for r in data["kernels"]:
        mine = [x for x in rows if x["Kernel Name"] == r["name"]]
        regs = next(x["Metric Value"] for x in mine if x["Metric Name"] == "Registers Per Thread")
        dyn = next(x["Metric Value"] for x in mine if x["Metric Name"] == "Dynamic Shared Memory Per Block")
        assert r["launch"]["registers_per_thread"] == int(regs.replace(",", ""))
        assert r["launch"]["dynamic_shared_mem_bytes"] == int(dyn.replace(",", ""))


# ------------------------------------------------------------------ roofline-true rates (#38)
def test_memory_bound_gemm_reports_its_share_of_the_roofline_not_of_compute_peak():
    """The bundled H200 trace's 64×7168×2048 block-scale GEMM is memory-bound: its rate is judged
    against min(peak, FLOP/byte × bandwidth), not against the fp8 compute peak it cannot reach."""
    prof = ingest(EXAMPLE)
    data = hot_kernels(prof, None)
    peak = DEFAULT_PEAKS.lookup("NVIDIA H200", "sm_90")
    small = next(r for r in data["kernels"] if r["shape"] and r["shape"]["M"] == 64)
    a = small["achieved"]
    k = next(k for k in prof.kernels if k.name == small["name"])
    (o,) = [o for o in k.ops if o.shape]
    flops = 2.0 * o.shape["M"] * o.shape["N"] * o.shape["K"]
    nbytes = sum(math.prod(d) * (1 if "float8" in str(t).lower() else 4)
                 for d, t in zip(o.input_dims, o.input_types) if isinstance(d, list) and d)
    attainable = min(1979.0, flops / nbytes * peak.gbps / 1e3)
    assert a["bound"] == "memory" and attainable < 1979.0
    assert a["attainable_tflops"] == pytest.approx(attainable, rel=1e-3)
    assert a["pct_attainable"] == pytest.approx(100 * a["tflops"] / attainable, abs=0.1)
    # memory-bound: the share of the roofline is the share of HBM bandwidth the GEMM drew
    assert a["pct_attainable"] == pytest.approx(100 * a["tbps"] / (peak.gbps / 1e3), abs=0.2)
    assert a["pct_attainable"] > 3 * a["pct_peak"]
    # compute-bound rows: the roofline is the compute peak
    big = data["kernels"][0]["shapes"][0]["achieved"]
    assert big["bound"] == "compute" and big["pct_attainable"] == big["pct_peak"]
    # the table cell, the detail words and the CSV say the roofline share, not the compute one
    from skillrun.analysis.hot_table import _achieved_parts, _fmt_achieved
    from skillrun.output.tabular import kernel_rows

    assert f"{a['pct_attainable']:.0f}% mem" in _fmt_achieved(a) and "TB/s" in _fmt_achieved(a)
    assert any(f"{a['pct_attainable']:.0f}% of roofline" in p for p in _achieved_parts(a))
    cols, rows = kernel_rows(data)
    row = next(r for r in rows if r["row"] == "kernel" and r["kernel"] == small["name"])
    assert row["pct_attainable"] == a["pct_attainable"] and row["bound"] == "memory"
    text = _kernels_table(EXAMPLE, 160)
    line = next(ln for ln in text.splitlines() if "Ablk128" in ln and "4x1" in ln)
    assert f"{a['pct_attainable']:.0f}% mem" in line


@needs_traces
def test_elementwise_rows_are_judged_against_bandwidth_on_a_real_trace():
    h100 = _TRACES / "pytorch_kineto" / "nvidia_h100_qwen1.5-0.5b_bf16.tracelens.json.gz"
    data = hot_kernels(ingest(h100), None)
    rows = [s["achieved"] for r in data["kernels"] if r["category"] == "elementwise" for s in r["shapes"]
            if s["achieved"].get("tbps")]
    assert rows
    for a in rows:
        assert a["bound"] == "memory" and a["pct_attainable"] == pytest.approx(100 * a["tbps"] / a["peak_tbps"], abs=0.1)


@needs_traces
def test_a_device_without_a_peak_table_is_named_in_a_note():
    a100 = _TRACES / "pytorch_kineto" / "nvidia_a100_alexnet_old_int_ts.hta.json.gz"
    data = hot_kernels(ingest(a100), None)
    (note,) = data["peak_notes"]
    assert "A100" in note and "no peak table" in note
    for r in data["kernels"]:
        assert r["achieved"].get("pct_peak") is None and r["achieved"].get("bound") is None
    assert note in _kernels_table(a100, 200)
    # a device that has one gets no note
    assert hot_kernels(ingest(EXAMPLE), None)["peak_notes"] == []


def test_report_judges_a_memory_bound_artifact_against_the_roofline():
    """The HTML report's measurement table and the run table: a memory-bound decode shape's share
    is its share of bandwidth, not the few percent of compute peak it was printed as."""
    from skillrun.evidence.validation import artifact_files, load_artifact
    from skillrun.output.report import COLUMNS, _roofline_share, _row

    recs = [load_artifact(f) for f in artifact_files(REPO / "validation" / "triton_fp8_rowwise_batched_gemm_sm90")]
    mem = [r for r in recs if (r.get("physical_limit") or {}).get("bound") == "memory" and r.get("gbps")]
    assert mem
    for r in mem:
        pl = r["physical_limit"]
        share = 100 * r["gbps"] / pl["peak_gbps"]
        assert _roofline_share(r) == pytest.approx(share, abs=1e-3)
        assert _roofline_share(r) > r["pct_of_peak"]
        assert _row(r)[COLUMNS.index("% roofline")].startswith(f"{share:.3g}"[:3])


def test_narrow_names_keep_the_words_that_tell_kernels_apart():
    """At 80 columns the two nvjet kernels of the bundled trace differ only in their cluster shape
    (2x1 vs 4x1) and share the scale tag a card matches on (Ablk128): both stay visible, and a
    shape is wrapped, never cut."""
    text = _kernels_table(EXAMPLE, 80)
    rows = [ln for ln in text.splitlines() if ln[:3].strip().isdigit()]
    assert len(rows) == 2
    assert all("Ablk128" in r and r.split()[-1].startswith("nvjet") for r in rows)
    assert "2x1" in rows[0] and "4x1" in rows[1]
    for shape in ("4096×65536×1536", "64×7168×2048"):
        assert shape in text


@needs_traces
def test_ncu_details_keep_every_metric_the_user_ran_ncu_for():
    import csv
    import io

    path = _TRACES / "ncu" / "nvidia_h200_fp8_scaled_mm_ncu_details.generated.csv"
    text = path.read_text()
    head = next(i for i, ln in enumerate(text.splitlines()) if ln.startswith('"ID"'))
    rows = list(csv.DictReader(io.StringIO("\n".join(text.splitlines()[head:]))))
    prof = ingest(path)
    for k in prof.kernels:
        mine = [x for x in rows if x["Kernel Name"] == k.name]
        want: dict[str, list[float]] = {}
        for x in mine:
            try:
                v = float(x["Metric Value"].replace(",", ""))
            except ValueError:
                continue
            key = f"{x['Section Name']}: {x['Metric Name']}" + (f" [{x['Metric Unit']}]" if x["Metric Unit"] else "")
            want.setdefault(key, []).append(v)
        assert k.metrics.keys() == want.keys()
        for key, vs in want.items():
            assert k.metrics[key] == pytest.approx(sum(vs) / len(vs), rel=1e-4)
    data = hot_kernels(prof, None)
    r = data["kernels"][0]
    occ = r["metrics"]["Occupancy: Achieved Occupancy [%]"]
    from skillrun.analysis.hot_table import launch_text

    assert f"achieved occupancy {occ:.3g}%" in launch_text(r) and "waves/SM" in launch_text(r)
    out = _kernels_table(path, 200, "--details")
    assert "SM throughput" in out and "achieved occupancy" in out


@needs_traces
def test_grids_are_launch_groups_and_say_so():
    """HIP's hipExtModuleLaunchKernel (hipBLASLt) takes a grid in work-items and Kineto copies it as is;
    it is divided by the workgroup, as rocprof's are, and every grid is labelled."""
    import gzip

    mi300 = _TRACES / "pytorch_kineto" / "amd_mi300x_qwen1.5-0.5b_bf16.tracelens.json.gz"
    doc = json.loads(gzip.decompress(mi300.read_bytes()))
    ext_corr = {e["args"]["correlation"] for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"
                and e.get("name") == "hipExtModuleLaunchKernel"}
    raw = {}
    for e in doc["traceEvents"]:
        a = e.get("args", {})
        if e.get("cat") == "kernel" and a.get("correlation") in ext_corr and "grid" in a:
            raw.setdefault(e["name"], (a["grid"], a["block"]))
    assert raw
    data = hot_kernels(ingest(mi300), None)
    seen = 0
    for r in data["kernels"]:
        if r["name"] in raw and r["grid"]:
            g, b = raw[r["name"]]
            assert r["grid"] == [-(-x // y) for x, y in zip(g, b)] and r["grid_unit"] == "workgroups"
            seen += 1
    assert seen
    assert {r["grid_unit"] for r in hot_kernels(ingest(H100), None)["kernels"] if r["grid"]} == {"blocks"}
    assert {r["grid_unit"] for r in hot_kernels(ingest(SLICE), None)["kernels"] if r["grid"]} == {"workgroups"}
