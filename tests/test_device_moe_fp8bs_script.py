"""The CPU-checkable pieces of benchmarks/device_moe_fp8bs_sm90.sh (the fp8 block-scale MoE device run):
the script parses, the recipe shapes run one per recipe first (so a short budget covers every recipe),
and the plan handed to `skill-run e2e` keeps only the MoE card's items in a form e2e reads, or the
script is told (exit 4) that the workload's trace gave none.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skillrun import api

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
FIX = ROOT / "tests" / "fixtures"
CARD = "triton_moe_fp8_blockscale_sm90"
SHAPES = ["tokens=16,model_dim=7168,inter_dim=2048,experts=256,topk=8",
          "tokens=4096,model_dim=7168,inter_dim=2048,experts=256,topk=8"]


@pytest.fixture(scope="module")
def bench_path():
    sys.path.insert(0, str(BENCH))
    yield
    sys.path.remove(str(BENCH))
    for mod in ("recipe_shapes", "validate_recipes", "plan_filter"):
        sys.modules.pop(mod, None)


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_script_parses_and_names_what_exists():
    script = BENCH / "device_moe_fp8bs_sm90.sh"
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    text = script.read_text()
    for path in ("benchmarks/workloads/fp8_blockscale_moe_workload.py", "kernels/skillrun_kernels/fp8_blockscale_moe/route.py",
                 "benchmarks/validate_recipes.py", "benchmarks/plan_filter.py", ".ci/device-env.sh"):
        assert path in text and (ROOT / path).exists(), path
    assert "BUDGET_S" in text and "timeout" in text
    # its steps are bounded by the shared runner (benchmarks/device_budget.sh) it sources
    assert "device_budget.sh" in text and "timeout -k" in (BENCH / "device_budget.sh").read_text()


def test_recipe_shapes_run_one_per_recipe_first(bench_path):
    import recipe_shapes
    import validate_recipes

    cases = recipe_shapes.card_cases(CARD, untuned=True)
    spread = recipe_shapes.recipes_first(cases)
    recipes = [r for _, r in cases]
    distinct = list(dict.fromkeys(recipes))
    assert len(distinct) == 4 and "untuned_default" in distinct
    assert [r for _, r in spread[:len(distinct)]] == distinct  # every recipe before any repeat
    assert sorted(spread) == sorted(cases)  # nothing dropped or added
    assert validate_recipes.targets([CARD], spread=True) == [(CARD, s) for s, _ in spread]
    assert validate_recipes.targets([CARD]) == [(CARD, s) for s, _ in cases]  # default order unchanged
    assert validate_recipes.targets([f"{CARD}:{SHAPES[0]}"], spread=True) == [(CARD, SHAPES[0])]
    assert recipe_shapes.card_shapes(CARD) == [s for s, r in cases if r != "untuned_default"]


def _analysis_json(trace: Path) -> dict:
    a = api.analyze(trace, index=api.load_index(), shapes=SHAPES)
    return {"plan": a.plan.model_dump(mode="json")}


def test_plan_filter_keeps_the_cards_items_in_a_form_e2e_reads(bench_path, tmp_path):
    import plan_filter

    src = tmp_path / "analysis.json"
    src.write_text(json.dumps(_analysis_json(FIX / "kineto_h200_deepgemm_moe.synthetic.json")))
    out = tmp_path / "plan_moe.json"
    assert plan_filter.main([str(src), "--card", CARD, "--out", str(out)]) == 0
    plan = api.load_plan(out)
    assert {i.skill_id for i in plan.items} == {CARD}
    assert sorted(i.shape["tokens"] for i in plan.items) == [16, 4096]
    # `skill-run plan --json` spells the trace `source`: the filter keeps the document as it came
    # and e2e's loader reads that spelling into the model's `profile`
    listed = json.loads(out.read_text())
    listed = {"schema_version": 1, "source": listed.pop("profile"), **listed}
    src.write_text(json.dumps(listed))
    assert plan_filter.main([str(src), "--card", CARD, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["source"] == listed["source"]
    assert api.load_plan(out).profile.endswith("kineto_h200_deepgemm_moe.synthetic.json")


def test_plan_filter_says_when_the_trace_gave_no_item(bench_path, tmp_path, capsys):
    import plan_filter

    src = tmp_path / "analysis.json"
    src.write_text(json.dumps(_analysis_json(ROOT / "runner/skillrun/examples/h200_fp8_blockscale_scaled_mm.pt.trace.json.gz")))
    out = tmp_path / "plan_moe.json"
    assert plan_filter.main([str(src), "--card", CARD, "--out", str(out)]) == 4
    assert not out.exists() and "no runnable item" in capsys.readouterr().out
    src.write_text("{not json")
    assert plan_filter.main([str(src), "--card", CARD, "--out", str(out)]) == 3


def test_workload_runs_its_layer_as_one_op_the_profiler_records_with_its_shape(bench_path, monkeypatch, tmp_path):
    """The bundled workload's layer op on the CPU (a stand-in launch, since the cuBLAS baseline needs a
    GPU): the op calls the launch's run (looked up when built, so e2e's route applies), and a real
    torch.profiler trace records it with Input Dims from which the runner reads the MoE shape and the
    128x128 weight-scale grid."""
    import torch

    sys.path.insert(0, str(BENCH / "workloads"))
    try:
        import fp8_blockscale_moe_workload as wl
    finally:
        sys.path.remove(str(BENCH / "workloads"))
    from skillrun.ingest.shapes import op_shape
    from skillrun_kernels.fp8_blockscale_moe import problem, references
    from skillrun_kernels.protocol import KernelLaunch

    calls = []

    def fake_build(shape, config, device):
        def run(p, out):
            calls.append(sorted(p))
            out.fill_(1.0)
            return out
        return KernelLaunch(name="stand_in", run=run)

    monkeypatch.setattr(references, "build_cublas_per_expert", fake_build)
    shape = {"tokens": 4, "model_dim": 256, "inter_dim": 128, "experts": 4, "topk": 2}
    inputs = problem.make_inputs(shape, 0, "cpu")
    launch = wl.build_layer(shape, {}, "cpu")
    out = problem.output_like(shape, "cpu")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        launch.run(launch.prepare(inputs), out)
    assert calls == [sorted(wl.OPERANDS)] and bool((out == 1).all())
    path = tmp_path / "cpu_trace.json"
    prof.export_chrome_trace(str(path))
    ops = [e for e in json.loads(path.read_text())["traceEvents"]
           if e.get("cat") == "cpu_op" and e.get("name") == "skillrun::fused_moe_fp8_blockscale"]
    assert len(ops) == 1
    got = op_shape(ops[0]["name"], ops[0]["args"]["Input Dims"], ops[0]["args"]["Input type"])
    assert got.shape == shape and got.scale_recipe == "blockwise_1x128_128x128" and got.dtype == "fp8_e4m3"


def test_skip_current_leaves_out_only_shapes_the_sustained_engine_measured_on_this_device(bench_path):
    """Repeated device calls of validate_recipes --skip-current work through a card's shapes: the five
    block-scale prefill shapes measured at 0d3d55c (sustained engine) are done on an H200; a decode
    shape with no artifact and a row-wise shape whose artifact is from the position-biased engine are
    still to run; nothing is done for an H100 (another device class)."""
    import validate_recipes

    index = api.load_index()
    card = "triton_fp8_blockscale_gemm_sm90"
    biased = ("triton_fp8_rowwise_batched_gemm_sm90", "batch=16,M=128,N=8192,K=1024")  # 20261129T093848Z only
    todo = [(card, "4096,65536,1536"), (card, "8192,8192,8192"), (card, "16,2048,7168"), biased]
    left, done = validate_recipes.pending(index, todo, device_name="NVIDIA H200")
    assert [d["shape"] for d in done] == ["4096,65536,1536", "8192,8192,8192"]
    assert all(d["verdict"] == "already measured" and "20261202T0" in d["artifact"] for d in done)
    assert left == [(card, "16,2048,7168"), biased]
    left, done = validate_recipes.pending(index, todo, device_name="NVIDIA H100 80GB HBM3")
    assert not done and left == todo
