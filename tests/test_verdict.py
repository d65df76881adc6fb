"""The two-axis verdict (skillrun.evidence.verdict.decide) on recorded numbers: every combination of
port pass/fail x baseline pass/fail x faster/slower/within noise, plus references that could not run."""
from __future__ import annotations

import itertools

import pytest

from skillrun.evidence.verdict import PortOutcome, RefOutcome, decide, speed_label

PORT_MS = 0.100
NOISE = 2.0  # percent
# reference median for each speed class (port 0.100 ms): 1.25x, 0.80x, 1.01x
REF_MS = {"faster": 0.125, "slower": 0.080, "within_noise": 0.101}


def _base(passed: bool, speed: str, **kw) -> RefOutcome:
    return RefOutcome(name="mslk_rowwise_batched", role="baseline", production=True, status="ok",
                      parity_passed=passed, median_ms=REF_MS[speed], **kw)


@pytest.mark.parametrize("port_ok,base_ok,speed", list(itertools.product([True, False], [True, False], list(REF_MS))))
def test_every_combination_of_port_parity_baseline_parity_and_speed(port_ok, base_ok, speed):
    port = PortOutcome(status="ok", parity_passed=port_ok, median_ms=PORT_MS)
    d = decide(port, [_base(base_ok, speed)], NOISE)
    sp = d.speeds["mslk_rowwise_batched"]
    assert sp.speed == speed  # the label never depends on either parity
    assert sp.speedup == pytest.approx(REF_MS[speed] / PORT_MS, rel=1e-3)
    if not port_ok:
        assert d.verdict == "parity_failed" and d.primary is None and d.speedup is None
        assert d.text.startswith("port fails the oracle")
        assert ("mslk_rowwise_batched passes the oracle" in d.text) == base_ok
        assert ("mslk_rowwise_batched fails the oracle" in d.text) == (not base_ok)
        return
    assert d.primary == "mslk_rowwise_batched" and d.speedup == sp.speedup
    assert "A/A noise 2.00%" in d.text
    if base_ok:
        # the production kernel passes the oracle: it is the headline, and the verdict reads the speed axis
        assert d.verdict == {"faster": "validated", "slower": "slower", "within_noise": "within_noise"}[speed]
        lead = {"faster": "faster than", "slower": "slower than", "within_noise": "within noise of"}[speed]
        assert d.text.startswith(f"{lead} mslk_rowwise_batched (")
        assert "fails the oracle" not in d.text
        return
    # the only production kernel fails the oracle: never validated, whichever way the ratio goes
    assert d.verdict == "production_fails_oracle"
    assert d.text.startswith("no oracle-correct production kernel was timed: the production mslk_rowwise_batched fails the oracle")
    assert ("the only oracle-correct kernel" in d.text) == (speed == "slower")


@pytest.mark.parametrize("mslk_ok,mslk_speed,loop_ok", list(itertools.product([True, False], list(REF_MS), [True, False])))
def test_the_headline_is_the_production_kernel_never_a_non_production_alternative(mslk_ok, mslk_speed, loop_ok):
    port = PortOutcome(parity_passed=True, median_ms=PORT_MS)
    refs = [RefOutcome("scaled_mm_loop", role="baseline", parity_passed=loop_ok, median_ms=0.4),  # not production, 4x
            RefOutcome("mslk_rowwise_batched", production=True, parity_passed=mslk_ok, median_ms=REF_MS[mslk_speed])]
    d = decide(port, refs, NOISE)
    assert d.primary == "mslk_rowwise_batched"  # a 4x ratio against the loop never leads
    assert "vs scaled_mm_loop 4x (faster)" in d.text
    if mslk_ok:
        assert d.verdict == {"faster": "validated", "slower": "slower", "within_noise": "within_noise"}[mslk_speed]
    else:
        assert d.verdict == "production_fails_oracle"
    # a wrong production kernel that leads is said to be wrong in the head, once
    assert "the faster kernel is the production mslk_rowwise_batched" not in d.text
    assert ("fails the oracle (the port passes), and the port is slower than it" in d.text) == (not mslk_ok and mslk_speed == "slower")


