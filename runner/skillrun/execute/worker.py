"""The child side of the harness: one task per process (see isolate.py), in the sandbox (skillrun.io.sandbox).

Tasks (JSON):
  candidate  build one kernel (port, baseline or alternative), run it once per seed and hand each
             output over as raw bytes (the accused's half of the parity gate, judge.py)
  judge      the other half, in a child that never imports a kernel: oracle, checksums, comparison
  probe      the launch watchdog's probe (watchdog.py): each slot's first launches, progress written around each
  slots      one side of a timed session (slot_server.py): the accused's (the port, its peers) or the
             references'; the parent drives it and holds the clock (session.py)

The port is untrusted code (so is every reference), and the tasks are built so that gaming the
measurement fails. What decides runs elsewhere: the parity gate is judged by a judge child
(judge.py); the timed session is driven by the parent, whose referee (referee.py) draws every input
set's content and, once every slot has committed to its output, whether a round is checked, and
judges the outputs handed over as bytes. This module also holds the gates the parent computes from
what the session's processes saw (kernel names, the observer effect: ``_names_gate``,
``_finish_gate``). Every child enters the sandbox first (``confine``), before any kernel module is
imported.

Only torch, the problem/kernel modules and light skillrun modules are imported here (never
pydantic models), so the child runs on a device image that lacks the runner's extras.
"""
from __future__ import annotations

import importlib
import math
import json
import os
import random
import sys
import time
import traceback
from typing import Any

from skillrun.execute import integrity, operands, parity
from skillrun.execute.cost import TASK as COST, take_compiles
from skillrun.execute.launch import (_aa_copy, _build, _describe, _fp32_oracle_precision, _jsonable,  # noqa: F401
                                     _run_once, _storage_bytes, _sync)


