"""The compile-only FlyDSL environment for the runner, and compiling a recipe in a child process.

A FlyDSL compile can abort the whole interpreter (LLVM fatal errors call ``abort()``), so every
compile runs in a fresh ``python -m skillrun.check._child`` with a timeout. The child gets
``ROCM_PATH`` pointing at a shim folder under the runner's cache (``llvm/bin/ld.lld`` -> Debian's
lld-19), ``COMPILE_ONLY=1`` and the target arch, and writes its facts as JSON to a file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skillrun.io import lifeline
from skillrun.errors import UnavailableError
from skillrun_kernels._flydsl import toolchain


def cache_dir() -> Path:
    return toolchain.default_cache_dir()


def require_toolchain() -> str:
    """The flydsl version, or :class:`UnavailableError` saying what to install."""
    reason = toolchain.missing_reason()
    if reason:
        raise UnavailableError(f"FlyDSL compile-only checks are unavailable: {reason}",
                               hint="CI installs lld-19 with apt-get; the flydsl wheel comes with skillrun[flydsl]")
    return toolchain.flydsl_version() or "unknown"


def shim_root() -> Path:
    """Create (if needed) and return the ROCM_PATH shim folder."""
    require_toolchain()
    return toolchain.ensure_rocm_shim(cache_dir())


def child_env(arch: str, isa_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(toolchain.compile_env(arch, dump_dir=None, cache_dir=cache_dir()))
    env["SKILLRUN_ISA_DIR"] = str(isa_dir)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return lifeline.child_env(env)  # the compiler process dies with `skill-run check`, even after SIGKILL


@dataclass
class ChildResult:
    ok: bool
    seconds: float
    facts: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    returncode: int | None = 0
    log_tail: str = ""


def compile_in_child(kernel_ref: str, shape: dict[str, int], config: dict[str, Any], arch: str,
                     timeout_s: float = 600.0, isa_dir: Path | None = None) -> ChildResult:
    """Run ``<module of kernel_ref>.compile_only(shape, config, arch)`` in a child process."""
    require_toolchain()
    module = kernel_ref.split(":", 1)[0]
    isa_dir = Path(isa_dir or cache_dir() / "isa")
    isa_dir.mkdir(parents=True, exist_ok=True)
    with lifeline.temp_dir("check") as tmp:  # named for this process: swept by the next run if we are killed
        out_path = Path(tmp) / "facts.json"
        request = {"module": module, "shape": shape, "config": config, "arch": arch, "out": str(out_path)}
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "skillrun.check._child"],
                input=json.dumps(request), capture_output=True, text=True, timeout=timeout_s,
                env=child_env(arch, isa_dir),
            )
        except subprocess.TimeoutExpired as exc:
            tail = ((exc.stderr or "") if isinstance(exc.stderr, str) else (exc.stderr or b"").decode(errors="replace"))[-2000:]
            return ChildResult(False, time.perf_counter() - t0, error=f"compile timed out after {timeout_s:.0f} s",
                               returncode=None, log_tail=tail)
        seconds = time.perf_counter() - t0
        log_tail = (proc.stdout + proc.stderr)[-4000:]
        if out_path.exists():
            payload = json.loads(out_path.read_text())
            if payload.get("ok"):
                return ChildResult(True, seconds, facts=payload["facts"], returncode=proc.returncode, log_tail=log_tail)
            return ChildResult(False, seconds, error=payload.get("error", "compile failed"), returncode=proc.returncode, log_tail=log_tail)
        last = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        why = last[-1] if last else "no output"
        if proc.returncode is not None and proc.returncode < 0:
            why = f"child killed by signal {-proc.returncode} ({why})"
        return ChildResult(False, seconds, error=f"compiler process failed (exit {proc.returncode}): {why}",
                           returncode=proc.returncode, log_tail=log_tail)
