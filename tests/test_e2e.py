"""`skill-run e2e` on the CPU: a tiny per-batch row-wise workload (tests/e2e_workloads/rowwise_loop.py)
run as-is and with the Triton port routed in through the Triton interpreter, plus the bad cases.
The route modules' argument mappings are checked in-process against the fp32 oracles.
"""
from __future__ import annotations

import sys

import os
from pathlib import Path

import pytest
import torch

from skillrun import api
from skillrun.profiling import routing as child
from skillrun.e2e.spec import build_spec
from skillrun.errors import SkillRunError
from skillrun.models import Plan, PlanItem
from skillrun.evidence.validation import load_artifact

HERE = Path(__file__).resolve().parent
WORKLOAD = str(HERE / "e2e_workloads" / "rowwise_loop.py")
ROWWISE = "triton_fp8_rowwise_batched_gemm_sm90"
PORT = "skillrun_kernels.fp8_rowwise_batched_gemm.triton_sm90:build"


@pytest.fixture(scope="module")
def index():
    return api.load_index()


def _plan(index, kernel_ref=PORT, shape=None, backend="triton") -> Plan:
    card = index.skill(ROWWISE)
    item = PlanItem(skill_id=card.id, kernel="nvjet_sm90_qqtst_128x128_ovscale", pct_gpu=80.0,
                    shape=shape or {"batch": 2, "M": 16, "N": 32, "K": 64}, recipe=card.recipes[0].name,
                    kernel_ref=kernel_ref, backend=backend, config={"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 1},
                    tolerance=card.tolerance, expected_speedup=1.5, projected_e2e_gain_pct=round(80 * (1 - 1 / 1.5), 4))
    return Plan(profile="synthetic", arch="sm_90", items=[item])


def _e2e(index, plan, mode="ok", **kw):
    return api.e2e([sys.executable, WORKLOAD, "--iters", "2", "--mode", mode], index=index, plan=plan, backend="cpu",
                   alternations=1, **kw)


def test_routed_run_counts_calls_matches_outputs_and_writes_a_valid_record(index, tmp_path):
    from skillrun.e2e import record as record_mod

    rec = _e2e(index, _plan(index), write=False)
    # 2 batches x 2 iterations: every call routed in B, and A saw the same calls (observe-only).
    assert rec["routing"]["routed_calls_per_run"] == [4]
    assert rec["routing"]["routable_calls_per_run_a"] == [4]
    assert rec["cards"][0]["id"] == ROWWISE and rec["card_ids"] == [ROWWISE]
    assert rec["cards"][0]["items"][0]["routed_calls"] == [4]
    item = rec["cards"][0]["items"][0]  # what ran: the port's module and the shared helpers it imports
    assert item["kernel_sources"][item["kernel"].split(":")[0]] == item["kernel_source_sha256"]
    assert "skillrun_kernels.protocol" in item["kernel_sources"]
    assert rec["outputs"]["method"] == "saved_tensors" and rec["outputs"]["passed"] is True
    assert rec["outputs"]["compared"][0]["name"] == "y" and rec["outputs"]["compared"][0]["rel_fro"] < 0.01
    assert rec["verdict_detail"]["outputs"] == "passed" and rec["verdict"].startswith("e2e_")
    # sampled calls of both arms (the warm-up runs) checked against the fp32 oracle: both right here
    orc = rec["outputs"]["oracle"]
    assert orc["fails"] == "none" and orc["as_is"]["checked"] == orc["routed"]["checked"] == 2, orc
    assert rec["verdict_detail"]["oracle_fails"] == "none" and "both arms pass the fp32 oracle" in rec["reason"]
    assert rec["routing"]["mechanism"] == ["TorchDispatchMode on aten::_scaled_mm"]
    w = rec["measured"]["wall"]
    assert w["basis"] == "step" and len(w["a"]["runs_ms"]) == 1 and len(w["aa_pair_ms"]) == 2
    assert rec["projection"]["gain_pct"] == pytest.approx(26.6667, abs=1e-3)
    # no machine paths: the interpreter, the workload and the working folder are KB-relative or redacted
    words = rec["command"].split(" ") + rec["workload"]["command"] + [rec["workload"]["cwd"]]
    assert not [w for w in words if w.startswith("/")], words
    assert any(w.endswith(Path(WORKLOAD).name) for w in rec["workload"]["command"])
    path = record_mod.write_record(rec, tmp_path)
    assert path.parent == tmp_path / "e2e" and path.name.endswith("_e2e.yaml")
    back = load_artifact(path)  # validated against schemas/e2e.schema.json by its kind
    assert back["kind"] == "e2e_validation" and back["measured"]["wall"]["gain_pct"] == w["gain_pct"]
    second = record_mod.write_record(rec, tmp_path)
    assert second != path and path.exists()  # never overwrites
    from skillrun.output.report import load_artifacts, report_table

    rows = load_artifacts([tmp_path])
    assert [r["verdict"] for r in rows] == [rec["verdict"]] * 2  # valid records, not "invalid" rows
    report_table(rows)  # the reviewer's table takes them (one-word verdict, reason line)
    # The evidence index keeps e2e records beside (never inside) the per-shape groups, and the
    # reviewer's report lists each with the measured gain next to the projection.
    from rich.console import Console

    from skillrun.evidence.index import build_index
    from skillrun.output.report import render_html, terminal_report

    ev = build_index(None, [tmp_path], root=tmp_path)
    assert len(ev.e2e) == 2 and not ev.entries
    assert ev.to_json()["e2e"][0]["card_ids"] == [ROWWISE]
    con = Console(width=200, record=True)
    con.print(terminal_report(ev))
    text = con.export_text()
    assert "End to end" in text and ROWWISE in text and "+26.67%" in text
    page = render_html(ev)
    assert "End to end (skill-run e2e)" in page and "+26.67%" in page


def test_output_check_catches_a_port_that_changes_the_result(index):
    rec = _e2e(index, _plan(index, kernel_ref="wrong_port:build_wrong"), write=False)
    assert rec["routing"]["routed_calls_per_run"] == [4]
    assert rec["outputs"]["passed"] is False and rec["verdict"] == "e2e_outputs_failed"
    assert "outside rtol" in rec["outputs"]["error"]
    orc = rec["outputs"]["oracle"]
    assert orc["fails"] == "routed" and orc["as_is"]["passed"] is True and orc["routed"]["passed"] is False, orc
    assert "the routed arm fails the fp32 oracle (2 of 2 sampled calls" in rec["outputs"]["error"]
    assert rec["verdict_detail"]["oracle_fails"] == "routed"


def test_workload_failing_in_both_arms_shows_both_exit_codes(index, tmp_path):
    with pytest.raises(SkillRunError) as exc:
        _e2e(index, _plan(index), mode="fail", write=True)
    msg = str(exc.value)
    assert "arm A (as-is) exited with code 3" in msg and "arm B (routed) exited with code 3" in msg


def test_a_raising_routed_kernel_fails_the_arm_and_writes_nothing(index, tmp_path, monkeypatch):
    from skillrun.kb import paths

    before = set((paths.kb_root() / "validation").rglob("*.yaml"))
    with pytest.raises(SkillRunError) as exc:
        _e2e(index, _plan(index, kernel_ref="wrong_port:build_raises"), write=True)
    msg = str(exc.value)
    assert "arm A (as-is) exited with code 0" in msg and "arm B (routed) exited with code 1" in msg
    assert "wrong_port:build_raises" in msg and "boom" in msg
    assert set((paths.kb_root() / "validation").rglob("*.yaml")) == before


def test_zero_routed_calls_is_an_error_naming_the_shapes_seen(index):
    with pytest.raises(SkillRunError) as exc:
        _e2e(index, _plan(index), mode="none", write=False)
    msg = str(exc.value)
    assert "no call was routed" in msg and "M=32,N=32,K=64" in msg and "M=16,N=32,K=64" in msg


def test_torch_compile_is_said_plainly_with_the_count(index):
    with pytest.raises(SkillRunError) as exc:
        _e2e(index, _plan(index), mode="compile", write=False)
    msg = str(exc.value)
    assert "torch.compile" in msg and "4 call(s) of the routed ops came from compiled code" in msg


def test_spec_leaves_out_items_that_cannot_be_routed_here(index):
    plan = _plan(index)
    flydsl = plan.items[0].model_copy(update={"backend": "flydsl"})
    moe = index.skill("triton_moe_a16wi4_sm90")
    unresolved = PlanItem(skill_id=moe.id, kernel="k", pct_gpu=1.0, status="unresolved_shape")
    spec = build_spec(Plan(profile="p", arch="sm_90", items=[plan.items[0], flydsl, unresolved]), index, ("triton", "torch"))
    assert [it["card"] for it in spec.items] == [ROWWISE]
    assert spec.items[0]["route"] == "skillrun_kernels.fp8_rowwise_batched_gemm.route"
    reasons = " | ".join(s["reason"] for s in spec.skipped)
    assert "flydsl port does not run" in reasons and "not planned (unresolved_shape)" in reasons
    # A shape where the card expects a slowdown keeps its baseline unless asked.
    slower = Plan(profile="p", arch="sm_90", items=[plan.items[0].model_copy(update={"expected_speedup": 0.8})])
    assert build_spec(slower, index, ("triton",)).items == []
    assert "expects 0.80x" in build_spec(slower, index, ("triton",)).skipped[0]["reason"]
    assert len(build_spec(slower, index, ("triton",), include_slower=True).items) == 1


def test_nothing_routable_is_an_error(index):
    plan = _plan(index)
    plan.items[0].backend = "flydsl"
    with pytest.raises(SkillRunError) as exc:
        _e2e(index, plan, write=False)
    assert "nothing to route" in str(exc.value) and exc.value.exit_code == 4


def test_plan_file_errors_name_the_file(index, tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text('{"items": [{"skill_id": 3}]}')
    with pytest.raises(SkillRunError) as exc:
        api.load_plan(bad)
    assert str(bad) in str(exc.value) and exc.value.exit_code == 3
    good = tmp_path / "good.json"
    good.write_text(_plan(index).model_dump_json())
    assert api.load_plan(good).items[0].skill_id == ROWWISE


# ------------------------------------------------------------------------------------------------
# Route modules: the op's arguments mapped to the problem's inputs (checked against the oracle)


def _controller(items):
    ctl = child.Controller({"items": items}, "B", "", "")
    ctl.load_routes()
    return ctl


def test_blockscale_route_maps_scaled_mm_arguments_to_the_problem():
    from skillrun_kernels.fp8_blockscale_gemm import problem

    shape = {"M": 8, "N": 256, "K": 256}
    x = problem.make_inputs(shape, seed=int.from_bytes(os.urandom(2), "little"))
    items = [{"id": "i0", "card": "c", "recipe": "r", "route": "skillrun_kernels.fp8_blockscale_gemm.route", "shape": shape,
              "kernel_ref": "skillrun_kernels.fp8_blockscale_gemm.references:build_oracle", "config": {}}]
    ctl = _controller(items)
    mode = child._make_mode(ctl, ctl.aten_watch())
    # The call as a user writes it: b is the (N, K) weight transposed, scale_b the weight scales transposed.
    sa = x["a_scale"].t().contiguous().t()
    with mode:
        y = torch._scaled_mm(x["a"], x["b"].t(), scale_a=sa, scale_b=x["b_scale"].t(), out_dtype=torch.bfloat16)
        # Tensor-wise scales are not this problem: passed through (and run by torch's CPU kernel).
        torch._scaled_mm(x["a"], x["b"].t(), scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0), out_dtype=torch.bfloat16)
    ref = problem.oracle(x)
    assert y.dtype == torch.bfloat16 and y.shape == (8, 256)
    assert float((y.float() - ref).norm() / ref.norm()) < 5e-3
    assert ctl.item_calls == {"i0": 1}
    assert [r for (_op, r) in ctl.passed] == ["scales are not block-wise 1x128 x 128x128 fp32"]


def test_rowwise_route_returns_the_out_tensor_and_counts_other_shapes():
    items = [{"id": "i0", "card": "c", "recipe": "r", "route": "skillrun_kernels.fp8_rowwise_batched_gemm.route",
              "shape": {"batch": 16, "M": 4, "N": 32, "K": 64},
              "kernel_ref": "skillrun_kernels.fp8_rowwise_batched_gemm.references:build_oracle", "config": {}}]
    ctl = _controller(items)
    g = torch.Generator().manual_seed(1)
    a = (torch.randn(4, 64, generator=g) * 10).to(torch.float8_e4m3fn)
    w = (torch.randn(32, 64, generator=g) * 10).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(4, 1, generator=g) + 0.5, torch.rand(1, 32, generator=g) + 0.5
    out = torch.empty(4, 32, dtype=torch.bfloat16)
    with child._make_mode(ctl, ctl.aten_watch()):
        got = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, out=out)
        torch._scaled_mm(a[:2], w.t(), scale_a=sa[:2], scale_b=sb, out_dtype=torch.bfloat16)  # M=2: not planned
    ref = (a.float() @ w.float().t()) * sa * sb
    assert got is out
    assert float((out.float() - ref).norm() / ref.norm()) < 5e-3
    assert ctl.item_calls == {"i0": 1}
    assert ctl.unplanned_shapes == {("aten::_scaled_mm", "batch=1,M=2,N=32,K=64"): 1}


