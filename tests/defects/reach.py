"""Ports that reach the judge instead of the math (issue 29, "separate the judge from the accused").

Each one scored while the oracle, the parity check and the result file lived in the process that
imports the port; each comment says what stops it now (skillrun.execute.judge: the isolated parity
gate is decided in a process that never imports a port, from output bytes handed over as a plain
tensor).
"""
from __future__ import annotations

import json
import os
import sys

import torch

from skillrun_kernels.protocol import KernelLaunch

from defects.kernels import _honest, _port


def _half(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The product with its right half of columns zeroed: half the work."""
    c = _honest(a, b)
    c[:, c.shape[1] // 2:] = 0
    return c


class _Lazy(torch.Tensor):
    """Computes the product only when someone looks: any torch function applied to it fills it first."""

    pending: dict = {}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for key, (a, b, out) in list(cls.pending.items()):
            with torch._C.DisableTorchFunctionSubclass():
                out.copy_(_honest(a, b))
            del cls.pending[key]
        return super().__torch_function__(func, types, args, kwargs or {})


def build_lazy_subclass(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Returns its output as a Tensor subclass whose __torch_function__ computes the product when the
    harness's parity check touches it; the timed call does nothing (stopped: outputs cross to the
    judge as raw bytes, and only an exact torch.Tensor is accepted)."""
    def body(p, out):
        lazy = out.as_subclass(_Lazy)
        _Lazy.pending[id(lazy)] = (p["a"], p["b"], out)
        return lazy

    return _port("port_lazy_subclass", body)


def build_forges_result(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Writes zeros, then finds the child's result path on the call stack, writes its own result
    (parity passed on every seed) and exits (stopped: the parent takes no verdict from the port's
    process; parity is the judge's, from the outputs handed over, and none were)."""
    def body(p, out):
        out.zero_()
        f = sys._getframe()
        while f is not None:
            task, path = f.f_locals.get("task"), f.f_locals.get("result_path")
            if isinstance(path, str) and isinstance(task, dict):
                seeds = [{"seed": s, "passed": True, "max_abs_err": 0.0, "max_rel_err": 0.0, "rel_fro": 0.0, "cosine": 1.0,
                          "mismatched": 0, "nonfinite": 0, "elements": out.numel()} for s in task.get("seeds", [])]
                forged = {"status": "ok", "role": task.get("role"), "ref": task.get("ref"), "shape": task.get("shape"),
                          "flops": 1.0, "min_bytes": 1.0, "name": "port_forges_result", "expect_kernels": None,
                          "describe": {"backend": "torch"}, "build_s": 0.0,
                          "parity": {"passed": True, "supported": True, "max_abs_err": 0.0, "max_rel_err": 0.0,
                                     "rel_fro": 0.0, "cosine": 1.0, "mismatched": 0, "nonfinite": 0, "seeds": seeds}}
                with open(path, "w") as fh:
                    json.dump(forged, fh)
                os._exit(0)
            f = f.f_back
        return out

    return _port("port_forges_result", body)


def build_patches_compare(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Does half the work and, when built, makes the harness's parity comparison pass everything
    (stopped: the judge's process never imports the port, so the patch never reaches it)."""
    from skillrun.execute import parity

    real = parity.compare

    def lenient(out, ref, tol):
        m = real(out, ref, tol)
        m.pop("error", None)
        m["passed"] = True
        return m

    parity.compare = lenient
    return _port("port_patches_compare", lambda p, out: out.copy_(_half(p["a"], p["b"])))


def build_patches_oracle(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Does half the work and, when built, swaps the problem's oracle for one that does the same half
    (stopped: the judge imports the problem module in its own process)."""
    import defects.problem as problem

    problem.oracle = lambda inputs: _half(inputs["a"], inputs["b"])
    return _port("port_patches_oracle", lambda p, out: out.copy_(_half(p["a"], p["b"])))


def build_patches_matmul(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Does half the work and, when built, makes ``Tensor.__matmul__`` (what the oracle multiplies
    with) zero the same half (stopped: torch in the judge's process is untouched)."""
    real = torch.Tensor.__matmul__

    def half_matmul(self, other):
        c = real(self, other)
        if c.dim() == 2:
            c[:, c.shape[1] // 2:] = 0
        return c

    torch.Tensor.__matmul__ = half_matmul
    return _port("port_patches_matmul", lambda p, out: out.copy_(_half(p["a"], p["b"])))


def build_zeroes_baseline_copy(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Computes the right answer and, from its 6th call on (the timed session), zeroes the baseline's
    copy of its inputs, found through ``gc.get_objects()``, so the baseline runs on zeros and is blamed
    for writing its inputs (stopped: a slot whose copy changed is run again alone; one that does not
    write its copy alone was written by another slot, and the session fails the port)."""
    import gc

    calls = [0]

    def body(p, out):
        calls[0] += 1
        if calls[0] > 5:
            for obj in gc.get_objects():
                copies = getattr(obj, "copies", None) if type(obj).__name__ == "InputSets" else None
                if isinstance(copies, dict) and "baseline" in copies:
                    for inputs in copies["baseline"]:
                        inputs["a"].zero_()
        out.copy_(_honest(p["a"], p["b"]))
        return out

    return _port("port_zeroes_baseline_copy", body)


def build_lazy_when_timed(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Honest in the judged gate (3 calls), then returns the lazy subclass in the timed session, where
    the checks run in its own process (stopped: sampled and post-timing checks take an exact
    torch.Tensor only)."""
    calls = [0]

    def body(p, out):
        calls[0] += 1
        if calls[0] <= 3:
            return out.copy_(_honest(p["a"], p["b"]))
        lazy = out.as_subclass(_Lazy)
        _Lazy.pending[id(lazy)] = (p["a"], p["b"], out)
        return lazy

    return _port("port_lazy_when_timed", body)


def _in_timing_loop() -> dict | None:
    """Inside a timed launch (the session's child serving the parent's ``launch`` request, not the checks
    around it): the round's index ``i`` and the rounds in all ``total``, read from the server's frame."""
    f = sys._getframe()
    while f is not None and not (f.f_code.co_name == "launch" and "msg" in f.f_locals and "self" in f.f_locals):
        f = f.f_back
    if f is None:
        return None
    tcfg = getattr(f.f_locals["self"], "tcfg", {}) or {}
    return {"i": int(f.f_locals["msg"].get("index", 0)),
            "total": int(tcfg.get("rounds", 0)) + int(tcfg.get("observe_rounds", 0))}


def _stale_when_timed(name: str, after=None, honest_when=None) -> KernelLaunch:
    """Right on its first 3 calls (the judged gate) and outside the timing loop; inside it, does the
    same work but returns its first answer again (cached, wrong for new content; as slow as an honest
    call, so profiling it shows nothing) unless ``honest_when(loop locals)``; ``after()`` runs after
    every call."""
    calls, first = [0], []

    def body(p, out):
        calls[0] += 1
        loop = _in_timing_loop()
        if calls[0] <= 3 or not first or loop is None or (honest_when and honest_when(loop)):
            out.copy_(_honest(p["a"], p["b"]))
            first[:] = [out.clone()]
        else:
            _honest(p["a"], p["b"])
            out.copy_(first[0])
        if after:
            after()
        return out

    return _port(name, body)


def build_zeroes_counters(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Stale in the timed rounds and, after each call, zeroes the session's sampled-failure counters
    found through ``gc.get_objects()`` (stopped: the counters are the referee's, in the parent)."""
    import gc

    def zero():
        for obj in gc.get_objects():
            if type(obj) is dict and set(obj) == {"checked", "failed", "failures"}:
                obj["failed"] = 0
                obj["failures"].clear()

    return _stale_when_timed("port_zeroes_counters", after=zero)


def build_session_patches_compare(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Honest in the judged gate; in the timed session (its 4th call on) patches the parity check of
    its own process to pass everything and returns stale answers (stopped: the session's outputs are
    compared by the referee, in the parent, from their bytes)."""
    from skillrun.execute import parity

    calls = [0]

    def patch():
        calls[0] += 1
        if calls[0] > 3:
            parity.compare = lambda out, ref, tol: {"passed": True, "cosine": 1.0}

    return _stale_when_timed("port_session_patches_compare", after=patch)


def build_patches_round_choice(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Makes its process's os.urandom-backed generator never choose a round early (so only the checks
    forced into the last timed rounds remain) and is honest only in the last 12 rounds, found from the
    timing loop's locals (stopped: the referee in the parent chooses the checked rounds)."""
    import random

    random.SystemRandom.random = lambda self: 0.999999
    return _stale_when_timed("port_patches_round_choice", honest_when=lambda loop: loop.get("i", 0) >= loop.get("total", 0) - 12)


def build_fixes_checked_outputs(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Stale in the timed rounds; when the referee says a round is checked, rewrites the outputs with
    the right answer before they are handed over (stopped: the session committed to each output's
    bytes before the referee chose the round, and the bytes handed over no longer match)."""
    from skillrun.execute import slot_server

    last: dict = {}
    between = slot_server.Server.op_between

    def sneaky(self, msg):
        if msg.get("token") is not None and last:  # the referee chose this round: hand over the right answer
            last["out"].copy_(_honest(last["a"], last["b"]))
        return between(self, msg)

    slot_server.Server.op_between = sneaky
    inner = _stale_when_timed("port_fixes_checked_outputs")

    def body(p, out):
        last.update(a=p["a"], b=p["b"], out=out)
        return inner.run(p, out)

    return _port("port_fixes_checked_outputs", body)
