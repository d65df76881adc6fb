"""A task server: one helper process that runs harness tasks one after another (sessions.py).

Started by :class:`skillrun.execute.sessions.TaskServer` as ``python -m skillrun.execute.serve ROLE``
in its own session; it imports torch and the worker once (the cost every spawned task child used
to pay again), answers ``{"ready": true, "imports_s": s}``, then serves one request per line:
``{"task", "result", "stdout", "stderr"}``. Each task runs exactly as in a child of its own
(``worker.main``: the result file is written the same way); its output goes to the task's own
files, and the answer ``{"exit": code}`` follows on the protocol pipe, which the task cannot see
(it was moved off fds 0 and 1 before any task ran). After each task the server returns the device's
cached memory (after a full garbage collection where a task held large input sets or failed), so
the next shape starts with the memory the last one freed.

A task that crashes or hangs takes this process with it; the parent records that task's fault and
starts a fresh server for the next one.
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

    lifeline.die_with_parent()  # the harness's pid, from the environment it gave us
    role = argv[1] if len(argv) > 1 else "accused"
    # The protocol moves to private descriptors; fd 0 reads nothing, fds 1 and 2 are the task's files.
    proto_in = os.fdopen(os.dup(0), "r")
    proto_out = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _redirect(None, 1)
    _redirect(None, 2)
    t0 = time.perf_counter()
    import torch  # noqa: F401  (once for every task this process serves)

    from skillrun.execute import worker

    if role == "accused":
        # The profiler's first session costs ~2 s (Kineto start-up); the session's integrity checks use
        # it, so pay it here, once. Host activity only: no device is touched.
        import torch.profiler

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            pass
    proto_out.write(json.dumps({"ready": True, "imports_s": round(time.perf_counter() - t0, 4), "pid": os.getpid()}) + "\n")
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
            code = worker.main(["worker", req["task"], req["result"]])
        except BaseException:  # noqa: BLE001 - a task's SystemExit or error is that task's, not the server's
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        if kind in ("session", "probe") or code != 0 or _failed(req["result"]):
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
        proto_out.write(json.dumps({"exit": int(code) if isinstance(code, int) else 1}) + "\n")
        proto_out.flush()
    return 0


def _failed(result: str) -> bool:
    try:
        with open(result) as fh:
            return json.load(fh).get("status") == "error"
    except (OSError, ValueError, AttributeError):
        return True


if __name__ == "__main__":
    sys.exit(main(sys.argv))
