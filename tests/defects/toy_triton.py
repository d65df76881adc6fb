"""A plain Triton fp16 matmul: the toy "port" for the GPU smoke run and the CPU interpreter test.

``build_cheat`` launches the same Triton kernel but then overwrites the result with torch.mm:
numerically perfect, and exactly what slot integrity must catch on a GPU (a cuBLAS kernel in the
port's window).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from skillrun_kernels.protocol import KernelLaunch

EXPECT = r"^_toy_mm_kernel$"


@triton.jit
def _toy_mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows = min(tiles_m - first_m, GROUP_M)
    pm = first_m + (pid % per_group) % rows
    pn = (pid % per_group) // rows
    om = pm * BM + tl.arange(0, BM)
    on = pn * BN + tl.arange(0, BN)
    ok = tl.arange(0, BK)
    a = a_ptr + (om % M)[:, None] * sam + ok[None, :] * sak
    b = b_ptr + ok[:, None] * sbk + (on % N)[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        left = K - k * BK
        x = tl.load(a, mask=ok[None, :] < left, other=0.0)
        y = tl.load(b, mask=ok[:, None] < left, other=0.0)
        acc = tl.dot(x, y, acc)
        a += BK * sak
        b += BK * sbk
    c = c_ptr + om[:, None] * scm + on[None, :] * scn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(om[:, None] < M) & (on[None, :] < N))


def _launch(p: dict, out: torch.Tensor, cfg: dict) -> torch.Tensor:
    a, b = p["a"], p["b"]
    m, k = a.shape
    n = b.shape[1]
    grid = (triton.cdiv(m, cfg["BM"]) * triton.cdiv(n, cfg["BN"]),)
    _toy_mm_kernel[grid](a, b, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                         out.stride(0), out.stride(1), BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"],
                         GROUP_M=cfg.get("GROUP_M", 8), num_warps=cfg.get("num_warps", 8),
                         num_stages=cfg.get("num_stages", 3))
    return out


DEFAULT = {"BM": 128, "BN": 128, "BK": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


def build(shape: dict, config: dict, device: str) -> KernelLaunch:
    cfg = {**DEFAULT, **(config or {})}
    return KernelLaunch(name="toy_triton_mm", run=lambda p, out: _launch(p, out, cfg), expect_kernels=EXPECT,
                        describe={"backend": "triton", "config": cfg})


def build_cheat(shape: dict, config: dict, device: str) -> KernelLaunch:
    cfg = {**DEFAULT, **(config or {})}

    def run(p, out):
        _launch(p, out, cfg)
        torch.mm(p["a"], p["b"], out=out)
        return out

    return KernelLaunch(name="toy_triton_mm_cheat", run=run, expect_kernels=EXPECT,
                        describe={"backend": "triton", "config": cfg})


def _compile_args(shape: dict, config: dict | None) -> tuple[dict, dict]:
    """The config and the compile arguments of ``build``'s launch at ``shape`` (both compile paths below)."""
    cfg = {**DEFAULT, **(config or {})}
    m, n, k = (int(shape[x]) for x in ("M", "N", "K"))
    ptrs = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16"}
    return cfg, {"types": ptrs, "constexprs": {"BM": cfg["BM"], "BN": cfg["BN"], "BK": cfg["BK"], "GROUP_M": cfg.get("GROUP_M", 8)},
                 "divisible": list(ptrs), "values": {"M": m, "N": n, "K": k, "sam": k, "sak": 1, "sbk": n, "sbn": 1, "scm": n, "scn": 1},
                 "num_warps": cfg.get("num_warps", 8), "num_stages": cfg.get("num_stages", 3)}


def compile_only(shape: dict, config: dict | None = None, arch: str = "sm_90a") -> dict:
    """What ``build`` launches, compiled for ``arch`` on the CPU (kernels/skillrun_kernels/protocol.py);
    small tiles keep the compile-ahead tests quick."""
    from skillrun_kernels._triton.compile import compile_facts

    cfg, kw = _compile_args(shape, config)
    facts = compile_facts(_toy_mm_kernel, arch=arch, **kw)
    return {"arch": arch, "config": cfg, "kernels": [facts]}


def launch_only(shape: dict, config: dict | None = None, arch: str = "sm_90a") -> dict:
    """``compile_only`` without the facts: what a launch needs from the cache (the cubin), not the PTX
    the facts are read from, so a pruned cache serves it (tests/test_compile_ahead.py)."""
    from skillrun_kernels._triton.compile import compile_kernel

    cfg, kw = _compile_args(shape, config)
    ck = compile_kernel(_toy_mm_kernel, arch=arch, **kw)
    return {"arch": arch, "config": cfg, "kernels": [{"name": "_toy_mm_kernel", "cubin_bytes": len(ck.asm["cubin"])}]}


def build_gpu_only(shape: dict, config: dict, device: str) -> KernelLaunch:
    """The toy port, refusing a CPU device in its build (as a port that calls CUDA-only APIs would)."""
    if not str(device).startswith("cuda"):
        raise RuntimeError("this port needs a CUDA device")
    return build(shape, config, device)
