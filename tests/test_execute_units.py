"""Unit tests of the harness's pure parts: parity numbers, statistics, proxy shapes, gates, peaks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from skillrun.errors import UsageError
from skillrun.execute import ExecOptions
from skillrun.execute.integrity import aliasing_gate, evaluate_names
from skillrun.execute.isolate import describe_exit
from skillrun.execute.parity import aggregate, compare, poison, tolerance_of
from skillrun.analysis.peaks import DEFAULT_PEAKS, compute_dtype, floor_ms
from skillrun.execute.proxy import generic_proxy
from skillrun.execute.stats import aa_noise, percentile, summarize
from skillrun.execute.timing import rotation_sets

TOL = tolerance_of(None)


def test_compare_counts_unwritten_elements_and_keeps_norms_finite():
    ref = torch.randn(8, 16)
    out = ref.clone()
    out[0, :3] = float("nan")
    m = compare(out, ref, TOL)
    assert not m["passed"] and m["nonfinite"] == 3 and m["mismatched"] == 3
    assert np.isfinite(m["rel_fro"]) and np.isfinite(m["max_abs_err"])


def test_compare_passes_exact_and_fails_scaled_output():
    ref = torch.randn(64, 64) * 10
    assert compare(ref.to(torch.bfloat16), ref, TOL)["passed"]
    scaled = compare(ref * 1.05, ref, TOL)
    assert not scaled["passed"] and scaled["cosine"] > 0.99999 and scaled["mismatched"] > 0
    assert scaled["max_rel_err"] == pytest.approx(0.05, rel=1e-3)
    assert scaled["rel_fro"] == pytest.approx(0.05, rel=1e-3)


def test_compare_rejects_wrong_shape_and_low_cosine():
    ref = torch.randn(4, 4)
    assert "shape" in compare(torch.randn(4, 5), ref, TOL)["error"]
    loose = {**TOL, "rtol": 10.0, "atol": 10.0}
    m = compare(-ref, ref, loose)
    assert not m["passed"] and "cosine" in m["error"]


def test_max_rel_fro_from_the_card_is_enforced():
    ref = torch.randn(32, 32)
    m = compare(ref * 1.001, ref, {**TOL, "max_rel_fro": 1e-4})
    assert not m["passed"] and "rel_fro" in m["error"]


def test_poison_and_aggregate():
    f = torch.empty(3)
    assert poison(f) == "nan" and torch.isnan(f).all()
    i = torch.empty(3, dtype=torch.int32)
    assert poison(i) == "int_max" and (i == torch.iinfo(torch.int32).max).all()
    good = {"passed": True, "max_abs_err": 0.1, "max_rel_err": 0.01, "rel_fro": 0.001, "cosine": 1.0, "mismatched": 0, "nonfinite": 0, "seed": 1}
    bad = {**good, "passed": False, "cosine": 0.5, "mismatched": 7, "seed": 2, "error": "x"}
    agg = aggregate([good, bad])
    assert not agg["passed"] and agg["cosine"] == 0.5 and agg["mismatched"] == 7 and "seed 2: x" in agg["error"]
    assert not aggregate([])["passed"]


def test_percentiles_match_numpy_and_spread():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0]
    for q in (10, 50, 90):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    s = summarize(xs)
    assert s["min"] == 1.0 and s["samples"] == 6
    assert s["spread_pct"] == pytest.approx(100 * (np.percentile(xs, 90) - np.percentile(xs, 10)) / np.median(xs))


def test_aa_noise_of_identical_slots_is_zero_and_of_offset_slots_is_the_offset():
    a = [1.0, 2.0, 3.0]
    assert aa_noise(a, a)["aa_noise_pct"] == 0.0
    assert aa_noise([x * 1.03 for x in a], a)["aa_noise_pct"] == pytest.approx(3.0)


def test_generic_proxy_keeps_alignment_and_structure():
    assert generic_proxy({"M": 4096, "N": 65536, "K": 1536}) == {"M": 256, "N": 256, "K": 256}
    assert generic_proxy({"M": 1, "N": 7168, "K": 768}) == {"M": 1, "N": 256, "K": 256}
    p = generic_proxy({"M": 96, "N": 384, "K": 7168})
    assert p["M"] == 96 and p["N"] == 256 and p["K"] % 128 == 0
    moe = generic_proxy({"tokens": 4096, "model_dim": 7168, "inter_dim": 512, "experts": 384, "topk": 8, "group_size": 32})
    assert moe["group_size"] == 32 and moe["topk"] == 8 and moe["experts"] >= 8
    assert moe["model_dim"] % 32 == 0 and moe["tokens"] == 128  # alignment (128) wins over the cap (64)
    assert generic_proxy({"M": 300}) == {"M": 256}  # 300 = 4 * 75: stays a multiple of 4


def test_device_names_must_all_be_the_slots_own():
    ok = evaluate_names("port", r"^_k$", {"baseline": r"nvjet"}, ["_k", "_k"], device=True)
    assert ok["passed"]
    extra = evaluate_names("port", r"^_k$", {"baseline": r"nvjet"}, ["_k", "elementwise_kernel"], device=True)
    assert not extra["passed"] and "unexpected" in extra["reason"]
    foreign = evaluate_names("port", r"^_k|nvjet", {"baseline": r"nvjet"}, ["_k", "nvjet_sm90_x"], device=True)
    assert not foreign["passed"] and "another slot" in foreign["reason"]
    assert not evaluate_names("port", None, {}, ["_k"], device=True)["passed"]
    assert not evaluate_names("port", r"^_k$", {}, [], device=True)["passed"]


def test_host_names_only_fail_on_foreign_ops_unless_own_is_declared():
    names = ["aten::copy_", "skillrun::slot", "aten::mul"]
    assert evaluate_names("port", r"^_k$", {"baseline": r"^aten::mm$"}, names, device=False, own_required=False)["passed"]
    assert not evaluate_names("port", r"^mine$", {}, names, device=False, own_required=True)["passed"]
    bad = evaluate_names("port", None, {"baseline": r"^aten::mm$"}, names + ["aten::mm"], device=False, own_required=False)
    assert not bad["passed"] and "aten::mm" in bad["reason"]


def test_aliasing_gate_sees_views_of_other_storage():
    a = torch.randn(8, 8)
    mine = torch.empty(4, 4)
    assert aliasing_gate(mine, {"inputs": {"a": a}})["passed"]
    view = a.view(-1)[16:32].view(4, 4)
    g = aliasing_gate(view, {"inputs": {"a": a}, "baseline output": torch.empty(2)})
    assert not g["passed"] and g["value"] == ["inputs"]


def test_physical_floor_uses_the_slower_bound_and_the_dtype_peak():
    h200 = DEFAULT_PEAKS.lookup("NVIDIA H200", "sm_90")
    assert h200 is not None and h200.gbps == 4800.0
    big = floor_ms(2 * 8192**3, 3 * 8192**2, h200, "fp8_e4m3")
    assert big["bound"] == "compute" and big["peak_tflops"] == 1979.0
    assert big["floor_ms"] == pytest.approx(2 * 8192**3 / 1979e12 * 1e3)
    thin = floor_ms(2 * 1 * 7168 * 2048, 7168 * 2048, h200, "bf16")
    assert thin["bound"] == "memory" and thin["peak_tflops"] == 989.0
    assert DEFAULT_PEAKS.lookup("AMD Instinct MI355X", None).tflops["fp8"] == 5000.0
    assert DEFAULT_PEAKS.lookup("Some CPU", "x86_64") is None
    assert compute_dtype("int4") == "bf16" and compute_dtype("fp8_e4m3_fnuz") == "fp8"
    # An unknown dtype takes the fastest peak, so the check can only err towards accepting.
    assert h200.flops_peak("weird")[0] == 1979.0


def test_rotation_covers_twice_the_l2():
    n, how = rotation_sets(10 << 20, 60 << 20, "rotate", 64, 1 << 34)
    assert n * (10 << 20) >= 2 * (60 << 20) and "rotate" in how
    n, how = rotation_sets(10 << 20, 60 << 20, "rotate", 4, 1 << 34)
    assert n == 4 and "capped" in how
    assert rotation_sets(1, None, "rotate", 8, 1 << 30)[0] == 1
    assert rotation_sets(1, 1 << 20, "off", 8, 1 << 30) == (1, "off (warm L2)")


def test_exit_descriptions_name_the_signal():
    assert "SIGSEGV" in describe_exit(-11) and "segmentation" in describe_exit(-11)
    assert "SIGABRT" in describe_exit(-6)
    assert "status 3" in describe_exit(3)


def test_bad_options_are_usage_errors():
    with pytest.raises(UsageError):
        ExecOptions.from_kw({"cold_l2": "lukewarm"})
    with pytest.raises(UsageError):
        ExecOptions.from_kw({"nonsense": 1})
    with pytest.raises(UsageError):
        ExecOptions.from_kw({"isolation": "thread"})


class _Ev:
    def __init__(self, name, device, annotation=False):
        self.name = name
        self.device_type = torch.autograd.DeviceType.CUDA if device else torch.autograd.DeviceType.CPU
        self.is_user_annotation = annotation


# What torch.profiler returned for the toy Triton port and torch.mm (cuBLAS) on the lent H200
# (2026-11-29, torch 2.11.0+cu130): the harness scope mirrored as a GPU annotation, a runtime
# memset beside the cuBLAS kernel.
H200_PORT = [_Ev("skillrun::slot", False), _Ev("cudaLaunchKernel", False), _Ev("skillrun::slot", True, True),
             _Ev("_toy_mm_kernel", True)]
H200_BASELINE = [_Ev("skillrun::slot", False), _Ev("aten::mm", False), _Ev("skillrun::slot", True, True),
                 _Ev("Memset (Device)", True), _Ev("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT", True)]
BASE_RX = r"(?i)(nvjet|xmma|cutlass|gemm|sm\d+_|splitKreduce)"


def test_gpu_annotations_are_not_kernels_and_memsets_are_exempt():
    from skillrun.execute.integrity import split_events

    dev, host = split_events(H200_PORT)
    assert dev == ["_toy_mm_kernel"] and "skillrun::slot" in host
    assert evaluate_names("port", r"^_toy_mm_kernel$", {"baseline": BASE_RX}, dev, device=True)["passed"]
    dev, _ = split_events(H200_BASELINE)
    gate = evaluate_names("baseline", BASE_RX, {"port": r"^_toy_mm_kernel$"}, dev, device=True)
    assert gate["passed"] and gate["runtime_fills"] == ["Memset (Device)"]
    # Without the annotation flag (older torch), a device name that is also a host event is dropped.
    legacy = [_Ev("skillrun::slot", False), _Ev("skillrun::slot", True, False), _Ev("_toy_mm_kernel", True)]
    assert split_events(legacy)[0] == ["_toy_mm_kernel"]


def test_a_memcpy_is_not_exempt_and_a_cheat_is_still_caught():
    cheat = ["_toy_mm_kernel", "Memset (Device)", "nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT"]
    g = evaluate_names("port", r"^_toy_mm_kernel$", {"baseline": BASE_RX}, cheat, device=True)
    assert not g["passed"] and "nvjet" in g["reason"]
    copy = evaluate_names("port", r"^_toy_mm_kernel$", {"baseline": BASE_RX},
                          ["_toy_mm_kernel", "Memcpy DtoD (Device -> Device)"], device=True)
    assert not copy["passed"] and "Memcpy" in copy["reason"]
    only_fill = evaluate_names("port", r"^_toy_mm_kernel$", {}, ["Memset (Device)"], device=True)
    assert not only_fill["passed"] and "no device kernel" in only_fill["reason"]
