"""Assemble a ranked :class:`~skillrun.models.Profile` from per-kernel aggregates.

Every reader reduces its input to calls of ``ProfileBuilder.add`` — one per (kernel name, device,
launching op, graph or not) group — and the builder does the rest the same way for all formats:
ranking, shares, op aggregation, shape recovery (:mod:`skillrun.shapes`), provenance, and the
time we could not attribute to a shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .. import shapes
from ..models import DeviceInfo, GraphReplay, KernelStat, OpCall, Profile
from .arch import dedupe_warnings, resolve_arch


@dataclass(frozen=True)
class OpRef:
    """The launching op of a group of kernel calls, as recorded by the profiler."""

    name: str
    dims: Optional[tuple] = None  # None: the op was found but carried no Input Dims
    types: tuple = ()
    strides: tuple = ()
    concrete: tuple = ()


def _freeze(x: Any) -> Any:
    if isinstance(x, list):
        return tuple(_freeze(v) for v in x)
    return x


def _thaw(x: Any) -> Any:
    if isinstance(x, tuple):
        return [_thaw(v) for v in x]
    return x


def make_opref(name: str, args: Optional[dict]) -> OpRef:
    """OpRef from a cpu_op's args dict (only the shape-bearing fields are kept)."""
    if not isinstance(args, dict) or "Input Dims" not in args or not isinstance(args.get("Input Dims"), list):
        return OpRef(name=name)

    def lst(key: str) -> tuple:
        v = args.get(key)
        return _freeze(v) if isinstance(v, list) else ()

    return OpRef(name=name, dims=lst("Input Dims"), types=lst("Input type"), strides=lst("Input Strides"),
                 concrete=lst("Concrete Inputs"))


@dataclass
class _OpAgg:
    ref: OpRef
    calls: int = 0
    total_us: float = 0.0


@dataclass
class _KernelAgg:
    name: str
    total_us: float = 0.0
    calls: int = 0
    devices: dict[int, float] = field(default_factory=dict)
    graph_calls: int = 0
    graph_us: float = 0.0
    linked_calls: int = 0
    linked_us: float = 0.0
    ops: dict[tuple, _OpAgg] = field(default_factory=dict)
    unlinked_calls: int = 0  # calls with no op that has dims
    unlinked_us: float = 0.0
    grid: Optional[list[int]] = None
    block: Optional[list[int]] = None
    demangled: Optional[str] = None


def _dims3(v: Any) -> Optional[list[int]]:
    if isinstance(v, (list, tuple)) and 1 <= len(v) <= 3 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                 for x in v):
        return list(v)
    return None


