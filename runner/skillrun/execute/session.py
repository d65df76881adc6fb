"""The timed session, driven by the parent: the judge holds the clock.

A port is untrusted code, and whatever shares its process can be rewritten by it: the clock
(``time.perf_counter``), the references' functions (``torch.mm``), their output buffers, the GIL
while a reference runs. So the session runs in two sandboxed children (slot_server.py) and the
parent, which never imports a kernel module, drives every step:

  accused     the port and its peers (the tuner's candidates)
  references  the baseline, the alternatives, the A/A copy and the **canary**, a fixed workload
              whose cost is measured before the port is imported; a process that never imports a port

The parent runs the one timing engine (timing.interleave: warm-up, balanced positions, profiled
rounds, sustained load) over *remote* slots: each launch is a request to the slot's process, which
times it with its own timer (events behind a hold on a GPU) and replies with the time, the SHA-256
commitment to the output and the output contract's check. The parent

* **bounds every sample by its own clock**: a claimed time above the parent's wall time around the
  request is impossible and fails the claimant; the accused's wall-minus-claim must match the
  references' (the same request, hand-over and commitment work) within ``max(claim, CLAIM_FLOOR_MS)``,
  so a port whose timer reads fast, or which computes after its timed interval and before its
  commitment, is caught by the time the parent saw;
* **freezes the accused while a reference runs** (SIGSTOP to every process of its sandbox, SIGCONT
  after): no thread of the port can contend with a reference, hold the GIL or write its buffers;
  what the port may have queued on a device before it was frozen shows in the canary;
* **checks the canary** each round: slower than its cost before the port was imported by more than
  ``CANARY_LIMIT``, the references were contended and the comparison is refused;
* decides nothing about correctness itself: the referee (referee.py) draws the content and which
  rounds are checked, and judges the outputs handed over against the commitments.

Every wait is bounded: the children connect within the session's timeout, each request has a
deadline (a launch: the launch deadline), and a child that does not answer is killed.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import select
import signal
import socket
import struct
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from skillrun.execute import confidence, timing
from skillrun.execute import referee as referee_mod
from skillrun.execute.cost import PhaseClock

CLAIM_FLOOR_MS = 1.0
CANARY_CALIBRATION = 9
CANARY_LIMIT = 2.0
LAUNCH_DEADLINE_S = 120.0
_LINE_MAX = 8 << 20


class SessionError(RuntimeError):
    """A child broke the session (an error, no answer in time, a closed connection)."""


# ------------------------------------------------------------------------------------------------
# the children


class Child:
    """One connected slot process: requests answered in turn, each within a deadline."""

    def __init__(self, role: str, conn: socket.socket, pid: int | None) -> None:
        self.role, self.conn, self.pid = role, conn, pid
        self.buf = b""
        self.dead = False

    def send(self, msg: dict) -> None:
        try:
            self.conn.sendall(json.dumps(msg).encode() + b"\n")
        except OSError as exc:
            raise SessionError(f"the {self.role}' process is gone ({exc})") from None

    def recv(self, deadline_s: float, what: str) -> dict:
        end = time.monotonic() + deadline_s
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                self.kill()
                raise SessionError(f"the {self.role}' process did not answer {what} within {deadline_s:g} s; it was killed")
            ready, _, _ = select.select([self.conn], [], [], min(left, 1.0))
            if not ready:
                continue
            try:
                chunk = self.conn.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                raise SessionError(f"the {self.role}' process ended during {what}")
            self.buf += chunk
            if len(self.buf) > _LINE_MAX:
                self.kill()
                raise SessionError(f"the {self.role}' process sent more than {_LINE_MAX} bytes in one answer")
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            ans = json.loads(line)
        except ValueError:
            self.kill()
            raise SessionError(f"the {self.role}' process sent an unreadable answer to {what}") from None
        if not isinstance(ans, dict):
            raise SessionError(f"the {self.role}' process sent a non-object answer to {what}")
        if ans.get("error"):
            raise SessionError(f"{self.role}: {str(ans['error'])[:1500]}" + (f" | {str(ans.get('traceback'))[-600:]}"
                                                                              if ans.get("traceback") else ""))
        return ans

    def request(self, msg: dict, deadline_s: float) -> dict:
        self.send(msg)
        return self.recv(deadline_s, f"{msg.get('op')!r}")

    def kill(self) -> None:
        """The process and, in its sandbox, everything it started (its PID namespace dies with it)."""
        if self.pid and not self.dead:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        self.dead = True

    def close(self) -> None:
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()


def both(children: list[Child], msg: Callable[[Child], dict | None], deadline_s: float) -> dict[str, dict]:
    """The same step on every child at once (each does its own work in parallel); answers by role."""
    sent = []
    for c in children:
        m = msg(c)
        if m is not None:
            c.send(m)
            sent.append((c, m))
    return {c.role: c.recv(deadline_s, repr(m.get("op"))) for c, m in sent}


def _peer_pid(conn: socket.socket) -> int | None:
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", raw)[0]) or None
    except (OSError, AttributeError):
        return None


class Listener:
    """One listening socket per side, with a secret token: the first connection that says it wins."""

    def __init__(self, folder: Path, role: str) -> None:
        self.role = role
        self.path = str(folder / f"{role[0]}.sock")
        if len(self.path.encode()) > 100:  # a Unix socket's path is limited to ~108 bytes
            raise ValueError(f"the temporary folder's path is too long for a Unix socket ({self.path}); set TMPDIR shorter")
        self.token = secrets.token_hex(16)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(4)

    def accept(self, deadline_s: float, alive: Callable[[], bool]) -> Child:
        end = time.monotonic() + deadline_s
        try:
            while time.monotonic() < end:
                if not alive():
                    raise SessionError(f"the {self.role}' process ended before it connected")
                ready, _, _ = select.select([self.sock], [], [], 0.2)
                if not ready:
                    continue
                conn, _ = self.sock.accept()
                child = Child(self.role, conn, _peer_pid(conn))
                try:
                    hello = child.recv(30.0, "hello")
                except SessionError:
                    conn.close()
                    continue
                if hello.get("hello") == self.token:
                    return child
                conn.close()  # someone else's connection (a port guessing at the other side's socket)
            raise SessionError(f"the {self.role}' process did not connect within {deadline_s:g} s")
        finally:
            self.sock.close()


# ------------------------------------------------------------------------------------------------
# freezing the accused while a reference runs


class Freezer:
    """SIGSTOP / SIGCONT for every process of the accused's sandbox: its PID namespace when it has one,
    else the process and its descendants."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.frozen: list[int] = []
        self.ns = _ns(pid) if pid else None
        self.own_ns = _ns(os.getpid())
        self.count = 0
        self.slow = 0

    def members(self) -> list[int]:
        """Every process of the accused's sandbox: the descendants of its PID namespace's init (orphans
        are reparented to it) when it has its own namespace, else of the process itself."""
        if not self.pid:
            return []
        root = self.pid
        if self.ns and self.ns != self.own_ns:
            init = _ppid(self.pid)
            if init and _ns(init) != self.own_ns:
                root = init
        out, todo = [], [root]
        while todo:
            p = todo.pop()
            if p != root or root == self.pid:
                out.append(p)
            kids = _children(p)
            if kids is None:  # no /proc/<pid>/task/*/children here: a full scan
                return [d for d in _all_pids() if d == self.pid or _descends(d, root)]
            todo.extend(kids)
        return out

    def freeze(self) -> None:
        if not self.pid:
            return
        stopped: set[int] = set()
        for _ in range(4):  # until no new member appears
            new = [p for p in self.members() if p not in stopped]
            if not new:
                break
            for p in new:
                try:
                    os.kill(p, signal.SIGSTOP)
                    stopped.add(p)
                except OSError:
                    pass
        self.frozen = sorted(stopped)
        self.count += 1
        # Wait until every thread of every member has stopped (a signal is delivered asynchronously).
        end = time.monotonic() + 0.5
        while time.monotonic() < end and not all(_stopped(p) for p in self.frozen):
            time.sleep(0.0002)
        if time.monotonic() >= end:
            self.slow += 1

    def thaw(self) -> None:
        for p in self.frozen:
            try:
                os.kill(p, signal.SIGCONT)
            except OSError:
                pass
        self.frozen = []


