"""Raw-sample distributions in `skill-run report`: read from the committed H200 artifacts of the
held timing engine, shown per slot in the terminal (with --samples, or for one named artifact) and
as a strip chart in the HTML page; older artifacts without raw samples show nothing new."""
from __future__ import annotations

import copy
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from skillrun.output.report import _details_body, samples_html, samples_svg, samples_text
from skillrun.evidence.samples import distributions

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "validation" / "triton_fp8_blockscale_gemm_sm90"
HELD = sorted(FOLDER.glob("20261202T01*_gpu_measured.yaml"))  # held engine (3ea3446), superseded since
SUSTAINED = sorted(FOLDER.glob("20261202T03*_gpu_measured.yaml")) + sorted(FOLDER.glob("20261202T04*_gpu_measured.yaml"))
# the decode shapes measured through the session referee (9e50fc8, 8385f6d), same sustained engine
REFEREED = sorted(FOLDER.glob("20261202T06*_gpu_measured.yaml")) + sorted(FOLDER.glob("20261202T07*_gpu_measured.yaml"))
OLD = FOLDER / "20261129T092558Z_prefill_k_light_M16384xN7168xK768_gpu_measured.yaml"


def _load(p: Path) -> dict:
    return yaml.safe_load(p.read_text())


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="400")
    return subprocess.run([sys.executable, "-m", "skillrun", *args], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)


def test_distributions_agree_with_the_engines_own_summary():
    assert HELD, "the committed held-engine artifacts are missing"
    for p in HELD:
        rec = _load(p)
        t = rec["timing"]
        d = distributions(rec)
        by = {s.slot: s for s in d.slots}
        assert set(by) == set(t["raw_samples"])  # every slot, the A/A copy included
        for slot, st in [("port", t["port_ms"]), ("baseline", t["baseline_ms"])] + \
                [(f"alt:{k}", v) for k, v in (t.get("alternatives_ms") or {}).items()]:
            s = by[slot]
            # Only the kept samples: the engine's statistics were computed from exactly these.
            assert len(s.kept_ms) == st["samples"] and s.total == len(t["raw_samples"][slot]["ms"])
            assert s.median == pytest.approx(st["median"], abs=2e-6)
            assert s.p10 == pytest.approx(st["p10"], abs=2e-6) and s.p90 == pytest.approx(st["p90"], abs=2e-6)
            assert s.by_position == pytest.approx(t["position_effect"]["median_ms_by_position"][slot])
        assert d.warnings == t["warnings"]


def test_per_position_medians_are_computed_when_the_engine_did_not_list_them():
    rec = copy.deepcopy(_load(HELD[0]))
    del rec["timing"]["position_effect"]
    raw = rec["timing"]["raw_samples"]["port"]
    d = {s.slot: s for s in distributions(rec).slots}["port"]
    first = sorted(ms for ms, pos, k in zip(raw["ms"], raw["position"], raw["kept"]) if pos == 0 and k)
    assert d.by_position[0] == pytest.approx(first[len(first) // 2] if len(first) % 2 else
                                             (first[len(first) // 2 - 1] + first[len(first) // 2]) / 2)
    assert len(d.by_position) == max(raw["position"]) + 1


def test_an_older_artifact_without_raw_samples_shows_nothing_new():
    rec = _load(OLD)
    assert "raw_samples" not in rec["timing"]
    assert distributions(rec) is None and samples_text(str(OLD), rec) is None and samples_svg(rec) is None
    assert samples_html(rec) is None and "raw samples" not in _details_body(rec)


def test_terminal_lines_per_slot_with_quantiles_positions_and_warnings():
    rec = _load(HELD[0])
    buf = io.StringIO()
    Console(file=buf, width=400, color_system=None).print(samples_text("a.yaml", rec))
    text = buf.getvalue()
    t = rec["timing"]
    port = next(line for line in text.splitlines() if line.strip().startswith("port "))
    n = t["port_ms"]["samples"]
    assert f"{n}/{len(t['raw_samples']['port']['ms'])}" in port
    assert f"{t['port_ms']['median']:.4g}" in port and f"{t['port_ms']['p90']:.4g}" in port
    assert port.rstrip().endswith(" ".join(f"{v:.4g}" for v in t["position_effect"]["median_ms_by_position"]["port"]))
    assert "baseline#aa" in text and "warning: position effect" in text


def test_untrusted_raw_samples_are_read_as_far_as_they_agree():
    rec = {"timing": {"raw_samples": {
        "port": {"ms": [0.1, "x", float("nan"), 0.3, 0.2], "position": [0, 1, 0, 1, True], "kept": [True, True, True, True, True]},
        "bad": "not a mapping",
        "short_kept": {"ms": [1.0, 2.0], "kept": [False]},  # kept of the wrong length: every sample counts
        "\x1b[31m<b>": {"ms": [0.5], "kept": [True]}},
        "warnings": "not a list", "hold": {"used": True, "final_us": "?"}}}
    d = {s.slot: s for s in distributions(rec).slots}
    assert d["port"].kept_ms == [0.1, 0.3, 0.2] and d["port"].by_position == [0.1, 0.3]
    assert d["short_kept"].kept_ms == [1.0, 2.0] and "bad" not in d
    svg = samples_svg(rec)
    assert "<b>" not in svg and "&lt;b&gt;" in svg
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(samples_text("x.yaml", rec))
    assert "\x1b" not in buf.getvalue() and "\\x1b" in buf.getvalue()  # a control character is shown, not obeyed
    assert distributions({"timing": {"raw_samples": {"p": {"ms": [], "kept": []}}}}) is None


def test_the_strip_chart_draws_every_kept_sample_and_fits_an_800px_page():
    rec = _load(HELD[0])
    svg = samples_svg(rec)
    width = int(re.search(r'viewBox="0 0 (\d+) ', svg).group(1))
    assert width <= 720  # an 800 px page shows it unscaled, so its 11 px text stays 11 px
    kept = sum(sum(1 for k in c["kept"] if k) for c in rec["timing"]["raw_samples"].values())
    assert svg.count("<circle") == kept
    # a huge artifact cannot make a huge page: at most 300 dots per slot
    big = {"timing": {"raw_samples": {"port": {"ms": [0.1 + i * 1e-6 for i in range(5000)]}}}}
    assert samples_svg(big).count("<circle") <= 300


def test_report_cli_shows_samples_for_one_artifact_or_with_the_flag():
    one = _cli("report", str(HELD[0].relative_to(REPO)))
    assert one.returncode == 0, one.stderr
    assert "raw samples: " in one.stdout and "warning: position effect" in one.stdout
    plain = _cli("report", str(FOLDER.relative_to(REPO)))
    assert plain.returncode == 0 and "raw samples: " not in plain.stdout
    flagged = _cli("report", str(FOLDER.relative_to(REPO)), "--samples")
    assert flagged.returncode == 0, flagged.stderr
    shown = re.findall(r"raw samples: (\S+)", flagged.stdout)
    # every current artifact of the folder with raw samples, and none of the older ones without
    assert shown and all("raw_samples" in (REPO / p).read_text() for p in shown)
    # the current ones are the sustained engine's (0d3d55c, and the decode shapes since): the held runs
    # they superseded are not shown
    assert {Path(p).name for p in shown} == {p.name for p in SUSTAINED + REFEREED}
    assert len(SUSTAINED) == 5 and len(REFEREED) == 6
    old = _cli("report", str(OLD.relative_to(REPO)))
    assert old.returncode == 0 and "raw samples: " not in old.stdout
