"""The evidence cache: a hit gives exactly what loading the artifact gives, any change to the file
misses, and a cache that is edited, forged, oversized, planted as a link or kept in a folder others
can write is ignored (the artifacts are then loaded as before)."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
from pathlib import Path

import pytest

from skillrun.evidence import cache as C
from skillrun.evidence.index import build_index
from skillrun.evidence.validation import artifact_files, load_artifact

REPO = Path(__file__).resolve().parents[1]
REAL = sorted(artifact_files(REPO / "validation" / "triton_fp8_blockscale_gemm_sm90"))[:6]


@pytest.fixture
def kb(tmp_path):
    root = tmp_path / "kb"
    folder = root / "validation" / "triton_fp8_blockscale_gemm_sm90"
    folder.mkdir(parents=True)
    for f in REAL:
        shutil.copy2(f, folder / f.name)
    return root


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("SKILLRUN_CACHE_DIR", str(d))
    monkeypatch.delenv("SKILLRUN_NO_CACHE", raising=False)
    return d


class Counting:
    def __init__(self):
        self.calls = 0

    def __call__(self, path):
        self.calls += 1
        return load_artifact(path)


def _files(kb):
    return sorted(artifact_files(kb / "validation"))


def _load(kb):
    loader = Counting()
    out = C.load_artifacts(_files(kb), loader, kb)
    return loader.calls, {str(f): rec for f, rec, _ in out}


def test_a_hit_is_what_loading_gives_and_skips_the_parse(kb, cache_folder):
    assert REAL, "no committed artifacts to test with"
    n1, first = _load(kb)
    n2, second = _load(kb)
    assert n1 == len(REAL) and n2 == 0
    assert second == first == {str(f): load_artifact(f) for f in _files(kb)}
    assert (cache_folder / "key").stat().st_mode & 0o777 == 0o600
    assert cache_folder.stat().st_mode & 0o777 == 0o700


def test_a_changed_artifact_misses(kb, cache_folder):
    _, before = _load(kb)
    f = _files(kb)[0]
    st = f.stat()
    text = f.read_text()
    i = text.index("created: '") + len("created: '") + 3  # the year's last digit, one year back: same size,
    f.write_text(text[:i] + str((int(text[i]) + 9) % 10) + text[i + 1:])  # still valid (a future date is refused)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: the content hash still tells
    n, after = _load(kb)
    assert n == 1
    assert after[str(f)] == load_artifact(f) and after[str(f)]["created"] != before[str(f)]["created"]


def _cache_file(folder):
    (p,) = [x for x in folder.iterdir() if x.name.startswith("evidence-")]
    return p


def _forge(folder, body: dict, key: bytes | None = None):
    raw = json.dumps(body).encode()
    mac = hmac.new(key if key is not None else (folder / "key").read_bytes(), raw, hashlib.sha256).hexdigest().encode()
    _cache_file(folder).write_bytes(mac + b"\n" + raw)


def _doctored(folder):
    """The cache's own body with every cached speedup made 10x."""
    blob = _cache_file(folder).read_bytes()
    body = json.loads(blob.partition(b"\n")[2])
    for e in body["entries"].values():
        e["record"]["speedup"] = 10.0
    return body


def test_an_edited_or_forged_cache_is_ignored(kb, cache_folder):
    _, truth = _load(kb)
    body = _doctored(cache_folder)
    # forged under another key (a cache file planted from elsewhere): ignored
    _forge(cache_folder, body, key=b"k" * 32)
    n, got = _load(kb)
    assert n == len(REAL) and got == truth
    # edited in place without the key: the MAC no longer matches
    blob = _cache_file(cache_folder).read_bytes()
    mac, _, raw = blob.partition(b"\n")
    _cache_file(cache_folder).write_bytes(mac + b"\n" + raw.replace(b'"speedup":', b'"speedup": ', 1))
    n, got = _load(kb)
    assert n == len(REAL) and got == truth
    # with the key (someone who can write the cache folder can write the artifacts too), a hit
    # still needs the artifact's own content hash
    body = _doctored(cache_folder)
    for e in body["entries"].values():
        e["sha256"] = "0" * 64
    _forge(cache_folder, body)
    n, got = _load(kb)
    assert n == len(REAL) and got == truth


def test_a_cache_in_a_folder_others_can_write_or_behind_a_link_is_not_used(kb, cache_folder, tmp_path):
    _load(kb)
    os.chmod(cache_folder, 0o777)
    assert not C.ArtifactCache(kb).enabled
    n, _ = _load(kb)
    assert n == len(REAL)
    os.chmod(cache_folder, 0o700)
    target = _cache_file(cache_folder)
    moved = tmp_path / "elsewhere.json"
    target.rename(moved)
    target.symlink_to(moved)
    n, _ = _load(kb)
    assert n == len(REAL)  # a symlinked cache file is not read
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o700)
    (loose / "key").write_bytes(b"k" * 32)
    os.chmod(loose / "key", 0o644)  # a key others can read is no key
    assert not C.ArtifactCache(kb, folder=loose).enabled


def test_an_oversized_or_non_json_cache_is_ignored(kb, cache_folder, monkeypatch):
    _, truth = _load(kb)
    monkeypatch.setattr(C, "MAX_CACHE_BYTES", 100)
    n, got = _load(kb)
    assert n == len(REAL) and got == truth
    monkeypatch.undo()
    os.environ["SKILLRUN_CACHE_DIR"] = str(cache_folder)
    raw = b'{"format": 1, "entries": NaN}'
    mac = hmac.new((cache_folder / "key").read_bytes(), raw, hashlib.sha256).hexdigest().encode()
    _cache_file(cache_folder).write_bytes(mac + b"\n" + raw)
    n, got = _load(kb)
    assert n == len(REAL) and got == truth


def test_a_broken_artifact_is_reported_not_cached(kb, cache_folder):
    bad = kb / "validation" / "triton_fp8_blockscale_gemm_sm90" / "broken.yaml"
    bad.write_text("card: [unclosed\n")
    for _ in range(2):
        ev = build_index(None, root=kb)
        invalid = [e for e in ev.entries if e.status == "invalid"]
        assert [Path(e.path).name for e in invalid] == ["broken.yaml"] and invalid[0].error
    assert len(ev.entries) == len(REAL) + 1


def test_no_cache_switch(kb, cache_folder, monkeypatch):
    monkeypatch.setenv("SKILLRUN_NO_CACHE", "1")
    assert C.cache_dir() is None and not C.ArtifactCache(kb).enabled
    n1, _ = _load(kb)
    n2, _ = _load(kb)
    assert n1 == n2 == len(REAL) and not cache_folder.exists()
