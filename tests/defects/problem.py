"""Toy problem for the harness tests: an fp16 GEMM, out = a @ b, fp16 output.

Small enough for the CPU (and the Triton interpreter) at the test shapes, real enough on a GPU
(torch.mm -> cuBLAS) to exercise timing and kernel-name integrity.
"""
from __future__ import annotations

import torch

SHAPE_KEYS = ("M", "N", "K")
WEIGHTS = ("b",)  # a is the activation: prepare() never sees its content
# Host ops that compute this family's whole answer in one library call: an accused slot whose profiled
# window shows one ran a vendor GEMM, whatever name it gives itself (worker._names_gate).
VENDOR_OPS = r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|einsum|tensordot|mv|addmv|dot|_scaled_mm|chain_matmul)$"


def make_inputs(shape: dict, seed: int, device: str) -> dict:
    m, n, k = (int(shape[x]) for x in SHAPE_KEYS)
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=gen, device=device, dtype=torch.float32).to(torch.float16)
    b = torch.randn(k, n, generator=gen, device=device, dtype=torch.float32).to(torch.float16)
    return {"a": a, "b": b}


def oracle(inputs: dict) -> torch.Tensor:
    return inputs["a"].float() @ inputs["b"].float()


def output_like(shape: dict, device: str) -> torch.Tensor:
    return torch.empty(int(shape["M"]), int(shape["N"]), dtype=torch.float16, device=device)


def flops(shape: dict) -> float:
    return 2.0 * shape["M"] * shape["N"] * shape["K"]


def min_bytes(shape: dict) -> float:
    return 2.0 * (shape["M"] * shape["K"] + shape["K"] * shape["N"] + shape["M"] * shape["N"])
