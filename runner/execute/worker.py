"""The child side of the harness: one task per process (see isolate.py).

Tasks (JSON):
  candidate  build one kernel (port, baseline or alternative) and gate it on the oracle over seeds
  session    build the candidates that passed, check output aliasing and slot integrity with the
             profiler, and time them interleaved (GPU, or an injected timer)

Only torch, the problem/kernel modules and light skillrun modules are imported here (never
pydantic models), so the child runs on a device image that lacks the runner's extras.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from typing import Any

from skillrun.execute import integrity, parity, timing
from skillrun.execute.proxy import proxy_shape
from skillrun.refs import resolve, split_ref


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

    builder = resolve(ref)
    t0 = time.perf_counter()
    launch = builder(dict(shape), dict(config or {}), device)
    if not isinstance(launch, KernelLaunch):
        raise TypeError(f"{ref} returned {type(launch).__name__}, not a KernelLaunch (kernels/protocol.py)")
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


def candidate(task: dict) -> dict:
    from skillrun_kernels.protocol import UnsupportedShape

    _fp32_oracle_precision()
    device = task["device"]
    sync = _sync(device)
    problem = importlib.import_module(task["problem"])
    result: dict[str, Any] = {"status": "ok", "role": task["role"], "ref": task["ref"]}
    shape = dict(task["shape"])
    if task.get("proxy") is not None:
        kmod = importlib.import_module(split_ref(task["ref"])[0])
        shape, how = proxy_shape(shape, task.get("config") or {}, kmod, problem, task["proxy"].get("caps"))
        result["proxy_shape"], result["proxy_how"] = shape, how
    result["shape"] = shape
    for key, fn in (("flops", "flops"), ("min_bytes", "min_bytes")):
        result[key] = float(getattr(problem, fn)(shape))
        result[f"planned_{key}"] = float(getattr(problem, fn)(task["shape"]))
    tol = parity.tolerance_of(task.get("tolerance"))
    try:
        launch, build_s = _build(task["ref"], shape, task.get("config") or {}, device)
    except UnsupportedShape as exc:
        result.update(status="unsupported", parity={"passed": False, "supported": False, "error": f"unsupported shape: {exc}"})
        return result
    result.update(_describe(launch), build_s=round(build_s, 4))
    per_seed = []
    for seed in task["seeds"]:
        inputs = problem.make_inputs(shape, seed, device)
        ref = problem.oracle(inputs).float()
        try:
            prepared = launch.prepare(inputs)
            out = problem.output_like(shape, device)
            marker = parity.poison(out)
            t0 = time.perf_counter()
            res = _run_once(launch, prepared, out, sync)
            first_s = time.perf_counter() - t0
        except UnsupportedShape as exc:
            result.update(status="unsupported", parity={"passed": False, "supported": False, "error": f"unsupported shape: {exc}"})
            return result
        m = parity.compare(res, ref, tol)
        m.update(seed=seed, poison=marker, wrote_into_out=bool(res is out), run_s=round(first_s, 4))
        per_seed.append(m)
        del inputs, ref, prepared, out, res
    agg = parity.aggregate(per_seed)
    agg["supported"] = True
    result["parity"] = agg
    return result


def _storage_bytes(objs) -> int:
    seen, total = set(), 0
    for t in integrity.tensors_in(objs):
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def session(task: dict) -> dict:
    import torch

    _fp32_oracle_precision()
    device = task["device"]
    sync = _sync(device)
    use_device = device.startswith("cuda")
    problem = importlib.import_module(task["problem"])
    shape = dict(task["shape"])
    tcfg = task.get("timing") or {}
    res: dict[str, Any] = {"status": "ok", "slots": {}, "notes": []}
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

    # Input sets: one for the checks, more when rotating to keep operands out of L2.
    timer = timing.make_timer(tcfg.get("timer"), device)
    seed0 = int(task.get("seed", 12345))
    first = problem.make_inputs(shape, seed0, device)
    prepared0 = {n: launches[n].prepare(first) for n in launches}
    outs0 = {n: problem.output_like(shape, device) for n in launches}
    bytes_per_set = _storage_bytes([first, *prepared0.values(), *outs0.values()])
    n_sets, cold = 1, "n/a (not timed)"
    if timer is not None:
        if use_device:
            free, _total = torch.cuda.mem_get_info()
            budget = int(free * 0.5)
        else:
            budget = 1 << 30
        n_sets, cold = timing.rotation_sets(bytes_per_set, tcfg.get("l2_bytes"), tcfg.get("cold_l2", "rotate"),
                                            int(tcfg.get("max_sets", 32)), budget)
    res["bytes_per_set"], res["input_sets"], res["cold_l2"] = bytes_per_set, n_sets, cold

    # 1. aliasing: references first, then the port, on the same inputs.
    ref_outs = {}
    for n in refs:
        parity.poison(outs0[n])
        ref_outs[n] = _run_once(launches[n], prepared0[n], outs0[n], sync)
    parity.poison(outs0[port])
    port_out = _run_once(launches[port], prepared0[port], outs0[port], sync)
    others = {"inputs": first}
    for n in refs:
        others[f"{n} output"] = ref_outs[n]
        others[f"{n} operands"] = prepared0[n]
    res["aliasing"] = integrity.aliasing_gate(port_out, others)
    if peers:
        res["peer_aliasing"] = {}
        for n in peers:
            parity.poison(outs0[n])
            peer_out = _run_once(launches[n], prepared0[n], outs0[n], sync)
            res["peer_aliasing"][n] = integrity.aliasing_gate(peer_out, {**others, "port output": port_out})
            del peer_out
    del ref_outs, port_out

    # 2. which kernels ran: a profiled sample of each slot's launches (already warm).
    n_prof = int(task.get("profile_launches", 3))
    regex = {}
    for n, launch in launches.items():
        host_rx = (launch.describe or {}).get("expect_host_ops")
        regex[n] = {"device": launch.expect_kernels, "host": host_rx or launch.expect_kernels, "host_declared": bool(host_rx)}
    for n, launch in launches.items():
        fn = (lambda l=launch, p=prepared0[n], o=outs0[n]: l.run(p, o))
        try:
            dev_names, host_names = integrity.profile_names(fn, n_prof, use_device, sync)
        except Exception as exc:  # a profiler failure must not pass as "proven"
            res["slots"][n]["integrity"] = {"name": f"slot_integrity:{n}", "passed": False, "reason": f"profiler failed: {exc}"}
            continue
        vs = refs if (n == port or n in peers) else [port, *peers]
        if use_device:
            gate = integrity.evaluate_names(n, regex[n]["device"], {k: regex[k]["device"] for k in vs}, dev_names, device=True)
        else:
            gate = integrity.evaluate_names(n, regex[n]["host"], {k: regex[k]["host"] for k in vs}, host_names, device=False,
                                            own_required=regex[n]["host_declared"] or _is_host_kernel(launch))
        # A foreign host op is a red flag on a GPU too (e.g. the port calling aten::_scaled_mm).
        if use_device:
            host_gate = integrity.evaluate_names(n, None, {k: (launches[k].describe or {}).get("expect_host_ops") for k in vs},
                                                 host_names, device=False, own_required=False)
            if not host_gate["passed"]:
                gate["passed"] = False
                gate["reason"] = (gate.get("reason", "") + "; host: " + host_gate["reason"]).strip("; ")
        gate["launches_profiled"] = n_prof
        res["slots"][n]["integrity"] = gate

    # 3. timing, interleaved, with an A/A copy of the chosen reference.
    if timer is not None:
        sets = [first] + [problem.make_inputs(shape, seed0 + i, device) for i in range(1, n_sets)]
        prepared = {n: [prepared0[n]] + [launches[n].prepare(x) for x in sets[1:]] for n in launches}
        outs = {n: [outs0[n]] + [problem.output_like(shape, device) for _ in sets[1:]] for n in launches}
        fns = {n: [(lambda l=launches[n], p=p, o=o: l.run(p, o)) for p, o in zip(prepared[n], outs[n])] for n in launches}
        graphs = {}
        if tcfg.get("cuda_graph") and use_device:
            try:
                for n in launches:
                    gl = []
                    for f in fns[n]:
                        f()  # warm on the side of capture (Triton JIT, cuBLAS handles)
                        sync()
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g):
                            f()
                        gl.append(g.replay)
                    graphs[n] = gl
                fns = graphs
                res["cuda_graph"] = True
            except Exception as exc:
                res["cuda_graph"] = False
                res["notes"].append(f"CUDA graph capture failed ({str(exc)[:200]}); timed eager launches")
        else:
            res["cuda_graph"] = False
        aa = task.get("aa_slot")
        if aa in fns:
            fns[f"{aa}#aa"] = fns[aa]
        between = None
        if tcfg.get("cold_l2") == "flush" and tcfg.get("l2_bytes") and use_device:
            flush = torch.empty(2 * int(tcfg["l2_bytes"]), dtype=torch.uint8, device=device)
            between = flush.zero_
        t = timing.interleave(fns, timer, int(tcfg.get("rounds", 100)), int(tcfg.get("warmup", 10)), between,
                              tcfg.get("max_seconds"))
        res["timing"] = {"method": timer.method, **t}
        # Re-check the port after the timed storm: a race shows up here, not in a single launch.
        parity.poison(outs[port][0])
        again = _run_once(launches[port], prepared[port][0], outs[port][0], sync)
        want = problem.oracle(first).float()
        res["post_timing_parity"] = parity.compare(again, want, parity.tolerance_of(task.get("tolerance")))
        if peers:
            res["post_timing_parity_peers"] = {}
            for n in peers:
                parity.poison(outs[n][0])
                again = _run_once(launches[n], prepared[n][0], outs[n][0], sync)
                res["post_timing_parity_peers"][n] = parity.compare(again, want, parity.tolerance_of(task.get("tolerance")))
    return res


def _is_host_kernel(launch) -> bool:
    """A torch-on-host kernel (no device kernels exist): its expect regex names host ops."""
    return (launch.describe or {}).get("backend") in ("torch", "cpu")


TASKS = {"candidate": candidate, "session": session}


def main(argv: list[str]) -> int:
    task_path, result_path = argv[1], argv[2]
    task = json.loads(open(task_path).read())
    try:
        res = TASKS[task["kind"]](task)
    except Exception as exc:  # reported as this row's error; the parent carries on
        res = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000],
               "traceback": traceback.format_exc()[-4000:]}
    tmp = result_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(_jsonable(res), fh, allow_nan=True)
    os.replace(tmp, result_path)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
