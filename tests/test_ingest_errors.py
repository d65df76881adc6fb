"""Bad input → one-line InputError naming the file; never a traceback. Fuzzed with hypothesis."""
from __future__ import annotations

import gzip
import json
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skillrun.errors import InputError
from skillrun.ingest import ingest
from skillrun.models import Profile

FIX = Path(__file__).resolve().parent / "fixtures"
CK = (FIX / "kineto_gfx950_ck_blockscale.synthetic.json").read_bytes()
SEEDS = {
    "kineto": CK,
    "rocprofv3_csv": (FIX / "rocprofv3_kernel_trace_new.synthetic.csv").read_bytes(),
    "rocprof_v1": (FIX / "rocprof_v1_results.synthetic.csv").read_bytes(),
    "nsys_stats": (FIX / "nsys_cuda_gpu_kern_sum.synthetic.csv").read_bytes(),
    "rocpd_db": (FIX / "rocpd.synthetic.db").read_bytes(),
}
_ROCPROF_JSON = json.dumps({"rocprofiler-sdk-tool": [{
    "agents": [{"id": {"handle": 7}, "type": 2, "name": "gfx950", "product_name": "AMD Instinct MI350X",
                "cu_count": 256, "wave_front_size": 64, "logical_node_id": 2}],
    "kernel_symbols": [{"kernel_id": 3, "formatted_kernel_name": "ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)"}],
    "buffer_records": {"kernel_dispatch": [{"start_timestamp": 1000, "end_timestamp": 5000,
                                            "dispatch_info": {"agent_id": {"handle": 7}, "kernel_id": 3,
                                                              "workgroup_size": {"x": 256, "y": 1, "z": 1},
                                                              "grid_size": {"x": 2560, "y": 1, "z": 1}}}]}}]}).encode()
SEEDS["rocprofv3_json"] = _ROCPROF_JSON
SEEDS["ncu_csv"] = (b'==PROF== Connected to process 1\n"ID","Process ID","Process Name","Host Name","Kernel Name",'
                    b'"Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name",'
                    b'"Metric Unit","Metric Value"\n"0","1","p","h","nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN","1","7",'
                    b'"(384, 1, 1)","(2, 66, 1)","0","9.0","SOL","Duration","nsecond","151,328"\n')


def _nsys_db() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "n.sqlite"
        con = sqlite3.connect(p)
        con.executescript("""
            CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, "end" INT, deviceId INT, correlationId INT,
                demangledName INT, shortName INT, gridX INT, gridY INT, gridZ INT, blockX INT, blockY INT,
                blockZ INT, graphNodeId INT);
            CREATE TABLE TARGET_INFO_GPU (id INT, name TEXT, computeMajor INT, computeMinor INT, smCount INT);
            INSERT INTO StringIds VALUES (1, 'nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN');
            INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (100, 251428, 0, 5, 1, 1, 2, 66, 1, 384, 1, 1, NULL);
            INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H200', 9, 0, 132);
        """)
        con.commit()
        con.close()
        return p.read_bytes()


SEEDS["nsys_db"] = _nsys_db()


