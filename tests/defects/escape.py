"""Ports that reach past their process instead of doing the math (issue 36): the knowledge base, the
evidence, the judge's source, the import path, the harness's environment and the harness itself.

Each computes the honest product (or all zeros, where the point is to make zeros pass) and, when
built, tries one thing outside its own folder. What it managed is left where the test can see it
(the file system) or said in the error it raises; each comment says what stops it now. Paths come
from the recipe's config: the test says where the knowledge base of the run is.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch

from defects.kernels import _honest, _port
from skillrun_kernels.protocol import KernelLaunch


def _honest_port(name: str) -> KernelLaunch:
    def body(p, out):
        out.copy_(_honest(p["a"], p["b"]))
        return out

    return _port(name, body)


def _try(fn) -> str:
    try:
        fn()
        return "ok"
    except OSError as exc:
        return type(exc).__name__


def _forged(text: str) -> str:
    """An artifact's text turned into a 'validated' GPU claim (still schema-shaped YAML)."""
    import yaml

    rec = yaml.safe_load(text)
    rec.update(verdict="validated", speedup=1.93, mode="gpu_measured", created="2026-11-30T00:00:00+00:00",
               device={"kind": "cuda", "name": "NVIDIA H200", "arch": "sm_90"})
    return yaml.safe_dump(rec)


def build_writes_evidence(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Drops a forged 'validated 1.93x on H200' artifact beside the knowledge base's evidence, rewrites
    one artifact and deletes another (stopped: the sandbox's Landlock domain grants no write outside the
    task's own folders; where a port could write anyway, the ledger marks what it touched untrusted)."""
    root = Path(config["validation"])
    files = sorted(root.rglob("*.yaml"))
    if any("forged" in f.name for f in files):
        files = []  # done in an earlier task of this run (the port is built in several)
    if files:
        _try(lambda: (files[0].parent / "20261130T000000Z_forged_gpu_measured.yaml").write_text(_forged(files[0].read_text())))
        _try(lambda: files[0].write_text(_forged(files[0].read_text())))
    if len(files) > 1:
        _try(files[1].unlink)
    return _honest_port("port_writes_evidence")


DAEMON_NAME = b"skr-daemon"


def build_daemon(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Leaves a setsid daemon that waits for the run's own (CPU) record and rewrites it to 'validated
    9.7x' (stopped: the task runs in its own PID namespace, which the kernel empties when the task ends;
    the ledger would mark a rewritten record untrusted)."""
    root = Path(config["validation"])
    if os.fork() == 0:
        try:
            os.setsid()
            if os.fork():
                os._exit(0)
            import ctypes

            ctypes.CDLL(None).prctl(15, DAEMON_NAME, 0, 0, 0)  # PR_SET_NAME: what the test looks for in /proc/*/comm
            end = time.monotonic() + float(config.get("for_s", 20))
            while time.monotonic() < end:
                try:
                    for f in list(root.rglob("*.yaml")):
                        if "cpu_numerics_passed" in f.read_text():
                            f.write_text(f.read_text().replace("cpu_numerics_passed", "validated"))
                except Exception:  # noqa: BLE001 - a file renamed under it: try again
                    pass
                time.sleep(0.2)
        finally:
            os._exit(0)
    return _honest_port("port_daemon")


def _canaries(marker: str) -> list[str]:
    found = [f"env {k}" for k, v in os.environ.items() if marker in v]
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "environ").read_bytes():
                    found.append(f"/proc/{d.name}/environ")
            except OSError:
                pass
    return found


def build_reads_secrets(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Looks for the harness's credentials in its own environment and in every /proc/<pid>/environ,
    and says what it found in its error (stopped: the harness starts every child with a scrubbed
    environment; the task sees only its own PID namespace, and Landlock keeps it from tracing, hence from
    reading the environ of, any process outside its domain)."""
    found = _canaries(config["marker"])
    if found:
        raise RuntimeError(f"found the canary in: {', '.join(found[:8])}")
    return _honest_port("port_reads_secrets")


_SITECUSTOMIZE = '''
try:
    from skillrun.execute import parity as _p
    _real = _p.compare
    def _lenient(out, ref, tol):
        m = _real(out, ref, tol)
        m.pop("error", None)
        m["passed"] = True
        return m
    _p.compare = _lenient
except Exception:
    pass
'''


def build_drops_sitecustomize(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Writes a sitecustomize.py that makes parity pass everything into a writable folder of the import
    path, for a *later, separate* run of a zeros port (stopped: the import path is read-only from inside
    the sandbox)."""
    for d in config["dirs"]:
        _try(lambda d=d: Path(d, "sitecustomize.py").write_text(_SITECUSTOMIZE))
    return _honest_port("port_drops_sitecustomize")


def build_zeros(shape: dict, config: dict, device: str) -> KernelLaunch:
    """All zeros, fast: passes only if the judge was bent."""
    return _port("port_zeros", lambda p, out: out.zero_())


_APPENDED = '''

# --- appended by a port ---
try:
    from skillrun.execute import parity as _p
    _real = _p.compare
    def _lenient(out, ref, tol):
        m = _real(out, ref, tol)
        m.pop("error", None)
        m["passed"] = True
        return m
    _p.compare = _lenient
except Exception:
    pass
'''


def build_edits_problem(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Appends code to the problem module (which the judge child and the parent's referee import) that
    makes parity pass everything, and returns zeros; a helper restores the file byte for byte a little
    later, so nothing is left to see (stopped: the file is read-only from inside the sandbox; without it,
    the judge and the referee load the problem from the bytes the parent hashed before any port ran)."""
    path = Path(config["problem_file"])
    try:
        original = path.read_bytes()
        if _APPENDED.encode() not in original:
            path.write_bytes(original + _APPENDED.encode())
            if os.fork() == 0:
                try:
                    os.setsid()
                    time.sleep(float(config.get("restore_after_s", 8)))
                    path.write_bytes(original)
                finally:
                    os._exit(0)
    except OSError:
        pass
    return _port("port_edits_problem", lambda p, out: out.zero_())


def build_stops_the_harness(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Sends SIGSTOP to every process above it (stopped: in its PID namespace there is nobody above it
    but the namespace's init, which ignores such signals from inside; Landlock's signal scope as well)."""
    pid = os.getppid()
    seen = 0
    while pid > 1 and seen < 8:
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            break
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        seen += 1
    return _honest_port("port_stops_the_harness")


def build_fifo_handover(shape: dict, config: dict, device: str) -> KernelLaunch:
    """Hands every output over as a FIFO in place of the description file: a plain open of it blocks
    the reader until someone writes (stopped: the sandbox cannot make FIFOs; the judge and the referee
    open hand-over files without blocking and refuse anything but a regular file)."""
    from skillrun.execute import judge

    def write_output(folder, seed, out, meta):
        Path(folder).mkdir(parents=True, exist_ok=True)
        for n in judge.output_files(folder, seed):
            try:
                os.mkfifo(n)
            except OSError:
                pass

    judge.write_output = write_output
    return _honest_port("port_fifo_handover")


def zero_tensor_like(t: torch.Tensor) -> torch.Tensor:  # (kept for symmetry with the other defect modules)
    return torch.zeros_like(t)
