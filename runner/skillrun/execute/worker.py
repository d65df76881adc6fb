"""The child side of the harness: one task per process (see isolate.py).

Tasks (JSON):
  candidate  build one kernel (port, baseline or alternative), run it once per seed and hand each
             output over as raw bytes (the accused's half of the parity gate, judge.py)
  judge      the other half, in a child that never imports a kernel: oracle, checksums, comparison
  probe      the launch watchdog's probe (watchdog.py): each slot's first launches, progress written around each
  session    build the candidates that passed, check output aliasing and slot integrity with the
             profiler, and time them interleaved (GPU, or an injected timer)

The port is untrusted code (so is every reference), and the tasks are built so that gaming the
measurement fails. What decides runs in other processes: the parity gate is judged by a judge child
(judge.py), and the timed session's checks by its referee in the parent (referee.py), which draws
every input set's content and, after each timed round and once every slot has committed to its
output, whether that round is checked; it judges the outputs handed over as bytes. What stays here:
inputs checksummed around every call (a candidate that writes its operands fails; in the session
each slot has its own copy, so the others never see it), and kernel names taken from timed rounds
profiled in place at random positions (on a GPU with cuda_graph, from replays of the captured
graphs). All of it runs between rounds, after the device is synchronized, never inside a measured
launch.

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

from skillrun.execute import confidence, integrity, operands, parity, referee, timing
from skillrun.execute.cost import PhaseClock, take_compiles, watch_compiles
from skillrun.execute.input_sets import InputSets
from skillrun.execute.parity import DegenerateInput
from skillrun.kb.refs import resolve

# Seconds by phase of the task this process runs (cost.py): one ``COST.mark(phase)`` per change of
# phase; the result carries them as ``phases``.
COST = PhaseClock()


def _sync(device: str):
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "model_dump"):
        return _jsonable(obj.model_dump(mode="json"))
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return _jsonable(asdict(obj))
    return str(obj)


def _build(ref: str, shape: dict, config: dict, device: str):
    from skillrun_kernels.protocol import KernelLaunch

    prev = COST.mark("imports")  # the kernel module and what it imports
    builder = resolve(ref)
    watch_compiles()  # Triton's cache hits and misses from here on (a carried compile cache, compile_ahead.py)
    COST.mark(prev)
    t0 = time.perf_counter()
    launch = builder(dict(shape), dict(config or {}), device)
    if not isinstance(launch, KernelLaunch):
        raise TypeError(f"{ref} returned {type(launch).__name__}, not a KernelLaunch (kernels/skillrun_kernels/protocol.py)")
    return launch, time.perf_counter() - t0


def _describe(launch) -> dict:
    return {"name": launch.name, "expect_kernels": launch.expect_kernels, "describe": _jsonable(launch.describe)}


def _run_once(launch, prepared, out, sync):
    res = launch.run(prepared, out)
    sync()
    return out if res is None else res


def _fp32_oracle_precision() -> None:
    """The oracle's fp32 matmul must be real fp32 on a GPU, not TF32 (a site default could change it)."""
    import torch

    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


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


def _storage_bytes(objs) -> int:
    seen, total = set(), 0
    for t in integrity.tensors_in(objs):
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


# How much more a port may slow down under the profiler than the reference does (each against its own
# plain launches at the same positions) before its timed rounds are taken to run other code when not
# observed. Eager launches only: a replayed CUDA graph runs no port code at all.
OBSERVER_EFFECT_LIMIT = 2.5


def session(task: dict) -> dict:
    try:
        return _session(task)
    except DegenerateInput as exc:
        return {"status": "error", "input_error": True, "error": str(exc)}


def _session(task: dict) -> dict:
    _fp32_oracle_precision()
    # The referee (referee.py, in the parent) draws the input content and which timed rounds are
    # checked, and judges those: connected before any kernel module is imported, so no port can take
    # the connection first. Which rounds are profiled is drawn here (os.urandom), as each round starts.
    client = referee.Client(task["referee"])
    try:
        return _timed_session(task, client)
    finally:
        client.close()


