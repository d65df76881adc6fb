"""Kernels for the toy problem: a correct port, a correct baseline, and one of each seeded defect.

The "honest" torch port computes the product with broadcast multiply + sum (never aten::mm), so
the baseline's op (aten::mm on the host, a cuBLAS kernel on a GPU) can only appear in the port's
profiled window if the port secretly calls the baseline.
"""
from __future__ import annotations

import ctypes
import os
import time

import torch
from torch.profiler import record_function

from skillrun_kernels.protocol import KernelLaunch, UnsupportedShape

PORT_SCOPE = "defects::port"
PORT_HOST = r"^defects::port$"
BASELINE_HOST = r"^aten::mm$"
# cuBLAS GEMM kernel names on sm_80/sm_90 (nvjet_*, sm90_xmma_*, cutlass_*, ampere_*gemm*), and
# the split-K reduction cuBLAS may add.
BASELINE_DEVICE = r"(?i)(nvjet|xmma|cutlass|gemm|sm\d+_|splitKreduce)"

# Set by the baseline, read by the cheating port that returns the baseline's output.
LAST_BASELINE_OUT: list = []


def _honest(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float().unsqueeze(2) * b.float().unsqueeze(0)).sum(1)


def _port(name: str, body) -> KernelLaunch:
    def run(p: dict, out: torch.Tensor) -> torch.Tensor:
        with record_function(PORT_SCOPE):
            return body(p, out)

    return KernelLaunch(name=name, run=run, expect_kernels=PORT_HOST,
                        describe={"backend": "torch", "expect_host_ops": PORT_HOST})


def build_oracle(shape: dict, config: dict, device: str) -> KernelLaunch:
    def run(p, out):
        out.copy_(p["a"].float() @ p["b"].float())
        return out

    return KernelLaunch(name="oracle", run=run, describe={"backend": "torch"})


def build_baseline(shape: dict, config: dict, device: str) -> KernelLaunch:
    def run(p, out):
        torch.mm(p["a"], p["b"], out=out)
        LAST_BASELINE_OUT[:] = [out]
        return out

    dev = BASELINE_DEVICE if str(device).startswith("cuda") else BASELINE_HOST
    return KernelLaunch(name="torch_mm", run=run, expect_kernels=dev,
                        describe={"backend": "torch", "expect_host_ops": BASELINE_HOST})


def build_baseline_wrong(shape: dict, config: dict, device: str) -> KernelLaunch:
    """A vendor path that silently returns garbage for this shape (like cuBLAS block-wise at K=768)."""
    base = build_baseline(shape, config, device)

    def run(p, out):
        base.run(p, out)
        out.mul_(-1.0)
        return out

    return KernelLaunch(name="torch_mm_wrong", run=run, expect_kernels=base.expect_kernels, describe=base.describe)


def build_baseline_off_when_timed(shape: dict, config: dict, device: str) -> KernelLaunch:
    """A vendor path right on its isolated calls but one element off on every timed call (numerics
    that cross the tolerance on some content, like an fp8 accumulator over a long K)."""
    import sys

    base = build_baseline(shape, config, device)

    def run(p, out):
        base.run(p, out)
        f = sys._getframe()
        while f is not None and f.f_code.co_name != "launch":  # a timed launch (the session's child)
            f = f.f_back
        if f is not None:
            out.view(-1)[0] += 100.0
        return out

    return KernelLaunch(name="torch_mm", run=run, expect_kernels=base.expect_kernels, describe=base.describe)


def build_baseline_unsupported(shape: dict, config: dict, device: str) -> KernelLaunch:
    raise UnsupportedShape(f"this baseline refuses M={shape['M']} (like cuBLAS block-wise at M=1)")


