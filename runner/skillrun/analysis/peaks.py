"""Datasheet ceilings per device and compute dtype: the physical-limit check's only source.

A measured time below ``max(flops / peak_flops, min_bytes / peak_bandwidth)`` cannot be real: the
harness rejects it as a measurement error (a kernel that did not run, a timer that missed the work,
an output that aliased another). The numbers are vendor *datasheet* peaks (dense, no sparsity), the
most any kernel could reach, so the check never rejects a legitimate time; they are not measured
here. Each entry names its source; ``facts/*_hardware.md`` carry the same figures for cards.

The table is injectable (``peaks=`` on the execute functions) so tests can prove the check fires.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DevicePeak:
    name: str  # a label for the entry (what the artifact records)
    match: str  # regex over the device name torch reports (case-insensitive) or its arch
    tflops: dict[str, float]  # compute dtype -> dense TFLOP/s
    gbps: float  # memory bandwidth, GB/s
    source: str
    notes: str = ""

    def flops_peak(self, dtype: str | None) -> tuple[float, str]:
        """(TFLOP/s, the dtype key used). Unknown dtypes get the fastest entry: the check stays safe."""
        key = compute_dtype(dtype)
        if key in self.tflops:
            return self.tflops[key], key
        best = max(self.tflops, key=self.tflops.get)
        return self.tflops[best], best


@dataclass
class PeakTable:
    entries: list[DevicePeak] = field(default_factory=list)

    def lookup(self, device_name: str | None, arch: str | None = None) -> DevicePeak | None:
        for e in self.entries:
            for text in (device_name, arch):
                if text and re.search(e.match, text, re.I):
                    return e
        return None


def compute_dtype(dtype: str | None) -> str | None:
    """The dtype the matrix units run in for a problem dtype (weight-only int4/mxfp4 run in bf16)."""
    if dtype is None:
        return None
    d = dtype.lower()
    if d.startswith("fp8") or d in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2"):
        return "fp8"
    if d in ("bf16", "bfloat16", "int4", "mxfp4", "a16wi4", "w4a16"):
        return "bf16"
    if d in ("fp16", "float16", "half"):
        return "fp16"
    if d in ("fp32", "float32", "tf32"):
        return "tf32"
    if d == "int8":
        return "int8"
    return d


_H100_SOURCE = "NVIDIA H100/H200 Tensor Core GPU datasheets (SXM, dense)"

DEFAULT_PEAKS = PeakTable(
    [
        DevicePeak(
            name="NVIDIA H200 SXM",
            match=r"H200",
            tflops={"fp8": 1979.0, "int8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
            gbps=4800.0,
            source=_H100_SOURCE + "; facts/sm90_hardware.md",
        ),
        DevicePeak(
            name="NVIDIA H100 SXM",
            match=r"H100(?!.*PCIe)",
            tflops={"fp8": 1979.0, "int8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
            gbps=3350.0,
            source=_H100_SOURCE,
        ),
        DevicePeak(
            name="AMD Instinct MI355X (gfx950)",
            match=r"MI355|MI350|gfx950",
            tflops={"fp8": 5000.0, "int8": 5000.0, "bf16": 2500.0, "fp16": 2500.0, "tf32": 1250.0, "fp32": 157.0},
            gbps=8000.0,
            source="AMD Instinct MI355X datasheet (dense); facts/gfx950_hardware.md",
            notes="MI350X has lower clocks: using MI355X peaks keeps the check conservative",
        ),
        DevicePeak(
            name="AMD Instinct MI300X (gfx942)",
            match=r"MI300|MI325|gfx942",
            tflops={"fp8": 2615.0, "int8": 2615.0, "bf16": 1307.0, "fp16": 1307.0, "tf32": 654.0, "fp32": 163.0},
            gbps=6000.0,
            source="AMD Instinct MI300X/MI325X datasheets (dense); facts/gfx942_hardware.md",
            notes="bandwidth is MI325X's 6.0 TB/s (MI300X: 5.3) so one entry stays conservative for both",
        ),
    ]
)


def roofline_pct(tflops: float | None, gbps: float | None, peak_tflops: float | None, peak_gbps: float | None) -> float | None:
    """A measured rate as a share of what the roofline lets it attain at its own arithmetic intensity:
    ``tflops / min(peak_tflops, intensity × peak_gbps)`` with ``intensity = tflops / gbps``, which is
    the larger of its share of the compute peak and its share of the bandwidth. A share of the
    compute peak alone reads a memory-bound kernel at 9 % when it draws 31 % of what HBM allows."""
    vals = (tflops, gbps, peak_tflops, peak_gbps)
    if not all(isinstance(v, (int, float)) and v > 0 for v in vals):
        return None
    return round(100.0 * max(tflops / peak_tflops, gbps / peak_gbps), 3)  # type: ignore[operator]


def no_peak_note(device_name: str | None, arch: str | None) -> str:
    """What the hot-kernel table says when a device has no entry above (a B200, an MI250, an A100):
    its rates stand alone, with no share of peak, no roofline and no bound."""
    if device_name:
        what = device_name + (f" ({arch})" if arch and arch not in device_name else "")
    else:
        what = f"{arch} (the trace names no device)" if arch else "this device (the trace names none)"
    return (f"no peak table for {what}: rates are shown without a share "
            "of peak, a roofline or a bound (skillrun.analysis.peaks lists the devices it knows)")


def floor_ms(flops: float, min_bytes: float, peak: DevicePeak, dtype: str | None) -> dict[str, float | str]:
    """The physical floor for one launch: the slower of the arithmetic and the memory bound."""
    tf, key = peak.flops_peak(dtype)
    compute_ms = flops / (tf * 1e12) * 1e3 if tf > 0 else 0.0
    memory_ms = min_bytes / (peak.gbps * 1e9) * 1e3 if peak.gbps > 0 else 0.0
    return {
        "floor_ms": max(compute_ms, memory_ms),
        "compute_ms": compute_ms,
        "memory_ms": memory_ms,
        "peak_tflops": tf,
        "peak_gbps": peak.gbps,
        "dtype_key": key,
        "bound": "compute" if compute_ms >= memory_ms else "memory",
    }