def test_validated_never_while_a_production_kernel_that_fails_the_oracle_was_faster():
    port = PortOutcome(parity_passed=True, median_ms=PORT_MS)
    refs = [RefOutcome("cublas_blockwise", role="baseline", production=True, parity_passed=True, median_ms=0.125),
            RefOutcome("mslk_groupwise", production=True, parity_passed=False, median_ms=0.050)]  # 2x the port's speed, wrong
    d = decide(port, refs, NOISE)
    assert d.primary == "cublas_blockwise" and d.speedup == pytest.approx(1.25)
    assert d.verdict == "production_fails_oracle"
    assert "the faster kernel is the production mslk_groupwise (2x the port's speed), and it fails the oracle" in d.text
    # without the wrong fast kernel the same numbers validate
    assert decide(port, refs[:1], NOISE).verdict == "validated"


def test_the_headline_is_the_fastest_oracle_correct_production_kernel():
    """16x7168x2048 on the H200 (8385f6d): the port beat cuBLAS by 1.045x while MSLK groupwise ran 1.28x faster than it."""
    port = PortOutcome(parity_passed=True, median_ms=0.0084)
    refs = [RefOutcome("cublas_blockwise", role="baseline", production=True, parity_passed=True, median_ms=0.00878),
            RefOutcome("mslk_groupwise", production=True, parity_passed=True, median_ms=0.00656),
            RefOutcome("bf16_cublas", parity_passed=False, median_ms=0.0100)]
    d = decide(port, refs, 0.83)
    assert d.primary == "mslk_groupwise" and d.fastest_production == "mslk_groupwise"
    assert d.verdict == "slower" and d.speedup == pytest.approx(0.781, abs=1e-3)
    assert d.text.startswith("slower than mslk_groupwise (0.781x, A/A noise 0.83%), the fastest oracle-correct production kernel")
    assert "vs cublas_blockwise (production) 1.04x (faster)" in d.text


@pytest.mark.parametrize("status", ["unavailable", "unsupported", "error"])
def test_no_production_kernel_compared_is_its_own_verdict_never_validated(status):
    port = PortOutcome(parity_passed=True, median_ms=PORT_MS)
    refs = [RefOutcome("mslk_bf16i4_shuffled_grouped", role="baseline", production=True, status=status, error="group 32"),
            RefOutcome("bf16_grouped_predequant", parity_passed=True, median_ms=0.31),
            RefOutcome("mslk_bf16_grouped_stacked", parity_passed=True, median_ms=2.30)]
    d = decide(port, refs, NOISE)
    assert d.verdict == "no_production_reference" and d.fastest_production is None
    # the ratio quoted is against the alternative the port beats least, and it says it is not validation
    assert d.primary == "bf16_grouped_predequant" and d.speedup == pytest.approx(3.1)
    assert d.text.startswith("no production kernel was compared (mslk_bf16i4_shuffled_grouped ")
    assert "context, not validation" in d.text and "(group 32)" in d.text
    assert d.text.count("mslk_bf16i4_shuffled_grouped") == 1  # named once, in the head
    # a card that names no production kernel at all: the same verdict
    assert decide(port, refs[1:], NOISE).verdict == "no_production_reference"


def test_a_ratio_inside_the_noise_floor_is_never_faster_or_slower():
    assert speed_label(1.019, 2.0) == "within_noise"
    assert speed_label(0.981, 2.0) == "within_noise"
    assert speed_label(1.021, 2.0) == "faster"
    assert speed_label(0.979, 2.0) == "slower"
    # a bigger floor swallows a bigger ratio
    assert speed_label(1.08, 10.0) == "within_noise"
    assert speed_label(None, 2.0) == "not_timed"


def test_a_reference_that_could_not_run_is_named_with_its_error_and_the_next_production_kernel_leads():
    port = PortOutcome(parity_passed=True, median_ms=PORT_MS)
    for status, word in [("unavailable", "unavailable"), ("unsupported", "unsupported for this shape"), ("error", "failed to run")]:
        refs = [RefOutcome("mslk_rowwise_batched", role="baseline", production=True, status=status,
                           error="ModuleNotFoundError: No module named 'mslk'"),
                RefOutcome("mslk_rowwise_batched_pad16", production=True, parity_passed=True, median_ms=0.3)]
        d = decide(port, refs, NOISE)
        assert d.speeds["mslk_rowwise_batched"].speed == "not_timed" and d.speeds["mslk_rowwise_batched"].speedup is None
        assert d.primary == "mslk_rowwise_batched_pad16" and d.verdict == "validated"
        assert f"mslk_rowwise_batched (production) {word} (ModuleNotFoundError: No module named 'mslk')" in d.text


