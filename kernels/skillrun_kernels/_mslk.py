"""MSLK's production ops (meta-pytorch/MSLK) as reference kernels, on CUDA and on ROCm.

``mslk-cuda`` (CUTLASS on sm_90) and ``mslk-rocm`` (CK / FlyDSL on gfx9xx) register the same
``torch.ops.mslk.*`` names with the same schemas, so one builder per op serves the sm_90 cards and
the gfx950 cards alike. ``mslk`` is imported only when a reference is built (the runner and CI run
without it; ``pip install skillrun[peers]`` brings ``mslk-cuda==1.1.0``).

Two ways a reference can fail to be a reference, both recorded, never papered over with another
kernel:

* ``mslk`` (or the op) is not importable here -> :class:`ReferenceUnavailable` (status ``unavailable``);
* the op raises for this shape (a TORCH_CHECK, "cutlass cannot implement", a cuBLAS refusal, or
  the dispatcher saying it has no kernel for this device, e.g. CPU tensors) ->
  :class:`UnsupportedShape` with MSLK's own text (status ``unsupported``). Errors that leave the
  device broken (illegal address, device-side assert) are re-raised as they are: they are faults.

and one refusal of ours: a shape an op would run but not compute right (the int4 ops at a group size
their CUTLASS kernel cannot serve, :func:`require_int4_group`) -> UnsupportedShape before any run.

Op schemas used here are those of MSLK v1.1.0 (csrc/gemm/gemm_ops.cpp), the wheel the H200 gets.
"""
from __future__ import annotations

from typing import Any, Callable

from skillrun_kernels.protocol import ReferenceUnavailable, UnsupportedShape

PIN = "mslk-cuda==1.1.0"

# Device kernel names the MSLK ops launch (slot integrity). Read from the string table of the
# mslk-cuda 1.1.0 wheel's mslk.so (not yet from a device trace: UNVERIFIED until the first device
# run records them): MSLK builds its GEMMs with CUTLASS_NAMESPACE=mslk, so every CUTLASS GEMM kernel
# there is `cutlass_mslk::device_kernel<...GemmUniversal...>` (mangled `_ZN12cutlass_mslk13device_kernel`;
# 5606 block-scaled ones among them), the grouped ops add MSLK's argument-setup kernels
# (`mslk::gemm::set_kernel_args`, `set_stacked_kernel_args_kernel`, ...). The plain `cutlass::`
# kernels in that library are attention/conv kernels, and torch's own CUTLASS GEMMs
# (torch._scaled_grouped_mm, torch._grouped_mm) are plain `cutlass::` too, so they are NOT accepted:
# an MSLK slot that ran torch's kernel instead fails integrity. On ROCm, CK kernels (`ck::` /
# `_ZN2ck`, `kernel_gemm_xdl...`), unread. None of these can match the ports' anchored Triton names.
MSLK_CUDA_KERNELS = r"cutlass_mslk|_ZN\d+cutlass_mslk|mslk::gemm::\w*kernel_args|_ZN4mslk4gemm\w*kernel_args"
MSLK_ROCM_KERNELS = r"_ZN2ck|\bck::|kernel_gemm_xdl|kernel_batched_gemm|kernel_grouped_gemm"
MSLK_KERNELS = f"{MSLK_CUDA_KERNELS}|{MSLK_ROCM_KERNELS}"

# Text of errors after which the device is not usable: a fault, not a refusal of the shape.
_FATAL = ("illegal memory access", "illegal address", "device-side assert", "unspecified launch failure",
          "misaligned address", "an illegal instruction")


def version() -> str | None:
    """The installed MSLK distribution and version (mslk-cuda / mslk-rocm), or None."""
    from importlib import metadata

    for dist in ("mslk-cuda", "mslk-rocm", "mslk"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    import sys

    mod = sys.modules.get("mslk")  # imported from a source tree (no distribution metadata)
    return f"mslk {getattr(mod, '__version__', 'unknown')}" if mod is not None else None


def namespace():
    """``torch.ops.mslk`` after ``import mslk`` (which registers the ops), or ReferenceUnavailable."""
    try:
        import mslk  # noqa: F401  (registers torch.ops.mslk.*)
    except Exception as exc:  # ImportError, or a shared library that does not load against this torch
        raise ReferenceUnavailable(
            f"mslk is not importable here ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            f"it comes with `pip install skillrun[peers]` ({PIN}) on CUDA or mslk-rocm on ROCm") from None
    import torch

    return torch.ops.mslk


def op(name: str):
    """One MSLK op by name, or ReferenceUnavailable naming the op and the installed version."""
    ns = namespace()
    try:
        return getattr(ns, name)
    except (AttributeError, RuntimeError) as exc:
        raise ReferenceUnavailable(f"{version() or 'mslk'} registers no torch.ops.mslk.{name} ({exc})") from None


def backend_name() -> str:
    import torch

    return "ck" if getattr(torch.version, "hip", None) else "cutlass"


def _shape_text(shape: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in shape.items())


# CUTLASS's sm_90 mixed-input (bf16 x int4) GEMM reads one scale per K tile of 64 (MSLK's tile
# K for these ops) or one for the whole K, so it can serve a group size that is a multiple of 64 or
# equal to K. Its ``can_implement`` would refuse other sizes only when host problem shapes are
# passed, and MSLK 1.1.0's grouped op passes none: at group 32 it runs and applies the wrong scales
# (measured on the H200 at b3bfb7f: bf16i4bf16_shuffled_grouped failed the fp32 oracle on every
# shape). So the refusal is ours, made before anything runs.
INT4_K_TILE = 64


def require_int4_group(name: str, shape: dict, group: int, ks: dict[str, int]) -> None:
    """UnsupportedShape unless ``group`` is a multiple of 64 or equals K, for every GEMM's K in ``ks``."""
    bad = {what: k for what, k in ks.items() if group % INT4_K_TILE and group != k}
    if bad:
        where = ", ".join(f"{what} K={k}" for what, k in bad.items())
        raise UnsupportedShape(
            f"torch.ops.mslk.{name} cannot serve {_shape_text(shape)}: its CUTLASS sm_90 mixed-input GEMM takes a "
            f"group size that is a multiple of {INT4_K_TILE} or equals K, and group {group} is neither for {where}; "
            f"MSLK does not refuse it itself (it would run with wrong scales), so it is not run")


def guarded(name: str, shape: dict, fn: Callable[[], Any]) -> Any:
    """``fn()``, with MSLK refusing this shape turned into UnsupportedShape (MSLK's text kept)."""
    try:
        return fn()
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        text = str(exc).strip()
        if any(f in text.lower() for f in _FATAL):
            raise
        first = " / ".join(ln.strip() for ln in text.splitlines()[:3] if ln.strip())[:600]
        raise UnsupportedShape(f"torch.ops.mslk.{name} raised for {_shape_text(shape)}: {type(exc).__name__}: {first}") from exc
