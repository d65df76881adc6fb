"""GPU checks shared by the Gluon block-scale kernels' tests (gluon_sm90, gluon_sm90_ws): one run of a
port twice on the same prepared operands, and the verdicts every lever is held to.

A seed is drawn per test and printed in each failure, so a failing case can be rerun as it was.
"""
from __future__ import annotations

import os

import torch

from skillrun_kernels.fp8_blockscale_gemm import problem

TOL = 3e-3  # relative Frobenius error against the fp32 oracle


def seed() -> int:
    return int.from_bytes(os.urandom(4), "little") % 1_000_000


def run_twice(port, sd: dict, knobs: dict | None, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(first output, second output, oracle) of ``port.build(sd, knobs)`` run twice on one prepare,
    the output buffer NaN-filled first so that an element never written shows."""
    x = problem.make_inputs(sd, seed, "cuda")
    kl = port.build(sd, knobs, "cuda")
    prep = kl.prepare(x)
    out = problem.output_like(sd, "cuda").fill_(float("nan"))
    kl.run(prep, out)
    first = out.clone()
    kl.run(prep, out)
    torch.cuda.synchronize()
    return first, out, problem.oracle(x)


def assert_matches_oracle(port, sd: dict, knobs: dict | None, seed: int, what: str = "") -> None:
    """Within TOL of the oracle, deterministic, every element written."""
    first, out, ref = run_twice(port, sd, knobs, seed)
    err = problem.rel_error(out, ref)
    assert err < TOL, f"{what}seed {seed}: rel err {err}"
    assert torch.equal(first, out), f"{what}seed {seed}: not deterministic"
    assert not torch.isnan(out).any(), f"{what}seed {seed}: unwritten elements"


def assert_lever_holds(port, name: str, sd: dict, seed: int) -> None:
    """An ablation of ``port.ABLATIONS``: a promoting variant matches the oracle; the ceiling twin
    (scales ignored) runs and writes every element but must NOT match; both deterministic."""
    first, out, ref = run_twice(port, sd, port.ABLATIONS[name], seed)
    err = problem.rel_error(out, ref)
    if port.ablation_config(name).promote:
        assert err < TOL, f"{name} seed {seed}: rel err {err}"
    else:
        assert not torch.isnan(out).any() and err > 1e-1, f"{name} seed {seed}: rel err {err}"
    assert torch.equal(first, out), f"{name} seed {seed}: not deterministic"
