"""A graph-*capture* trace is said plainly (its launches ran nothing), and a trace whose
deviceProperties carry only HIP's compute capability still gets its arch."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import traces_dir

from skillrun.ingest import ingest, torch_trace

TRACES = traces_dir() or Path("/nonexistent")
needs_traces = pytest.mark.skipif(traces_dir() is None, reason="../shared/traces is not present (set SKILLRUN_TRACES)")
MI300 = TRACES / "pytorch_kineto" / "amd_mi300x_qwen1.5-0.5b_bf16.tracelens.json.gz"
CAPTURED = 40


def _capture_trace(tmp_path: Path) -> tuple[Path, int]:
    """The real MI300X trace, turned into what a capture records: hipStreamBeginCapture … EndCapture
    around 40 consecutive hipLaunchKernel calls of one thread, whose kernels therefore never ran;
    deviceProperties keep only HIP's numbers (compute 9.4, warp 64, 304 CUs), as the vLLM capture
    trace does."""
    doc = json.loads(gzip.decompress(MI300.read_bytes()))
    ev = doc["traceEvents"]
    launches = sorted((e for e in ev if e.get("cat") == "cuda_runtime" and e.get("name") == "hipLaunchKernel"),
                      key=lambda e: e["ts"])
    tid = launches[100]["tid"]
    block = [e for e in launches if e["tid"] == tid][100:100 + CAPTURED]
    lo, hi = block[0]["ts"], block[-1]["ts"]
    # Every kernel launch of the thread in that window is captured (hipLaunchKernel, hipExtModuleLaunchKernel, …).
    inside = [e for e in ev if e.get("cat") == "cuda_runtime" and "Launch" in e.get("name", "") and e["tid"] == tid
              and lo <= e["ts"] <= hi]
    corrs = {e["args"]["correlation"] for e in inside}
    executed = [e for e in ev if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") not in corrs]
    dropped = sum(1 for e in ev if e.get("cat") == "kernel") - len(executed)
    keep = [e for e in ev if not (e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in corrs)]
    pid = block[0]["pid"]
    keep.append({"ph": "X", "cat": "cuda_runtime", "name": "hipStreamBeginCapture", "pid": pid, "tid": tid,
                 "ts": block[0]["ts"] - 1.0, "dur": 0.5, "args": {"correlation": 9_000_001}})
    keep.append({"ph": "X", "cat": "cuda_runtime", "name": "hipStreamEndCapture", "pid": pid, "tid": tid,
                 "ts": block[-1]["ts"] + block[-1]["dur"] + 1.0, "dur": 0.5, "args": {"correlation": 9_000_002}})
    doc["traceEvents"] = keep
    props = doc["deviceProperties"][0]
    props.pop("name", None)
    props.pop("gcnArchName", None)
    p = tmp_path / "capture.json"
    p.write_text(json.dumps(doc))
    return p, dropped, len(inside)


@needs_traces
def test_capture_trace_is_detected_and_said(tmp_path):
    path, dropped, inside = _capture_trace(tmp_path)
    assert dropped >= CAPTURED and inside >= CAPTURED  # those launches had run kernels in the original trace
    prof = ingest(path)
    cap = prof.graph_capture
    assert cap.detected and cap.captures == 1 and cap.captured_launches == inside
    warn = next(w for w in prof.warnings if w.startswith("graph capture"))
    assert f"{inside} kernel launch(es) inside" in warn and f"{prof.kernel_calls} kernel executions" in warn
    # The fast (sharded, raw-byte) reader finds the same capture.
    fast = torch_trace.ingest_kineto(path, small_limit=0, workers=2)
    assert fast.graph_capture == cap


@needs_traces
def test_arch_from_hip_compute_capability_in_device_properties(tmp_path):
    path, _, _ = _capture_trace(tmp_path)
    prof = ingest(path)
    assert prof.arch == "gfx942" and prof.devices[0].vendor == "amd"
    assert any("compute capability 9.4" in w and "304 CUs" in w for w in prof.warnings)


@needs_traces
def test_ordinary_traces_are_not_captures():
    for name in ("amd_mi300x_qwen1.5-0.5b_bf16.tracelens.json.gz", "nvidia_h200_fp8_scaled_mm_torch2.11.generated.json.gz"):
        prof = ingest(TRACES / "pytorch_kineto" / name)
        assert not prof.graph_capture.detected and not any(w.startswith("graph capture") for w in prof.warnings)


@pytest.mark.parametrize("major, minor, cus, arch", [(9, 4, 304, "gfx942"), (9, 5, 256, "gfx950"),
                                                     (9, 0, 104, "gfx90a"), (9, 0, 120, "gfx908"), (9, 0, 7, None)])
def test_amd_arch_from_compute(major, minor, cus, arch):
    from skillrun.ingest.arch import amd_arch_from_compute

    assert amd_arch_from_compute(major, minor, cus) == arch
