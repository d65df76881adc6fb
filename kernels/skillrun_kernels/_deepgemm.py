"""DeepGEMM (deepseek-ai/DeepGEMM) as a production reference: the fp8 block-scale GEMM that SGLang
and vLLM run for DeepSeek-V3-style layers on Hopper.

``deep_gemm`` is imported only when a reference is built (the runner and CI run without it). It
is not on PyPI in a form that loads on the H200 image (the ``sgl-deep-gemm`` 0.2.5 wheel fails
against torch 2.11 with an undefined ``c10::cuda::CUDAErrorLogCapture`` and ships no source), so
the device builds it from source: ``benchmarks/device_deepgemm_build.sh``. Two ways it can fail to
be a reference, both recorded, never replaced by another kernel:

* ``deep_gemm`` is not importable (not built, built against another torch, no CUDA home for its
  JIT) -> :class:`ReferenceUnavailable` with the import error (status ``unavailable``);
* it refuses the shape (a ``DG_HOST_ASSERT`` in its host code, raised as RuntimeError) ->
  :class:`UnsupportedShape` with DeepGEMM's text (status ``unsupported``). Faults that leave the
  device broken are re-raised as they are.

API used (DeepGEMM 2.x, ``csrc/apis/gemm.hpp``): ``deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), d)``
computes ``d = a @ b.T`` with a (M, K) and b (N, K) fp8 e4m3 K-major, d (M, N) bf16, and on sm_90
fp32 scales with the default recipe (1, 128, 128): sfa (M, K/128) per 1x128 block of a, sfb
(ceil(N/128), K/128) per 128x128 block of b, both decode multipliers like problem.py's. DeepGEMM
needs sfa MN-major and TMA-aligned; given another layout it transposes it on every call, so the
reference's ``prepare`` does that once with DeepGEMM's own ``get_mn_major_tma_aligned_tensor`` and
the timed call receives the layout it uses as is.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from skillrun_kernels.protocol import ReferenceUnavailable, UnsupportedShape

# DeepGEMM JIT-compiles its kernels; their names carry the implementation's template name:
# ``deep_gemm::sm90_fp8_gemm_1d2d_impl<...>`` (1x128 activation x 128x128 weight scales, the
# recipe here) or ``sm90_fp8_gemm_1d1d_impl`` (1x128 x 1x128). Read from DeepGEMM's source
# (deep_gemm/include/deep_gemm/impls/), not yet from a device trace: UNVERIFIED until a device run.
DEEPGEMM_KERNELS = r"sm90_fp8_gemm_1d[12]d_impl|_ZN9deep_gemm\d+sm90_fp8_gemm"
# The scale-layout kernel DeepGEMM launches inside a GEMM call when it is handed fp32 scales that are
# not MN-major and TMA-aligned (csrc/apis/layout.hpp -> deep_gemm/impls/smxx_layout.cuh).
DEEPGEMM_LAYOUT_KERNELS = r"deep_gemm::transpose_fp32<"
TMA_ALIGN_BYTES = 16  # DeepGEMM pads the MN axis of fp32 scale factors to 16 bytes (get_tma_aligned_size)
# The row alignment of the m-grouped contiguous layout before DeepGEMM made it a runtime setting
# (kLegacyMKAlignmentForContiguousLayout in csrc/jit_kernels/heuristics/runtime.hpp, 2.6.1).
LEGACY_CONTIGUOUS_ALIGNMENT = 128

_FATAL = ("illegal memory access", "illegal address", "device-side assert", "unspecified launch failure",
          "misaligned address", "an illegal instruction")


def version() -> str | None:
    import sys

    mod = sys.modules.get("deep_gemm")
    if mod is None:
        return None
    return f"deep_gemm {getattr(mod, '__version__', 'unknown')}"


def module():
    """The imported ``deep_gemm``, or ReferenceUnavailable with the reason it does not import."""
    try:
        import deep_gemm
    except Exception as exc:  # ImportError, an undefined symbol against this torch, its CUDA-home assert
        first = str(exc).splitlines()[0] if str(exc) else ""
        hint = ("build it on the device with benchmarks/device_deepgemm_build.sh"
                + ("" if os.environ.get("CUDA_HOME") else "; CUDA_HOME is not set (its JIT needs nvcc)"))
        raise ReferenceUnavailable(f"deep_gemm is not importable here ({type(exc).__name__}: {first[:300]}); {hint}") from None
    return deep_gemm


def function(name: str) -> Callable[..., Any]:
    dg = module()
    fn = getattr(dg, name, None)
    if fn is None:
        raise ReferenceUnavailable(f"{version() or 'deep_gemm'} has no {name} (built without sm_90 fp8 support, "
                                   "or a CUDA runtime older than 12.1)")
    return fn


def guarded(name: str, shape: dict, fn: Callable[[], Any]) -> Any:
    """``fn()``, with DeepGEMM refusing this shape turned into UnsupportedShape (its text kept)."""
    try:
        return fn()
    except (RuntimeError, ValueError) as exc:
        text = str(exc).strip()
        if any(f in text.lower() for f in _FATAL):
            raise
        if "compilation failed" in text.lower() or "nvcc version" in text.lower():
            # Its JIT could not build the kernel here (no usable nvcc): the library, not the shape.
            raise ReferenceUnavailable(f"deep_gemm.{name}: its JIT compiler failed here ({text.splitlines()[0][:300]}); "
                                       "set CUDA_HOME to a CUDA >= 12.3 toolkit with bin/nvcc") from exc
        first = " / ".join(ln.strip() for ln in text.splitlines()[:3] if ln.strip())[:600]
        dims = ", ".join(f"{k}={v}" for k, v in shape.items())
        raise UnsupportedShape(f"deep_gemm.{name} raised for {dims}: {type(exc).__name__}: {first}") from exc


def contiguous_m_alignment(dg) -> int:
    """Rows per expert segment of the m-grouped contiguous layout, as this DeepGEMM asks for it:
    ``get_m_alignment_for_contiguous_layout`` (1.x/2.0), ``get_mk_alignment_for_contiguous_layout``
    (2.6: a runtime setting, on the module or its ``_C``), else the legacy constant 128."""
    for owner in (dg, getattr(dg, "_C", None)):
        for name in ("get_m_alignment_for_contiguous_layout", "get_mk_alignment_for_contiguous_layout"):
            fn = getattr(owner, name, None) if owner is not None else None
            if callable(fn):
                return int(fn())
    return LEGACY_CONTIGUOUS_ALIGNMENT


def tma_aligned(mn: int) -> int:
    per = TMA_ALIGN_BYTES // 4
    return -(-mn // per) * per


def mn_major_sf(shape: tuple[int, ...], device, fill: float | None = None):
    """An fp32 scale-factor tensor of ``shape`` ((MN, K/128) or (G, MN, K/128)) in the layout DeepGEMM's
    sm_90 kernels read as is: MN-major, the MN axis padded to 16 bytes (the layout
    ``get_mn_major_tma_aligned_tensor`` returns). Writing gathered scales straight into it is what
    SGLang's quantization kernels do (column-major, TMA-aligned scales); handing DeepGEMM row-major
    scales instead makes it launch its own transpose inside the timed call."""
    import torch

    *g, mn, k = shape
    pad = tma_aligned(mn)
    if g:
        t = torch.empty_strided((g[0], mn, k), (pad * k, 1, pad), dtype=torch.float32, device=device)
    else:
        t = torch.empty_strided((mn, k), (1, pad), dtype=torch.float32, device=device)
    if fill is not None:
        t.fill_(fill)
    return t
