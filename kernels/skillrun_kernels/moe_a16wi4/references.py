"""Reference implementations of the a16wi4 MoE layer.

- ``build_oracle``: fp32 dequant reference (problem.oracle), rounded to bf16.
- ``build_dequant_grouped_bf16`` (CUDA; the baseline): what a PyTorch user without an int4 MoE
  kernel runs: find the experts this batch uses, dequantize their int4 weights to bf16, sort the
  (token, slot) pairs by expert and run both GEMMs as ``torch._grouped_mm`` (CUTLASS on sm_90).
- ``build_bf16_grouped_predequant`` (CUDA alternative): the same grouped GEMMs on bf16 weights
  dequantized once in ``prepare`` (4x the weight memory): the bf16 model this layer replaces.
- ``build_per_expert_loop`` (alternative): bf16 weights dequantized once, then a Python loop of
  ``F.linear`` over the experts that received tokens.
- ``build_ck_moe_int4`` (ROCm): aiter's fused MoE with int4 weights, when importable.
- MSLK's production ops (``mslk-cuda`` CUTLASS on sm_90; the same op names from ``mslk-rocm``),
  each as a whole MoE layer (routing, gate/up GEMM, SiLU*up, down GEMM, weighted top-k sum), the
  routing and the small elementwise steps in torch as a user of those ops writes them:
  ``build_mslk_bf16i4_shuffled_grouped`` (``bf16i4bf16_shuffled_grouped`` on ``preshuffle_i4``
  weights, int64 ``M_sizes``; the production int4 kernel), ``build_mslk_bf16i4_rowwise_batched``
  (``bf16i4bf16_rowwise_batched`` on the active experts, tokens padded per expert) and
  ``build_mslk_bf16_grouped_stacked`` (``bf16bf16bf16_grouped_stacked`` on bf16 weights made once:
  the dense bf16 ceiling, 4x the weight memory).

How our symmetric signed int4 maps onto MSLK's int4 forms. Ours: w = q * s, q in [-8, 7] (one per
int8), s a bf16 scale per ``group_size`` elements of K. MSLK's bf16 x int4 kernels take CUTLASS
``int4b_t`` (already signed, [-8, 7]) packed two per byte with the even k in the low nibble (MSLK's
``pack_int4``; the same bytes as packing.pack_int4), group scales laid out [K/group, N] per expert,
and an *additive* zero point z in weight units: w = q * s + z (MSLK's ``int4_row_quantize_zp``
recentres its unsigned [0, 15] codes by 8 into that signed form, so z = min + 8 s there). A
symmetric weight is exactly that form with the constant z = 0, so the zero tensors are zeros of
the scale's shape and dtype (``bf16i4bf16_shuffled_grouped`` in v1.1.0 does not even read them:
its CUTLASS mainloop is scale-only; ``bf16i4bf16_rowwise_batched`` does). Nothing is re-quantized:
the kernels see the problem's own q and s. CUTLASS's sm_90 mixed-input GEMM serves a group size
only if it equals K or is a multiple of its 64-deep K tile, but MSLK never asks it to check (no host
problem shapes reach ``can_implement``): on the H200 group 32 ran and failed the fp32 oracle on
every shape. So both int4 builders refuse such group sizes themselves (``_mslk.require_int4_group``),
recorded ``unsupported`` with the reason and never run; group 128 is served.

All GEMM inputs are bf16 with fp32 accumulation; only the int4 -> bf16 dequantization rounds.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from skillrun_kernels import _mslk
from skillrun_kernels.protocol import KernelLaunch, UnsupportedShape

from . import packing, problem

# Slot integrity for the torch references: every device activity their calls showed on the H200
# (torch 2.11, CUDA 13.0; results/h200_f95b066.json.gz, 24 shapes): aten elementwise/index/sort
# kernels, CUB scans and sorts, torch._grouped_mm's CUTLASS kernel and its argument preparation,
# cuBLAS nvjet GEMMs (per-expert loop) and copies. Anything else in the slot is a foreign kernel.
TORCH_MOE_KERNELS = (
    r"^(void (at::native::|at_cuda_detail::cub::|at::cuda::detail::prepare_grouped_gemm_data<"
    r"|\(anonymous namespace\)::elementwise_kernel_with_index<|cublasLt::splitKreduce_kernel<)"
    r"|at::native::\(anonymous namespace\)::fill_reverse_indices_kernel"
    r"|_ZN7cutlass13device_kernel|nvjet_sm90_tst_|Memcpy |Memset )"
)
# An MSLK MoE layer's slot: MSLK's own kernels plus the torch routing/elementwise kernels around them
# (argsort, bincount, gather, SiLU, index_add; aten and CUB), but none of torch's GEMMs
# (torch._grouped_mm's CUTLASS kernel, cuBLAS): a secret torch fallback fails integrity.
# torch.bincount (M_sizes) launches `at::cuda::kernelHistogram1D<...>` (seen in the slot on the H200,
# torch 2.11): routing, so part of the slot.
TORCH_ROUTING_KERNELS = (
    r"^(void (at::native::|at::cuda::kernelHistogram1D<|at_cuda_detail::cub::|\(anonymous namespace\)::elementwise_kernel_with_index<)"
    r"|at::native::\(anonymous namespace\)::fill_reverse_indices_kernel|Memcpy |Memset )"
)
MSLK_MOE_KERNELS = f"{TORCH_ROUTING_KERNELS}|{_mslk.MSLK_KERNELS}"


def build_oracle(shape: dict, config: dict, device: str) -> KernelLaunch:
    def run(inputs: dict, out: torch.Tensor) -> torch.Tensor:
        out.copy_(problem.oracle(inputs))
        return out

    return KernelLaunch(name="oracle_fp32", run=run, describe={"backend": "torch", "precision": "fp32"})


def dequantize_bf16(w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """int4-in-int8 (.., rows, K) with bf16 group scales -> bf16 weights.

    int4 values are exact in bf16 and the bf16 product is rounded once, so this equals an fp32
    dequantization rounded to bf16, without an fp32 temporary (the usual PyTorch spelling).
    """
    group = w_q.shape[-1] // w_scale.shape[-1]
    return packing.dequantize(w_q, w_scale, group, dtype=torch.bfloat16)


def dequantize_all_bf16(w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """Every expert dequantized to bf16, one expert at a time so fp32 temporaries stay small."""
    out = torch.empty(w_q.shape, dtype=torch.bfloat16, device=w_q.device)
    for e in range(w_q.shape[0]):
        out[e] = dequantize_bf16(w_q[e], w_scale[e])
    return out


def _grouped_mm(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """rows of ``a`` grouped by ``offs`` (cumulative ends) times w[g].T, bf16 out."""
    return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)


def _sort_pairs(topk_ids: torch.Tensor, groups: int, group_of_expert: torch.Tensor | None = None):
    """Pairs sorted by group, cumulative group ends (int32), and the token of each sorted pair."""
    flat = topk_ids.reshape(-1).long()
    g = flat if group_of_expert is None else group_of_expert[flat]
    order = torch.argsort(g, stable=True)
    counts = torch.zeros(groups, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, g, torch.ones_like(g, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    return order, offs, order // topk_ids.shape[1]


def _grouped_layer(x, w1, w2, topk_ids, topk_weights, out, group_of_expert=None):
    groups = w1.shape[0]
    inter = w2.shape[-1]
    order, offs, tok = _sort_pairs(topk_ids, groups, group_of_expert)
    gu = _grouped_mm(x[tok], w1, offs)
    h = F.silu(gu[:, :inter].float()) * gu[:, inter:].float()
    y = _grouped_mm(h.to(torch.bfloat16), w2, offs)
    y = y.float() * topk_weights.reshape(-1)[order].unsqueeze(-1)
    acc = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    acc.index_add_(0, tok, y)
    out.copy_(acc)
    return out


def _need_grouped_mm(device: str) -> None:
    if not hasattr(torch, "_grouped_mm"):
        raise UnsupportedShape("this torch build has no torch._grouped_mm")
    if str(device).startswith("cuda"):
        major, _ = torch.cuda.get_device_capability(torch.device(device))
        if major < 8:
            raise UnsupportedShape(f"torch._grouped_mm needs sm_80 or newer, this device is sm_{major}x")


def build_dequant_grouped_bf16(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Per call: unique experts (one host sync), dequantize only those to bf16, two grouped GEMMs."""
    _need_grouped_mm(device)

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        ids = p["topk_ids"]
        active = torch.unique(ids)  # host sync: the dequantized stack's size depends on it
        w1 = dequantize_bf16(p["w1_q"][active], p["w1_scale"][active])
        w2 = dequantize_bf16(p["w2_q"][active], p["w2_scale"][active])
        remap = torch.empty(p["w1_q"].shape[0], dtype=torch.long, device=ids.device)
        remap[active] = torch.arange(active.numel(), device=ids.device)
        return _grouped_layer(p["x"], w1, w2, ids, p["topk_weights"], out, group_of_expert=remap)

    return KernelLaunch(
        name="torch_dequant_grouped_bf16",
        run=run,
        expect_kernels=TORCH_MOE_KERNELS,
        describe={"backend": "torch", "graph_capturable": False, "dequant": "per call, active experts"},
    )


