"""One side of a timed session, in its own sandboxed child: the accused's (the port and its peers) or
the references' (baselines, alternatives, the A/A copy, the canary). The parent (session.py) holds the
clock and drives every step over a Unix socket; this process only does what it is told:

  build          import and build its slots (the harness's functions are recorded first: guard.py)
  init/add_set   input sets from the seeds the parent's referee drew (input_sets.py); one copy per slot
  first          each slot once on set 0 (poisoned output), then the aliasing gate (accused only)
  profile        a profiled sample of one slot's launches (kernel names)
  graph_probe /  CUDA graphs: one event-timed call per slot, then capture with the parent's repeat
  capture
  run            untimed launches (warm-up, the sustained load before a round)
  launch         one timed launch with this process's timer (events behind a hold on a GPU); the reply
                 carries the time it measured, the commitment to the output (its SHA-256, computed
                 with torch functions and Python dispatch off) and the output contract's check; the
                 parent bounds the time by its own clock
  between        after a round: the input checksums, the outputs handed over if the referee chose
                 the round (its token), and the guard's checks (modes, threads, replaced functions)
  refresh        new content for one input set, as the referee planned it
  post           the accused's post-timing check
  canary         the references' canary: a fixed workload of known cost
  finish         what the checks saw, then the process ends

Nothing here decides: the parent judges the replies, the referee the outputs. A reply is this
process's word, and for the accused's process the port's word (it can rewrite anything here).
"""
from __future__ import annotations

import importlib
import json
import os
import socket
import time
import traceback
from typing import Any

from skillrun.execute import guard, integrity, judge, parity, referee, timing
from skillrun.execute.input_sets import InputSets

LINE_MAX = 8 << 20
CANARY_N = {"cpu": 192, "cuda": 2048}


class _Pushed:
    """Input content as the parent pushed it (the referee's seeds and plans): InputSets' source."""

    def __init__(self, decoy: int) -> None:
        self._decoy, self.seeds, self.plans = int(decoy), [], []

    def decoy(self) -> int:
        return self._decoy

    def new_set(self, j: int) -> int:
        return int(self.seeds.pop(0))

    def refresh(self, j: int, master: dict) -> dict:
        return self.plans.pop(0)


