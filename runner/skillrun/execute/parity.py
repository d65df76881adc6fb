"""Parity of one output against the fp32 oracle: the numbers every candidate is gated on.

Runs inside the candidate's child process (imports torch). ``compare`` never raises on bad
values: NaN/Inf (including poisoned elements the kernel never wrote) are counted, and the error
norms are taken over the finite elements so a single unwritten element does not hide how far the
rest is off.
"""
from __future__ import annotations

from typing import Any

class DegenerateInput(ValueError):
    """The problem's inputs make the oracle useless as a test (all zeros, constant, non-finite)."""


DEFAULT_TOLERANCE = {"rtol": 1e-2, "atol": 1e-2, "min_cosine": 0.999}


def tolerance_of(tol: dict[str, Any] | None) -> dict[str, float]:
    out = dict(DEFAULT_TOLERANCE)
    out.update({k: float(v) for k, v in (tol or {}).items() if v is not None})
    return out


def poison(out: Any) -> str:
    """Fill an output buffer with a value no correct kernel writes; return what was used."""
    import torch

    from skillrun.execute import guard

    with guard.harness():
        if out.is_floating_point() or out.is_complex():
            out.fill_(float("nan"))
            return "nan"
        # Integer outputs cannot hold NaN: the dtype's extreme value is the next best marker.
        out.fill_(torch.iinfo(out.dtype).max)
        return "int_max"


def compare(out: Any, ref: Any, tol: dict[str, float]) -> dict[str, Any]:
    """max_abs_err, max_rel_err, rel_fro, cosine, mismatched, nonfinite and the pass/fail of one run."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return {"passed": False, "error": f"output shape {tuple(out.shape)} != oracle shape {tuple(ref.shape)}"}
    o = out.detach().float().reshape(-1)
    r = ref.detach().float().reshape(-1)
    finite = torch.isfinite(o)
    nonfinite = int((~finite).sum().item())
    ref_nonfinite = int((~torch.isfinite(r)).sum().item())
    of = torch.where(finite, o, torch.zeros_like(o))
    diff = (of - r).abs()
    diff = torch.where(finite, diff, torch.zeros_like(diff))
    rtol, atol = tol["rtol"], tol["atol"]
    within = (o - r).abs() <= atol + rtol * r.abs()  # NaN compares False: unwritten elements mismatch
    mismatched = int((~within).sum().item())
    big = r.abs() > atol  # relative error is only meaningful away from zero
    max_rel = float((diff[big] / r.abs()[big]).max().item()) if bool(big.any()) else 0.0
    # Norms and the dot product in float64 so cosine is consistent (never above 1 by rounding).
    rd, od = r.double(), of.double()
    rnorm = float(torch.linalg.vector_norm(rd).item())
    dnorm = float(torch.linalg.vector_norm(od - rd).item())
    onorm = float(torch.linalg.vector_norm(od).item())
    rel_fro = dnorm / rnorm if rnorm > 0 else (0.0 if dnorm == 0 else float("inf"))
    if rnorm > 0 and onorm > 0:
        cosine = max(-1.0, min(1.0, float(torch.dot(od, rd).item() / (onorm * rnorm))))
    else:
        cosine = 1.0 if rnorm == onorm == 0 else 0.0
    reasons = []
    if nonfinite:
        reasons.append(f"{nonfinite} non-finite elements (unwritten or overflow)")
    if mismatched:
        reasons.append(f"{mismatched}/{o.numel()} elements outside rtol={rtol:g} atol={atol:g}")
    if cosine < tol["min_cosine"]:
        reasons.append(f"cosine {cosine:.6f} < {tol['min_cosine']:g}")
    if "max_rel_fro" in tol and rel_fro > tol["max_rel_fro"]:
        reasons.append(f"rel_fro {rel_fro:.3g} > {tol['max_rel_fro']:g}")
    if ref_nonfinite:
        reasons.append(f"the oracle itself has {ref_nonfinite} non-finite elements")
    res = {
        "passed": not reasons,
        "max_abs_err": float(diff.max().item()) if diff.numel() else 0.0,
        "max_rel_err": max_rel,
        "rel_fro": rel_fro,
        "cosine": cosine,
        "mismatched": mismatched,
        "nonfinite": nonfinite,
        "elements": int(o.numel()),
    }
    if reasons:
        res["error"] = "; ".join(reasons)
    return res


def oracle_of(problem: Any, problem_name: str, shape: dict, inputs: dict, seed: int | None = None) -> Any:
    """The problem's fp32 oracle of ``inputs``; DegenerateInput (naming the problem, shape and seed)
    when it cannot serve as a test (see :func:`degenerate`)."""
    ref = problem.oracle(inputs).float()
    why = degenerate(ref)
    if why:
        at = f"shape={shape}" + (f", seed={seed}" if seed is not None else "")
        raise DegenerateInput(f"test input rejected: {problem_name}.make_inputs({at}) gives a degenerate test ({why}); "
                              "every candidate could agree with it: fix the problem's input generation")
    return ref


def degenerate(ref: Any) -> str | None:
    """Why an oracle output cannot serve as a test (None when it can).

    An all-zero, constant or non-finite reference agrees with many wrong kernels (an all-zero operand
    makes every GEMM "correct"), so such an input set is rejected: the problem's input generation is
    at fault, not the candidate.
    """
    import torch

    r = ref.detach().float().reshape(-1)
    if r.numel() == 0:
        return "the oracle output is empty"
    bad = int((~torch.isfinite(r)).sum().item())
    if bad:
        return f"the oracle output has {bad} non-finite elements of {r.numel()}"
    if not bool((r != 0).any()):
        return f"the oracle output is all zeros ({r.numel()} elements)"
    if bool((r == r[0]).all()):
        return f"the oracle output is constant ({float(r[0]):g} in all {r.numel()} elements)"
    return None


def aggregate(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst case over seeds; passes only if every seed passed."""
    if not per_seed:
        return {"passed": False, "error": "no seed ran"}
    num = [s for s in per_seed if "cosine" in s]
    agg: dict[str, Any] = {"passed": all(s.get("passed") for s in per_seed)}
    if num:
        agg.update(
            max_abs_err=max(s["max_abs_err"] for s in num),
            max_rel_err=max(s["max_rel_err"] for s in num),
            rel_fro=max(s["rel_fro"] for s in num),
            cosine=min(s["cosine"] for s in num),
            mismatched=sum(s["mismatched"] for s in num),
            nonfinite=sum(s["nonfinite"] for s in num),
        )
    mutated = sorted({n for s in per_seed for n in s.get("input_mutation") or []})
    if mutated:
        agg["input_mutation"] = mutated
    errors = [f"seed {s['seed']}: {s['error']}" for s in per_seed if s.get("error")]
    if errors:
        agg["error"] = "; ".join(errors)[:2000]
    agg["seeds"] = per_seed
    return agg
