"""Start torch.profiler inside a workload without editing it (used by `skill-run profile`).

`skill-run profile` copies this file into a temporary folder and puts that folder first on the
child's PYTHONPATH. Python imports `sitecustomize` at start-up (module `site`), so this runs
before the user's script: it starts the profiler, and an atexit handler writes the Chrome trace
when the interpreter ends (normal end, SystemExit, or an uncaught exception; not os._exit or a
fatal signal). Configuration comes from SKILLRUN_PROFILE_* variables set by the parent.

Rules this file keeps:
- Never break the workload: any failure here becomes a warning on stderr and a note in the
  status file the parent reads, and the script runs unprofiled.
- Profile one process: the first interpreter takes the configuration out of the environment, so
  its subprocesses (DataLoader workers, compile workers) run unprofiled and never race on the file.
- Stay transparent: a sitecustomize that was already on the path still runs (we chain to it), and
  our folder is removed from sys.path once we are set up.
- Standard library only at import time; torch is imported only when profiling was requested.
"""
from __future__ import annotations

import atexit
import gzip
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading

_PREFIX = "SKILLRUN_PROFILE_"
_CONTROLLER_KEY = "_skillrun_profile_controller"  # same key as skillrun.profiling.CONTROLLER_KEY
_TAG = "[skill-run profile]"


def _warn(msg: str) -> None:
    sys.stderr.write(f"{_TAG} {msg}\n")
    sys.stderr.flush()


def _claim_config() -> dict[str, str] | None:
    """Take our settings out of the environment so child processes are not profiled too."""
    return _claim(_PREFIX, "OUT")


def _claim(prefix: str, required: str) -> dict[str, str] | None:
    """The settings under ``prefix`` (None unless ``prefix + required`` is set), removed from the
    environment, and the hook folder taken off the import path, so that child processes neither
    see the settings nor load this hook again."""
    if not os.environ.get(prefix + required):
        return None
    cfg = {k[len(prefix):].lower(): os.environ.pop(k) for k in list(os.environ) if k.startswith(prefix)}
    hook_dir = cfg.get("hook_dir", "")
    if hook_dir:
        parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not _same(p, hook_dir)]
        if parts:
            os.environ["PYTHONPATH"] = os.pathsep.join(parts)
        else:
            os.environ.pop("PYTHONPATH", None)
        sys.path[:] = [p for p in sys.path if not _same(p, hook_dir)]
    return cfg


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _chain_previous_sitecustomize(hook_dir: str) -> None:
    """Run the sitecustomize that ours shadows (distro or venv set-up must still happen)."""
    search = [p for p in sys.path if not (hook_dir and _same(p or ".", hook_dir))]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", search)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - site.py also only warns about a failing sitecustomize
        _warn(f"the existing sitecustomize ({spec.origin}) failed: {type(exc).__name__}: {exc}")


def _ensure_markers_importable(hook_dir: str) -> None:
    """Make `skillrun.profiling` importable even where skillrun is not installed in the child."""
    try:
        if importlib.util.find_spec("skillrun") is not None:
            return
    except (ImportError, ValueError):
        pass
    path = os.path.join(hook_dir, "skillrun_profiling.py")
    if not os.path.exists(path):
        return
    spec = importlib.util.spec_from_file_location("skillrun.profiling", path)
    markers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(markers)
    package = importlib.util.module_from_spec(importlib.machinery.ModuleSpec("skillrun", None, is_package=True))
    package.__path__ = []
    package.profiling = markers
    sys.modules.setdefault("skillrun", package)
    sys.modules.setdefault("skillrun.profiling", markers)


def _write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _parse_window(text: str) -> tuple[int, int | None] | None:
    """`a:b` (b may be empty) as normalised by the parent; None means profile the whole run."""
    if not text:
        return None
    first, _, last = text.partition(":")
    return int(first), (int(last) if last else None)