def test_no_reference_runs_at_all_is_skipped_on_a_gpu_and_says_why():
    port = PortOutcome(parity_passed=True, median_ms=PORT_MS)
    refs = [RefOutcome("mslk_bf16i4_shuffled_grouped", role="baseline", production=True, status="unsupported",
                       error="unsupported shape: cutlass cannot implement")]
    d = decide(port, refs, NOISE)
    assert d.verdict == "skipped" and d.primary is None and d.speedup is None
    assert "no reference could be timed" in d.text and "cutlass cannot implement" in d.text


def test_untimed_cpu_run_is_cpu_numerics_and_every_reference_not_timed():
    port = PortOutcome(parity_passed=True)
    d = decide(port, [RefOutcome("b", role="baseline", parity_passed=True)], None, gpu=False)
    assert d.verdict == "cpu_numerics_passed" and d.speeds["b"].speed == "not_timed"
    assert "no GPU timing" in d.text


def test_host_timing_labels_speeds_but_never_claims_gpu_evidence():
    port = PortOutcome(parity_passed=True, median_ms=PORT_MS)
    d = decide(port, [_base(True, "faster")], NOISE, gpu=False, timer="wall")
    assert d.verdict == "cpu_numerics_passed" and d.speeds["mslk_rowwise_batched"].speed == "faster"
    assert "not GPU evidence" in d.text


def test_a_problem_after_parity_claims_no_speed():
    port = PortOutcome(parity_passed=True, median_ms=PORT_MS, problem="slot integrity failed (port)")
    d = decide(port, [_base(True, "faster")], NOISE)
    assert d.verdict == "error" and d.speedup is None
    assert all(s.speed == "not_timed" for s in d.speeds.values())
    race = decide(PortOutcome(parity_passed=True, median_ms=PORT_MS, problem="it failed parity after the timed rounds",
                              problem_verdict="parity_failed"), [], NOISE)
    assert race.verdict == "parity_failed"


def test_unsupported_or_broken_port():
    assert decide(PortOutcome(status="unsupported", error="M=0"), [], None).verdict == "skipped"
    assert decide(PortOutcome(status="error", error="boom"), [], None).verdict == "error"


def test_a_reference_whose_slot_is_not_proven_is_not_evidence():
    port = PortOutcome(parity_passed=True, median_ms=PORT_MS)
    ref = RefOutcome("loop", role="baseline", parity_passed=True, median_ms=0.5, comparable=False,
                     why_not_comparable="its slot integrity failed (foreign kernel)")
    d = decide(port, [ref], NOISE)
    assert d.speeds["loop"].speed == "not_timed" and d.verdict == "skipped"
    assert "foreign kernel" in d.text


def test_without_a_noise_floor_the_text_says_so():
    d = decide(PortOutcome(parity_passed=True, median_ms=PORT_MS), [_base(True, "faster")], None)
    assert "no A/A noise floor measured" in d.text and d.verdict == "validated"


def test_unknown_reference_status_is_rejected():
    with pytest.raises(ValueError, match="unknown status"):
        decide(PortOutcome(parity_passed=True), [RefOutcome("x", status="missing")], None)


def test_report_shows_the_ratio_against_each_production_kernel_and_its_parity():
    from pathlib import Path

    from skillrun.evidence.index import build_index
    from skillrun.output.report import SUMMARY_COLUMNS, summary_row

    rec = {"verdict": "validated", "mode": "gpu_measured", "created": "2026-12-01T00:00:00+00:00",
           "card": {"id": "c"}, "recipe": {"name": "r"}, "shape": {"M": 1}, "speedup": 1.21,
           "timing": {"port_ms": {"median": 1.0}, "cuda_graph": True},
           "verdict_text": "faster than mslk (1.21x, A/A noise 2.1%), and mslk fails the oracle",
           "references": [
               {"name": "mslk", "role": "baseline", "production": True, "status": "ok", "parity": {"passed": False},
                "speedup": 1.21, "noise_pct": 2.1, "speed": "faster"},
               {"name": "mslk_pad16", "role": "alternative", "production": True, "status": "unsupported", "speed": "not_timed"},
               {"name": "loop", "role": "alternative", "production": False, "status": "ok", "parity": {"passed": True},
                "speedup": 7.6, "noise_pct": 2.1, "speed": "faster"}]}
    (entry,) = build_index(None, records=[rec], root=Path("/nonexistent")).entries
    row = summary_row(entry)
    # the headline is against the production baseline, with the noise the verdict used, and its failing parity shows
    assert row["speed"] == "1.210× vs mslk" and "A/A noise 2.10%" in row["speed_sub"] and row["speed_axis"] == "faster"
    parity = {text.split()[0]: (failed, prod) for text, failed, prod in row["ref_parity"]}
    assert parity["mslk"] == (True, True) and parity["loop"][0] is False and parity["mslk_pad16"][1] is True
    assert row["failing_baseline"] is True and "speedup vs production (A/A noise)" in SUMMARY_COLUMNS




