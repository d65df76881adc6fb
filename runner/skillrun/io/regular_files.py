"""Opening input files that may not be what their name says.

A FIFO, a character device or a socket where a trace, a card or an artifact should be would make a
plain ``open()`` + ``read()`` block forever (or read ``/dev/zero`` until memory runs out), so every
input is first checked to be a regular file: opened non-blocking, checked with ``fstat`` on the
open descriptor (no window for a swap between the check and the read), and read with a size cap.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from skillrun.errors import InputError

_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def kind_of(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def check_regular(path: Path, what: str = "file") -> os.stat_result:
    """The file's stat if it is a regular file (following symlinks); InputError (exit 3) otherwise."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{what} not found", path=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read {what} ({exc.strerror or exc})", path=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"is {kind_of(st.st_mode)}, expected a regular {what}", path=str(path))
    return st


def open_regular(path: Path, what: str = "file") -> int:
    """A read-only descriptor on ``path``, refused at once unless it is a regular file.

    O_NONBLOCK makes opening a FIFO return immediately instead of waiting for a writer; the mode
    is then checked on the descriptor itself.
    """
    check_regular(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"cannot open {what} ({exc.strerror or exc})", path=str(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"is {kind_of(st.st_mode)}, expected a regular {what}", path=str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, limit: int, what: str = "file") -> bytes:
    """The whole content of a regular file of at most ``limit`` bytes."""
    fd = open_regular(path, what)
    try:
        with os.fdopen(fd, "rb", closefd=True) as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what} ({exc.strerror or exc})", path=str(path)) from None
    if len(data) > limit:
        raise InputError(f"{what} is larger than {_human(limit)} (the cap for this kind of file)", path=str(path))
    return data


def _human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
