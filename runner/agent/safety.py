"""What the agent tools may read, and what they must never repeat.

Tools read only inside the knowledge base and the paths the user handed over when the tools were
built; everything else is refused with a readable error. Symlinks and ``..`` are resolved before
the check, so a link inside an allowed folder cannot lead outside it.

Real profiler traces carry environment variables and tokens. Ingestion scrubs every string it
keeps (see :mod:`skillrun.redact`), and tool outputs are scrubbed again: a model must never see a
secret, because it may repeat it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from skillrun.errors import UsageError

# The patterns live in skillrun.redact, shared with ingestion (which scrubs every trace string).
from skillrun.redact import REDACTED, is_secret_key, scrub, scrub_text  # noqa: E402,F401


class PathGuard:
    """Read access limited to the knowledge base and the user's own files/folders."""

    def __init__(self, kb_root: Path, allowed: Iterable[str | Path] = ()):
        self.kb_root = Path(kb_root).resolve()
        self.allowed: list[Path] = [Path(p).expanduser().resolve() for p in allowed]

    @property
    def roots(self) -> list[Path]:
        return [self.kb_root, *self.allowed]

    def permits(self, path: Path) -> bool:
        for root in self.roots:
            if path == root or path.is_relative_to(root):
                return True
        return False

    def resolve(self, raw: str | Path, what: str = "path") -> Path:
        """The real path of `raw` if the tools may read it; a UsageError naming the rule otherwise."""
        text = str(raw).strip()
        if not text:
            raise UsageError(f"empty {what}", field=what)
        try:
            path = Path(text).expanduser().resolve()
        except (OSError, RuntimeError) as exc:  # symlink loops, unreadable parents
            raise UsageError(f"cannot resolve {what} {text!r}: {exc}", field=what) from None
        if not self.permits(path):
            shown = ", ".join(str(r) for r in self.roots)
            raise UsageError(
                f"{what} {text!r} (resolves to {path}) is outside the paths these tools may read",
                field=what,
                hint=f"allowed: {shown}; ask the user to pass the file when starting the agent (--allow PATH)",
            )
        if not path.exists():
            raise UsageError(f"no such file: {path}", field=what, hint="check the path the user gave")
        return path