def test_two_clocks_that_disagree_give_the_smaller_ratio_and_both_are_reported():
    """a16wi4 MoE decode on the H200 (8385f6d): events 23x, profiler kernel durations 2.46x; the reference
    read the routing back to the host inside its call."""
    port = PortOutcome(parity_passed=True, median_ms=0.0517, kernel_ms=0.0444, events_observed_ms=0.0513)
    ref = RefOutcome("mslk_bf16i4_shuffled_grouped", role="baseline", production=True, parity_passed=True, median_ms=1.19,
                     kernel_ms=0.1091, events_observed_ms=1.612, syncs_host=True)
    d = decide(port, [ref], 3.9)
    sp = d.speeds[ref.name]
    assert sp.events == pytest.approx(23.02, rel=1e-3) and sp.kernel == pytest.approx(2.457, rel=1e-3)
    assert d.speedup == sp.kernel == sp.speedup  # the headline is the smaller one ...
    assert d.speedup <= max(sp.events, sp.kernel)
    assert "events 23x, kernel durations 2.46x" in d.text  # ... both are reported ...
    assert "waits for the host inside its launch" in d.text  # ... and the reason is named
    # the kernel clock larger than the events: the events' ratio stands (the smaller one), and the port is named
    slow_port = PortOutcome(parity_passed=True, median_ms=0.060, kernel_ms=0.020, events_observed_ms=0.060)
    d2 = decide(slow_port, [RefOutcome("r", role="baseline", production=True, parity_passed=True, median_ms=0.066,
                                       kernel_ms=0.060, events_observed_ms=0.066)], 1.0)
    assert d2.speedup == pytest.approx(1.1) and "the port's event interval holds time outside its kernels" in d2.text


def test_clocks_that_agree_within_the_noise_keep_the_event_ratio():
    port = PortOutcome(parity_passed=True, median_ms=0.100, kernel_ms=0.098, events_observed_ms=0.101)
    ref = RefOutcome("cublas", role="baseline", production=True, parity_passed=True, median_ms=0.125, kernel_ms=0.121,
                     events_observed_ms=0.126)
    d = decide(port, [ref], 0.5)
    assert d.speedup == pytest.approx(1.25) and d.speeds["cublas"].clock_note is None
    assert "kernel durations" not in d.text


def test_the_noise_quoted_is_the_one_the_verdict_used_with_the_aa_band():
    d = decide(PortOutcome(parity_passed=True, median_ms=PORT_MS), [_base(True, "within_noise")], 1.37, aa_band=(0.981, 1.012))
    assert "A/A noise 1.37%, A/A ratio p10-p90 0.981-1.012" in d.text and d.verdict == "within_noise"


def test_readme_verdict_table_is_the_vocabulary():
    """The README's table and skillrun.evidence.verdict.VERDICTS are the same words with the same meanings."""
    from pathlib import Path

    from skillrun.evidence.verdict import VERDICTS

    readme = Path(__file__).resolve().parents[1].joinpath("README.md").read_text()
    table = readme[readme.index("| verdict | meaning |"):].split("\n\n")[0].splitlines()[2:]
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[2].strip() for line in table}
    assert rows == {k: meaning for k, (_, meaning) in VERDICTS.items()}


def test_every_verdict_decide_can_return_is_in_the_vocabulary():
    from skillrun.evidence.verdict import VERDICTS, reconcile

    port_ok = PortOutcome(parity_passed=True, median_ms=PORT_MS)
    seen = {decide(port_ok, [_base(True, s)], NOISE).verdict for s in REF_MS}
    seen |= {decide(PortOutcome(parity_passed=False, median_ms=PORT_MS), [_base(True, "faster")], NOISE).verdict,
             decide(PortOutcome(status="unsupported"), [], NOISE).verdict, decide(PortOutcome(status="error"), [], NOISE).verdict,
             decide(port_ok, [_base(True, "faster")], NOISE, gpu=False).verdict}
    assert seen <= set(VERDICTS)
    # a timed verdict follows the speed axis; anything else is kept
    assert reconcile("slower", "within_noise") == "within_noise" and reconcile("validated", "slower") == "slower"
    assert reconcile("parity_failed", "faster") == "parity_failed" and reconcile("skipped", "not_timed") == "skipped"
