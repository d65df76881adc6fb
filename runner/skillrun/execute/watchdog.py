"""Launch watchdog: every candidate's first launches run in a disposable child under a deadline.

A warp-specialized kernel with a synchronisation bug (a consumer waiting on an mbarrier phase that
never completes) does not crash: it spins until the process is killed. The harness's children
already have an overall deadline, but a timed session holds every slot in one process, so one
deadlocking slot used to take the whole session (and every other slot's timing) down with it.

Before a session is run, :func:`admit` probes its slots: one child process builds each slot in
turn (compile included), runs ``PROBE_LAUNCHES`` launches on the same prepared operands and
synchronizes, writing a progress line before and after each slot. The parent watches those lines:
a slot whose probe has not finished ``deadline_s`` after it started is recorded ``timeout`` (its
kernel and config named), the child's process group is killed, and a fresh child probes the slots
that are left. A child that dies during a slot (segfault, abort) gets that slot recorded
``crashed`` the same way. The session then runs without the dropped slots; if the port itself is
dropped there is nothing to time and the session is not started.

Two launches, not one, because the defects this catches are often stateful: a semaphore or
counter in a workspace that the first launch leaves set makes the second one wait for ever, and
the timed session repeats launches on the same prepared operands.

Candidate tasks (the harness's parity gate, the tuner's gate) carry ``launch_deadline_s``: their
child writes a progress line around each build and launch, and :class:`LaunchClock` ends the child
when one step outlasts the deadline (spawned children; the CPU's forked ones keep the overall
timeout only).

Benchmarks use the same machinery per variant: :func:`probe_kernels` (kernel refs and configs in,
one :class:`Probe` per variant out) before they build the variants in their own process.

Only the standard library and :mod:`skillrun.execute.isolate` are imported here: the tuner's lanes
and the device images import this module.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from skillrun.io import lifeline
from skillrun.execute.childproc import _tail, child_env, describe_exit, read_child_file

PROBE_LAUNCHES = 2
# The default deadline on a GPU (runner and tuner): a slot's compile plus two launches of a large
# GEMM take seconds (a DeepGEMM JIT compile tens of seconds); two minutes more is a hang.
GPU_DEADLINE_S = 120.0
# How long a fresh probe child may take to import torch and the problem module before its first
# slot starts (a cold interpreter on a loaded host); it is not part of any slot's deadline.
STARTUP_S = 300.0
POLL_S = 0.05


@dataclass
class Probe:
    """One slot's probe: ``ok``, ``timeout`` (deadlock or runaway), ``crashed`` or ``error`` (raised)."""

    slot: str
    kernel: str
    config: dict[str, Any]
    status: str
    reason: str = ""
    seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _label(kernel: str, config: dict[str, Any]) -> str:
    cfg = ", ".join(f"{k}={v}" for k, v in sorted(config.items())) or "default config"
    return f"{kernel} ({cfg})"


def probe_kernels(slots: list[dict[str, Any]], *, problem: str, shape: dict[str, int], device: str,
                  deadline_s: float, env: dict[str, str | None] | None = None,
                  launches: int = PROBE_LAUNCHES, launcher: Any = None) -> list[Probe]:
    """Probe each ``{"slot", "ref", "config"}`` in order; one :class:`Probe` per slot, in the same order.

    At most one child runs at a time; a child is replaced only when a slot hangs or kills it, so the
    usual cost is one interpreter start for all slots. ``launcher``, when given, runs the probe on a
    running process instead (a card's sandboxed accused server, sessions.CardSession.launcher): its
    ``temp_dir()`` is the probe's folder (inside what that server may write) and ``launcher(folder)``
    starts the probe and returns a handle polled and killed like the child."""
    results: dict[str, Probe] = {}
    todo = [dict(s) for s in slots]
    while todo:
        done = _probe_child(todo, problem=problem, shape=shape, device=device, deadline_s=deadline_s, env=env,
                            launches=launches, launcher=launcher)
        for p in done:
            results[p.slot] = p
        todo = [s for s in todo if s["slot"] not in results]
    return [results[s["slot"]] for s in slots]


