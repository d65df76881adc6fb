"""Markers a workload calls so `skill-run profile` keeps only the steps or regions that matter.

    from skillrun import profiling

    for batch in batches:
        model(batch)
        profiling.step()            # `skill-run profile --steps 5:8` keeps iterations 5, 6, 7

    with profiling.region("decode"):    # `skill-run profile --region` keeps only these regions
        model.generate(...)

    profiling.save_output("logits", logits)   # `skill-run e2e` compares it between as-is and routed runs

Under `skill-run e2e` step() also times each step. Outside those commands every call here does
nothing (one dict lookup), so the markers can stay in production code. This module imports nothing beyond the standard library: the child
interpreter may lack skillrun's dependencies, and the profiling hook loads a copy of this file
when skillrun itself is not installed there.

The rest of profiling sits beside it: run.py runs a workload under a profiler (`skill-run profile`),
hook/ is the start-up hook injected into the workload, routing.py is `skill-run e2e`'s workload side.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

# The profiling hook (runner/skillrun/profiling/hook/sitecustomize.py) registers its controller under this
# name in sys.modules; a key there is visible to every import path without importing anything.
CONTROLLER_KEY = "_skillrun_profile_controller"


# `skill-run e2e` registers its routing controller under this name (runner/skillrun/profiling/routing.py).
E2E_KEY = "_skillrun_e2e_controller"


def _controller():
    return sys.modules.get(CONTROLLER_KEY)


def active() -> bool:
    """True when this process runs under `skill-run profile` with its profiler set up."""
    return _controller() is not None


def step() -> None:
    """End the current profiler step and start the next (a no-op outside `skill-run profile`).

    Step k is the work between the k-th and (k+1)-th call (counting from 0), so calling this at
    the end of each loop iteration makes step k = iteration k.
    """
    e2e = sys.modules.get(E2E_KEY)
    if e2e is not None:
        e2e.step()
    ctl = _controller()
    if ctl is not None:
        ctl.step()


def save_output(name: str, tensor) -> None:
    """Hand a result tensor to `skill-run e2e`, which compares it between the as-is and the routed
    runs within the card's tolerance (a no-op otherwise). Call it once per result you care about
    (e.g. the final logits); repeated names are kept as name#1, name#2, ...
    """
    e2e = sys.modules.get(E2E_KEY)
    if e2e is not None:
        e2e.save_output(name, tensor)


@contextmanager
def region(name: str = "region") -> Iterator[None]:
    """Profile only inside this block when the run was started with `--region`.

    Without `--region` the block is still named in the trace (a `user_annotation` event), which
    makes it easy to find; outside `skill-run profile` it does nothing. Usable as a decorator too.
    """
    ctl = _controller()
    if ctl is None:
        yield
        return
    token = ctl.region_enter(name)
    try:
        yield
    finally:
        ctl.region_exit(token)
