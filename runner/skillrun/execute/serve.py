"""A task server: one long-lived helper process of a card that runs harness tasks one after another (sessions.py).

Started by :class:`skillrun.execute.sessions.TaskServer` as ``python -m skillrun.execute.serve ROLE ROOT MODE``
in its own process group. Before it imports torch or anything a card names it does what every task child
does first (worker.confine): it enters the sandbox (skillrun.io.sandbox) in mode ``MODE`` (``off`` for the
judge, which imports no kernel module) with ``ROOT`` as the only folder it may write, a folder the parent
made for this server, under which the parent puts every task's folder (its task, result, output files and
hand-over folder). Then it imports torch and the worker once (the cost every spawned task child used to
pay again), records what the harness's functions, modes and threads are (guard.baseline: a port of an
earlier shape that replaced one or left a thread behind is found in every later session of this process),
the references' server times the canary (``CANARY`` given: the canary's cost before this card's port
process starts), answers ``{"ready": true, "imports_s", "pid", "sandbox", "canary_ms"?}``, and serves one
request per line: ``{"task", "result", "stdout", "stderr"}``.

Each task runs as in a child of its own (worker.main, already confined: the result file is written the same
way); its output goes to the task's own files, and the answer ``{"exit": code}`` follows on the protocol
pipe, which the task cannot see (moved off fds 0 and 1 before the sandbox was entered). After each task the
server returns the device's cached memory (after a full garbage collection where a task held large input
sets or failed), so the next shape starts with the memory the last one freed.

A task that crashes or hangs takes this process with it (its PID namespace too); the parent records that
task's fault and starts a fresh server for the next one.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time


def _redirect(path: str | None, fd: int) -> None:
    f = os.open(path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(f, fd)
    os.close(f)


def main(argv: list[str]) -> int:
    from skillrun.io import lifeline

    role, root, mode = argv[1], argv[2], argv[3]
    canary = json.loads(os.environ.pop("SKILLRUN_SERVER_CANARY", "") or "null")
    pid_text = os.environ.get(lifeline.PARENT_ENV, "")
    parent = int(pid_text) if pid_text.isdigit() else None
    deathsig = os.environ.get(lifeline.DEATHSIG_ENV) == "1"
    # The protocol moves to private descriptors; fd 0 reads nothing, fds 1 and 2 are the task's files.
    proto_in = os.fdopen(os.dup(0), "r")
    proto_out = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _redirect(None, 1)
    _redirect(None, 2)
    t0 = time.perf_counter()
    from skillrun.io import sandbox

    # The sandbox first, as in every task child (one thread only: before torch or any watch thread starts).
    info = sandbox.enter([root], role={"references": "reference"}.get(role, role if role != "judge" else "judge"),
                         mode="off" if role == "judge" else mode, parent=parent, deathsig=deathsig)
    if not info.get("lifeline") and parent is not None:
        lifeline.die_with_parent(parent, deathsig=deathsig)
    import torch  # noqa: F401  (once for every task this process serves)

    from skillrun.execute import guard, worker

    hello: dict = {"ready": True, "pid": os.getpid(), "sandbox": info}
    if role != "judge":
        guard.baseline()  # before any kernel module is imported in this process
        # The profiler's first session costs ~2 s (Kineto start-up); the integrity checks use it, so pay it
        # here, once. Host activity only: no device is touched.
        import torch.profiler

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            pass
    if role == "references" and canary:
        from skillrun.execute import slot_server
        from skillrun.execute.session import CANARY_CALIBRATION

        hello["canary_ms"] = slot_server.calibrate_canary(canary["timer"], canary["device"], CANARY_CALIBRATION)
    import threading

    threads = {t.ident for t in threading.enumerate()}  # this process's own (the lifeline's watch, if any)
    hello["imports_s"] = round(time.perf_counter() - t0, 4)
    proto_out.write(json.dumps(hello) + "\n")
    proto_out.flush()
    for line in proto_in:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            with open(req["task"]) as fh:
                kind = json.load(fh).get("kind")
        except (OSError, ValueError, AttributeError):
            kind = None
        _redirect(req.get("stdout"), 1)
        _redirect(req.get("stderr"), 2)
        code = 1
        try:
            code = worker.main(["worker", req["task"], req["result"]], confined=info)
        except BaseException:  # noqa: BLE001 - a task's SystemExit or error is that task's, not the server's
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        if kind in ("slots", "probe") or code != 0 or _failed(req["result"]):
            # Large input sets (or a traceback's frames holding tensors) go now, not at some later
            # collection; a plain task frees its tensors by reference counting (a full collection
            # with torch loaded costs ~50 ms, which every task would otherwise pay).
            gc.collect()
        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - a broken device shows in the next task, which then fails on its own
            pass
        _redirect(None, 1)
        _redirect(None, 2)
        left = _left_behind(info, threads)
        answer = {"exit": int(code) if isinstance(code, int) else 1}
        if left:
            answer["ended"] = left
        proto_out.write(json.dumps(answer) + "\n")
        proto_out.flush()
        if left:
            # As in a child of its own, nothing a task started outlives it: this process ends, its PID namespace
            # (and whatever the task left in it) with it, and the next task gets a fresh server.
            return 0
    return 0


def _left_behind(info: dict, threads: set) -> str | None:
    """What the task left running in this server: processes in its PID namespace besides the namespace's init and
    this process, Python threads that were not here when it started; None when nothing."""
    import threading

    new = [t.name for t in threading.enumerate() if t.ident not in threads and t.is_alive()]
    procs = []
    if info.get("pid_namespace") and info.get("private_proc"):
        try:
            procs = [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) not in (1, os.getpid())]
        except OSError:
            procs = []
        procs = [p for p in procs if _state(p) not in ("Z", "X", None)]
    if not new and not procs:
        return None
    return ", ".join(([f"{len(procs)} process(es)"] if procs else []) + ([f"thread(s) {', '.join(new)[:200]}"] if new else []))


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def _failed(result: str) -> bool:
    try:
        with open(result) as fh:
            return json.load(fh).get("status") == "error"
    except (OSError, ValueError, AttributeError):
        return True


if __name__ == "__main__":
    sys.exit(main(sys.argv))
