"""`skill-run e2e`: the workload as-is (A) and with the planned ports routed in (B), interleaved.

    run_e2e(["python", "workload.py"], plan, index, alternations=5)

Order: one warm-up run per arm (discarded: JIT caches, first-touch costs), then A B A B ... (N of
each), then an A/A pair whose difference is the noise floor, then (with a GPU) one profiled run
per arm for GPU kernel time. Each run's value is the median of its steps' wall times (steps end at
``skillrun.profiling.step()``; the first ``skip_steps`` are set-up and left out) or, when it
marks none, the whole process's wall time. Gain = (A - B) / A, in percent: positive is faster.

Every failure is a SkillRunError and nothing is written: an arm that exits non-zero (both arms'
exit codes are given), a routed kernel that raises, zero routed calls, torch.compile (the dispatch
mode makes torch run compiled code eagerly, so neither arm would be the user's workload).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from skillrun.e2e.arms import ArmRun, run_arm, run_profiled
from skillrun.e2e.spec import RouteSpec, build_spec
from skillrun.errors import SkillRunError, UsageError
from skillrun.kb.index import SkillIndex
from skillrun.models import Plan

Progress = Callable[[str], None]
# Calls per plan item whose output each arm's warm-up run checks against the family's fp32 oracle.
ORACLE_SAMPLES = 2


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _short(cmd: list[str]) -> str:
    text = " ".join(cmd)
    return text if len(text) <= 120 else text[:117] + "..."


def _describe_rc(run: ArmRun) -> str:
    if run.timed_out:
        return "ran past the time limit"
    if run.rc < 0:
        return f"was killed by signal {-run.rc}"
    return f"exited with code {run.rc}"


def _fail_arms(cmd: list[str], a: ArmRun, b: ArmRun) -> None:
    """Both exit codes, and the routed kernel's error when that is why B failed."""
    errors = [e for r in (a, b) for e in (r.status.get("errors") or [])]
    install = [r.status["install_error"] for r in (a, b) if r.status.get("install_error")]
    if a.ok and b.ok and not errors and not install:
        return
    parts = [f"arm A (as-is) {_describe_rc(a)}", f"arm B (routed) {_describe_rc(b)}"]
    head = f"the workload `{_short(cmd)}` failed: " + "; ".join(parts)
    if errors:
        head += "; " + errors[0] + (f" (+{len(errors) - 1} more)" if len(errors) > 1 else "")
        if b.ok:
            head += " (the workload caught the error and exited 0; the arm still fails)"
    if install:
        head += "; " + install[0]
    bad = b if not b.ok or b.status.get("errors") else a
    tail = bad.log_tail().splitlines()[-3:]
    raise SkillRunError(head, hint=("last lines of " + bad.label + ": " + " | ".join(tail)[:600]) if tail else None)


def _check_hook(cmd: list[str], run: ArmRun) -> None:
    if not run.status.get("hook_ran"):
        raise SkillRunError(f"the workload `{_short(cmd)}` ran but the e2e start-up hook never did",
                            hint="run a Python interpreter directly (not with -I, -E or -S) so it honours PYTHONPATH")
    if run.status.get("install_error"):
        raise SkillRunError(run.status["install_error"])


def _compile_error(a: ArmRun, b: ArmRun) -> None:
    comp = b.status.get("compile") or {}
    if not comp.get("wrapped"):
        return
    inside = comp.get("routable_calls_inside", 0)
    raise SkillRunError(
        f"the workload calls torch.compile ({comp['wrapped']} time(s), compiled code called {comp.get('calls', 0)} time(s)): "
        f"while the routing dispatch mode is active, torch runs compiled code eagerly, so neither arm is the compiled "
        f"workload, and inside a compiled graph the mode cannot route at all; {inside} call(s) of the routed ops came "
        f"from compiled code and could not be routed in the compiled workload",
        hint="measure the eager workload (e.g. TORCHDYNAMO_DISABLE=1 or without torch.compile), or route through a "
             "custom op the compiled graph calls")


def _run_value(run: ArmRun, skip_steps: int) -> tuple[float, str]:
    steps = run.status.get("step_s") or []
    # step_s[j] is step j+1 (step 0 ends at the first mark); keep steps >= skip_steps.
    kept = steps[max(skip_steps - 1, 0):]
    if kept:
        return 1e3 * _median(kept), "step"
    return 1e3 * run.wall_s, "process"


def _arm_block(runs: list[ArmRun], skip_steps: int) -> dict[str, Any]:
    vals = [_run_value(r, skip_steps)[0] for r in runs]
    return {"runs_ms": [round(v, 6) for v in vals], "median_ms": round(_median(vals), 6),
            "min_ms": round(min(vals), 6), "max_ms": round(max(vals), 6),
            "steps_per_run": [int(r.status.get("steps") or 0) for r in runs]}


