"""The contract between the runner and kernel content.

An operator family lives in ``kernels/<family>/`` and provides a ``problem`` module:

    SHAPE_KEYS: tuple[str, ...]                      # e.g. ("M", "N", "K")
    make_inputs(shape, seed, device) -> dict        # fresh random inputs (never zeros)
    oracle(inputs) -> torch.Tensor                  # fp32 dequant reference
    output_like(shape, device) -> torch.Tensor      # an empty output of the right shape/dtype
    flops(shape) -> float                           # useful FLOPs (2·M·N·K for a GEMM)
    min_bytes(shape) -> float                       # fewest bytes a kernel must move
    ci_shape(shape | None) -> dict                  # optional: the small shape CI compiles a recipe at,
                                                    # given its representative shape (same config class)
    WEIGHTS: tuple[str, ...]                        # input keys that are weights (e.g. ("b", "b_scale"))
    PREPARED_ACTIVATIONS: tuple[str, ...]           # optional: activation scales prepare() may re-lay out

A kernel (port, baseline, or oracle-as-kernel) is referenced from a card as ``module:function``;
the function is a *builder*:

    build(shape: dict, config: dict, device: str) -> KernelLaunch

Building compiles/JITs (untimed). ``prepare`` turns problem inputs into the kernel's operands
(preshuffle, scale layouts; untimed); ``run`` is the timed launch and writes into ``out`` when the
kernel can (so the harness can poison ``out`` and catch unwritten elements). A port's ``prepare``
sees the content of its family's ``WEIGHTS`` (and ``PREPARED_ACTIVATIONS``) only: every other input
holds a decoy's values when ``prepare`` runs and its real values only afterwards, in the same buffer
(skillrun.execute.operands). So ``prepare`` may pack weights and keep references (or views) to
activations, but any work on an activation's values belongs in ``run``, where it is timed.

FlyDSL and Triton/Gluon (sm_90) port modules additionally expose
``compile_only(shape, config, arch) -> dict``: compile exactly what ``build(shape, config)`` would
launch, on a CPU, and return ``{"arch", "kernels": [{"name", ...facts}], ...}``. FlyDSL facts are
vgpr/agpr/spills/scratch/LDS and ISA opcode counts (static gates, ``skill-run check``); a Triton port
(``arch="sm_90a"``) reports per GEMM kernel ``regs``, ``spill_store_bytes``, ``shared_bytes``,
``fits_smem``, ``wgmma``, ``mma_sync`` and ``ptxas_wgmma_serialized``, read through
``skillrun_kernels._triton.compile`` (benchmarks/compile_check_sm90.py, tests/test_triton_sm90_compile.py).
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


# ---------------------------------------------------------------------------------------------
# Routing a user's workload through a port (`skill-run e2e`). A family that can be routed has a
# ``route`` module beside its ``problem`` module:
#
#     ATEN_OPS: tuple[str, ...]                         # e.g. ("aten::_scaled_mm",)
#     problem_call(op: str, args: dict) -> RoutedCall | str
#         ``args`` holds the op's schema arguments by name (defaults filled in); return the call
#         as this family's problem, or a short reason why this call is not one (another scale
#         recipe, a bias, an output dtype the port does not write): the reason is counted.
#     plan_key(shape: dict) -> tuple                    # which planned shape a call's shape uses
#     PY_TARGETS: dict[str, wrapper]                    # optional: "module:attr" -> wrap(original, route)
#
# ``route(target, call, run_original)`` (given by the engine to a PY_TARGETS wrapper) returns
# (True, value) when it ran the call (the port in the routed arm; ``run_original()``, a thunk
# running the wrapped original, in the as-is arm) and (False, None) when the original must run.
# Passing ``run_original`` lets the as-is arm run it with the calls it makes inside not counted
# as routable again (the routed arm never makes them), and check its output against the oracle.


@dataclass
class RoutedCall:
    """One intercepted call seen as the family's problem."""

    shape: dict  # the problem shape of this call (problem.SHAPE_KEYS)
    inputs: dict  # the problem's inputs (views of the op's arguments; never copies of activations)
    out: Any  # the tensor the port writes (the op's ``out=`` or a fresh one of the op's result type)
    result: Callable[[Any], Any] = lambda out: out  # the op's return value, from ``out``
    # Input keys that hold weights: the port's prepared form of them may be reused while these
    # tensors are unchanged (same storage, shape, strides and version counter); None: no reuse.
    static: tuple[str, ...] | None = None
    # Puts this call's per-call inputs into a prepared value made for an earlier call with the
    # same static inputs (needed when ``static`` is given).
    refresh: Callable[[Any, dict], Any] | None = None
