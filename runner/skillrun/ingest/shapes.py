"""Turn a launching op's recorded arguments into a problem shape, a dtype and a scale recipe.

torch.profiler (``record_shapes=True``) stores, per ``cpu_op`` event, ``Input Dims`` (one list per
argument, ``[]`` for scalars and ``None``), ``Input type`` (``c10::BFloat16``, ``float``, ``Scalar``,
``''`` …) and, in newer builds, ``Input Strides`` and ``Concrete Inputs``. Everything here is a pure
function of those lists, so the rules can be tested without a trace and extended without touching
the ingestion code: register a rule for another op with :func:`register_op_rule`.

Shapes use the keys of :data:`skillrun.models.SHAPE_KEYS` (M, N, K, batch, tokens, experts, topk,
model_dim, inter_dim, group_size).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

# torch's spelling of element types in ``Input type`` → our normalized dtype names.
_TYPE_NAMES = {
    "c10::float8_e4m3fn": "fp8_e4m3",
    "c10::float8_e4m3fnuz": "fp8_e4m3_fnuz",
    "c10::float8_e5m2": "fp8_e5m2",
    "c10::float8_e5m2fnuz": "fp8_e5m2_fnuz",
    "c10::float8_e8m0fnu": "fp8_e8m0",
    "c10::float4_e2m1fn_x2": "fp4_e2m1",
    "c10::bfloat16": "bf16",
    "c10::half": "fp16",
    "float": "fp32",
    "double": "fp64",
    "long int": "int64",
    "long": "int64",
    "int": "int32",
    "short int": "int16",
    "short": "int16",
    "signed char": "int8",
    "unsigned char": "uint8",
    "bool": "bool",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
    "c10::complex<c10::half>": "complex32",
    "c10::qint8": "qint8",
    "c10::quint8": "quint8",
    "c10::quint4x2": "int4",
}

# c10::ScalarType enum values as they appear in ``Concrete Inputs`` (e.g. _scaled_mm's out_dtype).
# Only values that have been stable across torch releases are listed.
SCALAR_TYPE_CODES = {
    "0": "uint8",
    "1": "int8",
    "2": "int16",
    "3": "int32",
    "4": "int64",
    "5": "fp16",
    "6": "fp32",
    "7": "fp64",
    "11": "bool",
    "15": "bf16",
    "23": "fp8_e5m2",
    "24": "fp8_e4m3",
    "25": "fp8_e5m2_fnuz",
    "26": "fp8_e4m3_fnuz",
}


def normalize_dtype(type_name: Any) -> Optional[str]:
    """``c10::Float8_e4m3fn`` → ``fp8_e4m3``; unknown or non-tensor spellings (``Scalar``, ``''``) → None."""
    if not isinstance(type_name, str) or not type_name:
        return None
    return _TYPE_NAMES.get(type_name.strip().lower())


@dataclass
class OpShape:
    """What an op's arguments say about the problem it solved."""

    shape: Optional[dict[str, int]] = None
    dtype: Optional[str] = None  # dtype of the main (first) operand
    scale_recipe: Optional[str] = None  # tensorwise | rowwise | blockwise_1x128_128x128 | …
    out_dtype: Optional[str] = None
    notes: list[str] = field(default_factory=list)


OpRule = Callable[[Sequence[Any], Sequence[Any], Sequence[Any]], Optional[OpShape]]
_RULES: dict[str, OpRule] = {}
_PATTERN_RULES: list[tuple[re.Pattern[str], OpRule]] = []


def register_op_rule(*names: str, pattern: Optional[str] = None) -> Callable[[OpRule], OpRule]:
    """Register ``fn(dims, types, concrete) -> OpShape | None`` for exact op names or a regex.

    This is the extension point for ops the core does not know (MoE kernels of a new framework,
    custom GEMM wrappers): a skill package can register its op here before ingestion runs.
    """

    def deco(fn: OpRule) -> OpRule:
        for n in names:
            _RULES[n] = fn
        if pattern:
            _PATTERN_RULES.append((re.compile(pattern), fn))
        return fn

    return deco


def _is_dims(d: Any) -> bool:
    return isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in d)


def _dims(dims: Sequence[Any], i: int) -> Optional[list[int]]:
    if i < len(dims) and _is_dims(dims[i]) and dims[i]:
        return list(dims[i])
    return None


