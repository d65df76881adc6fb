"""Reference implementations of the fp8 block-scale MoE layer (problem.py).

- ``build_oracle``: the fp32 oracle (problem.oracle), rounded to bf16.
- Production kernels on sm_90, each imported lazily: a machine without the package records the
  reference as unavailable (``ReferenceUnavailable``), never replaced by another kernel.
  * ``build_deepgemm_contiguous``: DeepGEMM ``m_grouped_fp8_gemm_nt_contiguous`` (SGLang's prefill
    path on Hopper): the (token, slot) rows gathered by expert, each expert's segment padded to
    DeepGEMM's M alignment, ``m_indices`` naming the expert of every row (-1 for padding).
  * ``build_deepgemm_masked``: DeepGEMM ``m_grouped_fp8_gemm_nt_masked`` (the decode path, CUDA-graph
    friendly): rows scattered into an (E, max_m, K) batch with a per-expert valid count on the device.
  * ``build_vllm_fused_moe`` / ``build_sglang_fused_moe``: the Triton ``fused_moe_kernel`` with
    ``block_shape=[128, 128]`` through ``fused_experts`` (bf16 hidden states in; the activation
    quantization runs inside, as a user of those stacks runs it).
- ``build_cublas_per_expert`` (the honest fallback where none of those loads): cuBLAS block-wise
  ``torch._scaled_mm`` (1x128 x 128x128, scale axis padded to a multiple of 4) once per active
  expert and stage, with torch routing, SiLU, the fp8 1x128 re-quantization of h and the weighted
  top-k sum around it. It is what a PyTorch user without a grouped fp8 kernel writes; it is NOT a
  production MoE kernel and is named as such in every artifact.

Every layer here follows the recipe of problem.py (h re-quantized to fp8 per 1x128 block before
the down GEMM), so each is compared with the same oracle.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from skillrun_kernels import _deepgemm
from skillrun_kernels.fp8_blockscale_gemm.references import _padded_call_forms, cublas_scale_layouts, round_up
from skillrun_kernels.protocol import KernelLaunch, ReferenceUnavailable, UnsupportedShape

from . import problem

# Torch routing / elementwise kernels any torch-side glue launches (aten, CUB sorts and scans, copies;
# at::cuda:: holds the routing count, kernelHistogram1D, seen inside the cuBLAS per-expert slot on
# the H200 at commit 0249008, where its absence failed that slot's integrity check).
TORCH_GLUE_KERNELS = (
    r"^(void (at::native::|at::cuda::|at_cuda_detail::cub::|\(anonymous namespace\)::elementwise_kernel_with_index<)"
    r"|at::native::\(anonymous namespace\)::fill_reverse_indices_kernel|Memcpy |Memset )"
)
CUBLAS_BLOCKWISE_KERNELS = r"nvjet_sm90_qqtst_\w*Ablk128_Bvec128|cublasLt::splitKreduce_kernel"
# DeepGEMM's grouped GEMMs (GemmType 1 contiguous, 2 masked) and its scale-layout transpose, which it
# launches only if handed scales in another layout than the one these references write.
DEEPGEMM_GROUPED_KERNELS = r"deep_gemm::\w+<.*\(deep_gemm::GemmType\)[12]\b|deep_gemm::transpose_fp32<"
TRITON_FUSED_MOE_KERNELS = r"^(fused_moe_kernel|moe_align_block_size|_per_token_group_quant_fp8|per_token_group_quant|\w*act_and_mul|\w*silu_and_mul|moe_sum|count_and_sort_expert_tokens)"


def build_oracle(shape: dict, config: dict | None = None, device: str = "cpu") -> KernelLaunch:
    problem.dims(shape)

    def run(inputs: dict, out: torch.Tensor) -> torch.Tensor:
        out.copy_(problem.oracle(inputs))
        return out

    return KernelLaunch(name="oracle_fp32", run=run, describe={"backend": "torch", "precision": "fp32"})


def sort_pairs(topk_ids: torch.Tensor, experts: int):
    """(pairs sorted by expert, per-expert counts int64, token of each sorted pair), on the device."""
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    return order, counts, order // topk_ids.shape[1]


def _weighted_sum(y: torch.Tensor, order: torch.Tensor, tok: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor):
    """out = sum over each token's slots of weight * y (y rows in sorted-pair order)."""
    acc = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    acc.index_add_(0, tok, y.float() * topk_weights.reshape(-1)[order].unsqueeze(-1))
    out.copy_(acc)
    return out


