"""`skill-run tune`: sweep a recipe's declared space for one shape and propose a recipe only on a real win.

    tune_shape(index, skill_id, shape)     one shape -> tuning artifact (+ proposed SKILL.md diff)

Steps (the seeds' method; the MoE PR's two tuner lies are the reason for steps 3 and 6):
  1. start from the nearest recipe (the one selected for the shape, else the nearest one that
     declares a space); the incumbent is what the plan gives today;
  2. candidates = the space around the start, constraint-pruned (pruned ones are recorded);
  3. every candidate, the incumbent and the baseline go through the harness's parity gate, fanned
     out over the pool; a candidate that fails to compile, raises, times out, crashes, loses its
     worker or fails parity is kept with its reason and is never counted as a loss;
  4. survivors are timed interleaved in sessions against the incumbent, with an A/A floor;
  5. the top few are re-timed in one fresh session, on one device alone, with the incumbent and the
     baseline;
  6. a winner is proposed only if it beats the incumbent by more than that session's noise floor.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from skillrun.evidence.store import machine_path_in_kb
from skillrun.errors import SkillRunError, UnavailableError
from skillrun.execute.backends import Backend, make_backend
from skillrun.kb import tunable as T
from skillrun.kb.index import SkillIndex
from skillrun.plan.select import select_recipe
from skillrun.tune import session as S
from skillrun.tune.task import (base_record, candidate_row, command_line, device_facts, nearest_recipe, shape_text,
                                task_context, timing_meta)
from skillrun.tune.workers import make_pool
from skillrun.evidence.tuning_artifact import write_tuning

DEFAULT_TOP = 3
SLOTS_PER_SESSION = 8


# ------------------------------------------------------------------------------------------ tune

def tune_shape(index: SkillIndex, skill_id: str, shape: dict[str, int], *, backend: str | Backend | None = None,
               timer: str | None = None, rounds: int = 100, recheck_rounds: int | None = None, warmup: int = 10,
               seeds: int = 3, timeout_s: float = 600.0, top: int = DEFAULT_TOP, workers: int | None = None,
               ray_address: str | None = None, ray_resources: dict[str, float] | None = None,
               ray_num_gpus: float | None = None, compile_only: bool = False, arch: str | None = None,
               start_from: str | Path | None = None, apply: bool = False, write: bool = True,
               validation_root: Path | None = None, cold_l2: str = "rotate", cuda_graph: bool = False,
               isolation: str | None = None, command: str | None = None, peaks: Any = None, sandbox: str = "auto",
               launch_timeout_s: float | None = None) -> dict[str, Any]:
    """Tune one shape; returns the tuning record plus ``artifact`` (path or None) and ``diff`` (text or None).

    ``launch_timeout_s``: the launch watchdog's deadline for each session slot's first launches
    (skillrun.execute.watchdog; None = on a GPU its GPU_DEADLINE_S, off on the CPU; 0 = off)."""
    card = index.skill(skill_id)
    validation_root = Path(validation_root) if validation_root is not None else index.root / "validation"
    if compile_only:
        from skillrun.tune.prune import prune_shape

        return prune_shape(index, card, shape, arch=arch, timeout_s=timeout_s, write=write,
                           validation_root=validation_root, command=command)
    be = backend if isinstance(backend, Backend) else make_backend(backend)
    target, facts = device_facts(index, card, be, arch)
    sel = select_recipe(card, shape, facts, target)
    start_name, why = nearest_recipe(card, shape, sel.recipe.name, sel.untuned)
    start = card.recipe(start_name)
    inc = sel.recipe
    mode, mode_why = be.port_mode(start.backend)
    if mode != "run":
        raise UnavailableError(f"cannot tune {card.id} here: {mode_why}",
                               hint="for FlyDSL on a CPU use --compile-only (prunes the space by the static gates)")
    space = T.space_of(card, start_name) or T.Space(knobs={})
    kspaces = T.kernel_spaces_of(card, start_name)
    # The recipe's own space only when it declares one (a recipe with only tunable_kernels still
    # keeps its incumbent slot, which is how every candidate is judged).
    configs, pruned = T.enumerate_candidates(dict(start.config), space, shape, facts) if space.knobs else ([], [])
    space_from = None
    if start_from:
        from skillrun.tune.prune import kept_configs

        configs, space_from = kept_configs(start_from, card, start_name, shape), machine_path_in_kb(start_from, index.root)
        pruned = []
    ctx = task_context(card, shape, be, start.backend, seeds=seeds, timeout_s=timeout_s, timer=timer, rounds=rounds,
               warmup=warmup, cold_l2=cold_l2, cuda_graph=cuda_graph, isolation=isolation, sandbox=sandbox)
    from skillrun.execute.watchdog import GPU_DEADLINE_S

    ctx["watchdog_s"] = launch_timeout_s if launch_timeout_s is not None else (GPU_DEADLINE_S if be.gpu else 0)
    inc_recipe = {"name": inc.name, "untuned": sel.untuned, "kernel": inc.kernel, "backend": inc.backend,
                  "config": dict(inc.config), "why": ("the card's default (UNTUNED shape); " if sel.untuned else "selected for this shape; ")
                  + f"sweep starts from {start_name}: {why}"}
    rec = base_record("tuning", card, shape, be, inc_recipe,
                      command or command_line(f"tune {card.id} --shape {shape_text(shape)}"))
    rec.update(space={"knobs": space.knobs, "constraints": space.constraints, **({"from": space_from} if space_from else {}),
                      **({"kernels": [{"kernel": k.kernel, "backend": k.backend, "config": k.config, "knobs": k.space.knobs,
                                       "constraints": k.space.constraints} for k in kspaces]} if kspaces else {})},
               tolerance=ctx["tolerance"], seeds=ctx["seeds"])
    notes: list[str] = []

    # Candidate ids: c0, c1, ... in space order (the recipe's own space, then each tunable_kernels
    # entry); the incumbent is its own slot (never deduplicated away), even when a candidate has the
    # same config (then the pair is an extra A/A check).
    base_cfg = dict(start.config)
    cands = [(f"c{i}", cfg) for i, cfg in enumerate(configs)]
    kernel_of = {cid: start.kernel for cid, _ in cands}
    foreign: dict[str, dict[str, Any]] = {}  # candidate id -> the other kernel, its backend and its start config
    kpruned: list[tuple[dict[str, Any], str, T.KernelSpace]] = []
    for ks in kspaces:
        kmode, kwhy = be.port_mode(ks.backend)
        kcfgs, kp = T.enumerate_candidates(dict(ks.config), ks.space, shape, facts)
        if kmode != "run":
            kpruned += [(cfg, f"not run here: {kwhy}", ks) for cfg in kcfgs]
            kcfgs = []
        kpruned += [(cfg, why, ks) for cfg, why in kp]
        for cfg in kcfgs:
            cid = f"c{len(cands)}"
            cands.append((cid, cfg))
            kernel_of[cid] = ks.kernel
            foreign[cid] = {"kernel": ks.kernel, "backend": ks.backend, "base": dict(ks.config)}

    def label(cid: str, cfg: dict[str, Any]) -> str:
        if cid in foreign:
            return f"{foreign[cid]['kernel'].rsplit('.', 1)[-1]}: {T.config_label(cfg, foreign[cid]['base'])}"
        return T.config_label(cfg, base_cfg)
    baseline_ref = be.baseline_ref(card.references)
    pool = make_pool(be.kind, workers=workers, ray_address=ray_address, ray_resources=ray_resources, ray_num_gpus=ray_num_gpus)
    rec["workers"] = {"engine": pool.engine, "lanes": pool.lanes(), "ray_address": ray_address, "rebuilt": 0}
    try:
        jobs = [S.gate_job(ctx, inc.kernel, inc.config)] + [S.gate_job(ctx, kernel_of[cid], cfg) for cid, cfg in cands]
        if baseline_ref:
            jobs.append(S.gate_job(ctx, baseline_ref, {}, role="baseline"))
        gated = pool.map(jobs)
        inc_res, cand_res = gated[0], gated[1:1 + len(cands)]
        base_res = gated[-1] if baseline_ref else None
        rows = [candidate_row(S.INCUMBENT, f"incumbent recipe {inc.name}", dict(inc.config), "incumbent", inc_res)]
        rows += [candidate_row(cid, label(cid, cfg), cfg, "candidate", r) for (cid, cfg), r in zip(cands, cand_res)]
        rows += [candidate_row(f"p{i}", T.config_label(cfg, base_cfg), cfg, "candidate", None, "pruned", why)
                 for i, (cfg, why) in enumerate(pruned)]
        rows += [candidate_row(f"p{len(pruned) + i}", f"{ks.kernel.rsplit('.', 1)[-1]}: {T.config_label(cfg, ks.config)}", cfg,
                               "candidate", None, "pruned", why) | {"kernel": ks.kernel, "backend": ks.backend}
                 for i, (cfg, why, ks) in enumerate(kpruned)]
        for r in rows:
            if r["id"] in foreign:
                r.update(kernel=foreign[r["id"]]["kernel"], backend=foreign[r["id"]]["backend"])
        if base_res is not None:
            rows.append(candidate_row(S.BASELINE, f"baseline {baseline_ref}", {}, "baseline", base_res))
        rec["candidates"] = rows
        by_id = {r["id"]: r for r in rows}
        survivors = [(cid, cfg) for cid, cfg in cands if by_id[cid]["status"] == "survivor"]
        base_ok = base_res is not None and by_id[S.BASELINE]["status"] == "survivor"
        if baseline_ref and not base_ok:
            notes.append(f"baseline {baseline_ref}: {by_id[S.BASELINE]['status']}: {by_id[S.BASELINE]['reason'][:300]}")
        rec["timing"] = None
        rec["sweep"] = None
        rec["recheck"] = None
        rec["decision"] = {"winner": None, "speedup_vs_incumbent": None, "speedup_vs_baseline": None,
                           "incumbent_vs_baseline": None, "noise_pct": None, "reason": ""}
        rec["proposal"] = None
        failed = [r for r in rows if r["role"] == "candidate" and r["status"] != "survivor"]
        _same_error_note(failed, len(cands), notes)
        summary = f"{len(survivors)} of {len(cands)} candidates passed the oracle; {len(failed)} kept with their reason"

        if by_id[S.INCUMBENT]["status"] != "survivor":
            _finish(rec, "incumbent_failed", f"the incumbent recipe {inc.name} did not pass the gate "
                    f"({by_id[S.INCUMBENT]['status']}: {by_id[S.INCUMBENT]['reason'][:300]}); no win can be judged against it. {summary}")
        elif not survivors:
            _finish(rec, "no_survivor", f"no candidate passed the gate; {summary}")
        elif ctx["timing"]["timer"] is None:
            _finish(rec, "not_timed", f"no timer on the {be.kind} backend: {summary}; nothing was timed and nothing is proposed")
        else:
            work = (float(inc_res.get("flops") or 0.0), float(inc_res.get("min_bytes") or 0.0), card.match.get("dtypes"))
            _sweep_and_recheck(rec, ctx, pool, be, inc, start, survivors, by_id, baseline_ref if base_ok else None,
                               rounds, recheck_rounds or rounds, top, notes, work, peaks)
        rec["workers"]["rebuilt"] = pool.rebuilt
    finally:
        pool.close()

    path = None
    diff = None
    refused: SkillRunError | None = None
    if rec["verdict"] == "proposed" and write:
        from skillrun.tune import proposal as P
        from skillrun.evidence.tuning_artifact import reserve_path

        path = reserve_path(rec, validation_root)  # the proposal cites this path
        try:
            prop = P.propose(index, card, rec, machine_path_in_kb(path, index.root), facts, target)
            diff = P.unified_diff(card, prop)
            rec["proposal"] = {"recipe_name": prop.recipe_name, "diff": diff, "applied": False}
            if apply:
                P.apply(index, card, prop, shape, facts, target)
                rec["proposal"]["applied"] = True
        except SkillRunError as exc:  # the evidence is still written; the card is left as it was
            refused = exc
            notes.append(f"proposal not applied: {exc}")
        except BaseException:
            path.unlink(missing_ok=True)  # no half-written placeholder left behind
            raise
    if notes:
        rec["notes"] = [*rec.get("notes", []), *notes]
    if write:
        path = write_tuning(rec, validation_root, path=path)
    if refused is not None:
        refused.reason += f" (tuning artifact: {path})"
        raise refused
    return {**rec, "artifact": str(path) if path else None, "diff": diff}


def _same_error_note(failed: list[dict[str, Any]], n: int, notes: list[str]) -> None:
    """Many candidates raising the same exception is a tuner or launcher bug (the MoE PR's split-K
    keyword), not a property of those configs: say so instead of letting the survivors decide."""
    kinds: dict[str, int] = {}
    for r in failed:
        if r["status"] in ("raised", "compile_failed"):
            head = r["reason"].split(":")[0][:80]
            kinds[head] = kinds.get(head, 0) + 1
    for head, k in kinds.items():
        if n >= 2 and k * 2 >= n:
            notes.append(f"{k} of {n} candidates raised the same {head}: suspect the tuner or the launcher's arguments, "
                         "not the configs; the survivors may not be the space's best")


def _dropped(by_id: dict[str, dict[str, Any]], ses: dict[str, Any]) -> None:
    """Candidates the launch watchdog left out of a session: their status says why (timeout, crashed, ...)."""
    for cid, why in ses["dropped"].items():
        if cid in by_id and by_id[cid]["role"] == "candidate":
            by_id[cid]["status"] = why["status"] if why["status"] in ("timeout", "crashed") else "raised"
            by_id[cid]["reason"] = "launch watchdog, before the timed session: " + why["reason"][:500]


def _finish(rec: dict[str, Any], verdict: str, reason: str) -> None:
    rec["verdict"], rec["reason"] = verdict, reason
    rec["decision"]["reason"] = reason


def _below_floor(be: Backend, peaks, work, stats: dict[str, Any]) -> dict[str, float]:
    """Slots whose fastest sample beats the device's physical floor (a timer that missed the work)."""
    from skillrun.analysis.peaks import DEFAULT_PEAKS, floor_ms

    flops, nbytes, dtypes = work
    peak = (peaks or DEFAULT_PEAKS).lookup(be.facts.name, be.facts.arch)
    if peak is None or not (flops or nbytes):
        return {}
    dtype = next((d for d in dtypes or [] if d != "*"), None)
    fl = float(floor_ms(flops, nbytes, peak, dtype)["floor_ms"])
    return {slot: fl for slot, st in stats.items() if st.get("min", fl) < fl}


