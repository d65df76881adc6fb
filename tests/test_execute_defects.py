"""Seeded defects on the CPU: the execution harness must catch each one with the right verdict.

Every case runs the real harness end to end (child processes, oracle parity, profiler integrity,
timing where a timer is given) on a toy fp16 GEMM whose kernels live in tests/defects/.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from defects.kb import card, make_defect_kb
from skillrun.execute import execute_plan, run_skill
from skillrun.analysis.peaks import DevicePeak, PeakTable
from skillrun.kb.index import SkillIndex
from skillrun.models import Plan
from skillrun.evidence.validation import load_artifact

SHAPE = {"M": 48, "N": 32, "K": 64}
# Generous CPU "peaks" (far above what a CPU core does): the check must NOT fire with these.
GENEROUS = PeakTable([DevicePeak(name="test CPU (generous)", match=".", tflops={"fp16": 100.0}, gbps=10000.0, source="tests")])
# Absurdly low peaks: any real time is below the floor they imply... inverted: floor is huge.
TINY = PeakTable([DevicePeak(name="test CPU (tiny peak)", match=".", tflops={"fp16": 1e-9}, gbps=1e-9, source="tests")])


@pytest.fixture(scope="module")
def kb(tmp_path_factory) -> tuple[SkillIndex, Path]:
    root = make_defect_kb(tmp_path_factory.mktemp("defect_kb"))
    index = SkillIndex.load(root)
    assert not index.errors, [str(e) for e in index.errors]
    return index, root / "validation"


def run(kb, card_id: str, shape=SHAPE, **kw) -> dict:
    index, out = kb
    kw.setdefault("timeout_s", 120)
    (rec,) = run_skill(index, card_id, [shape], backend="cpu", validation_root=out, **kw)
    if rec.get("artifact"):
        # Every written record is schema-valid and reads back identically.
        back = load_artifact(Path(rec["artifact"]))
        assert back["verdict"] == rec["verdict"]
    return rec


def test_correct_port_passes_with_evidence(kb):
    rec = run(kb, "defect_ok")
    assert rec["verdict"] == "cpu_numerics_passed", rec["reason"]
    assert rec["mode"] == "cpu_numerics"
    port = rec["parity"]["port"]
    assert port["passed"] and port["nonfinite"] == 0 and port["mismatched"] == 0
    assert len(port["seeds"]) == 3 and all(s["poison"] == "nan" for s in port["seeds"])
    assert rec["parity"]["baseline"]["passed"]
    assert rec["slot_integrity"]["port"]["passed"] and rec["slot_integrity"]["aliasing"]["passed"]
    assert rec["speedup"] is None and "no GPU timing" in rec["reason"]
    assert rec["proxy_shape"] == SHAPE
    assert len(rec["recipe"]["kernel_source_sha256"]) == 64
    # the source identity: the port's module (not in skillrun_kernels, so its own sha256 alone) and
    # the skillrun_kernels modules it imports
    sources = rec["recipe"]["kernel_sources"]
    assert sources["defects.kernels"] == rec["recipe"]["kernel_source_sha256"]
    assert "skillrun_kernels.protocol" in sources


def test_wrong_values_fail_parity_even_with_perfect_cosine(kb):
    rec = run(kb, "defect_wrong_values")
    assert rec["verdict"] == "parity_failed"
    port = rec["parity"]["port"]
    assert port["mismatched"] > 0
    assert port["cosine"] > 0.9999  # a uniform 5% scale keeps cosine at 1: cosine alone is not parity
    assert rec["parity"]["baseline"]["passed"]
    assert "timing" not in rec and "slot_integrity" not in rec  # a wrong port is never timed


def test_unwritten_output_is_caught_by_the_poison(kb):
    rec = run(kb, "defect_unwritten")
    assert rec["verdict"] == "parity_failed"
    # One row of N elements left unwritten per seed, three seeds.
    assert rec["parity"]["port"]["nonfinite"] == 3 * SHAPE["N"]
    assert "non-finite" in rec["reason"]


def test_port_that_calls_the_baseline_fails_slot_integrity(kb):
    rec = run(kb, "defect_calls_baseline")
    assert rec["parity"]["port"]["passed"]  # numerically perfect: only integrity can catch it
    assert rec["verdict"] == "error"
    gate = rec["slot_integrity"]["port"]
    assert not gate["passed"] and "aten::mm" in gate["reason"] and "baseline" in gate["reason"]


def test_the_baselines_output_is_out_of_the_ports_reach(kb):
    # It returns the baseline's output buffer when one ran in its process (a cached vendor result). The
    # references run in a process that never imports the port (execute/session.py): it finds none and
    # computes its own answer (its fallback). tests/test_execute_clock.py has the variant that
    # waits for the timed rounds and has no fallback.
    rec = run(kb, "defect_returns_baseline_out", timer="wall", rounds=4, warmup=1)
    assert rec["parity"]["port"]["passed"] and rec["slot_integrity"]["aliasing"]["passed"]
    assert rec["slot_integrity"]["port"]["sampled_timed_outputs"]["failed"] == 0


def test_port_that_returns_an_input_is_caught_writing_it(kb):
    # It hides its (right) result in operand a: the input checksum around its isolated call sees the
    # write before the aliasing gate could (tests/test_execute_untrusted.py covers mutation in depth).
    rec = run(kb, "defect_returns_input")
    assert rec["verdict"] == "parity_failed" and rec["reason"].startswith("port wrote to its inputs")
    assert rec["parity"]["port"]["input_mutation"] == ["a"]


def test_wrong_baseline_is_recorded_and_speedup_is_against_the_correct_alternative(kb):
    rec = run(kb, "defect_baseline_wrong", timer="wall", rounds=20, warmup=2, peaks=GENEROUS)
    base = rec["parity"]["baseline"]
    assert base["supported"] and not base["passed"] and base["rel_fro"] > 1.0
    assert rec["parity"]["alternatives"]["padded"]["passed"]
    assert "padded_gpu" not in rec["parity"]["alternatives"]  # a cuda-only alternative is not run on the CPU
    assert rec["timing"]["versus"].startswith("alternative padded")
    assert "baseline" in rec["timing"]["versus"] and "fails the fp32 oracle" in rec["timing"]["versus"]
    assert rec["speedup"] == pytest.approx(rec["timing"]["alternatives_ms"]["padded"]["median"] / rec["timing"]["port_ms"]["median"], rel=1e-3)
    assert any("NOT against the baseline" in n for n in rec["notes"])
    assert rec["physical_limit"]["passed"]  # positive control: a real time with sane peaks passes
    assert rec["timing"]["aa"]["slot"] == "alt:padded" and "aa_noise_pct" in rec["timing"]
    assert rec["verdict"] == "cpu_numerics_passed"  # CPU timing is never GPU evidence


def test_a_baseline_wrong_only_on_timed_calls_fails_the_oracle_and_the_ratio_moves_to_a_correct_one(kb):
    """Right on its isolated seeds, one element off on every timed call: the referee's sampled checks
    make it fail the oracle (a correctness fact about a reference, not an integrity failure)."""
    rec = run(kb, "defect_baseline_off_when_timed", timer="wall", rounds=12, warmup=2, peaks=GENEROUS)
    assert rec["parity"]["baseline"]["passed"]  # its isolated seeds
    gate = rec["slot_integrity"]["baseline"]
    assert gate["passed"] and gate["sampled_timed_outputs"]["failed"] == gate["sampled_timed_outputs"]["checked"] > 0
    base = next(e for e in rec["references"] if e["role"] == "baseline")
    assert base["parity"]["passed"] is False and base["parity"]["sampled_failed"] > 0 and base["median_ms"] > 0
    assert rec["timing"]["versus"].startswith("alternative padded")
    assert "fails the fp32 oracle on" in rec["timing"]["versus"] and "sampled timed calls" in rec["timing"]["versus"]


def test_unsupported_baseline_is_recorded_as_such(kb):
    rec = run(kb, "defect_baseline_unsupported", timer="wall", rounds=10, warmup=1)
    base = rec["parity"]["baseline"]
    assert base["supported"] is False and "refuses" in base["error"]
    assert rec["timing"]["versus"].startswith("alternative padded")
    assert "does not support this shape" in rec["timing"]["versus"]


def test_no_correct_reference_still_reports_the_ratio_and_says_the_reference_fails(kb):
    """Issue 11: a baseline that fails the oracle is still timed and named, never hidden behind skipped."""
    rec = run(kb, "defect_no_correct_reference", timer="wall", rounds=10, warmup=1)
    (ref,) = rec["references"]
    assert ref["role"] == "baseline" and ref["status"] == "ok" and ref["parity"]["passed"] is False
    assert ref["parity"]["mismatched"] > 0 and ref["parity"]["elements"] == 3 * SHAPE["M"] * SHAPE["N"]
    assert ref["speedup"] == rec["speedup"] and ref["speed"] in ("faster", "slower", "within_noise")
    assert ref["noise_pct"] is not None and rec["timing"]["aa"]["slot"] == "baseline"  # A/A on the failing baseline
    assert "fails the oracle" in rec["verdict_text"] and "fails the fp32 oracle" in rec["timing"]["versus"]
    assert rec["verdict"] == "cpu_numerics_passed"  # CPU timing is never GPU evidence


def test_time_below_the_physical_floor_is_a_measurement_error(kb):
    rec = run(kb, "defect_ok", timer="wall", rounds=10, warmup=1, peaks=TINY)
    assert rec["physical_limit"]["passed"] is False and rec["speedup"] is None
    # The floor is the reason, unless a slot-integrity check failed first: on a loaded 2-core machine the
    # observer check once read this honest toy's wall-clock rounds as "faster when profiled" (a known false
    # positive of that check on the CPU backend); the verdict is an error either way and no speed is claimed.
    assert rec["verdict"] == "error"
    assert "physical floor" in rec["reason"] or rec["reason"].startswith("slot integrity failed")


def test_a_timer_that_misses_the_work_is_rejected(kb):
    rec = run(kb, "defect_ok", timer="defects.timers:instant", rounds=5, warmup=1, peaks=GENEROUS)
    assert rec["timing"]["port_ms"]["median"] == pytest.approx(1e-9)
    assert rec["verdict"] == "error" and "physical floor" in rec["reason"]


def _plan(index, ids):
    from skillrun.execute import plan_item_for
    from skillrun.execute.backends import make_backend

    be = make_backend("cpu")
    return be, Plan(profile="(test)", arch=None, items=[plan_item_for(index, index.skill(i), SHAPE, be) for i in ids])


def test_faulting_kernels_fail_their_row_and_the_run_goes_on(kb):
    index, out = kb
    be, plan = _plan(index, ["defect_abort", "defect_segfault", "defect_ok"])
    recs = execute_plan(index, plan, backend=be, validation_root=out, timeout_s=120)
    verdicts = [r["verdict"] for r in recs]
    assert verdicts == ["error", "error", "cpu_numerics_passed"], [r["reason"] for r in recs]
    assert "SIGABRT" in recs[0]["reason"]
    assert "SIGSEGV" in recs[1]["reason"]
    assert all(r["artifact"] for r in recs)
    assert recs[2]["profile"]["source"] == "(test)"


def test_a_hanging_kernel_is_killed_at_the_timeout(kb):
    index, out = kb
    be, plan = _plan(index, ["defect_hang"])
    (rec,) = execute_plan(index, plan, backend=be, validation_root=out, timeout_s=4)
    assert rec["verdict"] == "error" and "timed out after 4 s" in rec["reason"]
    assert rec["parity"]["port"]["fault"] == "timeout"


def test_spawn_isolation_catches_a_crash_too(kb):
    rec = run(kb, "defect_segfault", isolation="spawn")
    assert rec["verdict"] == "error" and "SIGSEGV" in rec["reason"]


def test_triton_port_runs_in_the_interpreter_and_a_cheat_is_caught(kb):
    ok = run(kb, "toy_triton")
    assert ok["verdict"] == "cpu_numerics_passed", ok["reason"]
    assert any("TRITON_INTERPRET=1" in n for n in ok["notes"])
    cheat = run(kb, "toy_triton_cheat")
    assert cheat["verdict"] == "error" and "aten::mm" in cheat["reason"]


def test_flydsl_port_on_cpu_is_compile_only_and_says_what_it_lacks(kb):
    rec = run(kb, "defect_flydsl_only")
    assert rec["mode"] == "compile_only"
    assert rec["verdict"] == "skipped"
    # The card targets no gfx arch (gens: ['*']); without skillrun.check the reason names that instead.
    assert "gfx target" in rec["reason"] or "skillrun.check" in rec["reason"]
    assert any("nothing was executed" in n for n in rec["notes"])


def test_unresolved_plan_item_is_skipped_without_an_artifact(kb):
    index, out = kb
    from skillrun.execute import execute_item
    from skillrun.models import PlanItem

    item = PlanItem(skill_id="defect_ok", kernel="k", pct_gpu=10.0, status="unresolved_shape", notes=["no shape"])
    rec = execute_item(index, item, backend="cpu", validation_root=out)
    assert rec["verdict"] == "skipped" and rec["artifact"] is None and "no shape" in rec["reason"]


def test_real_blockscale_triton_port_on_the_cpu_backend(tmp_path):
    """The fp8 block-scale Triton port (kernels/skillrun_kernels/fp8_blockscale_gemm) through the CPU backend."""
    ref = "skillrun_kernels.fp8_blockscale_gemm.triton_sm90"
    if importlib.util.find_spec(ref) is None:
        pytest.skip(f"{ref} is not present yet")
    real = Path(__file__).resolve().parents[1] / "skills" / "triton_fp8_blockscale_gemm_sm90" / "SKILL.md"
    if real.exists():
        index = SkillIndex.load(Path(__file__).resolve().parents[1])
        card_id = "triton_fp8_blockscale_gemm_sm90"
    else:  # the real card is not written yet: a card of our own pointing at the same port
        c = card("blockscale_triton_port", f"{ref}:build", backend="triton",
                 baseline={"cpu": "skillrun_kernels.fp8_blockscale_gemm.references:build_oracle"})
        c["references"]["problem"] = "skillrun_kernels.fp8_blockscale_gemm.problem"
        c["references"]["oracle"] = "skillrun_kernels.fp8_blockscale_gemm.references:build_oracle"
        c["match"]["dtypes"] = ["fp8_e4m3"]
        index = SkillIndex.load(make_defect_kb(tmp_path / "kb", [c]))
        card_id = c["id"]
    (rec,) = run_skill(index, card_id, [{"M": 64, "N": 7168, "K": 2048}], backend="cpu",
                       validation_root=tmp_path / "validation", timeout_s=600, seeds=2)
    assert rec["verdict"] == "cpu_numerics_passed", rec["reason"]
    assert rec["shape"] == {"M": 64, "N": 7168, "K": 2048}
    assert rec["proxy_shape"]["K"] % 128 == 0 and rec["proxy_shape"]["N"] <= 256
    assert rec["parity"]["port"]["rel_fro"] < 1e-2
    load_artifact(Path(rec["artifact"]))


@pytest.mark.gpu
def test_gpu_toy_port_is_timed_and_proven(kb):
    """On a GPU: the Triton toy is timed against torch.mm with device-kernel integrity; the cheat fails."""
    index, out = kb
    (rec,) = run_skill(index, "toy_triton", [{"M": 2048, "N": 2048, "K": 2048}], validation_root=out, rounds=30)
    assert rec["mode"] == "gpu_measured"
    # torch.mm is no production kernel of the toy cards: the headline rule reads any ratio as context
    assert rec["verdict"] in ("validated", "slower", "within_noise", "no_production_reference"), rec["reason"]
    assert rec["slot_integrity"]["port"]["passed"] and rec["slot_integrity"]["port"]["level"] == "device kernels"
    assert rec["physical_limit"]["passed"] and rec["speedup"] > 0
    (cheat,) = run_skill(index, "toy_triton_cheat", [{"M": 2048, "N": 2048, "K": 2048}], validation_root=out, rounds=10)
    assert cheat["verdict"] == "error" and not cheat["slot_integrity"]["port"]["passed"]


def test_integrity_failure_keeps_the_timings_but_claims_no_speedup(kb):
    rec = run(kb, "defect_calls_baseline", timer="wall", rounds=5, warmup=1)
    assert rec["verdict"] == "error" and rec["speedup"] is None
    assert rec["timing"]["versus"].startswith("none: slot integrity failed")
    # 5 rounds, rounded up to whole blocks of 4 slots (port, baseline, its A/A copy, the references' canary)
    assert rec["timing"]["port_ms"]["samples"] == 8


def test_fork_isolation_is_refused_on_a_gpu_backend(kb):
    """Children forked from the zygote failed every CUDA call on the H200: a GPU run asks for spawn."""
    from skillrun.errors import UsageError
    from skillrun.execute.backends import CudaBackend, DeviceFacts

    index, out = kb
    fake_gpu = CudaBackend(DeviceFacts(kind="cuda", name="fake H200", arch="sm_90"))
    with pytest.raises(UsageError, match="cannot initialize CUDA"):
        run_skill(index, "defect_ok", [SHAPE], backend=fake_gpu, validation_root=out, isolation="fork")
