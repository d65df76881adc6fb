"""Reference kernels for the batched fp8 rowwise GEMM: the oracle and what users run today.

- ``build_oracle``: fp32 dequant reference (problem.oracle), rounded to bf16.
- ``build_scaled_mm_loop`` (CUDA): one ``torch._scaled_mm`` rowwise call per batch, the usual
  way to express a batched rowwise GEMM in PyTorch (``_scaled_mm`` is 2-D only).
- ``build_scaled_grouped_mm`` (CUDA sm_90/sm_100): ``torch._scaled_grouped_mm`` 3D x 3D, i.e. one
  CUTLASS launch for all batches.
- ``build_mslk_rowwise_batched`` (CUDA and ROCm; the production kernel): MSLK's
  ``torch.ops.mslk.f8f8bf16_rowwise_batched``, CUTLASS on sm_90 (``mslk-cuda``), CK/FlyDSL on
  gfx9xx (``mslk-rocm``): the op the row-wise seed (MSLK PR #444) implements for gfx950.
  ``build_mslk_rowwise_batched_pad16``: the same op on M padded to a multiple of 16, as a caller
  does where the op refuses a small M (kept beside the unpadded one, which then says
  ``unsupported``). ``build_ck_rowwise_batched`` is the same builder under the gfx950 card's name.
- ``build_aiter_batched_a8w8`` (ROCm): aiter's batched a8w8 GEMM, a separate named reference.
"""
from __future__ import annotations

import torch

from skillrun_kernels import _mslk
from skillrun_kernels.protocol import KernelLaunch, ReferenceUnavailable, UnsupportedShape

from . import problem

# Kernel names the CUDA references launch (read from torch.profiler traces on the H200; see NOTES.md).
# The loop's own kernels (cuBLASLt "nvjet" rowwise kernels carry "ovscale"; CUTLASS f8f8bf16_rowwise
# on older cuBLAS) plus the copy kernel of the padded-M path.
SCALED_MM_KERNELS = r"^(nvjet_sm90_.*|.*f8f8bf16_rowwise.*|.*cutlass.*|.*direct_copy_kernel.*|.*elementwise_kernel.*)$"
SCALED_GROUPED_MM_KERNELS = r"^(.*cutlass.*|.*f8f8bf16_grouped.*|.*device_kernel.*)$"


def build_oracle(shape: dict, config: dict, device: str) -> KernelLaunch:
    def run(inputs: dict, out: torch.Tensor) -> torch.Tensor:
        out.copy_(problem.oracle(inputs))
        return out

    return KernelLaunch(name="oracle_fp32", run=run, describe={"backend": "torch", "precision": "fp32"})


def _cuda_sm(device: str) -> tuple[int, int]:
    if not torch.cuda.is_available() or not str(device).startswith("cuda"):
        raise UnsupportedShape("this reference needs a CUDA device")
    return torch.cuda.get_device_capability(torch.device(device))