def _probe_child(slots: list[dict[str, Any]], *, problem: str, shape: dict[str, int], device: str, deadline_s: float,
                 env: dict[str, str | None] | None, launches: int, launcher: Any = None) -> list[Probe]:
    """One child for as many slots as it gets through; always returns at least one Probe (progress)."""
    # named for this process: its janitor removes it if the run is killed (a server's folder: with the server's)
    with (launcher.temp_dir() if launcher is not None else lifeline.temp_dir("watchdog")) as tmp:
        d = Path(tmp)
        progress = d / "progress.jsonl"
        progress.touch()
        task = {"kind": "probe", "problem": problem, "shape": dict(shape), "device": device, "launches": int(launches),
                "progress": str(progress), "slots": [{"slot": s["slot"], "ref": s["ref"], "config": s.get("config") or {}}
                                                     for s in slots]}
        (d / "task.json").write_text(json.dumps(task))
        by_slot = {s["slot"]: s for s in slots}
        out, err = open(d / "stdout", "wb"), open(d / "stderr", "wb")
        try:
            if launcher is not None:
                proc = launcher(d)
            else:
                proc = subprocess.Popen([sys.executable, "-m", "skillrun.execute.worker", str(d / "task.json"),
                                         str(d / "result.json")], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                        env=child_env(env), start_new_session=True)
        except Exception as exc:  # noqa: BLE001 - a server that cannot start fails the probe like a child that cannot
            out.close()
            err.close()
            return [Probe(s["slot"], s["ref"], s.get("config") or {}, "error", f"cannot start the probe child: {exc}")
                    for s in slots]
        results: list[Probe] = []
        current: str | None = None
        started = time.monotonic()
        offset = 0
        try:
            while True:
                code = proc.poll()
                # Read whatever progress lines are complete (the child writes one line per event).
                try:
                    chunk = read_child_file(progress, 1 << 20, offset)
                except OSError:
                    chunk = b""
                cut = chunk.rfind(b"\n") + 1
                offset += cut
                for line in chunk[:cut].decode("utf-8", "replace").splitlines():
                    try:  # the child runs untrusted kernel code: a line it did not write as we expect is skipped
                        ev = json.loads(line)
                        s = by_slot[ev["slot"]]
                        if ev["event"] not in ("start", "ok", "error"):
                            continue
                    except (ValueError, KeyError, TypeError):
                        continue
                    if ev["event"] == "start":
                        current, started = ev["slot"], time.monotonic()
                    else:
                        results.append(Probe(ev["slot"], s["ref"], s.get("config") or {}, ev["event"],
                                             str(ev.get("reason", ""))[:600], ev.get("seconds")))
                        current, started = None, time.monotonic()
                if code is not None:
                    break
                limit = deadline_s if current is not None else STARTUP_S
                if time.monotonic() - started > limit:
                    _kill(proc)
                    if current is None:  # it never started a slot: nothing to blame on a kernel
                        tail = _tail(d / "stderr")
                        rest = [s for s in slots if s["slot"] not in {p.slot for p in results}]
                        results += [Probe(s["slot"], s["ref"], s.get("config") or {}, "error",
                                          f"the probe child did not start a slot within {STARTUP_S:g} s; {tail[-300:]}")
                                    for s in rest]
                    else:
                        s = by_slot[current]
                        results.append(Probe(current, s["ref"], s.get("config") or {}, "timeout",
                                             f"{_label(s['ref'], s.get('config') or {})}: its first {launches} launch(es) "
                                             f"(compile + run + synchronize) did not return within {deadline_s:g} s "
                                             "(deadlock?); the probe child was killed and the slot left out"))
                    return results
                time.sleep(POLL_S)
        finally:
            if proc.poll() is None:
                _kill(proc)
            out.close()
            err.close()
        if current is not None:  # it died inside a slot's launch
            s = by_slot[current]
            why = describe_exit(code) if code else "child exited inside the probe"
            results.append(Probe(current, s["ref"], s.get("config") or {}, "crashed",
                                 f"{_label(s['ref'], s.get('config') or {})}: {why} during its first launch(es); "
                                 f"{_tail(d / 'stderr')[-400:]}"))
        elif results and code:
            pass  # it left after a slot on purpose (a sticky device error): a fresh child takes the rest
        else:
            # Ended between slots (the problem module failed to import, say): the rest cannot be
            # probed by another child either, so each is an error with what the child said.
            rest = [s for s in slots if s["slot"] not in {p.slot for p in results}]
            why = _child_error(d) or (describe_exit(code) if code else "the probe child ended early")
            results += [Probe(s["slot"], s["ref"], s.get("config") or {}, "error", f"not probed: {why}") for s in rest]
        return results


