"""What a killed run leaves: no temporary folder, and a note the next run reads out.

A SIGKILL (or an OOM kill) of `skill-run` runs no ``finally``: its temporary folders
(``skillrun-<kind>-<pid>-…``, :mod:`skillrun.io.lifeline`) would stay until a later run swept them,
and what it was doing would be lost without a word. So the first temporary folder a process makes
starts its janitor: a small process (no torch, the standard library only) that holds the read end of a
pipe whose write end only the harness holds. The harness writes what it is running (a card, a recipe,
a shape) as it starts each item and ``done`` when it ends. When the pipe closes, the harness is gone:

* it ended normally (said ``bye``): nothing to do but sweep what may remain;
* it was killed: the janitor removes every ``skillrun-*-<pid>-*`` of it at once and, if an item was
  running, writes a note (``<state>/lost/<pid>.json``) that the next run reads (:func:`lost_runs`),
  says (the record's notes, ``skill-run``'s stderr) and removes.

A stopped harness (SIGSTOP) is not dead: its janitor waits, as its children do (they end at their own
deadlines). The sandbox keeps a port from stopping or killing the harness at all.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()
_PIPE: dict[int, Any] = {}  # pid -> the write end (a fork's child starts its own janitor)


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "skillrun" / "lost"


def _write(msg: dict) -> None:
    fh = _PIPE.get(os.getpid())
    if fh is None:
        return
    try:
        fh.write((json.dumps(msg) + "\n").encode())
        fh.flush()
    except (OSError, ValueError):
        _PIPE.pop(os.getpid(), None)


def ensure() -> None:
    """Start this process's janitor once (called by lifeline.temp_dir)."""
    with _LOCK:
        if os.getpid() in _PIPE or os.environ.get("SKILLRUN_NO_JANITOR"):
            return
        try:
            # Run as a script (this file imports the standard library only): no import path to find, no
            # site start-up (-S), whatever way skillrun itself was installed.
            proc = subprocess.Popen([sys.executable, "-S", os.path.abspath(__file__), str(os.getpid()), tempfile.gettempdir(),
                                     str(state_dir())], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                                    env={k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "XDG_STATE_HOME")})
        except OSError:
            return
        _PIPE[os.getpid()] = proc.stdin
        import atexit

        atexit.register(_bye)


def _bye() -> None:
    _write({"bye": True})


def running(what: str) -> None:
    """The harness started an item (said to the janitor: lost if the harness is killed now)."""
    _write({"running": what[:500], "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def done() -> None:
    _write({"done": True})


def lost_runs(consume: bool = True) -> list[str]:
    """What killed runs were doing when they died (one line each); read once, then removed."""
    d = state_dir()
    out = []
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        p = d / name
        try:
            if not stat.S_ISREG(os.lstat(p).st_mode):
                continue
            note = json.loads(p.read_text()[:10000])
            out.append(f"a previous run (pid {note.get('pid')}) was killed at {note.get('killed')} while running "
                       f"{note.get('running')} (since {note.get('since')}): its results were lost; its temporary "
                       f"folders were removed ({note.get('removed', 0)})")
        except (OSError, ValueError, AttributeError):
            continue
        if consume:
            try:
                p.unlink()
            except OSError:
                pass
    return out


def _sweep(pid: int, tmp: str) -> int:
    n = 0
    try:
        names = os.listdir(tmp)
    except OSError:
        return 0
    for name in names:
        if not name.startswith("skillrun-") or f"-{pid}-" not in name:
            continue
        parts = name.split("-")
        if len(parts) < 3 or parts[2] != str(pid):
            continue
        path = os.path.join(tmp, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != os.getuid():
            continue
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                continue
        n += 1
    return n


def _main(pid: int, tmp: str, state: str) -> int:  # pragma: no cover - runs in the janitor process
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # it outlives the harness by design, for the moment it takes
    current: dict | None = None
    bye = False
    for raw in sys.stdin.buffer:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        if msg.get("running"):
            current = msg
        elif msg.get("done"):
            current = None
        elif msg.get("bye"):
            bye = True
    # The pipe closed: the harness is gone.
    if not bye:
        time.sleep(0.3)  # its children die with it (parent-death signal): let them go before their folders
    removed = _sweep(pid, tmp)
    if not bye and current is not None:
        Path(state).mkdir(parents=True, exist_ok=True)
        note = {"pid": pid, "running": current.get("running"), "since": current.get("since"), "removed": removed,
                "killed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmpf = Path(state) / f".{pid}.json.part"
        tmpf.write_text(json.dumps(note))
        os.replace(tmpf, Path(state) / f"{pid}.json")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