def pad_rows(xq: torch.Tensor, x_scale: torch.Tensor, multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero rows (scale 1) appended so M is a multiple of ``multiple``; inputs returned as is if it is."""
    b, m, k = xq.shape
    mp = -(-m // multiple) * multiple
    if mp == m:
        return xq, x_scale
    xp = torch.zeros(b, mp, k, dtype=torch.uint8, device=xq.device)
    xp[:, :m].copy_(xq.view(torch.uint8))
    sp = torch.ones(b, mp, dtype=x_scale.dtype, device=x_scale.device)
    sp[:, :m].copy_(x_scale)
    return xp.view(xq.dtype), sp


def build_scaled_mm_loop(shape: dict, config: dict, device: str) -> KernelLaunch:
    """B calls of ``torch._scaled_mm(xq[b], wq[b].t(), scale_a=(M,1), scale_b=(1,N))``.

    On the H200 (torch 2.11, CUDA 13.0) cuBLASLt's rowwise path refused M=1 at N=1280, K=8192
    with CUBLAS_STATUS_NOT_SUPPORTED, so by default M is padded to a multiple of 16 (zero rows,
    padded once in ``prepare``); the timed call then also copies the M real rows out, as a user's
    padded code would. ``config={"pad_m_to": 1}`` disables the padding.
    """
    _cuda_sm(device)
    cfg = config or {}
    fast_accum = bool(cfg.get("use_fast_accum", True))
    pad_to = int(cfg.get("pad_m_to", 16))
    m = int(shape["M"])

    def prepare(inputs: dict) -> dict:
        xq, xs = pad_rows(inputs["xq"], inputs["x_scale"], pad_to)
        wq, ws = inputs["wq"], inputs["w_scale"]
        padded = xq.shape[1] != m
        return {
            "a": [xq[b] for b in range(xq.shape[0])],
            "bt": [wq[b].t() for b in range(wq.shape[0])],  # (K, N) column-major: cuBLASLt's TN form
            "sa": [xs[b].reshape(-1, 1).contiguous() for b in range(xs.shape[0])],
            "sb": [ws[b].reshape(1, -1).contiguous() for b in range(ws.shape[0])],
            "tmp": torch.empty(xq.shape[0], xq.shape[1], wq.shape[1], dtype=torch.bfloat16, device=xq.device) if padded else None,
        }

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        target = out if p["tmp"] is None else p["tmp"]
        for b in range(len(p["a"])):
            torch._scaled_mm(
                p["a"][b], p["bt"][b], scale_a=p["sa"][b], scale_b=p["sb"][b],
                out_dtype=torch.bfloat16, use_fast_accum=fast_accum, out=target[b],
            )
        if p["tmp"] is not None:
            out.copy_(p["tmp"][:, :m])
        return out

    return KernelLaunch(
        name="torch_scaled_mm_loop",
        run=run,
        prepare=prepare,
        expect_kernels=SCALED_MM_KERNELS,
        describe={"backend": "cublas", "launches": int(shape["batch"]), "use_fast_accum": fast_accum,
                  "pad_m_to": pad_to if m % pad_to else None},
    )


def build_scaled_grouped_mm(shape: dict, config: dict, device: str) -> KernelLaunch:
    """``torch._scaled_grouped_mm`` with 3-D operands and no offsets: one batched CUTLASS launch."""
    major, minor = _cuda_sm(device)
    if (major, minor) not in ((9, 0), (10, 0)):
        raise UnsupportedShape(f"torch._scaled_grouped_mm needs sm_90 or sm_100, this device is sm_{major}{minor}")
    if not hasattr(torch, "_scaled_grouped_mm"):
        raise UnsupportedShape("this torch build has no torch._scaled_grouped_mm")
    n, k = int(shape["N"]), int(shape["K"])
    if k % 16 or n % 16:
        raise UnsupportedShape(f"torch._scaled_grouped_mm needs N and K divisible by 16, got N={n} K={k}")
    fast_accum = bool((config or {}).get("use_fast_accum", True))

    def prepare(inputs: dict) -> dict:
        return {
            "a": inputs["xq"],
            "bt": inputs["wq"].transpose(-2, -1),  # (B, K, N) view, "transposed" as the op requires
            "sa": inputs["x_scale"].contiguous(),
            "sb": inputs["w_scale"].contiguous(),
        }

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        return torch._scaled_grouped_mm(
            p["a"], p["bt"], p["sa"], p["sb"], out_dtype=torch.bfloat16, use_fast_accum=fast_accum
        )

    return KernelLaunch(
        name="torch_scaled_grouped_mm",
        run=run,
        prepare=prepare,
        expect_kernels=SCALED_GROUPED_MM_KERNELS,
        describe={"backend": "cutlass", "launches": 1, "use_fast_accum": fast_accum, "writes_out": False},
    )


def mslk_rowwise_batched_args(inputs: dict, pad_m_to: int = 1) -> dict:
    """The operands ``f8f8bf16_rowwise_batched`` takes (MSLK v1.1.0: 3-D contiguous e4m3 XQ (B, M, K)
    and WQ (B, N, K), fp32 x_scale (B, M) and w_scale (B, N) decode multipliers, bf16 out (B, M, N)),
    with M zero-padded to ``pad_m_to`` (scale 1 on the extra rows) when that is > 1."""
    xq, xs = inputs["xq"], inputs["x_scale"]
    if pad_m_to > 1:
        xq, xs = pad_rows(xq, xs, pad_m_to)
    b, mp, _ = xq.shape
    n = inputs["wq"].shape[1]
    padded = mp != inputs["xq"].shape[1]
    return {
        "XQ": xq.contiguous(), "WQ": inputs["wq"].contiguous(),
        "x_scale": xs.float().reshape(b, mp).contiguous(), "w_scale": inputs["w_scale"].float().reshape(b, n).contiguous(),
        "tmp": torch.empty(b, mp, n, dtype=torch.bfloat16, device=xq.device) if padded else None,
    }


def _mslk_rowwise(shape: dict, config: dict, device: str, pad_m_to: int, name: str) -> KernelLaunch:
    fn = _mslk.op("f8f8bf16_rowwise_batched")  # ReferenceUnavailable without mslk
    m = int(shape["M"])

    def prepare(inputs: dict) -> dict:
        return mslk_rowwise_batched_args(inputs, pad_m_to)

    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        target = out if p["tmp"] is None else p["tmp"]
        # use_fast_accum=True is the only mode MSLK's CUTLASS kernel accepts (TORCH_CHECK in v1.1.0).
        res = _mslk.guarded("f8f8bf16_rowwise_batched", shape, lambda: fn(
            p["XQ"], p["WQ"], p["x_scale"], p["w_scale"], bias=None, use_fast_accum=True, output=target))
        if p["tmp"] is not None:
            out.copy_(res[:, :m])
            return out
        return res

    # The padded form also launches the copy of the M real rows (the loop's copy kernels, SCALED_MM_KERNELS).
    expect = _mslk.MSLK_KERNELS + (r"|direct_copy_kernel|elementwise_kernel" if m % max(pad_m_to, 1) else "")
    return KernelLaunch(
        name=name, run=run, prepare=prepare, expect_kernels=expect,
        describe={"backend": _mslk.backend_name(), "op": "torch.ops.mslk.f8f8bf16_rowwise_batched", "mslk": _mslk.version(),
                  "launches": 1, "use_fast_accum": True, "pad_m_to": pad_m_to if m % max(pad_m_to, 1) else None,
                  "expect_kernels_verified": False},
    )


def build_mslk_rowwise_batched(shape: dict, config: dict, device: str) -> KernelLaunch:
    """MSLK's batched row-wise fp8 GEMM (the production kernel), unpadded: a shape it refuses (M=1 on
    the H200 probe) is recorded as unsupported with MSLK's error text."""
    return _mslk_rowwise(shape, config or {}, device, int((config or {}).get("pad_m_to", 1)), "mslk_f8f8bf16_rowwise_batched")