class ProfileBuilder:
    def __init__(self, source: str, fmt: str):
        self.source = source
        self.format = fmt
        self._k: dict[str, _KernelAgg] = {}
        self.devices: list[DeviceInfo] = []
        self.warnings: list[str] = []
        self.graph_launches = 0
        self.vendor_hint: Optional[str] = None
        self.kernel_devices: set[int] = set()
        # (op name, dims, types) → the length of the per-batch loop it runs in (readers that see
        # call order fill it; see ._loops)
        self.loop_batch: dict[tuple, int] = {}

    def add(self, name: str, total_us: float, calls: int = 1, device: Optional[int] = None,
            op: Optional[OpRef] = None, graph: bool = False, grid: Any = None, block: Any = None,
            demangled: Optional[str] = None) -> None:
        if not isinstance(name, str) or not name:
            name = "<unnamed kernel>"
        total_us = float(total_us) if total_us == total_us else 0.0  # NaN → 0
        if total_us < 0:
            total_us = 0.0
        k = self._k.get(name)
        if k is None:
            k = self._k[name] = _KernelAgg(name=name)
        k.total_us += total_us
        k.calls += calls
        if device is not None:
            k.devices[device] = k.devices.get(device, 0.0) + total_us
        if graph:
            k.graph_calls += calls
            k.graph_us += total_us
        if k.grid is None:
            k.grid = _dims3(grid)
        if k.block is None:
            k.block = _dims3(block)
        if demangled and not k.demangled:
            k.demangled = demangled
        if op is not None:
            key = (op.name, op.dims, op.types)
            agg = k.ops.get(key)
            if agg is None:
                agg = k.ops[key] = _OpAgg(ref=op)
            agg.calls += calls
            agg.total_us += total_us
        if op is not None and op.dims is not None:
            k.linked_calls += calls
            k.linked_us += total_us
        else:
            k.unlinked_calls += calls
            k.unlinked_us += total_us

    def build(self, arch: Optional[str] = None) -> Profile:
        total = sum(k.total_us for k in self._k.values())
        calls = sum(k.calls for k in self._k.values())
        stats: list[KernelStat] = []
        linked = 0
        unattributed = 0.0
        graph_calls = 0
        graph_us = 0.0
        for k in self._k.values():
            ops: list[OpCall] = []
            for agg in sorted(k.ops.values(), key=lambda a: (-a.total_us, a.ref.name)):
                ref = agg.ref
                if ref.dims is not None:
                    sh = shapes.op_shape(ref.name, _thaw(ref.dims), _thaw(ref.types), _thaw(ref.concrete))
                    ops.append(OpCall(op=ref.name, input_dims=_thaw(ref.dims), input_types=_thaw(ref.types),
                                      input_strides=_thaw(ref.strides), concrete_inputs=_thaw(ref.concrete),
                                      calls=agg.calls, total_us=round(agg.total_us, 3), shape=sh.shape,
                                      dtype=sh.dtype, scale_recipe=sh.scale_recipe, provenance="trace",
                                      loop_batch=self.loop_batch.get((ref.name, ref.dims, ref.types))))
                else:
                    ops.append(OpCall(op=ref.name, calls=agg.calls, total_us=round(agg.total_us, 3),
                                      provenance="unresolved"))
            provenance = "trace" if k.linked_calls else "unresolved"
            unattr = k.unlinked_us
            if k.unlinked_calls:
                named = shapes.shape_from_kernel_name(k.name)
                if named is not None:
                    ops.append(OpCall(op=k.name.split("<", 1)[0].replace("void ", "").strip(),
                                      calls=k.unlinked_calls, total_us=round(k.unlinked_us, 3),
                                      shape=named.shape, dtype=named.dtype, provenance="kernel-name"))
                    if not k.linked_calls:
                        provenance = "kernel-name"
                    unattr = 0.0
            device = next(iter(k.devices)) if len(k.devices) == 1 else None
            stats.append(KernelStat(
                name=k.name, demangled=k.demangled, total_us=round(k.total_us, 3), calls=k.calls,
                pct_gpu=round(100.0 * k.total_us / total, 4) if total > 0 else 0.0,
                avg_us=round(k.total_us / k.calls, 3) if k.calls else 0.0, device=device, ops=ops,
                shape_provenance=provenance, graph_replayed_calls=k.graph_calls,
                unattributed_us=round(unattr, 3), grid=k.grid, block=k.block))
            linked += k.linked_calls
            unattributed += unattr
            graph_calls += k.graph_calls
            graph_us += k.graph_us
        stats.sort(key=lambda s: (-s.total_us, s.name))
        warnings = list(self.warnings)
        resolved = resolve_arch(self.devices, arch, (s.name for s in stats[:200]), warnings, self.vendor_hint)
        if not stats:
            warnings.append("no GPU kernel executions found in the trace")
        return Profile(
            source=self.source, format=self.format, devices=self.devices, arch=resolved,
            total_kernel_us=round(total, 3), kernel_calls=calls, kernels=stats,
            graph_replay=GraphReplay(detected=bool(self.graph_launches or graph_calls),
                                     launches=self.graph_launches, kernel_calls=graph_calls,
                                     total_us=round(graph_us, 3)),
            unattributed_us=round(unattributed, 3), linked_calls=linked, warnings=dedupe_warnings(warnings))
