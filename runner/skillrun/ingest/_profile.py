"""Assemble a ranked :class:`~skillrun.models.Profile` from per-kernel aggregates.

Every reader reduces its input to calls of ``ProfileBuilder.add`` — one per (kernel name, device,
launching op, graph or not) group — and the builder does the rest the same way for all formats:
ranking, shares, op aggregation, shape recovery (:mod:`skillrun.ingest.shapes`), provenance, and the
time we could not attribute to a shape.

Values a trace cannot mean (a negative or non-finite duration, a problem dimension past 2**31) are
never silently clamped into the numbers: each is counted in ``Profile.anomalies`` and summarised in
a warning; the bad time is left out of every share and the bad shape is not planned.

Every string kept from the trace (kernel and op names, ``Input type``, ``Concrete Inputs``, device
names, warnings) is scrubbed of secrets here, once, so ``--json``, reports and agent results all
see the same redacted text.
"""
from __future__ import annotations

import math
import statistics
from array import array
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from skillrun.ingest import shapes
from ..models import DeviceInfo, DeviceTime, GraphCapture, GraphReplay, KernelStat, OpCall, Profile
from skillrun.ingest.names import kernel_category
from skillrun.io.redact import scrub, scrub_text
from .arch import dedupe_warnings, resolve_arch, trace_arch


# No GEMM/MoE dimension reaches 2**31 (a 2**31-row fp8 operand alone is 2 GiB per column).
MAX_DIM = 1 << 31

# Per-call durations kept for medians, over all kernels of a profile (8 bytes each): past it a
# kernel's median is not reported rather than estimated.
MAX_SAMPLES = 4_000_000

# Launch facts a trace may carry per kernel (Profile KernelStat.launch keys).
LAUNCH_KEYS = ("registers_per_thread", "shared_mem_bytes", "static_shared_mem_bytes", "dynamic_shared_mem_bytes",
               "local_mem_per_thread", "vgprs", "agprs", "sgprs", "lds_bytes", "scratch_bytes")

# Profile.anomalies keys
NEGATIVE_DURATION = "negative_duration"
NON_FINITE_DURATION = "non_finite_duration"
NON_FINITE_TIMESTAMP = "non_finite_timestamp"
ABSURD_SHAPE = "absurd_shape"
IMPOSSIBLE_DURATION = "impossible_duration"
KERNEL_TIME_EXCEEDS_SPAN = "kernel_time_exceeds_span"

# No single kernel runs an hour (drivers' watchdogs and every real trace end far sooner); a
# longer "duration" (1.5e308 µs sums to inf and turns every share into NaN) is a broken or forged value.
MAX_CALL_US = 3.6e9
# At most this many kernels run at once on one device (H100/MI300 hardware queues allow 128):
# more kernel time than this many times the device's span means duplicated events.
MAX_CONCURRENT_KERNELS = 128
# Names are kept to this many characters (matching reads 4096 of them: names.MAX_NAME_LEN); a
# 200 MB "kernel name" must not be held, printed or written whole. Longer ones are cut and counted.
MAX_KEPT_NAME = 8192
NAME_TRUNCATED = "name_truncated"
# Distinct kernel names kept; past it calls are summed under one row and counted (real traces
# have a few thousand; a million forged names would otherwise cost gigabytes downstream).
MAX_DISTINCT_KERNELS = 100_000
KERNELS_PAST_CAP = "kernels_past_name_cap"
OTHER_KERNELS = "<other kernels: past the distinct-name cap>"


def absurd_dims(shape: Optional[dict]) -> bool:
    """A recovered problem shape no real kernel has (negative, or a dimension >= 2**31)."""
    return bool(shape) and any(not isinstance(v, int) or v < 0 or v >= MAX_DIM for v in shape.values())


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
    short_name: Optional[str] = None
    min_us: Optional[float] = None
    max_us: Optional[float] = None
    minmax_known: bool = True  # False once a group of several calls came without its min/max
    device_calls: dict[int, int] = field(default_factory=dict)
    # Per-call durations (median, std-dev): kept while every group brings them and the profile-wide
    # cap allows; else only the sum of squares (std-dev) or the reader's own statistics.
    samples: Optional[array] = None
    samples_ok: bool = True
    sumsq: float = 0.0
    sumsq_ok: bool = True
    given_stats: Optional[tuple] = None  # (median, std) from a format that only gives statistics
    groups: int = 0
    launch: dict[str, int] = field(default_factory=dict)  # registers, shared/LDS, VGPRs, scratch …


