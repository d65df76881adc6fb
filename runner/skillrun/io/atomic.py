"""Writing output files so that a reader never sees half a file and a planted link redirects nothing.

Every output (validation artifacts, the HTML report, traces from ``skill-run profile``) is written
to a *fresh* temporary file in the target folder — created with O_EXCL | O_NOFOLLOW under a random
name, so a symlink planted at a predictable ``OUT.tmp`` has nothing to redirect — then fsync'd and
renamed over the target (or hard-linked, where an existing file must never be replaced). All of it
goes through one descriptor on the folder, so the folder cannot be swapped between the checks and
the write; with ``no_symlink_folder`` that folder itself may not be a symlink.

Temporary files are named ``.tmp-skillrun-<pid>-<random>.part``: readers (lint, the report) skip
them, and :func:`sweep_stale_temps` removes those whose writing process is gone.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import BinaryIO, Callable

from skillrun.errors import SkillRunError
from skillrun.io.lifeline import pid_alive

TMP_PREFIX = ".tmp-skillrun-"
TMP_SUFFIX = ".part"
_LEGACY_PREFIX = ".tmp-"  # earlier writers' temporary names (.tmp-XXXX.yaml, OUT.tmp)


def is_temp_name(name: str) -> bool:
    """True for our (and earlier versions') temporary files: never evidence, never output."""
    return name.startswith(_LEGACY_PREFIX) or name.endswith(".tmp") or name.endswith(TMP_SUFFIX)


def _open_dir(folder: Path, no_symlink_folder: bool) -> int:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    if no_symlink_folder:
        flags |= os.O_NOFOLLOW
    try:
        return os.open(folder, flags)
    except OSError as exc:
        if no_symlink_folder and os.path.islink(folder):
            raise SkillRunError("refusing to write through a symlinked folder", path=str(folder)) from None
        raise SkillRunError(f"cannot open output folder ({exc.strerror or exc})", path=str(folder)) from None


def sweep_stale_temps(folder: Path, dir_fd: int | None = None) -> list[str]:
    """Remove our temporary files in ``folder`` whose writer has exited; returns the names removed."""
    removed: list[str] = []
    try:
        names = os.listdir(dir_fd if dir_fd is not None else folder)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(TMP_PREFIX) and name.endswith(TMP_SUFFIX)):
            continue
        pid_text = name[len(TMP_PREFIX):].split("-", 1)[0]
        # A live writer's file (this process's included) is a write in progress: leave it.
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or pid_alive(int(pid_text)):
            continue
        try:
            if dir_fd is not None:
                os.unlink(name, dir_fd=dir_fd)
            else:
                os.unlink(Path(folder) / name)
            removed.append(name)
        except OSError:
            pass
    return removed


def write_atomic_from(target: Path, fill: Callable[[BinaryIO], None], *, replace: bool = True,
                      no_symlink_folder: bool = False) -> Path:
    """Atomically write ``target`` with what ``fill(fh)`` writes into the open temporary file.

    ``replace=False`` never replaces an existing file (FileExistsError instead): evidence is never
    clobbered. The file gets the usual 0666 & ~umask mode. The target name itself may be a planted
    symlink: rename replaces the link, it does not follow it.
    """
    target = Path(target)
    dfd = _open_dir(target.parent, no_symlink_folder)
    tmp: str | None = None
    try:
        sweep_stale_temps(target.parent, dfd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        while tmp is None:
            name = f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}{TMP_SUFFIX}"
            try:
                fd = os.open(name, flags, 0o666, dir_fd=dfd)
            except FileExistsError:
                continue
            except OSError as exc:  # read-only or full folder, no permission: say which and why
                raise SkillRunError(f"cannot create a file in the output folder ({exc.strerror or exc})",
                                    path=str(target.parent)) from None
            tmp = name
        try:
            with os.fdopen(fd, "wb") as fh:
                fill(fh)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise SkillRunError(f"cannot write ({exc.strerror or exc}) in {target.parent}", path=str(target)) from None
        try:
            if replace:
                os.replace(tmp, target.name, src_dir_fd=dfd, dst_dir_fd=dfd)
                tmp = None
            else:
                os.link(tmp, target.name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:
            raise  # replace=False and the name exists: the caller picks another name
        except OSError as exc:
            raise SkillRunError(f"cannot put the finished file in place ({exc.strerror or exc}) in {target.parent}",
                                path=str(target)) from None
        try:
            os.fsync(dfd)  # the rename itself survives a crash
        except OSError:
            pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
        os.close(dfd)
    return target


def write_atomic(target: Path, data: bytes | str, *, replace: bool = True, no_symlink_folder: bool = False) -> Path:
    """Write ``data`` (str is UTF-8 encoded) to ``target`` atomically; returns ``target``."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return write_atomic_from(target, lambda fh: fh.write(raw), replace=replace, no_symlink_folder=no_symlink_folder)