class Server:
    def __init__(self, task: dict) -> None:
        from skillrun.execute.launch import _sync

        self.task = task
        self.device = task["device"]
        self.sync = _sync(self.device)
        self.use_device = self.device.startswith("cuda")
        self.shape = dict(task["shape"])
        self.accused_role = task["role"] == "accused"
        self.port, self.peers = task["port_slot"], list(task.get("peers") or [])
        self.specs = {s["slot"]: s for s in task["slots"]}
        self.aa = task.get("aa_slot") if task.get("aa_slot") in self.specs else None
        self.tcfg = task.get("timing") or {}
        self.timer = timing.make_timer(self.tcfg.get("timer"), self.device) if self.tcfg.get("timer") else None
        # Each launch a round of its own behind its own hold, one timer per slot (timing.LaunchTimers).
        self.timers = timing.LaunchTimers.like(self.timer) if self.timer is not None else None
        self.handover = {n: os.path.join(task["handover"], f"s{i}") for n, i in task["slot_index"].items()}
        self.launches: dict[str, Any] = {}
        self.holder: dict[str, Any] = {}
        self.fns: dict[str, list] = {}
        self.sets: InputSets | None = None
        self.outs: dict[str, list] = {}
        self.guard: guard.Guard | None = None
        self.flush = None
        self.repeat = 1
        self.graphs = False
        self.canary_fn = None
        self.contract: dict | None = None
        self.observer = integrity.RoundObserver(self.use_device)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(task["conductor"])
        self.reader = self.sock.makefile("rb")
        self._send({"hello": task["token"], "pid": os.getpid()})

    # -- wire ---------------------------------------------------------------------------------

    def _send(self, msg: dict) -> None:
        self.sock.sendall(json.dumps(msg, allow_nan=True).encode() + b"\n")

    def serve(self) -> dict:
        idle = float(self.task.get("idle_s", 900))
        self.sock.settimeout(idle)  # a parent that stopped talking: this process ends on its own
        while True:
            try:
                line = self.reader.readline(LINE_MAX)
            except (OSError, socket.timeout):
                return {"status": "error", "error": f"the parent sent nothing for {idle:g} s"}
            if not line:
                return {"status": "error", "error": "the parent closed the session"}
            msg = json.loads(line)
            try:
                ans = self.handle(msg)
            except Exception as exc:  # noqa: BLE001 - this step's error, reported to the parent
                ans = {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-3000:]}
            self._send(ans)
            if msg.get("op") == "finish":
                return {"status": "ok"}

    def handle(self, msg: dict) -> dict:
        op = msg.get("op")
        fn = getattr(self, f"op_{op}", None)
        if fn is None:
            raise ValueError(f"unknown request {str(op)[:40]!r}")
        return fn(msg)

    # -- building -------------------------------------------------------------------------------

    def op_build(self, msg: dict) -> dict:
        from skillrun.execute.launch import _build, _describe, _fp32_oracle_precision

        _fp32_oracle_precision()
        self.problem = importlib.import_module(self.task["problem"])
        self.contract = referee.output_contract(self.problem, self.shape, self.device)
        # What the harness's functions, modes and threads were before any kernel module was imported in this
        # process: now, in a child of its own; when it started, in a card's long-lived server (sessions.py).
        self.guard = guard.baseline()
        out = {}
        for n, s in self.specs.items():
            launch, build_s = _build(s["ref"], self.shape, s.get("config") or {}, self.device)
            self.launches[n] = launch
            out[n] = {**_describe(launch), "build_s": round(build_s, 4), "ref": s["ref"]}
        method = getattr(self.timer, "method", None)
        return {"slots": out, "timer": {"method": method, "hold": bool(getattr(self.timer, "hold", False)),
                                        "sustain_ms": float(getattr(self.timer, "sustain_ms", 0.0) or 0.0)}}

    def op_init(self, msg: dict) -> dict:
        from skillrun.execute.launch import _storage_bytes

        self.source = _Pushed(msg["decoy"])
        self.source.seeds.append(int(msg["seed"]))
        blind = {self.port, *self.peers} & set(self.launches) if self.accused_role else set()
        self.sets = InputSets(self.problem, self.task["problem"], self.shape, self.device, self.launches, 1,
                              in_place=bool(msg.get("in_place")), blind=blind, source=self.source)
        self.outs = {n: [self.problem.output_like(self.shape, self.device)] for n in self.launches}
        self.sets.rerun = lambda n, j: self._run_once(n, j)
        nbytes = _storage_bytes([self.sets.master[0], *(self.sets.copies[n][0] for n in self.launches),
                                 *(self.sets.prepared[n][0] for n in self.launches), *(self.outs[n][0] for n in self.launches)])
        return {"bytes_per_set": nbytes}

    def op_add_set(self, msg: dict) -> dict:
        self.source.seeds.append(int(msg["seed"]))
        self.sets.add_set()
        for n in self.launches:
            self.outs[n].append(self.problem.output_like(self.shape, self.device))
        return {}

    def _run_once(self, n: str, j: int) -> Any:
        from skillrun.execute.launch import _run_once

        return _run_once(self.launches[n], self.sets.prepared[n][j], self.outs[n][j], self.sync)

    def op_first(self, msg: dict) -> dict:
        """Each slot once on set 0 (references first), checked; the accused's outputs' aliasing gates."""
        outs = {}
        order = [n for n in self.launches if n != self.port and n not in self.peers] + \
                [n for n in [self.port, *self.peers] if n in self.launches]
        for n in order:
            parity.poison(self.outs[n][0])
            outs[n] = self._run_once(n, 0)
            self.sets.check(n, 0, "output-aliasing call")
        res: dict[str, Any] = {}
        if self.accused_role:
            res.update(self._aliasing(outs))
        del outs
        res["guard"] = self.guard.check()
        return res

    def _aliasing(self, outs: dict) -> dict:
        res: dict[str, Any] = {}
        with guard.harness():
            others: dict[str, Any] = {"inputs": [self.sets.copies[n][0] for n in self.launches]}
            for n in self.launches:
                others[f"{n} operands"] = self.sets.prepared[n][0]
            res["aliasing"] = integrity.aliasing_gate(outs[self.port], others) if self.port in outs else None
            res["peer_aliasing"] = {n: integrity.aliasing_gate(outs[n], {**others, "port output": outs[self.port]})
                                    for n in self.peers if n in outs}
        return res

    def op_profile(self, msg: dict) -> dict:
        n = msg["slot"]
        launch = self.launches[n]
        fn = (lambda: launch.run(self.sets.prepared[n][0], self.outs[n][0]))
        try:
            dev, host = integrity.profile_names(fn, int(msg.get("launches", 3)), self.use_device, self.sync)
        except Exception as exc:  # noqa: BLE001 - a profiler failure must not pass as "proven"
            return {"error_profiler": f"profiler failed: {exc}"[:500]}
        finally:
            self.sets.check(n, 0, "profiled launches")
        return {"device": dev[:2000], "host": host[:2000]}

    # -- timing ---------------------------------------------------------------------------------

    def op_timing(self, msg: dict) -> dict:
        """Sets added, callables built; CUDA graphs need graph_probe + capture next."""
        self.guard.settle()  # every slot has run and been profiled: the threads present now are the harness's
        holder = self.holder

        def call(n: str, j: int):
            launch, out = self.launches[n], self.outs[n][j]

            def fn():
                r = launch.run(self.sets.prepared[n][j], out)
                holder[n] = out if r is None else r
            return fn

        self.fns = {n: [call(n, j) for j in range(self.sets.n_sets)] for n in self.launches}
        if msg.get("eager"):  # a capture failed on one side: eager launches on both, prepare's operands rebound
            self.repeat, self.graphs, self.sets.in_place = 1, False, False
        if self.tcfg.get("cold_l2") == "flush" and self.tcfg.get("l2_bytes") and self.use_device:
            import torch

            self.flush = torch.empty(2 * int(self.tcfg["l2_bytes"]), dtype=torch.uint8, device=self.device).zero_
        return {}

    def op_graph_probe(self, msg: dict) -> dict:
        import torch

        ms = {}
        for n in self.launches:
            for j, f in enumerate(self.fns[n]):
                f()  # warm on the side of capture (Triton JIT, cuBLAS handles)
                self.sync()
                self.sets.check(n, j, "graph warm-up call")
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            self.fns[n][0]()
            b.record()
            torch.cuda.synchronize()
            ms[n] = a.elapsed_time(b)
        return {"ms": ms}

    def op_capture(self, msg: dict) -> dict:
        import torch

        repeat, n_sets = int(msg["repeat"]), self.sets.n_sets
        try:
            graphs = {}
            for n in self.launches:
                gl = []
                for j in range(n_sets):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        for k in range(repeat):
                            self.fns[n][(j + k) % n_sets]()
                    cap = self.holder[n]  # a replay rewrites the tensor the last captured call returned

                    def replay(g=g, n=n, cap=cap):
                        g.replay()
                        self.holder[n] = cap
                    gl.append(replay)
                graphs[n] = gl
        except Exception as exc:  # noqa: BLE001 - eager launches then, said in the notes
            return {"captured": False, "error": str(exc)[:300]}
        self.fns, self.repeat, self.graphs = graphs, repeat, True
        self.sets.in_place = True
        return {"captured": True}

    def _fn(self, slot: str, j: int):
        if slot == "canary":
            return self.canary_fn
        if slot.endswith("#aa"):
            from skillrun.execute.launch import _aa_copy

            return _aa_copy(self.fns[slot[:-3]][j])
        return self.fns[slot][j]

    def op_run(self, msg: dict) -> dict:
        for slot, j in msg["calls"]:
            self._fn(slot, int(j))()
        self.sync()
        return {}

    def op_launch(self, msg: dict) -> dict:
        return self.launch(msg)

    def launch(self, msg: dict) -> dict:
        """One timed launch (held on its own on a GPU), then the commitment to its output."""
        slot, j, observe = msg["slot"], int(msg["set"]), bool(msg.get("observe"))
        fn = self._fn(slot, j)
        if self.flush is not None:
            self.flush()
        if observe:
            self.observer.round = int(msg.get("index", -1))
            ms, info = self.timers.launch(slot, fn, observe=self.observer(slot))
        else:
            ms, info = self.timers.launch(slot, fn)
        reply: dict[str, Any] = {"ms": ms, "held": info.get("held"), "clock_mhz": info.get("clock_mhz"),
                                 "hold_us": info.get("hold_us"), "launch_hold": info["launch_hold"],
                                 "self_synced": info["self_synced"], "unspun": info["unspun"]}
        if slot != "canary":
            reply.update(self.commit(slot[:-3] if slot.endswith("#aa") else slot))
        if observe:
            rec = (self.observer.seen.get(slot) or [(None, [], [])])[-1]
            reply["names"] = {"device": rec[1][:500], "host": rec[2][:500]}
            if self.use_device and self.observer.kernel_us.get(slot):
                reply["kernel_us"] = self.observer.kernel_us[slot][-1]
            if slot in self.observer.errors:
                reply["observer_error"] = self.observer.errors[slot]
        return reply

    def commit(self, n: str) -> dict:
        """The commitment to slot n's latest output and the output contract's check (every round)."""
        out = self.holder.get(n)
        breach = None
        with guard.harness():  # from the first look at the output on: no mode the port pushed runs here
            try:
                judge.plain(out)
            except TypeError as exc:
                return {"commit": f"refused: {exc}"[:500], "contract": str(exc)[:300]}
            breach = referee.contract_breach(out, self.contract, strides=True)
            if breach is None and out.device.type != str(self.device).split(":")[0]:
                breach = f"device {out.device}, the problem's output is on {self.device}"
            if breach is None:
                # Its own memory: not an input, an operand, or another slot's output of this process.
                others: dict[str, Any] = {"inputs": [c[j] for c in self.sets.copies.values() for j in range(len(c))],
                                          "operands": [p for ps in self.sets.prepared.values() for p in ps]}
                others.update({f"{k} output": v for k, v in self.holder.items() if k != n and v is not None})
                gate = integrity.aliasing_gate(out, others)
                if not gate["passed"]:
                    breach = gate["reason"]
            digest = integrity.output_digest(out)
        return {"commit": digest, "contract": breach}

    def op_between(self, msg: dict) -> dict:
        j, kind, token = int(msg["set"]), msg.get("kind"), msg.get("token")
        foreign = []
        for n in self.launches:
            before = len(self.sets.tampered[n])
            self.sets.check(n, j, f"{kind} round {msg.get('index')}")
            if len(self.sets.tampered[n]) > before:
                foreign.append(n)
        if token is not None:
            for n in self.launches:
                if n not in foreign:
                    self._hand_over(n, int(token), self.holder.get(n))
        return {"foreign": foreign, "guard": self.guard.check()}

    def _hand_over(self, n: str, token: int, out: Any) -> None:
        try:
            with guard.harness():
                judge.write_output(self.handover[n], token, out, {})
        except TypeError as exc:
            judge.write_refusal(self.handover[n], token, str(exc), {})

    def op_refresh(self, msg: dict) -> dict:
        self.source.plans.append(msg["plan"])
        self.sets.refresh(int(msg["set"]))
        self.sync()
        return {}

    def op_post(self, msg: dict) -> dict:
        """The accused re-run once each after the timed storm (a race shows here), handed over."""
        commits = {}
        for n in [self.port, *self.peers]:
            if n not in self.launches:
                continue
            parity.poison(self.outs[n][0])
            self.holder[n] = self._run_once(n, 0)
            self.sets.check(n, 0, "post-timing check")
            c = self.commit(n)
            self._hand_over(n, int(msg["tokens"][n]), self.holder[n])
            commits[n] = c
        return {"commits": commits, "guard": self.guard.check()}

    def op_canary(self, msg: dict) -> dict:
        """The canary's workload, built once (not the problem's: its cost must not depend on it)."""
        if self.canary_fn is None:
            self.canary_fn = canary_workload(self.device)
        ms = []
        for _ in range(int(msg.get("count", 0))):
            ms.append(self.launch({"slot": "canary", "set": 0})["ms"])
        return {"ms": ms}

    def op_finish(self, msg: dict) -> dict:
        out = {}
        for n in self.launches:
            out[n] = {"checks": self.sets.checks[n] if self.sets else 0,
                      "mutations": list(self.sets.mutations[n]) if self.sets else [],
                      "tampered": list(self.sets.tampered[n]) if self.sets else []}
        return {"slots": out, "guard": self.guard.check() if self.guard else []}