def _progress(task: dict):
    """A writer of the launch watchdog's progress lines (watchdog.LaunchClock), or a no-op.

    Written, flushed and synced before each step, so a step that never returns is still named."""
    path = task.get("progress")
    if not path:
        return lambda event, what="": None

    def note(event: str, what: str = "") -> None:
        with open(path, "a") as fh:
            fh.write(json.dumps({"event": event, "what": what}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    return note


def candidate(task: dict) -> dict:
    """The accused's half of the parity gate (judge.py): build, then prepare and run once per seed and
    hand each output over (``task["handover"]``); the oracle and the comparison are the judge's."""
    from skillrun.execute import judge
    from skillrun_kernels.protocol import UnsupportedShape

    device = task["device"]
    sync = _sync(device)
    COST.mark("imports")
    problem = importlib.import_module(task["problem"])
    mine = "reference_setup" if task["role"] in operands.REFERENCE_ROLES else "compile"
    COST.mark(mine)
    result: dict[str, Any] = {"status": "ok", "role": task["role"], "ref": task["ref"]}
    # The shape is the runner's choice (on a CPU its proxy, chosen in the parent: proxy.py); nothing
    # this child imports can change it.
    shape = dict(task["shape"])
    result["shape"] = shape
    handover = task["handover"]
    note = _progress(task)
    try:
        note("start", "its build")
        launch, build_s = _build(task["ref"], shape, task.get("config") or {}, device)
        note("done")
    except UnsupportedShape as exc:
        result.update(status="unsupported", parity={"passed": False, "supported": False, "error": f"unsupported shape: {exc}"})
        return result
    result.update(_describe(launch), build_s=round(build_s, 4))
    for seed in task["seeds"]:
        inputs = problem.make_inputs(shape, seed, device)
        # prepare() sees the weights and only a decoy's activations (operands.py): work on activations is timed work.
        acts = [] if task["role"] in operands.REFERENCE_ROLES else operands.activation_keys(problem, inputs)
        real = {k: inputs[k].clone() for k in acts}
        decoy = _activations(problem.make_inputs(shape, random.SystemRandom().randrange(1, 2**62), device), acts) if acts else {}
        try:
            note("start", f"its prepare and launch for seed {seed} (compile included on the first)")
            prepared = operands.prepare_blind(launch, inputs, acts, decoy, real)
            del decoy, real
            out = problem.output_like(shape, device)
            marker = parity.poison(out)
            t0 = time.perf_counter()
            res = _run_once(launch, prepared, out, sync)
            first_s = time.perf_counter() - t0
            note("done")
        except UnsupportedShape as exc:
            result.update(status="unsupported", parity={"passed": False, "supported": False, "error": f"unsupported shape: {exc}"})
            return result
        COST.mark("checks" if mine == "compile" else mine)  # the port's later seeds: its parity gate
        meta = {"poison": marker, "wrote_into_out": res is out, "run_s": round(first_s, 4),
                "after_digests": integrity.digests(inputs)}
        try:
            judge.write_output(handover, seed, res, meta)
        except TypeError as exc:
            judge.write_refusal(handover, seed, str(exc), meta)
        del inputs, prepared, out, res
    return result


def _activations(inputs: dict, acts: list[str]) -> dict:
    """Only the activations of a decoy input set (its weights are freed at once: they can be large)."""
    return {k: inputs[k] for k in acts}


# How much more a port may slow down under the profiler than the reference does (each against its own
# plain launches at the same positions) before its timed rounds are taken to run other code when not
# observed (and, two-sided, how much faster). Eager launches only: a replayed CUDA graph runs no port code.
OBSERVER_EFFECT_LIMIT = 2.5


def _names_gate(n: str, launches: dict, port: str, refs: list[str], dev_names: list[str], host_names: list[str],
                use_device: bool, peers: list[str] = (), vendor_ops: str | None = None) -> dict:
    """Slot n's kernel-name gate from what the profiler saw (device kernels on a GPU, host ops on a CPU).

    Peers (the tuner's candidates) run the port's own kernel with other configs: they and the port
    are checked against the references' regexes and the problem's ``vendor_ops`` (host ops that compute
    the family's whole answer in one library call, whatever the port names itself). A reference runs in
    a process that never imports a port, so no port code can show up in its window: it is held to its
    own regex only; the accused's regexes are the accused's word and are never held against it."""
    launch = launches[n]
    host_rx = (launch.describe or {}).get("expect_host_ops")
    accused = n == port or n in peers
    vs = refs if accused else []

    def rx(k: str, device: bool) -> str | None:
        h = (launches[k].describe or {}).get("expect_host_ops")
        return launches[k].expect_kernels if device else (h or launches[k].expect_kernels)

    # (the vendor ops first: where a reference's regex names the same op, the reference is named)
    host_others = {"the problem's vendor ops": vendor_ops} if accused and vendor_ops else {}
    host_others.update({k: (launches[k].describe or {}).get("expect_host_ops") for k in vs})
    if use_device:
        gate = integrity.evaluate_names(n, rx(n, True), {k: rx(k, True) for k in vs}, dev_names, device=True)
        # A foreign host op is a red flag on a GPU too (e.g. the port calling aten::_scaled_mm).
        host_gate = integrity.evaluate_names(n, None, host_others, host_names, device=False, own_required=False)
        if not host_gate["passed"]:
            gate["passed"] = False
            gate["reason"] = (gate.get("reason", "") + "; host: " + host_gate["reason"]).strip("; ")
        return gate
    others = {"the problem's vendor ops": vendor_ops} if accused and vendor_ops else {}
    others.update({k: rx(k, False) for k in vs})
    return integrity.evaluate_names(n, rx(n, False), others, host_names, device=False,
                                    own_required=bool(host_rx) or _is_host_kernel(launch))


def _finish_gate(slot: dict, n: str, sets: Any, observer: Any, t: dict | None, launches: dict,
                 port: str, refs: list[str], use_device: bool, graphs: bool, aa: str | None, peers: list[str] = (),
                 vendor_ops: str | None = None) -> None:
    """Fold the checks made around slot n's calls into its integrity gate (what the artifact shows);
    the sampled output checks are the referee's, added in the parent (referee.fold)."""
    gate = slot.setdefault("integrity", {"name": f"slot_integrity:{n}", "passed": False, "reason": "not checked"})
    problems = []
    muts = sets.mutations[n]
    gate["input_checksums"] = {"checked": sets.checks[n], "mutated": len(muts), "where": muts[:5], "method": integrity.DIGEST_METHOD}
    if sets.tampered[n]:
        gate["input_checksums"]["written_by_another_slot"] = sets.tampered[n][:5]
    if n == port or n in peers:
        # Another slot's copy written while this slot's code could run: the session cannot be trusted,
        # and the accused are the ones that gain from it (a reference blamed for writing its inputs).
        foreign = {k: v for k, v in sets.tampered.items() if v}
        if foreign:
            problems.append("input copies of " + ", ".join(f"{k} ({v[0]})" for k, v in sorted(foreign.items()))
                            + " were written during the session although those slots, run again alone, leave them "
                            "intact: another slot's code wrote them")
    if muts:
        problems.append(f"wrote to its input operand(s) ({muts[0]}{'; ' + str(len(muts) - 1) + ' more' if len(muts) > 1 else ''}): "
                        "the checksum of its own copy changed across its call; every slot reads its own copy, so no other "
                        "slot saw the change, and the copy was rebuilt from the pristine master")
    if t is not None:
        dev, host, rounds = observer.names(n)
        obs = {"rounds": rounds, "launches": len(rounds),
               "what": "graph replays (the captured kernels)" if graphs else "eager launches, profiled in place"}
        slow = observed_slowdown(t, n)
        if slow is not None:
            obs["slowdown"] = round(slow, 4)
        gate["observed_rounds"] = obs
        if n in observer.errors:
            problems.append(observer.errors[n])
        elif rounds:
            og = _names_gate(n, launches, port, refs, dev, host, use_device, peers, vendor_ops)
            if not og["passed"]:
                problems.append(f"in timed round(s) {rounds} profiled in place: {og['reason']}")
        if (n == port or n in peers) and not graphs and "slowdown" in obs:
            # Against the reference's own observed/plain ratio at the same positions: the profiler's cost
            # is shared, a port that runs other code when nobody watches is not (CPU wall timing too).
            ref = aa if aa in launches else next(iter(refs), None)
            ref_slow = observed_slowdown(t, ref) if ref else None
            if ref_slow and not use_device:
                # On a CPU the profiler's cost is per host op, so a port made of many small ops slows down
                # more than one vendor call does. Expect plain time + ops x the reference's cost per op.
                rel = host_observer_effect(t, n, ref, observer)
                if rel is not None:
                    obs["model"] = "host ops: plain time + (profiled ops x the reference's profiler cost per op)"
            else:
                rel = obs["slowdown"] / max(ref_slow, 1e-12) if ref_slow else None
            slowest = max((t.get("samples") or {}).get(n) or [0.0])
            seen_obs = (t.get("observed") or {}).get(n) or []
            if rel is not None:
                obs["slowdown_vs_reference"] = round(rel, 4)
                # ... and slower than every plain launch of its own: a loaded host's stray slow launches
                # land among the plain ones too, so noise alone does not refuse an honest port.
                if rel > OBSERVER_EFFECT_LIMIT and seen_obs and _median(seen_obs) > slowest:
                    problems.append(f"ran {obs['slowdown']:.2f}x slower when profiled than when not ({ref}: "
                                    f"{obs['slowdown'] / rel:.2f}x): it may run other code when not observed; "
                                    "time it with cuda_graph=True")
            # Two-sided: faster when watched than every plain launch of its own (the profiler only adds
            # cost), and by more than the limit against the reference: it runs other code when watched.
            # Against its own fastest plain launch, so a bimodal port (two honest speeds) is not refused.
            fastest = min((t.get("samples") or {}).get(n) or [float("inf")])
            seen_ms = (t.get("observed") or {}).get(n) or []
            # On a CPU the plain wall-clock launches of a loaded 2-core host can all run slower than a few profiled
            # ones (honest toys were refused at 1.15x-1.5x); there the profiled median must also beat the fastest
            # plain launch by the limit itself, which a port that idles when watched still does by far. CPU timing
            # is never GPU evidence; on a device the rule is unchanged.
            margin = 1.0 if use_device else OBSERVER_EFFECT_LIMIT
            if rel is not None and seen_ms and rel < 1.0 / OBSERVER_EFFECT_LIMIT and _median(seen_ms) * margin < fastest:
                problems.append(f"ran {1 / max(obs['slowdown'], 1e-12):.2f}x faster when profiled than when not, faster "
                                f"than any of its plain launches ({_median(seen_ms):.4g} ms against {fastest:.4g} ms): it "
                                "runs other code when observed")
    if problems:
        first = gate.get("reason") if not gate.get("passed", False) else None
        gate["passed"] = False
        gate["reason"] = "; ".join(([first] if first else []) + problems)


# Graph replays: a sample holds enough back-to-back calls to last about this long (sustained load).
# 8 ms, not 2: under its power limit the H200's SM clock moves between ~1450 and 1965 MHz within a
# round (NVML, commit fc67a32), and a 3.6 ms sample of 8192^3 spread 11.6 % (p10-p90) with it; a
# longer sample averages over those swings.
SAMPLE_TARGET_MS = 8.0
MAX_REPEAT = 64


def graph_repeat(tcfg: dict, first: dict, n_sets: int) -> int:
    """Calls per timed sample: ``tcfg["repeat"]`` if given, else enough for the fastest slot's
    sample to last SAMPLE_TARGET_MS (one event-timed call of each slot, after warm-up)."""
    want = tcfg.get("repeat")
    if isinstance(want, int) and want >= 1:
        return min(want, MAX_REPEAT)
    import torch

    fastest = None
    for fn in first.values():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ms = a.elapsed_time(b)
        fastest = ms if fastest is None else min(fastest, ms)
    if not fastest or fastest <= 0:
        return 1
    return max(1, min(MAX_REPEAT, math.ceil(float(tcfg.get("sample_ms", SAMPLE_TARGET_MS)) / fastest)))


def per_call(t: dict, repeat: int) -> None:
    """Samples of ``repeat`` back-to-back calls, as milliseconds per call."""
    for v in t["samples"].values():
        v[:] = [x / repeat for x in v]
    for v in t["observed"].values():
        v[:] = [x / repeat for x in v]
    for cols in t["raw"].values():
        cols["ms"] = [x / repeat for x in cols["ms"]]
    pe = t.get("position_effect") or {}
    for k, meds in (pe.get("median_ms_by_position") or {}).items():
        pe["median_ms_by_position"][k] = [m / repeat if m is not None else None for m in meds]


def host_observer_effect(t: dict, n: str, ref: str, observer: Any) -> float | None:
    """Slot n's observed time over what the profiler alone explains: its plain median plus its
    profiled host-op count times the reference's measured profiler cost per op."""
    def plain(k: str) -> float | None:
        xs = (t.get("samples") or {}).get(k) or []
        return _median(xs) if xs else None

    def ops(k: str) -> float | None:
        rec = observer.seen.get(k) or []
        return _median([float(len(h)) for _, _, h in rec]) if rec else None

    p_obs, r_obs = (t.get("observed") or {}).get(n) or [], (t.get("observed") or {}).get(ref) or []
    p_plain, r_plain, p_ops, r_ops = plain(n), plain(ref), ops(n), ops(ref)
    if not p_obs or not r_obs or None in (p_plain, r_plain, p_ops, r_ops):
        return None
    per_op = max(0.0, _median(r_obs) - r_plain) / max(r_ops, 1.0)
    expected = p_plain + p_ops * per_op
    return _median(p_obs) / max(expected, 1e-12)


def observed_slowdown(t: dict, n: str) -> float | None:
    """Median over slot n's observed launches of (observed ms / its plain median at the same position):
    the per-position medians are the engine's own (timing.position_effect, over the kept samples)."""
    observed = t.get("observed", {}).get(n) or []
    samples = t.get("samples", {}).get(n) or []
    if not observed or not samples:
        return None
    overall = _median(samples)
    by_pos = ((t.get("position_effect") or {}).get("median_ms_by_position") or {}).get(n) or []
    positions = (t.get("observed_positions") or {}).get(n) or [None] * len(observed)

    def plain(p):
        m = by_pos[p] if isinstance(p, int) and 0 <= p < len(by_pos) else None
        return m if m is not None else overall

    return _median([o / max(plain(p), 1e-12) for o, p in zip(observed, positions)])


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    k = len(ys) // 2
    return ys[k] if len(ys) % 2 else 0.5 * (ys[k - 1] + ys[k])


def _is_host_kernel(launch) -> bool:
    """A torch-on-host kernel (no device kernels exist): its expect regex names host ops."""
    return (launch.describe or {}).get("backend") in ("torch", "cpu")


def probe(task: dict) -> dict:
    """The watchdog's probe (watchdog.py): each slot built and launched in turn, progress written around it.

    The parent reads the progress file to know which slot a hang belongs to; the lines are flushed
    and synced before the launch so that a slot that never returns is still named."""
    device = task["device"]
    sync = _sync(device)
    COST.mark("imports")
    problem = importlib.import_module(task["problem"])
    COST.mark("compile")  # each slot's build and first launches
    shape = dict(task["shape"])
    inputs = problem.make_inputs(shape, 0, device)
    acts = operands.activation_keys(problem, inputs)
    decoy = _activations(problem.make_inputs(shape, 1, device), acts)
    real = {k: inputs[k].clone() for k in acts}

    def note(event: dict) -> None:
        with open(task["progress"], "a") as fh:
            fh.write(json.dumps(event) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    out: dict[str, Any] = {"status": "ok", "probes": {}}
    for s in task["slots"]:
        note({"slot": s["slot"], "event": "start"})
        t0 = time.perf_counter()
        try:
            launch, _ = _build(s["ref"], shape, s.get("config") or {}, device)
            prepared = operands.prepare_blind(launch, inputs, acts, decoy, real)
            buf = problem.output_like(shape, device)
            for _ in range(max(1, int(task.get("launches", 1)))):
                _run_once(launch, prepared, buf, sync)
            ev = {"slot": s["slot"], "event": "ok", "seconds": round(time.perf_counter() - t0, 3)}
            del launch, prepared, buf
        except Exception as exc:  # this slot's error; the next slot is still probed
            ev = {"slot": s["slot"], "event": "error", "seconds": round(time.perf_counter() - t0, 3),
                  "reason": f"{type(exc).__name__}: {exc}"[:600]}
            if device.startswith("cuda"):
                try:
                    sync()
                except Exception:  # a sticky device error: later slots need a fresh context (a new child)
                    note(ev)
                    os._exit(3)
        note(ev)
        out["probes"][s["slot"]] = ev
    return out


def _judge(task: dict) -> dict:
    COST.mark("imports")
    import torch  # noqa: F401  (what the judge computes with; counted as imports, not as the check)

    COST.mark("checks")
    from skillrun.execute import judge

    return judge.judge_task(task)


def _slots(task: dict) -> dict:
    from skillrun.execute import slot_server

    return slot_server.serve(task)


# A timed session (kind "session") never reaches a child: the parent drives it (session.py) and starts
# one "slots" child per side (the accused's, the references').
TASKS = {"candidate": candidate, "judge": _judge, "probe": probe, "slots": _slots}


def confine(task: dict, task_path: str, parent: int | None, deathsig: bool) -> dict:
    """Enter the sandbox (skillrun.io.sandbox) before any kernel module is imported, and tie this
    process's life to ``parent``. The judge imports no kernel: its environment is scrubbed, nothing more.
    Writable: the task's own folder (its result, its progress) and its hand-over folder, nothing else."""
    from skillrun.io import lifeline, sandbox

    kind = task.get("kind")
    mode = "off" if kind == "judge" else str(task.get("sandbox") or "auto")
    role = "reference" if task.get("role") in operands.REFERENCE_ROLES or task.get("role") == "references" else "accused"
    writable = [os.path.dirname(os.path.abspath(task_path)), task.get("handover")]
    info = sandbox.enter([w for w in writable if w], role=role, mode=mode, parent=parent, deathsig=deathsig)
    if not info.get("lifeline") and parent is not None:
        lifeline.die_with_parent(parent, deathsig=deathsig)
    return info


def main(argv: list[str], parent: int | None = None, deathsig: bool = False, confined: dict | None = None) -> int:
    """Run the task in ``argv[1]``, its result to ``argv[2]``; ``parent``: the process to die with.
    ``confined``: this process entered the sandbox already (a card's server, serve.py: what it said then)."""
    task_path, result_path = argv[1], argv[2]
    task = json.loads(open(task_path).read())
    COST.reset()
    if isinstance(task.get("t_spawn"), (int, float)):  # a child of its own: the interpreter's start is this task's
        COST.add("process_start", max(0.0, time.time() - float(task["t_spawn"])))
    try:
        try:
            if confined is None:
                COST.mark("process_start")  # entering the sandbox is part of starting the task's process
                info = confine(task, task_path, parent, deathsig)
                COST.mark(None)
            else:
                info = confined
                # a card's server: kernels compiled ahead since it started (a carried folder topped up while the
                # GPU measures) reach its Triton cache before this task (the accused's only: compile_seed.py)
                from skillrun.io import compile_seed

                if compile_seed.seed_folder() and os.environ.get("TRITON_CACHE_DIR"):
                    compile_seed.seed(os.environ["TRITON_CACHE_DIR"])
        except Exception as exc:  # noqa: BLE001 - a sandbox that was required and did not hold: no task runs
            raise RuntimeError(f"sandbox: {type(exc).__name__}: {exc}") from None
        res = TASKS[task["kind"]](task)
        if isinstance(res, dict):
            res["sandbox_entered"] = info
    except Exception as exc:  # reported as this row's error; the parent carries on
        res = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000],
               "traceback": traceback.format_exc()[-4000:]}
    if isinstance(res, dict):
        res["phases"] = COST.to_json()
        compiles = take_compiles()
        if compiles:
            res["compile_cache"] = compiles
    tmp = result_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(_jsonable(res), fh, allow_nan=True)
    os.replace(tmp, result_path)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    from skillrun.io import lifeline

    # Spawned by the harness: end with it, even after its SIGKILL (the sandbox carries the watch).
    pid_text = os.environ.get(lifeline.PARENT_ENV, "")
    sys.exit(main(sys.argv, int(pid_text) if pid_text.isdigit() else None, os.environ.get(lifeline.DEATHSIG_ENV) == "1"))
