"""The output check of an e2e run: the tensors each arm saved, compared within the card's tolerance.

The as-is arm's tensors are the reference (what the user's code produces today); the routed
arm's must match them within the routed cards' tolerance (the loosest of them when several cards
are routed). The as-is arm is not assumed right: sampled calls of both arms are also checked
against each family's fp32 oracle (:func:`oracle_check`, from the warm-up runs), so when the arms
differ because the as-is arm is the one that fails the oracle, the record says so and the routed
arm passes; a routed arm that fails the oracle fails whatever the saved tensors say. Two as-is runs are compared too: a workload whose own outputs change from run to run
(unseeded inputs) cannot be checked this way, and the record says so instead of blaming the port.
Alternatively a user command (``--check``) decides: it gets both arms' output folders.
"""
from __future__ import annotations

import shlex
import subprocess
from typing import Any

from skillrun.e2e.arms import ArmRun
from skillrun.execute.parity import compare, tolerance_of

CHECK_TIMEOUT_S = 600


def merged_tolerance(items: list[dict[str, Any]]) -> dict[str, float]:
    """The loosest of the routed cards' tolerances (each port is only held to its own card)."""
    tols = [tolerance_of(it.get("tolerance")) for it in items] or [tolerance_of(None)]
    out = {"rtol": max(t["rtol"] for t in tols), "atol": max(t["atol"] for t in tols),
           "min_cosine": min(t["min_cosine"] for t in tols)}
    fro = [t["max_rel_fro"] for t in tols if "max_rel_fro" in t]
    if fro and len(fro) == len(tols):
        out["max_rel_fro"] = max(fro)
    return out


def _load(run: ArmRun) -> list[tuple[str, Any]]:
    import torch

    out = []
    for o in run.status.get("outputs") or []:
        if not o.get("file"):
            continue
        out.append((o["name"], torch.load(run.saved / o["file"], map_location="cpu", weights_only=True)))
    return out


def compare_runs(ref: ArmRun, got: ArmRun, tol: dict[str, float]) -> dict[str, Any]:
    a, b = _load(ref), _load(got)
    names_a, names_b = [n for n, _ in a], [n for n, _ in b]
    if names_a != names_b:
        return {"passed": False, "error": f"the runs saved different outputs: {ref.label} {names_a[:8]}, {got.label} {names_b[:8]}",
                "compared": []}
    rows = []
    import torch

    # Large outputs (a 4096x65536 GEMM result) compare in seconds on a GPU, minutes on the CPU.
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for (name, x), (_, y) in zip(a, b):
        x, y = x.to(dev), y.to(dev)
        if x.dtype.is_floating_point or y.dtype.is_floating_point:
            res = compare(y, x, tol)
        else:  # integer/bool outputs (token ids, masks) must be equal
            same = tuple(x.shape) == tuple(y.shape) and bool((x == y).all())
            res = {"passed": same, "mismatched": 0 if same else int((x != y).sum()) if x.shape == y.shape else -1}
            if not same:
                res["error"] = "integer output differs"
        rows.append({"name": name, **{k: v for k, v in res.items() if k in (
            "passed", "error", "rel_fro", "cosine", "max_abs_err", "mismatched", "nonfinite", "elements")}})
    failed = [r for r in rows if not r["passed"]]
    res = {"passed": not failed, "compared": rows}
    if failed:
        res["error"] = "; ".join(f"{r['name']}: {r.get('error', 'differs')}" for r in failed[:5])
    return res


ARM_WORDS = {"as_is": "the as-is arm", "routed": "the routed arm"}


def _arm_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    judged = [r for r in rows if r.get("passed") is not None]
    failed = [r for r in judged if not r["passed"]]
    out: dict[str, Any] = {"checked": len(judged), "passed": (not failed) if judged else None, "failed": failed[:5]}
    fro = [r["rel_fro"] for r in judged if isinstance(r.get("rel_fro"), (int, float))]
    if fro:
        out["max_rel_fro"] = max(fro)
    unjudged = [r for r in rows if r.get("passed") is None]
    if unjudged:
        out["not_checked"] = unjudged[:3]
    return out


def oracle_check(a: ArmRun, b: ArmRun, samples: int) -> dict[str, Any]:
    """Which arm is right on the sampled calls: each arm's outputs against the family's fp32 oracle."""
    res: dict[str, Any] = {"runs": [a.label, b.label], "samples_per_item": samples,
                           "as_is": _arm_summary(a.status.get("oracle_checks") or []),
                           "routed": _arm_summary(b.status.get("oracle_checks") or [])}
    verdicts = {arm: res[arm]["passed"] for arm in ARM_WORDS}
    if any(v is None for v in verdicts.values()):
        missing = [ARM_WORDS[arm] for arm, v in verdicts.items() if v is None]
        res["fails"] = "not_checked"
        res["text"] = f"no oracle check for {' and '.join(missing)} (no sampled call could be checked)"
        return res
    wrong = [arm for arm, ok in verdicts.items() if not ok]
    res["fails"] = "none" if not wrong else wrong[0] if len(wrong) == 1 else "both"
    if not wrong:
        res["text"] = "both arms pass the fp32 oracle on the sampled calls"
    else:
        parts = []
        for arm in wrong:
            first = res[arm]["failed"][0]
            parts.append(f"{ARM_WORDS[arm]} fails the fp32 oracle ({len(res[arm]['failed'])} of {res[arm]['checked']} sampled "
                         f"calls; first: {first['shape']}, {first.get('error') or 'rel_fro ' + str(first.get('rel_fro'))})")
        right = [ARM_WORDS[arm] for arm in ARM_WORDS if arm not in wrong]
        res["text"] = "; ".join(parts) + (f"; {right[0]} passes it" if right else "")
    return res


