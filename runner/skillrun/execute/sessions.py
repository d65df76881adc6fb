"""One measurement session, many shapes: the sandboxed processes a card's measurements need, started once.

Run one task per fresh process (isolate.py's ``spawn``) and every shape pays, for each of its ten or
so tasks, an interpreter, ``import torch``, a device context and the kernels' JIT compiles again:
on the H200 that was 40-80 s of every shape's 50-160 s. A :class:`SessionPool` keeps, per card,
environment and sandbox mode, one long-lived :class:`TaskServer` (serve.py) for each role, and every
shape of the call is served by them:

==========  ===========================================================================
role        runs
==========  ===========================================================================
accused     the port's parity-gate task, the watchdog's probe, and the accused's side of the
            timed session (slot_server.py: the port and the tuner's peers)
references  the references' parity-gate tasks and the references' side of the timed session
            (baseline, alternatives, the A/A copy, the canary): a process that never runs port code
judge       the judge tasks (judge.py): a process that never imports a kernel module
==========  ===========================================================================

Each server is confined as a task child is (serve.py): it enters the sandbox before it imports anything a
card names, and may write only a folder the parent made for it (its *root*), under which the parent puts
every task's folder and hand-over folder; the parent and the referee read them there. The timed session is
still driven by the parent (session.py): its two sides are tasks on the accused's and the references'
servers, which connect to the parent's listeners as the children of a per-task session do.

What stays per shape: fresh inputs (the referee draws them), its own oracle, its own judge task and
referee (in the parent), its own artifact. What stays per card: the processes; a port never shares a
process with another card's port (servers are keyed by card), and the references' server never runs port
code. What a shared process changes: a port's process serves every shape of its own card, so what a port
leaves in it (a replaced function, a mode, a thread) is there in its later shapes; the guard's baseline is
taken when the server starts (guard.baseline), so a later session finds it, and a shape whose port did not
pass cleanly retires the accused's server (``retire``), so the next shape gets a fresh one. The canary's
cost is measured when the references' server starts, before the card's accused server has started, and
every session of the card compares its canary with that (on a GPU, queued device work of the port's
long-lived process cannot inflate it). A task that crashes, hangs (the overall timeout, the launch
watchdog's deadline or a session's request deadline) or leaves a GPU error behind ends its server: the
fault is recorded for that task, as a task child's would be, and the next task starts a fresh server.
Each server start is charged to the task that needed it (its ``phases``), so the artifact's cost says
which shape paid for it.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, IO

from skillrun.execute.childproc import child_env

# How long a fresh server may take to enter the sandbox and import torch and the worker (a cold interpreter
# on a loaded host).
STARTUP_S = 300.0
POLL_S = 0.05
ROLES = ("accused", "references", "judge")
REFERENCE_ROLES = ("baseline", "alternative")


def role_of(task: dict[str, Any]) -> str:
    """Which server runs ``task``: the judge's, the references', or the port's own."""
    kind = task.get("kind")
    if kind == "judge":
        return "judge"
    if kind == "candidate" and task.get("role") in REFERENCE_ROLES:
        return "references"
    if kind == "slots" and task.get("role") == "references":
        return "references"
    return "accused"  # the port's candidate, the watchdog's probe (every slot, in a throw-away order), the accused's slots


class ServerDied(RuntimeError):
    """The server could not be started or answered nothing."""


