"""Confinement of the processes that run untrusted code: ports, and the references timed beside them.

A task child calls :func:`enter` before it imports any kernel module. What it then runs gets, each
piece only where the kernel offers it (:func:`support` says which; the run records it and says
*unsandboxed* when nothing is available):

* **a scrubbed environment** (:func:`scrub_env`, also applied by the harness to every child it
  starts): variable names on an allowlist, minus anything that looks like a credential. The
  environment is scrubbed before the child is started, so no copy of a secret is in its memory.
* **its own user, PID, mount and IPC namespaces** (``unshare``): it sees only its own processes
  (a private ``/proc``; the harness's ``/proc/<pid>/environ`` is not there to read), gets a private
  ``/dev/shm``, and everything it starts ends with it: the namespace's first process is a small
  init of ours that dies with the harness (parent-death signal), and when a PID namespace's init
  dies the kernel kills every process in it, a ``setsid`` daemon included. The task runs as the
  init's child, so it can neither signal the init nor change the init's parent-death signal.
* **Landlock** (an LSM, Linux >= 5.13): the task may read and execute system folders and its
  import path, read and write its own folders (its task folder, its hand-over folder, a compile
  cache for its role) and nothing else: the knowledge base, the kernels' source, the import path
  and the harness's files are read-only, other tasks' folders and the home folder invisible. FIFOs,
  sockets, device nodes and links cannot be made; no process outside its domain can be traced
  (which also closes ``/proc/<pid>/mem`` and ``environ``); from ABI 6 on, no signal and no
  abstract Unix socket reaches outside.

Everything here is plain system calls through ctypes (``unshare``, ``mount``, ``landlock_*``,
``prctl``, ``capset``); nothing is installed. Entering is irreversible, so :func:`probe` (what
``skill-run doctor`` reports) enters it in a throw-away child and checks that each piece holds.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable

# ---------------------------------------------------------------------------------------- constants
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID = 0x00020000, 0x08000000, 0x10000000, 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
# landlock_create_ruleset, landlock_add_rule, landlock_restrict_self: the same numbers on every
# architecture (added to the common syscall table)
_SYS_CREATE, _SYS_ADD, _SYS_RESTRICT = 444, 445, 446
_LL_VERSION = 1
_LL_RULE_PATH_BENEATH = 1
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REMOVE_DIR, _REMOVE_FILE, _MAKE_CHAR, _MAKE_DIR, _MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
_MAKE_SOCK, _MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM, _REFER, _TRUNCATE, _IOCTL_DEV = (1 << 9, 1 << 10, 1 << 11,
                                                                              1 << 12, 1 << 13, 1 << 14, 1 << 15)
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1, 2
_READ = _EXECUTE | _READ_FILE | _READ_DIR
# In its own folders: regular files and folders only (a FIFO left for the harness to open would block it)
_OWN = _READ | _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE_DIR | _MAKE_REG | _TRUNCATE
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV  # what a rule on a file may grant

# Top-level folders never readable from inside (temporary files of other tasks, home folders with
# credentials, runtime sockets); the import path and the interpreter are added back by name.
_HIDDEN_TOP = frozenset({"tmp", "home", "root", "run", "var", "mnt", "media", "srv", "boot", "lost+found", "snap"})

# Environment: names kept as they are, and prefixes of the device stacks' and libraries' settings.
_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TZ", "SHELL", "TMPDIR",
    "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE",
    "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "XDG_CACHE_HOME", "COMPILE_ONLY",
    "SKILLRUN_PARENT_PID", "SKILLRUN_PDEATHSIG", "SKILLRUN_SUSTAIN_MS", "SKILLRUN_GIT_REVISION", "SKILLRUN_CACHE",
    "SKILLRUN_DEBUG", "SKILLRUN_KB", "SKILLRUN_ISA_DIR", "SKILLRUN_LANE_PID", "SKILLRUN_TEST_TAG",
    "SKILLRUN_COMPILE_SEED", "SKILLRUN_SERVER_CANARY", "SKILLRUN_SANDBOX_WITHOUT",
})
_ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "ROCM_", "HSA_", "AMD_", "GPU_", "TRITON_", "TORCH_",
                 "PYTORCH_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "FLYDSL_", "CUBLAS_", "CUDNN_", "NCCL_")


# The pieces a machine's GPU stack may not survive, which :func:`gpu_fit` leaves out (the first H200 run
# inside the full sandbox failed every CUDA call with cudaErrorOperatingSystem). The harness finds the
# strongest combination under which the device initialises, tells its children through WITHOUT_ENV, and
# the artifact says what was left out and why.
PIECES = ("private_mounts", "ipc", "landlock", "namespaces")
WITHOUT_ENV = "SKILLRUN_SANDBOX_WITHOUT"
CANDIDATES: tuple[tuple[str, ...], ...] = ((), ("private_mounts",), ("ipc",), ("private_mounts", "ipc"), ("landlock",),
                                           ("namespaces",), ("namespaces", "landlock"))


def without_from_env() -> frozenset[str]:
    """The pieces the harness told this child to leave out (unknown names ignored)."""
    return frozenset(p for p in os.environ.get(WITHOUT_ENV, "").split(",") if p in PIECES)


class SandboxError(RuntimeError):
    """The sandbox was required and could not be entered."""


def scrub_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with only allowlisted names, and none whose name or value looks like a credential."""
    from skillrun.io.redact import is_secret_key, scrub_text

    out = {}
    for k, v in env.items():
        if not (k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)):
            continue
        if is_secret_key(k) or scrub_text(v) != v:
            continue
        out[k] = v
    return out


