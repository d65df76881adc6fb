"""Which operands a port may preprocess untimed: weights yes, activations never.

A family's problem module declares ``WEIGHTS``, the input keys that are weights: in a model they
are fixed for many calls, so a port may turn them into its own layout once (shuffles, packing,
scale re-layout) in ``KernelLaunch.prepare``, outside the timed launch, as production ports do.
Every other tensor input is an activation: new on every call, so any work on it is the kernel's
work and must be timed.

``prepare_blind`` enforces that: it calls ``prepare`` with each activation's *buffer* holding
unrelated content of the same shape and dtype (a decoy from the problem's own ``make_inputs``
under another seed) and writes the real content into those same buffers only after ``prepare``
returned. A port that keeps a reference to an activation (or a view of it) reads the real values
when it runs; a port that derived anything from an activation's values in ``prepare`` (a copy, a
layout change, or the whole product) holds the decoy's result and fails the oracle. A problem that
declares no ``WEIGHTS`` has none: every tensor input is an activation.

A family may also declare ``PREPARED_ACTIVATIONS``: activation side operands (per-block scales)
whose *layout* production gets for free, because their producer (the activation quantizer) writes
them in whatever layout the kernel reads. ``prepare`` sees their content so a port can re-lay them
out as that producer would; they hold too little of the problem to compute the output from (the
scales without the values they scale), so this opens no shortcut to the answer.

Only the accused are blinded: the port and its peers (the tuner's candidates, the port's own kernel
with other configs). A reference's ``prepare`` sees everything, as its production caller does: a
reference that moved work into ``prepare`` only makes the port look slower, never faster.
"""
from __future__ import annotations

from typing import Any


def _declared(problem: Any, attr: str) -> frozenset[str]:
    w = getattr(problem, attr, ())
    if isinstance(w, str) or not isinstance(w, (tuple, list, frozenset, set)) or not all(isinstance(k, str) for k in w):
        raise TypeError(f"{getattr(problem, '__name__', problem)}.{attr} must be a tuple of input keys, not {w!r}")
    return frozenset(w)


def activation_keys(problem: Any, inputs: dict) -> list[str]:
    """The tensor inputs ``prepare`` must not see: neither weights nor declared prepared activations."""
    import torch

    seen = _declared(problem, "WEIGHTS") | _declared(problem, "PREPARED_ACTIVATIONS")
    return [k for k, v in inputs.items() if k not in seen and isinstance(v, torch.Tensor)]


# The candidate roles whose prepare() is a reference's: it sees every operand (see the module docstring).
REFERENCE_ROLES = frozenset({"baseline", "alternative"})


def prepare_blind(launch: Any, inputs: dict, acts: list[str], decoy: dict, real: dict) -> Any:
    """``launch.prepare(inputs)`` with the activations ``acts`` holding ``decoy``'s content; each
    activation buffer of ``inputs`` then gets ``real``'s content (in place, so references the port
    kept see it). ``real`` may be ``inputs`` itself only when it is not one of the buffers written."""
    for k in acts:
        d, r = decoy[k], inputs[k]
        if tuple(d.shape) != tuple(r.shape) or d.dtype != r.dtype:
            raise ValueError(f"decoy for activation {k!r} is {tuple(d.shape)} {d.dtype}, the input {tuple(r.shape)} {r.dtype}: "
                             "the problem's make_inputs must give the same shapes for every seed")
    from skillrun.execute import guard

    try:
        with guard.harness():
            for k in acts:
                inputs[k].copy_(decoy[k])
        return launch.prepare(inputs)
    finally:
        # No mode the port pushed may run here: it would see the real activations arrive, untimed.
        with guard.harness():
            for k in acts:
                inputs[k].copy_(real[k])
