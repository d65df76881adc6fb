"""Bounded ingestion: hostile SQLite, gzip and CSV inputs end in bounded time and memory with one
clear error, and values a trace cannot mean are counted in ``anomalies`` and warned about.

Every hostile file is generated here, small: the bounds are lowered for the test (a gzip bomb of
a few MB against a small ratio cap, a one-second SQLite deadline) instead of producing gigabytes.
"""
from __future__ import annotations

import gzip
import json
import sqlite3
import time
from pathlib import Path

import pytest

from skillrun.errors import InputError
from skillrun.ingest import _io, _profile, _sqlite, ingest, torch_trace

pytestmark = pytest.mark.timeout(120)

NSYS_SCHEMA = """
    CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
    CREATE TABLE TARGET_INFO_GPU_REAL (id INT, name TEXT, computeMajor INT, computeMinor INT, smCount INT);
    INSERT INTO StringIds VALUES (1, 'nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN');
"""
KERNEL_TABLE = """
    CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, "end" INT, deviceId INT, demangledName INT);
    INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (100, 251428, 0, 1);
"""
ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r)"


def _db(path: Path, script: str) -> Path:
    con = sqlite3.connect(path)
    con.executescript(script)
    con.commit()
    con.close()
    return path


def _kineto(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": 7}}


# ----------------------------------------------------------------------------- SQLite
def test_a_recursive_view_as_the_kernel_table_ends_at_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(_sqlite, "DEADLINE_S", 1.0)
    db = _db(tmp_path / "loop.sqlite", NSYS_SCHEMA + f"""
        CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS {ENDLESS}
            SELECT x AS start, x + 1 AS "end", 0 AS deviceId, 1 AS demangledName FROM r;""")
    t0 = time.monotonic()
    with pytest.raises(InputError, match="longer than 1 s"):
        ingest(db)
    assert time.monotonic() - t0 < 30


def test_an_endless_device_view_is_capped(tmp_path):
    db = _db(tmp_path / "gpus.sqlite", NSYS_SCHEMA + KERNEL_TABLE + f"""
        CREATE VIEW TARGET_INFO_GPU AS {ENDLESS}
            SELECT x AS id, 'GPU' AS name, 9 AS computeMajor, 0 AS computeMinor, 132 AS smCount FROM r;""")
    prof = ingest(db)
    assert len(prof.devices) <= _sqlite.MAX_DEVICE_ROWS and prof.kernels


@pytest.mark.parametrize("name", ["report#1.sqlite", "report?mode=rw.sqlite", "a b%20c.sqlite"])
def test_uri_characters_in_a_file_name_are_escaped(tmp_path, name):
    db = _db(tmp_path / name, NSYS_SCHEMA + KERNEL_TABLE)
    before = sorted(p.name for p in tmp_path.iterdir())
    prof = ingest(db)
    assert prof.kernels[0].name.startswith("nvjet_sm90")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created beside it (no `report`)


# ----------------------------------------------------------------------------- gzip
def _bomb(path: Path, n: int) -> Path:
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * n + b"]}", 9))
    return path


@pytest.mark.parametrize("small_limit", [torch_trace.SMALL_LIMIT, 0])  # whole-document and streaming paths
def test_a_gzip_bomb_is_refused_by_ratio(tmp_path, monkeypatch, small_limit):
    monkeypatch.setattr(_io, "GZIP_RATIO_SLACK", 0)
    monkeypatch.setattr(_io, "MAX_GZIP_RATIO", 20)
    gz = _bomb(tmp_path / "bomb.json.gz", 4 << 20)  # ~1000x
    with pytest.raises(InputError, match="gzip bomb"):
        torch_trace.ingest_kineto(gz, small_limit=small_limit, workers=1)
    assert not list(tmp_path.glob("skillrun-trace-*"))


def test_decompression_stops_at_the_absolute_budget(tmp_path):
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(bytes(range(256)) * 4096))  # 1 MiB, ratio within bounds
    with pytest.raises(InputError, match="can be spared"):
        for _ in _io.iter_decompressed(gz, 4096, budget=100_000):
            pass
    assert sum(len(b) for b in _io.iter_decompressed(gz, 4096, budget=2 << 20)) == 1 << 20


