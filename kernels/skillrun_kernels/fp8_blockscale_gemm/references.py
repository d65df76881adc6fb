"""Reference kernels for the fp8 block-scale GEMM: the oracle as a kernel, the vendor paths a user
has today, and correct alternatives. Each ``build_*`` returns a :class:`KernelLaunch`.

cuBLAS block-wise on sm_90 (through ``torch._scaled_mm``) takes the activation scales M-major,
shape (M, L) with strides (1, M), L = K/128, and the weight scales as the transpose of an
(N/128, L) row-major tensor. cuBLASLt needs the L axis of the 128x128 scales padded to a multiple
of 4 (PyTorch PR #166752): without the padding, L % 4 != 0 (K = 768: L = 6) is accepted and
silently wrong. ``build_cublas_blockwise`` is the unpadded call a user writes today (the baseline);
``build_cublas_blockwise_padded`` is the corrected layout.

``build_mslk_groupwise``: MSLK's CUTLASS ``f8f8bf16_groupwise`` (1x128 activation / 128x128
weight scales; ``mslk-cuda``, and the same op name on ROCm), an alternative to cuBLAS block-wise.

``build_deepgemm``: DeepGEMM's ``fp8_gemm_nt`` (the sm_90 1d2d kernel: 1x128 activation / 128x128
weight fp32 scales), the production kernel of SGLang and vLLM for this recipe (kernels/_deepgemm.py).
"""
from __future__ import annotations

from typing import Any

import torch

from skillrun_kernels import _deepgemm, _mslk
from skillrun_kernels.fp8_blockscale_gemm import problem
from skillrun_kernels.protocol import KernelLaunch, UnsupportedShape