def _gpu_kernel_ms(run: ArmRun, skip_steps: int) -> tuple[float | None, dict[str, Any]]:
    from skillrun.ingest import ingest

    if run.trace is None:
        return None, {}
    prof = ingest(run.trace)
    steps = int(run.status.get("steps") or 0)
    per = max(steps - skip_steps, 0)
    total_ms = prof.total_kernel_us / 1e3
    info = {"trace_kernel_ms": round(total_ms, 6), "kernel_calls": prof.kernel_calls}
    return (total_ms / per if per else total_ms), {**info, "steps": per, "profile": prof}


def _kernel_calls(profile, regex: str | None) -> int:
    import re

    if not regex or profile is None:
        return 0
    rx = re.compile(regex)
    return sum(k.calls for k in profile.kernels if rx.search(k.name) or (k.demangled and rx.search(k.demangled)))


def run_e2e(cmd: list[str], plan: Plan, index: SkillIndex, *, backend: str | None = None, alternations: int = 5,
            skip_steps: int = 1, check_cmd: str | None = None, gpu_time: bool | None = None, timeout: float | None = None,
            plan_source: str | None = None, command_line: str | None = None, write: bool = True,
            out_root: Path | None = None, progress: Progress | None = None, keep_runs: Path | None = None,
            include_slower: bool = False) -> dict[str, Any]:
    """Run the arms, check and measure; return the e2e record (written under validation/e2e/ if ``write``)."""
    from skillrun.execute.backends import make_backend

    if not cmd:
        raise UsageError("no workload command; put it after `--`, e.g. `skill-run e2e --profile t.json -- python w.py`",
                         field="COMMAND")
    if alternations < 1 or alternations > 100:
        raise UsageError(f"--alternations must be 1..100, got {alternations}", field="--alternations")
    if skip_steps < 0:
        raise UsageError(f"--skip-steps must be >= 0, got {skip_steps}", field="--skip-steps")
    be = make_backend(backend)
    spec = build_spec(plan, index, be.runs, include_slower=include_slower)
    if not spec.items:
        why = "; ".join(f"{s['card']} {s.get('shape')}: {s['reason']}" for s in spec.skipped[:4]) or "the plan is empty"
        raise SkillRunError(f"nothing to route: no plan item can be routed here ({why})", exit_code=4)
    say = progress or (lambda _msg: None)
    base_env = dict(os.environ)
    extra_env = {k: v for k, v in be.env(None).items()}
    tmp = Path(tempfile.mkdtemp(prefix="skillrun-e2e-"))
    try:
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps(spec.to_json()))

        compared = {"A1", "B1", "AA2"}  # the runs whose saved tensors the output check reads

        def arm(a: str, label: str, oracle: int = 0) -> ArmRun:
            say(f"run {label} ({'routed' if a == 'B' else 'as-is'})")
            return run_arm(cmd, a, label, tmp, spec_path, base_env, extra_env, timeout, save=label in compared, oracle=oracle)

        # The warm-up runs (never timed) also check sampled calls of each arm against the oracle.
        wa, wb = arm("A", "warmup-A", ORACLE_SAMPLES), arm("B", "warmup-B", ORACLE_SAMPLES)
        _check_hook(cmd, wa)
        _check_hook(cmd, wb)
        _fail_arms(cmd, wa, wb)
        _compile_error(wa, wb)
        _zero_routed(cmd, spec, wb)
        timed_a, timed_b = [], []
        for i in range(1, alternations + 1):
            ra, rb = arm("A", f"A{i}"), arm("B", f"B{i}")
            _fail_arms(cmd, ra, rb)
            timed_a.append(ra)
            timed_b.append(rb)
        aa1, aa2 = arm("A", "AA1"), arm("A", "AA2")
        _fail_arms(cmd, aa1, aa2)

        use_gpu = gpu_time if gpu_time is not None else bool(wa.status.get("cuda_used"))
        prof_a = prof_b = None
        if use_gpu:
            window = f"{skip_steps}:" if (wa.status.get("steps") or 0) > skip_steps else None
            say("profiled runs (GPU kernel time)")
            prof_a = run_profiled(cmd, "A", "profiled-A", tmp, spec_path, base_env, extra_env, window)
            prof_b = run_profiled(cmd, "B", "profiled-B", tmp, spec_path, base_env, extra_env, window)
            _fail_arms(cmd, prof_a, prof_b)

        from skillrun.e2e.outputs import check_outputs, oracle_check
        from skillrun.e2e.record import build_record, write_record

        outputs = check_outputs(timed_a[0], timed_b[0], aa2, spec.items, check_cmd, base_env,
                                oracle=oracle_check(wa, wb, ORACLE_SAMPLES))
        measured = _measure(timed_a, timed_b, aa1, aa2, skip_steps, prof_a, prof_b, spec)
        rec = build_record(cmd=cmd, spec=spec, index=index, be=be, plan=plan, plan_source=plan_source,
                           command_line=command_line, warm=(wa, wb), timed_a=timed_a, timed_b=timed_b, aa=(aa1, aa2),
                           measured=measured, outputs=outputs, alternations=alternations, skip_steps=skip_steps)
        if keep_runs is not None:
            shutil.copytree(tmp, keep_runs, dirs_exist_ok=True)
        if write:
            rec["artifact"] = str(write_record(rec, out_root))
        return rec
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _zero_routed(cmd: list[str], spec: RouteSpec, b: ArmRun) -> None:
    calls = b.status.get("item_calls") or {}
    if sum(calls.values()) > 0:
        return
    seen = [f"{p['op']} {p['reason']} x{p['calls']}" for p in b.status.get("passed") or []]
    shapes = [f"{u['op']} {u['shape']} x{u['calls']}" for u in b.status.get("unplanned_shapes") or []]
    planned = [f"{it['card']} {','.join(f'{k}={v}' for k, v in it['shape'].items())}" for it in spec.items]
    msg = f"no call was routed in the routed arm of `{_short(cmd)}`: the plan selected {'; '.join(planned[:4])}"
    if shapes:
        msg += f"; the workload called {'; '.join(shapes[:4])}"
    elif seen:
        msg += f"; calls seen but not this problem: {'; '.join(seen[:4])}"
    else:
        msg += "; none of the routed ops was called in the workload's main thread"
    graphs = b.status.get("cuda_graphs") or {}
    if graphs.get("replays"):
        msg += f" (it replayed CUDA graphs {graphs['replays']} time(s))"
    raise SkillRunError(msg, hint="a zero count is an error, not a result: check the plan's shapes against the workload's")


