"""Ports that bend the timed session from inside their own process (issue 36): the clock, the
references beside them, torch modes in the harness's own calls, and the profiled rounds.

Each scored while the references, the clock and the commitment shared the port's process; each
comment says what stops it now (skillrun.execute.session: the parent holds the clock, the references
run in a process that never imports a port and the accused are frozen while they do; guard.py: no mode
runs in the harness's torch calls, and modes, threads and replaced functions are found between rounds;
the referee checks every profiled round against a SHA-256 commitment and the output contract).
"""
from __future__ import annotations

import sys
import threading
import time

import torch
from torch.autograd import profiler as autograd_profiler
from torch.overrides import TorchFunctionMode

from defects.kernels import LAST_BASELINE_OUT, PORT_HOST, PORT_SCOPE, _honest, _port
from skillrun_kernels.protocol import KernelLaunch
from torch.profiler import record_function

SLOW_S = 0.006  # the honest work is made to last this long: well above a loaded host's jitter


def _slow_honest(p, out):
    out.copy_(_honest(p["a"], p["b"]))
    time.sleep(SLOW_S)
    return out


# -- 1. the clock and the references share the port's process -----------------------------------


def build_fast_clock(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Replaces ``time.perf_counter`` with a clock that loses 7/8 of the time spent inside the port's
    own calls, so its slots read 8x faster and nobody else's do (stopped: its time is claimed by its own
    process and bounded by the parent's clock around the launch; the replaced function is found too)."""
    real = time.perf_counter
    lost = [0.0]

    def fake() -> float:
        return real() - lost[0]

    time.perf_counter = fake

    def body(p, out):
        t0 = real()
        _slow_honest(p, out)
        lost[0] += (real() - t0) * 7 / 8
        return out

    return _port("port_fast_clock", body)


def build_wraps_mm(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Wraps ``torch.mm`` (the baseline's op, never its own) so that it sleeps first: only the baseline
    slows down (stopped: the references run in another process, where torch.mm is torch's)."""
    real = torch.mm

    def slow_mm(*a, **k):
        time.sleep(0.02)
        return real(*a, **k)

    torch.mm = slow_mm
    return _port("port_wraps_mm", lambda p, out: out.copy_(_honest(p["a"], p["b"])))


def build_gil_thread(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Starts a thread that keeps the GIL (a pure-Python loop, a long switch interval) except while the
    port's own launch runs: a reference that releases the GIL inside its BLAS call cannot get it back
    (stopped: the references run in another process, the accused's is frozen while they run, and the new
    thread is found between rounds)."""
    mine = threading.Event()
    sys.setswitchinterval(0.05)

    def hog():
        while True:
            if mine.is_set():
                time.sleep(0.0005)
                continue
            x = 0
            for i in range(200_000):
                x += i

    threading.Thread(target=hog, name="port-hog", daemon=True).start()

    def body(p, out):
        mine.set()
        try:
            return out.copy_(_honest(p["a"], p["b"]))
        finally:
            mine.clear()

    return _port("port_gil_thread", body)


def build_noisy_neighbour(shape: dict, config: dict, device: str) -> KernelLaunch:
    """An honest port plus a thread that burns CPU except while the port runs (stopped as the GIL
    thread is: the accused's process is frozen while a reference runs, and the thread is found)."""
    mine = threading.Event()

    def burn():
        while True:
            if mine.is_set():
                time.sleep(0.0002)
            else:
                torch.mm(torch.ones(96, 96), torch.ones(96, 96))  # native work: releases the GIL, takes a core

    threading.Thread(target=burn, name="port-burner", daemon=True).start()

    def body(p, out):
        mine.set()
        try:
            return out.copy_(_honest(p["a"], p["b"]))
        finally:
            mine.clear()

    return _port("port_noisy_neighbour", body)


def _baseline_ran_first() -> bool | None:
    """Whether the baseline ran before the port in this timing round (from the timing loop's frame, when
    it is in this process), None outside such a loop."""
    f = sys._getframe()
    while f is not None:
        order = f.f_locals.get("order")
        if isinstance(order, list) and "port" in order and "baseline" in order:
            return order.index("baseline") < order.index("port")
        f = f.f_back
    return None


def build_returns_baseline_out_late(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Its own answer on its first 8 calls (parity gate, the aliasing call, the profiled ones); in the
    timed rounds, the baseline's output buffer whenever the baseline ran first on the same content (the
    right answer, for free), its own answer otherwise; zeros when it finds no baseline at all (stopped:
    the baseline's buffers live in another process, and aliasing is checked every round)."""
    n = [0]

    def body(p, out):
        n[0] += 1
        first = _baseline_ran_first()
        if n[0] <= 8 or (first is not True and LAST_BASELINE_OUT):
            return out.copy_(_honest(p["a"], p["b"]))
        if first and LAST_BASELINE_OUT:
            return LAST_BASELINE_OUT[0]
        return out.zero_()

    return _port("port_returns_baseline_out_late", body)


def build_zeroes_baseline_out(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Honest, and zeroes the baseline's last output after each of its own calls, so the baseline fails
    its sampled checks and the headline moves to a slower alternative (stopped: another process)."""
    def body(p, out):
        out.copy_(_honest(p["a"], p["b"]))
        if LAST_BASELINE_OUT:
            LAST_BASELINE_OUT[0].zero_()
        return out

    return _port("port_zeroes_baseline_out", body)


def build_claims_mm(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Honest, but declares the baseline's op ``aten::mm`` in its own host-op regex, so the fast baseline
    fails its slot gate for showing "the port's" op (stopped: a reference is held to its own regex)."""
    rx = r"^(defects::port|aten::mm)$"

    def run(p, out):
        with record_function(PORT_SCOPE):
            return out.copy_(_honest(p["a"], p["b"]))

    return KernelLaunch(name="port_claims_mm", run=run, expect_kernels=rx, describe={"backend": "torch", "expect_host_ops": rx})


def build_vendor_alias(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Runs the vendor GEMM as ``aten::addmm``, which no baseline regex names (stopped: the problem
    declares its vendor ops, and an accused slot that shows one fails)."""
    def body(p, out):
        torch.addmm(torch.zeros(1, dtype=out.dtype), p["a"], p["b"], out=out)
        return out

    return _port("port_vendor_alias", body)


def _profiled() -> bool:
    return bool(autograd_profiler._is_profiler_enabled or torch._C._autograd._profiler_enabled())


def build_idle_when_profiled(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Does nothing when profiled (its window shows only its own scope, and it is fast there, which the
    one-sided observer check never minded) and the vendor GEMM otherwise (stopped: profiled rounds are
    judged like the others, and a port faster when watched than on any plain launch fails)."""
    def body(p, out):
        if _profiled():
            return out
        torch.addmm(torch.zeros(1, dtype=out.dtype), p["a"], p["b"], out=out)
        return out

    return _port("port_idle_when_profiled", body)


# -- 2. a torch mode in the harness's own calls -------------------------------------------------


class _After(TorchFunctionMode):
    """Computes what the port left pending as soon as the harness calls any torch function."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # (not on the port's own profiler scope closing: that is still inside the timed call)
        if self.pending and "record_function" not in str(getattr(func, "__name__", func)):
            while self.pending:
                a, b, out = self.pending.pop()
                out.copy_(_honest(a, b))
        return func(*args, **(kwargs or {}))


def build_mode_after_round(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Pushes a TorchFunctionMode when built; each timed call returns at once, and the answer is written
    by the mode when the harness next touches torch (its commitment's read of the output), outside the
    timed interval (stopped: the harness's torch calls run with torch functions off, the mode is found
    on the stack, and the garbage committed fails the referee)."""
    mode = _After()
    mode.__enter__()

    def body(p, out):
        mode.pending.append((p["a"], p["b"], out))
        return out

    return _port("port_mode_after_round", body)


def build_float64(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Returns the right values as float64 (the problem's output is float16): half the precision loss,
    twice the bytes, and an output no caller could use (stopped: the output contract, every round)."""
    def body(p, out):
        return _honest(p["a"], p["b"]).double()

    return _port("port_float64", body)


class _Prepare(TorchFunctionMode):
    """Watches the harness copy the real activations in after prepare(), and multiplies then."""

    def __init__(self) -> None:
        super().__init__()
        self.watch: dict = {}
        self.answer: dict = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        r = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "copy_" and args and id(args[0]) in self.watch:
            inputs = self.watch[id(args[0])]
            self.answer[id(args[0])] = _honest(inputs["a"], inputs["b"])
        return r


def build_mode_prepare(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Pushes a TorchFunctionMode when built that computes the product the moment the real activations
    are copied into the buffers prepare() saw (untimed), and only copies it when run; zeros when it has
    none (stopped: the copy runs with torch functions off, so the mode never sees the real activations
    arrive; the mode is found on the stack)."""
    mode = _Prepare()
    mode.__enter__()

    def prepare(inputs):
        mode.watch[id(inputs["a"])] = inputs
        return {"a": inputs["a"], "b": inputs["b"]}

    def body(p, out):
        ans = mode.answer.get(id(p["a"]))
        return out.copy_(ans) if ans is not None else out.zero_()  # nothing of its own: the mode is the whole trick

    launch = _port("port_mode_prepare", body)
    launch.prepare = prepare
    return launch


def zero_like(t):  # (the defect modules share no state: kept local)
    return torch.zeros_like(t)


__all__ = [n for n in dir() if n.startswith("build_")] + ["PORT_HOST"]