def _type(types: Sequence[Any], i: int) -> Optional[str]:
    return normalize_dtype(types[i]) if i < len(types) else None


def _prod(xs: Sequence[int]) -> int:
    return math.prod(xs) if xs else 1


def _ok(*vals: int) -> bool:
    return all(isinstance(v, int) and v > 0 for v in vals)


def _first_tensor_dtype(dims: Sequence[Any], types: Sequence[Any]) -> Optional[str]:
    for i, t in enumerate(types):
        dt = normalize_dtype(t)
        if dt and (i >= len(dims) or _dims(dims, i) is not None):
            return dt
    return None


def _mm_like(a: Optional[list[int]], b: Optional[list[int]]) -> Optional[dict[str, int]]:
    """[M,K]×[K,N] (also [B,M,K]×[B,K,N]); None when the inner dimensions disagree."""
    if a is None or b is None:
        return None
    if len(a) == 2 and len(b) == 2 and a[1] == b[0] and _ok(a[0], a[1], b[1]):
        return {"M": a[0], "N": b[1], "K": a[1]}
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1] and _ok(*a, b[2]):
        return {"batch": a[0], "M": a[1], "N": b[2], "K": a[2]}
    return None


@register_op_rule("aten::mm", "aten::_mm", "aten::matmul", "aten::bmm")
def _rule_mm(dims, types, concrete):
    a, b = _dims(dims, 0), _dims(dims, 1)
    shape = _mm_like(a, b)
    if shape is None and a is not None and b is not None and len(a) > 2 and len(b) == 2 and a[-1] == b[0]:
        # matmul of a batched activation with a 2-D weight folds the leading dims into M.
        shape = {"M": _prod(a[:-1]), "N": b[1], "K": a[-1]}
    return OpShape(shape=shape, dtype=_type(types, 0))


@register_op_rule("aten::addmm", "aten::baddbmm", "aten::_addmm_activation")
def _rule_addmm(dims, types, concrete):
    return OpShape(shape=_mm_like(_dims(dims, 1), _dims(dims, 2)), dtype=_type(types, 1))


@register_op_rule("aten::linear")
def _rule_linear(dims, types, concrete):
    x, w = _dims(dims, 0), _dims(dims, 1)
    if x is None or w is None or len(w) != 2 or x[-1] != w[1]:
        return OpShape(dtype=_type(types, 0))
    m = _prod(x[:-1])
    if not _ok(m, w[0], w[1]):
        return OpShape(dtype=_type(types, 0))
    return OpShape(shape={"M": m, "N": w[0], "K": w[1]}, dtype=_type(types, 0))