# Device kernel names each slot launches (slot integrity). cuBLAS names its operands column-major,
# so our 128x128-scaled B appears as its "A" (Ablk128) and our 1x128-scaled A as its "B" (Bvec128).
# Names as the H200 runs saw them (benchmarks/results/fp8_blockscale_sm90_h200_run2.json): cuBLAS
# splits K for some skinny shapes and then also launches its split-K reduce kernel.
CUBLAS_BLOCKWISE_KERNELS = r"nvjet_sm90_qqtst_\w*Ablk128_Bvec128|cublasLt::splitKreduce_kernel"
CUBLAS_BF16_KERNELS = r"nvjet_sm90_tst_|cublasLt::splitKreduce_kernel|sm90_xmma_gemm_bf16"
CK_BLOCKSCALE_KERNELS = r"kernel_gemm_xdl.*blockscale|gemm_a8w8_blockscale"


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def cublas_scale_layouts(a_scale: torch.Tensor, b_scale: torch.Tensor, pad_k_blocks: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The scale tensors cuBLAS block-wise takes on sm_90.

    scale_a: (M, L) with strides (1, M) (M-major).
    scale_b: unpadded -> (L, Nb) with strides (1, L): the (Nb, L) row-major tensor transposed.
             padded   -> (L4, Nb) with strides (1, L4), L4 = round_up(L, 4); the extra K blocks are 0.
    """
    if a_scale.dim() != 2 or b_scale.dim() != 2 or a_scale.shape[1] != b_scale.shape[1]:
        raise ValueError(f"a_scale {tuple(a_scale.shape)} and b_scale {tuple(b_scale.shape)} must be (M, L) and (Nb, L)")
    sa = a_scale.float().t().contiguous().t()
    nb, L = b_scale.shape
    if not pad_k_blocks:
        return sa, b_scale.float().contiguous().t()
    L4 = round_up(L, 4)
    padded = torch.zeros((nb, L4), dtype=torch.float32, device=b_scale.device)
    padded[:, :L] = b_scale.float()
    return sa, padded.t()


# ---------------------------------------------------------------------------------------------
# Oracle


def build_oracle(shape: dict, config: dict | None = None, device: str = "cpu") -> KernelLaunch:
    """fp32 dequant -> fp32 matmul as a kernel slot (CPU or GPU). Returns the fp32 result and, if
    given a bf16 ``out``, also writes the rounded result there."""
    problem.check_shape(shape)

    def run(inputs: dict, out: torch.Tensor | None) -> torch.Tensor:
        ref = problem.oracle(inputs)
        if out is not None:
            out.copy_(ref)
        return ref

    return KernelLaunch(name="oracle_fp32", run=run, expect_kernels=None, describe={"backend": "torch", "precision": "fp32"})


# ---------------------------------------------------------------------------------------------
# cuBLAS block-wise (what a user has today) and its corrected layout


def _is_not_supported(exc: BaseException) -> bool:
    text = str(exc)
    return "NOT_SUPPORTED" in text or "not supported" in text.lower()


def _probe(call, shape: dict, what: str) -> None:
    """Run ``call`` once; a cuBLAS refusal becomes UnsupportedShape (a coverage gap, not a failure)."""
    try:
        call()
    except (RuntimeError, NotImplementedError) as exc:
        if _is_not_supported(exc):
            raise UnsupportedShape(f"{what} does not support M={shape['M']}, N={shape['N']}, K={shape['K']}: {str(exc).splitlines()[0]}") from exc
        raise


def build_cublas_blockwise(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """``torch._scaled_mm`` with the scale layouts sm_90 accepts, WITHOUT the L4 padding (the baseline).

    Wrong without an error when (K/128) % 4 != 0; unsupported (raises) for some small M (M = 1)."""
    problem.check_shape(shape)

    def prepare(inputs: dict) -> dict:
        sa, sb = cublas_scale_layouts(inputs["a_scale"], inputs["b_scale"], pad_k_blocks=False)
        prep = {"a": inputs["a"].contiguous(), "bt": inputs["b"].contiguous().t(), "sa": sa, "sb": sb}
        scratch = torch.empty((inputs["a"].shape[0], inputs["b"].shape[0]), dtype=torch.bfloat16, device=inputs["a"].device)
        _probe(lambda: run(prep, scratch), shape, "cuBLAS block-wise (torch._scaled_mm)")
        return prep

    def run(prep: dict, out: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(prep["a"], prep["bt"], prep["sa"], prep["sb"], out_dtype=torch.bfloat16, out=out)

    return KernelLaunch(
        name="cublas_blockwise",
        run=run,
        prepare=prepare,
        expect_kernels=CUBLAS_BLOCKWISE_KERNELS,
        describe={"backend": "cublas", "api": "torch._scaled_mm", "scale_b_padded": False},
    )


def _padded_call_forms():
    """Ways to hand cuBLAS the padded 128x128 scales, most explicit first. torch versions differ in
    which one they accept (the v1 auto-detect checks the stride as L; the v2 API wants L4 rows)."""
    import torch.nn.functional as F

    def v2_l4_rows(a, bt, sa, sb_l4, L, out):
        return F.scaled_mm(a, bt, sa, F.ScalingType.BlockWise1x128, sb_l4, F.ScalingType.BlockWise128x128,
                           output_dtype=torch.bfloat16)

    def v2_l_rows(a, bt, sa, sb_l4, L, out):
        return F.scaled_mm(a, bt, sa, F.ScalingType.BlockWise1x128, sb_l4[:L], F.ScalingType.BlockWise128x128,
                           output_dtype=torch.bfloat16)

    def v1_l_rows(a, bt, sa, sb_l4, L, out):
        return torch._scaled_mm(a, bt, sa, sb_l4[:L], out_dtype=torch.bfloat16, out=out)

    forms = []
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        forms += [("F.scaled_mm[L4 rows]", v2_l4_rows), ("F.scaled_mm[L rows, L4 stride]", v2_l_rows)]
    forms.append(("torch._scaled_mm[L rows, L4 stride]", v1_l_rows))
    return forms


def build_cublas_blockwise_padded(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """cuBLAS block-wise with the 128x128 scales' K-block axis padded to a multiple of 4 (PyTorch
    PR #166752): the oracle-correct way to call it. The first call form this torch accepts is used
    (recorded in ``describe['call_form']``); correctness is judged by the caller against the oracle."""
    problem.check_shape(shape)
    chosen: dict[str, Any] = {}

    def prepare(inputs: dict) -> dict:
        sa, sb_l4 = cublas_scale_layouts(inputs["a_scale"], inputs["b_scale"], pad_k_blocks=True)
        L = inputs["a_scale"].shape[1]
        prep = {"a": inputs["a"].contiguous(), "bt": inputs["b"].contiguous().t(), "sa": sa, "sb": sb_l4, "L": L}
        scratch = torch.empty((inputs["a"].shape[0], inputs["b"].shape[0]), dtype=torch.bfloat16, device=inputs["a"].device)
        if "form" not in chosen:
            errors = []
            for name, fn in _padded_call_forms():
                try:
                    fn(prep["a"], prep["bt"], sa, sb_l4, L, scratch)
                except (RuntimeError, ValueError, NotImplementedError, TypeError) as exc:
                    errors.append(f"{name}: {str(exc).splitlines()[0]}")
                    continue
                chosen.update(form=fn, name=name)
                launch.describe["call_form"] = name
                break
            else:
                if errors and all(_is_not_supported(Exception(e)) for e in errors):
                    raise UnsupportedShape("padded cuBLAS block-wise: " + "; ".join(errors))
                raise UnsupportedShape("no padded cuBLAS block-wise call form accepted here: " + "; ".join(errors))
        return prep

    def run(prep: dict, out: torch.Tensor) -> torch.Tensor:
        return chosen["form"](prep["a"], prep["bt"], prep["sa"], prep["sb"], prep["L"], out)

    launch = KernelLaunch(
        name="cublas_blockwise_padded",
        run=run,
        prepare=prepare,
        expect_kernels=CUBLAS_BLOCKWISE_KERNELS,
        describe={"backend": "cublas", "api": "scaled_mm", "scale_b_padded": True},
    )
    return launch


# ---------------------------------------------------------------------------------------------
# MSLK's CUTLASS group-wise kernel


def mslk_groupwise_scales(a_scale: torch.Tensor, b_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The scale layouts ``f8f8bf16_groupwise`` reads, as MSLK v1.1.0's own benchmark and tests make
    them (``quantize_fp8_group(x, k_major=False)``, ``quantize_fp8_block(w, 128, 128, k_major=False)``):

    x_scale: (K/128, M) contiguous, M fastest ("M-major"), element [kb, m] = a_scale[m, kb];
    w_scale: (K/128, ceil(N/128)) contiguous, element [kb, nb] = b_scale[nb, kb].

    Both are decode multipliers (MSLK returns amax/448, the same convention as problem.py). Handing
    the problem's (M, K/128) / (Nb, K/128) row-major tensors over as they are is the "naive layout"
    that gave wrong results in the H200 probe (peers-on-h200.md).
    """
    if a_scale.dim() != 2 or b_scale.dim() != 2 or a_scale.shape[1] != b_scale.shape[1]:
        raise ValueError(f"a_scale {tuple(a_scale.shape)} and b_scale {tuple(b_scale.shape)} must be (M, L) and (Nb, L)")
    return a_scale.float().t().contiguous(), b_scale.float().t().contiguous()


def build_mslk_groupwise(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """MSLK's CUTLASS fp8 GEMM with 1x128 / 128x128 scales (``torch.ops.mslk.f8f8bf16_groupwise``).

    Unavailable without mslk; a shape the op refuses (TORCH_CHECK / "cutlass cannot implement") is
    recorded as unsupported with MSLK's text. It allocates its own output (no ``out`` argument)."""
    problem.check_shape(shape)
    fn = _mslk.op("f8f8bf16_groupwise")

    def prepare(inputs: dict) -> dict:
        xs, ws = mslk_groupwise_scales(inputs["a_scale"], inputs["b_scale"])
        return {"XQ": inputs["a"].contiguous(), "WQ": inputs["b"].contiguous(), "x_scale": xs, "w_scale": ws}

    def run(prep: dict, out: torch.Tensor) -> torch.Tensor:
        return _mslk.guarded("f8f8bf16_groupwise", shape, lambda: fn(prep["XQ"], prep["WQ"], prep["x_scale"], prep["w_scale"]))

    return KernelLaunch(name="mslk_f8f8bf16_groupwise", run=run, prepare=prepare, expect_kernels=_mslk.MSLK_KERNELS,
                        describe={"backend": _mslk.backend_name(), "op": "torch.ops.mslk.f8f8bf16_groupwise",
                                  "mslk": _mslk.version(), "writes_out": False, "expect_kernels_verified": False})


def build_deepgemm(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """DeepGEMM's dense fp8 GEMM with 1x128 / 128x128 fp32 scales (``deep_gemm.fp8_gemm_nt``, sm_90).

    Unavailable without deep_gemm (or without an nvcc for its JIT); a shape its host code refuses is
    recorded as unsupported with DeepGEMM's text. It writes into ``out`` (bf16, row-major)."""
    problem.check_shape(shape)
    gemm = _deepgemm.function("fp8_gemm_nt")
    align = _deepgemm.function("get_mn_major_tma_aligned_tensor")

    def prepare(inputs: dict) -> dict:
        # sfa once into the layout the kernel reads (MN-major, TMA-aligned): the timed call then
        # passes it through untouched instead of transposing it on every call (kernels/_deepgemm.py).
        sfa = _deepgemm.guarded("get_mn_major_tma_aligned_tensor", shape, lambda: align(inputs["a_scale"].float().contiguous()))
        return {"a": inputs["a"].contiguous(), "b": inputs["b"].contiguous(), "sfa": sfa,
                "sfb": inputs["b_scale"].float().contiguous()}

    def run(prep: dict, out: torch.Tensor) -> torch.Tensor:
        _deepgemm.guarded("fp8_gemm_nt", shape, lambda: gemm((prep["a"], prep["sfa"]), (prep["b"], prep["sfb"]), out))
        return out

    return KernelLaunch(name="deepgemm_fp8_gemm_nt", run=run, prepare=prepare, expect_kernels=_deepgemm.DEEPGEMM_KERNELS,
                        describe={"backend": "deep_gemm", "op": "deep_gemm.fp8_gemm_nt", "deep_gemm": _deepgemm.version(),
                                  "recipe": "sm90 1d2d: sfa 1x128 (MN-major, TMA-aligned, made in prepare), sfb 128x128",
                                  "expect_kernels_verified": False})


# ---------------------------------------------------------------------------------------------
# bf16 cuBLAS on pre-dequantized operands (what the fp8 path must beat to be worth it)


def build_bf16_cublas(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """``torch.mm`` in bf16 on operands dequantized in ``prepare`` (untimed)."""
    problem.check_shape(shape)

    def prepare(inputs: dict) -> dict:
        a16 = problem.dequant_a(inputs["a"], inputs["a_scale"]).to(torch.bfloat16)
        b16 = problem.dequant_b(inputs["b"], inputs["b_scale"]).to(torch.bfloat16)
        return {"a": a16, "bt": b16.t()}

    def run(prep: dict, out: torch.Tensor) -> torch.Tensor:
        return torch.mm(prep["a"], prep["bt"], out=out)

    return KernelLaunch(name="bf16_cublas", run=run, prepare=prepare, expect_kernels=CUBLAS_BF16_KERNELS,
                        describe={"backend": "cublas", "api": "torch.mm", "dtype": "bf16"})


# ---------------------------------------------------------------------------------------------
# ROCm: CK block-scale through aiter (not testable on this project's machines)


def build_ck_blockscale(shape: dict, config: dict | None = None, device: str = "cuda") -> KernelLaunch:
    """aiter's CK ``gemm_a8w8_blockscale`` on ROCm. Untested here (no AMD GPU). On gfx942 the fp8
    type is e4m3fnuz: inputs made as e4m3fn must be converted (and their scales doubled) first."""
    problem.check_shape(shape)
    try:
        import aiter  # noqa: F401
        from aiter import gemm_a8w8_blockscale
    except Exception as exc:  # ImportError, or a broken ROCm install raising at import
        raise UnsupportedShape(f"CK block-scale baseline needs aiter (import failed: {type(exc).__name__}: {exc})") from exc
    if not getattr(torch.version, "hip", None):
        raise UnsupportedShape("CK block-scale baseline runs on ROCm only")

    def prepare(inputs: dict) -> dict:
        return {"a": inputs["a"].contiguous(), "b": inputs["b"].contiguous(),
                "sa": inputs["a_scale"].float().contiguous(), "sb": inputs["b_scale"].float().contiguous()}

    def run(prep: dict, out: torch.Tensor) -> torch.Tensor:
        return gemm_a8w8_blockscale(prep["a"], prep["b"], prep["sa"], prep["sb"], dtype=torch.bfloat16)

    return KernelLaunch(name="ck_blockscale", run=run, prepare=prepare, expect_kernels=CK_BLOCKSCALE_KERNELS,
                        describe={"backend": "ck", "api": "aiter.gemm_a8w8_blockscale", "tested": False})
