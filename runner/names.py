"""Kernel-name forms: raw (as the profiler wrote it), demangled, and a bounded form for regexes.

Profilers write names mangled (``_ZN2ck27kernel_gemm…``), demangled (``void ck::kernel_gemm…<…>``)
or truncated. Cards' regexes are searched against every form we have.
"""
from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache

# Regexes from cards run on names of bounded length, so a pathological pattern cannot stall a run
# on a multi-kilobyte template name (lint also rejects catastrophic patterns outright).
MAX_NAME_LEN = 4096


@lru_cache(maxsize=1)
def _cxxfilt() -> str | None:
    return shutil.which("c++filt") or shutil.which("llvm-cxxfilt") or shutil.which("llvm-cxxfilt-19")


def demangle_many(names: list[str]) -> dict[str, str]:
    """Demangle Itanium names with c++filt in one call; names that are not mangled map to themselves."""
    mangled = [n for n in names if n.startswith("_Z")]
    out = {n: n for n in names}
    tool = _cxxfilt()
    if not mangled or tool is None:
        return out
    try:
        res = subprocess.run([tool], input="\n".join(mangled) + "\n", capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return out
    lines = res.stdout.splitlines()
    if res.returncode == 0 and len(lines) == len(mangled):
        out.update(dict(zip(mangled, lines)))
    return out


def name_forms(raw: str, demangled: str | None = None) -> list[str]:
    forms = [raw[:MAX_NAME_LEN]]
    if demangled and demangled != raw:
        forms.append(demangled[:MAX_NAME_LEN])
    # rocprof appends ".kd" to code-object symbols; match without it too.
    if raw.endswith(".kd"):
        forms.append(raw[:-3][:MAX_NAME_LEN])
    return forms
