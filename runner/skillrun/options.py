"""Values a user (or an agent) passes that the runner checks the same way everywhere.

The CLI, the agent tools and the MCP server all call these, so ``--arch sm90`` is the same usage
error (exit 2, with the accepted list) whichever door it came through.
"""
from __future__ import annotations

import difflib
import re
from typing import Optional

from skillrun.errors import UsageError

# Device architectures the runner knows (ingest resolves these from traces; cards name them in
# ``gens``). A typo such as ``sm90`` or ``gfx-950`` must not silently match nothing.
AMD_ARCHS = ("gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201")
NVIDIA_ARCHS = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a",
                "sm_103", "sm_120")
ARCHS = AMD_ARCHS + NVIDIA_ARCHS
FLYDSL_ARCHS = ("gfx942", "gfx950")  # what `check` compiles for

BACKENDS = ("cuda", "rocm", "cpu")
COLD_L2 = ("rotate", "flush", "off")


def check_arch(value: Optional[str], accepted: tuple[str, ...] = ARCHS, why: str = "") -> Optional[str]:
    """``value`` normalized (stripped, lower case), or a :class:`UsageError` naming the accepted list."""
    if value is None:
        return None
    v = str(value).strip().lower()
    if v in accepted:
        return v
    close = difflib.get_close_matches(v, accepted, n=1, cutoff=0.6)
    guess = re.sub(r"^sm(\d)", r"sm_\1", v)
    if guess in accepted:
        close = [guess]
    hint = f"did you mean {close[0]}? " if close else ""
    raise UsageError(f"{why}arch {value!r} is not accepted" if why else f"unknown arch {value!r}", field="--arch",
                     hint=f"{hint}accepted: {', '.join(accepted)}")


def check_choice(value: Optional[str], accepted: tuple[str, ...], field: str) -> Optional[str]:
    if value is None:
        return None
    v = str(value).strip().lower()
    if v not in accepted:
        raise UsageError(f"unknown value {value!r}", field=field, hint=f"accepted: {', '.join(accepted)}")
    return v


def check_positive(value: int, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"must be at least 1, got {value!r}", field=field)
    return value