def _measure(timed_a, timed_b, aa1, aa2, skip_steps, prof_a, prof_b, spec) -> dict[str, Any]:
    basis = {_run_value(r, skip_steps)[1] for r in timed_a + timed_b}
    a, b = _arm_block(timed_a, skip_steps), _arm_block(timed_b, skip_steps)
    v1, v2 = _run_value(aa1, skip_steps)[0], _run_value(aa2, skip_steps)[0]
    aa_pct = 100.0 * abs(v1 - v2) / (0.5 * (v1 + v2)) if v1 + v2 > 0 else 0.0
    range_pct = 100.0 * (a["max_ms"] - a["min_ms"]) / a["median_ms"] if a["median_ms"] > 0 else 0.0
    noise = max(aa_pct, range_pct / 2.0)
    gain = 100.0 * (a["median_ms"] - b["median_ms"]) / a["median_ms"] if a["median_ms"] > 0 else 0.0
    speed = "within_noise" if abs(gain) <= noise else ("faster" if gain > 0 else "slower")
    wall = {"basis": "step" if basis == {"step"} else ("process" if basis == {"process"} else "mixed"),
            "a": a, "b": b, "aa_pair_ms": [round(v1, 6), round(v2, 6)], "aa_pair_pct": round(aa_pct, 4),
            "a_range_pct": round(range_pct, 4), "noise_floor_pct": round(noise, 4), "gain_pct": round(gain, 4),
            "speedup": round(a["median_ms"] / b["median_ms"], 6) if b["median_ms"] > 0 else None, "speed": speed}
    out: dict[str, Any] = {"wall": wall, "gpu_kernel": None}
    if prof_a is not None and prof_b is not None:
        ka, ia = _gpu_kernel_ms(prof_a, skip_steps)
        kb, ib = _gpu_kernel_ms(prof_b, skip_steps)
        if ka is not None and kb is not None:
            launches = prof_b.status.get("launches") or []
            out["gpu_kernel"] = {
                "a_ms": round(ka, 6), "b_ms": round(kb, 6),
                "gain_pct": round(100.0 * (ka - kb) / ka, 4) if ka > 0 else None,
                "per": "step" if ia.get("steps") else "process",
                "a_kernel_calls": ia.get("kernel_calls"), "b_kernel_calls": ib.get("kernel_calls"),
                "port_kernel_calls_b": sum(_kernel_calls(ib.get("profile"), l.get("expect_kernels")) for l in launches),
                "port_kernel_calls_a": sum(_kernel_calls(ia.get("profile"), l.get("expect_kernels")) for l in launches),
                "baseline_kernel_calls": {c: {"a": _kernel_calls(ia.get("profile"), rx), "b": _kernel_calls(ib.get("profile"), rx)}
                                          for c, rx in {it["card"]: it.get("card_regex") for it in spec.items}.items()},
                "method": "one torch.profiler run per arm (after the timed runs); no noise floor for this number",
            }
    return out