def test_moe_route_wraps_the_baseline_layer_and_reuses_packed_weights(monkeypatch):
    from skillrun_kernels.moe_a16wi4 import problem, references

    shape = {"tokens": 4, "model_dim": 64, "inter_dim": 32, "experts": 4, "topk": 2, "group_size": 32}
    items = [{"id": "i0", "card": "c", "recipe": "r", "route": "skillrun_kernels.moe_a16wi4.route", "shape": shape,
              "kernel_ref": "skillrun_kernels.moe_a16wi4.references:build_oracle", "config": {}}]
    monkeypatch.setattr(references, "build_dequant_grouped_bf16", references.build_dequant_grouped_bf16)  # restored after
    ctl = _controller(items)
    ctl.patch_python_targets()
    launch = references.build_dequant_grouped_bf16(shape, {}, "cpu")
    x = problem.make_inputs(shape, 0, "cpu")
    out = problem.output_like(shape, "cpu")
    y = launch.run(launch.prepare(x), out)
    ref = problem.oracle(x)
    assert float((y.float() - ref).norm() / ref.norm()) < 1e-2
    x2 = dict(x, x=torch.randn(4, 64).to(torch.bfloat16))
    launch.run(launch.prepare(x2), out)
    assert ctl.item_calls == {"i0": 2}
    assert len(ctl._prepared) == 1  # the same weights: prepared once, the activations refreshed
    ref2 = problem.oracle(x2)
    assert float((out.float() - ref2).norm() / ref2.norm()) < 1e-2


