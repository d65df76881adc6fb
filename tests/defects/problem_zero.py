"""A broken problem: its operand ``a`` is all zeros, so the oracle is all zeros and any kernel
that writes zeros (or anything within atol of them) would "match" it. The harness must reject
the input, not grade candidates on it."""
from __future__ import annotations

import torch

from defects.problem import SHAPE_KEYS, WEIGHTS, flops, min_bytes, oracle, output_like  # noqa: F401
from defects.problem import make_inputs as _make_inputs


def make_inputs(shape: dict, seed: int, device: str) -> dict:
    inputs = _make_inputs(shape, seed, device)
    inputs["a"] = torch.zeros_like(inputs["a"])
    return inputs