class TaskServer:
    """One long-lived, sandboxed helper process serving tasks of one role of one card (see the module doc)."""

    def __init__(self, role: str, env: dict[str, str | None] | None, mode: str = "auto", label: str = "",
                 canary: dict[str, Any] | None = None) -> None:
        from skillrun.io import lifeline

        self.role, self.env, self.mode, self.label = role, dict(env or {}), mode, label
        self.canary = canary if role == "references" else None
        self.proc: subprocess.Popen | None = None
        self.started = 0            # how many processes this server has started (restarts included)
        self.tasks = 0
        self.start_cost: dict[str, float] | None = None  # the last start's cost, until a task is charged with it
        self.sandbox: dict[str, Any] | None = None       # what the last start's sandbox entry said
        self.canary_ms: list[float] | None = None        # the canary's cost when this server first started
        self.left_behind: str | None = None              # what the last task left running (its server then ended)
        self.first_start: float | None = None            # when its first process was started (time.monotonic)
        # The one folder the server may write (named for this process: the janitor removes it if the run dies).
        self._root = lifeline.temp_dir(f"srv{role[0]}")
        self.root = Path(self._root.name)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure(self) -> None:
        if self.alive():
            return
        self.stop()
        t0 = time.perf_counter()
        env = child_env(self.env)
        if self.canary and self.canary_ms is None:
            env["SKILLRUN_SERVER_CANARY"] = json.dumps(self.canary)
        self.proc = subprocess.Popen([sys.executable, "-m", "skillrun.execute.serve", self.role, str(self.root), self.mode],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, text=True, start_new_session=True)
        self.started += 1
        self.first_start = self.first_start or time.monotonic()
        line = _readline(self.proc.stdout, STARTUP_S)
        try:
            hello = json.loads(line) if line else {}
        except ValueError:
            hello = {}
        if not hello.get("ready"):
            self.stop()
            raise ServerDied(f"the {self.role} server did not start within {STARTUP_S:g} s (or its sandbox refused it)")
        total = time.perf_counter() - t0
        imports = float(hello.get("imports_s") or 0.0)
        self.start_cost = {"process_start": max(0.0, total - imports), "imports": imports}
        self.sandbox = hello.get("sandbox")
        if self.canary_ms is None and isinstance(hello.get("canary_ms"), list):
            self.canary_ms = [float(x) for x in hello["canary_ms"]]

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            if p.stdin:
                p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(timeout=0.5)  # a server ends on EOF; its interpreter's teardown is not worth waiting for
        except subprocess.TimeoutExpired:
            pass
        kill_group(p)

    def close(self) -> None:
        self.stop()
        self._root.cleanup()

    def temp_dir(self, prefix: str = "t") -> tempfile.TemporaryDirectory:
        """A folder for one task (or one hand-over) inside what this server may write."""
        return tempfile.TemporaryDirectory(prefix=f"{prefix}-", dir=self.root)

    def call(self, d: Path, timeout_s: float, clock: Any = None) -> tuple[int, bool, str | None, str | None]:
        """Run the task in folder ``d`` (task.json -> result.json, its stdout/stderr files there), as
        isolate._spawn does for a child of its own: (exit code, timed out, error starting, stuck reason)."""
        try:
            self.ensure()
        except (ServerDied, OSError) as exc:
            return -1, False, f"cannot start the {self.role} server: {exc}", None
        call = ServerCall(self, d)
        end = time.monotonic() + timeout_s
        while True:
            # Woken by the answer itself; between answers, the launch watchdog's clock is read every POLL_S.
            code = call.poll(wait=max(0.0, min(POLL_S if clock is not None else 1.0, end - time.monotonic())))
            if code is not None:
                return code, False, None, None
            stuck = clock.stuck() if clock is not None else None
            if stuck is not None or time.monotonic() >= end:
                call.kill()
                return call.wait(), True, None, stuck

    def take_start_cost(self) -> dict[str, float] | None:
        c, self.start_cost = self.start_cost, None
        return c


class ServerCall:
    """One task on a server, with the interface of a ``subprocess.Popen`` the watchdog polls: ``pid``
    (the server's process group), ``poll()``, ``wait()``; killing the group ends the server."""

    def __init__(self, server: TaskServer, d: Path) -> None:
        self.server = server
        self.proc = server.proc
        assert self.proc is not None and self.proc.stdin is not None
        self.pid = self.proc.pid
        self.code: int | None = None
        req = {"task": str(d / "task.json"), "result": str(d / "result.json"), "stdout": str(d / "stdout"),
               "stderr": str(d / "stderr")}
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except OSError:
            self.code = self._died()
        server.tasks += 1

    def _died(self) -> int:
        p = self.proc
        try:
            code = p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_group(p)
            code = p.wait()
        kill_group(p)  # whatever the task left in the server's group ends with it
        if self.server.proc is p:
            self.server.proc = None
        return code if code != 0 else 1  # a server that exits 0 mid-task still left the task without an answer

    def poll(self, wait: float = 0.0) -> int | None:
        if self.code is not None:
            return self.code
        ready, _, _ = select.select([self.proc.stdout], [], [], wait)
        if not ready:
            if self.proc.poll() is not None:
                self.code = self._died()
            return self.code
        line = self.proc.stdout.readline()
        if not line:
            self.code = self._died()
            return self.code
        try:
            ans = json.loads(line)
            self.code = int(ans["exit"])
        except (ValueError, KeyError, TypeError):
            self.code = self._died()
            return self.code
        if ans.get("ended"):
            # The task left something running (serve.py): the server ends with it, the next task starts a fresh one.
            self.server.left_behind = str(ans["ended"])[:300]
            p = self.proc
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            kill_group(p)
            if self.server.proc is p:
                self.server.proc = None
        return self.code

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll(wait=POLL_S)
            if code is not None:
                return code
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired("task server", timeout)

    def kill(self) -> None:
        kill_group(self.proc)
        if self.code is None:
            try:
                self.code = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.code = -signal.SIGKILL
        if self.server.proc is self.proc:
            self.server.proc = None


