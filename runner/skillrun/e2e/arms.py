"""Run the workload once as one arm (A: as-is, B: routed) with the start-up hook, and read what it saw.

Each run gets its own folder: the hook's status file, the tensors the workload saved with
``skillrun.profiling.save_output`` (``saved/``), a folder the workload may write its own files
to (``$SKILLRUN_OUTPUT_DIR``, read by a user ``--check`` command) and the workload's stdout and
stderr (``log.txt``). Profiled runs (GPU kernel time) go through ``skill-run profile``'s own
runner with the same routing settings added.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skillrun.errors import UsageError

LOG_TAIL = 1500


@dataclass
class ArmRun:
    arm: str  # A | B
    label: str  # warmup-A, A1, B1, AA2, profiled-B ...
    folder: Path
    rc: int
    wall_s: float
    status: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False
    trace: Path | None = None

    @property
    def saved(self) -> Path:
        return self.folder / "saved"

    @property
    def files(self) -> Path:
        return self.folder / "files"

    def log_tail(self) -> str:
        try:
            text = (self.folder / "log.txt").read_text(errors="replace")
        except OSError:
            return ""
        return text[-LOG_TAIL:].strip()

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out


@functools.lru_cache(maxsize=1)  # one folder of links per process, however many arms run
def package_paths() -> tuple[str, ...]:
    """Folders that make ``skillrun`` and ``skillrun_kernels`` importable in the child (as here).

    A package whose folder has another name (the checkout maps runner/ -> skillrun and kernels/ ->
    skillrun_kernels through an editable install, which only this interpreter's site-packages
    knows) is reached through a folder of links named for the packages, so the workload's own
    ``python`` finds them whatever its site-packages hold.
    """
    import skillrun
    import skillrun_kernels

    out: list[str] = []
    links: Path | None = None
    for pkg in (skillrun, skillrun_kernels):
        folder = Path(list(pkg.__path__)[0])
        if folder.name == pkg.__name__:
            parent = str(folder.parent)
        else:
            if links is None:
                links = Path(tempfile.mkdtemp(prefix="skillrun-e2e-pkgs-"))
            (links / pkg.__name__).symlink_to(folder.resolve(), target_is_directory=True)
            parent = str(links)
        if parent not in out:
            out.append(parent)
    return tuple(out)


def child_env(base: dict[str, str], spec_path: Path, arm: str, run_dir: Path, extra: dict[str, str | None],
              save: bool = False, oracle: int = 0) -> dict[str, str]:
    env = dict(base)
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in package_paths() if p not in paths])
    (run_dir / "saved").mkdir(parents=True, exist_ok=True)
    (run_dir / "files").mkdir(parents=True, exist_ok=True)
    env.update({
        "SKILLRUN_E2E_SPEC": str(spec_path),
        "SKILLRUN_E2E_ARM": arm,
        "SKILLRUN_E2E_STATUS": str(run_dir / "status.json"),
        "SKILLRUN_E2E_OUTPUTS": str(run_dir / "saved"),
        "SKILLRUN_E2E_SAVE": "1" if save else "0",
        "SKILLRUN_E2E_ORACLE": str(max(0, int(oracle))),  # calls per plan item checked against the oracle
        "SKILLRUN_OUTPUT_DIR": str(run_dir / "files"),
    })
    return env


def _read_status(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def run_arm(cmd: list[str], arm: str, label: str, root: Path, spec_path: Path, base_env: dict[str, str],
            extra_env: dict[str, str | None], timeout: float | None = None, save: bool = False, oracle: int = 0) -> ArmRun:
    """One unprofiled run with the hook installed (``oracle``: calls per plan item checked against the oracle)."""
    from skillrun.profiling.run import _install_hook

    run_dir = root / label
    run_dir.mkdir(parents=True, exist_ok=True)
    hook_dir = Path(tempfile.mkdtemp(prefix="hook-", dir=root))
    _install_hook(hook_dir)
    env = child_env(base_env, spec_path, arm, run_dir, extra_env, save, oracle)
    env["PYTHONPATH"] = os.pathsep.join([str(hook_dir), env["PYTHONPATH"]])
    env["SKILLRUN_E2E_HOOK_DIR"] = str(hook_dir)
    timed_out = False
    with open(run_dir / "log.txt", "wb") as log:
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=False)
        except FileNotFoundError:
            raise UsageError(f"command not found: {cmd[0]}", field="COMMAND") from None
        except PermissionError:
            raise UsageError(f"command is not executable: {cmd[0]}", field="COMMAND") from None
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
        except KeyboardInterrupt:
            proc.kill()
            proc.wait()
            raise
        wall = time.perf_counter() - t0
    return ArmRun(arm=arm, label=label, folder=run_dir, rc=rc, wall_s=wall, status=_read_status(run_dir / "status.json"),
                  timed_out=timed_out)


def run_profiled(cmd: list[str], arm: str, label: str, root: Path, spec_path: Path, base_env: dict[str, str],
                 extra_env: dict[str, str | None], steps: str | None) -> ArmRun:
    """One run under torch.profiler (`skill-run profile`'s runner) with the same routing: GPU kernel time."""
    from skillrun.profiling.run import WorkloadFailed, profile_workload

    run_dir = root / label
    run_dir.mkdir(parents=True, exist_ok=True)
    env = child_env(base_env, spec_path, arm, run_dir, extra_env)
    trace = run_dir / "trace.json.gz"
    t0 = time.perf_counter()
    rc = 0
    with open(run_dir / "log.txt", "wb") as log:
        try:
            profile_workload(cmd, trace, steps=steps, env=env, stdout=log)
        except WorkloadFailed as exc:
            rc = exc.returncode
    return ArmRun(arm=arm, label=label, folder=run_dir, rc=rc, wall_s=time.perf_counter() - t0,
                  status=_read_status(run_dir / "status.json"), trace=trace if trace.exists() else None)
