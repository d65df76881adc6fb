"""Ports that try to carry something from one shape of their card to the next, where a card's shapes share
long-lived processes (runner/skillrun/execute/sessions.py). Each computes the honest product."""
from __future__ import annotations

import threading
import time

from defects.kernels import _honest, _port
from skillrun_kernels.protocol import KernelLaunch


def _honest_port(name: str) -> KernelLaunch:
    def body(p, out):
        out.copy_(_honest(p["a"], p["b"]))
        return out

    return _port(name, body)


def build_patches_at_m16(shape: dict, config: dict, device: str) -> KernelLaunch:
    """At M = 16 only, replaces ``time.perf_counter`` (a harness function) with a wrapper when first built in its
    process, i.e. in its parity-gate task, before its session's build (stopped: the server's guard took what the
    harness's functions were when the process started, so the session finds the replacement; the process is then
    retired, and the card's next shape, which patches nothing, runs in a fresh one)."""
    if shape["M"] == 16 and not getattr(time.perf_counter, "_served", False):
        real = time.perf_counter

        def wrapped() -> float:
            return real()

        wrapped._served = True  # type: ignore[attr-defined]
        time.perf_counter = wrapped
    return _honest_port("port_patches_at_m16")


def build_leaves_thread_at_m16(shape: dict, config: dict, device: str) -> KernelLaunch:
    """At M = 16 only, leaves a thread behind when built (stopped: a task that leaves a thread or a process in its
    server ends that server, so the next task, the session's, runs in a fresh process, whose guard finds the
    thread the port starts again there)."""
    if shape["M"] == 16:
        threading.Thread(target=time.sleep, args=(600,), name="port-leftover", daemon=True).start()
    return _honest_port("port_leaves_thread_at_m16")
