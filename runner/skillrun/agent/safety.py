"""What the agent tools may read, and what they must never repeat.

Tools read only inside the knowledge base and the paths the user handed over when the tools were
built; everything else is refused with a readable error. Symlinks and ``..`` are resolved before
the check, so a link inside an allowed folder cannot lead outside it. Checking a name and then
opening it leaves a window (another process swaps a folder for a symlink in between), so the file
is opened first and the *open descriptor* is checked (its real path, from the kernel); readers are
then handed a path to that descriptor (``/proc/<pid>/fd/N``), which can no longer be redirected.

Real profiler traces carry environment variables and tokens. Ingestion scrubs every string it
keeps (see :mod:`skillrun.io.redact`), and tool outputs are scrubbed again: a model must never see a
secret, because it may repeat it.
"""
from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from skillrun.errors import UsageError

# The patterns live in skillrun.io.redact, shared with ingestion (which scrubs every trace string).
from skillrun.io.redact import REDACTED, is_secret_key, scrub, scrub_text  # noqa: E402,F401


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
        if "\x00" in text:
            raise UsageError(f"{what} contains a NUL byte, which no file name can", field=what)
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

    @contextmanager
    def opened(self, raw: str | Path, what: str = "path") -> Iterator[tuple[Path, Path]]:
        """``(path to read, real path)`` of an allowed file, pinned for the duration of the block.

        The file is opened (never following a symlink in its last component), then the real path
        of the open descriptor is checked against the allowed roots: a swap of any folder on the
        way between the check in :meth:`resolve` and the open is caught here, not after reading.
        The path to read names the descriptor itself, so every later open by a reader (or by one
        of its worker processes) gets the same file. Folders are yielded as their resolved path.
        """
        path = self.resolve(raw, what)
        proc = Path(f"/proc/{os.getpid()}/fd")
        if not proc.is_dir():  # no /proc (not Linux): the check in resolve() is what we have
            yield path, path
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise UsageError(f"cannot open {what} {str(raw)!r}: {exc.strerror or exc}", field=what) from None
        try:
            real = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if not self.permits(real):
                raise UsageError(f"{what} {str(raw)!r} changed while it was being opened and now leads to {real}, "
                                 "outside the paths these tools may read", field=what)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                yield real, real
            else:
                yield proc / str(fd), real
        finally:
            os.close(fd)
