"""Every place our kernels touch FlyDSL beyond its public ``flydsl.compiler``/``flydsl.expr`` API.

FlyDSL is young and changes between releases; the ports must compile under every release in the
tested range (:data:`TESTED`), so anything version-sensitive lives here and nowhere else:

* the version string (recorded in every compile artifact, read in the process that compiled);
* the compile-only entry point (``JitFunction._compile_only``) and where the compiled artifact is
  kept (``_last_compiled``), both private in 0.4.2 and 0.5.0;
* the MLIR bindings and dialects ``dsl.py`` builds raw ops with (``flydsl._mlir``).

When a release moves one of these, add the new spelling here behind a version or attribute
check; a release outside the range gets a clear error naming what is missing.
"""
from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any, Callable, Sequence

TESTED = ("0.4.2", "0.5.0")  # oldest and newest release CI compiles the FlyDSL kernels with
SPEC = ">=0.4.2,<0.6"  # pyproject's flydsl extra


def version() -> str | None:
    try:
        return metadata.version("flydsl")
    except metadata.PackageNotFoundError:
        return None


def _parse(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def in_tested_range(v: str | None) -> bool:
    return bool(v) and (0, 4, 2) <= _parse(v) < (0, 6, 0)


def _unsupported(what: str) -> RuntimeError:
    return RuntimeError(f"FlyDSL {version() or '?'} has no {what}; the kernels are tested with FlyDSL "
                        f"{TESTED[0]} to {TESTED[1]} (pip install 'flydsl{SPEC}')")


def compile_only(launcher: Callable, args: Sequence[Any]) -> str:
    """Compile a ``@flyc.jit`` launcher for the target set in the environment without launching
    it; returns the compiled module's text (with ``#gpu.kernel_metadata``)."""
    fn = getattr(launcher, "_compile_only", None)
    if fn is None:
        raise _unsupported("JitFunction._compile_only (compile without a device)")
    fn(*args)
    last = getattr(launcher, "_last_compiled", None)
    if not last:
        raise RuntimeError("FlyDSL returned no compiled artifact (is the disk cache disabled?)")
    artifact = last[1] if isinstance(last, tuple) else last
    ir = getattr(artifact, "ir", None)
    if ir is None:
        raise _unsupported("CompiledArtifact.ir (the compiled module text)")
    return ir if isinstance(ir, str) else str(ir)


def mlir():
    """``(ir, dialects)``: FlyDSL's bundled MLIR bindings, dialects by name (arith, llvm, math,
    rocdl, scf, vector)."""
    try:
        ir = importlib.import_module("flydsl._mlir.ir")
    except ImportError:
        raise _unsupported("flydsl._mlir (its bundled MLIR Python bindings)") from None

    class _Dialects:
        def __getattr__(self, name: str):
            try:
                return importlib.import_module(f"flydsl._mlir.dialects.{name}")
            except ImportError:
                raise _unsupported(f"MLIR dialect {name!r} under flydsl._mlir.dialects") from None

    return ir, _Dialects()
