"""How `skill-run e2e` routes an a16wi4 MoE layer: at the Python level, not through an aten op.

The baseline a PyTorch user runs (``references.build_dequant_grouped_bf16``) dequantizes the int4
experts to bf16 before its only GEMM op (``aten::_grouped_mm``), so no single aten call carries
this problem's inputs (the int4 weights and their group scales are gone by then). The layer is
therefore routed where it is one call: the run of the baseline's launch,

    run({"x", "w1_q", "w1_scale", "w2_q", "w2_scale", "topk_ids", "topk_weights"}, out)

which ``PY_TARGETS`` wraps. A user's own MoE layer function needs its own entry here (same idea:
read the layer's arguments as this problem's inputs).

The packed int4 weights (``prepare``) are reused while the weight tensors are unchanged
(``static``): a deployment packs the experts once, at load time.
"""
from __future__ import annotations

from skillrun_kernels.protocol import RoutedCall

from . import problem

ATEN_OPS: tuple[str, ...] = ()
_WEIGHTS = ("w1_q", "w1_scale", "w2_q", "w2_scale")
_PER_CALL = ("x", "topk_ids", "topk_weights")
TARGET = "skillrun_kernels.moe_a16wi4.references:build_dequant_grouped_bf16"


def plan_key(shape: dict) -> tuple:
    return tuple(int(shape[k]) for k in problem.SHAPE_KEYS)


def _refresh(prepared: dict, inputs: dict) -> dict:
    return {**prepared, **{k: inputs[k] for k in _PER_CALL}}


def layer_call(p: dict, out) -> RoutedCall | str:
    """The layer's problem from the baseline launch's operands (its ``prepare`` passes them through)."""
    missing = [k for k in (*_WEIGHTS, *_PER_CALL) if k not in p]
    if missing:
        return f"operands {missing} missing"
    x, w1, s1, w2 = p["x"], p["w1_q"], p["w1_scale"], p["w2_q"]
    if x.dim() != 2 or w1.dim() != 3 or w2.dim() != 3 or s1.dim() != 3 or s1.shape[-1] < 1:
        return "operand ranks are not (tokens, D), (E, 2I, D), (E, D, I)"
    shape = {"tokens": x.shape[0], "model_dim": x.shape[1], "inter_dim": w2.shape[-1], "experts": w1.shape[0],
             "topk": p["topk_ids"].shape[1], "group_size": x.shape[1] // s1.shape[-1]}
    try:
        problem.dims(shape)
    except ValueError as exc:
        return str(exc)
    inputs = {k: p[k] for k in (*_WEIGHTS, *_PER_CALL)}
    return RoutedCall(shape=shape, inputs=inputs, out=out, static=_WEIGHTS, refresh=_refresh)


def _wrap_builder(original, route):
    def build_dequant_grouped_bf16(shape, config, device):
        launch = original(shape, config, device)
        baseline_run = launch.run

        def run(p, out):
            routed, value = route(TARGET, layer_call(p, out), lambda: baseline_run(p, out))
            return value if routed else baseline_run(p, out)

        launch.run = run
        return launch

    build_dequant_grouped_bf16.__doc__ = original.__doc__
    build_dequant_grouped_bf16.__wrapped__ = original
    return build_dequant_grouped_bf16


PY_TARGETS = {TARGET: _wrap_builder}
