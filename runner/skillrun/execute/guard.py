"""In-process guards of a session's child: the harness's own torch calls shielded from the port, and
checks between rounds that the port left nothing running in the harness's way.

A port is imported into the process that launches it; whatever it leaves behind runs when the
harness next calls torch or a function of its own:

* a ``TorchFunctionMode`` or ``TorchDispatchMode`` pushed when the port was built sees every torch
  call the harness makes afterwards: the commitment's read of an output, the copy of the real
  activations after ``prepare()``, the input checksums. :func:`harness` turns torch functions
  (subclasses and modes) and Python dispatch off around every such call, so no mode runs there, and
  :meth:`Guard.check` fails the session when a mode is still on the stack after the port returned.
* a thread the port started (to hold the GIL, to compute between rounds, to contend with the
  references): :meth:`Guard.check` compares the Python threads and the process's native threads
  with those present once every slot had run.
* a harness function replaced (``time.perf_counter``, the commitment, the hand-over, the checks):
  :meth:`Guard.check` compares the functions it recorded before the port was imported with what
  their modules hold now.

These checks run in the port's process, so a port that rewrites this module (or the C state they
read) can hide from them; they close the cheap routes, and the decisive facts are taken outside the
process: the parent's clock bounds every claimed time, the references run in a process that never
imports a port, and the referee judges outputs it holds commitments to (session.py, referee.py).
"""
from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

# Functions the session's children must not see replaced: module -> attribute names (a class's method as
# "Class.method").
WATCHED = {
    "time": ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "sleep"),
    "hashlib": ("sha256", "new"),
    "skillrun.execute.integrity": ("output_digest", "bytes_digest", "digests", "changed", "aliasing_gate",
                                   "split_events", "profile_names", "RoundObserver.__call__"),
    "skillrun.execute.judge": ("write_output", "write_refusal", "plain"),
    "skillrun.execute.parity": ("poison", "compare"),
    "skillrun.execute.operands": ("prepare_blind",),
    "skillrun.execute.input_sets": ("InputSets.check", "InputSets.refresh", "InputSets._write"),
    "skillrun.execute.timing": ("EventTimer.measure", "EventTimer.begin_round", "EventTimer.end_round",
                                "WallTimer.measure", "TorchDevice.event", "TorchDevice.synchronize",
                                "LaunchTimers.launch", "LaunchTimers.timer"),
    "skillrun.execute.slot_server": ("Server.launch", "Server.commit", "Server.handle"),
    "skillrun.execute.guard": ("Guard.check", "harness", "baseline"),
    "socket": ("socket.sendall", "socket.recv"),
    "json": ("dumps", "loads"),
}


def _resolve(module: str, name: str) -> Any:
    obj: Any = sys.modules.get(module)
    for part in name.split("."):
        obj = getattr(obj, part, None) if obj is not None else None
    return obj


@contextmanager
def harness() -> Iterator[None]:
    """The harness's own torch calls: no ``__torch_function__`` (subclass or mode) and no Python
    dispatch (``TorchDispatchMode``, ``__torch_dispatch__``) runs inside."""
    import torch

    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python) | torch._C.DispatchKeySet(torch._C.DispatchKey.PythonTLSSnapshot)
    with torch._C.DisableTorchFunction(), torch._C._ExcludeDispatchKeyGuard(keys):
        yield


def _native_threads() -> int | None:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


class Guard:
    """What the process looked like before the port was imported, and the check against it."""

    def __init__(self) -> None:
        import torch

        self._tf_len = torch._C._len_torch_function_stack
        self._td_len = torch._C._len_torch_dispatch_stack
        for m in WATCHED:  # the harness's modules are imported before the port is; socket/json/hashlib too
            if m not in sys.modules and m.startswith("skillrun."):
                __import__(m)
        self.functions = {f"{m}.{n}": _resolve(m, n) for m, names in WATCHED.items() for n in names}
        self.functions = {k: v for k, v in self.functions.items() if v is not None}
        self.codes = {k: getattr(v, "__code__", None) for k, v in self.functions.items()}
        # Python threads: before any kernel module is imported, so none a port starts when built is "ours"
        self.threads: set[int] = {t.ident for t in threading.enumerate() if t.ident is not None}
        self.native: int | None = None

    def settle(self) -> None:
        """Count the native threads once every slot has run and been profiled (torch's, the profiler's and
        the libraries' pools exist by then); from here on the Python and native threads are compared."""
        self.native = _native_threads()

    def check(self) -> list[str]:
        """Why the process is not as the harness left it (an empty list when it is)."""
        problems = []
        tf, td = self._tf_len(), self._td_len()
        if tf:
            problems.append(f"{tf} torch function mode(s) left active (TorchFunctionMode): port code would run "
                            "inside the harness's own torch calls")
        if td:
            problems.append(f"{td} torch dispatch mode(s) left active (TorchDispatchMode): port code would run "
                            "inside the harness's own torch calls")
        new = [t for t in threading.enumerate() if t.ident not in self.threads and t.is_alive()
               and not t.name.startswith("skillrun-digest")]
        if new:
            problems.append("new thread(s) running between rounds: " + ", ".join(sorted({t.name for t in new}))[:200])
        if self.native is not None:
            native = _native_threads()
            if native is not None and native > self.native + len(new):
                problems.append(f"{native - self.native} new native thread(s) running between rounds")
        changed = []
        for k, v in self.functions.items():
            now = _resolve(*_split(k))
            if now is not v or getattr(now, "__code__", None) is not self.codes.get(k):
                changed.append(k)
        if changed:
            problems.append("harness function(s) replaced: " + ", ".join(changed[:6]))
        return problems


_BASELINE: Guard | None = None


def baseline() -> Guard:
    """This process's guard: what its harness functions, torch modes and threads were before any kernel module
    was imported in it. A task child takes it at its session's build; a card's long-lived server (serve.py)
    when it starts, before its first task, so whatever a port of an earlier shape of the card replaced or left
    running in the process is found by every later session there (sessions.py)."""
    global _BASELINE
    if _BASELINE is None:
        _BASELINE = Guard()
    return _BASELINE


def _split(key: str) -> tuple[str, str]:
    for m in sorted(WATCHED, key=len, reverse=True):
        if key.startswith(m + "."):
            return m, key[len(m) + 1:]
    return key.rpartition(".")[0], key.rpartition(".")[2]