def build_alt_padded(shape: dict, config: dict, device: str) -> KernelLaunch:
    """The oracle-correct alternative: pads M to a multiple of 64, multiplies, slices back."""
    m = int(shape["M"])
    mp = -(-m // 64) * 64

    def prepare(inputs):
        a = torch.zeros(mp, inputs["a"].shape[1], dtype=inputs["a"].dtype, device=inputs["a"].device)
        a[:m] = inputs["a"]
        return {"a": a, "b": inputs["b"]}

    def run(p, out):
        out.copy_(torch.mm(p["a"], p["b"])[:m])
        return out

    dev = BASELINE_DEVICE if str(device).startswith("cuda") else BASELINE_HOST
    return KernelLaunch(name="torch_mm_padded", run=run, prepare=prepare, expect_kernels=dev,
                        describe={"backend": "torch", "expect_host_ops": BASELINE_HOST})


def build_port_ok(shape: dict, config: dict, device: str) -> KernelLaunch:
    def body(p, out):
        out.copy_(_honest(p["a"], p["b"]))
        return out

    return _port("port_ok", body)


def build_port_wrong(shape: dict, config: dict, device: str) -> KernelLaunch:
    def body(p, out):
        out.copy_(_honest(p["a"], p["b"]) * 1.05)  # 5% off: inside cosine, outside rtol
        return out

    return _port("port_wrong", body)


def build_port_partial(shape: dict, config: dict, device: str) -> KernelLaunch:
    def body(p, out):
        rows = out.shape[0] - 1  # forgets the last row (an off-by-one tail tile)
        out[:rows].copy_(_honest(p["a"][:rows], p["b"]))
        return out

    return _port("port_partial", body)


def build_port_calls_baseline(shape: dict, config: dict, device: str) -> KernelLaunch:
    def body(p, out):
        torch.mm(p["a"], p["b"], out=out)  # the "port" is the vendor kernel in disguise
        return out

    return _port("port_calls_baseline", body)


def build_port_returns_baseline_out(shape: dict, config: dict, device: str) -> KernelLaunch:
    def body(p, out):
        if LAST_BASELINE_OUT:
            return LAST_BASELINE_OUT[0]  # the baseline's result, when one ran in this process
        out.copy_(_honest(p["a"], p["b"]))
        return out

    return _port("port_returns_baseline_out", body)


def build_port_returns_input(shape: dict, config: dict, device: str) -> KernelLaunch:
    m, n, k = int(shape["M"]), int(shape["N"]), int(shape["K"])
    if k < n:
        raise ValueError("build_port_returns_input needs K >= N (it hides its result inside operand a)")

    def body(p, out):
        res = _honest(p["a"], p["b"])
        stash = p["a"].view(-1)[: m * n].view(m, n)  # overwrites an input operand with the result...
        stash.copy_(res)
        return stash  # ...and returns that view instead of writing `out`

    return _port("port_returns_input", body)


def build_port_abort(shape: dict, config: dict, device: str) -> KernelLaunch:
    def body(p, out):
        os.abort()

    return _port("port_abort", body)


def build_port_segfault(shape: dict, config: dict, device: str) -> KernelLaunch:
    def body(p, out):
        ctypes.string_at(0)  # reads address 0: SIGSEGV

    return _port("port_segfault", body)


def build_port_segfault_at_m40(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Honest, except at M = 40, where its first launch takes its process down (one bad shape of many)."""
    def body(p, out):
        if p["a"].shape[0] == 40:
            ctypes.string_at(0)
        out.copy_(_honest(p["a"], p["b"]))
        return out

    return _port("port_segfault_at_m40", body)


def build_port_hang(shape: dict, config: dict, device: str) -> KernelLaunch:
    def body(p, out):
        time.sleep(3600)

    return _port("port_hang", body)


def _relaunch_deadlock(name: str, body) -> KernelLaunch:
    """A stand-in for a warp-specialized kernel with a synchronisation bug that shows only when it
    runs again on the same prepared operands (what a timed session does): its first launch sets a
    flag in the workspace that ``prepare`` made, like a semaphore that is never reset, and every
    later launch on that workspace waits for the flag to clear, for ever. The harness's
    candidate gate calls ``prepare`` once per seed, so it passes that gate and deadlocks later."""
    def prepare(inputs):
        return {**inputs, "workspace": torch.zeros(1, dtype=torch.int32)}

    def run(p, out):
        ws = p["workspace"]
        while int(ws[0]) != 0:  # the consumer's wait: nobody ever releases it
            time.sleep(0.01)
        ws[0] = 1
        return body(p, out)

    launch = _port(name, lambda p, out: run(p, out))
    launch.prepare = prepare
    return launch


def build_alt_relaunch_deadlock(shape: dict, config: dict, device: str) -> KernelLaunch:
    """An oracle-correct alternative that deadlocks on its second launch (see _relaunch_deadlock)."""
    return _relaunch_deadlock("alt_relaunch_deadlock", lambda p, out: out.copy_(p["a"].float() @ p["b"].float()))


def build_port_relaunch_deadlock(shape: dict, config: dict, device: str) -> KernelLaunch:
    def body(p, out):
        out.copy_(_honest(p["a"], p["b"]))
        return out

    return _relaunch_deadlock("port_relaunch_deadlock", body)