def _ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _children(pid: int) -> list[int] | None:
    try:
        out = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out.extend(int(x) for x in fh.read().split())
        return out
    except FileNotFoundError:
        return [] if not os.path.exists(f"/proc/{pid}") else None
    except (OSError, ValueError):
        return []


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _descends(pid: int, root: int) -> bool:
    for _ in range(64):
        if pid == root:
            return True
        pp = _ppid(pid)
        if not pp or pp == pid:
            return False
        pid = pp
    return False


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _stopped(pid: int) -> bool:
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
            if state not in (b"T", b"t", b"Z", b"X"):
                return False
    except (OSError, IndexError):
        return True  # gone
    return True


# ------------------------------------------------------------------------------------------------
# the clock


class RemoteCall:
    """One slot on one input set, launched in its process; called plainly it is an untimed launch."""

    def __init__(self, clock: "ParentClock", slot: str, j: int) -> None:
        self.clock, self.slot, self.j = clock, slot, j

    def __call__(self) -> None:
        self.clock.queue.append((self.slot, self.j))


class ParentClock:
    """The timing engine's timer, in the parent: each measurement is a request to the slot's process,
    bounded by the parent's clock (see the module doc)."""

    def __init__(self, session: "Session", method: str, hold: bool, sustain_ms: float) -> None:
        self.s = session
        self.method = (f"{method}; each launch timed in its slot's own process (the port's apart from the "
                       "references'), started by the parent and bounded by the parent's clock")
        self.hold = hold
        self.sustain_ms = sustain_ms
        self.hold_us: float | None = None
        # Each launch is a round of its own in its process, behind its own hold on a GPU, with a timer of its
        # slot's own (timing.LaunchTimers): ``launch_hold`` says a slot's timer went to the engine's
        # per-launch mode (a launch that synchronizes inside itself), ``unspun`` which slots then lost
        # their spin altogether.
        self.launch_hold = False
        self.unspun: set[str] = set()
        self.queue: list[tuple[str, int]] = []
        self.observing: str | None = None
        self.round: list[dict] = []

    def _flush(self) -> None:
        """Untimed launches (warm-up, the sustained load before a round): one request per process, each
        process's calls in their order (the load is about the device's power state, not the interleave)."""
        q, self.queue = self.queue, []
        by: dict[str, list[tuple[str, int]]] = {}
        for call in q:
            by.setdefault(self.s.child_of(call[0]).role, []).append(call)
        for role, calls in by.items():
            self.s.untimed(self.s.children[role], calls)

    def begin_round(self, lead: bool = True, load: Callable[[], Any] | None = None) -> None:
        if load is not None:
            load()
        self._flush()

    def begin_round_observed(self) -> None:
        self._flush()

    def measure(self, fn: RemoteCall) -> Callable[[], float]:
        self._flush()
        rec = self.s.timed(fn.slot, fn.j, observe=self.observing == fn.slot)
        self.round.append(rec)
        if rec.get("hold_us"):
            self.hold_us = max(self.hold_us or 0.0, float(rec["hold_us"]))
        self.launch_hold = self.launch_hold or rec["launch_hold"]
        if rec["unspun"]:
            self.unspun.add(fn.slot)
        return lambda: rec["sample"]

    def end_round(self) -> dict[str, Any]:
        self._flush()
        recs, self.round = self.round, []
        helds = [r.get("held") for r in recs if r.get("held") is not None]
        clocks = [r["clock_mhz"] for r in recs if isinstance(r.get("clock_mhz"), (int, float))]
        out = {"held": all(helds) if helds else None, "queue_us": None,
               "clock_mhz": sorted(clocks)[len(clocks) // 2] if clocks else None}
        if any(r["launch_hold"] for r in recs):
            # per launch, as the engine counts a slot that synchronizes inside its launch (hold.self_syncing)
            out["launch_held"] = [not r["self_synced"] for r in recs]
        return out

    def sync(self) -> None:
        self._flush()


class RemoteObserver:
    """The timing engine's observer, in the parent: the next launch of the slot is profiled in its
    process; what it saw comes back with the reply (the interface of integrity.RoundObserver)."""

    def __init__(self, clock: ParentClock, use_device: bool) -> None:
        self.clock, self.use_device = clock, use_device
        self.seen: dict[str, list[tuple[int, list[str], list[str]]]] = {}
        self.errors: dict[str, str] = {}
        self.kernel_us: dict[str, list[float]] = {}
        self.round = -1

    def __call__(self, slot: str) -> Any:
        from contextlib import contextmanager

        @contextmanager
        def ctx():
            self.clock.observing = slot
            try:
                yield
            finally:
                self.clock.observing = None
        return ctx()

    def add(self, slot: str, rep: dict) -> None:
        names = rep.get("names") or {}
        self.seen.setdefault(slot, []).append((self.round, list(names.get("device") or []), list(names.get("host") or [])))
        if rep.get("observer_error"):
            self.errors.setdefault(slot, str(rep["observer_error"])[:300])
        if rep.get("kernel_us") is not None:
            self.kernel_us.setdefault(slot, []).append(float(rep["kernel_us"]))

    def kernel_ms(self) -> dict[str, list[float]]:
        return {k: [round(v / 1e3, 6) for v in vs] for k, vs in self.kernel_us.items()}

    def names(self, slot: str) -> tuple[list[str], list[str], list[int]]:
        rec = self.seen.get(slot, [])
        return ([n for _, d, _ in rec for n in d], [n for _, _, h in rec for n in h], [r for r, _, _ in rec])


# ------------------------------------------------------------------------------------------------
# the session


class Session:
    def __init__(self, task: dict, ref: referee_mod.Referee, folder: Path, timeout_s: float) -> None:
        self.task, self.ref, self.folder = task, ref, folder
        self.end = time.monotonic() + timeout_s
        self.port = task["port_slot"]
        self.peers = [s["slot"] for s in task["slots"] if s["slot"] in (task.get("peers") or []) and s["slot"] != self.port]
        self.accused = [self.port, *self.peers]
        self.refs = [s["slot"] for s in task["slots"] if s["slot"] not in self.accused]
        self.aa = task.get("aa_slot") if task.get("aa_slot") in {s["slot"] for s in task["slots"]} else None
        tcfg = task.get("timing") or {}
        self.launch_deadline = float((task.get("watchdog") or {}).get("deadline_s") or tcfg.get("launch_deadline_s")
                                     or LAUNCH_DEADLINE_S)
        self.children: dict[str, Child] = {}
        self.freezer = Freezer(None)
        self.bounds: dict[str, list[tuple[float, float]]] = {}
        self.contract: dict[str, list[str]] = {}
        self.guard: dict[str, list[str]] = {}
        self.commits: dict[str, str] = {}
        self.impossible: dict[str, int] = {}
        self.observer: RemoteObserver | None = None
        self.use_device = str(task["device"]).startswith("cuda")
        self.canary_ms: list[float] | None = None  # the canary's cost taken when the references' server started
        # Where the session's wall time goes, by phase (cost.py), as this process sees it: the children's
        # start, their builds, the input sets, the checks, warm-up and rounds (timing.interleave's phase_s).
        self.cost = PhaseClock()

    def left(self) -> float:
        return max(1.0, self.end - time.monotonic())

    def child_of(self, slot: str) -> Child:
        base = slot[:-3] if slot.endswith("#aa") else slot
        return self.children["accused" if base in self.accused else "references"]

    def untimed(self, child: Child, calls: list[tuple[str, int]]) -> None:
        frozen = child.role == "references" and self._freeze()
        try:
            child.request({"op": "run", "calls": [[n, j] for n, j in calls]}, self.launch_deadline * max(1, len(calls)))
        finally:
            if frozen:
                self.freezer.thaw()

    def _freeze(self) -> bool:
        if "accused" in self.children and self.freezer.pid:
            self.freezer.freeze()
            return True
        return False

    def timed(self, slot: str, j: int, observe: bool = False) -> dict:
        child = self.child_of(slot)
        frozen = child.role == "references" and self._freeze()
        try:
            t0 = time.perf_counter()
            rep = child.request({"op": "launch", "slot": slot, "set": j, "observe": observe,
                                 "index": self.observer.round if self.observer else -1}, self.launch_deadline)
            wall = (time.perf_counter() - t0) * 1e3
        finally:
            if frozen:
                self.freezer.thaw()
        claimed = float(rep.get("ms") or 0.0)
        if not math.isfinite(claimed) or claimed < 0:
            claimed = wall
            self.impossible[slot] = self.impossible.get(slot, 0) + 1
        if claimed > wall * 1.001 + 0.01:  # it claims more time than passed: impossible
            self.impossible[slot] = self.impossible.get(slot, 0) + 1
        self.bounds.setdefault(slot, []).append((claimed, wall))
        base = slot[:-3] if slot.endswith("#aa") else slot
        if slot != "canary":
            self.commits[base] = rep.get("commit")
            if rep.get("contract"):
                self.contract.setdefault(base, []).append(str(rep["contract"])[:300])
        if observe and self.observer is not None:
            self.observer.add(slot, rep)
        return {"sample": min(claimed, wall), "held": rep.get("held"), "clock_mhz": rep.get("clock_mhz"),
                "hold_us": rep.get("hold_us"), "self_synced": rep.get("self_synced") is True,
                "unspun": rep.get("unspun") is True, "launch_hold": rep.get("launch_hold") is True}


def run_session(task: dict, *, timeout_s: float, env: dict | None, isolation: str, run_task: Callable[..., dict],
                handover: Callable[[str], Any] | None = None, canary_ms: list[float] | None = None) -> dict:
    """A session task: the referee, the two children, the rounds; the result in the harness's form.

    With a card's long-lived servers (sessions.py): ``handover(role)`` gives each side's hand-over folder (a
    temporary folder inside what that side's server may write), and ``canary_ms`` the canary's cost as the
    references' server measured it when it started, before the card's accused server existed."""
    from skillrun.io import lifeline

    with lifeline.temp_dir("session") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        try:
            sides_of = ["accused"] + (["references"] if any(x["slot"] not in {task["port_slot"], *(task.get("peers") or [])}
                                                            for x in task["slots"]) else [])
            folders = {role: Path(stack.enter_context(handover(role))) for role in sides_of} if handover else None
            ref = referee_mod.Referee(task, folder, handover=folders)
        except Exception as exc:  # noqa: BLE001 - the problem module or the device, named in the row's error
            return {"status": "error", "error": f"the session's referee could not start: {type(exc).__name__}: {exc}"[:2000],
                    "wall_s": 0.0}
        t0 = time.perf_counter()
        s = Session(task, ref, folder, timeout_s)
        s.canary_ms = list(canary_ms) if canary_ms else None
        # until both children have connected: their processes' start, or (a card's servers, already running) a
        # moment's wait, unless a server had to start for this session (charged below, from what it says)
        s.cost.mark("process_start" if handover is None else "other")
        results: dict[str, dict] = {}
        threads = []
        try:
            sides = [("accused", s.accused)] + ([("references", s.refs)] if s.refs else [])
            listeners = {role: Listener(folder, role) for role, _ in sides}
            for lane, (role, names) in enumerate(sides):
                child_task = {
                    "kind": "slots", "role": role, "problem": task["problem"], "shape": task["shape"],
                    "device": task["device"], "port_slot": s.port, "peers": s.peers, "aa_slot": s.aa,
                    "slots": [x for x in task["slots"] if x["slot"] in names], "timing": task.get("timing") or {},
                    "slot_index": {x["slot"]: i for i, x in enumerate(task["slots"]) if x["slot"] in names},
                    "handover": str(ref.handovers[role]), "conductor": listeners[role].path,
                    "token": listeners[role].token, "idle_s": timeout_s, "sandbox": task.get("sandbox")}

                def start(role=role, child_task=child_task, lane=lane):
                    results[role] = run_task(child_task, timeout_s=timeout_s, env=env, isolation=isolation, lane=lane)
                th = threading.Thread(target=start, name=f"skillrun-session-{role}", daemon=True)
                th.start()
                threads.append((role, th))
            for role, th in threads:
                s.children[role] = listeners[role].accept(s.left(), alive=th.is_alive)
            res = _drive(s, task)
            res["phases"] = s.cost.to_json()
            res["wall_s"] = round(time.perf_counter() - t0, 3)
            ref.done = True
        except SessionError as exc:
            res = {"status": "error", "error": str(exc)[:2000], "wall_s": round(time.perf_counter() - t0, 3)}
            for role, th in threads:  # a child that ended early says why (a sandbox refused, a crash)
                if not th.is_alive() and results.get(role, {}).get("status") == "error":
                    res["error"] = (res["error"] + f"; the {role}' process: {str(results[role].get('error'))[:600]}")[:2000]
        finally:
            s.freezer.thaw()
            for c in s.children.values():
                c.close()  # a child still waiting for a request sees the end and leaves
            for role, th in threads:
                th.join(timeout=30)
                if th.is_alive():
                    if role in s.children:
                        s.children[role].kill()
                    th.join(timeout=30)
            summary = ref.summary()
            ref.stop()
        for role, r in results.items():
            if r.get("status") == "error" and res.get("status") == "ok":
                res.setdefault("notes", []).append(f"the {role}' process ended with an error after the session: "
                                                   f"{str(r.get('error'))[:300]}")
            if res.get("status") == "error" and r.get("stderr_tail"):
                res.setdefault("stderr_tail", r["stderr_tail"])
        # the session's children (a server already running serves it without starting one)
        res["processes_started"] = sum(int(r.get("processes_started") or 0) for r in results.values())
        if handover is not None and isinstance(res.get("phases"), dict):
            for r in results.values():
                for k in ("process_start", "imports"):
                    s.cost.move("other", k, float((r.get("server_start") or {}).get(k) or 0.0))
            res["phases"] = s.cost.to_json()
        if res.get("status") == "error" and summary.get("input_error"):
            return {**res, "input_error": True, "error": summary["input_error"]}
        return referee_mod.fold(res, task, summary)


def _ask(s: Session, msg: dict) -> dict:
    ans = s.ref.answer(msg)
    if ans.get("error"):
        raise SessionError(f"referee: {ans['error']}")
    return ans


def _drive(s: Session, task: dict) -> dict:
    from skillrun.execute import worker

    ref, tcfg = s.ref, task.get("timing") or {}
    device = task["device"]
    use_device = device.startswith("cuda")
    kids = list(s.children.values())
    acc, refs_child = s.children["accused"], s.children.get("references")
    s.freezer = Freezer(acc.pid)
    res: dict[str, Any] = {"status": "ok", "slots": {}, "notes": [], "shape": dict(task["shape"])}

    # 1. the references first, and the canary's cost before the port is imported anywhere
    s.cost.mark("compile")  # the slots' builds (their modules imported, their JIT compiles)
    canary_cal: list[float] = []
    built: dict[str, dict] = {}
    timer_info: dict[str, Any] = {}
    if refs_child is not None:
        b = refs_child.request({"op": "build"}, s.left())
        built.update(b["slots"])
        timer_info = b["timer"]
        if tcfg.get("timer"):
            # Its cost before any process holding this card's port existed: the references' server measured it when
            # it started (sessions.py); else here, before the accused's process has imported the port.
            canary_cal = s.canary_ms or refs_child.request({"op": "canary", "count": CANARY_CALIBRATION}, s.left())["ms"]
            if s.canary_ms:
                refs_child.request({"op": "canary", "count": 0}, s.left())  # built in this session's process too
    b = acc.request({"op": "build"}, s.left())
    built.update(b["slots"])
    timer_info = timer_info or b["timer"]
    for x in task["slots"]:
        res["slots"][x["slot"]] = built[x["slot"]]
    launches = {n: SimpleNamespace(expect_kernels=d.get("expect_kernels"), describe=d.get("describe") or {})
                for n, d in built.items()}
    vendor = getattr(ref.problem, "VENDOR_OPS", None)
    vendor = vendor if isinstance(vendor, str) else None

    # 2. input sets: the referee's seeds (it rejects a degenerate problem on set 0)
    s.cost.mark("inputs")
    ans = s.ref.answer({"op": "set", "j": 0})
    if ans.get("error"):
        if ans.get("input_error"):
            return {"status": "error", "input_error": True, "error": ans["error"]}
        raise SessionError(f"referee: {ans['error']}")
    decoy = _ask(s, {"op": "decoy"})["seed"]
    want_graphs = bool(tcfg.get("cuda_graph") and use_device and tcfg.get("timer"))
    inits = both(kids, lambda c: {"op": "init", "decoy": decoy, "seed": ans["seed"], "in_place": want_graphs}, s.left())
    bytes_per_set = sum(int(r["bytes_per_set"]) for r in inits.values())
    n_sets, cold = 1, "n/a (not timed)"
    if tcfg.get("timer"):
        if use_device:
            import torch

            budget = int(torch.cuda.mem_get_info()[0] * 0.5)
        else:
            budget = 1 << 30
        n_sets, cold = timing.rotation_sets(bytes_per_set, tcfg.get("l2_bytes"), tcfg.get("cold_l2", "rotate"),
                                            int(tcfg.get("max_sets", 32)), budget)
        if n_sets < 2 and budget >= 2 * bytes_per_set:
            n_sets = 2
    res["bytes_per_set"], res["input_sets"], res["cold_l2"] = bytes_per_set, n_sets, cold
    for j in range(1, n_sets):
        seed = _ask(s, {"op": "set", "j": j})["seed"]
        both(kids, lambda c: {"op": "add_set", "seed": seed}, s.left())

    # 3. each slot once, the aliasing gates; then which kernels ran (a profiled sample of each slot)
    s.cost.mark("checks")
    first = both(kids, lambda c: {"op": "first"}, s.left())
    res["aliasing"] = first["accused"].get("aliasing") or {"name": "port_output_aliasing", "passed": False,
                                                            "reason": "not checked"}
    if s.peers:
        res["peer_aliasing"] = first["accused"].get("peer_aliasing") or {}
    for role, r in first.items():
        s.guard.setdefault(role, []).extend(r.get("guard") or [])
    n_prof = int(task.get("profile_launches", 3))
    for n in launches:
        rep = s.child_of(n).request({"op": "profile", "slot": n, "launches": n_prof}, s.left())
        if rep.get("error_profiler"):
            res["slots"][n]["integrity"] = {"name": f"slot_integrity:{n}", "passed": False, "reason": rep["error_profiler"]}
            continue
        gate = worker._names_gate(n, launches, s.port, s.refs, rep["device"], rep["host"], use_device, s.peers, vendor)
        gate["launches_profiled"] = n_prof
        res["slots"][n]["integrity"] = gate

    # 4. timing, interleaved, driven from here
    t = None
    clock = None
    if tcfg.get("timer"):
        s.cost.mark("warmup")  # the callables, CUDA-graph capture
        both(kids, lambda c: {"op": "timing"}, s.left())
        repeat = 1
        res["cuda_graph"] = False
        if want_graphs:
            probes = both(kids, lambda c: {"op": "graph_probe"}, s.left())
            fastest = min((v for r in probes.values() for v in r["ms"].values()), default=None)
            want = tcfg.get("repeat")
            if isinstance(want, int) and want >= 1:
                repeat = min(want, worker.MAX_REPEAT)
            elif fastest and fastest > 0:
                repeat = max(1, min(worker.MAX_REPEAT, math.ceil(float(tcfg.get("sample_ms", worker.SAMPLE_TARGET_MS)) / fastest)))
            caps = {}
            for c in kids:
                caps[c.role] = c.request({"op": "capture", "repeat": repeat}, s.left())
                if not caps[c.role].get("captured"):
                    break
            if all(r.get("captured") for r in caps.values()) and len(caps) == len(kids):
                res["cuda_graph"] = True
            else:
                bad = next(r for r in caps.values() if not r.get("captured"))
                both(kids, lambda c: {"op": "timing", "eager": True}, s.left())  # eager everywhere
                repeat = 1
                res["notes"].append(f"CUDA graph capture failed ({str(bad.get('error'))[:200]}); timed eager launches")
        n_sets = res["input_sets"]
        last_set = lambda j: (j + repeat - 1) % n_sets  # noqa: E731  the set the sample's last call read
        clock = ParentClock(s, timer_info.get("method") or "the slot process's timer", bool(timer_info.get("hold")),
                            float(timer_info.get("sustain_ms") or 0.0))
        s.observer = RemoteObserver(clock, use_device)
        names = [n for n in launches]
        slots = {n: [RemoteCall(clock, n, j) for j in range(n_sets)] for n in names}
        if s.aa in slots:
            slots[f"{s.aa}#aa"] = [RemoteCall(clock, f"{s.aa}#aa", j) for j in range(n_sets)]
        if refs_child is not None:
            slots["canary"] = [RemoteCall(clock, "canary", j) for j in range(n_sets)]
        seen = {"checked": 0, "seconds": 0.0}

        def after_round(info: dict) -> None:
            t0 = time.perf_counter()
            j, kind = info["set"], info["kind"]
            token = None
            if kind in ("timed", "observed"):
                commits = {n: s.commits.get(n) for n in names}
                ans = _ask(s, {"op": "round", "kind": kind, "index": info["index"], "read": last_set(j),
                               "last": bool(info["last"]), "commits": commits})
                token = ans.get("token") if ans.get("check") else None
            s.commits = {}
            btw = both(kids, lambda c: {"op": "between", "set": j, "kind": kind, "index": info["index"], "token": token},
                       s.left())
            foreign = sorted({n for r in btw.values() for n in r.get("foreign") or []})
            for role, r in btw.items():
                s.guard.setdefault(role, []).extend(g for g in r.get("guard") or [] if g not in s.guard.get(role, []))
            if token is not None:
                seen["checked"] += 1
                _ask(s, {"op": "handed", "token": token, "foreign": foreign})
            plan = _ask(s, {"op": "refresh", "j": j})["plan"]
            both(kids, lambda c: {"op": "refresh", "set": j, "plan": plan}, s.left())
            seen["seconds"] += time.perf_counter() - t0

        import random

        # Stop on confidence (confidence.py) when the task asks for it: ``rounds`` is then a cap, and the rule
        # decides after every whole block of the parent's rounds (the canary is a slot of the block).
        rule = confidence.StopRule.from_config(tcfg.get("stop"), s.port, list(slots), s.aa)
        s.cost.mark(None)  # the engine says where its time went (phase_s)
        t = timing.interleave(slots, clock, int(tcfg.get("rounds", 100)), int(tcfg.get("warmup", 10)), None,
                              tcfg.get("max_seconds"), observe=int(tcfg.get("observe_rounds", 3)), observer=s.observer,
                              after_round=after_round, rng=random.SystemRandom(), stop=rule,
                              horizon=rule.horizon(len(slots)) if rule else None)
        for k, v in (t.get("phase_s") or {}).items():
            s.cost.add(k, v)
        s.cost.mark("checks")
        canary = _take_canary(t)
        if repeat > 1:
            worker.per_call(t, repeat)
        res["timing"] = {"method": clock.method, "repeat": repeat,
                         **{k: t[k] for k in ("samples", "rounds", "warmup", "raw", "round_info", "position_effect",
                                              "unheld_rounds", "hold_ineffective", "throttled_rounds", "observed",
                                              "observed_positions", "held", "hold_us", "sustain_ms", "launch_hold",
                                              "self_syncing", "unspun")},
                         "observed_rounds": len(t["observed_rounds"]), "timed_device_s": t.get("timed_device_s"),
                         **({"stop": rule.record(t["block"])} if rule else {}),
                         "profiler_ms": ({k: [x / repeat for x in v] for k, v in s.observer.kernel_ms().items()}
                                         if use_device else {})}
        res["timing"]["parent_clock"] = _parent_clock(s)
        if canary is not None:
            res["timing"]["canary"] = _canary(canary, canary_cal, at_start=bool(s.canary_ms))
            r = res["timing"]["canary"].get("ratio")
            if r and r > CANARY_LIMIT and not use_device:
                res["notes"].append(f"the canary in the references' process ran {r:.2f}x its cost before the port was "
                                    "imported: this machine was loaded during the session (the port's process was "
                                    "frozen while the references ran, so not by it); CPU timings are not evidence")
        res["notes"].append(
            f"between timed rounds (never inside a measured launch): {seen['seconds']:.2f} s of input checksums, "
            f"{seen['checked']} rounds' outputs handed to the referee (every profiled round among them) and input-content "
            f"refreshes; every output committed (SHA-256) in the reply to its own launch; the accused's process frozen "
            f"while the references ran ({s.freezer.count} times)")
        # 5. the accused once more after the timed storm (a race shows up here)
        tokens = {n: ref.rng.randrange(1, 2**62) for n in s.accused if n in launches}
        post = acc.request({"op": "post", "tokens": tokens}, s.left())
        s.guard.setdefault("accused", []).extend(post.get("guard") or [])
        for n, c in post["commits"].items():
            s.ref.answer({"op": "handed", "what": "post", "slot": n, "token": tokens[n], "commit": c.get("commit")})
            if c.get("contract"):
                s.contract.setdefault(n, []).append(str(c["contract"])[:300])

    # 6. what each process's checks saw, folded into every slot's gate
    fin = both(kids, lambda c: {"op": "finish"}, s.left())
    for role, r in fin.items():
        s.guard.setdefault(role, []).extend(g for g in r.get("guard") or [] if g not in s.guard.get(role, []))
    views = {n: v for r in fin.values() for n, v in (r.get("slots") or {}).items()}
    sets = SimpleNamespace(mutations={n: v.get("mutations") or [] for n, v in views.items()},
                           checks={n: int(v.get("checks") or 0) for n, v in views.items()},
                           tampered={n: v.get("tampered") or [] for n, v in views.items()})
    for n in launches:
        res["slots"][n].setdefault("integrity", {"name": f"slot_integrity:{n}", "passed": False, "reason": "not checked"})
        worker._finish_gate(res["slots"][n], n, sets, s.observer or RemoteObserver(ParentClock(s, "", False, 0.0), use_device),
                            t, launches, s.port, s.refs, use_device, graphs=bool(res.get("cuda_graph")), aa=s.aa,
                            peers=s.peers, vendor_ops=vendor)
        _accused_facts(s, res, n, t)
    return res


def _take_canary(t: dict) -> dict | None:
    if "canary" not in t.get("samples", {}):
        return None
    out = {"samples": t["samples"].pop("canary"), "observed": t["observed"].pop("canary", [])}
    t["raw"].pop("canary", None)
    t["observed_positions"].pop("canary", None)
    pe = t.get("position_effect") or {}
    (pe.get("median_ms_by_position") or {}).pop("canary", None)
    (t.get("self_syncing") or {}).pop("canary", None)
    return out


def _median(xs: list[float]) -> float | None:
    ys = sorted(xs)
    if not ys:
        return None
    k = len(ys) // 2
    return ys[k] if len(ys) % 2 else 0.5 * (ys[k - 1] + ys[k])


def _canary(c: dict, cal: list[float], at_start: bool = False) -> dict:
    base, now = _median(cal), _median(c["samples"])
    out = {"what": "a fixed matrix product timed in the references' process in every round; its cost measured "
                   + ("when the card's references' process started, before the card's port process was started"
                      if at_start else "there before the port was imported anywhere"),
           "before_ms": round(base, 6) if base else None, "session_ms": round(now, 6) if now else None,
           "limit": CANARY_LIMIT}
    if base and now:
        out["ratio"] = round(now / base, 4)
    return out


def _low(xs: list[float]) -> float | None:
    """The 20th percentile: a host's scheduling delays only ever add time to some requests, a clock that
    reads short or work done before the commitment adds it to every one; a low quantile keeps the second
    and drops the first."""
    ys = sorted(xs)
    return ys[int(0.2 * (len(ys) - 1))] if ys else None


def _parent_clock(s: Session) -> dict:
    """Per slot: the median time its process claimed, the parent's wall time around the same requests,
    and the time the claims leave unaccounted (low quantile); the references' is the request's own cost."""
    per = {}
    for n, xs in s.bounds.items():
        per[n] = {"claimed_ms": round(_median([c for c, _ in xs]) or 0.0, 6),
                  "parent_ms": round(_median([w for _, w in xs]) or 0.0, 6),
                  "unaccounted_ms": round(_low([w - c for c, w in xs]) or 0.0, 6), "launches": len(xs)}
        if s.impossible.get(n):
            per[n]["impossible_claims"] = s.impossible[n]
    # The references' slots that produce the problem's output, each on its own: the canary's request commits to a
    # small fixed product, so pooled with them it dragged the 20th percentile far below what a request of this
    # output costs (on the H200, 451 ms against 477-496 ms per slot for a 512 MiB output) and an honest port
    # was refused. The slots' own spread is the noise an honest request shows, so it widens the bound.
    lows = [per[n]["unaccounted_ms"] for n in s.bounds if n != "canary" and n in per and s.child_of(n).role == "references"]
    ref_gap = _median(lows) if lows else None
    spread = (max(lows) - min(lows)) if len(lows) > 1 else 0.0
    return {"how": "every timed launch is a request from the parent; its slot's process replies with the time its own timer "
                   "measured and its commitment to the output (computed in the same request, so the time between a "
                   "launch's end and its commitment is part of what the claims leave unaccounted), and the parent's clock "
                   "runs around the request. A claim above the parent's time is impossible; the time the accused's claims "
                   "leave unaccounted (20th percentile over its launches) must match the references' (the median of their "
                   "slots' own, the canary left out) within max(its median claim, "
                   f"{CLAIM_FLOOR_MS} ms) plus the spread between the references' slots",
            "reference_overhead_ms": round(ref_gap, 6) if ref_gap is not None else None,
            "reference_spread_ms": round(spread, 6), "floor_ms": CLAIM_FLOOR_MS, "slots": per}


def _accused_facts(s: Session, res: dict, n: str, t: dict | None) -> None:
    """What the parent holds against slot n beyond the process's own checks: its clock, the canary, the
    contract and the guard's findings (the accused's, for the accused)."""
    gate = res["slots"][n]["integrity"]
    problems: list[str] = []
    accused = n in s.accused
    contract = s.contract.get(n) or []
    if contract:
        problems.append(f"{len(contract)} of its outputs break the problem's output contract or alias memory that is not "
                        f"its own (checked every round): {contract[0]}")
        gate["output_contract"] = {"breaches": len(contract), "first": contract[0]}
    if t is not None:
        pc = (res.get("timing") or {}).get("parent_clock") or {}
        mine = (pc.get("slots") or {}).get(n)
        base = pc.get("reference_overhead_ms")
        if mine:
            gate["parent_clock"] = mine
            if mine.get("impossible_claims"):
                problems.append(f"{mine['impossible_claims']} of its timed launches claim more time than the parent saw pass "
                                "around them: its times are not a clock's")
            if accused and base is not None:
                excess = mine["unaccounted_ms"] - base
                bound = max(CLAIM_FLOOR_MS, mine["claimed_ms"]) + float(pc.get("reference_spread_ms") or 0.0)
                if excess > bound:
                    problems.append(f"its samples claim {mine['claimed_ms']:.4g} ms, but the parent's clock saw {mine['parent_ms']:.4g} ms "
                                    f"around each launch, {excess:.4g} ms more than the references' requests take beyond "
                                    f"their claims (bound {bound:.4g} ms): its time is read by a clock it controls, or it "
                                    "works outside the timed interval before it commits to its output")
        can = (res.get("timing") or {}).get("canary") or {}
        # On a GPU the accused's process, frozen while a reference runs, can still have work queued on the
        # device: the canary shows it. On a CPU a frozen process contends with nothing, so a slow canary
        # there is the machine's load (a warning in the timing block, never held against the port).
        if accused and s.use_device and can.get("ratio") and can["ratio"] > CANARY_LIMIT:
            problems.append(f"the canary in the references' process ran {can['ratio']:.2f}x its cost before the port was "
                            "imported: the references were contended during the session (by the port's process or by "
                            "something else on this machine), so their times are not comparable; rerun on a quiet machine")
    if accused:
        g = s.guard.get("accused") or []
        if g:
            problems.append("between rounds, in the port's process: " + "; ".join(dict.fromkeys(g))[:600])
            gate["guard"] = list(dict.fromkeys(g))[:10]
    elif s.guard.get("references"):
        gate["guard"] = list(dict.fromkeys(s.guard["references"]))[:10]
    if problems:
        first = gate.get("reason") if not gate.get("passed", False) else None
        gate["passed"] = False
        gate["reason"] = "; ".join(([first] if first else []) + problems)
