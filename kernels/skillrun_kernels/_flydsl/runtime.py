"""Running a FlyDSL port: compile-only facts on a CPU, or compile-then-launch on a ROCm device."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from . import toolchain

ConfigT = TypeVar("ConfigT")


def ensure_compile_env(arch: str, tag: str) -> Path:
    """Make this process a compile-only FlyDSL process for ``arch``; returns the ISA dump folder.

    ``SKILLRUN_ISA_DIR`` (set by the runner's child process) chooses where listings are kept;
    otherwise a fresh temporary folder is used.
    """
    base = os.environ.get("SKILLRUN_ISA_DIR")
    dump = Path(base) / tag if base else Path(tempfile.mkdtemp(prefix=f"flydsl-{tag}-"))
    toolchain.apply_compile_env(arch, dump_dir=dump)
    return dump


def compile_only(make: Callable[[], tuple[Callable, Sequence[Any]]], *, arch: str, tag: str, describe: dict) -> dict:
    """Build the launcher and placeholder arguments with ``make()`` and return the compiled facts."""
    ensure_compile_env(arch, tag)
    from .compiled import compile_facts

    launcher, args = make()
    return compile_facts(launcher, args, arch=arch, describe=describe)


def compile_stream_launcher(
    make_launcher: Callable[[], Callable],
    placeholders: Callable[[], Sequence[Any]],
    *,
    arch: str,
    tag: str,
    describe: dict,
) -> dict:
    """:func:`compile_only` for a launcher whose last argument is the stream: ``placeholders()``
    (meta tensors and scalars, built after the compile env is set) followed by a null stream."""

    def make() -> tuple[Callable, Sequence[Any]]:
        import flydsl.expr as fx

        return make_launcher(), (*placeholders(), fx.Stream(None))

    return compile_only(make, arch=arch, tag=tag, describe=describe)


def config_from_dict(cls: type[ConfigT], config: dict | None, owner: str) -> ConfigT:
    """Build the dataclass ``cls`` from a recipe's config dict; unknown keys are an error naming ``owner``."""
    config = dict(config or {})
    known = cls.__dataclass_fields__  # type: ignore[attr-defined]
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ValueError(f"{owner}: unknown config keys {unknown}; known: {sorted(known)}")
    return cls(**config)


def check_mfma_tiles(tm: int, tn: int, tk: int, K: int, *, waves: int, nthreads: int, k_step: int = 128) -> None:
    """The tile rules of the 16x16 MFMA GEMM cores whose waves split N: 16-row M steps, 16 columns
    per wave, whole 128-K steps that divide K, and an A tile copied 16 bytes per thread per step."""
    from skillrun_kernels.protocol import UnsupportedShape

    if tm % 16 or tm < 16:
        raise UnsupportedShape(f"tile_m={tm} must be a positive multiple of 16")
    if tn % (16 * waves):
        raise UnsupportedShape(f"tile_n={tn} must be a multiple of {16 * waves} ({waves} waves x 16 columns)")
    if tk % k_step or K % tk:
        raise UnsupportedShape(f"tile_k={tk} must be a multiple of {k_step} that divides K={K}")
    if (tm * tk) % (16 * nthreads):
        raise UnsupportedShape(f"tile_m*tile_k={tm * tk} must be a multiple of {16 * nthreads} (16 B per thread per copy step)")


def waves_per_eu_attrs(waves_per_eu: int) -> dict[str, str] | None:
    """Kernel attributes for a waves-per-EU occupancy hint; 0 means no hint (LLVM's default)."""
    return {"rocdl.waves_per_eu": str(waves_per_eu)} if waves_per_eu else None


def flat_out_run(launch: Callable, prep_keys: Sequence[str], *scalars: Any) -> Callable[[dict, Any], Any]:
    """A ``KernelLaunch.run`` that calls ``launch(out.view(-1), prep[k]..., *scalars, stream)`` on the
    current torch stream and returns ``out``."""

    def run(prep: dict, out: Any) -> Any:
        import torch

        launch(out.view(-1), *(prep[k] for k in prep_keys), *scalars, torch.cuda.current_stream())
        return out

    return run


def rocm_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available() and getattr(torch.version, "hip", None))


def device_arch() -> str:
    """The gfx target of the current ROCm device (``gcnArchName`` without feature flags)."""
    import torch

    name = torch.cuda.get_device_properties(torch.cuda.current_device()).gcnArchName
    return name.split(":")[0]


class DeviceLaunch:
    """Compile on the first call with the real HIP tensors (which also launches once), then reuse.

    ``flyc.compile`` with live device arguments compiles and launches; the returned
    ``CompiledFunction`` is FlyDSL's fast path (prebuilt argument slots, no retrace) for later calls.
    """

    def __init__(self, launcher: Callable):
        self._launcher = launcher
        self._compiled = None

    def __call__(self, *args: Any) -> None:
        if self._compiled is None:
            import flydsl.compiler as flyc

            self._compiled = flyc.compile(self._launcher, *args)
            return
        self._compiled(*args)


def require_rocm(what: str) -> str:
    """The device arch, or a clear error when there is no ROCm device to launch ``what`` on."""
    if not rocm_available():
        raise RuntimeError(
            f"{what} launches through FlyDSL's HIP runtime and needs a ROCm device "
            "(torch.cuda with torch.version.hip); use compile_only() for static checks on a CPU"
        )
    os.environ.setdefault("FLYDSL_GPU_ARCH", device_arch())
    return os.environ["FLYDSL_GPU_ARCH"]
