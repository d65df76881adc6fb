"""One measurement session, many shapes: the helper processes a card's measurements need, started once.

Run one task per fresh process (isolate.py's ``spawn``) and every shape pays, for each of its ten or
so tasks, an interpreter, ``import torch``, a device context and the kernels' JIT compiles again:
on the H200 that was 40-80 s of every shape's 50-160 s. A :class:`SessionPool` keeps, per card and
environment, one long-lived :class:`TaskServer` (serve.py) for each role, and every shape of the
call is served by them:

=========  ==============================================================================
role       runs
=========  ==============================================================================
accused    the port's parity-gate task, the watchdog's probe and the timed session (the
           session times every slot in the port's process, as it always has)
reference  the references' parity-gate tasks: never the port's process
judge      the judge tasks (judge.py): a process that never imports a kernel module
=========  ==============================================================================

What stays per shape: fresh inputs (the referee draws them), its own oracle, its own judge task and
referee (in the parent), its own artifact. What stays per card: the processes; a port never shares
a process with another card's port (servers are keyed by card). A task that crashes, hangs (the
overall timeout, or the launch watchdog's deadline) or leaves a GPU error behind ends its server:
the fault is recorded for that task, as a task child's would be, and the next task starts a fresh
server. Each server start is charged to the task that needed it (``process`` in the task's result),
so the artifact's cost says which shape paid for it.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, IO

from skillrun.execute.childproc import child_env

# How long a fresh server may take to import torch and the worker (a cold interpreter on a loaded host).
STARTUP_S = 300.0
POLL_S = 0.05
ROLES = ("accused", "reference", "judge")
REFERENCE_ROLES = ("baseline", "alternative")


def role_of(task: dict[str, Any]) -> str:
    """Which server runs ``task``: the judge's, the references', or the port's own."""
    kind = task.get("kind")
    if kind == "judge":
        return "judge"
    if kind == "candidate" and task.get("role") in REFERENCE_ROLES:
        return "reference"
    return "accused"


class ServerDied(RuntimeError):
    """The server could not be started or answered nothing."""


class TaskServer:
    """One long-lived helper process serving tasks of one role (see the module doc)."""

    def __init__(self, role: str, env: dict[str, str | None] | None, label: str = "") -> None:
        self.role, self.env, self.label = role, dict(env or {}), label
        self.proc: subprocess.Popen | None = None
        self.started = 0            # how many processes this server has started (restarts included)
        self.tasks = 0
        self.start_cost: dict[str, float] | None = None  # the last start's cost, until a task is charged with it

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure(self) -> None:
        if self.alive():
            return
        self.stop()
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "skillrun.execute.serve", self.role],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=child_env(self.env), text=True, start_new_session=True)
        self.started += 1
        line = _readline(self.proc.stdout, STARTUP_S)
        try:
            hello = json.loads(line) if line else {}
        except ValueError:
            hello = {}
        if not hello.get("ready"):
            self.stop()
            raise ServerDied(f"the {self.role} server did not start within {STARTUP_S:g} s")
        total = time.perf_counter() - t0
        imports = float(hello.get("imports_s") or 0.0)
        self.start_cost = {"process_start": max(0.0, total - imports), "imports": imports}

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
            self.code = int(json.loads(line)["exit"])
        except (ValueError, KeyError, TypeError):
            self.code = self._died()
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
    """The task servers of one call (a ``run_skill`` over many shapes, a plan, a device script), per
    card and environment; a context manager that stops them all at its end."""

    def __init__(self, gpu: bool = False) -> None:
        self.gpu = gpu
        self.servers: dict[tuple[str, str, str], TaskServer] = {}
        self.lock = threading.Lock()
        self.card: str | None = None

    def __enter__(self) -> "SessionPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def for_card(self, card: str) -> "CardSession":
        return CardSession(self, card)

    def server(self, card: str, role: str, env: dict[str, str | None] | None) -> TaskServer:
        key = (card, role, json.dumps(env or {}, sort_keys=True))
        with self.lock:
            s = self.servers.get(key)
            if s is None:
                s = self.servers[key] = TaskServer(role, env, label=card)
            return s

    def processes_started(self, card: str | None = None) -> int:
        return sum(s.started for (c, _, _), s in self.servers.items() if card is None or c == card)

    def close(self) -> None:
        with self.lock:
            for s in self.servers.values():
                s.stop()
            self.servers.clear()


class CardSession:
    """A pool seen from one card: what isolate.run_task is handed to route its tasks."""

    def __init__(self, pool: SessionPool, card: str) -> None:
        self.pool, self.card = pool, card

    @property
    def gpu(self) -> bool:
        return self.pool.gpu

    def server_for(self, task: dict[str, Any], env: dict[str, str | None] | None) -> TaskServer:
        return self.pool.server(self.card, role_of(task), env)

    def launcher(self, env: dict[str, str | None] | None):
        """For the watchdog's probe (watchdog.probe_kernels): start the probe task on the port's server
        and hand back a Popen-like handle (the probe child is then the accused server)."""
        server = self.pool.server(self.card, "accused", env)

        def start(d: Path) -> ServerCall:
            server.ensure()
            return ServerCall(server, d)
        return start
