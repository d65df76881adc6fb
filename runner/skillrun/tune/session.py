"""Gate and time tuning candidates with the harness's own child tasks (``skillrun.execute.worker``).

* :func:`gate_job`: the harness's ``candidate`` task (build, fp32 oracle over fresh seeds, poisoned
  output) for one config.
* :func:`session_job`: the harness's ``session`` task with the incumbent as the port, the
  candidates as its *peers* (same kernel, other configs: checked like the port against the
  references, not against each other) and an A/A copy of the incumbent.
* :func:`classify`: a gate result -> (status, reason); :func:`read_session`: a session result ->
  per-slot stats, paired ratios against the incumbent, the noise floor and every integrity gate.
"""
from __future__ import annotations

from typing import Any

from skillrun.execute.stats import aa_noise, percentile, summarize

import re

INCUMBENT = "incumbent"
_GPU_FAULT = re.compile(r"(?i)CUDA error|HIP error|hipError|illegal memory access|device-side assert|unspecified launch failure")
BASELINE = "baseline"


def gate_job(ctx: dict[str, Any], ref: str, config: dict[str, Any], role: str = "port") -> dict[str, Any]:
    task = {"kind": "candidate", "role": role, "ref": ref, "config": dict(config), "shape": ctx["shape"],
            "problem": ctx["problem"], "device": ctx["device"], "seeds": ctx["seeds"], "tolerance": ctx["tolerance"],
            "sandbox": ctx.get("sandbox") or "auto"}
    if ctx.get("watchdog_s"):
        task["launch_deadline_s"] = float(ctx["watchdog_s"])
    return {"task": task, "timeout_s": ctx["timeout_s"], "env": ctx["env"], "isolation": ctx["isolation"]}


def session_job(ctx: dict[str, Any], incumbent: dict[str, Any], peers: list[tuple[str, str, dict]],
                baseline_ref: str | None, seed: int, rounds: int) -> dict[str, Any]:
    slots = [{"slot": INCUMBENT, "ref": incumbent["kernel"], "config": incumbent["config"]}]
    slots += [{"slot": sid, "ref": ref, "config": cfg} for sid, ref, cfg in peers]
    if baseline_ref:
        slots.append({"slot": BASELINE, "ref": baseline_ref, "config": {}})
    t = ctx["timing"]
    task = {"kind": "session", "problem": ctx["problem"], "shape": ctx["shape"], "device": ctx["device"],
            "port_slot": INCUMBENT, "peers": [sid for sid, _, _ in peers], "tolerance": ctx["tolerance"], "seed": seed,
            "slots": slots, "aa_slot": INCUMBENT, "profile_launches": ctx["profile_launches"],
            "timing": {**t, "rounds": rounds}, "sandbox": ctx.get("sandbox") or "auto"}
    if ctx.get("watchdog_s"):
        task["watchdog"] = {"deadline_s": float(ctx["watchdog_s"])}
    return {"task": task, "timeout_s": ctx["timeout_s"], "env": ctx["env"], "isolation": ctx["isolation"]}


def classify(res: dict[str, Any]) -> tuple[str, str]:
    """A gate result's status for the artifact; nothing here is ever a "loss"."""
    st = res.get("status")
    if st == "ok":
        p = res.get("parity") or {}
        if p.get("passed"):
            return "survivor", (f"matches the fp32 oracle on {len(p.get('seeds') or [])} seeds "
                                f"(rel_fro {p.get('rel_fro', float('nan')):.3g}, cosine {p.get('cosine', float('nan')):.6f})")
        return "parity_failed", "fails the fp32 oracle: " + str(p.get("error") or _parity_text(p))[:500]
    if st == "unsupported":
        return "unsupported", str((res.get("parity") or {}).get("error") or res.get("error"))[:500]
    err = str(res.get("error") or "failed")
    tail = _tail(res)
    fault = res.get("fault")
    if fault == "worker_died":
        return "worker_died", err
    if fault == "timeout":
        return "timeout", err + tail
    if fault == "crash":
        return "crashed", err + tail
    if _GPU_FAULT.search(err):
        # The child raised on a sticky device error: its process (and context) is gone, the sweep goes on.
        return "crashed", "GPU fault: " + err[:800] + tail
    if "Compil" in err.split(":")[0] or "CompilationError" in err:
        return "compile_failed", err[:800]
    return "raised", err[:800] + tail


def _parity_text(p: dict[str, Any]) -> str:
    return f"mismatched {p.get('mismatched')} of {p.get('elements')}, rel_fro {p.get('rel_fro')}, nonfinite {p.get('nonfinite')}"


def _tail(res: dict[str, Any]) -> str:
    t = res.get("stderr_tail") or res.get("traceback")
    if not t:
        return ""
    lines = [ln for ln in str(t).strip().splitlines() if ln.strip()]
    return " | " + " / ".join(lines[-2:])[:400]


def read_session(res: dict[str, Any], peer_ids: list[str]) -> dict[str, Any]:
    """Per-slot stats, paired speedups against the incumbent, noise and integrity of one session."""
    out: dict[str, Any] = {"slots": [INCUMBENT, *peer_ids], "device": res.get("device"), "noise_pct": None,
                           "aa_slot": None, "stats": {}, "ratio_vs_incumbent": {}, "integrity": {},
                           "dropped": dict((res.get("watchdog") or {}).get("dropped") or {})}
    if res.get("status") != "ok":
        out["error"] = str(res.get("error") or "session failed")[:800] + _tail(res)
        return out
    slots = res.get("slots") or {}
    integ: dict[str, Any] = {}
    for sid in [INCUMBENT, *peer_ids, BASELINE]:
        if sid not in slots:
            continue
        problems = []
        g = slots[sid].get("integrity") or {}
        if not g.get("passed", False):
            problems.append(g.get("reason", "not checked"))
        al = res.get("aliasing") if sid == INCUMBENT else (res.get("peer_aliasing") or {}).get(sid)
        if sid != BASELINE and al is not None and not al.get("passed"):
            problems.append(al.get("reason", "aliasing"))
        post = res.get("post_timing_parity") if sid == INCUMBENT else (res.get("post_timing_parity_peers") or {}).get(sid)
        if sid != BASELINE and post is not None and not post.get("passed"):
            problems.append("failed the oracle after the timed rounds: " + str(post.get("error") or _parity_text(post))[:200])
        integ[sid] = {"passed": not problems, "reason": "; ".join(problems) or g.get("reason", "")}
    out["integrity"] = integ
    if BASELINE in slots:
        out["slots"].append(BASELINE)
    t = res.get("timing")
    if not t:
        return out
    samples: dict[str, list[float]] = t["samples"]
    out["stats"] = {k: _round(summarize(v)) for k, v in samples.items() if v and not k.endswith("#aa")}
    inc = samples.get(INCUMBENT) or []
    if inc and samples.get(INCUMBENT + "#aa"):
        aa = aa_noise(inc, samples[INCUMBENT + "#aa"])
        out["aa_slot"] = INCUMBENT
        out["noise_pct"] = round(max(aa["aa_noise_pct"], aa["aa_medians_pct"]), 4)
    for sid, v in samples.items():
        if sid.endswith("#aa") or sid == INCUMBENT or not v:
            continue
        # Paired per round (same round = same device state): incumbent time / slot time, >1 = slot faster.
        ratios = [a / b for a, b in zip(inc, v) if b > 0]
        if ratios:
            out["ratio_vs_incumbent"][sid] = round(percentile(ratios, 50), 5)
    return out


def _round(st: dict[str, Any]) -> dict[str, Any]:
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in st.items()}
