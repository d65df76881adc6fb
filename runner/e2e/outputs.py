"""The output check of an e2e run: the tensors each arm saved, compared within the card's tolerance.

The as-is arm's tensors are the reference (what the user's code produces today); the routed
arm's must match them within the routed cards' tolerance (the loosest of them when several cards
are routed). Two as-is runs are compared too: a workload whose own outputs change from run to run
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


def check_outputs(a_first: ArmRun, b_first: ArmRun, a_again: ArmRun, items: list[dict[str, Any]],
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
