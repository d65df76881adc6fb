"""A tunable toy port for the tuner tests, with one seeded tuner defect per config, and a fake timer.

``tile`` picks the behaviour (the incumbent recipe uses 16):

====  =====================================================================
tile  what the candidate does
====  =====================================================================
16    correct, cost 1.0 (the incumbent)
32    correct, cost 0.99: wins only by noise (the fake A/A floor is 6%)
64    correct, cost 0.70: the real winner
8     cost 0.2 but 5% off: fast and wrong (must fail parity, never win)
48    raises at build time (must be kept as "raised", never a loss)
96    segfaults at build time (a GPU fault's stand-in) -> "crashed"
128   kills the worker running it (SKILLRUN_LANE_PID) -> "worker_died"
40    correct, but deadlocks when relaunched on the same prepared operands: passes the gate, is
      caught by the launch watchdog before the session -> "timeout" (the other slots are timed)
====  =====================================================================

The fake timer reports the cost the last launch declared: timing decisions become deterministic,
and no test depends on how fast this machine is.
"""
from __future__ import annotations

import os
import signal

from defects.kernels import _honest, _port

CONFIG_SCHEMA = {"type": "object", "additionalProperties": False,
                 "properties": {"tile": {"type": "integer", "enum": [8, 16, 32, 40, 48, 64, 96, 128]}}}
COST = {"16": 1.0, "32": 0.99, "64": 0.7, "8": 0.2}
LAST = {"ms": 1.0}


def build(shape: dict, config: dict, device: str):
    tile = int((config or {}).get("tile", 16))
    if tile == 48:
        raise ValueError("tile=48 does not divide the warp layout (seeded: a candidate that raises)")
    if tile == 96:
        import ctypes

        ctypes.string_at(0)  # seeded: the candidate's process dies (SIGSEGV)
    if tile == 128:
        pid = os.environ.get("SKILLRUN_LANE_PID")
        if not pid:
            raise RuntimeError("tile=128 kills its worker, and there is none here")
        os.kill(int(pid), signal.SIGKILL)  # seeded: the worker process dies under this candidate
        os._exit(3)
    if tile == 40:
        from defects.kernels import build_port_relaunch_deadlock

        return build_port_relaunch_deadlock(shape, config, device)
    cost = COST.get(str(tile), 1.2)
    wrong = tile == 8

    def body(p, out):
        res = _honest(p["a"], p["b"])
        out.copy_(res * 1.05 if wrong else res)
        LAST["ms"] = cost
        return out

    return _port(f"tunable_t{tile}", body)


class FakeTimer:
    """Each launch "takes" its kernel's declared cost; the A/A copy always reads 6% slow.

    The harness launches the A/A copy through callables marked ``aa_copy``, so the copy is known
    whatever position the timing engine gives it in a round (positions are balanced at random).
    """

    method = "fake timer (tests): each launch reports its kernel's declared cost"

    def measure(self, fn):
        import time

        t0 = time.perf_counter()
        LAST["ms"] = 1.0  # a kernel that declares no cost (the baseline) "takes" 1.0
        fn()
        ms = LAST["ms"] * (1.06 if getattr(fn, "aa_copy", False) else 1.0)
        # ... and that long really passes: the parent's clock around the launch bounds what a timer claims
        while (time.perf_counter() - t0) * 1e3 < ms:
            time.sleep(max(0.0, ms / 1e3 - (time.perf_counter() - t0)))
        return lambda: ms

    def sync(self) -> None:
        pass


def fake(device: str) -> FakeTimer:
    return FakeTimer()


def build_other(shape: dict, config: dict, device: str):
    """Another kernel for the same problem (a recipe's ``tunable_kernels`` entry in the tests):
    correct, cost 0.6 at tile 32 (beats every config of ``build``), 1.1 otherwise."""
    tile = int((config or {}).get("tile", 16))
    cost = 0.6 if tile == 32 else 1.1

    def body(p, out):
        out.copy_(_honest(p["a"], p["b"]))
        LAST["ms"] = cost
        return out

    return _port(f"tunable_other_t{tile}", body)
