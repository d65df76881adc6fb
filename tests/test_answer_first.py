"""Answer first: the one line that answers comes before everything else, criteria only on request,
and colours follow meaning (faster green, slower amber, within noise plain)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rich.text import Text

from skillrun.models import Plan, PlanItem
from skillrun.plan.planner import answer_line, item_lines
from skillrun.output.report import results_answer

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "runner" / "skillrun" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz"


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "skillrun", *args], capture_output=True, text=True, timeout=300, env=env)


def test_profile_and_plan_print_the_answer_first_and_criteria_only_with_v():
    for args in (["--profile", str(EXAMPLE)], ["plan", str(EXAMPLE)]):
        res = _cli(*args)
        assert res.returncode == 0, res.stderr
        first = res.stdout.split("\n\n")[0].split("\nh200_fp8")[0].replace("\n", " ")  # the answer, however it wraps
        # the trace's own call being wrong (K=768, unpadded scales) comes before everything else
        assert first.startswith("Answer: your call returns wrong results here: [3] M=16384,N=7168,K=768")
        assert "1 card(s) match" in first and "projected end-to-end gain" in first and "next:" in first
        assert "✓" not in res.stdout and "add -v" in res.stdout
        verbose = _cli(*args, "-v")
        assert verbose.stdout.replace("\n", " ").startswith(first) and "✓ identity" in verbose.stdout
    assert "✓ identity" in _cli("match", str(EXAMPLE)).stdout  # match is the criteria view


def _styles(markup: str) -> dict[str, str]:
    t = Text.from_markup(markup)
    return {t.plain[s.start:s.end]: str(s.style) for s in t.spans}


def _plan(gain: float, speed: str, speedup: float) -> Plan:
    ev = {"path": "validation/x.yaml", "age": "1 h old", "speedup": speedup, "versus": "cublas", "noise_pct": 2.0,
          "speed": speed, "device": "H200 (sm_90)", "commit": "abc", "timing_mode": "CUDA graph", "shape": {"M": 1}}
    item = PlanItem(skill_id="c", kernel="k", pct_gpu=50.0, shape={"M": 1}, recipe="r", expected_speedup=speedup,
                    expected_source="measured", evidence=ev, projected_e2e_gain_pct=gain)
    return Plan(profile="t", arch="sm_90", items=[item], projected_gain_pct=gain, projected_gain_all_pct=gain,
                measured_gain_pct=gain, prior_gain_pct=0.0)


def test_colours_follow_meaning_not_source():
    slow = _plan(-7.6, "slower", 0.879)
    assert _styles(answer_line(slow, 1))["projected end-to-end gain -7.60% of GPU time"] == "yellow"
    line = next(l for l in item_lines(1, slow.items[0]) if "0.879×" in l)
    assert _styles(line)["0.879×"] == "bold yellow"
    fast = _plan(10.0, "faster", 1.25)
    assert _styles(answer_line(fast, 1))["projected end-to-end gain +10.00% of GPU time"] == "green"
    tie = _plan(0.0, "within_noise", 0.99)
    styles = _styles(answer_line(tie, 1))
    assert not any("projected" in k for k in styles)  # a tie is not coloured at all
    line = next(l for l in item_lines(1, tie.items[0]) if "0.990×" in l)
    assert _styles(line)["0.990×"] == "bold"


def test_run_answer_counts_verdicts_by_tone():
    recs = [{"verdict": "slower", "speedup": 0.8, "mode": "gpu_measured", "card": {"id": "c"}, "artifact": "a.yaml"},
            {"verdict": "validated", "speedup": 1.3, "mode": "gpu_measured", "card": {"id": "c"}}]
    line = results_answer(recs)
    assert line.startswith("[bold]Answer:[/] 2 run(s)") and "0.800× to 1.300×" in line and "1 artifact(s) written" in line
    styles = _styles(line)
    assert styles["1 slower"] == "yellow" and styles["1 validated"] == "green"


def test_runs_report_item_by_item_on_a_terminal_and_stay_silent_when_piped(monkeypatch):
    import io

    from rich.console import Console

    from skillrun.cli.common import ItemProgress
    from skillrun.execute import harness

    seen = []
    monkeypatch.setattr(harness, "execute_item", lambda index, item, backend=None, **kw: seen.append(("run", item.shape)) or
                        {"verdict": "slower" if item.shape["M"] == 1 else "validated", "speedup": 0.9 if item.shape["M"] == 1 else 1.2})
    plan = Plan(profile="t", arch="sm_90", items=[PlanItem(skill_id="c", kernel="k", pct_gpu=1.0, shape={"M": m}) for m in (1, 2)])
    buf = io.StringIO()
    tty = Console(file=buf, force_terminal=True, width=120, color_system=None)
    with ItemProgress(tty) as on_item:
        harness.execute_plan(None, plan, backend="cpu", on_item=lambda *a: (seen.append(a[0]), on_item(*a)))
    assert seen == ["start", ("run", {"M": 1}), "done", "start", ("run", {"M": 2}), "done"]
    text = buf.getvalue()  # a live status line while running, then one line per finished item
    assert "running [1/2] c M=1" in text
    assert text.index("[1/2] c M=1: slower 0.900× (") < text.index("[2/2] c M=2: validated 1.200× (")
    piped = Console(file=io.StringIO(), force_terminal=False)
    with ItemProgress(piped) as on_item:
        assert on_item is None  # nothing is drawn into a pipe or a log


def test_progress_estimates_the_time_left_from_the_items_finished_so_far():
    import io

    from rich.console import Console

    from skillrun.cli.common import ItemProgress

    now = [0.0]  # an injected clock: item 1 takes 10 s, item 2 takes 20 s
    buf = io.StringIO()
    tty = Console(file=buf, force_terminal=True, width=160, color_system=None)
    items = [PlanItem(skill_id="c", kernel="k", pct_gpu=1.0, shape={"M": m}) for m in (1, 2, 3, 4)]
    with ItemProgress(tty, clock=lambda: now[0]) as on_item:
        on_item("start", 0, 4, items[0])
        assert on_item.time_left(0, 4) is None  # nothing finished: no guess
        now[0] += 10
        on_item("done", 0, 4, items[0], {"verdict": "validated", "speedup": 1.1})
        assert on_item.time_left(1, 4) == 30  # 3 left at 10 s each
        on_item("start", 1, 4, items[1])
        now[0] += 20
        on_item("done", 1, 4, items[1], {"verdict": "slower", "speedup": 0.9})
        assert on_item.time_left(2, 4) == 30  # 2 left at the 15 s mean
        on_item("start", 2, 4, items[2])
        now[0] += 15
        on_item("done", 2, 4, items[2], {"verdict": "validated", "speedup": 1.0})
        on_item("start", 3, 4, items[3])
        now[0] += 15
        on_item("done", 3, 4, items[3], {"verdict": "validated", "speedup": 1.0})
    text = buf.getvalue()
    assert "[1/4] c M=1: validated 1.100× (10.0 s; about 30 s left (estimate))" in text
    assert "[2/4] c M=2: slower 0.900× (20.0 s; about 30 s left (estimate))" in text
    assert "running [2/4] c M=2 … (about 30 s left (estimate))" in text  # the live line says it too
    assert "[4/4] c M=4: validated 1.000× (15.0 s)" in text  # the last item: nothing left to estimate
    assert "left" not in text.split("[4/4] c M=4: ")[1]


def test_durations_read_as_a_person_says_them():
    from skillrun.cli.common import _seconds

    assert [_seconds(x) for x in (0.2, 4.4, 59.6, 200, 3900)] == ["under 1 s", "4 s", "1 min 00 s", "3 min 20 s", "1 h 05 min"]


def test_help_is_grouped_short_h_works_and_ids_get_a_did_you_mean():
    res = _cli("-h")
    assert res.returncode == 0
    text = res.stdout
    panels = ["Analyse a trace", "Cards", "Run and check ports", "Evidence", "Setup", "Agents"]
    assert all(p in text for p in panels) and [text.index(p) for p in panels] == sorted(text.index(p) for p in panels)
    assert "With --run (on a GPU)" in text  # the run-only options are apart from the analysis options
    assert "issue 11" not in text and "lent" not in text
    assert "when the trace does not say" not in _cli("ablate", "-h").stdout  # ablate reads no trace
    bad = _cli("show", "triton_fp8_blockscale_gem_sm90")
    assert bad.returncode == 2 and "did you mean 'triton_fp8_blockscale_gemm_sm90'" in bad.stderr
    bad = _cli("fact", "sm90_hardwre")
    assert bad.returncode == 2 and "did you mean 'sm90_hardware'" in bad.stderr


def test_e2e_answer_line_colours_the_measured_gain_by_meaning():
    from skillrun.cli.e2e import answer_line as e2e_answer

    rec = {"measured": {"wall": {"gain_pct": -3.2, "noise_floor_pct": 1.0, "speed": "slower"}},
           "projection": {"gain_pct": 4.0}, "verdict_detail": {"outputs": "passed"}}
    line = e2e_answer(rec)
    assert line.startswith("[bold]Answer:[/] routing the ports in") and "projected +4.00%" in line and "outputs passed" in line
    assert _styles(line)["-3.20% (slower, noise floor 1.00%)"] == "yellow"
    rec["measured"]["wall"].update(gain_pct=0.4, speed="within_noise")
    assert not any("0.40%" in k for k in _styles(e2e_answer(rec)))


def test_long_steps_show_a_spinner_and_their_time_on_a_terminal_only():
    import io

    from rich.console import Console

    from skillrun.cli.common import busy

    buf = io.StringIO()
    with busy("compiling x", Console(file=buf, force_terminal=True, width=100, color_system=None)):
        pass
    assert "compiling x …" in buf.getvalue() and "compiling x: 0.0 s" in buf.getvalue()
    piped = io.StringIO()
    with busy("compiling x", Console(file=piped, force_terminal=False)):
        pass
    assert piped.getvalue() == ""
