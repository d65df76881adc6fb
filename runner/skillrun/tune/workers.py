"""Where tuning tasks run: inline (one device), one local worker per visible GPU, or a Ray cluster.

All three run the same function (:func:`skillrun.tune.lane.run_job`) and return one result per job,
in job order, whatever happened: a candidate whose worker died comes back as an error with
``fault: worker_died`` (and the worker is replaced); nothing is dropped.

* :class:`InlinePool`: the tuner's own process starts each task's child (the harness default).
* :class:`LocalPool`: one lane process per device, pinned with ``CUDA_VISIBLE_DEVICES`` (NVIDIA) or
  ``HIP_VISIBLE_DEVICES`` (ROCm) before anything in it touches the GPU; jobs are pulled from one
  queue, so a slow candidate does not hold the others back.
* :class:`RayPool`: Ray tasks with ``num_gpus=1`` (Ray pins the device), for several machines.
  Ray is an optional extra (``pip install 'skillrun[ray]'``); it is imported only here.
"""
from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Callable

from skillrun.errors import UnavailableError, UsageError
from skillrun.io import lifeline
from skillrun.execute.isolate import child_env, describe_exit, run_task
from skillrun.tune.lane import MARK, run_job

# Extra time a lane gets beyond the task's own timeout (the child is killed at the task timeout;
# this only catches a lane that stopped answering altogether).
LANE_GRACE_S = 120.0


def device_var(kind: str) -> str | None:
    return {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}.get(kind)


def visible_devices(kind: str) -> list[str | None]:
    """The device ids a sweep may use: the pin variable's list when set, else every device torch sees."""
    var = device_var(kind)
    if var is None:
        return [None]
    pinned = os.environ.get(var)
    if pinned:
        return [d.strip() for d in pinned.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] or [None]


def pin_env(kind: str, device: str | None) -> dict[str, str | None]:
    var = device_var(kind)
    if var is None or device is None:
        return {}
    env: dict[str, str | None] = {var: device}
    if kind == "rocm":
        env["CUDA_VISIBLE_DEVICES"] = None  # HIP honours both; one index space only
    return env


def _died(why: str, lane: int | None, device: str | None) -> dict[str, Any]:
    return {"status": "error", "fault": "worker_died", "lane": lane, "device": device,
            "error": f"the worker process running this candidate died ({why}); the worker was rebuilt and the sweep went on"}


class InlinePool:
    engine = "inline"

    def __init__(self, kind: str, device: str | None) -> None:
        self.kind, self.device, self.rebuilt = kind, device, 0

    def lanes(self) -> list[dict[str, Any]]:
        return [{"lane": 0, "device": self.device}]

    def map(self, jobs: list[dict[str, Any]], done: Callable[[int, dict], None] | None = None) -> list[dict[str, Any]]:
        out = []
        for i, job in enumerate(jobs):
            env = {**(job.get("env") or {}), **pin_env(self.kind, self.device)}
            res = run_task(job["task"], timeout_s=float(job["timeout_s"]), env=env, isolation=job.get("isolation") or "spawn")
            res.update(lane=0, device=self.device)
            out.append(res)
            if done:
                done(i, res)
        return out

    def solo(self, job: dict[str, Any]) -> dict[str, Any]:
        return _solo_here(self.kind, self.device, job)

    def close(self) -> None:
        pass


def _solo_here(kind: str, device: str | None, job: dict[str, Any]) -> dict[str, Any]:
    """One task alone on one device, started from this process (the pool's workers are idle)."""
    env = {**(job.get("env") or {}), **pin_env(kind, device)}
    res = run_task(job["task"], timeout_s=float(job["timeout_s"]), env=env, isolation=job.get("isolation") or "spawn")
    res.update(lane=None, device=device)
    return res


