"""What the trace's own call is, and which of a card's references reproduces it.

A plan item is worth what the port gains over the code the user runs, and that code is in the
trace: the launching op and its operands. Three facts of the call decide which reference is the
user's:

* the scale layout of a block-scale ``aten::_scaled_mm``: whether the 128x128 weight scales' K-block
  axis is padded to a multiple of 4 (cuBLASLt reads an unpadded axis wrongly when K/128 is not one:
  the call returns wrong results, silently);
* a loop of N identical calls per profiler step (one per batch) versus one batched call;
* eager launches versus CUDA/HIP graph replays.

A card lists, under ``references.trace_calls``, which reference reproduces which call (content, not
engine): the first entry whose keys all hold is the user's call. :func:`call_pattern` reads the
facts off an op of the trace; :func:`trace_reference` picks the entry.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from skillrun.models import KernelStat, OpCall

BLOCK = 128  # the block-scale recipes' K block (1x128 activations, 128x128 weights)


def _dims(x: Any) -> Optional[list[int]]:
    if isinstance(x, (list, tuple)) and x and all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        return list(x)
    return None


def _scale_b_layout(oc: OpCall) -> tuple[Optional[bool], Optional[str]]:
    """(padded, words) for a block-scale _scaled_mm's weight scales; (None, None) where it does not apply.

    ``padded`` is None also where K/128 is already a multiple of 4 (padding changes nothing there)."""
    if oc.scale_recipe != "blockwise_1x128_128x128" or not oc.shape or "K" not in oc.shape or len(oc.input_dims) < 4:
        return None, None
    k_blocks = math.ceil(oc.shape["K"] / BLOCK)
    dims = _dims(oc.input_dims[3])
    strides = _dims(oc.input_strides[3]) if len(oc.input_strides) > 3 else None
    if dims is None or len(dims) != 2:
        return None, None
    extent = max(dims[0], strides[1] if strides and len(strides) == 2 and strides[0] == 1 else 0)
    shown = f"scale_b {dims}" + (f" with strides {tuple(strides)}" if strides else "")
    if k_blocks % 4 == 0:
        return None, f"{shown}: K/128 = {k_blocks}, a multiple of 4"
    if extent >= k_blocks + (-k_blocks) % 4:
        return True, f"{shown}: K/128 = {k_blocks}, padded to {extent}"
    return False, f"{shown}: K/128 = {k_blocks}, not padded to a multiple of 4"


def call_pattern(oc: OpCall, kernel: Optional[KernelStat] = None) -> dict[str, Any]:
    """The facts of the trace's call that decide which reference reproduces it, and a sentence for people.

    Keys: ``op``, ``scale_recipe``, ``scale_b_padded`` (True / False / None: not applicable),
    ``loop`` (a loop of identical calls per step), ``calls_per_step``, ``graph``, ``description``.
    """
    padded, scale_words = _scale_b_layout(oc)
    loop = bool(oc.loop_batch and oc.loop_batch > 1)
    graph = bool(kernel is not None and kernel.graph_replayed_calls > 0)
    words = [oc.op]
    if scale_words:
        words.append(scale_words)
    if loop:
        words.append(f"a loop of {oc.loop_batch} identical calls per profiler step, not one batched call")
    words.append("CUDA/HIP graph replays" if graph else "eager launches")
    return {"op": oc.op, "scale_recipe": oc.scale_recipe, "scale_b_padded": padded, "loop": loop,
            "calls_per_step": oc.loop_batch if loop else None, "graph": graph, "description": "; ".join(words)}


_KEYS = ("op", "scale_b_padded", "loop", "graph")


def trace_reference(trace_calls: list[dict[str, Any]] | None, pattern: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The first ``references.trace_calls`` entry whose keys all hold for ``pattern`` (None: no entry does)."""
    for entry in trace_calls or []:
        if all(pattern.get(k) == entry[k] for k in _KEYS if k in entry):
            return dict(entry)
    return None
