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
        if not own:
            problems.append("the slot declares no expect_kernels regex, so which kernel ran cannot be proven")
        elif not seen:
            problems.append("no device kernel was recorded in the profiled window")
        else:
            unexpected = [n for n in seen if not _search(own, n)]
            if unexpected:
                problems.append(f"unexpected kernels (not matching {own!r}): " + ", ".join(unexpected[:5]))
    elif own and own_required and not any(_search(own, n) for n in seen):
        problems.append(f"none of the host ops matches the slot's own {own!r}")
    if problems:
        gate["passed"] = False
        gate["reason"] = "; ".join(problems)
    else:
        gate["reason"] = (f"{len(seen)} device kernel name(s), all matching the slot's regex, none another slot's" if device
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


def profile_names(fn: Callable[[], Any], launches: int, use_device: bool, sync: Callable[[], None]) -> tuple[list[str], list[str]]:
    """(device kernel names, host event names) seen while calling ``fn`` ``launches`` times."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU]
    if use_device:
        acts.append(ProfilerActivity.CUDA)
    with profile(activities=acts) as prof:
        for _ in range(launches):
            with record_function(HARNESS_SCOPE):
                fn()
        sync()
    device, host = [], []
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        if dt is not None and dt != torch.autograd.DeviceType.CPU:
            device.append(e.name)
        else:
            host.append(e.name)
    return device, host


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
