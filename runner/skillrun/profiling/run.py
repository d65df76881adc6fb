"""Run a user's command under a profiler and return the trace it wrote (`skill-run profile`).

    profile_workload(["python", "bench.py"], Path("trace.json"), steps="5:8", region=False, tool="torch")

`tool="torch"` injects torch.profiler through a start-up hook (runner/skillrun/profiling/hook/sitecustomize.py)
so the user's script is never edited; `rocprofv3` and `nsys` wrap the command with the vendor tool
and copy its kernel-trace output to `out`. Every failure is a SkillRunError saying what happened
to the workload and whether a trace exists.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import IO, Union

from skillrun.errors import EXIT_FAILURE, SkillRunError, UnavailableError, UsageError

TOOLS = ("torch", "rocprofv3", "nsys")
ACTIVITY_NAMES = ("cpu", "cuda", "gpu", "hip", "rocm")
DEFAULT_OUT = {"torch": "trace.json", "rocprofv3": "trace.csv", "nsys": "trace.sqlite"}
ChildStream = Union[int, IO, None]


@dataclass
class WorkloadFailed(SkillRunError):
    """The profiled command exited non-zero; `returncode` is its exit status (negative: signal)."""

    returncode: int = 1
    trace: str | None = None


def parse_steps(text: str | None) -> tuple[int, int | None] | None:
    """`a:b` keeps steps a..b-1 (a Python slice), `a:` from a to the end, `:b` the first b, `n` just n."""
    if text is None or text.strip() == "":
        return None
    raw = text.strip()
    try:
        if ":" in raw:
            first_s, last_s = (part.strip() for part in raw.split(":", 1))
            first = int(first_s) if first_s else 0
            end = int(last_s) if last_s else None
        else:
            first = int(raw)
            end = first + 1
    except ValueError:
        raise UsageError(f"expected a:b, a:, :b or n with whole numbers, got {text!r}", field="--steps") from None
    if first < 0 or (end is not None and end <= first):
        raise UsageError(f"the window {text!r} is empty or negative (steps count from 0; a:b keeps a..b-1)", field="--steps")
    return first, end


def _parse_activities(spec: str) -> str:
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return spec
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in ACTIVITY_NAMES]
    if bad or not names:
        raise UsageError(f"unknown activity {', '.join(bad) or spec!r}; use auto or a comma list of cpu,cuda", field="--activities")
    return ",".join(names)


def profile_workload(cmd: list[str], out: Path, steps: str | None = None, region: bool = False, tool: str = "torch",
                     *, activities: str = "auto", stdout: ChildStream = None, env: dict[str, str] | None = None) -> Path:
    """Run `cmd` under `tool`, write its trace to `out` (gzip when it ends in .gz) and return `out`.

    steps/region/activities apply to tool="torch" only. `stdout` redirects the workload's stdout
    (the CLI sends it to stderr under --json). `env` replaces os.environ for the child.
    Raises UsageError (bad arguments), UnavailableError (tool or torch missing), WorkloadFailed
    (non-zero exit; `.trace` is set when a partial trace was still written) or SkillRunError
    (the run ended normally but no trace was produced, with the reason).
    """
    if not cmd:
        raise UsageError("no command to profile; put it after `--`, e.g. `skill-run profile -- python bench.py`", field="COMMAND")
    if tool not in TOOLS:
        raise UsageError(f"unknown tool {tool!r}; choose one of {', '.join(TOOLS)}", field="--tool")
    window = parse_steps(steps)
    if window is not None and region:
        raise UsageError("--steps and --region select the profiled part in two different ways; use one", field="--steps")
    if tool != "torch" and (window is not None or region):
        raise UsageError(f"--steps and --region need --tool torch (they drive torch.profiler); {tool} profiles the whole run",
                         field="--tool")
    acts = _parse_activities(activities)
    out = Path(out).expanduser().absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    base_env = dict(os.environ if env is None else env)

    if tool == "torch":
        return _run_torch(cmd, out, window, region, acts, base_env, stdout)
    exe = shutil.which(tool, path=base_env.get("PATH"))
    if exe is None:
        raise UnavailableError(f"{tool} is not on PATH", hint="install it or use --tool torch")
    if tool == "rocprofv3":
        return _run_rocprofv3(exe, cmd, out, base_env, stdout)
    return _run_nsys(exe, cmd, out, base_env, stdout)


# --------------------------------------------------------------------------- torch.profiler via hook
def _run_torch(cmd: list[str], out: Path, window, region: bool, activities: str, env: dict[str, str], stdout: ChildStream) -> Path:
    with tempfile.TemporaryDirectory(prefix="skillrun-profile-") as tmp:
        hook_dir = Path(tmp)
        _install_hook(hook_dir)
        status_path = hook_dir / "status.json"
        env = dict(env)
        env["PYTHONPATH"] = os.pathsep.join([str(hook_dir)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env.update({
            "SKILLRUN_PROFILE_OUT": str(out),
            "SKILLRUN_PROFILE_STATUS": str(status_path),
            "SKILLRUN_PROFILE_HOOK_DIR": str(hook_dir),
            "SKILLRUN_PROFILE_STEPS": "" if window is None else f"{window[0]}:{'' if window[1] is None else window[1]}",
            "SKILLRUN_PROFILE_REGION": "1" if region else "0",
            "SKILLRUN_PROFILE_ACTIVITIES": activities,
        })
        before = _stamp(out)
        child = _run_child(cmd, env, stdout)
        status = _read_status(status_path)
    rc = child.rc
    written = status.get("trace") is not None and _stamp(out) != before and out.exists()
    if child.interrupted and written:
        # Ctrl-C is how one ends a server or a long loop: the trace of what ran is the result.
        return out
    if rc != 0:
        raise _failed(cmd, rc, str(out) if written else None, status)
    if written:
        return out
    raise _no_trace(cmd, out, window, region, status)


def _install_hook(hook_dir: Path) -> None:
    hook_pkg = resources.files("skillrun.profiling.hook")
    (hook_dir / "sitecustomize.py").write_text(hook_pkg.joinpath("sitecustomize.py").read_text())
    # A copy of the markers, loaded by the hook only where skillrun is not installed in the child.
    (hook_dir / "skillrun_profiling.py").write_text(resources.files("skillrun.profiling").joinpath("__init__.py").read_text())


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_ino


def _read_status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class _ChildResult:
    rc: int
    interrupted: bool  # the user pressed Ctrl-C while it ran (it got the SIGINT too)


def _run_child(cmd: list[str], env: dict[str, str], stdout: ChildStream) -> _ChildResult:
    """Wait for the workload. A first Ctrl-C reaches it too (same process group) and it writes its
    trace on the way out, so we keep waiting instead of killing it as subprocess.run would; a
    second one kills it. SIGTERM sent to us is passed on, so the child is never orphaned."""
    import threading

    try:
        proc = subprocess.Popen(cmd, env=env, stdout=stdout)
    except FileNotFoundError:
        raise UsageError(f"command not found: {cmd[0]}", field="COMMAND") from None
    except PermissionError:
        raise UsageError(f"command is not executable: {cmd[0]}", field="COMMAND") from None
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signal.SIGTERM))
    interrupts = 0
    try:
        while True:
            try:
                return _ChildResult(proc.wait(), interrupts > 0)
            except KeyboardInterrupt:
                interrupts += 1
                if interrupts >= 2:
                    proc.kill()
                    proc.wait()
                    raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


def _failed(cmd: list[str], rc: int, trace: str | None, status: dict) -> WorkloadFailed:
    reason = f"the workload `{_short(cmd)}` {_describe_rc(rc)}"
    if trace:
        reason += f"; a partial trace was still written to {trace}"
    elif status.get("hook_ran"):
        reason += "; no trace was written"
    else:
        reason += "; no trace was written (the profiling hook did not run)"
    if status.get("unavailable") or status.get("error"):
        reason += f" (profiling hook: {status.get('unavailable') or status.get('error')})"
    return WorkloadFailed(reason=reason, exit_code=EXIT_FAILURE, returncode=rc, trace=trace)


def _no_trace(cmd: list[str], out: Path, window, region: bool, status: dict) -> SkillRunError:
    head = f"the workload `{_short(cmd)}` exited normally but no trace was written to {out}"
    if not status:
        return SkillRunError(head + ": the profiling hook never ran",
                             hint="run a Python interpreter directly (not with -I, -E or -S) so it honours PYTHONPATH "
                                  "and imports sitecustomize; for a non-Python program use --tool rocprofv3 or nsys")
    if status.get("unavailable"):
        return UnavailableError(head + ": " + status["unavailable"], hint="install torch in that interpreter or use --tool rocprofv3/nsys")
    if status.get("error"):
        return SkillRunError(head + ": " + status["error"])
    if not status.get("finished"):
        return SkillRunError(head + ": the process ended without running its exit handlers",
                             hint="os._exit() or a fatal signal skips them; end the script normally")
    if window is not None:
        first = window[0]
        seen = status.get("steps_seen", 0)
        return SkillRunError(head + f": the step window starts at step {first} but the workload called "
                                    f"skillrun.profiling.step() {seen} time(s)",
                             hint="call step() once per iteration, or lower --steps")
    if region:
        return SkillRunError(head + ": --region was given but no `with skillrun.profiling.region(...)` block ran")
    return SkillRunError(head)


def _short(cmd: list[str]) -> str:
    text = " ".join(cmd)
    return text if len(text) <= 120 else text[:117] + "..."


# --------------------------------------------------------------------------- vendor tools
def _finish_copy(found: Path, out: Path) -> Path:
    """Copy the tool's file to `out` atomically, gzip-compressing when `out` ends in .gz."""
    from skillrun.io.atomic import write_atomic_from

    def fill(dst) -> None:
        with open(found, "rb") as src:
            if out.name.endswith(".gz") and not found.name.endswith(".gz"):
                with gzip.GzipFile(fileobj=dst, mode="wb") as gz:
                    shutil.copyfileobj(src, gz, 1 << 20)
            else:
                shutil.copyfileobj(src, dst, 1 << 20)

    return write_atomic_from(out, fill)