def _timed_session(task: dict, client: Any) -> dict:
    import torch

    device = task["device"]
    sync = _sync(device)
    use_device = device.startswith("cuda")
    COST.mark("imports")
    problem = importlib.import_module(task["problem"])
    COST.mark("compile")
    shape = dict(task["shape"])
    tcfg = task.get("timing") or {}
    rng = random.SystemRandom()
    res: dict[str, Any] = {"status": "ok", "slots": {}, "notes": [], "shape": shape}
    launches = {}
    for s in task["slots"]:
        launch, build_s = _build(s["ref"], shape, s.get("config") or {}, device)
        launches[s["slot"]] = launch
        res["slots"][s["slot"]] = {**_describe(launch), "build_s": round(build_s, 4), "ref": s["ref"]}
    port = task["port_slot"]
    # Peers (the tuner's candidates) run the port's own kernel with other configs: they are checked
    # like the port (against the references), never against each other or the port.
    peers = [n for n in task.get("peers") or [] if n in launches and n != port]
    refs = [n for n in launches if n != port and n not in peers]

    # Input sets: one for the checks, more when rotating to keep operands out of L2; each slot its own copy.
    timer = timing.make_timer(tcfg.get("timer"), device)
    want_graphs = bool(tcfg.get("cuda_graph") and use_device and timer is not None)
    # (the referee rejects a degenerate problem when set 0 is made, before any candidate runs)
    COST.mark("inputs")
    sets = InputSets(problem, task["problem"], shape, device, launches, 1, in_place=want_graphs, blind={port, *peers},
                     source=client)
    outs = {n: [problem.output_like(shape, device)] for n in launches}
    bytes_per_set = _storage_bytes([sets.master[0], *(sets.copies[n][0] for n in launches),
                                    *(sets.prepared[n][0] for n in launches), *(outs[n][0] for n in launches)])
    n_sets, cold = 1, "n/a (not timed)"
    if timer is not None:
        if use_device:
            free, _total = torch.cuda.mem_get_info()
            budget = int(free * 0.5)
        else:
            budget = 1 << 30
        n_sets, cold = timing.rotation_sets(bytes_per_set, tcfg.get("l2_bytes"), tcfg.get("cold_l2", "rotate"),
                                            int(tcfg.get("max_sets", 32)), budget)
        # New content on every visit (InputSets.refresh): a repeated timed call never sees inputs it has
        # seen before, whatever the L2 mode. Two sets at least where memory allows, so the buffer changes
        # too; a single set only happens when one set is a good part of the device memory, far beyond L2,
        # so rewriting it just before its next use cannot leave it warm.
        if n_sets < 2 and budget >= 2 * bytes_per_set:
            n_sets = 2
    res["bytes_per_set"], res["input_sets"], res["cold_l2"] = bytes_per_set, n_sets, cold

    sets.rerun = lambda n, j: _run_once(launches[n], sets.prepared[n][j], outs[n][j], sync)
    # 1. aliasing: references first, then the port, on the same content (each on its own copy).
    COST.mark("checks")
    ref_outs = {}
    for n in refs:
        parity.poison(outs[n][0])
        ref_outs[n] = _run_once(launches[n], sets.prepared[n][0], outs[n][0], sync)
        sets.check(n, 0, "output-aliasing call")
    parity.poison(outs[port][0])
    port_out = _run_once(launches[port], sets.prepared[port][0], outs[port][0], sync)
    sets.check(port, 0, "output-aliasing call")
    others: dict[str, Any] = {"inputs": [sets.copies[n][0] for n in launches]}
    for n in refs:
        others[f"{n} output"] = ref_outs[n]
        others[f"{n} operands"] = sets.prepared[n][0]
    res["aliasing"] = integrity.aliasing_gate(port_out, others)
    if peers:
        res["peer_aliasing"] = {}
        for n in peers:
            parity.poison(outs[n][0])
            peer_out = _run_once(launches[n], sets.prepared[n][0], outs[n][0], sync)
            sets.check(n, 0, "output-aliasing call")
            res["peer_aliasing"][n] = integrity.aliasing_gate(peer_out, {**others, "port output": port_out})
            del peer_out
    del ref_outs, port_out

    # 2. which kernels ran: a profiled sample of each slot's launches (already warm).
    n_prof = int(task.get("profile_launches", 3))
    for n, launch in launches.items():
        fn = (lambda n=n, l=launch: l.run(sets.prepared[n][0], outs[n][0]))
        try:
            dev_names, host_names = integrity.profile_names(fn, n_prof, use_device, sync)
        except Exception as exc:  # a profiler failure must not pass as "proven"
            res["slots"][n]["integrity"] = {"name": f"slot_integrity:{n}", "passed": False, "reason": f"profiler failed: {exc}"}
            sets.check(n, 0, "profiled launches")
            continue
        sets.check(n, 0, "profiled launches")
        gate = _names_gate(n, launches, port, refs, dev_names, host_names, use_device, peers)
        gate["launches_profiled"] = n_prof
        res["slots"][n]["integrity"] = gate

    # 3. timing, interleaved, with an A/A copy of the chosen reference.
    slot_dirs = {s["slot"]: os.path.join(task["handover"], f"s{i}") for i, s in enumerate(task["slots"])}
    observer = integrity.RoundObserver(use_device)
    t = None
    if timer is not None:
        COST.mark("inputs")
        while sets.n_sets < n_sets:
            sets.add_set()
            for n in launches:
                outs[n].append(problem.output_like(shape, device))
        holder: dict[str, Any] = {}

        def call(n: str, j: int):
            launch, out = launches[n], outs[n][j]

            def fn():
                # Inside the measured interval only the launch and one dict store (host-side, ~0.1 us; on a
                # GPU the launch is asynchronous, so device events do not see it). The operands are looked up
                # at call time because a refresh may hand back new ones (eager only; graphs copy in place).
                r = launch.run(sets.prepared[n][j], out)
                holder[n] = out if r is None else r
            return fn

        fns = {n: [call(n, j) for j in range(n_sets)] for n in launches}
        COST.mark("warmup")  # graph warm-up and capture
        res["cuda_graph"] = False
        repeat = 1
        if want_graphs:
            try:
                for n in launches:
                    for j, f in enumerate(fns[n]):
                        f()  # warm on the side of capture (Triton JIT, cuBLAS handles)
                        sync()
                        sets.check(n, j, "graph warm-up call")
                repeat = graph_repeat(tcfg, {n: fns[n][0] for n in launches}, n_sets)
                graphs = {}
                for n in launches:
                    gl = []
                    for j in range(n_sets):
                        # One sample = `repeat` calls back to back, rotating through the input sets from j
                        # (each call reads operands another set evicted from L2), as a model runs kernels:
                        # the device stays at its sustained clock, not the boost of a lone launch.
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g):
                            for k in range(repeat):
                                fns[n][(j + k) % n_sets]()
                        cap = holder[n]  # a replay rewrites the tensor the last captured call returned

                        def replay(g=g, n=n, cap=cap):
                            g.replay()
                            holder[n] = cap
                        gl.append(replay)
                    graphs[n] = gl
                fns = graphs
                res["cuda_graph"] = True
            except Exception as exc:
                repeat = 1
                res["notes"].append(f"CUDA graph capture failed ({str(exc)[:200]}); timed eager launches")
        last_set = lambda j: (j + repeat - 1) % n_sets  # noqa: E731  the set the sample's last call read
        sets.in_place = bool(res["cuda_graph"])  # only captured graphs need prepare's operands copied in place
        aa = task.get("aa_slot")
        if aa in fns:
            # The A/A copy launches the same work through its own callables, marked as the copy, so an
            # injected test timer can tell the two apart whatever position the engine gives them.
            fns[f"{aa}#aa"] = [_aa_copy(f) for f in fns[aa]]
        between = None
        if tcfg.get("cold_l2") == "flush" and tcfg.get("l2_bytes") and use_device:
            flush = torch.empty(2 * int(tcfg["l2_bytes"]), dtype=torch.uint8, device=device)
            between = flush.zero_
        rounds = int(tcfg.get("rounds", 100))
        seen = {"checked": 0, "seconds": 0.0}

        def after_round(info: dict) -> None:
            # Runs after timer.sync() with every launch of the round finished and its time read: none of
            # this (checksums, commitments, handing outputs over, new content) is inside a measured interval.
            t0 = time.perf_counter()
            j, kind = info["set"], info["kind"]
            # A reference whose inputs another slot wrote in this round is not judged on this round's output.
            foreign = []
            for n in launches:
                before = len(sets.tampered[n])
                sets.check(n, j, f"{kind} round {info['index']}")
                if len(sets.tampered[n]) > before:
                    foreign.append(n)
            if kind == "timed":
                # Commit to every output first; the referee then says whether this round is checked.
                ans = client.ask({"op": "round", "kind": kind, "index": info["index"], "read": last_set(j),
                                  "last": bool(info["last"]), "commits": {n: _commit(holder[n]) for n in launches}})
                if ans.get("check"):
                    seen["checked"] += 1
                    for n in launches:
                        if n not in foreign:
                            _hand_over(slot_dirs[n], int(ans["token"]), holder[n])
                    client.ask({"op": "handed", "token": ans["token"], "foreign": foreign})
            sets.refresh(j)
            sync()
            seen["seconds"] += time.perf_counter() - t0

        # Stop on confidence (confidence.py) when the task asks for it; ``rounds`` is then a cap.
        rule = confidence.StopRule.from_config(tcfg.get("stop"), port, list(fns), aa)
        COST.mark(None)  # the engine says where its time went (phase_s)
        t = timing.interleave(fns, timer, rounds, int(tcfg.get("warmup", 10)), between, tcfg.get("max_seconds"),
                              observe=int(tcfg.get("observe_rounds", 3)), observer=observer, after_round=after_round, rng=rng,
                              stop=rule, horizon=rule.horizon(len(fns)) if rule else None)
        for k, v in (t.get("phase_s") or {}).items():
            COST.add(k, v)
        COST.mark("checks")
        if repeat > 1:
            per_call(t, repeat)
        res["timing"] = {"method": timer.method, "repeat": repeat,
                         **{k: t[k] for k in ("samples", "rounds", "warmup", "raw", "round_info",
                                                                       "position_effect", "unheld_rounds", "hold_ineffective", "throttled_rounds",
                                                                       "observed", "observed_positions", "held", "hold_us", "sustain_ms",
                                                                       "launch_hold", "self_syncing")},
                         "observed_rounds": len(t["observed_rounds"]),
                         "unspun": t.get("unspun") or [], "timed_device_s": t.get("timed_device_s"),
                         **({"stop": rule.record(t["block"])} if rule else {}),
                         "profiler_ms": ({k: [x / repeat for x in v] for k, v in observer.kernel_ms().items()}
                                         if use_device else {})}
        res["notes"].append(
            f"between timed rounds (never inside a measured launch): {seen['seconds']:.2f} s of input checksums, "
            f"output commitments, {seen['checked']} rounds' outputs handed to the referee and {sets.refreshes} "
            "input-content refreshes")
        # Re-check the port (and its peers) after the timed storm: a race shows up here, not in a single launch.
        for n in [port, *peers]:
            parity.poison(outs[n][0])
            again = _run_once(launches[n], sets.prepared[n][0], outs[n][0], sync)
            sets.check(n, 0, "post-timing check")
            token = rng.randrange(1, 2**62)
            commit = _commit(again)
            _hand_over(slot_dirs[n], token, again)
            client.ask({"op": "handed", "what": "post", "slot": n, "token": token, "commit": commit})
            del again

    for n in launches:
        _finish_gate(res["slots"][n], n, sets, observer, t, launches, port, refs, use_device,
                     graphs=bool(res.get("cuda_graph")), aa=task.get("aa_slot"), peers=peers)
    return res


