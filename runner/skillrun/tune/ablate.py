"""`skill-run ablate`: is a recipe's lever load-bearing?  ("Ablation is ground truth; util% is not.")

The recipe the card selects for the shape (or ``recipe=``) is timed against the same recipe with
the given knobs changed, in one session, interleaved, with an A/A copy of the recipe for the noise
floor. Both configs first pass the harness's parity gate. The artifact says whether the change
moved the time outside the noise (load-bearing), which way, and whether that agrees with what the
card claims for that change (a structured ``ablations:`` entry, or ``knob: A -> B`` in the lever or
a "what loses" entry).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from skillrun.errors import UnavailableError, UsageError
from skillrun.execute.backends import Backend, make_backend
from skillrun.execute.isolate import run_task
from skillrun.kb import tunable as T
from skillrun.kb.index import SkillIndex
from skillrun.plan.select import select_recipe
from skillrun.tune import session as S
from skillrun.tune.task import base_record, candidate_row, command_line, device_facts, shape_text, task_context, timing_meta
from skillrun.tune.workers import pin_env, visible_devices
from skillrun.evidence.tuning_artifact import write_tuning

ABLATED = "ablated"


def parse_sets(sets: list[str] | dict[str, Any]) -> dict[str, Any]:
    if isinstance(sets, dict):
        return dict(sets)
    out: dict[str, Any] = {}
    for s in sets:
        knob, sep, value = s.partition("=")
        if not sep or not knob.strip():
            raise UsageError(f"--set {s!r} is not knob=value", field="set")
        out[knob.strip()] = T.literal(value)
    if not out:
        raise UsageError("ablate needs at least one --set knob=value", field="set")
    return out


def ablate_shape(index: SkillIndex, skill_id: str, shape: dict[str, int], sets: list[str] | dict[str, Any], *,
                 recipe: str | None = None, backend: str | Backend | None = None, timer: str | None = None,
                 rounds: int = 200, warmup: int = 10, seeds: int = 3, timeout_s: float = 600.0, arch: str | None = None,
                 write: bool = True, validation_root: Path | None = None, cold_l2: str = "rotate",
                 cuda_graph: bool = False, isolation: str | None = None, command: str | None = None) -> dict[str, Any]:
    card = index.skill(skill_id)
    validation_root = Path(validation_root) if validation_root is not None else index.root / "validation"
    changes = parse_sets(sets)
    be = backend if isinstance(backend, Backend) else make_backend(backend)
    target, facts = device_facts(index, card, be, arch)
    if recipe:
        r = card.recipe(recipe)
        untuned = False
    else:
        sel = select_recipe(card, shape, facts, target)
        r, untuned = sel.recipe, sel.untuned
    mode, why = be.port_mode(r.backend)
    if mode != "run":
        raise UnavailableError(f"cannot ablate {card.id}/{r.name} here: {why}")
    schema = T.config_schema(r.kernel)
    if schema:
        bad = [w for k, v in changes.items() if (w := T.value_error(schema, k, v))]
        if bad:
            raise UsageError("; ".join(bad), field="set")
    same = {k: v for k, v in changes.items() if r.config.get(k, object()) == v}
    if same and len(same) == len(changes):
        raise UsageError(f"recipe {r.name} already has {same}: nothing to ablate", field="set")
    ablated_cfg = {**r.config, **changes}
    claim = T.claim_for(card, r.name, changes)
    ran_shape, proxy_note = shape, None
    if not be.gpu:
        # As `run` does: the interpreter on a production shape takes hours (it timed out after 60 s
        # per task); both configs run on the runner's proxy shape, recorded in the artifact.
        from skillrun.execute.proxy import proxy_shape

        ran_shape, how = proxy_shape(shape)
        proxy_note = f"CPU numerics on the proxy shape {shape_text(ran_shape)} (asked {shape_text(shape)}); proxy chosen by {how}"
    ctx = task_context(card, ran_shape, be, r.backend, seeds=seeds, timeout_s=timeout_s, timer=timer, rounds=rounds, warmup=warmup,
               cold_l2=cold_l2, cuda_graph=cuda_graph, isolation=isolation)
    rec = base_record("ablation", card, shape, be,
                      {"name": r.name, "untuned": untuned, "kernel": r.kernel, "backend": r.backend, "config": dict(r.config)},
                      command or command_line(f"ablate {card.id} --shape {shape_text(shape)} "
                                          + " ".join(f"--set {k}={v}" for k, v in changes.items())))
    dev = visible_devices(be.kind)[0]
    env = {**ctx["env"], **pin_env(be.kind, dev)}

    def run(job):
        res = run_task(job["task"], timeout_s=job["timeout_s"], env=env, isolation=job["isolation"])
        res.update(lane=0, device=dev)
        return res

    inc_res = run(S.gate_job(ctx, r.kernel, r.config))
    abl_res = run(S.gate_job(ctx, r.kernel, ablated_cfg))
    rows = [candidate_row(S.INCUMBENT, f"recipe {r.name}", dict(r.config), "incumbent", inc_res),
            candidate_row(ABLATED, T.config_label(ablated_cfg, r.config), ablated_cfg, "ablated", abl_res)]
    rec.update(tolerance=ctx["tolerance"], seeds=ctx["seeds"], candidates=rows, timing=None,
               workers={"engine": "inline", "lanes": [{"lane": 0, "device": dev}], "ray_address": None, "rebuilt": 0})
    ab: dict[str, Any] = {"set": changes, "ablated_config": ablated_cfg,
                          "claim": ({"expect": claim.expect, "claim": claim.claim[:500], "source": claim.source} if claim else None),
                          "ratio_ablated_over_recipe": None, "noise_pct": None, "load_bearing": None,
                          "direction": "not_timed", "agrees_with_card": None}
    rec["ablation"] = ab
    if proxy_note:
        rec["proxy_shape"] = dict(ran_shape)
        rec["notes"] = [*rec.get("notes", []), proxy_note]
    if rows[0]["status"] != "survivor":
        _done(rec, "incumbent_failed", f"recipe {r.name} did not pass the gate ({rows[0]['status']}: {rows[0]['reason'][:300]})")
    elif rows[1]["status"] != "survivor":
        _done(rec, "ablated_failed", f"the ablated config {rows[1]['label']} did not pass the gate "
              f"({rows[1]['status']}: {rows[1]['reason'][:300]}); a lever whose removal breaks the kernel is not timed")
    elif ctx["timing"]["timer"] is None:
        _done(rec, "not_timed", f"no timer on the {be.kind} backend: both configs pass the oracle; nothing timed")
    else:
        res = run(S.session_job(ctx, {"kernel": r.kernel, "config": dict(r.config)}, [(ABLATED, r.kernel, ablated_cfg)],
                                None, 7001, rounds))
        ses = S.read_session(res, [ABLATED])
        ses["device"] = be.facts.name + (f" (device {dev})" if dev is not None else "")
        rec["recheck"] = ses
        _judge(rec, ses, ab, claim, r.name, res, ctx, rounds)
    if write:
        path = write_tuning(rec, validation_root)
        return {**rec, "artifact": str(path)}
    return {**rec, "artifact": None}


def _done(rec: dict[str, Any], verdict: str, reason: str) -> None:
    rec["verdict"], rec["reason"] = verdict, reason


def _judge(rec, ses, ab, claim, name, res, ctx, rounds) -> None:
    if "error" in ses:
        _done(rec, "error", f"the A/B session failed: {ses['error'][:600]}")
        return
    rec["timing"] = timing_meta(ctx, res, rounds)
    bad = [f"{k}: {v['reason']}" for k, v in ses["integrity"].items() if not v["passed"]]
    if bad:
        _done(rec, "error", "slot integrity failed: " + "; ".join(bad)[:600])
        return
    sp = ses["ratio_vs_incumbent"].get(ABLATED)  # recipe time / ablated time
    noise = ses["noise_pct"]
    if sp is None or noise is None:
        _done(rec, "error", "the session gave no paired samples or no A/A floor")
        return
    ratio = 1.0 / sp  # ablated time / recipe time: > 1 means the lever helps
    floor = noise / 100.0
    ab.update(ratio_ablated_over_recipe=round(ratio, 4), noise_pct=noise)
    if ratio > 1.0 + floor:
        ab.update(load_bearing=True, direction="recipe_faster")
        what = f"load-bearing: without it the kernel takes {ratio:.3f}x the recipe's time (A/A noise {noise:.2f}%)"
    elif ratio < 1.0 - floor:
        ab.update(load_bearing=True, direction="ablated_faster")
        what = (f"load-bearing the wrong way: the ablated config is faster, {ratio:.3f}x the recipe's time "
                f"(A/A noise {noise:.2f}%); the recipe should be re-tuned")
    else:
        ab.update(load_bearing=False, direction="within_noise")
        what = f"not load-bearing: {ratio:.3f}x the recipe's time, within the A/A noise {noise:.2f}%"
    if claim is None:
        agree = "the card makes no claim about this change"
    else:
        ok = (claim.expect == "load_bearing" and ab["direction"] == "recipe_faster") or \
             (claim.expect == "not_load_bearing" and ab["direction"] == "within_noise")
        ab["agrees_with_card"] = ok
        agree = (f"{'confirms' if ok else 'REFUTES'} the card's claim ({claim.source}: expects "
                 f"{claim.expect.replace('_', '-')}: {claim.claim[:160]!r})")
    _done(rec, "load_bearing" if ab["load_bearing"] else "not_load_bearing", f"{name}: {ab['set']} is {what}; {agree}")