def _collect(folder: Path, pattern: str, tool: str, cmd: list[str], rc: int, out: Path) -> Path:
    """Find the tool's output under `folder`, copy it to `out`, and turn a failed run into WorkloadFailed."""
    found = sorted((p for p in folder.rglob(pattern) if p.is_file()), key=lambda p: p.stat().st_size, reverse=True)
    # Several files means several profiled processes; the largest is the one doing the GPU work.
    if found:
        _finish_copy(found[0], out)
    if rc != 0:
        reason = f"the workload `{_short(cmd)}` under {tool} {_describe_rc(rc)}"
        reason += f"; a partial trace was still written to {out}" if found else "; no trace was written"
        raise WorkloadFailed(reason=reason, returncode=rc, trace=str(out) if found else None)
    if not found:
        listing = ", ".join(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())[:300] or "nothing"
        raise SkillRunError(f"{tool} finished but wrote no file matching {pattern} (it wrote: {listing})")
    return out


def _run_rocprofv3(exe: str, cmd: list[str], out: Path, env: dict[str, str], stdout: ChildStream) -> Path:
    """rocprofv3 names its files DIR/<host>/<pid>_kernel_trace.csv (or _results.json/.db); the format follows `out`."""
    name = out.name[:-3] if out.name.endswith(".gz") else out.name
    if name.endswith(".json"):
        fmt, pattern = "json", "*results.json"
    elif name.endswith(".db"):
        fmt, pattern = "rocpd", "*results.db"
    else:
        fmt, pattern = "csv", "*kernel_trace.csv"
    with tempfile.TemporaryDirectory(prefix="skillrun-rocprofv3-") as tmp:
        rc = _run_child([exe, "--kernel-trace", "--output-format", fmt, "-d", tmp, "--", *cmd], env, stdout).rc
        return _collect(Path(tmp), pattern, "rocprofv3", cmd, rc, out)


