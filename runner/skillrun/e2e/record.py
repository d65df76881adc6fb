"""The e2e validation record: built from the runs, checked against schemas/e2e.schema.json, written
atomically under ``validation/e2e/`` (never overwriting), beside the isolated artifacts.

A reader finds the cards it covers in ``card_ids`` (and ``cards[].id`` with each card's routed
recipes and shapes); ``verdict`` is one word (``e2e_*``), ``verdict_detail`` has both axes, ``reason`` the one-line
summary; ``measured.wall.gain_pct`` and ``projection.gain_pct`` are the two numbers a
card's ``validation.measured.e2e_pct`` can cite, with this file's path.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from skillrun.evidence.store import machine_path_in_kb, record_command, record_path, slug, stamp, write_new
from skillrun.kb.index import SkillIndex
from skillrun.kb.paths import kb_root
from skillrun.evidence.kernel_sources import source_identity
from skillrun.io.redact import scrub
from skillrun.evidence.validation import card_revision, file_sha256, runner_info, software_info, utc_now, validate_record

KIND = "e2e_validation"


def build_record(*, cmd, spec, index: SkillIndex, be, plan, plan_source, command_line, warm, timed_a, timed_b, aa,
                 measured, outputs, alternations, skip_steps) -> dict[str, Any]:
    wa, wb = warm
    cards: dict[str, dict[str, Any]] = {}
    routed_items = []
    identity_notes: list[str] = []
    for it in spec.items:
        routed = [int((r.status.get("item_calls") or {}).get(it["id"], 0)) for r in timed_b]
        routable = [int((r.status.get("item_calls") or {}).get(it["id"], 0)) for r in timed_a]
        card = index.skill(it["card"])
        entry = cards.setdefault(card.id, {"id": card.id, "revision": card_revision(card.path), "path": machine_path_in_kb(card.path),
                                           "sha256": file_sha256(card.path), "items": []})
        row = {"recipe": it["recipe"], "untuned": it["untuned"], "kernel": it["kernel_ref"], "backend": it["backend"],
               "config": it["config"], "shape": it["shape"], "route": it["route"], "pct_gpu": it["pct_gpu"],
               "expected_speedup": it["expected_speedup"], "projected_gain_pct": it["projected_gain_pct"],
               "routed_calls": routed, "routable_calls_a": routable}
        identity, problem = source_identity(it["kernel_ref"])
        row.update(identity)
        if problem:
            identity_notes.append(f"{it['kernel_ref']}: {problem}")
        entry["items"].append(row)
        if max(routed, default=0) > 0:
            routed_items.append(it)
    # Cards none of whose items routed a call stay out of `cards` (the record does not cover them).
    covered = [c for c in cards.values() if any(max(r["routed_calls"], default=0) > 0 for r in c["items"])]
    last_b = timed_b[-1].status
    by: dict[str, int] = {}
    for r in timed_b:
        for op, n in (r.status.get("routed_by") or {}).items():
            by[op] = by.get(op, 0) + n
    mechanisms = sorted(f"TorchDispatchMode on {op}" if op.startswith("aten::") else f"Python-level wrapper of {op}"
                        for op, n in by.items() if n)
    notes = list(dict.fromkeys(n for r in [wb, *timed_b] for n in (r.status.get("notes") or []))) + identity_notes
    graphs = last_b.get("cuda_graphs") or {}
    if graphs.get("captures"):
        notes.append(f"the workload captured {graphs['captures']} CUDA graph(s) and replayed them {graphs.get('replays', 0)} "
                     f"time(s); {graphs.get('calls_in_capture', 0)} routed call(s) were made during capture, so each replay "
                     f"runs the captured port kernels, but replays are not counted as routed calls")
    per_run_b = [sum((r.status.get("item_calls") or {}).values()) for r in timed_b]
    per_run_a = [sum((r.status.get("item_calls") or {}).values()) for r in timed_a]
    if per_run_a and per_run_b and per_run_a != per_run_b:
        notes.append(count_mismatch_note(per_run_a, per_run_b, timed_a[-1].status, last_b, spec.items))
    steps_a = {int(r.status.get("steps") or 0) for r in timed_a}
    steps_b = {int(r.status.get("steps") or 0) for r in timed_b}
    if steps_a != steps_b:
        notes.append(f"the arms marked different numbers of steps (A {sorted(steps_a)}, B {sorted(steps_b)})")
    proj = [it["projected_gain_pct"] for it in routed_items if it.get("projected_gain_pct") is not None]
    wall = measured["wall"]
    out_verdict = "not_checked" if outputs.get("passed") is None else ("passed" if outputs["passed"] else "failed")
    gk = measured.get("gpu_kernel")
    summary = (f"wall {wall['basis']} time {wall['a']['median_ms']:.4g} ms as-is -> {wall['b']['median_ms']:.4g} ms routed: "
               f"gain {wall['gain_pct']:+.2f}% (noise floor {wall['noise_floor_pct']:.2f}%: {wall['speed'].replace('_', ' ')})")
    if gk and gk.get("gain_pct") is not None:
        summary += f"; GPU kernel time gain {gk['gain_pct']:+.2f}%"
    summary += f"; projected {sum(proj):+.2f}% of GPU time" if proj else "; no projection (the plan has no speedup prior)"
    summary += f"; outputs {out_verdict.replace('_', ' ')}"
    oracle = outputs.get("oracle") or {}
    if oracle.get("text"):
        summary += f" ({oracle['text']})"
    rec: dict[str, Any] = {
        "schema_version": 1,
        "kind": KIND,
        "created": utc_now(),
        # no machine paths: KB-relative, or redacted to the file name (skillrun.evidence.store.record_path)
        "command": record_command(command_line or "skill-run e2e -- " + " ".join(cmd)),
        "workload": {"command": record_command(list(cmd)), "cwd": record_path(os.getcwd())},
        "plan": {"source": record_path(plan_source) if plan_source else None, "arch": plan.arch},
        "card_ids": [c["id"] for c in covered] or [c["id"] for c in cards.values()],
        "cards": covered or list(cards.values()),
        "skipped_items": spec.skipped,
        "routing": {
            "mechanism": mechanisms,
            "routed_calls_per_run": per_run_b,
            "routable_calls_per_run_a": per_run_a,
            "passed_through": last_b.get("passed") or [],
            "unplanned_shapes": last_b.get("unplanned_shapes") or [],
            "cuda_graphs": graphs,
            "compile": last_b.get("compile") or {},
            "notes": notes,
        },
        "device": be.facts.artifact(),
        "software": software_info(),
        "runner": runner_info(),
        "method": {
            "alternations": alternations,
            "order": "warm-up A, warm-up B (discarded); " + " ".join(["A B"] * alternations) + "; A A (noise pair)"
                     + ("; profiled A, profiled B (GPU kernel time)" if gk else ""),
            "warmup_runs_per_arm": 1,
            "skip_steps": skip_steps,
            "value": ("per run: median wall time of its steps (skillrun.profiling.step(), which synchronizes the device), "
                      f"steps before {skip_steps} left out; per arm: median over runs"
                      if wall["basis"] == "step" else "per run: the whole process's wall time; per arm: median over runs"),
            "noise_floor": "max(|A1 - A2| of the A/A pair, half the range of the timed A runs), percent of A",
            "overhead": "both arms run under the same dispatch mode (arm A only counts the calls it would route), so its "
                        "Python cost is in both",
        },
        "measured": measured,
        "projection": {"gain_pct": round(sum(proj), 4) if proj else None,
                       "basis": "sum over the routed plan items of f·(1−1/s): f the item's share of the profiled GPU kernel "
                                "time, s the card's expected isolated speedup for its recipe"},
        "outputs": outputs,
        "verdict": "e2e_outputs_failed" if out_verdict == "failed" else f"e2e_{wall['speed']}",
        "verdict_detail": {"outputs": out_verdict, "speed": wall["speed"],
                           **({"oracle_fails": oracle["fails"]} if oracle.get("fails") else {})},
        "reason": summary,
    }
    return _clean(rec)


def count_mismatch_note(per_run_a: list[int], per_run_b: list[int], a: dict, b: dict, items: list[dict]) -> str:
    """Why the arms' call counts differ: per plan item, and the calls only one arm passed through (with
    the reason each was not routed), from the last run of each arm."""
    ia, ib = a.get("item_calls") or {}, b.get("item_calls") or {}
    per_item = [f"{it['card']} {','.join(f'{k}={v}' for k, v in it['shape'].items())}: as-is {ia.get(it['id'], 0)}, "
                f"routed {ib.get(it['id'], 0)}" for it in items if ia.get(it["id"], 0) != ib.get(it["id"], 0)]
    pa = {(p["op"], p["reason"]): p["calls"] for p in a.get("passed") or []}
    pb = {(p["op"], p["reason"]): p["calls"] for p in b.get("passed") or []}
    passed = [f"{op} '{reason}': as-is {pa.get((op, reason), 0)}, routed {pb.get((op, reason), 0)}"
              for op, reason in sorted(set(pa) | set(pb)) if pa.get((op, reason), 0) != pb.get((op, reason), 0)]
    text = (f"the routed arm routed {per_run_b} call(s) per run, the as-is arm would have routed {per_run_a}: the arms "
            f"did not run the same calls")
    if per_item:
        text += "; per plan item (last runs): " + "; ".join(per_item[:6])
    if passed:
        text += "; calls not routed, by reason, that differ between the arms: " + "; ".join(passed[:6])
    if not per_item and not passed:
        text += " (the last runs agree: the counts changed from run to run, e.g. a data-dependent number of calls)"
    return text


def _clean(x: Any) -> Any:
    """Plain YAML-safe values (tuples to lists, drop the in-memory profile objects)."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items() if k != "profile"}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    return x


def record_name(rec: dict[str, Any]) -> str:
    script = next((Path(a).stem for a in rec["workload"]["command"] if a.endswith(".py")), Path(rec["workload"]["command"][0]).name)
    return f"{stamp(rec['created'])}_{slug(script, 60)}_{slug('+'.join(rec['card_ids']), 60)}_e2e.yaml"


def write_record(rec: dict[str, Any], root: Path | None = None) -> Path:
    """Validate, then write atomically to validation/e2e/ (or root/e2e); never overwrites."""
    rec = scrub(rec)  # the workload's command line is the user's text: no token reaches evidence
    validate_record(rec)
    return write_new((Path(root) if root is not None else kb_root() / "validation") / "e2e", record_name(rec), rec)
