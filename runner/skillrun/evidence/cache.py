"""A cache of loaded validation artifacts, so that `skill-run --profile` does not parse ~90 YAML
files in pure Python on every run (about 85 % of its time when a card matches).

What it caches is exactly what :func:`skillrun.evidence.validation.load_artifact` returns for a
file (parsed, schema-checked, scrubbed), keyed on the file's identity: its path, ``(dev, inode,
size, mtime_ns, ctime_ns)`` *and* the SHA-256 of its bytes (each file is still read: ~2 MB in all,
a few milliseconds). Any change to a file, to the artifact schema or to the code that loads one
(:data:`_FINGERPRINT_FILES`) misses, and the file is loaded the slow way.

A cache is untrusted input like any other file:

- it lives in a per-user folder (``$SKILLRUN_CACHE_DIR``, else ``$XDG_CACHE_HOME/skillrun``, else
  ``~/.cache/skillrun``) that must be a real folder owned by this user and writable by no one else;
  otherwise nothing is cached;
- its content is authenticated: an HMAC-SHA256 under a random key kept beside it (mode 0600, owned
  by this user), so a cache file copied in, edited or planted by someone who cannot write that
  folder is ignored (and anyone who can write it can write the artifacts themselves);
- it is read as a regular file of at most :data:`MAX_CACHE_BYTES`, parsed as strict JSON, and a
  record that does not survive a JSON round trip unchanged is never cached;
- it is bounded (:data:`MAX_ENTRIES`; entries for files no longer asked for are dropped) and
  written atomically (:mod:`skillrun.io.atomic`), so a reader never sees half of one.

``SKILLRUN_NO_CACHE=1`` turns it off. Every failure to read or write the cache is silent and costs
only speed: the artifacts are then loaded as before.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from skillrun.errors import SkillRunError

FORMAT = 1
MAX_CACHE_BYTES = 64 << 20
MAX_ENTRIES = 20_000
_KEY_BYTES = 32
_HERE = Path(__file__).resolve().parent
# The code and schema that decide what a loaded artifact is: a change to any of them empties the cache.
_FINGERPRINT_FILES = (_HERE / "validation.py", _HERE / "store.py", _HERE.parent / "io" / "redact.py",
                      _HERE.parent / "kb" / "bounded_yaml.py", _HERE / "cache.py")

Loaded = tuple[Path, Optional[dict[str, Any]], Optional[SkillRunError]]


def cache_dir() -> Optional[Path]:
    """The cache folder this user's runs share, or None when caching is off."""
    if os.environ.get("SKILLRUN_NO_CACHE", "").strip() not in ("", "0"):
        return None
    env = os.environ.get("SKILLRUN_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "skillrun"


def _private_dir(folder: Path) -> bool:
    """``folder`` exists (created 0700 if not), is not a symlink, is ours and no one else can write it."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022)


def _own_regular(fd: int) -> Optional[os.stat_result]:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return st


def _key(folder: Path) -> Optional[bytes]:
    """The HMAC key: 32 random bytes in ``folder/key``, mode 0600, created on first use."""
    path = folder / "key"
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK
    for _ in range(2):
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            except FileExistsError:
                continue  # another run made it meanwhile: read that one
            except OSError:
                return None
            key = os.urandom(_KEY_BYTES)
            try:
                os.write(fd, key)
            finally:
                os.close(fd)
            return key
        except OSError:
            return None
        try:
            st = _own_regular(fd)
            if st is None or st.st_mode & 0o077 or st.st_size != _KEY_BYTES:
                return None
            key = os.read(fd, _KEY_BYTES + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        return key if len(key) == _KEY_BYTES else None
    return None


def _fingerprint() -> str:
    """What a cached record depends on besides its file: the loader's code, the artifact schema."""
    h = hashlib.sha256(f"format {FORMAT}".encode())
    files = list(_FINGERPRINT_FILES)
    try:
        from skillrun.kb.paths import schema_path

        files += [schema_path("validation"), schema_path("e2e")]
    except Exception:  # noqa: BLE001 - no schema found: the loader will say so itself
        pass
    for f in files:
        try:
            h.update(f.read_bytes())
        except OSError:
            h.update(b"missing " + str(f).encode())
    return h.hexdigest()


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _same_after_json(record: dict[str, Any]) -> bool:
    try:
        return json.loads(json.dumps(record, allow_nan=False)) == record
    except (TypeError, ValueError):
        return False


class ArtifactCache:
    """One cache file (per knowledge-base root) read once, consulted per artifact, written once."""

    def __init__(self, root: Path, folder: Optional[Path] = None):
        self.folder = folder if folder is not None else cache_dir()
        self.path: Optional[Path] = None
        self.key: Optional[bytes] = None
        self.fingerprint = ""
        self.entries: dict[str, dict[str, Any]] = {}
        self.used: dict[str, dict[str, Any]] = {}
        self.dirty = False
        self.hits = self.misses = 0
        if self.folder is None or not _private_dir(self.folder):
            return
        self.key = _key(self.folder)
        if self.key is None:
            return
        tag = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:16]
        self.path = self.folder / f"evidence-{tag}.json"
        self.fingerprint = _fingerprint()
        self.entries = self._read()

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _read(self) -> dict[str, dict[str, Any]]:
        assert self.path is not None and self.key is not None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return {}
        try:
            st = _own_regular(fd)
            if st is None or st.st_size > MAX_CACHE_BYTES:
                return {}
            os.set_blocking(fd, True)
            with os.fdopen(os.dup(fd), "rb") as fh:
                blob = fh.read(MAX_CACHE_BYTES + 1)
        except OSError:
            return {}
        finally:
            os.close(fd)
        mac, _, body = blob.partition(b"\n")
        want = hmac.new(self.key, body, hashlib.sha256).hexdigest().encode()
        if len(blob) > MAX_CACHE_BYTES or not hmac.compare_digest(mac, want):
            return {}
        try:
            doc = json.loads(body, parse_constant=_no_constant)
        except ValueError:
            return {}
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("fingerprint") != self.fingerprint:
            return {}
        entries = doc.get("entries")
        if not isinstance(entries, dict) or len(entries) > MAX_ENTRIES:
            return {}
        return {k: v for k, v in entries.items() if isinstance(v, dict)}

    def load(self, path: Path, loader: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
        """``loader(path)``, or what it returned last time for exactly these bytes."""
        if not self.enabled:
            return loader(path)
        from skillrun.evidence.store import MAX_RECORD_BYTES
        from skillrun.io.regular_files import open_regular

        try:
            fd = open_regular(Path(path), "validation artifact")
        except SkillRunError:
            return loader(path)  # the loader raises the same error with its own words
        try:
            st = os.fstat(fd)
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read(MAX_RECORD_BYTES + 1)
        except OSError:
            return loader(path)
        finally:
            os.close(fd)
        name = str(Path(path).absolute())
        digest = hashlib.sha256(data).hexdigest()
        ident = _identity(st)
        hit = self.entries.get(name)
        if (hit is not None and hit.get("sha256") == digest and hit.get("stat") == ident
                and isinstance(hit.get("record"), dict)):
            self.hits += 1
            self.used[name] = hit
            return hit["record"]
        self.misses += 1
        record = loader(path)  # raises for a bad artifact: a failure is never cached
        if len(data) <= MAX_RECORD_BYTES and _same_after_json(record):
            # what is kept is a JSON copy, so the caller's later edits of `record` never reach the cache
            self.used[name] = {"sha256": digest, "stat": ident, "record": json.loads(json.dumps(record))}
            self.dirty = True
        return record

    def save(self) -> None:
        """Write the cache if this run loaded anything anew (silent on failure): the entries it used,
        then older ones whose file is still there, at most :data:`MAX_ENTRIES`."""
        if not self.enabled or not self.dirty:
            return
        from skillrun.io.atomic import write_atomic

        entries = dict(self.used)
        for name, e in self.entries.items():
            if len(entries) >= MAX_ENTRIES:
                break
            if name not in entries and os.path.isfile(name):
                entries[name] = e
        body = json.dumps({"format": FORMAT, "fingerprint": self.fingerprint, "entries": entries},
                          separators=(",", ":"), allow_nan=False).encode()
        if len(body) + 65 > MAX_CACHE_BYTES:
            return
        mac = hmac.new(self.key, body, hashlib.sha256).hexdigest().encode()  # type: ignore[arg-type]
        try:
            write_atomic(self.path, mac + b"\n" + body, replace=True, no_symlink_folder=True)  # type: ignore[arg-type]
        except (SkillRunError, OSError):
            pass


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_artifacts(paths: Iterable[Path], loader: Callable[[Path], dict[str, Any]], root: Path) -> list[Loaded]:
    """``(path, record, None)`` or ``(path, None, error)`` per path, through the cache of ``root``."""
    cache = ArtifactCache(root)
    out: list[Loaded] = []
    for f in paths:
        try:
            out.append((f, cache.load(f, loader), None))
        except SkillRunError as exc:
            out.append((f, None, exc))
    cache.save()
    return out