def _one_line_error(path: Path) -> str:
    with pytest.raises(InputError) as e:
        ingest(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_missing_empty_and_directory(tmp_path):
    assert "not found" in _one_line_error(tmp_path / "nope.json")
    (tmp_path / "e.json").write_bytes(b"")
    assert "empty" in _one_line_error(tmp_path / "e.json")
    (tmp_path / "w.json").write_bytes(b"  \n\t ")
    assert "empty" in _one_line_error(tmp_path / "w.json")
    assert "directory" in _one_line_error(tmp_path)


def test_garbage_and_wrong_json(tmp_path):
    p = tmp_path / "g.bin"
    p.write_bytes(bytes(range(256)) * 10)
    assert "binary" in _one_line_error(p)
    p.write_text("hello, world\nthis is not a trace\n")
    assert "not a recognized" in _one_line_error(p)
    p.write_text('{"traceEvents": 5}')
    assert "traceEvents" in _one_line_error(p)
    p.write_text('"just a string"')
    _one_line_error(p)
    p.write_text("<html><body>nope</body></html>")
    assert "XML" in _one_line_error(p)


def test_truncated_json_and_gzip(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(CK[: len(CK) // 2])
    assert "corrupt or truncated" in _one_line_error(p)
    gz = gzip.compress(CK)
    p.write_bytes(gz[: len(gz) // 2])
    assert "truncated" in _one_line_error(p)
    p.write_bytes(b"\x1f\x8b" + b"\x00" * 64)
    assert "gzip" in _one_line_error(p)


def test_non_profile_sqlite(tmp_path):
    p = tmp_path / "x.db"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (a INTEGER)")
    con.commit()
    con.close()
    assert "not an nsys or rocpd" in _one_line_error(p)


def _check(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "trace"
        p.write_bytes(data)
        try:
            prof = ingest(p)
        except InputError as exc:
            assert "\n" not in str(exc)
            return
        assert isinstance(prof, Profile)
        Profile.model_validate(prof.model_dump(mode="json"))


_FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(seed=st.sampled_from(sorted(SEEDS)), cut=st.floats(0, 1), data=st.data())
def test_fuzz_truncated_and_mutated(seed, cut, data):
    raw = bytearray(SEEDS[seed])
    raw = raw[: int(len(raw) * cut)]
    n = data.draw(st.integers(0, 8))
    for _ in range(n):
        if not raw:
            break
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    _check(bytes(raw))
    if data.draw(st.booleans()):
        _check(gzip.compress(bytes(raw)))


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                     max_leaves=20)
_event = st.fixed_dictionaries({}, optional={
    "ph": st.sampled_from(["X", "i", "s", "f", 3]), "cat": st.sampled_from(["kernel", "cpu_op", "cuda_runtime",
                                                                            "cuda_driver", "python_function", 7]),
    "name": st.text(max_size=10) | st.integers(), "ts": st.floats(allow_nan=False) | st.text(max_size=3),
    "dur": st.floats(allow_nan=False) | st.integers() | st.none(), "tid": st.integers() | st.text(max_size=3),
    "args": st.dictionaries(st.sampled_from(["correlation", "External id", "Input Dims", "Input type", "device",
                                             "grid", "graph id"]), _json, max_size=5) | _json})


@_FUZZ
@given(doc=st.one_of(_json, st.fixed_dictionaries({"traceEvents": st.lists(_event, max_size=12)},
                                                  optional={"deviceProperties": _json})))
def test_fuzz_random_json(doc):
    _check(json.dumps(doc).encode())


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_fuzz_seeds_are_valid_traces(seed, tmp_path):
    p = tmp_path / "seed"
    p.write_bytes(SEEDS[seed])
    prof = ingest(p)
    assert prof.kernels and prof.kernel_calls > 0
    if seed == "nsys_db":
        assert prof.arch == "sm_90" and prof.kernels[0].total_us == pytest.approx(251.328)


def test_sqlite_with_non_utf8_schema_is_one_input_error(tmp_path):
    """Regression (found by the fuzz test on a clean clone): SQLite's error text quoted non-UTF-8
    bytes of a damaged schema and Python's decode of that message escaped as a traceback."""
    import sqlite3

    from skillrun.errors import InputError
    from skillrun.ingest import ingest

    db = tmp_path / "damaged.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE zzzz (x)")
    con.commit()
    con.close()
    # A non-UTF-8 table name in a schema SQLite cannot parse: its error message quotes the name.
    db.write_bytes(db.read_bytes().replace(b"zzzz", b"zz\x80z").replace(b"(x)", b"(x("))
    with pytest.raises(InputError) as err:
        ingest(db)
    assert str(db) in str(err.value)