class _Controller:
    """Owns the torch profiler for this process; skillrun.profiling's markers call into it."""

    def __init__(self, cfg: dict[str, str]):
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile, supported_activities

        self.torch = torch
        self.Action = ProfilerAction
        self.out = cfg["out"]
        self.hook_dir = cfg.get("hook_dir", "")  # the runner's private folder (0700, removed by the runner)
        self.status_path = cfg.get("status", "")
        self.window = _parse_window(cfg.get("steps", ""))
        self.region_mode = cfg.get("region") == "1"
        self.pid = os.getpid()
        self.steps_seen = 0
        self.regions_seen = 0
        self.written: str | None = None
        self.error: str | None = None
        self.notes: list[str] = []
        self._depth = 0
        self._started = False
        self._closed = False
        self._lock = threading.Lock()

        self.activities = self._pick_activities(cfg.get("activities", "auto"), ProfilerActivity, supported_activities())
        kwargs = dict(activities=self.activities, record_shapes=True, on_trace_ready=self._save)
        if not self.region_mode:
            # A schedule makes torch mark ProfilerStep#N around each step and lets us keep a window.
            kwargs["schedule"] = self._schedule
        self.prof = profile(**kwargs)
        if not self.region_mode:
            self.prof.start()
            self._started = True

    def _pick_activities(self, spec: str, Activity, supported) -> list:
        names = {"cpu": Activity.CPU, "cuda": Activity.CUDA, "gpu": Activity.CUDA, "hip": Activity.CUDA, "rocm": Activity.CUDA}
        if spec in ("", "auto"):
            # CPU is always on: the cpu_op events carry the input shapes. CUDA activity covers ROCm
            # too (Kineto maps it to roctracer / rocprofiler-sdk). Checking supported_activities()
            # instead of torch.cuda.is_available() keeps CUDA uninitialised, so a script that sets
            # CUDA_VISIBLE_DEVICES itself still sees the devices it chose.
            chosen = [Activity.CPU] + ([Activity.CUDA] if Activity.CUDA in supported else [])
        else:
            chosen = []
            for name in spec.split(","):
                act = names[name.strip()]
                if act not in supported:
                    self.notes.append(f"activity {name.strip()} is not supported by this torch build; left out")
                elif act not in chosen:
                    chosen.append(act)
        if not chosen:
            raise RuntimeError(f"none of the requested activities ({spec}) is supported by this torch build")
        return chosen

    # ---------------------------------------------------------------- schedule (steps mode)
    def _schedule(self, k: int):
        A = self.Action
        if self.window is None:
            return A.RECORD
        first, end = self.window
        if k < first - 1:
            return A.NONE
        if k == first - 1:
            return A.WARMUP  # start tracing one step early so start-up cost stays out of the window
        if end is None or k < end - 1:
            return A.RECORD
        if k == end - 1:
            return A.RECORD_AND_SAVE
        return A.NONE

    def _sync(self) -> None:
        # Kernels still queued when collection stops would be missing from the trace.
        cuda = self.torch.cuda
        try:
            if cuda.is_initialized():
                cuda.synchronize()
        except Exception:  # noqa: BLE001 - a broken device must not hide the trace we have
            pass

    # ---------------------------------------------------------------- markers
    def step(self) -> None:
        with self._lock:
            self.steps_seen += 1
            if self.region_mode or self._closed:
                return
            if self._schedule(self.prof.step_num) == self.Action.RECORD_AND_SAVE:
                self._sync()
            self.prof.step()

    def region_enter(self, name: str):
        rec = self.torch.profiler.record_function(name)
        with self._lock:
            self.regions_seen += 1
            if self.region_mode and not self._closed:
                if self._depth == 0:
                    if not self._started:
                        self.prof.start()
                        self._started = True
                    else:
                        self.prof.toggle_collection_dynamic(True, self.activities)
                self._depth += 1
        rec.__enter__()
        return rec

    def region_exit(self, rec) -> None:
        rec.__exit__(None, None, None)
        with self._lock:
            if self.region_mode and not self._closed:
                self._depth -= 1
                if self._depth == 0:
                    self._sync()
                    self.prof.toggle_collection_dynamic(False, self.activities)

    # ---------------------------------------------------------------- output
    def _save(self, prof) -> None:
        # The exporter writes by name, so it writes into the runner's private hook folder; the
        # result then reaches `out` through a fresh O_EXCL temporary file beside it and a rename
        # (no predictable `OUT.partial` name a planted symlink could redirect).
        out = self.out
        made = not (self.hook_dir and os.path.isdir(self.hook_dir))
        private = tempfile.mkdtemp(prefix="skillrun-trace-") if made else self.hook_dir
        raw = os.path.join(private, f"trace.{os.getpid()}.json")
        tmp = None
        try:
            prof.export_chrome_trace(raw)
            fd, tmp = tempfile.mkstemp(prefix=f".tmp-skillrun-{os.getpid()}-", suffix=".part",
                                       dir=os.path.dirname(os.path.abspath(out)))
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)
            with os.fdopen(fd, "wb") as dst, open(raw, "rb") as src:
                if out.endswith(".gz"):
                    with gzip.GzipFile(fileobj=dst, mode="wb") as gz:
                        shutil.copyfileobj(src, gz, 1 << 20)
                else:
                    shutil.copyfileobj(src, dst, 1 << 20)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, out)
            tmp = None
            self.written = out
        except Exception as exc:  # noqa: BLE001
            self.error = f"writing the trace failed: {type(exc).__name__}: {exc}"
            _warn(self.error)
        finally:
            for leftover in (tmp, raw):
                if leftover:
                    try:
                        os.unlink(leftover)
                    except OSError:
                        pass
            if made:
                shutil.rmtree(private, ignore_errors=True)

    def finish(self) -> None:
        if os.getpid() != self.pid:  # a forked child inherits our atexit hooks; the trace is not its to write
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._started:
                self._sync()
                if self.region_mode and self._depth > 0:
                    self.notes.append("the run ended inside a profiling region")
                self.prof.stop()  # in RECORD state this calls _save via on_trace_ready
        except Exception as exc:  # noqa: BLE001
            self.error = f"stopping the profiler failed: {type(exc).__name__}: {exc}"
            _warn(self.error)
        self.write_status()

    def write_status(self, **extra) -> None:
        if not self.status_path:
            return
        acts = [str(a).split(".")[-1].lower() for a in self.activities]
        data = {"hook_ran": True, "pid": self.pid, "torch": self.torch.__version__, "activities": acts,
                "mode": "region" if self.region_mode else ("steps" if self.window else "whole run"),
                "steps_seen": self.steps_seen, "regions_seen": self.regions_seen, "trace": self.written,
                "error": self.error, "notes": self.notes, "finished": self._closed}
        data.update(extra)
        try:
            _write_json_atomic(self.status_path, data)
        except OSError as exc:
            _warn(f"could not write the status file: {exc}")