def _commit(out: Any) -> Any:
    """What the session commits to for one output before the referee picks the round: the digest of
    its bytes, or why it cannot be handed over (not a plain tensor)."""
    from skillrun.execute import judge

    try:
        return list(integrity.output_digest(judge.plain(out)))
    except TypeError as exc:
        return f"refused: {exc}"[:500]


def _hand_over(folder: str, token: int, out: Any) -> None:
    from skillrun.execute import judge

    try:
        judge.write_output(folder, token, out, {})
    except TypeError as exc:
        judge.write_refusal(folder, token, str(exc), {})


def _names_gate(n: str, launches: dict, port: str, refs: list[str], dev_names: list[str], host_names: list[str],
                use_device: bool, peers: list[str] = ()) -> dict:
    """Slot n's kernel-name gate from what the profiler saw (device kernels on a GPU, host ops on a CPU).

    Peers (the tuner's candidates) run the port's own kernel with other configs: they and the port
    are checked against the references, the references against the port and every peer."""
    launch = launches[n]
    host_rx = (launch.describe or {}).get("expect_host_ops")
    vs = refs if (n == port or n in peers) else [port, *peers]

    def rx(k: str, device: bool) -> str | None:
        h = (launches[k].describe or {}).get("expect_host_ops")
        return launches[k].expect_kernels if device else (h or launches[k].expect_kernels)

    if use_device:
        gate = integrity.evaluate_names(n, rx(n, True), {k: rx(k, True) for k in vs}, dev_names, device=True)
        # A foreign host op is a red flag on a GPU too (e.g. the port calling aten::_scaled_mm).
        host_gate = integrity.evaluate_names(n, None, {k: (launches[k].describe or {}).get("expect_host_ops") for k in vs},
                                             host_names, device=False, own_required=False)
        if not host_gate["passed"]:
            gate["passed"] = False
            gate["reason"] = (gate.get("reason", "") + "; host: " + host_gate["reason"]).strip("; ")
        return gate
    return integrity.evaluate_names(n, rx(n, False), {k: rx(k, False) for k in vs}, host_names, device=False,
                                    own_required=bool(host_rx) or _is_host_kernel(launch))


