"""Run one harness task in a child process, so a crash, GPU fault or hang fails that row only.

Two ways to start the child, same worker code (``skillrun.execute.worker``):

* ``spawn``: a fresh interpreter (``python -m skillrun.execute.worker task.json result.json``).
  Clean device state every time; costs an interpreter + torch import per task. Default on GPUs.
* ``fork``: forked from a zygote process that has torch imported but no GPU context and no
  kernel module (zygote.py). Milliseconds per task. Default on the CPU backend.

A third way serves many tasks from one process: with a ``session`` (sessions.CardSession), each
task goes to the card's long-lived server for its role (the port's, the references', the judge's),
which imports torch and the worker once for every shape of the call; a task that crashes or hangs
ends that server, and the next task starts a fresh one.

Either way the child runs in its own process session: a segfault or abort kills only it, a hang is
ended at the timeout by killing its process group, and its stdout/stderr are kept so the error in
the artifact says what happened (a CUDA error message, an LLVM abort). Triton reads
``TRITON_INTERPRET`` whenever a function is decorated with ``@triton.jit``, including its own
library functions at ``import triton``: the variable is therefore set in the environment of the
process that first imports Triton (the spawned child, or the zygote, one zygote per environment).
"""
from __future__ import annotations

import atexit
import functools
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

from skillrun.io import lifeline

from skillrun.execute.childproc import TAIL_CHARS, _tail, child_env, describe_exit, read_child_file  # noqa: F401  (re-exported)


