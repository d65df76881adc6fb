"""Read a GPU profiler trace of any supported format into one normalized :class:`Profile`.

    from skillrun.ingest import ingest
    profile = ingest("trace.json.gz")            # format detected from the content
    profile = ingest("results.csv", arch="gfx950")  # an explicit arch overrides the trace's

``progress(done, total)`` (bytes) is called while large files are read, so a CLI can draw a bar.
Every failure to read is an :class:`~skillrun.errors.InputError` naming the file and the problem.
Trace metadata (environment, command lines, tokens) is never copied into the Profile.
"""
from __future__ import annotations

import csv

from pathlib import Path
from typing import Callable, Optional

from ..errors import InputError, SkillRunError
from ..models import Profile

__all__ = ["ingest", "detect_format", "FORMATS", "require_kernels"]

ProgressFn = Callable[[int, int], None]


def detect_format(path: str | Path) -> str:
    from .detect import detect

    return detect(path)


def __getattr__(name: str):  # FORMATS without importing the readers at package import
    if name == "FORMATS":
        from .detect import FORMATS

        return FORMATS
    raise AttributeError(name)


def ingest(path: str | Path, arch: Optional[str] = None, progress: Optional[ProgressFn] = None) -> Profile:
    """Parse ``path`` into a ranked :class:`Profile` (hottest kernel first)."""
    from . import detect as d

    p = Path(path)
    fmt = d.detect(p)
    try:
        if fmt == d.KINETO:
            from .torch_trace import ingest_kineto

            return ingest_kineto(p, arch=arch, progress=progress)
        if fmt == d.ROCPROFV3_JSON:
            from .rocprof_json import ingest_rocprofv3_json

            return ingest_rocprofv3_json(p, arch=arch, progress=progress)
        if fmt in (d.ROCPROFV3_CSV, d.ROCPD_CSV, d.ROCPROF_V2_CSV, d.ROCPROF_V1_CSV, d.ROCPROF_STATS_CSV):
            from .rocprof_csv import ingest_rocprof_csv

            return ingest_rocprof_csv(p, fmt, arch=arch, progress=progress)
        if fmt == d.ROCPD_SQLITE:
            from .rocpd_sqlite import ingest_rocpd_sqlite

            return ingest_rocpd_sqlite(p, arch=arch, progress=progress)
        if fmt == d.NSYS_SQLITE:
            from .nsys_sqlite import ingest_nsys_sqlite

            return ingest_nsys_sqlite(p, arch=arch, progress=progress)
        if fmt == d.NSYS_STATS_CSV:
            from .nsys_stats_csv import ingest_nsys_stats_csv

            return ingest_nsys_stats_csv(p, arch=arch, progress=progress)
        if fmt == d.NCU_CSV:
            from .ncu_csv import ingest_ncu_csv

            return ingest_ncu_csv(p, arch=arch, progress=progress)
    except SkillRunError:
        raise
    except MemoryError:
        raise InputError("not enough memory to read this trace", path=str(p)) from None
    except RuntimeError as exc:  # a reader worker process failed: report it in one line, not a traceback
        raise SkillRunError(reason=f"trace reader failed ({str(exc)[:200]})", path=str(p)) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError,
            UnicodeError, OSError, EOFError, csv.Error) as exc:
        # A reader met input it did not expect: report it as bad input, in one line.
        raise InputError(f"cannot read {fmt} trace ({type(exc).__name__}: {str(exc)[:200]})", path=str(p)) from None
    raise InputError(f"format {fmt} has no reader", path=str(p))


def require_kernels(profile: Profile) -> Profile:
    """``profile`` if it holds at least one GPU kernel execution, else an :class:`InputError` (exit 3)
    that says why: a trace with no kernel has nothing to rank or match, so it is bad input, not a
    trace that no card matched (an empty table with exit 4 read as the latter)."""
    if profile.kernels:
        return profile
    cap = profile.graph_capture
    if cap.detected:
        raise InputError(f"a graph-capture trace: {cap.captured_launches} kernel launch(es) were recorded into "
                         f"{cap.captures} graph capture(s) and none ran, so there is no kernel time to analyse",
                         path=profile.source, hint="profile steps that replay the graph (after capture), e.g. "
                         "skill-run profile --steps 5:8 -- python workload.py")
    raise InputError(f"no GPU kernel executions in this {profile.format} trace (only host-side activity?), so "
                     "there is nothing to rank or match", path=profile.source,
                     hint="record the device activity: torch.profiler activities=[CPU, CUDA] (CUDA covers ROCm too), "
                     "as `skill-run profile` does unless --activities leaves the device out")