def _finish_gate(slot: dict, n: str, sets: InputSets, observer: Any, t: dict | None, launches: dict,
                 port: str, refs: list[str], use_device: bool, graphs: bool, aa: str | None, peers: list[str] = ()) -> None:
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
            og = _names_gate(n, launches, port, refs, dev, host, use_device, peers)
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
            if rel is not None:
                obs["slowdown_vs_reference"] = round(rel, 4)
                if rel > OBSERVER_EFFECT_LIMIT:
                    problems.append(f"ran {obs['slowdown']:.2f}x slower when profiled than when not ({ref}: "
                                    f"{obs['slowdown'] / rel:.2f}x): it may run other code when not observed; "
                                    "time it with cuda_graph=True")
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


def _aa_copy(fn):
    import functools

    p = functools.partial(fn)
    p.aa_copy = True
    return p


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

    importlib.import_module(task["problem"])
    COST.mark("checks")
    from skillrun.execute import judge

    return judge.judge_task(task)


TASKS = {"candidate": candidate, "judge": _judge, "session": session, "probe": probe}


def main(argv: list[str]) -> int:
    task_path, result_path = argv[1], argv[2]
    task = json.loads(open(task_path).read())
    COST.reset()
    if isinstance(task.get("t_spawn"), (int, float)):  # a child of its own: the interpreter's start is this task's
        COST.add("process_start", max(0.0, time.time() - float(task["t_spawn"])))
    try:
        res = TASKS[task["kind"]](task)
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

    lifeline.die_with_parent()  # spawned by the harness: end with it, even after its SIGKILL
    sys.exit(main(sys.argv))