def _run_nsys(exe: str, cmd: list[str], out: Path, env: dict[str, str], stdout: ChildStream) -> Path:
    with tempfile.TemporaryDirectory(prefix="skillrun-nsys-") as tmp:
        folder = Path(tmp)
        base = folder / "report"
        rc = _run_child([exe, "profile", "--trace", "cuda,nvtx", "--export", "sqlite", "--force-overwrite", "true",
                         "-o", str(base), "--", *cmd], env, stdout).rc
        rep = next(folder.glob("*.nsys-rep"), None)
        if not any(folder.glob("*.sqlite")) and rep is not None:
            # Some nsys versions skip the export when asked during `profile`; do it explicitly.
            subprocess.run([exe, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", f"{base}.sqlite", str(rep)],
                           env=env, stdout=subprocess.DEVNULL, check=False)
        return _collect(folder, "*.sqlite", "nsys", cmd, rc, out)


def main(argv: list[str] | None = None) -> int:
    """`python -m skillrun.profiling.run [--out F] [--steps a:b] [--region] [--tool T] -- CMD…`

    The same run as `skill-run profile --no-analyze`, with the standard library only, for machines
    where the CLI's dependencies (pydantic, jsonschema, ijson) are not installed, such as a bare
    GPU image; analyse the trace elsewhere with `skill-run --profile F`.
    """
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m skillrun.profiling.run", description=main.__doc__.splitlines()[0])
    ap.add_argument("--out", "-o", type=Path, default=None)
    ap.add_argument("--steps", default=None)
    ap.add_argument("--region", action="store_true")
    ap.add_argument("--tool", choices=TOOLS, default="torch")
    ap.add_argument("--activities", default="auto")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        trace = profile_workload(cmd, args.out or Path(DEFAULT_OUT[args.tool]), steps=args.steps, region=args.region,
                                 tool=args.tool, activities=args.activities)
    except SkillRunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"wrote {trace}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