def busy_span(intervals) -> tuple[float, float]:
    """(busy, span) of (start, end) intervals in one unit: busy is the length of their union
    (overlapping streams count once), span runs from the first start to the last end."""
    ivs = sorted((float(a), float(b)) for a, b in intervals if b == b and a == a and b >= a)
    if not ivs:
        return 0.0, 0.0
    busy = 0.0
    cur_s, cur_e = ivs[0]
    last = cur_e
    for a, b in ivs[1:]:
        if a > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = a, b
        elif b > cur_e:
            cur_e = b
        last = max(last, b)
    busy += cur_e - cur_s
    return busy, max(last, cur_e) - ivs[0][0]


def busy_span_arrays(starts, ends) -> tuple[float, float]:
    """:func:`busy_span` over two parallel columns; no per-interval objects when starts are sorted
    (the usual case within one device of a Kineto trace)."""
    n = len(starts)
    if n == 0:
        return 0.0, 0.0
    if any(starts[i] > starts[i + 1] for i in range(n - 1)):
        return busy_span(zip(starts, ends))
    busy = 0.0
    cur_s, cur_e = starts[0], ends[0]
    last = cur_e
    for i in range(1, n):
        a, b = starts[i], ends[i]
        if a > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = a, b
        elif b > cur_e:
            cur_e = b
        if b > last:
            last = b
    busy += cur_e - cur_s
    return busy, last - starts[0]


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
        self.captures = 0  # stream captures (cudaStreamBeginCapture…EndCapture) the trace records
        self.captured_launches = 0  # kernel launches recorded inside them (they build a graph, run nothing)
        self.vendor_hint: Optional[str] = None
        self.kernel_devices: set[int] = set()
        self.anomalies: dict[str, int] = {}
        # (op name, dims, types) → the length of the per-batch loop it runs in (readers that see
        # call order fill it; see ._loops)
        self.loop_batch: dict[tuple, int] = {}
        self._timeline: dict[int, tuple[float, float]] = {}  # device → (busy µs, span µs)

    def note(self, kind: str, n: int = 1) -> None:
        """Count ``n`` values of one anomaly kind (see the module docstring)."""
        if n > 0:
            self.anomalies[kind] = self.anomalies.get(kind, 0) + n

    def timeline(self, device: Optional[int], busy_us: float, span_us: float) -> None:
        """Record one device's busy time and span (see :func:`busy_span`) for idle-time reporting."""
        d = device if isinstance(device, int) else -1
        b0, s0 = self._timeline.get(d, (0.0, 0.0))
        self._timeline[d] = (b0 + max(0.0, busy_us), s0 + max(0.0, span_us))

    def add(self, name: str, total_us: float, calls: int = 1, device: Optional[int] = None,
            op: Optional[OpRef] = None, graph: bool = False, grid: Any = None, block: Any = None,
            demangled: Optional[str] = None, min_us: Optional[float] = None, max_us: Optional[float] = None,
            short_name: Optional[str] = None, samples=None, sumsq: Optional[float] = None,
            median_us: Optional[float] = None, std_us: Optional[float] = None,
            launch: Optional[dict] = None) -> None:
        """One group of ``calls`` executions of kernel ``name``. ``samples`` (their durations in µs,
        one per call), else ``sumsq`` (the sum of their squares), else ``median_us``/``std_us`` (a
        format's own statistics, usable only when the kernel comes in one group) give the spread."""
        if not isinstance(name, str) or not name:
            name = "<unnamed kernel>"
        if len(name) > MAX_KEPT_NAME:
            self.note(NAME_TRUNCATED, calls)
            name = name[:MAX_KEPT_NAME] + f"…[{len(name) - MAX_KEPT_NAME} more characters]"
        if isinstance(demangled, str) and len(demangled) > MAX_KEPT_NAME:
            demangled = demangled[:MAX_KEPT_NAME] + "…"
        if isinstance(short_name, str) and len(short_name) > MAX_KEPT_NAME:
            short_name = short_name[:MAX_KEPT_NAME] + "…"
        if name not in self._k and len(self._k) >= MAX_DISTINCT_KERNELS:
            self.note(KERNELS_PAST_CAP, calls)
            name, op, demangled, short_name, grid, block = OTHER_KERNELS, None, None, None, None, None
        if op is not None and len(op.name) > MAX_KEPT_NAME:
            op = replace(op, name=op.name[:MAX_KEPT_NAME] + "…")
        total_us = float(total_us)
        if not math.isfinite(total_us):
            self.note(NON_FINITE_DURATION, calls)
            total_us = 0.0  # left out of every share (counted, reported)
        elif total_us < 0:
            self.note(NEGATIVE_DURATION, calls)
            total_us = 0.0
        elif calls > 0 and (total_us / calls > MAX_CALL_US or (isinstance(max_us, (int, float)) and max_us > MAX_CALL_US)):
            self.note(IMPOSSIBLE_DURATION, calls)
            total_us = 0.0
            min_us = max_us = None
        k = self._k.get(name)
        if k is None:
            k = self._k[name] = _KernelAgg(name=name)
        k.total_us += total_us
        k.calls += calls
        k.groups += 1
        self._spread(k, total_us, calls, samples, sumsq, median_us, std_us)
        if launch:
            for key, v in launch.items():
                if key in LAUNCH_KEYS and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 40):
                    k.launch.setdefault(key, v)
        if calls == 1 and min_us is None and max_us is None:
            min_us = max_us = total_us
        if min_us is None or max_us is None or not (min_us == min_us and max_us == max_us):
            if calls > 0:
                k.minmax_known = False
        else:
            k.min_us = max(0.0, float(min_us)) if k.min_us is None else min(k.min_us, max(0.0, float(min_us)))
            k.max_us = float(max_us) if k.max_us is None else max(k.max_us, float(max_us))
        if short_name and not k.short_name and isinstance(short_name, str):
            k.short_name = short_name
        if device is not None:
            k.devices[device] = k.devices.get(device, 0.0) + total_us
            k.device_calls[device] = k.device_calls.get(device, 0) + calls
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

    _kept = 0

    def _spread(self, k: _KernelAgg, total_us: float, calls: int, samples, sumsq, median_us, std_us) -> None:
        if calls <= 0:
            return
        if samples is None and calls == 1:
            samples = (total_us,)
        if samples is not None and len(samples) == calls:
            if k.sumsq_ok:
                k.sumsq += math.fsum(x * x for x in samples)
            if k.samples_ok and self._kept + calls <= MAX_SAMPLES:
                if k.samples is None:
                    k.samples = array("d")
                k.samples.extend(samples)
                self._kept += calls
            else:
                k.samples_ok = False
        else:
            k.samples_ok = False
            if sumsq is not None and math.isfinite(sumsq) and sumsq >= 0:
                k.sumsq += sumsq
            else:
                k.sumsq_ok = False
        if median_us is not None or std_us is not None:
            k.given_stats = (median_us, std_us)

    @staticmethod
    def _stats(k: _KernelAgg) -> tuple[Optional[float], Optional[float]]:
        """(median, sample std-dev) of one call's duration, where the trace lets us know them."""
        med = std = None
        if k.samples_ok and k.samples is not None and len(k.samples) == k.calls:
            med = statistics.median(k.samples)
            std = statistics.stdev(k.samples) if k.calls > 1 else 0.0
        elif k.sumsq_ok and k.calls > 1:
            mean = k.total_us / k.calls
            std = math.sqrt(max(0.0, (k.sumsq - k.calls * mean * mean) / (k.calls - 1)))
        elif k.sumsq_ok and k.calls == 1:
            std = 0.0
        if k.given_stats is not None and k.groups == 1:
            g_med, g_std = k.given_stats
            med = g_med if med is None and isinstance(g_med, (int, float)) and g_med >= 0 else med
            std = g_std if std is None and isinstance(g_std, (int, float)) and g_std >= 0 else std
        return (round(med, 3) if med is not None else None, round(std, 3) if std is not None else None)

    def build(self, arch: Optional[str] = None) -> Profile:
        total = sum(k.total_us for k in self._k.values())
        calls = sum(k.calls for k in self._k.values())
        stats: list[KernelStat] = []
        linked = 0
        unattributed = 0.0
        graph_calls = 0
        graph_us = 0.0
        dev_total: dict[int, float] = {}
        dev_calls: dict[int, int] = {}
        for k in self._k.values():
            for d, us in k.devices.items():
                dev_total[d] = dev_total.get(d, 0.0) + us
                dev_calls[d] = dev_calls.get(d, 0) + k.device_calls.get(d, 0)
        per_device = len([d for d, us in dev_total.items() if us > 0]) > 1
        crowded = self._crowded_devices(dev_total, dev_calls, total, calls)
        category_us: dict[str, float] = {}
        for k in self._k.values():
            ops: list[OpCall] = []
            for agg in sorted(k.ops.values(), key=lambda a: (-a.total_us, a.ref.name)):
                ref = agg.ref
                if ref.dims is not None:
                    sh = shapes.op_shape(ref.name, _thaw(ref.dims), _thaw(ref.types), _thaw(ref.concrete))
                    shape, prov = sh.shape, "trace"
                    if absurd_dims(shape):
                        self.note(ABSURD_SHAPE, agg.calls)
                        shape, prov = None, "unresolved"  # never planned
                    ops.append(OpCall(op=scrub_text(ref.name), input_dims=_thaw(ref.dims),
                                      input_types=scrub(_thaw(ref.types)), input_strides=_thaw(ref.strides),
                                      concrete_inputs=scrub(_thaw(ref.concrete)), calls=agg.calls,
                                      total_us=round(agg.total_us, 3), shape=shape, dtype=sh.dtype,
                                      scale_recipe=sh.scale_recipe, provenance=prov,
                                      loop_batch=self.loop_batch.get((ref.name, ref.dims, ref.types))))
                else:
                    ops.append(OpCall(op=scrub_text(ref.name), calls=agg.calls, total_us=round(agg.total_us, 3),
                                      provenance="unresolved"))
            provenance = "trace" if k.linked_calls else "unresolved"
            unattr = k.unlinked_us
            if k.unlinked_calls:
                named = shapes.shape_from_kernel_name(k.name)
                if named is not None and absurd_dims(named.shape):
                    self.note(ABSURD_SHAPE, k.unlinked_calls)
                    named = None
                if named is not None:
                    ops.append(OpCall(op=scrub_text(k.name.split("<", 1)[0].replace("void ", "").strip()),
                                      calls=k.unlinked_calls, total_us=round(k.unlinked_us, 3),
                                      shape=named.shape, dtype=named.dtype, provenance="kernel-name"))
                    if not k.linked_calls:
                        provenance = "kernel-name"
                    unattr = 0.0
            device = next(iter(k.devices)) if len(k.devices) == 1 else None
            dpct = {d: round(100.0 * us / dev_total[d], 4) for d, us in sorted(k.devices.items()) if dev_total.get(d)}
            # Multi-GPU: a kernel's share is of one device's time, on the device where it is largest.
            pct = max(dpct.values()) if per_device and dpct else (100.0 * k.total_us / total if total > 0 else 0.0)
            cat = kernel_category(k.name, k.demangled, [o.op for o in ops])
            category_us[cat] = category_us.get(cat, 0.0) + k.total_us
            known = k.minmax_known and k.min_us is not None
            med, std = self._stats(k)
            stats.append(KernelStat(
                name=scrub_text(k.name), demangled=scrub_text(k.demangled) if k.demangled else None,
                total_us=round(k.total_us, 3), calls=k.calls,
                pct_gpu=round(pct, 4),
                avg_us=round(k.total_us / k.calls, 3) if k.calls else 0.0,
                min_us=round(k.min_us, 3) if known else None, max_us=round(k.max_us, 3) if known else None,
                device=device, device_us={d: round(us, 3) for d, us in sorted(k.devices.items())},
                device_pct=dpct if per_device else {},
                short_name=scrub_text(k.short_name) if k.short_name else None, category=cat, ops=ops,
                shape_provenance=provenance, graph_replayed_calls=k.graph_calls,
                unattributed_us=round(unattr, 3), grid=k.grid, block=k.block,
                median_us=med, std_us=std, launch=dict(k.launch)))
            linked += k.linked_calls
            unattributed += unattr
            graph_calls += k.graph_calls
            graph_us += k.graph_us
        stats.sort(key=lambda s: (-s.total_us, s.name))
        warnings = list(self.warnings)
        own = trace_arch(self.devices, [s.name for s in stats[:200]]) if arch else None
        resolved = resolve_arch(self.devices, arch, (s.name for s in stats[:200]), warnings, self.vendor_hint)
        if self.captures:
            warnings.append(f"graph capture: this trace records {self.captures} stream capture(s) "
                            f"(…StreamBeginCapture…EndCapture) with {self.captured_launches} kernel launch(es) inside; "
                            "captured launches build a graph and run nothing, so they are not in the kernel times "
                            f"({calls} kernel executions were recorded). Profile the graph's replays to time them")
        if not stats:
            warnings.append("no GPU kernel executions found in the trace")
        for d, kernel_us, span_us in crowded:
            warnings.append(f"device {d}: {kernel_us / 1000:.3f} ms of kernel time inside a {span_us / 1000:.3f} ms span "
                            f"(more than {MAX_CONCURRENT_KERNELS} kernels at once): duplicated events? The times are "
                            "shown as the trace gives them")
        if self.anomalies:
            warnings.append("values the trace cannot mean were left out (not clamped into the numbers): "
                            + ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in sorted(self.anomalies.items())))
        for d in self.devices:
            if d.name:
                d.name = scrub_text(d.name)
        return Profile(
            source=self.source, format=self.format, devices=self.devices, arch=resolved,
            arch_from_trace=own if own and own != resolved else None,
            anomalies=dict(sorted(self.anomalies.items())),
            total_kernel_us=round(total, 3), kernel_calls=calls, kernels=stats,
            graph_replay=GraphReplay(detected=bool(self.graph_launches or graph_calls),
                                     launches=self.graph_launches, kernel_calls=graph_calls,
                                     total_us=round(graph_us, 3)),
            graph_capture=GraphCapture(detected=bool(self.captures), captures=self.captures,
                                       captured_launches=self.captured_launches),
            unattributed_us=round(unattributed, 3), linked_calls=linked,
            device_time=self._device_time(dev_total, dev_calls),
            category_us={c: round(us, 3) for c, us in sorted(category_us.items(), key=lambda kv: -kv[1])},
            warnings=[scrub_text(w) for w in dedupe_warnings(warnings)])

    def _crowded_devices(self, dev_total: dict[int, float], dev_calls: dict[int, int], total: float,
                         calls: int) -> list[tuple[int, float, float]]:
        """Devices whose kernel time cannot fit in their timeline's span; each counted in anomalies."""
        out = []
        for d, (_, span) in sorted(self._timeline.items()):
            kernel_us, n = (dev_total.get(d, 0.0), dev_calls.get(d, 0)) if d >= 0 else (total, calls)
            if d < 0 and dev_total:
                continue
            if span > 0 and kernel_us > span * MAX_CONCURRENT_KERNELS:
                self.note(KERNEL_TIME_EXCEEDS_SPAN, n)
                out.append((max(d, 0), kernel_us, span))
        return out

    def _device_time(self, dev_total: dict[int, float], dev_calls: dict[int, int]) -> list[DeviceTime]:
        out = []
        for d in sorted(set(dev_total) | {x for x in self._timeline if x >= 0}):
            busy, span = self._timeline.get(d, (None, None))
            out.append(DeviceTime(device=d, kernel_us=round(dev_total.get(d, 0.0), 3), calls=dev_calls.get(d, 0),
                                  busy_us=round(busy, 3) if busy is not None else None,
                                  span_us=round(span, 3) if span is not None else None,
                                  idle_us=round(max(0.0, span - busy), 3) if busy is not None else None))
        if not out and -1 in self._timeline:  # the format names no device: one anonymous timeline
            busy, span = self._timeline[-1]
            total = sum(dev_total.values()) or sum(k.total_us for k in self._k.values())
            out.append(DeviceTime(device=0, kernel_us=round(total, 3), calls=sum(k.calls for k in self._k.values()),
                                  busy_us=round(busy, 3), span_us=round(span, 3), idle_us=round(max(0.0, span - busy), 3)))
        return out
