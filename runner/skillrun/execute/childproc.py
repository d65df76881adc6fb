"""What every harness child needs from its parent: the environment it starts with, the tail of its
output for an error message, and its exit status in words. Shared by the task runner (isolate.py)
and the launch watchdog (watchdog.py), which both start children, so neither imports the other."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from skillrun.io import lifeline, sandbox

TAIL_CHARS = 3000


# A child's result, progress and output files are the child's to write, and a port runs in it.
RESULT_MAX = 64 << 20


def read_child_file(path: Path, max_bytes: int = RESULT_MAX, offset: int = 0) -> bytes:
    """A file a child wrote, read so that it cannot hold the parent: opened without blocking and without
    following a link, refused unless it is a regular file, at most ``max_bytes`` from ``offset``.
    (A FIFO put where a result should be would block a plain open until someone writes it.)
    OSError when it is missing or not a regular file."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{Path(path).name} is not a regular file")
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        chunks, left = [], max_bytes
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _tail(path: Path) -> str:
    try:
        size = os.stat(path).st_size
        data = read_child_file(path, TAIL_CHARS * 8, max(0, size - TAIL_CHARS * 8))
    except OSError:
        return ""
    text = data[-TAIL_CHARS * 2:].decode("utf-8", "replace")
    # torch's profiler prints USDT lines to stderr; they are noise in an error message.
    lines = [ln for ln in text.splitlines() if "USDT:" not in ln]
    return "\n".join(lines)[-TAIL_CHARS:]


def child_env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """The parent's environment, scrubbed, with the parent's import path so the child sees the same modules."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths + ([old] if old else [])))
    env.setdefault("PYTHONUNBUFFERED", "1")
    # A timed session runs two children side by side (the accused's and the references', session.py): an
    # OpenMP pool that spins after each parallel region would take the CPU from the other one's launch.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    # No credential reaches a child (skillrun.io.sandbox): ports run in these children, and a port can
    # read its own process's memory, where the environment it was started with stays.
    return lifeline.child_env(sandbox.scrub_env(env))  # the child dies with this process (parent-death signal + watch)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        what = {"SIGSEGV": "segmentation fault", "SIGABRT": "abort", "SIGKILL": "killed (out of memory?)",
                "SIGBUS": "bus error", "SIGFPE": "arithmetic fault", "SIGILL": "illegal instruction"}.get(name, "")
        return f"child died from {name}" + (f" ({what})" if what else "")
    return f"child exited with status {code} without a result"