def _exit_cleanly_on_sigterm() -> None:
    """SIGTERM's default action kills the process before atexit runs, losing the trace of a server
    stopped that way; turn it into SystemExit(143) instead, only while nobody else handles it."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def _raise(signum, frame):
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, _raise)


_E2E_PREFIX = "SKILLRUN_E2E_"


def _claim_e2e_config() -> dict[str, str] | None:
    """`skill-run e2e` settings (SKILLRUN_E2E_*), taken out of the environment like ours."""
    return _claim(_E2E_PREFIX, "SPEC")


def _start_e2e(cfg: dict[str, str]) -> None:
    """Install the routing of `skill-run e2e` (skillrun.profiling.routing); a failure is reported, not hidden:
    the status file says why, and the parent fails the arm."""
    try:
        from skillrun.profiling import routing as child

        child.install(cfg)
    except Exception as exc:  # noqa: BLE001
        msg = f"could not install e2e routing: {type(exc).__name__}: {exc}"
        _warn(msg)
        if cfg.get("status"):
            _write_json_atomic(cfg["status"], {"hook_ran": True, "pid": os.getpid(), "install_error": msg})


def _main() -> None:
    e2e = _claim_e2e_config()
    cfg = _claim_config()
    if cfg is None and e2e is None:
        return  # imported outside `skill-run profile` / `e2e` (e.g. as skillrun.profiling.hook.sitecustomize)
    hook_dir = (cfg or e2e or {}).get("hook_dir", "")
    _chain_previous_sitecustomize(hook_dir)
    if e2e is not None:
        _start_e2e(e2e)
    if cfg is None:
        return
    status = cfg.get("status", "")
    try:
        _ensure_markers_importable(hook_dir)
        ctl = _Controller(cfg)
    except ImportError as exc:
        msg = f"torch is not importable in {sys.executable}: {exc}"
        _warn(msg + " - running the workload without profiling")
        if status:
            _write_json_atomic(status, {"hook_ran": True, "pid": os.getpid(), "unavailable": msg, "trace": None})
        return
    except Exception as exc:  # noqa: BLE001 - never stop the workload because profiling failed
        msg = f"could not start torch.profiler: {type(exc).__name__}: {exc}"
        _warn(msg + " - running the workload without profiling")
        if status:
            _write_json_atomic(status, {"hook_ran": True, "pid": os.getpid(), "error": msg, "trace": None})
        return
    sys.modules[_CONTROLLER_KEY] = ctl
    ctl.write_status()  # early: tells the parent the hook ran even if the process is killed later
    atexit.register(ctl.finish)
    _exit_cleanly_on_sigterm()
    acts = ",".join(str(a).split(".")[-1].lower() for a in ctl.activities)
    what = f"steps {cfg.get('steps')}" if ctl.window else ("regions only" if ctl.region_mode else "whole run")
    _warn(f"torch.profiler on ({acts}; {what}) -> {ctl.out}")


_main()
