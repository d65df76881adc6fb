"""What every harness child needs from its parent: the environment it starts with, the tail of its
output for an error message, and its exit status in words. Shared by the task runner (isolate.py)
and the launch watchdog (watchdog.py), which both start children, so neither imports the other."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from skillrun.io import lifeline

TAIL_CHARS = 3000


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    text = data[-TAIL_CHARS * 2:].decode("utf-8", "replace")
    # torch's profiler prints USDT lines to stderr; they are noise in an error message.
    lines = [ln for ln in text.splitlines() if "USDT:" not in ln]
    return "\n".join(lines)[-TAIL_CHARS:]


def child_env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """The parent's environment, with the parent's import path so the child sees the same modules."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths + ([old] if old else [])))
    env.setdefault("PYTHONUNBUFFERED", "1")
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return lifeline.child_env(env)  # the child dies with this process (parent-death signal + watch)


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