# ---------------------------------------------------------------------------------------- syscalls
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _fail(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: not available)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        r = _libc().syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_LL_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(r))


def _handled(abi: int) -> int:
    bits = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        bits |= _REFER
    if abi >= 3:
        bits |= _TRUNCATE
    if abi >= 5:
        bits |= _IOCTL_DEV
    return bits


def _landlock(libc: Any, abi: int, read: Iterable[str], own: Iterable[str], devices: Iterable[str]) -> None:
    handled = _handled(abi)
    scoped = (_SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("=QQQ", handled, 0, scoped)
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    buf = ctypes.create_string_buffer(attr[:size], size)
    fd = libc.syscall(_SYS_CREATE, buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise _fail("landlock_create_ruleset")
    try:
        def rule(path: str, access: int) -> None:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return  # a path that does not exist here grants nothing
            try:
                if not os.path.isdir(path):
                    access &= _FILE_RIGHTS
                access &= handled
                pb = struct.pack("=Qi", access, pfd)
                if libc.syscall(_SYS_ADD, ctypes.c_int(fd), ctypes.c_int(_LL_RULE_PATH_BENEATH),
                                ctypes.create_string_buffer(pb, len(pb)), ctypes.c_uint32(0)) != 0:
                    raise _fail(f"landlock_add_rule {path}")
            finally:
                os.close(pfd)

        for p in read:
            rule(p, _READ)
        for p in devices:
            rule(p, _READ | _WRITE_FILE | _IOCTL_DEV)
        for p in own:
            rule(p, _OWN | (_REFER if abi >= 2 else 0))
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _fail("prctl(NO_NEW_PRIVS)")
        if libc.syscall(_SYS_RESTRICT, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise _fail("landlock_restrict_self")
    finally:
        os.close(fd)


def _drop_capabilities(libc: Any) -> bool:
    """No capability left in the task's user namespace (it needed them only to mount /proc)."""
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two {effective, permitted, inheritable} words, all zero
    return libc.syscall(126 if os.uname().machine == "x86_64" else 91, ctypes.create_string_buffer(header, 8),
                        ctypes.create_string_buffer(data, 24)) == 0


# ---------------------------------------------------------------------------------------- what is here
_SUPPORT: dict[str, Any] | None = None


def _try_namespaces() -> str | None:
    """None when this process may create user+PID+mount namespaces (tried in a throw-away child)."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only makes system calls and leaves
        os.close(r)
        try:
            msg = b""
            libc = _libc()
            if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWPID | _CLONE_NEWNS | _CLONE_NEWIPC) != 0:
                msg = str(_fail("unshare")).encode()
        except BaseException as exc:  # noqa: BLE001
            msg = repr(exc).encode()
        os.write(w, msg[:500])
        os._exit(0)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as fh:
            msg = fh.read().decode("utf-8", "replace")
    finally:
        os.waitpid(pid, 0)
    return msg or None


def support() -> dict[str, Any]:
    """What this machine offers: ``namespaces`` (None or why not), ``landlock_abi``, ``seccomp``,
    ``bwrap``; ``level`` is ``full`` (namespaces and Landlock), ``partial`` or ``none``."""
    global _SUPPORT
    if _SUPPORT is None:
        import shutil

        ns_error = _try_namespaces()
        abi = landlock_abi()
        seccomp = None
        try:
            seccomp = any(line.startswith("Seccomp:") for line in Path("/proc/self/status").read_text().splitlines())
        except OSError:
            seccomp = False
        level = "full" if (ns_error is None and abi >= 1) else ("partial" if (ns_error is None or abi >= 1) else "none")
        _SUPPORT = {"level": level, "namespaces": None if ns_error is None else ns_error, "landlock_abi": abi,
                    "seccomp": bool(seccomp), "bwrap": shutil.which("bwrap")}
    return dict(_SUPPORT)


def describe(sup: dict[str, Any] | None = None) -> str:
    """One line: what a sandboxed task gets on this machine."""
    s = sup or support()
    parts = []
    parts.append("user/PID/mount/IPC namespaces" if s["namespaces"] is None else f"no namespaces ({s['namespaces']})")
    parts.append(f"Landlock ABI {s['landlock_abi']}" if s["landlock_abi"] else "no Landlock")
    return ", ".join(parts)


def record(mode: str, sup: dict[str, Any] | None = None, gpu: bool = False) -> dict[str, Any]:
    """What the artifact says about the confinement of the run's untrusted processes (``gpu``: on a device,
    what :func:`gpu_fit` left out, which is what the harness told the children)."""
    s = sup or support()
    if mode == "off":
        return {"level": "none", "unsandboxed": "the sandbox was turned off for this run (sandbox=off)",
                "env_scrubbed": True}
    out: dict[str, Any] = {"level": s["level"], "mechanism": describe(s), "env_scrubbed": True,
                           "pid_namespace": s["namespaces"] is None, "landlock_abi": s["landlock_abi"]}
    fit = gpu_fit() if gpu and mode == "auto" and s["level"] != "none" else None
    left = sorted(fit["without"]) if fit else []
    if left:
        why = next((t.get("error") for t in fit["tried"] if not t.get("ok")), None)
        out.update({"level": "partial", "left_out": left,
                    "pid_namespace": s["namespaces"] is None and "namespaces" not in left,
                    "landlock_abi": 0 if "landlock" in left else s["landlock_abi"],
                    "unsandboxed": ("partly: the device does not initialise inside the full sandbox on this machine, so "
                                    f"{', '.join(left)} {'was' if len(left) == 1 else 'were'} left out"
                                    + (f" (inside it: {str(why)[:300]})" if why else ""))})
        return out
    if s["level"] == "none":
        out["unsandboxed"] = ("this machine offers neither user namespaces nor Landlock: the port's process can "
                              "write the knowledge base, read other processes and outlive the run")
    elif s["level"] == "partial":
        out["unsandboxed"] = ("partly: " + ("no Landlock (the file system is open to the port)" if not s["landlock_abi"]
                                            else "no PID namespace (other processes are visible, a daemon can outlive the run)"))
    return out


# ---------------------------------------------------------------------------------------- entering
def cache_dir(role: str) -> Path:
    """The compile cache (Triton, CUDA JIT) of one role's sandboxed tasks: the accused share one,
    the references another, so a port can poison no cache a reference reads."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "skillrun" / "sandbox" / role
    base.mkdir(parents=True, exist_ok=True)
    return base


def _readable() -> list[str]:
    tops = []
    try:
        tops = [f"/{n}" for n in os.listdir("/") if n not in _HIDDEN_TOP]
    except OSError:
        pass
    extra = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable),
             os.path.realpath(sys.executable)]
    extra += [p for p in sys.path if p]
    extra += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # Our packages wherever they are: an editable install maps them through an import hook, not sys.path
    # (a clone under /home would otherwise be unreadable from inside).
    import importlib.util

    for name in ("skillrun", "skillrun_kernels", "skillrun_kb"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        extra += list(getattr(spec, "submodule_search_locations", None) or [])
    return [p for p in dict.fromkeys(tops + extra) if p and os.path.exists(p)]


def enter(writable: Iterable[str | os.PathLike], role: str = "accused", mode: str = "require", *,
          parent: int | None = None, deathsig: bool = False, triton_cache: str | None = None,
          without: Iterable[str] | None = None) -> dict[str, Any]:
    """Confine this process (a task child, before it imports any kernel module); returns what held.

    ``mode``: ``require`` raises SandboxError unless namespaces and Landlock both hold; ``auto``
    takes what the machine offers; ``off`` only scrubs the environment. With namespaces this
    process forks twice (the namespace's init, then the task) and only the task returns from here:
    the two processes above it wait, pass its exit status on and never return. ``parent`` (and
    ``deathsig``, see :mod:`skillrun.io.lifeline`) is the process this one must die with; with
    namespaces the process that stays outside carries that watch (``info["lifeline"]``), and the
    task is tied to it through the init. ``triton_cache``: Triton's cache is that folder (writable) instead of the
    role's (compile_ahead.py's jobs, which write the carried folder). The accused role's cache takes what it lacks
    from a carried folder compiled ahead (skillrun.io.compile_seed, ``SKILLRUN_COMPILE_SEED``), read-only inside.
    ``without``: pieces (:data:`PIECES`) to leave out, by default those the harness named in WITHOUT_ENV
    after :func:`gpu_fit` found the device does not initialise with them; ``info["left_out"]`` says which.
    """
    skip = frozenset(without) if without is not None else without_from_env()
    kept = scrub_env(dict(os.environ))  # (the harness scrubbed it before starting us: defence in depth)
    os.environ.clear()
    os.environ.update(kept)
    own = [os.path.realpath(str(p)) for p in writable if p]
    info: dict[str, Any] = {"mode": mode, "env_scrubbed": True}
    if mode == "off":
        info["level"] = "none"
        return info
    sup = support()
    if mode == "require" and sup["level"] != "full":
        raise SandboxError(f"the sandbox is required but this machine offers {describe(sup)}")
    cache = cache_dir(role)
    for k, sub in (("TRITON_CACHE_DIR", "triton"), ("CUDA_CACHE_PATH", "nv"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        (cache / sub).mkdir(exist_ok=True)
        os.environ[k] = str(cache / sub)
    from skillrun.io import compile_seed

    seed = compile_seed.seed_folder() if role == "accused" else None
    if triton_cache:
        os.environ["TRITON_CACHE_DIR"] = os.path.realpath(triton_cache)
        own.append(os.environ["TRITON_CACHE_DIR"])
    elif seed:
        info["compile_seed"] = compile_seed.seed(cache / "triton", seed)  # entries copied into the role's own cache
    if role != "accused":
        os.environ.pop(compile_seed.SEED_ENV, None)  # the ports' kernels are the accused's: no other role reads them
    os.environ["XDG_CACHE_HOME"] = str(cache)
    if own:
        os.environ["TMPDIR"] = own[0]
        tempfile.tempdir = None
    libc = _libc()
    if skip:
        info["left_out"] = sorted(skip)
    if sup["namespaces"] is None and "namespaces" not in skip:
        _namespaces(libc, parent, deathsig, ipc="ipc" not in skip)  # returns in the task process only
        info["pid_namespace"] = info["lifeline"] = True
        info["ipc_namespace"] = "ipc" not in skip
        info["private_proc"] = _private_mounts(libc) if "private_mounts" not in skip else False
    else:
        info["pid_namespace"] = False
    if sup["landlock_abi"] and "landlock" not in skip:
        devices = [d for d in ("/dev",) if os.path.isdir(d)]
        shm = "/dev/shm" if info.get("private_proc") and os.path.isdir("/dev/shm") else None
        readable = _readable() + ([os.path.realpath(seed)] if seed and not triton_cache else [])
        _landlock(libc, sup["landlock_abi"], readable, own + [str(cache)] + ([shm] if shm else []), devices)
        info["landlock_abi"] = sup["landlock_abi"]
    if info["pid_namespace"]:
        info["capabilities_dropped"] = _drop_capabilities(libc)
    info["level"] = "full" if info["pid_namespace"] and info.get("landlock_abi") and not skip else "partial"
    return info


def _namespaces(libc: Any, parent: int | None, deathsig: bool, ipc: bool = True) -> None:
    """unshare, then fork the namespace's init, which forks the task: only the task returns."""
    import select

    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWPID | _CLONE_NEWNS | (_CLONE_NEWIPC if ipc else 0)) != 0:
        raise _fail("unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)
    alive_r, alive_w = os.pipe()  # held open by the outer process: EOF means it is gone
    status_r, status_w = os.pipe()  # the task's raw wait status, from the init to the outer process
    init = os.fork()
    if init:
        os.close(alive_r)
        os.close(status_w)
        _pass_on(init, status_r, parent, deathsig)  # never returns
    os.close(alive_w)
    os.close(status_r)
    # The namespace's init (PID 1): dies with the process outside; the kernel then ends everything inside.
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0 or select.select([alive_r], [], [], 0)[0]:
        os._exit(1)
    os.close(alive_r)
    task = os.fork()
    if task:
        _reap(task, status_w)  # never returns
    os.close(status_w)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        os._exit(1)
    for k in ("SKILLRUN_PARENT_PID", "SKILLRUN_PDEATHSIG"):  # the init is this process's lifeline now
        os.environ.pop(k, None)


def _pass_on(init: int, status_r: int, parent: int | None, deathsig: bool) -> None:
    """The process outside the namespace: ends with its own parent, waits for the init and ends the
    way the task did (the same exit code, or killed by the same signal). It polls instead of starting a
    watch thread: after unshare(CLONE_NEWPID) this process can start no thread. Never returns."""
    import time

    code = 1
    try:
        if deathsig:
            _libc().prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        while True:
            try:
                done, _ = os.waitpid(init, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            if parent is not None and os.getppid() != parent:  # the harness is gone: so is the namespace
                os.kill(init, signal.SIGKILL)
                os._exit(1)
            time.sleep(0.02)
        with os.fdopen(status_r, "rb") as fh:
            text = fh.read(64).decode("ascii", "replace")
        code = os.waitstatus_to_exitcode(int(text)) if text.strip().lstrip("-").isdigit() else 1
        sys.stdout.flush()
        sys.stderr.flush()
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
    finally:
        os._exit(code if code >= 0 else 128 - code)


def _reap(task: int, status_w: int) -> None:
    """The init: reap every orphan until the task ends; its end ends the namespace."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    status = 1 << 8
    while True:
        try:
            pid, st = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            break
        if pid == task:
            status = st
            break
    os.write(status_w, str(status).encode())
    os._exit(0)


def _private_mounts(libc: Any) -> bool:
    """A /proc of this PID namespace and an empty /dev/shm (mount namespace private first).
    False when the kernel refuses the /proc mount (a container that masks parts of the host's)."""
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return False
    if os.path.isdir("/dev/shm"):
        libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=64m,mode=1777")
    return libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) == 0


# ---------------------------------------------------------------------------------------- doctor
def probe(timeout_s: float = 60.0) -> dict[str, Any]:
    """Enter the sandbox in a fresh child and check each piece: (support, what held, problems)."""
    import subprocess

    sup = support()
    with tempfile.TemporaryDirectory(prefix="skillrun-sbxprobe-") as d:
        try:
            out = subprocess.run([sys.executable, "-m", "skillrun.io.sandbox", "--probe", d], capture_output=True,
                                 text=True, timeout=timeout_s, env={**os.environ, "SKILLRUN_PROBE_CANARY": "hf_canarysecret1"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"support": sup, "held": {}, "problems": [f"the probe child failed: {exc}"]}
    try:
        held = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"support": sup, "held": {}, "problems": [f"the probe child said nothing readable: {out.stderr[-300:]}"]}
    problems = [k for k, ok in held.get("checks", {}).items() if not ok]
    return {"support": sup, "held": held, "problems": problems}


def _probe_child(folder: str) -> dict[str, Any]:  # pragma: no cover - runs in the probe's child
    parent = os.getppid()
    info = enter([folder], role="probe", mode="auto")
    checks: dict[str, bool] = {}
    checks["environment scrubbed"] = "SKILLRUN_PROBE_CANARY" not in os.environ
    try:
        Path(folder, "x").write_text("ok")
        checks["own folder writable"] = True
    except OSError:
        checks["own folder writable"] = False
    if info.get("landlock_abi"):
        try:
            Path(sys.prefix, ".skillrun-probe").write_text("no")
            Path(sys.prefix, ".skillrun-probe").unlink()
            checks["import path read-only"] = False
        except OSError:
            checks["import path read-only"] = True
    if info.get("pid_namespace"):
        try:
            os.kill(parent, 0)
            checks["harness invisible"] = False
        except ProcessLookupError:
            checks["harness invisible"] = True
        except PermissionError:
            checks["harness invisible"] = True
        if info.get("private_proc"):
            pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
            checks["private /proc"] = max(pids) <= 8
    return {"info": info, "checks": checks}


# ---------------------------------------------------------------------------------------- the device inside
_GPU_FIT: dict[str, Any] | None = None


def _device_check(check: str, info: dict[str, Any]) -> None:
    """What a sandboxed task does first on a device: raises if it cannot. ``cuda``: the driver, a context,
    pinned host memory, a cuBLAS call and a synchronize (torch.cuda, CUDA and ROCm builds alike).
    ``fail-with=a+b`` (the CPU tests' stand-in for a device stack): fails while any named piece is in force."""
    if check == "cuda":
        import torch

        x = torch.ones(256, 256, device="cuda")
        pinned = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
        y = (x @ x).sum()
        torch.cuda.synchronize()
        if float(y) != 256.0 ** 3 or not pinned.is_pinned():
            raise RuntimeError("the device computed a wrong sum")
        return
    if check.startswith("fail-with="):
        held = {"namespaces": info.get("pid_namespace"), "ipc": info.get("ipc_namespace"),
                "private_mounts": info.get("private_proc"), "landlock": bool(info.get("landlock_abi"))}
        bad = [p for p in check.split("=", 1)[1].split("+") if held.get(p)]
        if bad:
            raise OSError(f"simulated device failure inside {'+'.join(bad)}")
        return
    raise ValueError(f"unknown device check {check!r}")


def gpu_fit(check: str = "cuda", candidates: Iterable[Iterable[str]] = CANDIDATES, timeout_s: float = 180.0,
            refresh: bool = False) -> dict[str, Any]:
    """The strongest sandbox under which ``check`` passes: every candidate (pieces to leave out, strongest
    first) is tried at once, each in a fresh child that enters the sandbox without those pieces and runs the
    check. Returns ``{"without": [...], "tried": [{"without", "ok", "error"}...]}``; ``without`` is [] when the
    full sandbox works, and also when nothing does (the device is then broken outside the sandbox too, and the
    runs say so themselves). Cached for the process: a GPU call pays one round of probes (~10 s), not one per task."""
    global _GPU_FIT
    if _GPU_FIT is not None and _GPU_FIT.get("check") == check and not refresh:
        return dict(_GPU_FIT)
    import subprocess

    cands = [tuple(c) for c in candidates]
    env = {**scrub_env(dict(os.environ)), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop(WITHOUT_ENV, None)
    tried: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="skillrun-gpufit-") as d:
        procs = []
        for i, c in enumerate(cands):
            folder = os.path.join(d, str(i))
            os.mkdir(folder)
            procs.append(subprocess.Popen([sys.executable, "-m", "skillrun.io.sandbox", "--device-probe", folder,
                                           ",".join(c), check], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=env, start_new_session=True))
        for c, proc in zip(cands, procs):
            try:
                out, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                tried.append({"without": list(c), "ok": False, "error": f"no answer within {timeout_s:.0f} s"})
                continue
            try:
                res = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                res = {"ok": False, "error": (err.strip().splitlines() or ["(nothing said)"])[-1][:500]}
            tried.append({"without": list(c), "ok": bool(res.get("ok")), "error": res.get("error")})
    ok = next((t["without"] for t in tried if t["ok"]), None)
    _GPU_FIT = {"check": check, "without": ok or [], "none_worked": ok is None, "tried": tried}
    return dict(_GPU_FIT)


def _device_probe_child(folder: str, without: str, check: str) -> dict[str, Any]:  # pragma: no cover - a child
    try:
        info = enter([folder], role="probe", mode="auto", without=[p for p in without.split(",") if p])
        _device_check(check, info)
        return {"ok": True}
    except BaseException as exc:  # noqa: BLE001 - any failure is this candidate's answer
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]}


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--probe":  # pragma: no cover
    print(json.dumps(_probe_child(sys.argv[2])))
    sys.stdout.flush()
if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--device-probe":  # pragma: no cover
    print(json.dumps(_device_probe_child(*sys.argv[2:5])))
    sys.stdout.flush()
