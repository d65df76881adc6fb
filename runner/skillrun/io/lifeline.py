"""Helper processes die with the process that started them, and leave no temporary files behind.

A SIGKILL (or an OOM kill, or a SIGTERM with no handler) of `skill-run` runs no ``finally`` and no
``atexit``: its zygote, task children, tuning lanes and trace-scanning workers would otherwise
live on under PID 1, one of them at 100 % CPU in a hung port. Every such process calls
:func:`die_with_parent` first thing, which

* asks the kernel to SIGKILL it when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``, through
  ctypes). The kernel ties that request to the parent *thread* that forked, so it is used only
  when the parent says it spawned from its main thread (:func:`child_env` records that);
* checks that the parent is still the one that started it (it may have died before the request);
* watches the parent from a daemon thread as well (``getppid()`` changes when the parent is gone),
  the portable fallback and the only one when the spawning thread was not the main thread. On
  the parent's death it kills its own process group (when it leads one, as our children do:
  ``start_new_session``) and exits.

Temporary folders of our helpers carry the creating process's id (``skillrun-<kind>-<pid>-…``);
:func:`sweep_stale` removes those whose process is gone (called whenever a new one is made).
"""
from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

PARENT_ENV = "SKILLRUN_PARENT_PID"
DEATHSIG_ENV = "SKILLRUN_PDEATHSIG"
_PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 0.2


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a helper process this process is about to start (see :func:`die_with_parent`)."""
    env = dict(env)
    env[PARENT_ENV] = str(os.getpid())
    env[DEATHSIG_ENV] = "1" if threading.current_thread() is threading.main_thread() else "0"
    return env


def _set_pdeathsig() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _gone() -> None:
    """The parent is dead: take this process's own group (our children lead one) with us."""
    try:
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
    finally:
        os._exit(1)


def _watch(parent: int) -> None:
    while True:
        time.sleep(WATCH_INTERVAL_S)
        if os.getppid() != parent:
            _gone()


def die_with_parent(parent: int | None = None, *, deathsig: bool | None = None) -> bool:
    """Make this process end when ``parent`` does. ``parent`` defaults to the pid the starting
    process put in the environment; without either, nothing is done (returns False).

    Call it again in a forked child (threads do not survive ``fork``).
    """
    if parent is None:
        text = os.environ.get(PARENT_ENV, "")
        if not text.isdigit():
            return False
        parent = int(text)
        if deathsig is None:
            deathsig = os.environ.get(DEATHSIG_ENV) == "1"
    # Not handed on: a grandchild must be told its own parent, never ours.
    os.environ.pop(PARENT_ENV, None)
    os.environ.pop(DEATHSIG_ENV, None)
    if deathsig:
        _set_pdeathsig()
    if os.getppid() != parent:  # the parent died before we could ask
        _gone()
    threading.Thread(target=_watch, args=(parent,), name="skillrun-lifeline", daemon=True).start()
    return True


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (ours or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(kind: str, base: str | None = None) -> list[str]:
    """Remove ``skillrun-<kind>-<pid>-*`` folders and files in the temp folder whose process has exited."""
    base = base or tempfile.gettempdir()
    prefix = f"skillrun-{kind}-"
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or pid_alive(int(pid_text)):
            continue
        path = Path(base) / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        # Only real folders and files of this user (mkdtemp/mkstemp make those; a link is not ours).
        if st.st_uid != os.getuid() or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            continue
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                path.unlink()
            except OSError:
                continue
        removed.append(name)
    return removed


def temp_dir(kind: str) -> tempfile.TemporaryDirectory:
    """A temporary folder named for this process (so a later run can tell it is stale), after
    removing the stale folders of that kind left by killed runs. The process's janitor
    (:mod:`skillrun.io.janitor`) removes it at once if this process is killed."""
    from skillrun.io import janitor

    janitor.ensure()
    sweep_stale(kind)
    return tempfile.TemporaryDirectory(prefix=f"skillrun-{kind}-{os.getpid()}-")