def _child_error(d: Path) -> str:
    try:
        return str(json.loads(read_child_file(d / "result.json")).get("error") or "")[:400]
    except (OSError, ValueError):
        return _tail(d / "stderr")[-400:]


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and anything it started
    except ProcessLookupError:
        pass
    proc.wait()


class LaunchClock:
    """A child task's own progress (worker.py writes a ``start`` line before each build or launch and
    a ``done`` line after it) -> the step that has been running for longer than the deadline.

    isolate.py polls it while a candidate task's child runs: a deadlocked launch is then ended after
    ``deadline_s`` rather than at the task's overall timeout, and named."""

    def __init__(self, path: Path, deadline_s: float, label: str) -> None:
        self.path, self.deadline_s, self.label = path, float(deadline_s), label
        self.offset = 0
        self.current: str | None = None
        self.since = time.monotonic()

    def stuck(self) -> str | None:
        try:
            chunk = read_child_file(self.path, 1 << 16, self.offset)
        except OSError:
            chunk = b""
        cut = chunk.rfind(b"\n") + 1
        self.offset += cut
        for line in chunk[:cut].decode("utf-8", "replace").splitlines():
            try:
                ev = json.loads(line)
                event, what = ev["event"], str(ev.get("what", ""))[:200]
            except (ValueError, KeyError, TypeError):
                continue  # untrusted code shares the child: a line it wrote is not ours
            self.current = what if event == "start" else None
            self.since = time.monotonic()
        if self.current is not None and time.monotonic() - self.since > self.deadline_s:
            return (f"{self.label}: {self.current} did not return within {self.deadline_s:g} s (deadlock?); "
                    "child killed by the launch watchdog")
        return None


def admit(task: dict[str, Any], env: dict[str, str | None] | None = None,
          launcher: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A session task -> (the task without the slots that hung, crashed or raised in their probe, the watchdog record).

    The record (``deadline_s``, ``probes`` per slot, ``dropped`` slot -> status and reason) goes into
    the session's result, where the harness and the tuner turn it into per-slot statuses."""
    wd = task.get("watchdog") or {}
    deadline = float(wd["deadline_s"])
    probes = probe_kernels(task["slots"], problem=task["problem"], shape=task["shape"], device=task["device"],
                           deadline_s=deadline, env=env, launches=int(wd.get("launches", PROBE_LAUNCHES)),
                           launcher=launcher)
    dropped = {p.slot: {"status": p.status, "kernel": p.kernel, "config": p.config, "reason": p.reason}
               for p in probes if p.status != "ok"}
    record = {"deadline_s": deadline, "launches": int(wd.get("launches", PROBE_LAUNCHES)),
              "probes": {p.slot: {"status": p.status, "seconds": p.seconds, **({"reason": p.reason} if p.reason else {})}
                         for p in probes},
              "dropped": dropped}
    kept = dict(task)
    kept["slots"] = [s for s in task["slots"] if s["slot"] not in dropped]
    kept["peers"] = [n for n in task.get("peers") or [] if n not in dropped]
    if kept.get("aa_slot") in dropped:
        kept["aa_slot"] = task["port_slot"]
    kept.pop("watchdog", None)
    return kept, record
