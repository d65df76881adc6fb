"""How `skill-run e2e` routes an fp8 block-scale MoE layer: at the Python level, not through an aten op.

No single aten call carries this problem: the baseline a PyTorch user runs on the lent H200
(``references.build_cublas_per_expert``, the named fallback) is a loop of ``_scaled_mm`` calls per
active expert with routing, SiLU, the fp8 re-quantization of h and the top-k sum around them, and
DeepGEMM / vLLM launch their kernels from Python. The layer is therefore routed where it is one
call: the run of the baseline's launch,

    run({"a", "a_scale", "w1", "w1_scale", "w2", "w2_scale", "topk_ids", "topk_weights"}, out)

which ``PY_TARGETS`` wraps. A user's own MoE layer function needs its own entry here (same idea:
read the layer's arguments as this problem's inputs). The port's prepared weights are reused while
the weight tensors are unchanged (``static``).
"""
from __future__ import annotations

from skillrun_kernels._moe.routing import refresher, shape_key, wrap_layer_builder
from skillrun_kernels.protocol import RoutedCall

from . import problem

ATEN_OPS: tuple[str, ...] = ()
_WEIGHTS = ("w1", "w1_scale", "w2", "w2_scale")
_PER_CALL = ("a", "a_scale", "topk_ids", "topk_weights")
TARGET = "skillrun_kernels.fp8_blockscale_moe.references:build_cublas_per_expert"


def plan_key(shape: dict) -> tuple:
    return shape_key(shape, problem.SHAPE_KEYS)


_refresh = refresher(_PER_CALL)


def layer_call(p: dict, out) -> RoutedCall | str:
    """The layer's problem from the baseline launch's operands, or why they are not one."""
    missing = [k for k in (*_WEIGHTS, *_PER_CALL) if k not in p]
    if missing:
        return f"operands {missing} missing"
    a, w1, w2 = p["a"], p["w1"], p["w2"]
    if a.dim() != 2 or w1.dim() != 3 or w2.dim() != 3 or p["topk_ids"].dim() != 2:
        return "operand ranks are not (tokens, D), (E, 2I, D), (E, D, I), (tokens, topk)"
    if a.dtype != problem.FP8_DTYPE or w1.dtype != problem.FP8_DTYPE or w2.dtype != problem.FP8_DTYPE:
        return f"operands are not {problem.FP8_DTYPE} (a {a.dtype}, w1 {w1.dtype}, w2 {w2.dtype})"
    shape = {"tokens": a.shape[0], "model_dim": a.shape[1], "inter_dim": w2.shape[-1], "experts": w1.shape[0],
             "topk": p["topk_ids"].shape[1]}
    try:
        problem.dims(shape)
    except ValueError as exc:
        return str(exc)
    inputs = {k: p[k] for k in (*_WEIGHTS, *_PER_CALL)}
    return RoutedCall(shape=shape, inputs=inputs, out=out, static=_WEIGHTS, refresh=_refresh)


PY_TARGETS = {TARGET: wrap_layer_builder(TARGET, layer_call)}
