"""The contract between the runner and kernel content.

An operator family lives in ``kernels/<family>/`` and provides a ``problem`` module:

    SHAPE_KEYS: tuple[str, ...]                      # e.g. ("M", "N", "K")
    make_inputs(shape, seed, device) -> dict        # fresh random inputs (never zeros)
    oracle(inputs) -> torch.Tensor                  # fp32 dequant reference
    output_like(shape, device) -> torch.Tensor      # an empty output of the right shape/dtype
    flops(shape) -> float                           # useful FLOPs (2·M·N·K for a GEMM)
    min_bytes(shape) -> float                       # fewest bytes a kernel must move

A kernel (port, baseline, or oracle-as-kernel) is referenced from a card as ``module:function``;
the function is a *builder*:

    build(shape: dict, config: dict, device: str) -> KernelLaunch

Building compiles/JITs (untimed). ``prepare`` turns problem inputs into the kernel's operands
(preshuffle, scale layouts; untimed); ``run`` is the timed launch and writes into ``out`` when the
kernel can (so the harness can poison ``out`` and catch unwritten elements).

FlyDSL modules additionally expose ``compile_only(shape, config, arch) -> dict`` returning the
compiled facts (vgpr/agpr/spills/scratch/LDS, ISA opcode counts) for static gating on a CPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


class UnsupportedShape(ValueError):
    """The kernel (often a vendor baseline) does not support this shape; not a numerical failure."""


class ReferenceUnavailable(ImportError):
    """The reference's library is not importable on this machine (e.g. ``mslk`` not installed).

    The harness records the reference as ``unavailable`` with this text; it is never replaced by
    another kernel. (The worker reports it as ``ReferenceUnavailable: <text>``.)
    """


@dataclass
class KernelLaunch:
    name: str
    run: Callable[[Any, Any], Any]  # run(prepared, out) -> output tensor
    prepare: Callable[[dict], Any] = lambda inputs: inputs
    # Regex of the device kernel names this slot is expected to launch (slot integrity):
    # the harness checks that the profiler saw these, and only these, inside the timed window.
    expect_kernels: str | None = None
    describe: dict[str, Any] = field(default_factory=dict)
