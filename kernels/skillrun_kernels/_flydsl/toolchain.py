"""Compile-only FlyDSL toolchain on a CPU-only machine.

FlyDSL's ROCDL serializer links every code object with ``$ROCM_PATH/llvm/bin/ld.lld``. On a machine
without ROCm we point ``ROCM_PATH`` at a small folder whose ``llvm/bin/ld.lld`` is a link to Debian's
lld-19. ``COMPILE_ONLY=1`` (no prefix: ``FLYDSL_COMPILE_ONLY`` is ignored) stops FlyDSL from loading
the HIP runtime; ``FLYDSL_GPU_ARCH``/``ARCH`` select the target, otherwise FlyDSL silently falls
back to gfx942.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

LLD_CANDIDATES = ("/usr/lib/llvm-19/bin/ld.lld", "/usr/bin/ld.lld-19")
SUPPORTED_ARCHS = ("gfx942", "gfx950")


class ToolchainUnavailable(RuntimeError):
    """lld-19 or flydsl is missing, so nothing can be compiled here."""


def find_lld() -> Path | None:
    for cand in LLD_CANDIDATES:
        p = Path(cand)
        if p.exists():
            return p
    which = shutil.which("ld.lld-19")
    return Path(which) if which else None


def flydsl_version() -> str | None:
    if importlib.util.find_spec("flydsl") is None:
        return None
    from importlib import metadata

    try:
        return metadata.version("flydsl")
    except metadata.PackageNotFoundError:
        return "unknown"


def missing_reason() -> str | None:
    """None when a compile can run here; otherwise what is missing, in one line."""
    problems = []
    if find_lld() is None:
        problems.append("lld-19 is not installed (apt-get install -y lld-19; expected /usr/lib/llvm-19/bin/ld.lld)")
    if flydsl_version() is None:
        problems.append("the flydsl package is not installed (pip install 'skillrun[flydsl]')")
    return "; ".join(problems) or None


def default_cache_dir() -> Path:
    if os.environ.get("SKILLRUN_CACHE"):
        return Path(os.environ["SKILLRUN_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "skillrun"


def ensure_rocm_shim(cache_dir: Path | None = None) -> Path:
    """Create (once) ``<cache>/rocm-shim/llvm/bin/ld.lld -> lld-19`` and return the shim root."""
    reason = missing_reason()
    if reason:
        raise ToolchainUnavailable(reason)
    lld = find_lld()
    assert lld is not None
    root = Path(cache_dir or default_cache_dir()) / "rocm-shim"
    link = root / "llvm" / "bin" / "ld.lld"
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and Path(os.readlink(link)) == lld:
        return root
    tmp = link.with_name(f".ld.lld.{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(lld)
    os.replace(tmp, link)  # atomic: concurrent checks never see a half-made link
    return root


def compile_env(arch: str, dump_dir: Path | None = None, cache_dir: Path | None = None) -> dict[str, str]:
    """Environment variables for a compile-only FlyDSL run targeting ``arch``."""
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported FlyDSL target {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
    env = {
        "ROCM_PATH": str(ensure_rocm_shim(cache_dir)),
        "COMPILE_ONLY": "1",
        "FLYDSL_GPU_ARCH": arch,
        "ARCH": arch,
        # The disk cache would hand back an artifact without re-running the compiler, and
        # ``_last_compiled`` is only set by a real compile.
        "FLYDSL_RUNTIME_ENABLE_CACHE": "0",
    }
    if dump_dir is not None:
        env["FLYDSL_DEBUG_DUMP_ASM"] = "1"
        env["FLYDSL_DUMP_DIR"] = str(dump_dir)
    return env


def apply_compile_env(arch: str, dump_dir: Path | None = None, cache_dir: Path | None = None) -> None:
    """Set the compile-only environment in this process (call in a child process, before compiling)."""
    os.environ.update(compile_env(arch, dump_dir, cache_dir))
