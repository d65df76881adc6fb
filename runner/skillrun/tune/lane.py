"""One tuning worker ("lane"): a long-lived process pinned to one device that runs harness tasks.

The same function, :func:`run_job`, runs inside a local lane process (``python -m
skillrun.tune.lane``, one per visible GPU, started by :class:`skillrun.tune.workers.LocalPool`) and
inside a Ray worker (:class:`skillrun.tune.workers.RayPool`, ``num_gpus=1``). Each task still runs
in its own child (``skillrun.execute.isolate.run_task``), so a fault in a candidate costs that
candidate; if the lane itself dies, the pool records the candidate it was running as
``worker_died`` and starts a new lane.

The lane exports ``SKILLRUN_LANE_PID`` (its own pid) to its children, so a result can say which
worker ran it (and the tests' seeded "worker dies" kernel knows whom to kill).

Protocol on stdin/stdout: one JSON job per line in; one line ``SKILLRUN-LANE <json result>`` out.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

MARK = "SKILLRUN-LANE "


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run one harness task here (a child process of this worker); always returns a result dict."""
    from skillrun.execute.isolate import run_task

    os.environ["SKILLRUN_LANE_PID"] = str(os.getpid())
    # A Ray worker does not inherit the driver's import path: take the entries that exist here too.
    for p in reversed(job.get("sys_path") or []):
        if p not in sys.path and os.path.isdir(p):
            sys.path.insert(0, p)
    try:
        res = run_task(job["task"], timeout_s=float(job["timeout_s"]), env=job.get("env"),
                       isolation=job.get("isolation") or "spawn")
    except Exception as exc:  # the lane itself must not die of a harness error
        res = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-3000:]}
    res["worker_pid"] = os.getpid()
    res["visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("HIP_VISIBLE_DEVICES")
    return res


def main() -> int:
    from skillrun.io import lifeline

    lifeline.die_with_parent()  # a lane must not outlive the tuning session that started it
    out = sys.stdout
    sys.stdout = sys.stderr  # anything a library prints must not corrupt the protocol stream
    for line in sys.stdin:
        if not line.strip():
            continue
        res = run_job(json.loads(line))
        out.write(MARK + json.dumps(res, allow_nan=True, default=str) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
