"""The host side of MoE routing: expert row groups for oracles, and the e2e wrapper of a layer builder.

torch only (no Triton): problem modules and oracles import this on any machine.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

import torch


def expert_rows(topk_ids: torch.Tensor) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield (expert, token indices, slot indices) for every expert that received tokens, experts in
    increasing order, each expert's (token, slot) pairs in token order."""
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
    start = 0
    topk = topk_ids.shape[1]
    for e, c in zip(experts.tolist(), counts.tolist()):
        pairs = order[start:start + c]
        start += c
        yield e, pairs // topk, pairs % topk


def shape_key(shape: dict, keys: tuple[str, ...]) -> tuple:
    """A route's ``plan_key``: the problem's dimensions in its key order."""
    return tuple(int(shape[k]) for k in keys)


def refresher(per_call: tuple[str, ...]) -> Callable[[dict, dict], dict]:
    """A ``RoutedCall.refresh``: the port's prepared operands with this call's per-call inputs."""
    def refresh(prepared: dict, inputs: dict) -> dict:
        return {**prepared, **{k: inputs[k] for k in per_call}}

    return refresh


def wrap_layer_builder(target: str, layer_call: Callable[[dict, Any], Any]):
    """The ``PY_TARGETS`` wrapper of a layer builder (``build(shape, config, device) -> KernelLaunch``):
    each ``run(p, out)`` of the launches it builds is offered to e2e's ``route`` as ``layer_call(p, out)``
    (a ``RoutedCall``, or the reason it is not one), with the original run as the thunk that arm A runs
    itself; a call the plan does not select runs the original."""
    def wrap(original, route):
        @functools.wraps(original)
        def build(shape, config, device):
            launch = original(shape, config, device)
            baseline_run = launch.run

            def run(p, out):
                routed, value = route(target, layer_call(p, out), lambda: baseline_run(p, out))
                return value if routed else baseline_run(p, out)

            launch.run = run
            return launch

        return build

    return wrap
