"""The evidence ledger: which files under ``validation/`` the runner wrote, and what they held.

Evidence is written by the runner's parent process alone (:mod:`skillrun.evidence.store`): never by a
task child, where ports and references run. Each write appends one line to the ledger of the folder
it went to (``LEDGER.jsonl`` beside the artifacts): the file's name and the sha256 of its bytes.
The evidence index (:mod:`skillrun.evidence.index`) holds every artifact against it:

* a file the ledger does not list was not written by the runner (a port that dropped a schema-valid
  "validated" artifact next to the real ones, a hand edit under a new name): **untrusted**;
* a file whose bytes no longer match its line was changed after the runner wrote it: **untrusted**;
* a line whose file is gone is reported as **lost** (a deleted artifact).

The ledger is only as safe as the folder it sits in: the sandbox (:mod:`skillrun.io.sandbox`) keeps
every untrusted process from writing the knowledge base at all, so neither the artifacts nor their
ledger are in a port's reach; a run without the sandbox says so in its artifact, and there a port
could rewrite both. Artifacts committed before the ledger existed are listed with ``adopted`` (the
project's own commits, checked when the ledger was introduced) instead of a writer.

Lines are appended with ``O_APPEND`` (one ``write`` each), so concurrent runs do not interleave;
``.gitattributes`` merges ledgers of parallel branches as a union of lines.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

LEDGER_NAME = "LEDGER.jsonl"
MAX_LEDGER_BYTES = 16 << 20


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record(path: Path, data: bytes, **extra: str) -> None:
    """Append ``path``'s line (name, sha256 of ``data``) to its folder's ledger."""
    import datetime as _dt

    from skillrun import __version__

    path = Path(path)
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    line = {"file": path.name, "sha256": digest(data), "written": now, "by": f"skillrun {__version__}", **extra}
    text = (json.dumps(line, sort_keys=True) + "\n").encode()
    fd = os.open(path.parent / LEDGER_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        os.write(fd, text)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Ledger:
    """Every ledger line under one evidence root, by folder and file name."""

    root: Path
    lines: dict[Path, dict[str, dict]] = field(default_factory=dict)  # folder -> file name -> line (last wins)
    problems: dict[Path, str] = field(default_factory=dict)  # folder -> why its ledger could not be read

    def check(self, path: Path) -> Optional[str]:
        """None when the runner wrote ``path`` and it is unchanged; else why it is untrusted."""
        path = Path(path)
        folder = self._folder(path.parent)
        if folder in self.problems:
            return f"its folder's {LEDGER_NAME} cannot be read ({self.problems[folder]})"
        line = self.lines.get(folder, {}).get(path.name)
        if line is None:
            return (f"not written by the runner: {LEDGER_NAME} has no line for it (a file dropped into validation/ "
                    "by something else, a port included)")
        try:
            now = digest(path.read_bytes())
        except OSError as exc:
            return f"cannot be read to compare with the ledger ({exc.strerror or exc})"
        if now != line.get("sha256"):
            return (f"changed since the runner wrote it (sha256 {str(line.get('sha256'))[:10]}… in {LEDGER_NAME}, "
                    f"{now[:10]}… now)")
        return None

    def lost(self) -> list[dict]:
        """Ledger lines whose file is gone (deleted evidence), with the folder they were in."""
        out = []
        for folder, by_name in self.lines.items():
            for name, line in by_name.items():
                if not (folder / name).exists():
                    out.append({"path": str(folder / name), "sha256": line.get("sha256"),
                                "written": line.get("written") or line.get("adopted")})
        return sorted(out, key=lambda x: x["path"])

    def _folder(self, folder: Path) -> Path:
        folder = Path(folder)
        if folder not in self.lines and folder not in self.problems:
            self.lines[folder], why = read(folder)
            if why:
                self.problems[folder] = why
        return folder


def read(folder: Path) -> tuple[dict[str, dict], Optional[str]]:
    """(file name -> its last line, a problem reading the ledger or None) for one folder."""
    p = Path(folder) / LEDGER_NAME
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, str(exc.strerror or exc)
    import stat

    if not stat.S_ISREG(st.st_mode):
        return {}, "not a regular file"
    if st.st_size > MAX_LEDGER_BYTES:
        return {}, f"larger than {MAX_LEDGER_BYTES} bytes"
    out: dict[str, dict] = {}
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            text = fh.read(MAX_LEDGER_BYTES + 1).decode("utf-8", "replace")
    except OSError as exc:
        return {}, str(exc.strerror or exc)
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # a torn or foreign line grants nothing
        if isinstance(line, dict) and isinstance(line.get("file"), str) and isinstance(line.get("sha256"), str):
            out[line["file"]] = line
    return out, None


def load(root: Path, folders: Iterable[Path] = ()) -> Ledger:
    led = Ledger(root=Path(root))
    for f in folders:
        led._folder(Path(f))
    return led
