"""The hot-kernel table: what a kernel engineer reads first in a profile.

Per kernel: the launching op, the recovered shape and dtype, calls, total and per-call
mean/min/max, and where the shape says how much work a call does, the achieved TFLOP/s (GEMMs)
or input TB/s (memory-bound kernels) with the share of the device's datasheet peak
(:mod:`skillrun.analysis.peaks`). Plus GPU time by category, idle time between kernels and, on a
multi-GPU trace, each device's own totals.

:func:`hot_kernels` is the data (``--json`` and agent tools use it); :func:`render` lays it out
for a terminal of a given width, never letting two different kernels look alike.
"""
from __future__ import annotations

from typing import Any, Optional

from skillrun.analysis.peaks import DEFAULT_PEAKS, PeakTable, no_peak_note
from skillrun.models import KernelStat, OpCall, Profile
from skillrun.ingest.names import CATEGORIES, demangle_many, display_names

# Bytes per element of torch's ``Input type`` spellings (memory-traffic lower bound).
_ELEM_BYTES = {
    "float": 4, "double": 8, "c10::half": 2, "c10::bfloat16": 2, "long int": 8, "long": 8, "int": 4,
    "short int": 2, "short": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::float8_e4m3fn": 1,
    "c10::float8_e4m3fnuz": 1, "c10::float8_e5m2": 1, "c10::float8_e5m2fnuz": 1, "c10::float8_e8m0fnu": 1,
    "c10::float4_e2m1fn_x2": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}
_MAX_ELEMS = 1 << 44  # absurd dims (a hostile trace) are not turned into throughput claims


def _gemm_flops(shape: Optional[dict[str, int]]) -> Optional[float]:
    if not shape or not all(isinstance(shape.get(k), int) and shape[k] > 0 for k in ("M", "N", "K")):
        return None
    b = shape.get("batch") or 1
    if not isinstance(b, int) or b <= 0:
        return None
    return 2.0 * shape["M"] * shape["N"] * shape["K"] * b


def _input_bytes(op: OpCall) -> Optional[float]:
    """Bytes of the tensor inputs of one call: a lower bound on its memory traffic (outputs are
    not in the trace)."""
    total = 0
    seen = False
    for i, dims in enumerate(op.input_dims):
        if not isinstance(dims, list) or not dims or not all(isinstance(d, int) and d >= 0 for d in dims):
            continue
        t = op.input_types[i] if i < len(op.input_types) else None
        size = _ELEM_BYTES.get(str(t).strip().lower()) if t is not None else None
        if size is None:
            continue
        n = 1
        for d in dims:
            n *= d
        if n > _MAX_ELEMS:
            return None
        total += n * size
        seen = True
    return float(total) if seen else None


def _main_op(k: KernelStat) -> Optional[OpCall]:
    with_shape = [o for o in k.ops if o.shape]
    return max(with_shape or k.ops, key=lambda o: o.total_us) if k.ops else None


