"""Slot integrity: prove which kernel ran in each timed slot.

A port that secretly calls the vendor kernel, or returns the baseline's output, would time and
verify as "correct and fast". Two checks catch that:

* **names**: torch.profiler records a sample of each slot's launches. On a GPU the device kernel
  names seen must all match the slot's ``KernelLaunch.expect_kernels`` regex and none may match
  another slot's. On a CPU there are no device kernels; host ops and ``record_function`` scopes are
  checked instead against ``describe["expect_host_ops"]`` (falling back to ``expect_kernels``):
  another slot's ops must not appear, and a slot that declares host ops must show them.
* **aliasing**: the port's output must not share storage with a reference's output or with any
  input/prepared operand (a "kernel" returning its input, or a cached baseline result).

``evaluate_names`` is pure so it can be tested without a profiler.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable

# Scopes the harness itself opens around launches; never counted as a slot's own work.
HARNESS_SCOPE = "skillrun::slot"
_IGNORED_HOST = re.compile(r"^(skillrun::|ProfilerStep|\[memory\]|cudaDeviceSynchronize|hipDeviceSynchronize)")


def _search(regex: str, name: str) -> bool:
    try:
        return re.search(regex, name) is not None
    except re.error:
        return False


def evaluate_names(slot: str, own: str | None, others: dict[str, str | None], names: Iterable[str], *, device: bool,
                   own_required: bool = True) -> dict[str, Any]:
    """One gate for one slot from the names seen in its profiled window.

    ``device``: the names are device kernels (strict: all must be the slot's own). Otherwise they
    are host events (loose: only foreign names fail, and the own regex is required only when
    ``own_required``).
    """
    seen = sorted({n for n in names if n and not (not device and _IGNORED_HOST.search(n))})
    gate: dict[str, Any] = {"name": f"slot_integrity:{slot}", "passed": True, "value": seen[:20],
                            "limit": {"expect": own, "not": {k: v for k, v in others.items() if v}},
                            "level": "device kernels" if device else "host ops"}
    problems = []
    for bad in (f"{k}: invalid regex" for k, v in {slot: own, **others}.items() if v and not _valid(v)):
        problems.append(bad)
    foreign = {n: k for n in seen for k, rx in others.items() if rx and _search(rx, n)}
    if foreign:
        problems.append("saw kernels of another slot: " + ", ".join(f"{n} ({k})" for n, k in sorted(foreign.items())[:5]))
    if device:
        kernels = [n for n in seen if not _RUNTIME_FILL.search(n)]
        fills = sorted(set(seen) - set(kernels))
        if fills:
            gate["runtime_fills"] = fills
        if not own:
            problems.append("the slot declares no expect_kernels regex, so which kernel ran cannot be proven")
        elif not kernels:
            problems.append("no device kernel was recorded in the profiled window")
        else:
            unexpected = [n for n in kernels if not _search(own, n)]
            if unexpected:
                problems.append(f"unexpected kernels (not matching {own!r}): " + ", ".join(unexpected[:5]))
    elif own and own_required and not any(_search(own, n) for n in seen):
        problems.append(f"none of the host ops matches the slot's own {own!r}")
    if problems:
        gate["passed"] = False
        gate["reason"] = "; ".join(problems)
    else:
        gate["reason"] = (f"{len([n for n in seen if not _RUNTIME_FILL.search(n)])} device kernel name(s), all matching the "
                          "slot's regex, none another slot's" if device
                          else ("host ops only (no device kernels on this backend): "
                                + ("own ops seen, " if own and own_required else "own kernels not visible on the host, ")
                                + "no other slot's ops"))
    return gate


def _valid(rx: str) -> bool:
    try:
        re.compile(rx)
        return True
    except re.error:
        return False


# Runtime fills (cudaMemsetAsync / hipMemsetAsync) cannot carry a result from another slot, and vendor
# libraries issue them around their kernels (cuBLAS before some fp16 GEMMs on the H200), so they are
# listed but not held against a slot. Copies are not exempt: a memcpy can move a cached answer.
_RUNTIME_FILL = re.compile(r"^(Memset|memset|hipMemset)")


def split_events(events: Iterable[Any]) -> tuple[list[str], list[str]]:
    """(device activity names, host event names) from profiler events.

    ``record_function`` scopes are mirrored on the GPU timeline as user annotations (seen on the
    H200: ``skillrun::slot`` with a CUDA device type); they are not kernels and are dropped from the
    device list, by the event's flag where torch has it and by name (a name that is also a host
    event) otherwise.
    """
    device, host = [], []
    for e in events:
        dt = getattr(e, "device_type", None)
        on_device = dt is not None and getattr(dt, "name", str(dt)) not in ("CPU", "DeviceType.CPU")
        (device if on_device and not getattr(e, "is_user_annotation", False) else host).append(e.name)
    host_set = set(host)
    return [n for n in device if n not in host_set], host


def profile_names(fn: Callable[[], Any], launches: int, use_device: bool, sync: Callable[[], None]) -> tuple[list[str], list[str]]:
    """(device kernel names, host event names) seen while calling ``fn`` ``launches`` times."""
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU]
    if use_device:
        acts.append(ProfilerActivity.CUDA)
    with profile(activities=acts) as prof:
        for _ in range(launches):
            with record_function(HARNESS_SCOPE):
                fn()
        sync()
    return split_events(prof.events())


def tensors_in(obj: Any, depth: int = 0) -> list[Any]:
    """Every tensor reachable from a prepared-operand structure (dicts, lists, dataclasses)."""
    import torch

    if depth > 6:
        return []
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v, depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_in(v, depth + 1)]
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return [t for v in vars(obj).values() for t in tensors_in(v, depth + 1)]
    return []


def _span(t: Any) -> tuple[int, int]:
    start = t.untyped_storage().data_ptr()
    return start, start + t.untyped_storage().nbytes()


def aliasing_gate(port_out: Any, others: dict[str, Any]) -> dict[str, Any]:
    """Fail if the port's output overlaps the storage of any tensor in ``others`` (label -> tensors)."""
    lo, hi = _span(port_out)
    hits = []
    for label, tensors in others.items():
        for t in tensors_in(tensors):
            a, b = _span(t)
            if a < hi and lo < b and (hi > lo):
                hits.append(label)
                break
    gate = {"name": "port_output_aliasing", "passed": not hits, "value": sorted(set(hits))}
    gate["reason"] = ("the port's output shares memory with " + ", ".join(sorted(set(hits)))
                      + ": it did not compute its own result") if hits else "the port's output is its own memory"
    return gate