def test_a_gzip_trailer_that_lies_about_the_size_cannot_force_the_in_memory_path(tmp_path, monkeypatch):
    events = [_kernel(f"kernel_{i % 7}", 10.0 * i, 5.0) for i in range(6000)]
    body = json.dumps({"traceEvents": events}).encode()
    gz = tmp_path / "lie.json.gz"
    # The last member's trailer is what a size hint reads: a tiny member claims the file is tiny.
    gz.write_bytes(gzip.compress(body) + gzip.compress(b" "))
    assert len(body) > 400_000 and _io.content_size_hint(gz) < 100_000
    monkeypatch.setattr(torch_trace, "SMALL_READ_FLOOR", 0)
    held: list[int] = []
    real = _io.read_content

    def spy(path, limit=_io.MAX_TRACE_BYTES):
        held.append(limit)
        return real(path, limit)

    monkeypatch.setattr(_io, "read_content", spy)
    prof = torch_trace.ingest_kineto(gz, small_limit=100_000, workers=1)
    assert held == [400_000]  # the in-memory read stopped at its cap ...
    assert prof.kernel_calls == 6000  # ... and the streaming path read the whole trace


# ----------------------------------------------------------------------------- CSV
def test_csv_traces_are_streamed_never_read_whole(tmp_path, monkeypatch):
    def whole(*a, **kw):
        raise AssertionError("a CSV reader read the whole file into memory")

    monkeypatch.setattr(_io, "read_content", whole)
    rows = ['"Kind","Agent_Id","Queue_Id","Kernel_Id","Kernel_Name","Correlation_Id","Start_Timestamp","End_Timestamp"']
    rows += [f'"KERNEL_DISPATCH","1","0","{i % 3}","kern_{i % 3}","{i}","{1000 * i}","{1000 * i + 500}"' for i in range(200)]
    p = tmp_path / "kernel_trace.csv.gz"
    p.write_bytes(gzip.compress(("\r\n".join(rows) + "\r\n").encode()))
    prof = ingest(p)
    assert prof.kernel_calls == 200 and {k.name for k in prof.kernels} == {"kern_0", "kern_1", "kern_2"}


# ----------------------------------------------------------------------------- names and anomalies
def test_a_huge_kernel_name_is_cut_and_counted(tmp_path):
    p = _kineto(tmp_path / "t.json", [_kernel("k" * 1_000_000, 0.0, 5.0), _kernel("small", 10.0, 5.0)])
    prof = ingest(p)
    assert max(len(k.name) for k in prof.kernels) < _profile.MAX_KEPT_NAME + 100
    assert prof.anomalies["name_truncated"] == 1


def test_distinct_kernel_names_past_the_cap_are_folded_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(_profile, "MAX_DISTINCT_KERNELS", 10)
    p = _kineto(tmp_path / "t.json", [_kernel(f"k{i}", 10.0 * i, 5.0) for i in range(50)])
    prof = ingest(p)
    assert len(prof.kernels) == 11 and prof.kernel_calls == 50
    assert prof.anomalies["kernels_past_name_cap"] == 40


def test_impossible_durations_are_counted_not_summed_into_inf(tmp_path):
    p = _kineto(tmp_path / "t.json", [_kernel("a", 0.0, 1.5e308), _kernel("b", 10.0, 1.5e308), _kernel("c", 20.0, 5.0)])
    prof = ingest(p)
    assert prof.anomalies["impossible_duration"] == 2
    assert prof.total_kernel_us == 5.0
    assert all(k.pct_gpu == k.pct_gpu for k in prof.kernels)  # no NaN share
    assert any("impossible duration" in w for w in prof.warnings)


def test_duplicated_events_are_counted_and_warned(tmp_path):
    p = _kineto(tmp_path / "t.json", [_kernel("dup", 0.0, 50.0)] * 2001)
    prof = ingest(p)
    assert prof.anomalies["kernel_time_exceeds_span"] == 2001
    assert any("duplicated events" in w for w in prof.warnings)


def test_ordinary_overlap_is_not_an_anomaly(tmp_path):
    # Eight streams running at once: plenty of overlap, nothing impossible.
    ev = [dict(_kernel(f"k{s}", 10.0 * i, 9.0), tid=s) for s in range(8) for i in range(50)]
    prof = ingest(_kineto(tmp_path / "t.json", ev))
    assert not prof.anomalies