class Zygote:
    """One long-lived zygote per harness process (started on first use, stopped at exit)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.env_key: str | None = None

    def _start(self, env: dict[str, str]) -> None:
        self.stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "skillrun.execute.zygote"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True,
                                     start_new_session=True)
        hello = self._readline(self.proc.stdout, 300)
        if not hello or not json.loads(hello).get("ready"):
            self.stop()
            raise RuntimeError("the zygote did not start")
        if json.loads(hello).get("kernels_loaded"):
            self.stop()
            raise RuntimeError("the zygote imported a kernel module; TRITON_INTERPRET could not be chosen per task")

    @staticmethod
    def _readline(stream: IO[str] | None, timeout_s: float) -> str | None:
        if stream is None:
            return None
        ready, _, _ = select.select([stream], [], [], timeout_s)
        return stream.readline() if ready else None

    def stop(self) -> None:
        if self.proc is not None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc = None

    def run(self, req: dict[str, Any], base_env: dict[str, str], key_env: dict[str, str | None]) -> tuple[int, bool]:
        with self.lock:
            # Restart only when what the zygote imported could differ (import path, Triton mode), not
            # for every environment change (pytest, for one, rewrites PYTEST_CURRENT_TEST per test).
            key = json.dumps([base_env.get("PYTHONPATH"), key_env], sort_keys=True)
            if self.proc is None or self.proc.poll() is not None or key != self.env_key:
                self._start(base_env)
                self.env_key = key
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self._readline(self.proc.stdout, float(req["timeout_s"]) + 60)
            if not line:
                self.stop()
                raise RuntimeError("the zygote stopped answering")
            ans = json.loads(line)
            return int(ans["exit"]), bool(ans["timed_out"])


_ZYGOTE = Zygote()
atexit.register(_ZYGOTE.stop)
# A timed session runs two children at once (the accused's and the references', session.py): the second
# forks from a zygote of its own ("lane" 1), so neither waits for the other.
_LANES: dict[int, Zygote] = {0: _ZYGOTE}


def _zygote(lane: int) -> Zygote:
    if lane not in _LANES:
        _LANES[lane] = Zygote()
        atexit.register(_LANES[lane].stop)
    return _LANES[lane]


def run_task(task: dict[str, Any], *, timeout_s: float, env: dict[str, str | None] | None = None,
             isolation: str = "spawn", lane: int = 0, session: Any = None) -> dict[str, Any]:
    """Run ``task`` in a child; always returns a dict with ``status`` (ok/unsupported/error) and ``wall_s``.

    ``session`` (sessions.CardSession): the task runs on the card's server for its role instead of a
    child of its own. The result's ``phases`` are its seconds by phase (cost.py), the start of any
    process it needed included; ``processes_started`` counts those processes.

    A session task that carries ``watchdog`` (``{"deadline_s": s}``) first has its slots probed
    under that deadline (watchdog.py): slots that hang, crash or raise are left out, the rest are
    timed, and the result carries the watchdog's record. This is the one place the harness and the
    tuner (inline, local lanes, Ray) start sessions, so every one of them is guarded."""
    if task.get("kind") == "candidate" and "handover" not in task:
        # The parity gate: the port's process runs it, a process that never imported the port judges it.
        return _judged(task, timeout_s=timeout_s, env=env, isolation=isolation, session=session)
    if task.get("kind") == "session" and task.get("watchdog"):
        from skillrun.execute import watchdog

        t0 = time.perf_counter()
        launcher = session.launcher(env, str(task.get("sandbox") or "auto")) if session is not None else None
        kept, record = watchdog.admit(task, env=env, launcher=launcher)
        probe = {"compile": time.perf_counter() - t0}  # the probe's builds and first launches (and its process)
        if task["port_slot"] in record["dropped"]:
            why = record["dropped"][task["port_slot"]]
            return {"status": "error", "fault": why["status"], "error": f"watchdog: {why['reason']}",
                    "watchdog": record, "wall_s": 0.0, "phases": probe}
        res = run_task(kept, timeout_s=timeout_s, env=env, isolation=isolation, session=session)
        res["watchdog"] = record
        res["phases"] = _add_phases(res.get("phases"), probe)
        return res
    if task.get("kind") == "session":
        # The timed session: this process holds the clock and the referee; the port's process and the
        # references' process only do what they are told (session.py).
        return _refereed(task, timeout_s=timeout_s, env=env, isolation=isolation, session=session)
    if session is not None:
        return _served(task, session, timeout_s=timeout_s, env=env)
    # Named for this process: a run killed by SIGKILL leaves its folder, and the next run removes it.
    with lifeline.temp_dir("child") as tmp:
        d = Path(tmp)
        task, clock = _launch_clock(task, d)
        t0 = time.perf_counter()
        code, timed_out = None, False
        # A child of its own: the interpreter's start is charged to this task (worker.main).
        (d / "task.json").write_text(json.dumps({**task, "t_spawn": time.time()} if isolation != "fork" else task))
        if isolation == "fork":
            # The backend's variables (TRITON_INTERPRET) go into the zygote's own environment: Triton
            # decorates its library functions (tl.cdiv, …) when it is imported, which the zygote may
            # already have done (the profiler imports it), so the choice must precede the zygote.
            base = child_env(env)
            req = {"task": str(d / "task.json"), "result": str(d / "result.json"), "stdout": str(d / "stdout"),
                   "stderr": str(d / "stderr"), "env": {}, "timeout_s": timeout_s}
            try:
                code, timed_out = _zygote(lane).run(req, base, env or {})
            except (RuntimeError, OSError, ValueError):
                code = None  # fall back to a fresh interpreter below
        stuck = None
        if code is None:
            code, timed_out, err, stuck = _spawn(d, timeout_s, env, clock)
            if err:
                return {"status": "error", "error": err, "wall_s": 0.0}
        res = _collect(d, code, timed_out, stuck, timeout_s, time.perf_counter() - t0)
        res["processes_started"] = 1
        return res


def _launch_clock(task: dict[str, Any], d: Path) -> tuple[dict[str, Any], Any]:
    """The launch watchdog's clock over the task's progress file in ``d`` (None without a deadline)."""
    if not task.get("launch_deadline_s"):
        return task, None
    from skillrun.execute.watchdog import LaunchClock

    task = {**task, "progress": str(d / "progress.jsonl")}
    cfg = ", ".join(f"{k}={v}" for k, v in sorted((task.get("config") or {}).items())) or "default config"
    return task, LaunchClock(d / "progress.jsonl", float(task["launch_deadline_s"]), f"{task.get('ref')} ({cfg})")


def _served(task: dict[str, Any], session: Any, *, timeout_s: float, env: dict[str, str | None] | None) -> dict[str, Any]:
    """The task on its card's server for its role (sessions.py), in a folder inside what that server may write."""
    server = session.server_for(task, env)
    with server.temp_dir("t") as tmp:
        d = Path(tmp)
        task, clock = _launch_clock(task, d)
        (d / "task.json").write_text(json.dumps(task))
        t0 = time.perf_counter()
        code, timed_out, err, stuck = server.call(d, timeout_s, clock)
        started, n_started = session.take_start_cost(server)
        if err:
            return {"status": "error", "error": err, "wall_s": 0.0}
        res = _collect(d, code, timed_out, stuck, timeout_s, time.perf_counter() - t0)
    if started:
        res["phases"] = _add_phases(res.get("phases"), started)
        res["server_start"] = started  # (a session's side: the parent's own phases take it from here)
        res["processes_started"] = n_started
    if session.gpu and res.get("status") == "error":
        # A GPU error can stay behind in the process's context: the next task gets a fresh server.
        server.stop()
    return res


def _collect(d: Path, code: int, timed_out: bool, stuck: str | None, timeout_s: float, wall: float) -> dict[str, Any]:
    """The task's result from its folder, or the error its process's end says."""
    result_path = d / "result.json"
    if not timed_out and result_path.exists():
        try:
            res = json.loads(read_child_file(result_path))
            res.setdefault("status", "error")
            res["wall_s"] = round(wall, 3)
            if code != 0:
                res.setdefault("notes", []).append(f"child exit status {code} after writing its result")
            return res
        except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
            return {"status": "error", "error": f"unreadable child result: {exc}", "wall_s": round(wall, 3)}
    msg = stuck or (f"timed out after {timeout_s:g} s (hang?); child killed" if timed_out else describe_exit(code))
    tail = _tail(d / "stderr") or _tail(d / "stdout")
    return {"status": "error", "error": msg, "fault": "timeout" if timed_out else "crash", "exit_code": code,
            "stderr_tail": tail, "wall_s": round(wall, 3)}