def build_mslk_rowwise_batched_pad16(shape: dict, config: dict, device: str) -> KernelLaunch:
    """The same op on M zero-padded to a multiple of 16 (padded once, untimed); the timed call also
    copies the M real rows out, as a caller's padded code would (same rule as the _scaled_mm loop)."""
    return _mslk_rowwise(shape, config or {}, device, 16, "mslk_f8f8bf16_rowwise_batched_pad16")


def build_ck_rowwise_batched(shape: dict, config: dict, device: str) -> KernelLaunch:
    """The gfx950 card's ROCm baseline: MSLK's batched row-wise op (mslk-rocm), the same builder as
    the sm_90 card's (same op name and schema). Without mslk it is ``unavailable``; aiter's GEMM is
    ``build_aiter_batched_a8w8``, a separate reference, never a silent stand-in."""
    return _mslk_rowwise(shape, config or {}, device, 1, "mslk_f8f8bf16_rowwise_batched")


def build_aiter_batched_a8w8(shape: dict, config: dict, device: str) -> KernelLaunch:
    """aiter's batched a8w8 GEMM on ROCm. Not runnable on this project's machines (no AMD GPU)."""
    try:
        import aiter

        fn = aiter.batched_gemm_a8w8
    except (ImportError, AttributeError) as exc:
        raise ReferenceUnavailable(f"aiter.batched_gemm_a8w8 is not importable here ({type(exc).__name__}: {exc})") from None

    def run_aiter(p: dict, out: torch.Tensor) -> torch.Tensor:
        return fn(p["xq"], p["wq"], p["x_scale"].unsqueeze(-1), p["w_scale"].unsqueeze(-2), out)

    return KernelLaunch(name="aiter_batched_gemm_a8w8", run=run_aiter, describe={"backend": "ck", "api": "aiter.batched_gemm_a8w8"})