_ELEM_OF_DTYPE = {"fp8": 1, "int8": 1, "int4": 1, "bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4}


def _gemm_bytes(o: OpCall) -> Optional[float]:
    """Bytes one GEMM call must move at least: its tensor inputs when the trace lists them, else
    A, B and C at the input width from the recovered shape."""
    b = _input_bytes(o) if o.provenance == "trace" else None
    if b:
        return b
    sh = o.shape or {}
    if not all(isinstance(sh.get(x), int) and sh[x] > 0 for x in ("M", "N", "K")):
        return None
    key = (o.dtype or "").split("_", 1)[0]
    e = _ELEM_OF_DTYPE.get(key)
    if e is None:
        return None
    batch = sh.get("batch") or 1
    return float(batch * (sh["M"] * sh["K"] + sh["K"] * sh["N"] + sh["M"] * sh["N"]) * e)


def _roofline(out: dict[str, Any], tflops: float, intensity: Optional[float], peak) -> None:
    """Add the roofline's view of a GEMM rate: what is attainable at its arithmetic intensity on this
    device, min(compute peak, intensity × bandwidth), the rate as a share of that, and the bound.

    A share of the *compute* peak alone says nothing of a memory-bound GEMM (an M=64 decode GEMM at
    31 % of what its intensity allows read 9 % of peak). Without the bytes (no intensity) the
    attainable rate is unknown and only the share of the compute peak is given."""
    pk = out.get("peak_tflops")
    if not pk or intensity is None or not peak.gbps:
        return
    mem_roof = intensity * peak.gbps / 1e3  # FLOP/byte × GB/s = GFLOP/s → TFLOP/s
    attainable = min(pk, mem_roof)
    out.update(flop_per_byte=round(intensity, 1), ridge_flop_per_byte=round(pk * 1e12 / (peak.gbps * 1e9), 1),
               bound="compute" if mem_roof >= pk else "memory", attainable_tflops=round(attainable, 2))
    pct = 100.0 * tflops / attainable if attainable > 0 else None
    if pct is not None and pct > 100.0:
        # Faster than HBM could feed it at this intensity: the inputs were (partly) in L2 already.
        out.update(pct_attainable=None, above_roofline=True,
                   note=f"{pct:.0f}% of the HBM roofline: its inputs were likely served from cache (L2), not HBM")
    else:
        out["pct_attainable"] = round(pct, 1) if pct is not None else None


def _rate(k_category: str, ops: list[OpCall], peak, dtype: Optional[str]) -> dict[str, Any]:
    """TFLOP/s (GEMM) or input TB/s over ``ops`` (calls of one kernel), the share of what the device
    can attain at that arithmetic intensity (the roofline, see :func:`_roofline`) and the bound.

    ``pct_attainable`` is the share of the roofline (what the table shows); ``pct_peak`` stays the
    share of the datasheet's compute peak (GEMMs) or bandwidth (memory-bound kernels).

    A rate above the device's peak cannot be real: the work model does not fit the kernel (a
    gather reads a few rows of the table it is given, a fused kernel skips an input), so the rate
    is replaced by ``model_na`` with the reason, never shown as a fact."""
    out: dict[str, Any] = {}
    if k_category == "gemm":
        flops = time = nbytes = 0.0
        bytes_known = True
        for o in ops:
            f = _gemm_flops(o.shape)
            if f is not None and o.total_us > 0:
                flops += f * o.calls
                time += o.total_us
                b = _gemm_bytes(o)
                if b is None:
                    bytes_known = False
                else:
                    nbytes += b * o.calls
        if time <= 0:
            return {}
        tflops = flops / (time * 1e-6) / 1e12
        out = {"tflops": round(tflops, 2), "basis": "2·M·N·K per call from the recovered shape"}
        known = bytes_known and nbytes > 0
        if known:
            # the bandwidth the GEMM drew (a lower bound: each byte counted once): what a decode GEMM is judged by
            out["tbps"] = round(nbytes / (time * 1e-6) / 1e12, 3)
        if peak is not None:
            pk, key = peak.flops_peak(dtype)
            out.update(peak_tflops=pk, peak_dtype=key, pct_peak=round(100.0 * tflops / pk, 1) if pk else None,
                       peak_device=peak.name)
            _roofline(out, tflops, flops / nbytes if known else None, peak)
    elif k_category in ("elementwise", "reduction", "memcpy"):
        nbytes = time = 0.0
        for o in ops:
            b = _input_bytes(o)
            if b is not None and o.total_us > 0 and o.provenance == "trace":
                nbytes += b * o.calls
                time += o.total_us
        if time <= 0 or nbytes <= 0:
            return {}
        tbps = nbytes / (time * 1e-6) / 1e12
        out = {"tbps": round(tbps, 3), "basis": "tensor inputs read per call (a lower bound: outputs are not in the trace)"}
        if peak is not None and peak.gbps:
            pct = round(100.0 * tbps / (peak.gbps / 1e3), 1)
            # A few FLOPs per element at most: far below any GPU's ridge point, so the roof is the bandwidth.
            out.update(peak_tbps=peak.gbps / 1e3, pct_peak=pct, pct_attainable=pct, attainable_tbps=peak.gbps / 1e3,
                       peak_device=peak.name, bound="memory")
    else:
        return {}
    pct = out.get("pct_peak")
    if pct is not None and pct > 100.0:
        unit = "TFLOP/s" if k_category == "gemm" else "TB/s"
        value = out.pop("tflops", None) if k_category == "gemm" else out.pop("tbps", None)
        for key in ("tbps", "pct_peak", "pct_attainable", "bound", "attainable_tflops", "attainable_tbps", "above_roofline", "note"):
            out.pop(key, None)
        out.update(model_na=True, model_value=value,
                   reason=f"the work model gives {value} {unit}, {pct:.0f}% of the {peak.name} peak: "
                          "impossible, so the model does not fit this kernel (e.g. it reads only part of an input)")
    return out


def _achieved(k: KernelStat, peak, dtype: Optional[str]) -> dict[str, Any]:
    """The kernel's rate over all its calls whose shape is known (see :func:`_rate`)."""
    return _rate(k.category, k.ops, peak, dtype)


def _shape_rows(k: KernelStat, peak) -> list[dict[str, Any]]:
    """One row per launching op and argument shapes of a kernel, its share of the kernel's time
    and its own rate: a kernel that ran four GEMM shapes has four rates, not one blended one."""
    rows = []
    for o in k.ops:
        if o.calls <= 0:
            continue
        frac = o.total_us / k.total_us if k.total_us > 0 else 0.0
        rows.append({
            "op": o.op, "shape": o.shape, "dtype": o.dtype,
            "input_dims": o.input_dims if not o.shape else None,
            "shape_provenance": o.provenance, "calls": o.calls,
            "total_ms": round(o.total_us / 1e3, 4), "mean_us": round(o.total_us / o.calls, 3),
            "pct_of_kernel": round(100.0 * frac, 2), "pct_gpu": round(k.pct_gpu * frac, 3),
            "achieved": _rate(k.category, [o], peak, o.dtype),
        })
    rows.sort(key=lambda r: -r["total_ms"])
    # Calls no op with shapes was linked to (graph replays, user kernels): shown, so the rows add up.
    rest_calls = k.calls - sum(o.calls for o in k.ops)
    rest_us = k.total_us - sum(o.total_us for o in k.ops)
    if rows and rest_calls > 0 and rest_us > 0:
        frac = rest_us / k.total_us
        rows.append({"op": None, "shape": None, "dtype": None, "input_dims": None, "shape_provenance": "unresolved",
                     "calls": rest_calls, "total_ms": round(rest_us / 1e3, 4), "mean_us": round(rest_us / rest_calls, 3),
                     "pct_of_kernel": round(100.0 * frac, 2), "pct_gpu": round(k.pct_gpu * frac, 3), "achieved": {}})
    return rows


def _device_of(profile: Profile, k: KernelStat):
    dev = next((d for d in profile.devices if k.device is not None and d.index == k.device), None)
    return dev if dev is not None else (profile.devices[0] if profile.devices else None)


def _grid_unit(profile: Profile, k: KernelStat) -> Optional[str]:
    """What a grid counts: every reader converts to launch groups (rocprof's and HIP's work-item grids
    are divided by the workgroup size), called blocks on NVIDIA and workgroups on AMD."""
    if not k.grid:
        return None
    dev = _device_of(profile, k)
    arch = (dev.arch if dev else None) or profile.arch or ""
    vendor = (dev.vendor if dev else None) or ("amd" if arch.startswith("gfx") else "nvidia" if arch.startswith("sm_") else None)
    return {"amd": "workgroups", "nvidia": "blocks"}.get(vendor or "")


def _peak_for(profile: Profile, k: KernelStat, peaks: PeakTable):
    dev = _device_of(profile, k)
    return peaks.lookup(dev.name if dev else None, (dev.arch if dev else None) or profile.arch)


def hot_kernels(profile: Profile, top: Optional[int] = 20, peaks: PeakTable = DEFAULT_PEAKS) -> dict[str, Any]:
    """The table as data: ``kernels`` (ranked rows), ``categories`` and ``devices`` breakdowns."""
    kernels = profile.kernels[:top] if top else profile.kernels
    dem = demangle_many([k.name for k in kernels if k.demangled is None and k.name.startswith("_Z")])
    rows = []
    peak_notes: list[str] = []
    for i, k in enumerate(kernels, 1):
        op = _main_op(k)
        dtype = op.dtype if op else None
        peak = _peak_for(profile, k, peaks)
        if peak is None:
            dev = _device_of(profile, k)
            note = no_peak_note(dev.name if dev else None, (dev.arch if dev else None) or profile.arch)
            if note not in peak_notes:
                peak_notes.append(note)
        demangled = k.demangled or (dem.get(k.name) if dem.get(k.name) != k.name else None)
        rows.append({
            "rank": i, "name": k.name, "demangled": demangled, "short_name": k.short_name, "category": k.category,
            "pct_gpu": round(k.pct_gpu, 3), "total_ms": round(k.total_us / 1e3, 4), "calls": k.calls,
            "mean_us": round(k.avg_us, 3), "min_us": k.min_us, "max_us": k.max_us,
            "median_us": k.median_us, "std_us": k.std_us,
            "grid": k.grid, "grid_unit": _grid_unit(profile, k), "block": k.block, "launch": dict(k.launch),
            "metrics": dict(k.metrics),
            "op": op.op if op else None, "shape": op.shape if op else None, "dtype": dtype,
            "input_dims": op.input_dims if op and not op.shape else None,
            "shape_provenance": k.shape_provenance, "device": k.device,
            "device_pct": {str(d): p for d, p in k.device_pct.items()},
            "achieved": _achieved(k, peak, dtype),
            "shapes": _shape_rows(k, peak),
            "offered_to_cards": k.category != "communication",
        })
    total = profile.total_kernel_us
    cats = [{"category": c, "ms": round(profile.category_us.get(c, 0.0) / 1e3, 4),
             "pct": round(100.0 * profile.category_us.get(c, 0.0) / total, 2) if total else 0.0}
            for c in CATEGORIES if profile.category_us.get(c)]
    all_kernel = sum(d.kernel_us for d in profile.device_time) or total
    devices = []
    for d in profile.device_time:
        row: dict[str, Any] = {"device": d.device, "kernel_ms": round(d.kernel_us / 1e3, 4), "calls": d.calls,
                               "pct_of_all_kernel_time": round(100.0 * d.kernel_us / all_kernel, 2) if all_kernel else 0.0}
        if d.span_us:
            row.update(busy_ms=round((d.busy_us or 0) / 1e3, 4), span_ms=round(d.span_us / 1e3, 4),
                       idle_ms=round((d.idle_us or 0) / 1e3, 4),
                       idle_pct=round(100.0 * (d.idle_us or 0) / d.span_us, 2))
        devices.append(row)
    return {"kernels": rows, "categories": cats, "devices": devices, "peak_notes": peak_notes,
            "listed_devices": len(profile.devices), "total_kernel_ms": round(total / 1e3, 4),
            "total_calls": profile.kernel_calls, "kernel_count": len(profile.kernels)}


# ------------------------------------------------------------------------------------ rendering
def _fmt_us(v: Optional[float]) -> str:
    """A microsecond count in at most 7 characters (k = thousand µs, so the column keeps its unit)."""
    if v is None:
        return "—"
    if v >= 1e7:
        return f"{v / 1e6:.0f}M"
    if v >= 1e5:
        return f"{v / 1e3:.0f}k"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def _fmt_dur(v: Optional[float]) -> str:
    """A duration given in µs, with its unit (µs below a millisecond, else ms or s)."""
    if v is None:
        return "—"
    if v >= 1e6:
        return f"{v / 1e6:.3g} s"
    if v >= 1e3:
        return f"{v / 1e3:.3g} ms"
    return f"{v:.3g} µs"


def _fmt_shape(shape: Optional[dict[str, int]]) -> str:
    if not shape:
        return ""
    return "×".join(f"{k}{v}" if k not in ("M", "N", "K") else str(v) for k, v in shape.items()) \
        if all(k in ("M", "N", "K") for k in shape) else ",".join(f"{k}={v}" for k, v in shape.items())


def _fmt_rate(a: dict[str, Any]) -> str:
    """A memory-bound row's rate is its bandwidth (what limits it), a compute-bound one's its TFLOP/s."""
    if "tflops" in a and not (a.get("bound") == "memory" and a.get("tbps") is not None):
        return f"{a['tflops']:.0f} TF/s" if a["tflops"] >= 10 else f"{a['tflops']:.2f} TF/s"
    return f"{a['tbps']:.2f} TB/s" if "tflops" in a else f"≥{a['tbps']:.2f} TB/s"


def _fmt_achieved(a: dict[str, Any]) -> str:
    """The table cell: rate, share of the roofline-attainable rate, bound (``pk``: share of the compute
    peak, the bytes being unknown; ``>roof``: above the HBM roofline, served from cache)."""
    if not a:
        return ""
    if a.get("model_na"):
        return "model n/a"
    s = _fmt_rate(a)
    if a.get("above_roofline"):
        return s + " >roof"
    if a.get("pct_attainable") is not None:
        s += f" {a['pct_attainable']:.0f}%"
    elif a.get("pct_peak") is not None:
        return s + f" {a['pct_peak']:.0f}% pk"
    if a.get("bound"):
        s += " " + ("cmp" if a["bound"] == "compute" else "mem")
    return s


def _achieved_parts(a: dict[str, Any]) -> list[str]:
    """The rate in words, for the detail lines (bound spelled out; a model error said plainly)."""
    if not a:
        return []
    if a.get("model_na"):
        return ["rate: model n/a", "the work model gives more than the device peak"]
    parts = [f"{a['tflops']:.0f} TF/s" if a["tflops"] >= 10 else f"{a['tflops']:.2f} TF/s"] if "tflops" in a else []
    if a.get("tbps") is not None:
        parts.append(("" if "tflops" in a else "≥") + f"{a['tbps']:.2f} TB/s")
    bound = f"{a['bound']}-bound" if a.get("bound") else ""
    if a.get("above_roofline"):
        parts.append(a.get("note") or "above the HBM roofline")
    elif a.get("pct_attainable") is not None:
        roof = (f" ({a['attainable_tflops']:.0f} TF/s)" if a.get("bound") == "memory" and a.get("attainable_tflops") is not None
                else "")
        parts.append(f"{a['pct_attainable']:.0f}% of roofline{roof}" + (f", {bound}" if bound else ""))
        bound = ""
    elif a.get("pct_peak") is not None:
        parts.append(f"{a['pct_peak']:.0f}% of compute peak (bytes unknown)")
    if bound:
        parts.append(bound)
    return parts


def _shape_text(r: dict[str, Any]) -> str:
    """``op dims dtype`` of a kernel row or a shape row."""
    if not r.get("op"):
        return ""
    dims = _fmt_shape(r["shape"]) if r.get("shape") else _dims_text(r.get("input_dims"))
    return r["op"] + (" " + dims if dims else "") + (" " + r["dtype"] if r.get("dtype") else "")


_LAUNCH_WORDS = (("registers_per_thread", "regs/thread", ""), ("vgprs", "VGPRs", ""), ("agprs", "AGPRs", ""),
                 ("sgprs", "SGPRs", ""), ("shared_mem_bytes", "shared", " B"), ("lds_bytes", "LDS", " B"),
                 ("scratch_bytes", "scratch", " B"), ("local_mem_per_thread", "local/thread", " B"))


def launch_text(r: dict[str, Any]) -> str:
    """Grid, block and the launch facts the trace carries, in one line (``--details``)."""
    parts = []
    if r.get("grid"):
        parts.append("grid " + "×".join(str(v) for v in r["grid"]) + (f" {r['grid_unit']}" if r.get("grid_unit") else ""))
    if r.get("block"):
        parts.append("block " + "×".join(str(v) for v in r["block"]))
    launch = r.get("launch") or {}
    parts += [f"{word} {launch[key]}{unit}" for key, word, unit in _LAUNCH_WORDS if key in launch]
    m = r.get("metrics") or {}
    parts += [f"{word} {_num(m[key])}{unit}" for key, word, unit in _METRIC_WORDS if key in m]
    if m:
        parts.append(f"{len(m)} profiler metrics in --json")
    return ", ".join(parts)


# ncu's headline numbers (Speed Of Light, occupancy, waves) in the --details line; --json has all of them.
_METRIC_WORDS = (("GPU Speed Of Light Throughput: Compute (SM) Throughput [%]", "SM throughput", "%"),
                 ("GPU Speed Of Light Throughput: Memory Throughput [%]", "memory throughput", "%"),
                 ("GPU Speed Of Light Throughput: DRAM Throughput [%]", "DRAM", "%"),
                 ("Occupancy: Achieved Occupancy [%]", "achieved occupancy", "%"),
                 ("Occupancy: Theoretical Occupancy [%]", "theoretical", "%"),
                 ("Launch Statistics: Waves Per SM", "waves/SM", ""))


def _num(v: float) -> str:
    return f"{v:.0f}" if v == int(v) else f"{v:.3g}"


def _split(r: dict[str, Any]) -> bool:
    """A kernel that ran more than one shape gets a row per shape under its own."""
    return len(r.get("shapes") or []) > 1


def _detail(r: dict[str, Any], with_minmax: bool, with_achieved: bool, with_cat: bool) -> list[str]:
    parts = []
    if with_cat:
        parts.append(r["category"] + ("" if r["offered_to_cards"] else " (no card)"))
    if r["op"] and not _split(r):
        parts.append(_shape_text(r))
    elif _split(r):
        n = sum(1 for x in r["shapes"] if x["op"])
        parts.append(f"{n} shape{'s' if n != 1 else ''} (rows below)")
    if with_minmax and r["min_us"] is not None:
        parts.append(f"min {_fmt_dur(r['min_us'])} max {_fmt_dur(r['max_us'])}")
    if with_minmax and r.get("median_us") is not None:
        parts.append(f"median {_fmt_dur(r['median_us'])}" + (f" sd {_fmt_dur(r['std_us'])}" if r.get("std_us") is not None else ""))
    elif with_minmax and r.get("std_us") is not None:
        parts.append(f"sd {_fmt_dur(r['std_us'])}")
    if with_achieved and r["achieved"] and not _split(r):
        parts += _achieved_parts(r["achieved"])
    return parts


def _pack(parts: list[str], width: int) -> list[str]:
    """Detail parts joined with ' · ' into lines of at most ``width``; a part too long for a line is
    wrapped at its spaces (a shape or a dtype is never cut), only a single word longer than a whole
    line is cut."""
    lines: list[str] = []
    cur = ""
    for p in parts:
        if len(p) > width:
            if cur:
                lines.append(cur)
                cur = ""
            for w in p.split(" "):
                w = w if len(w) <= width else w[: max(1, width - 1)] + "…"
                if cur and len(cur) + 1 + len(w) > width:
                    lines.append(cur)
                    cur = w
                else:
                    cur = f"{cur} {w}" if cur else w
            lines.append(cur)
            cur = ""
            continue
        if cur and len(cur) + 3 + len(p) > width:
            lines.append(cur)
            cur = p
        else:
            cur = f"{cur} · {p}" if cur else p
    if cur:
        lines.append(cur)
    return lines


def breakdown_lines(data: dict[str, Any], with_total: bool = True) -> list[str]:
    """The total, one line of GPU time by category, one of idle time (per device when there are several)."""
    lines = []
    if with_total and "total_calls" in data:
        # The denominator of every % GPU below (per device on a multi-GPU trace, listed there).
        lines.append(f"GPU kernel time: {data['total_kernel_ms']:.3f} ms in {data['total_calls']} calls of "
                     f"{data['kernel_count']} kernels")
    for note in data.get("peak_notes") or []:
        lines.append(note)
    if data["categories"]:
        lines.append("GPU time by category: " + " · ".join(f"{c['category']} {c['pct']:.1f}%" for c in data["categories"]))
    devs = data["devices"]
    timed = [d for d in devs if "span_ms" in d]
    if len(devs) > 1:
        head = f"{len(devs)} devices ran kernels" + (f" (of {data['listed_devices']} listed)" if data["listed_devices"] > len(devs) else "")
        lines.append(head + "; each device's time is its own 100%:")
        for d in devs:
            s = f"  GPU{d['device']}: {d['kernel_ms']:.3f} ms kernel time ({d['pct_of_all_kernel_time']:.1f}% of all), {d['calls']} calls"
            if "span_ms" in d:
                s += f", idle {d['idle_ms']:.3f} of {d['span_ms']:.3f} ms ({d['idle_pct']:.1f}%)"
            lines.append(s)
    elif timed:
        d = timed[0]
        extra = f" (kernels ran on GPU{d['device']}, one of {data['listed_devices']} listed)" if data["listed_devices"] > 1 else ""
        lines.append(f"idle between kernels: {d['idle_ms']:.3f} ms of a {d['span_ms']:.3f} ms span ({d['idle_pct']:.1f}%){extra}")
    elif devs and data["listed_devices"] > 1:
        lines.append(f"kernels ran on GPU{devs[0]['device']}, one of {data['listed_devices']} listed")
    return lines


def _label(r: dict[str, Any]) -> str:
    """The name a reader wants: demangled, without rocprof's code-object suffixes."""
    s = r["demangled"] or r["name"]
    for suffix in (" [clone .kd]", ".kd"):
        if s.endswith(suffix):
            s = s[: -len(suffix)]
    return s


def _dims_text(dims: Any) -> str:
    if not isinstance(dims, list):
        return ""
    shown = ["×".join(str(d) for d in x) for x in dims[:3] if isinstance(x, list) and x and all(isinstance(d, int) for d in x)]
    return ("[" + ", ".join(shown) + "]") if shown else ""


def render(data: dict[str, Any], width: int, wide: bool = False, title: Optional[str] = None, details: bool = False):
    """A rich Table that fits ``width`` columns (``wide``: names whole, the table as wide as it needs;
    ``details``: each kernel's launch facts under it)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from skillrun.io.termtext import plain

    rows = data["kernels"]
    big = width >= 120
    cols = [("#", 3), ("% GPU", 6), ("total ms", 9), ("calls", 6), ("mean µs", 7)]
    if big:
        cols += [("med µs", 7), ("sd µs", 7), ("min µs", 7), ("max µs", 7), ("achieved", 19)]
    fixed = sum(w for _, w in cols) + 2 * (len(cols) + 1)
    name_w = max(24, width - fixed - 1)
    labels = [_label(r) for r in rows]
    shown = labels if wide else display_names(labels, name_w)
    legend = None
    if big and any((r["achieved"] or {}).get("bound") or any(x["achieved"].get("bound") for x in r.get("shapes") or [])
                   for r in rows):
        legend = ("achieved: the rate and its share of the roofline, min(peak, FLOP/byte × bandwidth) at the row's "
                  "intensity; cmp/mem: compute- or memory-bound (memory-bound rows in TB/s); pk: share of the compute "
                  "peak where the bytes are unknown")
    t = Table(title=title, caption=legend, box=box.SIMPLE_HEAD, padding=(0, 1), expand=False, title_justify="left",
              caption_justify="left", show_edge=False, pad_edge=False)
    for c, w in cols:
        t.add_column(c, justify="right", no_wrap=True, min_width=min(w, len(c)))
    t.add_column("kernel" + ("" if wide else " (--wide: whole names)"), justify="left",
                 no_wrap=True, overflow="ignore" if wide else "ellipsis", max_width=None if wide else name_w)
    for r, name in zip(rows, shown):
        cells = [str(r["rank"]), f"{r['pct_gpu']:.2f}", f"{r['total_ms']:.3f}", str(r["calls"]), _fmt_us(r["mean_us"])]
        if big:
            cells += [_fmt_us(r.get("median_us")), _fmt_us(r.get("std_us")), _fmt_us(r["min_us"]), _fmt_us(r["max_us"]),
                      _fmt_achieved(r["achieved"]) or "—"]
        cell = Text(plain(name))
        if r["short_name"] and r["short_name"] not in name and (wide or len(name) + len(r["short_name"]) + 4 <= name_w):
            cell.append(f"  [{plain(r['short_name'])}]", style="cyan")
        parts = [plain(p) for p in _detail(r, with_minmax=not big, with_achieved=not big, with_cat=True)]
        if details and launch_text(r):
            parts += [plain(x) for x in launch_text(r).split(", ")]
        for line in (_pack(parts, name_w - 2) if not wide else [" · ".join(parts)] if parts else []):
            cell.append("\n  " + line, style="dim")
        t.add_row(*cells, cell)
        if _split(r):
            for sr in r["shapes"]:
                sub = ["", f"{sr['pct_gpu']:.2f}", f"{sr['total_ms']:.3f}", str(sr["calls"]), _fmt_us(sr["mean_us"])]
                if big:
                    sub += ["", "", "", "", _fmt_achieved(sr["achieved"]) or "—"]
                sparts = ["↳ " + plain(_shape_text(sr) or "calls with no recovered shape")]
                if not big:
                    sparts += [plain(p) for p in _achieved_parts(sr["achieved"])]
                lines = [" · ".join(sparts)] if wide else _pack(sparts, name_w - 4)
                t.add_row(*sub, Text("  " + "\n    ".join(lines), style="dim"))
    return t
