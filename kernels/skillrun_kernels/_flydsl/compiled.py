"""Compile one FlyDSL launcher without a GPU and return its compiled facts.

Run this in a child process (an LLVM fatal error aborts Python) after
:func:`skillrun_kernels._flydsl.toolchain.apply_compile_env`. The facts come from two places:

* the artifact's ``#gpu.kernel_metadata`` (registers, spills, scratch, static LDS), and
* the ISA listing FlyDSL dumps under ``FLYDSL_DUMP_DIR/<kernel>/NN_final_isa.s`` (opcode counts,
  wait/barrier statistics, the E8M0 scale trace).
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from . import compat as _compat
from . import isa as _isa


def _dump_dir() -> Path:
    d = os.environ.get("FLYDSL_DUMP_DIR")
    if not d or os.environ.get("FLYDSL_DEBUG_DUMP_ASM") != "1":
        raise RuntimeError("compile facts need FLYDSL_DEBUG_DUMP_ASM=1 and FLYDSL_DUMP_DIR (use toolchain.apply_compile_env)")
    return Path(d)


def _final_isa(dump: Path, kernel: str) -> Path:
    """The listing that defines ``kernel``: ``<dump>/<kernel>/`` for a single-kernel module, or the
    launcher's folder when one ``@flyc.jit`` launches several kernels."""
    candidates = sorted((dump / kernel).glob("*final_isa.s")) or sorted(dump.glob("*/*final_isa.s"))
    for path in reversed(candidates):
        if kernel in _isa.functions(path.read_text()):
            return path
    raise RuntimeError(f"FlyDSL wrote no ISA defining kernel {kernel!r} under {dump}")


def kernel_facts(name: str, meta: dict[str, int], isa_path: Path) -> dict[str, Any]:
    text = isa_path.read_text()
    fns = _isa.functions(text)
    fn = fns.get(name)
    if fn is None:
        raise RuntimeError(f"kernel {name!r} not found in {isa_path} (has {sorted(fns)})")
    vgpr = int(meta.get("vgpr_count", 0))
    agpr = int(meta.get("agpr_count", 0))
    return {
        "name": name,
        "vgpr": vgpr,  # unified: ArchVGPRs up to accum_offset plus AGPRs
        "agpr": agpr,
        "arch_vgpr": vgpr - agpr,
        "sgpr": int(meta.get("sgpr_count", 0)),
        "vgpr_spill": int(meta.get("vgpr_spill_count", 0)),
        "sgpr_spill": int(meta.get("sgpr_spill_count", 0)),
        "scratch_bytes": int(meta.get("private_segment_fixed_size", 0)),
        "lds_bytes": int(meta.get("group_segment_fixed_size", 0)),
        "max_flat_workgroup_size": int(meta.get("max_flat_workgroup_size", 0)),
        "waves_per_simd": _isa.waves_per_simd(vgpr),
        "mfma": _isa.mfma_counts(fn),
        "isa_stats": _isa.isa_stats(fn),
        "e8m0": _isa.e8m0_summary(fn),
        "isa_path": str(isa_path),
        "isa_sha256": _isa.sha256_text(text),
    }


def compile_facts(
    launcher: Callable,
    args: Sequence[Any],
    *,
    arch: str,
    describe: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Compile ``launcher(*args)`` (a ``@flyc.jit`` function) for ``arch`` and return its facts."""
    dump = _dump_dir()
    if dump.exists():
        shutil.rmtree(dump)  # stale listings from an earlier compile would be read as ours
    dump.mkdir(parents=True)
    if os.environ.get("COMPILE_ONLY") != "1" or os.environ.get("FLYDSL_GPU_ARCH") != arch:
        raise RuntimeError("compile_facts must run under toolchain.apply_compile_env(arch, ...)")
    t0 = time.perf_counter()
    ir_text = _compat.compile_only(launcher, args)
    seconds = time.perf_counter() - t0
    metas = _isa.parse_kernel_metadata(ir_text)
    if not metas:
        raise RuntimeError("the compiled module carries no #gpu.kernel_metadata")
    kernels = [kernel_facts(name, meta, _final_isa(dump, name)) for name, meta in metas.items()]
    # The version that compiled (read here, in the compiling process) goes into every artifact.
    return {"arch": arch, "flydsl": _compat.version(), "compile_seconds": round(seconds, 3), "kernels": kernels,
            **({"describe": describe} if describe else {})}
