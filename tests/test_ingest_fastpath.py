"""The large-file path (byte scanner in worker processes) must give the same Profile as the
simple whole-document path. Chunk sizes are shrunk so that small fixtures span many chunks."""
from __future__ import annotations

import gzip
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import traces_dir
from skillrun.ingest import _kineto_shard, torch_trace

FIX = Path(__file__).resolve().parent / "fixtures"
TRACES = traces_dir()
NAMES = ["nvidia_h200_fp8_scaled_mm_torch2.11.generated.json.gz", "amd_mi300x_qwen1.5-0.5b_bf16.tracelens.json.gz",
         "amd_mi300x_sglang_qwen3-8b_decode_hipgraph.tracelens.json.gz", "nvidia_a100_alexnet_old_int_ts.hta.json.gz",
         "amd_mi250_rocm6.2_minitoy_train.hta.json.gz"]


def _sources() -> list[Path]:
    out = [FIX / "kineto_gfx950_ck_blockscale.synthetic.json"]
    if TRACES is not None:
        out += [TRACES / "pytorch_kineto" / n for n in NAMES]
    return out


def _dump(p):
    d = p.model_dump(mode="json")
    d.pop("source")
    return d


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(_kineto_shard, "READ_SIZE", 48 << 10)
    monkeypatch.setattr(_kineto_shard, "TAIL_MARGIN", 16 << 10)


@pytest.mark.parametrize("src", _sources(), ids=lambda p: p.name)
def test_fast_path_matches_simple_path(src, tmp_path, small_chunks):
    plain = tmp_path / "trace.json"
    if src.suffix == ".gz":
        plain.write_bytes(gzip.decompress(src.read_bytes()))
    else:
        shutil.copy(src, plain)
    simple = torch_trace.ingest_kineto(plain)
    assert torch_trace.LAST_STATS["shards"] == 1
    fast = torch_trace.ingest_kineto(plain, small_limit=0, workers=2)
    stats = dict(torch_trace.LAST_STATS)
    assert stats["shards"] == 2 and stats["fast_chunks"] > 0
    assert _dump(fast) == _dump(simple)


@pytest.mark.parametrize("src", _sources()[:3], ids=lambda p: p.name)
def test_fast_path_on_gzip_overlaps_decompression(src, tmp_path, small_chunks, monkeypatch):
    monkeypatch.setattr(torch_trace, "GZ_RANGE", 64 << 10)  # many ranges even for small fixtures
    raw = gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes()
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(raw, compresslevel=1))
    plain = tmp_path / "t.json"
    plain.write_bytes(raw)
    fast = torch_trace.ingest_kineto(gz, small_limit=0, workers=2)
    assert torch_trace.LAST_STATS["fast_chunks"] > 0
    assert _dump(fast) == _dump(torch_trace.ingest_kineto(plain))
    assert not list(Path(tempfile.gettempdir()).glob("skillrun-trace-*"))


def test_unusual_layout_falls_back_to_full_parse(tmp_path, small_chunks):
    # Keys sorted alphabetically ("args" first): the byte scanner cannot use its layout and
    # must hand every chunk to the full parser, with the same result.
    import json

    src = FIX / "kineto_gfx950_ck_blockscale.synthetic.json"
    doc = json.loads(src.read_text())
    plain = tmp_path / "sorted.json"
    plain.write_text(json.dumps(doc, sort_keys=True, indent=1))
    fast = torch_trace.ingest_kineto(plain, small_limit=0, workers=2)
    assert torch_trace.LAST_STATS["fast_chunks"] == 0
    assert _dump(fast) == _dump(torch_trace.ingest_kineto(src))


def test_truncated_large_file_is_an_input_error(tmp_path, small_chunks):
    from skillrun.errors import InputError

    src = FIX / "kineto_gfx950_ck_blockscale.synthetic.json"
    plain = tmp_path / "t.json"
    data = src.read_bytes()
    plain.write_bytes(data[: len(data) - 300])
    with pytest.raises(InputError) as e:
        torch_trace.ingest_kineto(plain, small_limit=0, workers=2)
    assert str(plain) in str(e.value) and "\n" not in str(e.value)


def test_progress_reports_reach_the_total(tmp_path, small_chunks):
    src = FIX / "kineto_gfx950_ck_blockscale.synthetic.json"
    calls = []
    torch_trace.ingest_kineto(src, small_limit=0, workers=2, progress=lambda d, t: calls.append((d, t)))
    assert calls and calls[-1][0] == calls[-1][1] == src.stat().st_size
    assert calls[0][0] >= _array_offset(src)  # the header was read before the workers started
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))


def _array_offset(p: Path) -> int:
    data = p.read_bytes()
    return data.index(b"[", data.index(b'"traceEvents"')) + 1


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from skillrun.ingest._jsonhead import BadJSON  # noqa: E402

CK = (FIX / "kineto_gfx950_ck_blockscale.synthetic.json").read_bytes()
_BODY = CK[CK.index(b"[", CK.index(b'"traceEvents"')) + 1:]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, len(_BODY)), flips=st.lists(st.tuples(st.integers(0, len(_BODY) - 1), st.integers(0, 255)),
                                                        max_size=6))
def test_fuzz_byte_scanner(cut, flips, small_chunks):
    """The scanner itself (in-process) only ever fails with the errors the reader turns into InputError."""
    raw = bytearray(_BODY)
    for i, v in flips:
        raw[i] = v
    raw = bytes(raw[:cut] if cut < len(raw) and flips == [] else raw)
    prefixes = _kineto_shard.detect_prefixes(raw[:1 << 20])
    shard = _kineto_shard.Shard()
    pos = [0]

    def read(n):
        b = raw[pos[0]:pos[0] + n]
        pos[0] += len(b)
        return b

    try:
        _kineto_shard.scan_stream(shard, read, prefixes, True)
    except (ValueError, BadJSON, _kineto_shard.NoBoundary):
        return
    t = shard.kernel_table()
    assert len(t["kname"]) == len(t["kdur"]) == len(t["kcorr"]) == len(t["launch"])


def test_workers_start_cleanly_while_another_thread_runs(tmp_path, small_chunks):
    """A CLI progress bar keeps a refresh thread alive: workers must then not be forked."""
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert torch_trace._mp_context().get_start_method() != "fork"
        src = FIX / "kineto_gfx950_ck_blockscale.synthetic.json"
        fast = torch_trace.ingest_kineto(src, small_limit=0, workers=2)
    finally:
        stop.set()
        t.join()
    assert _dump(fast) == _dump(torch_trace.ingest_kineto(src))


def test_unsplittable_document_falls_back_to_streaming_parser(tmp_path, monkeypatch):
    """No event boundary within MAX_CARRY bytes: the reader streams the file with ijson instead."""
    monkeypatch.setattr(_kineto_shard, "READ_SIZE", 256)
    monkeypatch.setattr(_kineto_shard, "MAX_CARRY", 128)
    monkeypatch.setattr(_kineto_shard, "TAIL_MARGIN", 64)
    src = FIX / "kineto_gfx950_ck_blockscale.synthetic.json"
    plain = tmp_path / "t.json"
    shutil.copy(src, plain)
    fast = torch_trace.ingest_kineto(plain, small_limit=0, workers=2)
    assert torch_trace.LAST_STATS["shards"] == 1  # the single in-process ijson shard
    assert _dump(fast) == _dump(torch_trace.ingest_kineto(src))