class _Lane:
    def __init__(self, index: int, kind: str, device: str | None) -> None:
        self.index, self.kind, self.device = index, kind, device
        self.proc: subprocess.Popen | None = None
        self.err_path: str | None = None

    def start(self) -> None:
        # Named for this process: the next session removes the file if this one is killed.
        lifeline.sweep_stale("lane")
        if self.err_path:  # a restarted lane: the dead one's log is not needed any more
            try:
                os.unlink(self.err_path)
            except OSError:
                pass
        fd, self.err_path = tempfile.mkstemp(prefix=f"skillrun-lane-{os.getpid()}-{self.index}-", suffix=".err")
        env = child_env(pin_env(self.kind, self.device))
        self.proc = subprocess.Popen([sys.executable, "-m", "skillrun.tune.lane"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=fd, env=env, text=True, start_new_session=True)
        os.close(fd)

    def run(self, job: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """(result, lane died)."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._dead("its input pipe was closed"), True
        deadline = float(job["timeout_s"]) + LANE_GRACE_S
        while True:
            ready, _, _ = select.select([self.proc.stdout], [], [], deadline)
            if not ready:
                return self._dead(f"no answer within {deadline:g} s"), True
            line = self.proc.stdout.readline()
            if not line:
                return self._dead(None), True
            if line.startswith(MARK):
                res = json.loads(line[len(MARK):])
                res.update(lane=self.index, device=self.device)
                return res, False

    def _dead(self, why: str | None) -> dict[str, Any]:
        code = None
        if self.proc is not None:
            if why is not None:  # stopped answering: end it
                self.kill()
            code = self.proc.wait()
        self.proc = None
        text = why or (describe_exit(code) if code is not None else "it exited")
        return _died(text.replace("child", "worker"), self.index, self.device)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        if self.proc is not None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
            self.proc = None
        if self.err_path:
            try:
                os.unlink(self.err_path)
            except OSError:
                pass


class LocalPool:
    engine = "local"

    def __init__(self, kind: str, devices: list[str | None]) -> None:
        if not devices:
            raise UsageError("a local pool needs at least one worker", field="workers")
        self.kind = kind
        self._lanes = [_Lane(i, kind, d) for i, d in enumerate(devices)]
        self.rebuilt = 0
        self._lock = threading.Lock()

    def lanes(self) -> list[dict[str, Any]]:
        return [{"lane": ln.index, "device": ln.device} for ln in self._lanes]

    def map(self, jobs: list[dict[str, Any]], done: Callable[[int, dict], None] | None = None) -> list[dict[str, Any]]:
        todo: queue.Queue = queue.Queue()
        for i, job in enumerate(jobs):
            todo.put((i, job))
        results: list[dict[str, Any] | None] = [None] * len(jobs)

        def work(lane: _Lane) -> None:
            while True:
                try:
                    i, job = todo.get_nowait()
                except queue.Empty:
                    return
                res, died = lane.run(job)
                with self._lock:
                    if died:
                        self.rebuilt += 1  # the next job on this lane starts a fresh worker
                    results[i] = res
                    if done:
                        done(i, res)

        threads = [threading.Thread(target=work, args=(ln,), daemon=True) for ln in self._lanes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [r if r is not None else _died("no result", None, None) for r in results]

    def solo(self, job: dict[str, Any]) -> dict[str, Any]:
        return _solo_here(self.kind, self._lanes[0].device, job)

    def close(self) -> None:
        for ln in self._lanes:
            ln.stop()


class RayPool:
    engine = "ray"

    def __init__(self, address: str | None, num_gpus: float = 1.0, resources: dict[str, float] | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise UnavailableError("--ray needs the optional Ray extra, which is not installed",
                                   hint="pip install 'skillrun[ray]' (or plain `pip install ray`)") from None
        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        self.address = address
        opts: dict[str, Any] = {"num_gpus": num_gpus, "max_retries": 0}
        if resources:
            opts["resources"] = dict(resources)
        # The same worker function as a local lane; Ray sets CUDA_VISIBLE_DEVICES for num_gpus tasks.
        self._fn = ray.remote(run_job).options(**opts)
        self.rebuilt = 0

    def lanes(self) -> list[dict[str, Any]]:
        nodes = [n for n in self._ray.nodes() if n.get("Alive")]
        return [{"lane": i, "device": f"ray node {n.get('NodeManagerAddress')} ({int(n.get('Resources', {}).get('GPU', 0))} GPU)"}
                for i, n in enumerate(nodes)]

    def map(self, jobs: list[dict[str, Any]], done: Callable[[int, dict], None] | None = None) -> list[dict[str, Any]]:
        ray = self._ray
        path = [p for p in sys.path if p and os.path.isdir(p)]
        refs = [self._fn.remote({**job, "sys_path": path}) for job in jobs]
        out = []
        for i, (ref, job) in enumerate(zip(refs, jobs)):
            try:
                res = ray.get(ref, timeout=float(job["timeout_s"]) + LANE_GRACE_S)
                res.setdefault("lane", None)
                res["device"] = f"ray worker pid {res.get('worker_pid')}, CUDA_VISIBLE_DEVICES={res.get('visible_devices')}"
            except ray.exceptions.GetTimeoutError:
                ray.cancel(ref, force=True)
                self.rebuilt += 1
                res = _died("no answer from the Ray task in time; cancelled", None, None)
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.RayTaskError, ray.exceptions.TaskCancelledError,
                    ray.exceptions.RayError) as exc:
                self.rebuilt += 1
                res = _died(f"Ray: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", None, None)
            out.append(res)
            if done:
                done(i, res)
        return out

    def solo(self, job: dict[str, Any]) -> dict[str, Any]:
        """The re-check: one Ray task (one GPU), submitted after every sweep task has finished."""
        return self.map([job])[0]

    def close(self) -> None:
        pass


def make_pool(kind: str, *, workers: int | None = None, ray_address: str | None = None,
              ray_resources: dict[str, float] | None = None, ray_num_gpus: float | None = None):
    """The pool for a sweep: Ray when an address is given, else one local worker per visible device."""
    if ray_address is not None:
        gpus = ray_num_gpus if ray_num_gpus is not None else (1.0 if kind != "cpu" else 0.0)
        return RayPool(None if ray_address in ("", "local") else ray_address, num_gpus=gpus, resources=ray_resources)
    devices = visible_devices(kind)
    if workers is not None:
        if workers < 1:
            raise UsageError("workers must be >= 1", field="workers")
        devices = devices[:workers] if kind != "cpu" else [None] * workers
    if len(devices) == 1:
        return InlinePool(kind, devices[0])
    return LocalPool(kind, devices)
