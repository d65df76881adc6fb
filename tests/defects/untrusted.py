"""Ports that game the measurement instead of the math (issue 16, "a port is untrusted code").

Each one passes isolated parity (it computes the right answer whenever it is plainly checked) and,
before the harness grew its defences, scored in the timed session. Each comment says which defence
catches it now. Call counts are per process: the harness runs each task in its own child.
"""
from __future__ import annotations

import hashlib

import torch
from torch.autograd import profiler as autograd_profiler

from defects.kernels import PORT_SCOPE, _honest, _port  # noqa: F401  (PORT_SCOPE: the scope every port opens)
from skillrun_kernels.protocol import KernelLaunch


def _calls():
    n = [0]

    def tick() -> int:
        n[0] += 1
        return n[0]

    return tick


# -- 1. answers reused across timed repetitions ------------------------------------------------


def build_memo_ptr(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Remembers its answer per operand address: a timed repeat is a copy (caught: new content per
    visit makes the cached answer stale, and sampled timed outputs are checked)."""
    cache: dict = {}

    def body(p, out):
        key = (p["a"].data_ptr(), p["b"].data_ptr())
        if key not in cache:
            # Holding the operands keeps their addresses from being reused by later, different inputs
            # (what makes it pass isolated parity, where each seed gets freshly allocated tensors).
            cache[key] = (_honest(p["a"], p["b"]).to(out.dtype), p["a"], p["b"])
        out.copy_(cache[key][0])
        return out

    return _port("port_memo_ptr", body)


def build_memo_slice(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Remembers its answer per hash of the first 8 elements of each operand (caught: partial
    refreshes change rows the hash does not read)."""
    cache: dict = {}

    def body(p, out):
        h = hashlib.sha1()
        for name in ("a", "b"):
            h.update(p[name].reshape(-1)[:8].cpu().numpy().tobytes())
        key = h.hexdigest()
        if key not in cache:
            cache[key] = _honest(p["a"], p["b"]).to(out.dtype)
        out.copy_(cache[key])
        return out

    return _port("port_memo_slice", body)


def build_stale_after_n(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Right on its first 4 calls, then returns the output of its previous call (caught: that
    answer belongs to other inputs, and the sampled timed outputs show it)."""
    tick, prev = _calls(), []

    def body(p, out):
        if tick() > 4 and prev:
            return prev[0]
        out.copy_(_honest(p["a"], p["b"]))
        prev[:] = [out.clone()]
        return out

    return _port("port_stale_after_n", body)


# -- 2. different code when observed -----------------------------------------------------------


def _observed(out: torch.Tensor) -> bool:
    # The profiler is on, or the output was NaN-poisoned (how the harness's plain checks start).
    return bool(autograd_profiler._is_profiler_enabled or torch._C._autograd._profiler_enabled()
                or torch.isnan(out).all())


def build_profiler_aware(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Honest when it sees the profiler or a poisoned output, a cheap wrong answer otherwise (caught:
    the timed calls whose outputs are checked are chosen after they return, with nothing to see)."""

    def body(p, out):
        if _observed(out):
            out.copy_(_honest(p["a"], p["b"]))
        else:
            out.zero_()
        return out

    return _port("port_profiler_aware", body)


def build_fast_when_unwatched(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Its own (slow) code whenever the profiler is on, the vendor op otherwise: right answers every
    time, its own names in every profiled window, and timed rounds that measure someone else's kernel
    (caught: against the reference, it slows down far more when observed than when not, each compared
    with its own plain launches at the same positions in the round)."""
    import time as _time

    def body(p, out):
        if _observed(out):
            _time.sleep(0.1)  # stands for a slow kernel of its own (well above a loaded CI host's jitter)
            out.copy_(_honest(p["a"], p["b"]))
        else:
            torch.mm(p["a"], p["b"], out=out)
        return out

    return _port("port_fast_when_unwatched", body)


def build_frame_reader(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Reads the timing loop's frames (``sys._getframe``) to learn which rounds the harness will profile,
    runs its own (slow) code there and the vendor op everywhere else: right answers every time, its own
    names in every profiled window (caught: the engine draws a round's observation only when that round
    starts, with an unpredictable generator, so there is nothing to read in advance, and the port
    knowing at call time is the profiler-aware case, which the observer-effect check catches)."""
    import sys as _sys
    import time as _time

    def watched() -> bool:
        f = _sys._getframe(1)
        while f is not None:
            loc = f.f_locals
            if "observed_at" in loc and "i" in loc:  # a schedule decided before the rounds ran
                return loc["i"] in loc["observed_at"]
            if "obs" in loc and isinstance(loc["obs"], bool):  # the current round's own draw
                return loc["obs"]
            f = f.f_back
        return True  # outside the timing loop (the parity gate, the post-timing check): honest

    def body(p, out):
        if watched():
            _time.sleep(0.1)  # stands for a slow kernel of its own
            out.copy_(_honest(p["a"], p["b"]))
        else:
            torch.mm(p["a"], p["b"], out=out)
        return out

    return _port("port_frame_reader", body)


def build_first_k(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Its own code on its first 6 calls (isolated parity, aliasing, the profiled launches before
    timing), then the baseline's aten::mm: right answers, someone else's kernel (caught: rounds
    profiled at random positions inside the timed sequence see aten::mm in the port's slot)."""
    tick = _calls()

    def body(p, out):
        if tick() <= 6:
            out.copy_(_honest(p["a"], p["b"]))
        else:
            torch.mm(p["a"], p["b"], out=out)
        return out

    return _port("port_first_k", body)


# -- 3. inputs mutated -------------------------------------------------------------------------


def build_zero_a_once(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Right answer, then zeroes operand a (once): every later reader of a, the oracle included,
    would see zeros (caught: the checksum after its first isolated call)."""
    tick = _calls()

    def body(p, out):
        out.copy_(_honest(p["a"], p["b"]))
        if tick() == 1:
            p["a"].zero_()
        return out

    return _port("port_zero_a_once", body)


def build_zero_a_late(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Zeroes a on its 6th call, in the timed session, after isolated parity (caught: the checksum
    of its own copy after that timed round; the other slots never read that copy)."""
    tick = _calls()

    def body(p, out):
        out.copy_(_honest(p["a"], p["b"]))
        if tick() == 6:
            p["a"].zero_()
        return out

    return _port("port_zero_a_late", body)


def build_b_scratch(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Uses b as scratch every call (scaled in place, then scaled back): fp16 rounding leaves b
    changed (caught: the checksum after every call)."""

    def body(p, out):
        b = p["b"]
        b.mul_(3.0)
        out.copy_(_honest(p["a"], b.float() / 3.0))
        b.div_(3.0)
        return out

    return _port("port_b_scratch", body)


def build_b_scratch_exact(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Uses b as scratch and restores it bit for bit before returning. NOT detectable from outside
    the call, and harmless to the others: the checksum between calls matches, every slot has its
    own copy, and the restoring is timed as the port's own work (the documented limit)."""

    def body(p, out):
        b = p["b"]
        saved = b.clone()
        b.fill_(0.0)
        out.copy_(_honest(p["a"], saved))
        b.copy_(saved)
        return out

    return _port("port_b_scratch_exact", body)


# -- 4. work moved out of the timed launch -----------------------------------------------------


def build_product_in_prepare(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Computes the whole product in ``prepare`` (untimed, and re-run for every new input content)
    and only copies it in ``run`` (caught: ``prepare`` sees the weight ``b`` but a decoy's ``a``,
    whose real content arrives after it returned, so the stored product is the decoy's)."""
    def prepare(inputs):
        return {**inputs, "answer": _honest(inputs["a"], inputs["b"])}

    def body(p, out):
        out.copy_(p["answer"])
        return out

    launch = _port("port_product_in_prepare", body)
    launch.prepare = prepare
    return launch


def build_weights_in_prepare(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Honest: re-lays the weight out once in ``prepare`` (b transposed and made contiguous, as a
    production port packs its weights) and keeps a reference to the activation ``a``, which it
    reads when it runs. Passes: only the activation's content is hidden from ``prepare``."""
    def prepare(inputs):
        return {"a": inputs["a"], "bt": inputs["b"].t().contiguous()}

    def body(p, out):
        out.copy_(_honest(p["a"], p["bt"].t()))
        return out

    launch = _port("port_weights_in_prepare", body)
    launch.prepare = prepare
    return launch
