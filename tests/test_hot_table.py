"""The hot-kernel table: snapshots at 80 and 160 columns on a real trace slice with long C++ template
names, names that never look alike, throughput from recovered shapes, categories, idle time, and
per-device shares on multi-GPU traces."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skillrun.peaks import DEFAULT_PEAKS
from skillrun.hot_table import hot_kernels, render
from skillrun.ingest import ingest
from skillrun.names import demangle_many, display_names, kernel_category

REPO = Path(__file__).resolve().parents[1]
SLICE = REPO / "tests" / "fixtures" / "rocprofv3_mi350x_subset.real.json.gz"
EXAMPLE = REPO / "runner" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz"
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
    from skillrun.hot_table import breakdown_lines

    lines = breakdown_lines(data)
    assert any("GPU0: 1.000 ms" in ln for ln in lines) and any("GPU1: 0.400 ms" in ln and "idle 0.600" in ln for ln in lines)


def test_communication_kernels_are_never_offered_to_cards(tmp_path):
    from skillrun import api
    from skillrun.match import match_kernel

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
