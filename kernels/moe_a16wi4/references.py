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

All GEMM inputs are bf16 with fp32 accumulation; only the int4 -> bf16 dequantization rounds.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

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