def check_outputs(a_first: ArmRun, b_first: ArmRun, a_again: ArmRun, items: list[dict[str, Any]],
                  check_cmd: str | None, env: dict[str, str], oracle: dict[str, Any] | None = None) -> dict[str, Any]:
    res = _check_outputs(a_first, b_first, a_again, items, check_cmd, env)
    return judge_with_oracle(res, oracle) if oracle is not None else res


def judge_with_oracle(res: dict[str, Any], oracle: dict[str, Any]) -> dict[str, Any]:
    """The output verdict with the oracle's word on which arm is right.

    A routed arm that fails the oracle fails. Saved tensors that differ because the as-is arm fails
    the oracle (and the routed arm passes it) pass, and the note names the as-is arm. Without saved
    tensors, the oracle alone decides."""
    res = dict(res, oracle=oracle)
    fails = oracle.get("fails")
    if fails in ("routed", "both"):
        res["passed"], res["judged_by"] = False, "oracle"
        res["error"] = "; ".join(x for x in (oracle["text"], res.get("error")) if x)
    elif fails == "as_is" and res.get("passed") is not True and res.get("method") != "command":
        differ = res.get("passed") is False
        res["passed"], res["judged_by"] = True, "oracle"
        res["note"] = (("the arms' outputs differ because " if differ else "") + oracle["text"]
                       + ": the routed arm is the right one" + (f" (saved tensors: {res.pop('error')})" if res.get("error") else ""))
    elif fails == "none" and res.get("method") == "none":
        res["method"], res["passed"], res["judged_by"] = "oracle", True, "oracle"
        res["note"] = oracle["text"] + " (the workload saved no outputs: the sampled calls decide)"
    return res


def _check_outputs(a_first: ArmRun, b_first: ArmRun, a_again: ArmRun, items: list[dict[str, Any]],
                   check_cmd: str | None, env: dict[str, str]) -> dict[str, Any]:
    tol = merged_tolerance(items)
    if check_cmd:
        return _user_check(check_cmd, a_first, b_first, env)
    if not (a_first.status.get("outputs") or b_first.status.get("outputs")):
        return {"method": "none", "passed": None, "tolerance": tol,
                "note": "the workload saved no outputs (skillrun.profiling.save_output) and no --check was given: outputs not compared"}
    aa = compare_runs(a_first, a_again, tol)
    ab = compare_runs(a_first, b_first, tol)
    res = {"method": "saved_tensors", "tolerance": tol, "passed": ab["passed"], "compared": ab["compared"],
           "runs": [a_first.label, b_first.label], "aa": {"runs": [a_first.label, a_again.label], "passed": aa["passed"]}}
    if ab.get("error"):
        res["error"] = ab["error"]
    if not aa["passed"]:
        res["passed"] = None
        res["note"] = ("two as-is runs already differ beyond the tolerance (" + aa.get("error", "") + "): the workload's "
                       "outputs are not reproducible, so they cannot judge the port; seed its inputs")
    return res


def _user_check(check_cmd: str, a: ArmRun, b: ArmRun, env: dict[str, str]) -> dict[str, Any]:
    cmd = shlex.split(check_cmd)
    if not cmd:
        return {"method": "command", "passed": False, "error": "--check is empty"}
    cenv = {k: v for k, v in env.items() if not k.startswith("SKILLRUN_E2E_")}
    cenv.update({"SKILLRUN_E2E_A_DIR": str(a.files), "SKILLRUN_E2E_B_DIR": str(b.files),
                 "SKILLRUN_E2E_A_SAVED": str(a.saved), "SKILLRUN_E2E_B_SAVED": str(b.saved)})
    try:
        proc = subprocess.run(cmd, env=cenv, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except FileNotFoundError:
        return {"method": "command", "command": check_cmd, "passed": False, "error": f"--check command not found: {cmd[0]}"}
    except subprocess.TimeoutExpired:
        return {"method": "command", "command": check_cmd, "passed": False, "error": f"--check ran over {CHECK_TIMEOUT_S} s"}
    tail = (proc.stdout + proc.stderr).strip()[-500:]
    res = {"method": "command", "command": check_cmd, "passed": proc.returncode == 0, "exit_code": proc.returncode,
           "runs": [a.label, b.label], "output_tail": tail}
    if proc.returncode != 0:
        res["error"] = f"--check exited with code {proc.returncode}" + (f": {tail.splitlines()[-1]}" if tail else "")
    return res