def _add_phases(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, float]:
    out = dict(a or {})
    for k, v in (b or {}).items():
        if isinstance(v, (int, float)):
            out[k] = round(float(out.get(k) or 0.0) + float(v), 4)
    return out


# The accused's claims the parent never takes: correctness and the problem's own numbers are the judge's.
_NOT_TAKEN = ("parity", "input_error", "flops", "min_bytes")


def _judged(task: dict, *, timeout_s: float, env: dict[str, str | None] | None, isolation: str,
            session: Any = None) -> dict[str, Any]:
    """A candidate task as two children, accused and judge (judge.py); the result has the usual form."""
    from skillrun.execute import judge

    if "problem_pin" not in task:  # pinned before the accused runs (the harness pins once per item, earlier)
        try:
            task = {**task, "problem_pin": judge.pin_problem(task["problem"])}
        except (ImportError, OSError, ValueError) as exc:
            return {"status": "error", "error": f"the problem module cannot be pinned: {exc}", "wall_s": 0.0}
    # The hand-over folder: where the accused's process may write (its server's folder, with a session)
    folder = session.server_for(task, env).temp_dir("handover") if session is not None else lifeline.temp_dir("handover")
    with folder as tmp:
        res = run_task({**{k: v for k, v in task.items() if k != "problem_pin"}, "handover": tmp}, timeout_s=timeout_s,
                       env=env, isolation=isolation, session=session)
        said = res.get("parity") if isinstance(res.get("parity"), dict) else {}
        for k in _NOT_TAKEN:
            res.pop(k, None)
        if res.get("status") == "unsupported":
            res["parity"] = {"passed": False, "supported": False, "error": str(said.get("error") or "unsupported shape")[:2000]}
        if res.get("status") != "ok":
            return res
        verdict = run_task({"kind": "judge", "problem": task["problem"], "shape": task["shape"], "device": task["device"],
                            "seeds": task["seeds"], "tolerance": task.get("tolerance"), "handover": tmp,
                            "problem_pin": task["problem_pin"]},
                           timeout_s=timeout_s, env=env, isolation=isolation, session=session)
    res["wall_s"] = round(float(res.get("wall_s") or 0.0) + float(verdict.get("wall_s") or 0.0), 3)
    res["phases"] = _add_phases(res.get("phases"), verdict.get("phases"))
    res["processes_started"] = int(res.get("processes_started") or 0) + int(verdict.get("processes_started") or 0)
    if verdict.get("status") != "ok":
        res.update(status="error", error=str(verdict.get("error") or "the judge failed")[:2000])
        if verdict.get("input_error"):
            res["input_error"] = True
        else:
            res["error"] = "judge: " + res["error"]
            for k in ("fault", "exit_code", "stderr_tail", "traceback"):
                if k in verdict:
                    res[k] = verdict[k]
        return res
    res.update(parity=verdict["parity"], flops=verdict["flops"], min_bytes=verdict["min_bytes"])
    return res


def _refereed(task: dict, *, timeout_s: float, env: dict[str, str | None] | None, isolation: str,
              session: Any = None) -> dict[str, Any]:
    """A session task, driven from this process (session.py): the referee here, the accused and the
    references in two children (or on the card's two servers, with a ``session``)."""
    from skillrun.execute import session as session_mod

    if session is None:
        return session_mod.run_session(task, timeout_s=timeout_s, env=env, isolation=isolation, run_task=run_task)
    mode = str(task.get("sandbox") or "auto")
    return session_mod.run_session(task, timeout_s=timeout_s, env=env, isolation=isolation,
                                   run_task=functools.partial(run_task, session=session),
                                   handover=lambda role: session.server(role, env, mode).temp_dir("handover"),
                                   canary_ms=session.canary_ms(env, mode))


def _spawn(d: Path, timeout_s: float, env: dict[str, str | None] | None,
           clock: Any = None) -> tuple[int, bool, str | None, str | None]:
    """(exit code, timed out, error starting it, the launch watchdog's reason when it ended the child)."""
    out, err = open(d / "stdout", "wb"), open(d / "stderr", "wb")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "skillrun.execute.worker", str(d / "task.json"), str(d / "result.json")],
            stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=child_env(env), start_new_session=True,
        )
    except OSError as exc:
        out.close()
        err.close()
        return -1, False, f"cannot start child: {exc}", None
    timed_out, stuck = False, None
    end = time.monotonic() + timeout_s
    try:
        while True:
            try:
                code = proc.wait(timeout=min(0.1, max(0.0, end - time.monotonic())) if clock else timeout_s)
                break
            except subprocess.TimeoutExpired:
                stuck = clock.stuck() if clock else None
                if stuck is None and time.monotonic() < end:
                    continue
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group: it and anything it spawned
                except ProcessLookupError:
                    pass
                code = proc.wait()
                break
    finally:
        out.close()
        err.close()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what the task left in its group ends with it (zygote._end_group)
        except (ProcessLookupError, PermissionError):
            pass
    return code, timed_out, None, stuck