def _sweep_and_recheck(rec, ctx, pool, be, inc, start, survivors, by_id, baseline_ref, rounds, recheck_rounds, top, notes,
                       work, peaks):
    inc_slot = {"kernel": inc.kernel, "config": dict(inc.config)}
    chunks = [survivors[i:i + SLOTS_PER_SESSION] for i in range(0, len(survivors), SLOTS_PER_SESSION)]
    jobs = [S.session_job(ctx, inc_slot, [(cid, by_id[cid].get("kernel") or start.kernel, cfg) for cid, cfg in ch], None,
                          2000 + i, rounds)
            for i, ch in enumerate(chunks)]
    results = pool.map(jobs)
    sessions = []
    ranked: list[tuple[float, str]] = []
    for ch, res in zip(chunks, results):
        ids = [cid for cid, _ in ch]
        ses = S.read_session(res, ids)
        ses["device"] = res.get("device")
        sessions.append(ses)
        _dropped(by_id, ses)
        if "error" in ses:
            for cid in ids:
                by_id[cid]["sweep"] = {"error": ses["error"][:500]}
            continue
        if rec["timing"] is None and res.get("timing"):
            rec["timing"] = timing_meta(ctx, res, rounds)
        for cid in ids:
            if cid in ses["dropped"]:
                continue
            ok = ses["integrity"].get(cid, {}).get("passed", False)
            sp = ses["ratio_vs_incumbent"].get(cid)
            by_id[cid]["sweep"] = {"speedup_vs_incumbent": sp, "median_ms": ses["stats"].get(cid, {}).get("median"),
                                   "noise_pct": ses["noise_pct"], "session": len(sessions) - 1,
                                   "integrity": ses["integrity"].get(cid)}
            if not ok:
                by_id[cid]["status"] = "integrity_failed"
                by_id[cid]["reason"] = "slot integrity failed in the sweep session: " + ses["integrity"].get(cid, {}).get("reason", "")[:400]
            elif sp is not None:
                ranked.append((sp, cid))
    rec["sweep"] = {"sessions": sessions}
    if not ranked:
        errs = "; ".join(s.get("error", "") for s in sessions if "error" in s)[:600]
        _finish(rec, "error" if errs else "no_survivor", f"no candidate was timed in the sweep{': ' + errs if errs else ''}")
        return
    ranked.sort(reverse=True)
    finalists = [cid for _, cid in ranked[:max(1, top)]]

    # Fresh session, one device, nothing else running on it (the pool is idle now): the MoE PR's
    # busy-GPU winners did not survive exactly this.
    peers = [(cid, by_id[cid].get("kernel") or start.kernel, by_id[cid]["config"]) for cid in finalists]
    # Hidden A/A: the sweep's start config timed once more beside the incumbent. When it is the
    # incumbent's own config, any ratio outside the noise floor means the session's numbers cannot be
    # trusted (an engine biased by slot position once reported such a copy at 1.46x).
    peers.append((START_CHECK, start.kernel, dict(start.config)))
    job = S.session_job(ctx, inc_slot, peers, baseline_ref, 9001, recheck_rounds)
    res = pool.solo(job)
    ses = S.read_session(res, finalists + [START_CHECK])
    dev = res.get("device")
    ses["device"] = f"{be.facts.name} (device {dev})" if dev is not None else be.facts.name
    rec["recheck"] = ses
    _dropped(by_id, ses)
    if "error" in ses:
        _finish(rec, "error", f"the re-check session failed: {ses['error'][:600]}")
        return
    if rec["timing"] is None:
        rec["timing"] = timing_meta(ctx, res, recheck_rounds)
    noise = ses["noise_pct"]
    dec = rec["decision"]
    dec["noise_pct"] = noise
    st = ses["stats"]
    if S.BASELINE in st:
        dec["incumbent_vs_baseline"] = round(st[S.BASELINE]["median"] / st[S.INCUMBENT]["median"], 4)
    if not ses["integrity"].get(S.INCUMBENT, {}).get("passed", False):
        _finish(rec, "error", "the incumbent failed slot integrity in the re-check: " + ses["integrity"][S.INCUMBENT]["reason"][:400])
        return
    check = start_check(ses, start.kernel == inc.kernel and dict(start.config) == dict(inc.config))
    dec["start_check"] = check
    if check.get("unreliable"):
        _finish(rec, "no_win", f"numbers unreliable: {check['text']}; nothing proposed")
        return
    impossible = _below_floor(be, peaks, work, st)
    if impossible:
        _finish(rec, "error", "measurement error: " + ", ".join(f"{s} min {st[s]['min']:.6g} ms" for s in sorted(impossible))
                + f" is below the physical floor {next(iter(impossible.values())):.6g} ms; these timings cannot be real")
        return
    best = None
    for cid in finalists:
        if cid in ses["dropped"]:
            continue
        sp = ses["ratio_vs_incumbent"].get(cid)
        ok = ses["integrity"].get(cid, {}).get("passed", False)
        by_id[cid]["recheck"] = {"speedup_vs_incumbent": sp, "median_ms": st.get(cid, {}).get("median"),
                                 "noise_pct": noise, "integrity": ses["integrity"].get(cid)}
        if not ok:
            by_id[cid]["status"] = "integrity_failed"
            by_id[cid]["reason"] = "slot integrity failed in the re-check: " + ses["integrity"].get(cid, {}).get("reason", "")[:400]
            continue
        if sp is not None and (best is None or sp > best[0]):
            best = (sp, cid)
    floor = (noise or 0.0) / 100.0
    floor_txt = f"A/A noise {noise:.2f}%" if noise is not None else "no A/A noise floor"
    if best is None:
        _finish(rec, "no_win", "no finalist survived the re-check")
        return
    sp, cid = best
    label = by_id[cid]["label"]
    if noise is None:
        _finish(rec, "no_win", f"best finalist {cid} ({label}) {sp:.3f}x vs the incumbent, but the re-check has no A/A noise floor: nothing proposed")
        return
    if sp <= 1.0 + floor:
        sweep_sp = by_id[cid].get("sweep", {}).get("speedup_vs_incumbent")
        how = (f"inside the {floor_txt}: within noise" if sp >= 1.0 - floor
               else f"slower than the incumbent beyond the {floor_txt}")
        _finish(rec, "no_win", f"best finalist {cid} ({label}) is {sp:.3f}x the incumbent {inc.name} in the re-check "
                f"(sweep said {sweep_sp:.3f}x), {how}: the incumbent stays")
        return
    dec["winner"] = cid
    dec["speedup_vs_incumbent"] = round(sp, 4)
    if S.BASELINE in st:
        dec["speedup_vs_baseline"] = round(st[S.BASELINE]["median"] / st[cid]["median"], 4)
    vs_base = f"; {dec['speedup_vs_baseline']:.3f}x vs the baseline" if dec["speedup_vs_baseline"] else "; baseline not timed (it failed its gate or the card names none)"
    _finish(rec, "proposed", f"{cid} ({label}) beats the incumbent recipe {inc.name!r} by {sp:.3f}x in a fresh same-session re-check "
            f"on one device ({floor_txt}){vs_base}")


