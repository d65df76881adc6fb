"""How `skill-run e2e` sees a row-wise ``aten::_scaled_mm`` call (one batch of a per-batch loop).

    torch._scaled_mm(xq[b], wq[b].t(), scale_a=(M, 1), scale_b=(1, N), out_dtype=torch.bfloat16)
    -> problem inputs with batch = 1: xq (1, M, K), wq (1, N, K), x_scale (1, M), w_scale (1, N)

``_scaled_mm`` is 2-D, so a user's batched row-wise GEMM is a loop of such calls; each call is
routed on its own as a batch-1 problem. The planned shape's batch is therefore not part of the
match (``plan_key`` is (M, N, K)), and the batched launch that is this port's lever (one launch
for all batches) is NOT what an e2e run of a per-batch loop measures: it measures the port at
batch 1, B launches, as a drop-in for each call.

The bundled baseline (``references.build_scaled_mm_loop``, what benchmarks/workloads runs) is also
routed as a whole at the Python level (``PY_TARGETS``): its per-batch operands are equally spaced
views of one (B, M, K) / (B, N, K) tensor, so the batched problem is rebuilt from them without a
copy and the port runs once for all B batches, as it would in a model that calls it directly.

Tensor-wise or block-wise scales, a bias, a result scale and non-bf16 outputs are passed through
(counted with the reason). The weight operand's prepared form is reused while the weight tensor
is unchanged (``static``): a deployment prepares weights once.
"""
from __future__ import annotations

import torch

from skillrun_kernels.protocol import RoutedCall

ATEN_OPS = ("aten::_scaled_mm",)
FP8 = torch.float8_e4m3fn


def plan_key(shape: dict) -> tuple:
    return (int(shape["M"]), int(shape["N"]), int(shape["K"]))


def _refresh(prepared: dict, inputs: dict) -> dict:
    return {**prepared, "xq": inputs["xq"], "x_scale": inputs["x_scale"], "w_scale": inputs["w_scale"]}


def problem_call(op: str, args: dict) -> RoutedCall | str:
    a, b, sa, sb = args["self"], args["mat2"], args["scale_a"], args["scale_b"]
    if a.dim() != 2 or b.dim() != 2:
        return "not a 2-D GEMM"
    if a.dtype != FP8 or b.dtype != FP8:
        return f"operands {a.dtype}/{b.dtype}, not float8_e4m3fn"
    M, K = a.shape
    N = b.shape[1]
    if b.shape[0] != K:
        return "inner dimensions differ"
    if tuple(sa.shape) != (M, 1) or tuple(sb.shape) != (1, N) or M * N == 1:
        return "scales are not row-wise (M, 1) x (1, N)"
    if sa.dtype != torch.float32 or sb.dtype != torch.float32:
        return "row-wise scales are not fp32"
    if args.get("bias") is not None:
        return "has a bias (the port has no bias epilogue)"
    if args.get("scale_result") is not None:
        return "has a result scale"
    if args.get("out_dtype") is not torch.bfloat16:
        return f"out_dtype {args.get('out_dtype')} (the port writes bf16)"
    out = args.get("out")
    if out is None:
        out = torch.empty((M, N), dtype=torch.bfloat16, device=a.device)
    elif tuple(out.shape) != (M, N) or out.dtype != torch.bfloat16:
        return "out= is not an (M, N) bf16 tensor"
    inputs = {
        "xq": a.unsqueeze(0),
        "wq": b.t().unsqueeze(0),
        "x_scale": sa.reshape(1, M),
        "w_scale": sb.reshape(1, N),
    }
    # The op returns the (M, N) tensor itself (the very ``out=`` object for the out overload).
    return RoutedCall(shape={"batch": 1, "M": M, "N": N, "K": K}, inputs=inputs, out=out.unsqueeze(0),
                      result=lambda _o, target=out: target, static=("wq",), refresh=_refresh)


# ------------------------------------------------------------------------------------------------
# The whole per-batch loop of the bundled baseline, as one batched problem


LOOP_TARGET = "skillrun_kernels.fp8_rowwise_batched_gemm.references:build_scaled_mm_loop"


def stacked(views: list) -> "torch.Tensor | None":
    """(B, ...) view over B same-shaped views spaced evenly in one storage; None if they are not."""
    if not views:
        return None
    v0 = views[0]
    if len(views) == 1:
        return v0.unsqueeze(0)
    size = v0.element_size()
    step = views[1].data_ptr() - v0.data_ptr()
    if step <= 0 or step % size:
        return None
    base = v0.untyped_storage().data_ptr()
    for b, v in enumerate(views):
        if (v.data_ptr() != v0.data_ptr() + b * step or v.shape != v0.shape or v.stride() != v0.stride()
                or v.dtype != v0.dtype or v.untyped_storage().data_ptr() != base):
            return None
    return v0.as_strided((len(views), *v0.shape), (step // size, *v0.stride()))


def loop_call(p: dict, out) -> RoutedCall | str:
    """The batched problem behind the baseline loop's prepared operands (no copies)."""
    try:
        xq, bt, sa, sb = (stacked(list(p[k])) for k in ("a", "bt", "sa", "sb"))
    except (KeyError, TypeError):
        return "not the per-batch loop's operands"
    if xq is None or bt is None or sa is None or sb is None:
        return "the per-batch operands are not views of one batched tensor"
    if xq.dtype != FP8 or bt.dtype != FP8 or sa.shape[-1] != 1 or sb.shape[-2] != 1:
        return "not fp8 operands with row-wise scales"
    if out.dim() != 3 or out.dtype != torch.bfloat16:
        return "the output is not (B, M, N) bf16"
    bsz, m, n = out.shape
    k = xq.shape[-1]
    if xq.shape[0] != bsz or bt.shape[1:] != (k, n) or xq.shape[1] < m:
        return "operand shapes do not fit the output"
    inputs = {"xq": xq[:, :m], "wq": bt.transpose(1, 2), "x_scale": sa[:, :m, 0], "w_scale": sb[:, 0, :]}
    return RoutedCall(shape={"batch": bsz, "M": m, "N": n, "K": k}, inputs=inputs, out=out, static=("wq",), refresh=_refresh)


def _wrap_loop(original, route):
    def build_scaled_mm_loop(shape, config, device):
        launch = original(shape, config, device)
        baseline_run = launch.run

        def run(p, out):
            routed, value = route(LOOP_TARGET, loop_call(p, out), lambda: baseline_run(p, out))
            return value if routed else baseline_run(p, out)

        launch.run = run
        return launch

    build_scaled_mm_loop.__doc__ = original.__doc__
    build_scaled_mm_loop.__wrapped__ = original
    return build_scaled_mm_loop


PY_TARGETS = {LOOP_TARGET: _wrap_loop}
