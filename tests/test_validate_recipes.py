"""benchmarks/validate_recipes.py --budget: value order, a budget the call finishes inside, a resumable
manifest, and the call's device seconds by phase. The loop is driven with an injected measurement and
clock (what a device call would take), and once for real on the CPU backend."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from defects.kb import K, card, make_defect_kb
from skillrun import api

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def vr():
    sys.path.insert(0, str(BENCH))
    import validate_recipes

    yield validate_recipes
    sys.path.remove(str(BENCH))
    for mod in ("recipe_shapes", "validate_recipes"):
        sys.modules.pop(mod, None)


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    root = make_defect_kb(tmp_path_factory.mktemp("vr_kb"), [card("vr_a", f"{K}:build_port_ok"), card("vr_b", f"{K}:build_port_ok")])
    return root


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def time(self) -> float:
        return self.t


def _fake(monkeypatch, vr, costs: dict[str, tuple[float, float]]):
    """measure() that takes (first shape, later shapes) seconds per card on a fake clock."""
    clock = Clock()
    monkeypatch.setattr(vr.time, "time", clock.time)
    ran: list[tuple[str, str]] = []

    def measure(index, card_id, shape, *, pool, a, left):
        first, later = costs[card_id]
        took = first if not any(c == card_id for c, _ in ran) else later
        ran.append((card_id, shape))
        clock.t += took
        dev = {"process_start": 0.1 * took, "rounds": 0.5 * took, "checks": 0.4 * took}
        return {"card": {"id": card_id}, "shape": shape, "verdict": "slower", "speedup": 0.9, "artifact": f"{card_id}-{shape}.yaml",
                "cost": {"device_seconds": dev, "total_s": took, "processes_started": 3 if took == first else 0}}

    monkeypatch.setattr(vr, "measure", measure)
    return clock, ran


SHAPES_A = [f"vr_a:{m},32,64" for m in (16, 32, 48, 64)]
SHAPES_B = [f"vr_b:{m},32,64" for m in (16, 32)]


def test_the_call_finishes_inside_its_budget_and_the_manifest_resumes_it(vr, kb, tmp_path, monkeypatch, capsys):
    clock, ran = _fake(monkeypatch, vr, {"vr_a": (30.0, 5.0), "vr_b": (40.0, 6.0)})
    man = tmp_path / "manifest.json"
    args = [*SHAPES_A, *SHAPES_B, "--kb", str(kb), "--backend", "cpu", "--manifest", str(man), "--out", str(tmp_path / "v.json"),
            "--estimate-first-s", "30", "--estimate-shape-s", "5"]
    t0 = clock.t
    assert vr.main([*args, "--budget", "60"]) == 0
    assert clock.t - t0 <= 60  # inside the budget
    # card a: its start and three warm shapes fit (30 + 5 + 5 + 5 = 45); b's first shape (40) would not
    # fit after that, and is left for a later call, not half-run
    assert [c for c, _ in ran] == ["vr_a"] * 4
    m = json.loads(man.read_text())
    status = {f"{t['card']}:{t['shape']}": t["status"] for t in m["targets"]}
    assert [status[s] for s in SHAPES_A] == ["done"] * 4
    assert [status[s] for s in SHAPES_B] == ["not_run"] * 2
    call = m["calls"][0]
    assert call["budget_s"] == 60 and len(call["ran"]) == 4 and len(call["not_run"]) == 2
    # the call's device seconds by phase: the shapes' costs summed
    assert call["summary"]["shapes"] == 4 and call["summary"]["device_seconds"]["rounds"] == pytest.approx(0.5 * 45)
    assert "left for a later call" in capsys.readouterr().out
    # the same command in the next call runs only what is left
    ran.clear()
    assert vr.main([*args, "--budget", "60"]) == 0
    assert [c for c, _ in ran] == ["vr_b", "vr_b"]
    m = json.loads(man.read_text())
    assert all(t["status"] == "done" for t in m["targets"]) and len(m["calls"]) == 2
    rows = json.loads((tmp_path / "v.json").read_text())
    assert [r["card"] for r in rows] == ["vr_b", "vr_b"] and rows[0]["cost"]["processes_started"] == 3


def test_a_cheaper_shape_further_down_still_runs_when_a_costlier_one_does_not_fit(vr, kb, tmp_path, monkeypatch):
    clock, ran = _fake(monkeypatch, vr, {"vr_a": (20.0, 4.0), "vr_b": (50.0, 4.0)})
    args = [SHAPES_A[0], SHAPES_B[0], SHAPES_A[1], "--kb", str(kb), "--backend", "cpu", "--budget", "40",
            "--estimate-first-s", "30", "--estimate-shape-s", "5"]
    assert vr.main(args) == 0
    # a's first (35 estimated) runs; b's first (35) would end past 40; a's second, warm, fits
    assert ran == [("vr_a", "16,32,64"), ("vr_a", "32,32,64")]


def test_shapes_are_ordered_by_share_times_uncertainty(vr):
    index = api.load_index(ROOT)  # the checkout's cards and artifacts (an earlier test pinned a fixture KB)
    c = "triton_fp8_blockscale_gemm_sm90"
    # 4096x65536x1536 has a current artifact of the sustained engine (0.872x, A/A 0.01 %: far from 1);
    # 16x2048x7168 has none: it is worth more, whatever its share
    rows = vr.valued(index, [(c, "4096,65536,1536"), (c, "16,2048,7168")])
    assert [r["shape"] for r in rows] == ["16,2048,7168", "4096,65536,1536"]
    measured = rows[1]
    assert measured["current"] and measured["uncertainty"] < 0.1 and rows[0]["uncertainty"] == 1.0
    # uncertainty from the margin: a ratio one noise floor from 1 is a close call
    class Hit:
        class summary:  # noqa: N801
            engine, verdict, noise_pct, speedup = "sustained", "slower", 1.0, 0.99

    assert vr.uncertainty(Hit) == pytest.approx(1 / (1 + 1.0), rel=0.02)
    Hit.summary.speedup = 2.0
    assert vr.uncertainty(Hit) < 0.02
    Hit.summary.engine = "position_biased"
    assert vr.uncertainty(Hit) == 1.0


def test_a_real_budgeted_call_on_the_cpu_backend_shares_the_cards_processes(vr, kb, tmp_path):
    man = tmp_path / "m.json"
    assert vr.main([SHAPES_A[0], SHAPES_A[1], "--kb", str(kb), "--backend", "cpu", "--timer", "wall", "--no-graph",
                    "--rounds", "6", "--seeds", "1", "--budget", "300", "--manifest", str(man)]) == 0
    m = json.loads(man.read_text())
    done = [t for t in m["targets"] if t["status"] == "done"]
    assert len(done) == 2 and all(t["verdict"] == "cpu_numerics_passed" for t in done)
    assert [t["cost"]["processes_started"] for t in done] == [3, 0]  # one session for the card's shapes
    assert m["calls"][0]["summary"]["shapes"] == 2 and m["calls"][0]["summary"]["device_seconds"]["imports"] > 0


def test_the_device_script_for_every_sm90_shape_parses_and_names_what_exists():
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    script = BENCH / "device_measure_all_sm90.sh"
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    text = script.read_text()
    for path in ("benchmarks/validate_recipes.py", ".ci/device-env.sh"):
        assert path in text and (ROOT / path).exists(), path
    for flag in ("--budget", "--manifest", "--compile-cache", "timeout"):
        assert flag in text
    cards = ["triton_fp8_blockscale_gemm_sm90", "triton_fp8_rowwise_batched_gemm_sm90", "triton_moe_a16wi4_sm90",
             "triton_moe_fp8_blockscale_sm90"]
    assert all(c in text and (ROOT / "skills" / c / "SKILL.md").exists() for c in cards)
    # the README gives this exact command for the H200 (issue 35)
    readme = (ROOT / "README.md").read_text()
    assert "BUDGET_S=540 OUT=$OUT bash benchmarks/device_measure_all_sm90.sh" in readme


def test_first_shapes_lead_and_are_re_measured_even_when_the_manifest_has_them_done(vr, kb, tmp_path, monkeypatch):
    clock, ran = _fake(monkeypatch, vr, {"vr_a": (10.0, 2.0), "vr_b": (10.0, 2.0)})
    man = tmp_path / "manifest.json"
    args = [*SHAPES_A, *SHAPES_B, "--kb", str(kb), "--backend", "cpu", "--manifest", str(man), "--budget", "300"]
    assert vr.main(args) == 0
    assert len(ran) == 6
    # a second call with --first: the bench beside it compares against this call's numbers, so the shape
    # runs again (and first) although the manifest has it done; nothing else is left to run
    ran.clear()
    assert vr.main([*args, "--first", SHAPES_B[1], "--first", SHAPES_A[2]]) == 0
    assert ran == [("vr_b", "32,32,64"), ("vr_a", "48,32,64")]
    m = json.loads(man.read_text())
    assert all(t["status"] == "done" for t in m["targets"])
    # in a fresh call the --first shapes lead the value order, and one not among the targets is added
    ran.clear()
    assert vr.main([SHAPES_A[0], SHAPES_A[1], "--first", SHAPES_B[0], "--kb", str(kb), "--backend", "cpu", "--budget", "300"]) == 0
    assert ran[0] == ("vr_b", "16,32,64") and sorted(ran[1:]) == [("vr_a", "16,32,64"), ("vr_a", "32,32,64")]