def scale_recipe(scale_a: Optional[list[int]], scale_b: Optional[list[int]], m: int, n: int, k: int,
                 block: int = 128) -> Optional[str]:
    """Name the scaling scheme from the two scale tensors' dims ([] = a 0-d tensor)."""
    a = [] if scale_a is None else [x for x in scale_a]
    b = [] if scale_b is None else [x for x in scale_b]
    numel_a, numel_b = _prod(a), _prod(b)
    if numel_a == 1 and numel_b == 1:
        return "tensorwise"
    kb, nb = -(-k // block), -(-n // block)
    if sorted(a) == sorted([m, 1]) and sorted(b) == sorted([1, n]):
        return "rowwise"
    if len(a) == 2 and len(b) == 2 and sorted(a) == sorted([m, kb]) and sorted(b) == sorted([kb, nb]):
        return f"blockwise_1x{block}_{block}x{block}"
    if len(a) == 2 and len(b) == 2 and sorted(a) == sorted([m, kb]) and sorted(b) == sorted([n, kb]):
        return f"blockwise_1x{block}_1x{block}"
    return None


@register_op_rule("aten::_scaled_mm")
def _rule_scaled_mm(dims, types, concrete):
    # _scaled_mm(a[M,K], b[K,N], scale_a, scale_b, bias?, scale_result?, out_dtype?, use_fast_accum)
    a, b = _dims(dims, 0), _dims(dims, 1)
    shape = _mm_like(a, b)
    out = OpShape(shape=shape, dtype=_type(types, 0))
    if len(concrete) > 6 and isinstance(concrete[6], str):
        out.out_dtype = SCALAR_TYPE_CODES.get(concrete[6].strip())
    if shape is not None:
        sa = dims[2] if len(dims) > 2 and _is_dims(dims[2]) else None
        sb = dims[3] if len(dims) > 3 and _is_dims(dims[3]) else None
        out.scale_recipe = scale_recipe(sa, sb, shape["M"], shape["N"], shape["K"])
    return out


@register_op_rule("aten::_grouped_mm")
def _rule_grouped_mm(dims, types, concrete):
    a, b = _dims(dims, 0), _dims(dims, 1)
    out = OpShape(dtype=_type(types, 0))
    if a is None or b is None:
        return out
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        out.shape = {"batch": a[0], "M": a[1], "N": b[2], "K": a[2]}
    elif len(a) == 2 and len(b) == 3 and a[1] == b[1]:
        # 2-D x 3-D: rows of all groups stacked along M (MoE with offsets); experts = groups.
        out.shape = {"M": a[0], "N": b[2], "K": a[1], "experts": b[0]}
    return out


@register_op_rule("aten::_scaled_grouped_mm")
def _rule_scaled_grouped_mm(dims, types, concrete):
    out = _rule_grouped_mm(dims, types, concrete)
    sa = dims[2] if len(dims) > 2 and _is_dims(dims[2]) else None
    sb = dims[3] if len(dims) > 3 and _is_dims(dims[3]) else None
    if out.shape and sa is not None and sb is not None:
        g = out.shape.get("batch") or out.shape.get("experts")
        m, n = out.shape["M"], out.shape["N"]
        if _prod(sa) == 1 and _prod(sb) == 1:
            out.scale_recipe = "tensorwise"
        elif sorted(sb) == sorted([g, n]) and (sorted(sa) == sorted([g, m]) or sa == [m]):
            out.scale_recipe = "rowwise"
    return out


def _rule_a8w8(dims, types, concrete):
    """aiter / vLLM style fp8 GEMMs: x[M,K], w[N,K] (weight rows are output features)."""
    x, w = _dims(dims, 0), _dims(dims, 1)
    out = OpShape(dtype=_type(types, 0))
    if x is None or w is None or len(w) != 2 or x[-1] != w[1]:
        return out
    m = _prod(x[:-1])
    if not _ok(m, w[0], w[1]):
        return out
    out.shape = {"M": m, "N": w[0], "K": w[1]}
    sx = dims[2] if len(dims) > 2 and _is_dims(dims[2]) else None
    sw = dims[3] if len(dims) > 3 and _is_dims(dims[3]) else None
    if sx is not None and sw is not None:
        kb, nb = -(-w[1] // 128), -(-w[0] // 128)
        if sorted(sx) == sorted([m, kb]) and sorted(sw) == sorted([nb, kb]):
            out.scale_recipe = "blockwise_1x128_128x128"
        elif sorted(sx) == sorted([m, 1]) and sorted(sw) in (sorted([w[0], 1]), sorted([1, w[0]])):
            out.scale_recipe = "rowwise"
        elif _prod(sx) == 1 and _prod(sw) == 1:
            out.scale_recipe = "tensorwise"
    return out


register_op_rule(pattern=r"(?i)^(aiter|vllm|sglang)::.*gemm_a8w8")(_rule_a8w8)


def _rule_moe(dims, types, concrete):
    """Fused-MoE ops in the common (hidden[T,D], w1[E,2I|I,D], w2[E,D,I], topk_weights[T,k]) layout.

    Recognized only when the dims agree with that layout; anything else stays unresolved rather
    than guessed.
    """
    h, w1, w2 = _dims(dims, 0), _dims(dims, 1), _dims(dims, 2)
    out = OpShape(dtype=_type(types, 0))
    if h is None or w1 is None or w2 is None or len(h) != 2 or len(w1) != 3 or len(w2) != 3:
        return out
    t, d = h
    e = w1[0]
    if w2[0] != e or w1[2] != d or w2[1] != d:
        return out
    inter = w2[2]
    shape = {"tokens": t, "model_dim": d, "experts": e, "inter_dim": inter}
    tw = _dims(dims, 3)
    if tw is not None and len(tw) == 2 and tw[0] == t:
        shape["topk"] = tw[1]
    out.shape = shape
    # DeepSeek-style block scales: a W1 scale argument (any position) of one fp32 per 128x128 block
    blocks = [e, -(-w1[1] // 128), -(-d // 128)]
    if any(_dims(dims, i) == blocks for i in range(4, len(dims))):
        out.scale_recipe = "blockwise_1x128_128x128"
    return out


register_op_rule(pattern=r"(?i)(fused_moe|fused_experts|fmoe|moe_sorting_fwd|::moe_)")(_rule_moe)


def op_shape(op: str, dims: Sequence[Any] | None, types: Sequence[Any] | None,
             concrete: Sequence[Any] | None = None) -> OpShape:
    """Problem shape, dtype and scale recipe for one op call; never raises on odd input."""
    dims = dims if isinstance(dims, list) else []
    types = types if isinstance(types, list) else []
    concrete = concrete if isinstance(concrete, list) else []
    rule = _RULES.get(op)
    if rule is None:
        for pat, fn in _PATTERN_RULES:
            if pat.search(op):
                rule = fn
                break
    res: Optional[OpShape] = None
    if rule is not None:
        try:
            res = rule(dims, types, concrete)
        except (TypeError, ValueError, IndexError, KeyError):
            res = None  # malformed dims in a hand-edited trace: no shape, not a crash
    if res is None:
        res = OpShape()
    if res.dtype is None:
        res.dtype = _first_tensor_dtype(dims, types)
    return res


# --- dtype from kernel names ------------------------------------------------------------------
# Conservative on purpose: only tokens that name an element type unambiguously. The op's
# ``Input type`` is always preferred when the kernel could be linked to an op.
_NAME_DTYPE_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"bf8_fnuz_t|f8e5m2fnuz|e5m2fnuz"), "fp8_e5m2_fnuz"),
    (re.compile(r"(?<![a-z])f8_fnuz_t|f8e4m3fnuz|e4m3fnuz"), "fp8_e4m3_fnuz"),
    (re.compile(r"(?<![a-z_])(?:ck::)?f8_t(?![a-z])|e4m3"), "fp8_e4m3"),
    (re.compile(r"e5m2"), "fp8_e5m2"),
    (re.compile(r"^nvjet_(?:sm\d+_)?qq"), "fp8"),  # cuBLASLt nvjet: 'qq' seen only with fp8 inputs
    (re.compile(r"(?i)bf16|bfloat16"), "bf16"),
    (re.compile(r"(?<![a-z])fp16|__half|(?<![a-z])half(?![a-z])"), "fp16"),
]


def dtype_from_kernel_name(name: str) -> Optional[str]:
    """Input dtype spelled in a kernel name (``…gemm_e4m3bf16…`` → fp8_e4m3), else None.

    ``fp8`` means "an fp8 format the name does not pin down" (nvjet ``qq`` kernels).
    """
    if not name:
        return None
    for pat, dt in _NAME_DTYPE_RULES:
        if pat.search(name):
            return dt
    return None


# --- shapes from kernel names -----------------------------------------------------------------
_DEEPGEMM = re.compile(r"deep_gemm::(\w+)<([^>]*)")
_UINT = re.compile(r"^\s*(\d+)u?\s*$")


def shape_from_kernel_name(name: str) -> Optional[OpShape]:
    """Problem dims baked into template arguments (DeepGEMM), else None.

    DeepGEMM v1 ``fp8_gemm_kernel<SHAPE_N, SHAPE_K, BLOCK_M, …>``; v2 ``*_impl<[(enum)x, …]
    SHAPE_M, SHAPE_N, SHAPE_K, …>`` where SHAPE_M = 0 means "M is a runtime value".
    """
    m = _DEEPGEMM.search(name or "")
    if not m:
        return None
    kernel, args = m.group(1), m.group(2).split(",")
    nums: list[int] = []
    for a in args:
        a = a.strip()
        if a.startswith("("):  # enum casts such as (cute::UMMA::Major)0 precede the shape
            if nums:
                break
            continue
        u = _UINT.match(a)
        if not u:
            break
        nums.append(int(u.group(1)))
    shape: dict[str, int] = {}
    if kernel.startswith("fp8_gemm_kernel") and len(nums) >= 2:
        shape = {"N": nums[0], "K": nums[1]}
    elif kernel.endswith("_impl") and len(nums) >= 3:
        if nums[0] > 0:
            shape["M"] = nums[0]
        shape.update({"N": nums[1], "K": nums[2]})
    shape = {k: v for k, v in shape.items() if v > 0}
    if not shape.get("N") or not shape.get("K"):
        return None
    dt = "fp8_e4m3" if "fp8" in kernel else dtype_from_kernel_name(name)
    return OpShape(shape=shape, dtype=dt, scale_recipe=None)
