"""A pre-warmed parent for harness children: imports torch once, then forks one child per task.

Starting a fresh interpreter costs seconds (importing torch), which dominates CPU-only runs of
small tasks. The zygote pays that once; each task is still its own process (``os.fork``) in its
own session, so a segfault, abort or hang still fails only that task. The zygote never imports a
kernel module and never initializes a GPU, so each child creates its own device context. Triton
reads ``TRITON_INTERPRET`` at every ``@triton.jit`` decoration, its own library's included (at
``import triton``, which the profiler warm-up below triggers), so the harness starts one zygote per
environment with the variable already chosen.

Protocol (one JSON object per line): the harness writes
``{"task": path, "result": path, "stdout": path, "stderr": path, "env": {...}, "timeout_s": s}``;
the zygote answers ``{"exit": code, "timed_out": bool}`` (code < 0: killed by that signal).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time


def _child(req: dict, zygote: int) -> None:
    os.setsid()
    # The zygote's request pipe is not the task's to read (a port could take the next task's request).
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, key in ((1, "stdout"), (2, "stderr")):
        f = os.open(req[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    for k, v in (req.get("env") or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    code = 1
    try:
        from skillrun.execute import worker

        # worker.main enters the sandbox first (one thread only: before any watch thread starts), then
        # ties this task to the zygote (forked from its main thread: the parent-death signal holds).
        code = worker.main(["worker", req["task"], req["result"]], parent=zygote, deathsig=True)
    except BaseException:  # noqa: BLE001 - anything left is this task's failure, reported by exit code
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _end_group(pgid: int) -> None:
    """Whatever the task's process left in its group (a port's helper process) ends with it: nothing
    of the port outlives its task to touch the next one's files (the judge's, judge.py)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait(pid: int, timeout_s: float) -> tuple[int, bool]:
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _end_group(pid)
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)  # the child's own session/group
            except ProcessLookupError:
                pass
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status), True
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def main() -> int:
    from skillrun.io import lifeline

    lifeline.die_with_parent()  # the harness's pid, from the environment it gave us
    import torch  # noqa: F401  (the point of the zygote: children inherit it imported)
    import torch.profiler  # noqa: F401

    import skillrun.execute.worker  # noqa: F401

    # The profiler's first session costs ~2 s (Kineto start-up); pay it here once so every forked
    # child's integrity check starts warm. Host activity only: no device is touched.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        pass

    out = sys.stdout
    kernels = [m for m in sys.modules if m.startswith("skillrun_kernels.") and m != "skillrun_kernels.protocol"]
    out.write(json.dumps({"ready": True, "kernels_loaded": kernels}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        me = os.getpid()
        pid = os.fork()
        if pid == 0:
            _child(req, me)
        code, timed_out = _wait(pid, float(req.get("timeout_s", 600)))
        out.write(json.dumps({"exit": code, "timed_out": timed_out}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