def kill_group(p: subprocess.Popen | None) -> None:
    """The server and its sandbox: the process outside, the namespace's init and the task (one process group;
    the namespace's init dies with the process outside, and the kernel then ends everything inside)."""
    if p is None:
        return
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _readline(stream: IO[str] | None, timeout_s: float) -> str | None:
    if stream is None:
        return None
    ready, _, _ = select.select([stream], [], [], timeout_s)
    return stream.readline() if ready else None


class SessionPool:
    """The task servers of one call (a ``run_skill`` over many shapes, a plan, a device script), per card,
    environment and sandbox mode; a context manager that stops them all (and removes their folders) at its end.

    ``canary`` (``{"timer", "device"}``, the timed sessions' timer): each card's references' server times the
    canary when it starts, and is started before the card's accused server (see the module doc)."""

    def __init__(self, gpu: bool = False, canary: dict[str, Any] | None = None) -> None:
        self.gpu = gpu
        self.canary = canary
        self.servers: dict[tuple[str, str, str, str], TaskServer] = {}
        self.lock = threading.Lock()

    def __enter__(self) -> "SessionPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def for_card(self, card: str) -> "CardSession":
        return CardSession(self, card)

    def server(self, card: str, role: str, env: dict[str, str | None] | None, mode: str = "auto") -> TaskServer:
        key = (card, role, json.dumps(env or {}, sort_keys=True), mode)
        with self.lock:
            s = self.servers.get(key)
            if s is None:
                s = self.servers[key] = TaskServer(role, env, mode, label=card, canary=self.canary)
            return s

    def processes_started(self, card: str | None = None) -> int:
        return sum(s.started for (c, *_), s in self.servers.items() if card is None or c == card)

    def close(self) -> None:
        with self.lock:
            for s in self.servers.values():
                s.close()
            self.servers.clear()


class CardSession:
    """A pool seen from one card: what isolate.run_task is handed to route its tasks."""

    def __init__(self, pool: SessionPool, card: str) -> None:
        self.pool, self.card = pool, card
        self.early: list[dict[str, float]] = []  # start costs of servers started ahead of the task that asked

    @property
    def gpu(self) -> bool:
        return self.pool.gpu

    def server(self, role: str, env: dict[str, str | None] | None, mode: str = "auto") -> TaskServer:
        s = self.pool.server(self.card, role, env, mode)
        if role == "accused" and self.pool.canary and not s.started:
            # The canary's cost is taken by the references' server when it starts: before any process that
            # holds this card's port exists (a port's queued device work could otherwise inflate it).
            ref = self.pool.server(self.card, "references", env, mode)
            if ref.canary_ms is None:
                try:
                    ref.ensure()
                    self.early.append(ref.take_start_cost() or {})  # charged to the task that made it start now
                except (ServerDied, OSError):
                    pass  # the references' task that needs it says why
        return s

    def take_start_cost(self, server: TaskServer) -> tuple[dict[str, float], int]:
        """What starting processes cost the task that ran on ``server`` (its own start, and any server started
        ahead for it), and how many processes that was."""
        costs = [c for c in [server.take_start_cost(), *self.early] if c]
        self.early = []
        out: dict[str, float] = {}
        for c in costs:
            for k, v in c.items():
                out[k] = out.get(k, 0.0) + float(v)
        return out, len(costs)

    def server_for(self, task: dict[str, Any], env: dict[str, str | None] | None) -> TaskServer:
        return self.server(role_of(task), env, str(task.get("sandbox") or "auto"))

    def canary_ms(self, env: dict[str, str | None] | None, mode: str = "auto") -> list[float] | None:
        return self.pool.server(self.card, "references", env, mode).canary_ms

    def retire(self, role: str) -> None:
        """End this card's servers of ``role`` (their next task starts a fresh process): after a shape whose port
        did not pass cleanly, nothing it left in its process reaches the card's next shape."""
        with self.pool.lock:
            servers = [s for (c, r, *_), s in self.pool.servers.items() if c == self.card and r == role]
        for s in servers:
            s.stop()

    def launcher(self, env: dict[str, str | None] | None, mode: str = "auto") -> "Launcher":
        """For the watchdog's probe (watchdog.probe_kernels): its folder in the accused server's root, and the
        probe started there (the probe child is then the accused server)."""
        return Launcher(self.server("accused", env, mode))


class Launcher:
    def __init__(self, server: TaskServer) -> None:
        self.server = server

    def temp_dir(self) -> tempfile.TemporaryDirectory:
        return self.server.temp_dir("probe")

    def __call__(self, d: Path) -> ServerCall:
        self.server.ensure()
        return ServerCall(self.server, d)