def test_cli_e2e_needs_exactly_one_plan_source(tmp_path):
    from typer.testing import CliRunner

    from skillrun.cli.entry import app

    res = CliRunner().invoke(app, ["e2e", "--", sys.executable, WORKLOAD])
    assert res.exit_code == 2 and "exactly one of --profile TRACE or --plan" in res.output
    missing = tmp_path / "nope.json"
    res = CliRunner().invoke(app, ["e2e", "--plan", str(missing), "--", sys.executable, WORKLOAD])
    assert res.exit_code == 3 and "cannot read the plan" in res.output


def test_a_malformed_e2e_record_is_rejected_by_its_own_schema(index, tmp_path):
    from skillrun.e2e import record as record_mod
    from skillrun.evidence.validation import validate_record

    with pytest.raises(SkillRunError) as exc:
        validate_record({"kind": "e2e_validation", "schema_version": 1})
    assert "e2e.schema.json" in str(exc.value)
    with pytest.raises(SkillRunError):
        record_mod.write_record({"kind": "e2e_validation", "schema_version": 1, "created": "x"}, tmp_path)
    assert not (tmp_path / "e2e").exists() or not any((tmp_path / "e2e").iterdir())


_BLOCKSCALE_PORT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import interp_fixups  # noqa: F401  (bf16 fixes for the interpreter)
import torch
from skillrun.profiling import routing as child
from skillrun_kernels.fp8_blockscale_gemm import problem
shape = {"M": 64, "N": 256, "K": 256}
x = problem.make_inputs(shape, int(sys.argv[2]))
items = [{"id": "i0", "card": "c", "recipe": "r", "route": "skillrun_kernels.fp8_blockscale_gemm.route", "shape": shape,
          "kernel_ref": "skillrun_kernels.fp8_blockscale_gemm.triton_sm90:build",
          "config": {"BM": 64, "BN": 128, "num_warps": 4, "stages": 3, "persistent": False, "tma": False}}]