def canary_workload(device: str):
    """The canary: a fixed matrix product of a size per device kind, whatever the problem."""
    import torch

    size = CANARY_N["cuda" if str(device).startswith("cuda") else "cpu"]
    g = torch.Generator(device=device).manual_seed(7)
    a = torch.randn(size, size, generator=g, device=device)
    b = torch.randn(size, size, generator=g, device=device)
    c = torch.empty(size, size, device=device)
    reps = 4

    def canary():
        for _ in range(reps):
            torch.mm(a, b, out=c)
    return canary


def calibrate_canary(timer: str, device: str, count: int) -> list[float]:
    """The canary's cost, timed as a session times it (each launch a round of its own): what a card's references'
    server measures when it starts (serve.py), before the card's port process exists."""
    timers = timing.LaunchTimers.like(timing.make_timer(timer, device))
    fn = canary_workload(device)
    fn()  # warm (the library's first call)
    return [timers.launch("canary", fn)[0] for _ in range(count)]


def serve(task: dict) -> dict:
    """The task kind ``slots`` (worker.TASKS): connect to the parent before any kernel is imported, serve."""
    t0 = time.perf_counter()
    server = Server(task)
    try:
        res = server.serve()
    finally:
        try:
            server.sock.close()
        except OSError:
            pass
    res["wall_s"] = round(time.perf_counter() - t0, 3)
    return res