def _silu_quant(gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU(gate) * up in fp32, then the recipe's fp8 1x128 quantization (the stage-2 input)."""
    inter = gu.shape[-1] // 2
    h = F.silu(gu[:, :inter].float()) * gu[:, inter:].float()
    return problem.quantize_rows_1x128(h)


# ---------------------------------------------------------------------------------------------
# The honest fallback: cuBLAS block-wise per expert


def build_cublas_per_expert(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """Per call: sort pairs (one host sync for the counts), then per active expert one cuBLAS
    block-wise GEMM for gate/up and one for down. Rows are padded per expert to a multiple of 16
    with zero codes (cuBLAS refuses some M < 16 fp8 shapes); padded rows are dropped."""
    _, d, i, e, _ = problem.dims(shape)
    if not str(device).startswith("cuda"):
        raise UnsupportedShape("cuBLAS block-wise (torch._scaled_mm) needs a CUDA device")
    chosen: dict = {}

    def gemm(a, sa, w, sw):
        rows = a.shape[0]
        m = round_up(max(rows, 1), 16)
        if m != rows:
            a = torch.cat([a, torch.zeros(m - rows, a.shape[1], dtype=a.dtype, device=a.device)])
            sa = torch.cat([sa, torch.ones(m - rows, sa.shape[1], dtype=sa.dtype, device=sa.device)])
        lay_a, lay_b = cublas_scale_layouts(sa, sw, pad_k_blocks=True)
        out = torch.empty(m, w.shape[0], dtype=torch.bfloat16, device=a.device)
        if "form" not in chosen:
            errors = []
            for name, fn in _padded_call_forms():
                try:
                    fn(a, w.t(), lay_a, lay_b, sa.shape[1], out)
                except (RuntimeError, ValueError, NotImplementedError, TypeError) as exc:
                    errors.append(f"{name}: {str(exc).splitlines()[0]}")
                    continue
                chosen["form"] = fn
                launch.describe["call_form"] = name
                break
            else:
                raise UnsupportedShape("no cuBLAS block-wise call form accepted here: " + "; ".join(errors))
        res = chosen["form"](a, w.t(), lay_a, lay_b, sa.shape[1], out)
        return res[:rows]

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        order, counts, tok = sort_pairs(p["topk_ids"], e)
        a, sa = p["a"][tok], p["a_scale"][tok]
        y = torch.empty(order.numel(), d, dtype=torch.bfloat16, device=a.device)
        start = 0
        for ex, c in enumerate(counts.tolist()):  # host sync, then one step per active expert
            if c == 0:
                continue
            rows = slice(start, start + c)
            start += c
            gu = gemm(a[rows], sa[rows], p["w1"][ex], p["w1_scale"][ex])
            hq, hs = _silu_quant(gu)
            y[rows] = gemm(hq, hs, p["w2"][ex], p["w2_scale"][ex])
        return _weighted_sum(y, order, tok, p["topk_weights"], out)

    launch = KernelLaunch(
        name="cublas_blockwise_per_expert",
        run=run,
        expect_kernels=f"{TORCH_GLUE_KERNELS}|{CUBLAS_BLOCKWISE_KERNELS}",
        describe={"backend": "cublas", "api": "scaled_mm per active expert", "production": False,
                  "graph_capturable": False, "note": "fallback named as such: not a grouped MoE kernel"},
    )
    return launch


# ---------------------------------------------------------------------------------------------
# DeepGEMM grouped fp8 GEMMs (SGLang's MoE path on Hopper). Loaded and guarded through
# skillrun_kernels._deepgemm: not importable -> ``unavailable`` with the reason and how to build it;
# a shape its host code refuses -> ``unsupported`` with DeepGEMM's text. The activation scales are
# written straight into the layout DeepGEMM's sm_90 kernels read (MN-major, TMA-aligned), as SGLang's
# quantization kernels write them, so DeepGEMM launches no transpose of its own inside the layer;
# the routing, gather, SiLU, re-quantization and top-k sum around the two GEMMs are torch ops here
# (SGLang fuses them): the layer is timed whole, like the port.


def _dg_fn(dg, *names):
    for n in names:
        fn = getattr(dg, n, None)
        if fn is not None:
            return fn
    raise ReferenceUnavailable(f"this deep_gemm ({getattr(dg, '__version__', '?')}) has none of {names}")


def _silu_quant_mn_major(gu: torch.Tensor, groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """_silu_quant with the scales copied into DeepGEMM's MN-major layout ((R, I/128), or
    (G, R/G, I/128) when ``groups``): the stage-2 operand as the GEMM reads it."""
    hq, hs = _silu_quant(gu)
    if groups:
        hq = hq.view(groups, hq.shape[0] // groups, hq.shape[1])
        hs = hs.view(groups, hs.shape[0] // groups, hs.shape[1])
    sf = _deepgemm.mn_major_sf(tuple(hs.shape), hs.device)
    sf.copy_(hs)
    return hq, sf


def contiguous_layout(topk_ids: torch.Tensor, experts: int, align: int):
    """The m-grouped contiguous layout of the (token, slot) pairs: each expert's rows padded to
    ``align``. Returns (order, tok, dest, m_indices, total): pairs sorted by expert, their tokens,
    their row in the padded layout, the expert of every padded row (-1 for padding, int32) and the
    padded row count (one host sync: it sizes the buffers)."""
    order, counts, tok = sort_pairs(topk_ids, experts)
    padded = (counts + align - 1) // align * align
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    total = int(ends[-1])
    sorted_e = topk_ids.reshape(-1).long()[order]
    rank = torch.arange(order.numel(), device=order.device) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    dest = starts[sorted_e] + rank
    m_indices = torch.full((total,), -1, dtype=torch.int32, device=order.device)
    m_indices[dest] = sorted_e.to(torch.int32)
    return order, tok, dest, m_indices, total


def build_deepgemm_contiguous(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """DeepGEMM's contiguous-layout grouped GEMM for both stages (``m_grouped_fp8_gemm_nt_contiguous``,
    the prefill layout): rows gathered by expert, each expert's segment padded to DeepGEMM's row
    alignment, ``m_indices`` naming the expert of every row (-1 for padding rows, which it skips)."""
    _, d, i, e, _ = problem.dims(shape)
    dg = _deepgemm.module()
    fn = _dg_fn(dg, "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous")
    align = _deepgemm.contiguous_m_alignment(dg)

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        order, tok, dest, m_indices, total = contiguous_layout(p["topk_ids"], e, align)
        dev = order.device
        a = torch.zeros(total, d, dtype=p["a"].dtype, device=dev)
        sa = _deepgemm.mn_major_sf((total, d // 128), dev, fill=1.0)
        a[dest], sa[dest] = p["a"][tok], p["a_scale"][tok]
        gu = torch.empty(total, 2 * i, dtype=torch.bfloat16, device=dev)
        _deepgemm.guarded("m_grouped_fp8_gemm_nt_contiguous", shape,
                          lambda: fn((a, sa), (p["w1"], p["w1_scale"]), gu, m_indices))
        hq, hs = _silu_quant_mn_major(gu)
        y = torch.empty(total, d, dtype=torch.bfloat16, device=dev)
        _deepgemm.guarded("m_grouped_fp8_gemm_nt_contiguous", shape,
                          lambda: fn((hq, hs), (p["w2"], p["w2_scale"]), y, m_indices))
        return _weighted_sum(y[dest], order, tok, p["topk_weights"], out)

    return KernelLaunch(name="deepgemm_m_grouped_contiguous", run=run,
                        expect_kernels=f"{TORCH_GLUE_KERNELS}|{DEEPGEMM_GROUPED_KERNELS}",
                        describe={"backend": "deep_gemm", "op": "deep_gemm.m_grouped_fp8_gemm_nt_contiguous",
                                  "deep_gemm": _deepgemm.version(), "m_alignment": align,
                                  "sfa": "MN-major, TMA-aligned (written by the gather)",
                                  "glue": "torch ops (SGLang fuses routing, gather, SiLU+quant and the top-k sum)",
                                  "expect_kernels_verified": False, "graph_capturable": False})


def build_deepgemm_masked(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """DeepGEMM's masked-layout grouped GEMM (``m_grouped_fp8_gemm_nt_masked``, the decode layout,
    CUDA-graph friendly): (E, max_m, K) per expert, valid row counts on the device. max_m = tokens
    rounded up to 64 (an expert sees at most one slot of each token); ``expected_m`` = mean rows per
    active expert, the scheduling hint DeepGEMM asks for."""
    t, d, i, e, k = problem.dims(shape)
    dg = _deepgemm.module()
    fn = _dg_fn(dg, "m_grouped_fp8_gemm_nt_masked", "m_grouped_gemm_fp8_fp8_bf16_nt_masked")
    max_m = round_up(t, 64)
    expected_m = max(1, round(t * k / problem.expected_active_experts(shape)))

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        order, counts, tok = sort_pairs(p["topk_ids"], e)
        dev = order.device
        sorted_e = p["topk_ids"].reshape(-1).long()[order]
        rank = torch.arange(order.numel(), device=dev) - (torch.cumsum(counts, 0) - counts)[sorted_e]
        a = torch.zeros(e, max_m, d, dtype=p["a"].dtype, device=dev)
        sa = _deepgemm.mn_major_sf((e, max_m, d // 128), dev, fill=1.0)
        a[sorted_e, rank], sa[sorted_e, rank] = p["a"][tok], p["a_scale"][tok]
        masked_m = counts.to(torch.int32)
        gu = torch.empty(e, max_m, 2 * i, dtype=torch.bfloat16, device=dev)
        _deepgemm.guarded("m_grouped_fp8_gemm_nt_masked", shape,
                          lambda: fn((a, sa), (p["w1"], p["w1_scale"]), gu, masked_m, expected_m))
        hq, hs = _silu_quant_mn_major(gu.reshape(e * max_m, 2 * i), groups=e)
        y = torch.empty(e, max_m, d, dtype=torch.bfloat16, device=dev)
        _deepgemm.guarded("m_grouped_fp8_gemm_nt_masked", shape,
                          lambda: fn((hq, hs), (p["w2"], p["w2_scale"]), y, masked_m, expected_m))
        return _weighted_sum(y[sorted_e, rank], order, tok, p["topk_weights"], out)

    return KernelLaunch(name="deepgemm_m_grouped_masked", run=run,
                        expect_kernels=f"{TORCH_GLUE_KERNELS}|{DEEPGEMM_GROUPED_KERNELS}",
                        describe={"backend": "deep_gemm", "op": "deep_gemm.m_grouped_fp8_gemm_nt_masked",
                                  "deep_gemm": _deepgemm.version(), "max_m": max_m, "expected_m": expected_m,
                                  "sfa": "MN-major, TMA-aligned (written by the gather)",
                                  "glue": "torch ops (SGLang fuses routing, gather, SiLU+quant and the top-k sum)",
                                  "expect_kernels_verified": False, "graph_capturable": True})


# ---------------------------------------------------------------------------------------------
# vLLM / SGLang Triton fused_moe (block_shape=[128, 128])


def _bf16_hidden(p: dict) -> torch.Tensor:
    """The layer input as those stacks take it: bf16 hidden states (they quantize 1x128 inside)."""
    return problem.dequant_rows(p["a"], p["a_scale"]).to(torch.bfloat16)


def _triton_fused_moe(name: str, module: str, shape: dict) -> KernelLaunch:
    problem.dims(shape)
    try:
        mod = __import__(module, fromlist=["fused_experts"])
        fused_experts = mod.fused_experts
    except Exception as exc:
        raise ReferenceUnavailable(f"{module}.fused_experts is not importable here ({type(exc).__name__}: {exc})") from None

    def prepare(inputs: dict) -> dict:
        return {**inputs, "x_bf16": _bf16_hidden(inputs)}

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        try:
            res = fused_experts(p["x_bf16"], p["w1"], p["w2"], p["topk_weights"], p["topk_ids"],
                                use_fp8_w8a8=True, w1_scale=p["w1_scale"], w2_scale=p["w2_scale"], block_shape=[128, 128])
        except TypeError as exc:  # newer releases take a quant-config object instead of these keywords
            raise UnsupportedShape(f"{module}.fused_experts does not take the block-scale keywords this reference passes: {exc}") from None
        out.copy_(res)
        return out

    return KernelLaunch(name=name, run=run, prepare=prepare,
                        expect_kernels=f"{TORCH_GLUE_KERNELS}|{TRITON_FUSED_MOE_KERNELS}",
                        describe={"backend": "triton", "api": f"{module}.fused_experts(block_shape=[128, 128])",
                                  "expect_kernels_verified": False, "input": "bf16 hidden states (quantized inside, timed)"})


def build_vllm_fused_moe(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    return _triton_fused_moe("vllm_triton_fused_moe", "vllm.model_executor.layers.fused_moe.fused_moe", shape)


def build_sglang_fused_moe(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    return _triton_fused_moe("sglang_triton_fused_moe", "sglang.srt.layers.moe.fused_moe_triton.fused_moe", shape)


# ---------------------------------------------------------------------------------------------
# ROCm production path (aiter fused_moe, per_1x128)


def build_aiter_fused_moe(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """ROCm baseline: aiter's ``fused_moe`` with ``QuantType.per_1x128`` (CK ``kernel_moe_gemm`` over
    ``GridwiseMoeGemmBlockScale`` or the ASM ``fmoe_bf16_blockscaleFp8_*`` kernels, chosen by aiter's
    tuned table). Not runnable on this project's machines.

    aiter wants its own weight preparation (``shuffle_weight(w, (16, 16))`` on the fp8 experts, its
    scale layouts, fnuz fp8 on gfx942). Without a ROCm device that preparation cannot be checked
    against the oracle, so this builder stops with a clear error instead of guessing a layout (the
    a16wi4 family's ROCm baseline does the same).
    """
    problem.dims(shape)
    try:
        from aiter.fused_moe import fused_moe  # noqa: F401
    except Exception as exc:
        raise ReferenceUnavailable(f"build_aiter_fused_moe needs aiter (aiter.fused_moe.fused_moe) on a ROCm device; not importable here ({exc})") from None
    raise NotImplementedError(
        "build_aiter_fused_moe: aiter is importable, but its per_1x128 weight shuffle and scale layouts are not wired "
        "here; they need a ROCm device to validate against the oracle"
    )