ctl = child.Controller({"items": items}, "B", "", "")
ctl.load_routes()
with child._make_mode(ctl, ctl.aten_watch()):
    y = torch._scaled_mm(x["a"], x["b"].t(), scale_a=x["a_scale"].t().contiguous().t(), scale_b=x["b_scale"].t(),
                         out_dtype=torch.bfloat16)
ref = problem.oracle(x)
print(json.dumps({"rel": float((y.float() - ref).norm() / ref.norm()), "calls": ctl.item_calls,
                  "kernel": ctl.launch_info[0]["expect_kernels"]}))
"""


def test_blockscale_call_routed_into_the_triton_port_in_the_interpreter():
    import json
    import subprocess
    import sys

    seed = int.from_bytes(os.urandom(2), "little")
    proc = subprocess.run([sys.executable, "-c", _BLOCKSCALE_PORT, str(HERE), str(seed)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["calls"] == {"i0": 1} and res["kernel"] == "_fp8_blockscale_gemm_sm90"
    assert res["rel"] < 5e-3, f"seed {seed}: rel err {res['rel']}"


def test_rowwise_loop_target_rebuilds_the_batched_problem_without_copies():
    from skillrun_kernels.fp8_rowwise_batched_gemm import problem, references, route

    shape = {"batch": 3, "M": 1, "N": 32, "K": 64}
    x = problem.make_inputs(shape, 0, "cpu")
    # The baseline loop's prepare (references.build_scaled_mm_loop), M padded to 16 rows.
    xq, xs = references.pad_rows(x["xq"], x["x_scale"], 16)
    p = {"a": [xq[b] for b in range(3)], "bt": [x["wq"][b].t() for b in range(3)],
         "sa": [xs[b].reshape(-1, 1).contiguous() for b in range(3)], "sb": [x["w_scale"][b].reshape(1, -1).contiguous() for b in range(3)]}
    out = problem.output_like(shape, "cpu")
    call = route.loop_call(p, out)
    assert call.shape == shape and call.out is out
    for key in ("xq", "wq", "x_scale", "w_scale"):
        assert torch.equal(call.inputs[key].float(), x[key].float()), key
    assert call.inputs["wq"].data_ptr() == x["wq"].data_ptr()  # a view, not a copy
    ref = problem.oracle(x)
    y = references.build_oracle(shape, {}, "cpu").run(call.inputs, out)
    assert float((y.float() - ref).norm() / ref.norm()) < 5e-3
    # Views that are not evenly spaced in one tensor are not a batch.
    p_bad = dict(p, a=[xq[0], xq[2], xq[1]])
    assert "not views of one batched tensor" in route.loop_call(p_bad, out)


def test_a_user_check_command_judges_the_outputs(index):
    check = f"{sys.executable} {HERE / 'e2e_workloads' / 'check_close.py'}"
    rec = _e2e(index, _plan(index, kernel_ref="wrong_port:build_wrong"), write=False, check=check)
    o = rec["outputs"]
    assert o["method"] == "command" and o["passed"] is False and o["exit_code"] == 1
    assert "differ: max abs" in o["output_tail"] and rec["verdict"] == "e2e_outputs_failed"


def _rowwise_items(shape, kernel_ref="skillrun_kernels.fp8_rowwise_batched_gemm.references:build_oracle"):
    return [{"id": "i0", "card": "c", "recipe": "r", "route": "skillrun_kernels.fp8_rowwise_batched_gemm.route",
             "problem": "skillrun_kernels.fp8_rowwise_batched_gemm.problem", "shape": shape, "kernel_ref": kernel_ref,
             "config": {}, "tolerance": {"rtol": 1e-2, "atol": 1e-2, "min_cosine": 0.999}}]


def test_the_as_is_arm_does_not_count_the_calls_inside_a_python_target_it_would_route(monkeypatch):
    """Issue 24: the row-wise e2e record said 12 routed calls vs 108 routable, because arm A counted
    the per-batch _scaled_mm calls inside the loop it would route as a whole (arm B never makes them)."""
    from skillrun_kernels.fp8_rowwise_batched_gemm import problem, references

    monkeypatch.setattr(references, "_cuda_sm", lambda device: (9, 0))  # the loop reference, on the CPU
    original = references.build_scaled_mm_loop
    shape = {"batch": 2, "M": 16, "N": 32, "K": 64}  # the per-batch calls (M=16, N=32, K=64) match the plan key too
    x = problem.make_inputs(shape, 0, "cpu")
    seen = {}
    for arm in ("A", "B"):
        monkeypatch.setattr(references, "build_scaled_mm_loop", original)
        ctl = child.Controller({"items": _rowwise_items(shape)}, arm, "", "", oracle=1)
        ctl.load_routes()
        ctl.patch_python_targets()
        launch = references.build_scaled_mm_loop(shape, {}, "cpu")
        out = problem.output_like(shape, "cpu")
        with child._make_mode(ctl, ctl.aten_watch()):
            launch.run(launch.prepare(x), out)
        ref = problem.oracle(x)
        assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
        seen[arm] = (dict(ctl.item_calls), dict(ctl.passed), dict(ctl.unplanned_shapes), ctl.oracle_checks)
    assert seen["A"][:3] == seen["B"][:3] == ({"i0": 1}, {}, {})
    for arm in ("A", "B"):
        (row,) = seen[arm][3]
        assert row["passed"] is True and row["item"] == "i0" and row["shape"] == "batch=2,M=16,N=32,K=64", row


def _scaled_mm_call(route_mod, m=4):
    g = torch.Generator().manual_seed(1)
    a = (torch.randn(m, 64, generator=g) * 10).to(torch.float8_e4m3fn)
    w = (torch.randn(32, 64, generator=g) * 10).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(m, 1, generator=g) + 0.5, torch.rand(1, 32, generator=g) + 0.5
    args = {"self": a, "mat2": w.t(), "scale_a": sa, "scale_b": sb, "out_dtype": torch.bfloat16}
    return route_mod.problem_call("aten::_scaled_mm", args), (a, w, sa, sb)


def test_oracle_samples_say_which_arm_is_right_and_the_output_verdict_follows():
    from skillrun.e2e.arms import ArmRun
    from skillrun.e2e.outputs import judge_with_oracle, oracle_check
    from skillrun_kernels.fp8_rowwise_batched_gemm import route

    name, op = "skillrun_kernels.fp8_rowwise_batched_gemm.route", "aten::_scaled_mm"
    items = _rowwise_items({"batch": 1, "M": 4, "N": 32, "K": 64})
    # arm A: an original that is wrong (what an fp8 kernel without accumulator promotion looks like)
    a = child.Controller({"items": items}, "A", "", "", oracle=2)
    a.load_routes()
    for _ in range(3):  # three calls, two sampled
        call, _ops = _scaled_mm_call(route)
        routed, value = a.route(name, op, call, lambda: torch.ones(4, 32, dtype=torch.bfloat16))
        assert routed and value.shape == (4, 32)
    assert a.item_calls == {"i0": 3} and [r["call"] for r in a.oracle_checks] == [1, 2]
    assert all(r["passed"] is False for r in a.oracle_checks), a.oracle_checks
    # arm B: the port (here the family's oracle builder) is right
    b = child.Controller({"items": items}, "B", "", "", oracle=2)
    b.load_routes()
    call, (x, w, sa, sb) = _scaled_mm_call(route)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # a workload's TF32 setting: the oracle ignores it, and it is kept
    try:
        routed, value = b.route(name, op, call, None)
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
    want = (x.float() @ w.float().t()) * sa * sb
    assert routed and float((value.float() - want).norm() / want.norm()) < 1e-2
    assert [r["passed"] for r in b.oracle_checks] == [True]

    def run(arm, ctl):
        return ArmRun(arm=arm, label=f"warmup-{arm}", folder=Path("."), rc=0, wall_s=0.0, status=ctl.status())

    orc = oracle_check(run("A", a), run("B", b), 2)
    assert orc["fails"] == "as_is" and orc["as_is"]["checked"] == 2 and orc["routed"]["passed"] is True
    assert orc["text"].startswith("the as-is arm fails the fp32 oracle (2 of 2 sampled calls; first: batch=1,M=4,N=32,K=64")
    assert orc["text"].endswith("the routed arm passes it")
    # saved tensors differ because the as-is arm is wrong: the routed arm passes, and the note says why
    res = judge_with_oracle({"method": "saved_tensors", "passed": False, "error": "y: 12 elements outside rtol"}, orc)
    assert res["passed"] is True and res["judged_by"] == "oracle" and "error" not in res
    assert res["note"].startswith("the arms' outputs differ because the as-is arm fails the fp32 oracle")
    assert "the routed arm is the right one (saved tensors: y: 12 elements outside rtol)" in res["note"]
    # the other way round: a routed arm that fails the oracle fails, even when the saved tensors agree
    flipped = oracle_check(run("A", b), run("B", a), 2)
    assert flipped["fails"] == "routed"
    res = judge_with_oracle({"method": "saved_tensors", "passed": True}, flipped)
    assert res["passed"] is False and res["error"].startswith("the routed arm fails the fp32 oracle")
    # both right and nothing saved: the sampled calls decide
    both = oracle_check(run("A", b), run("B", b), 2)
    res = judge_with_oracle({"method": "none", "passed": None, "note": "no outputs"}, both)
    assert both["fails"] == "none" and res["method"] == "oracle" and res["passed"] is True
    # no sampled call in one arm: said, and nothing is decided by it
    none = oracle_check(run("A", child.Controller({"items": items}, "A", "", "")), run("B", b), 2)
    assert none["fails"] == "not_checked" and "no oracle check for the as-is arm" in none["text"]
    assert judge_with_oracle({"method": "saved_tensors", "passed": False}, none)["passed"] is False


def test_a_call_count_mismatch_is_explained_per_item_and_by_reason():
    from skillrun.e2e.record import count_mismatch_note

    items = [{"id": "i0", "card": "c", "shape": {"M": 4}}, {"id": "i1", "card": "d", "shape": {"M": 8}}]
    a = {"item_calls": {"i0": 108, "i1": 3}, "passed": [{"op": "aten::_scaled_mm", "reason": "shape not in the plan", "calls": 5}]}
    b = {"item_calls": {"i0": 12, "i1": 3}, "passed": [{"op": "aten::_scaled_mm", "reason": "shape not in the plan", "calls": 2}]}
    note = count_mismatch_note([111], [15], a, b, items)
    assert "the routed arm routed [15] call(s) per run, the as-is arm would have routed [111]" in note
    assert "c M=4: as-is 108, routed 12" in note and "d M=8" not in note
    assert "aten::_scaled_mm 'shape not in the plan': as-is 5, routed 2" in note