# ------------------------------------------------------------------------------------------ start-config check

START_CHECK = "start_check"


def start_check(ses: dict[str, Any], identical: bool) -> dict[str, Any]:
    """The hidden A/A of the start config in the re-check: its ratio against the incumbent, and whether
    the session is trustworthy (only judged when the start config is the incumbent's own)."""
    ratio = ses.get("ratio_vs_incumbent", {}).get(START_CHECK)
    noise = ses.get("noise_pct")
    out: dict[str, Any] = {"ratio_vs_incumbent": ratio, "identical_to_incumbent": identical, "noise_pct": noise}
    if ratio is None:
        out["text"] = "the start config was not timed in the re-check"
        return out
    floor = max(noise or 0.0, 1.0)
    dev = 100.0 * abs(ratio - 1.0)
    out["within_noise"] = dev <= floor
    if identical and not out["within_noise"]:
        out["unreliable"] = True
        out["text"] = (f"the start config, identical to the incumbent, came out at {ratio:.3f}x the incumbent, outside the "
                       f"{floor:.2f}% noise floor: the session's ratios are not trustworthy")
    else:
        out["text"] = f"start config at {ratio:.3f}x the incumbent ({'within' if out['within_noise'] else 'outside'} the {floor:.2f}% noise floor)"
    return out