def _bf16_weights(inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 weights: taken from inputs['w1_bf16'/'w2_bf16'] when a caller shares them, else made here."""
    w1 = inputs.get("w1_bf16")
    w2 = inputs.get("w2_bf16")
    if w1 is None:
        w1 = dequantize_all_bf16(inputs["w1_q"], inputs["w1_scale"])
    if w2 is None:
        w2 = dequantize_all_bf16(inputs["w2_q"], inputs["w2_scale"])
    return w1, w2


def build_bf16_grouped_predequant(shape: dict, config: dict, device: str) -> KernelLaunch:
    """bf16 weights made once (untimed); per call only routing and two grouped GEMMs (no host sync)."""
    _need_grouped_mm(device)

    def prepare(inputs: dict) -> dict:
        w1, w2 = _bf16_weights(inputs)
        return {"x": inputs["x"], "w1": w1, "w2": w2, "topk_ids": inputs["topk_ids"], "topk_weights": inputs["topk_weights"]}

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        return _grouped_layer(p["x"], p["w1"], p["w2"], p["topk_ids"], p["topk_weights"], out)

    return KernelLaunch(
        name="torch_bf16_grouped_predequant",
        run=run,
        prepare=prepare,
        expect_kernels=TORCH_MOE_KERNELS,
        describe={"backend": "torch", "graph_capturable": True, "weights": "bf16 (4x int4 memory)"},
    )


def build_per_expert_loop(shape: dict, config: dict, device: str) -> KernelLaunch:
    """bf16 weights made once (untimed); per call a Python loop over experts that received tokens."""

    def prepare(inputs: dict) -> dict:
        w1, w2 = _bf16_weights(inputs)
        return {"x": inputs["x"], "w1": w1, "w2": w2, "topk_ids": inputs["topk_ids"], "topk_weights": inputs["topk_weights"]}

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        x, ids, wts = p["x"], p["topk_ids"], p["topk_weights"]
        inter = p["w2"].shape[-1]
        acc = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
        flat = ids.reshape(-1).long()
        order = torch.argsort(flat, stable=True)
        experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
        start = 0
        for e, c in zip(experts.tolist(), counts.tolist()):  # host sync, then one step per expert
            pairs = order[start:start + c]
            start += c
            tok = pairs // ids.shape[1]
            gu = F.linear(x[tok], p["w1"][e])
            h = (F.silu(gu[:, :inter].float()) * gu[:, inter:].float()).to(torch.bfloat16)
            y = F.linear(h, p["w2"][e]).float() * wts.reshape(-1)[pairs].unsqueeze(-1)
            acc.index_add_(0, tok, y)
        out.copy_(acc)
        return out

    return KernelLaunch(
        name="torch_per_expert_loop_bf16",
        run=run,
        prepare=prepare,
        expect_kernels=TORCH_MOE_KERNELS,
        describe={"backend": "torch", "graph_capturable": False},
    )


def build_ck_moe_int4(shape: dict, config: dict, device: str) -> KernelLaunch:
    """ROCm baseline: aiter's fused MoE on int4 weights. Not runnable on this project's machines.

    aiter's a16wi4 path (ROCm/aiter PR #4646) wants its own weight preparation: int8 values
    shuffled with ``shuffle_weight(w, (16, 16))``, packed to int4, scales reordered with
    ``shuffle_scale_for_int4(group_size=32)``. Without a ROCm device that preparation cannot be
    checked, so this builder stops with a clear error instead of guessing a layout.
    """
    try:
        from aiter.fused_moe import fused_moe  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"build_ck_moe_int4 needs aiter (aiter.fused_moe.fused_moe) on a ROCm device; not importable here ({exc})"
        ) from None
    raise NotImplementedError(
        "build_ck_moe_int4: aiter is importable, but its a16wi4 weight preshuffle (shuffle_weight (16,16), "
        "int4 pack, shuffle_scale_for_int4) is not wired here; it needs a ROCm device to validate"
    )


# ---------------------------------------------------------------------------------------------
# MSLK production ops (see the module docstring for the int4 mapping)


def mslk_int4_operands(w_q: torch.Tensor, w_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(E, N, K) int8 codes in [-8, 7] and (E, N, K/g) bf16 scales -> MSLK's int4 operands:

    packed (E, N, K/2) int8 (two codes per byte, even k in the low nibble), scale (E, K/g, N) bf16
    contiguous (MSLK's [num_groups, N] per expert) and zero (E, K/g, N) bf16 zeros (symmetric: z = 0).
    One expert at a time, so the int16 packing temporaries stay one expert large.
    """
    if w_q.dim() != 3 or w_scale.dim() != 3 or w_q.shape[:2] != w_scale.shape[:2]:
        raise ValueError(f"w_q {tuple(w_q.shape)} and w_scale {tuple(w_scale.shape)} must be (E, N, K) and (E, N, K/group)")
    e, n, k = w_q.shape
    packed = torch.empty((e, n, k // 2), dtype=torch.int8, device=w_q.device)
    for i in range(e):
        packed[i] = packing.pack_int4(w_q[i]).view(torch.int8)
    scale = w_scale.to(torch.bfloat16).transpose(1, 2).contiguous()
    return packed, scale, torch.zeros_like(scale)


def preshuffle_experts(packed: torch.Tensor, scale: torch.Tensor, preshuffle) -> torch.Tensor:
    """MSLK's ``preshuffle_i4`` per expert on copies: the bf16 path reorders its WQ argument in place
    (CUTLASS reorder_tensor on WQ's storage) and returns it, so the caller's tensor is never handed over."""
    out = torch.empty_like(packed)
    for i in range(packed.shape[0]):
        wq_i, _ = preshuffle(packed[i].clone(), scale[i])
        out[i].copy_(wq_i)
    return out


def route_grouped(topk_ids: torch.Tensor, experts: int):
    """(order of the (token, slot) pairs sorted by expert, int64 M_sizes per expert, token of each pair).

    M_sizes counts every expert (zeros included), computed on the device: no host sync."""
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    m_sizes = torch.bincount(flat, minlength=experts).to(torch.int64)
    return order, m_sizes, order // topk_ids.shape[1]


def _moe_grouped_layer(x, topk_ids, topk_weights, out, experts: int, gemm1, gemm2):
    """A MoE layer around two grouped GEMMs ``gemm(rows, M_sizes) -> (rows, N)`` (rows sorted by expert)."""
    order, m_sizes, tok = route_grouped(topk_ids, experts)
    gu = gemm1(x[tok].contiguous(), m_sizes)
    inter = gu.shape[-1] // 2
    h = (F.silu(gu[:, :inter].float()) * gu[:, inter:].float()).to(torch.bfloat16)
    y = gemm2(h.contiguous(), m_sizes).float() * topk_weights.reshape(-1)[order].unsqueeze(-1)
    acc = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    acc.index_add_(0, tok, y)
    out.copy_(acc)
    return out


def _require_int4_group(op: str, shape: dict) -> None:
    """Refuse before anything runs a group size MSLK's int4 GEMMs cannot serve (both GEMMs' K)."""
    _, d, i, _, _, g = problem.dims(shape)
    _mslk.require_int4_group(op, shape, g, {"gate/up GEMM (model_dim)": d, "down GEMM (inter_dim)": i})


def _mslk_launch(name: str, op: str, run, prepare, shape: dict, **describe) -> KernelLaunch:
    return KernelLaunch(name=name, run=run, prepare=prepare, expect_kernels=MSLK_MOE_KERNELS,
                        describe={"backend": _mslk.backend_name(), "op": f"torch.ops.mslk.{op}", "mslk": _mslk.version(),
                                  "group_size": int(shape["group_size"]), "expect_kernels_verified": False, **describe})


def build_mslk_bf16i4_shuffled_grouped(shape: dict, config: dict, device: str) -> KernelLaunch:
    """The production bf16 x int4 MoE path: ``bf16i4bf16_shuffled_grouped(X, WQ, w_scale_group,
    w_zero_group, M_sizes)`` for gate/up and for down, on ``preshuffle_i4`` weights made once (untimed)."""
    _require_int4_group("bf16i4bf16_shuffled_grouped", shape)
    fn = _mslk.op("bf16i4bf16_shuffled_grouped")
    pre = _mslk.op("preshuffle_i4")
    experts = int(shape["experts"])

    def prepare(inputs: dict) -> dict:
        p = {"x": inputs["x"], "topk_ids": inputs["topk_ids"], "topk_weights": inputs["topk_weights"]}
        for w in ("w1", "w2"):
            packed, scale, zero = mslk_int4_operands(inputs[f"{w}_q"], inputs[f"{w}_scale"])
            packed = _mslk.guarded("preshuffle_i4", shape, lambda: preshuffle_experts(packed, scale, pre))
            p[w] = (packed, scale, zero)
        return p

    def gemm(w):
        return lambda rows, m_sizes: _mslk.guarded("bf16i4bf16_shuffled_grouped", shape, lambda: fn(rows, *w, m_sizes))

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        return _moe_grouped_layer(p["x"], p["topk_ids"], p["topk_weights"], out, experts, gemm(p["w1"]), gemm(p["w2"]))

    return _mslk_launch("mslk_bf16i4bf16_shuffled_grouped", "bf16i4bf16_shuffled_grouped", run, prepare, shape,
                        graph_capturable=True, weights="int4 preshuffled (preshuffle_i4), bf16 group scales, zero points 0")


def build_mslk_bf16_grouped_stacked(shape: dict, config: dict, device: str) -> KernelLaunch:
    """The dense bf16 ceiling: ``bf16bf16bf16_grouped_stacked(X, W, M_sizes)`` on bf16 weights
    dequantized once in ``prepare`` (4x the int4 weight memory)."""
    fn = _mslk.op("bf16bf16bf16_grouped_stacked")
    experts = int(shape["experts"])

    def prepare(inputs: dict) -> dict:
        w1, w2 = _bf16_weights(inputs)
        return {"x": inputs["x"], "w1": w1.contiguous(), "w2": w2.contiguous(), "topk_ids": inputs["topk_ids"],
                "topk_weights": inputs["topk_weights"]}

    def gemm(w):
        return lambda rows, m_sizes: _mslk.guarded("bf16bf16bf16_grouped_stacked", shape, lambda: fn(rows, w, m_sizes))

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        return _moe_grouped_layer(p["x"], p["topk_ids"], p["topk_weights"], out, experts, gemm(p["w1"]), gemm(p["w2"]))

    return _mslk_launch("mslk_bf16bf16bf16_grouped_stacked", "bf16bf16bf16_grouped_stacked", run, prepare, shape,
                        graph_capturable=True, weights="bf16 (4x int4 memory)")


def pad_by_expert(x: torch.Tensor, topk_ids: torch.Tensor):
    """Rows of the (token, slot) pairs scattered into a (A, M_max, D) batch, one batch entry per
    active expert (zero rows past each expert's count). Host syncs: the active experts and M_max."""
    flat = topk_ids.reshape(-1).long()
    active = torch.unique(flat)
    remap = torch.empty(int(flat.max()) + 1 if flat.numel() else 1, dtype=torch.long, device=flat.device)
    remap[active] = torch.arange(active.numel(), device=flat.device)
    order = torch.argsort(flat, stable=True)
    ge = remap[flat[order]]
    counts = torch.bincount(ge, minlength=active.numel())
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(order.numel(), device=flat.device) - starts[ge]
    m_max = int(counts.max())
    xb = torch.zeros((active.numel(), m_max, x.shape[-1]), dtype=x.dtype, device=x.device)
    tok = order // topk_ids.shape[1]
    xb[ge, pos] = x[tok]
    return xb, active, order, ge, pos, tok


def build_mslk_bf16i4_rowwise_batched(shape: dict, config: dict, device: str) -> KernelLaunch:
    """``bf16i4bf16_rowwise_batched(X, WQ, w_scale, w_zp)`` as a MoE layer: each call gathers the active
    experts' packed int4 weights (one copy of them: the batched op takes one contiguous (B, N, K/2)
    stack) and pads each expert's rows to the largest count. Scales/zeros are (B * K/group, N)."""
    _require_int4_group("bf16i4bf16_rowwise_batched", shape)
    fn = _mslk.op("bf16i4bf16_rowwise_batched")

    def prepare(inputs: dict) -> dict:
        p = {"x": inputs["x"], "topk_ids": inputs["topk_ids"], "topk_weights": inputs["topk_weights"]}
        for w in ("w1", "w2"):
            p[w] = mslk_int4_operands(inputs[f"{w}_q"], inputs[f"{w}_scale"])
        return p

    def bmm(rows, w, active):
        packed, scale, zero = w
        n = packed.shape[1]
        s = scale[active].reshape(-1, n)
        z = zero[active].reshape(-1, n)
        return _mslk.guarded("bf16i4bf16_rowwise_batched", shape, lambda: fn(rows, packed[active].contiguous(), s, z))

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        xb, active, order, ge, pos, tok = pad_by_expert(p["x"], p["topk_ids"])
        gu = bmm(xb, p["w1"], active)
        inter = gu.shape[-1] // 2
        h = (F.silu(gu[..., :inter].float()) * gu[..., inter:].float()).to(torch.bfloat16)  # padded rows stay 0
        y = bmm(h.contiguous(), p["w2"], active)[ge, pos].float() * p["topk_weights"].reshape(-1)[order].unsqueeze(-1)
        acc = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
        acc.index_add_(0, tok, y)
        out.copy_(acc)
        return out

    return _mslk_launch("mslk_bf16i4bf16_rowwise_batched", "bf16i4bf16_rowwise_batched", run, prepare, shape,
                        graph_capturable=False, weights="int4 packed (not shuffled), gathered per call for the active experts")

