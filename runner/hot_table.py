"""The hot-kernel table: what a kernel engineer reads first in a profile.

Per kernel: the launching op, the recovered shape and dtype, calls, total and per-call
mean/min/max, and where the shape says how much work a call does, the achieved TFLOP/s (GEMMs)
or input TB/s (memory-bound kernels) with the share of the device's datasheet peak
(:mod:`skillrun.peaks`). Plus GPU time by category, idle time between kernels and, on a
multi-GPU trace, each device's own totals.

:func:`hot_kernels` is the data (``--json`` and agent tools use it); :func:`render` lays it out
for a terminal of a given width, never letting two different kernels look alike.
"""
from __future__ import annotations

from typing import Any, Optional

from skillrun.peaks import DEFAULT_PEAKS, PeakTable
from skillrun.models import KernelStat, OpCall, Profile
from skillrun.names import CATEGORIES, demangle_many, display_names

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


def _achieved(k: KernelStat, peak, dtype: Optional[str]) -> dict[str, Any]:
    """TFLOP/s (GEMM) or input TB/s over the calls whose shape is known, and % of the peak."""
    if k.category == "gemm":
        flops = time = 0.0
        for o in k.ops:
            f = _gemm_flops(o.shape)
            if f is not None and o.total_us > 0:
                flops += f * o.calls
                time += o.total_us
        if time > 0:
            tflops = flops / (time * 1e-6) / 1e12
            out: dict[str, Any] = {"tflops": round(tflops, 2), "basis": "2·M·N·K per call from the recovered shape"}
            if peak is not None:
                pk, key = peak.flops_peak(dtype)
                out.update(peak_tflops=pk, peak_dtype=key, pct_peak=round(100.0 * tflops / pk, 1) if pk else None,
                           peak_device=peak.name)
            return out
        return {}
    if k.category in ("elementwise", "reduction", "memcpy"):
        nbytes = time = 0.0
        for o in k.ops:
            b = _input_bytes(o)
            if b is not None and o.total_us > 0 and o.provenance == "trace":
                nbytes += b * o.calls
                time += o.total_us
        if time > 0 and nbytes > 0:
            tbps = nbytes / (time * 1e-6) / 1e12
            out = {"tbps": round(tbps, 3), "basis": "tensor inputs read per call (a lower bound: outputs are not in the trace)"}
            if peak is not None and peak.gbps:
                out.update(peak_tbps=peak.gbps / 1e3, pct_peak=round(100.0 * tbps / (peak.gbps / 1e3), 1),
                           peak_device=peak.name)
            return out
    return {}


def _peak_for(profile: Profile, k: KernelStat, peaks: PeakTable):
    dev = next((d for d in profile.devices if k.device is not None and d.index == k.device), None)
    if dev is None and profile.devices:
        dev = profile.devices[0]
    return peaks.lookup(dev.name if dev else None, (dev.arch if dev else None) or profile.arch)


def hot_kernels(profile: Profile, top: Optional[int] = 20, peaks: PeakTable = DEFAULT_PEAKS) -> dict[str, Any]:
    """The table as data: ``kernels`` (ranked rows), ``categories`` and ``devices`` breakdowns."""
    kernels = profile.kernels[:top] if top else profile.kernels
    dem = demangle_many([k.name for k in kernels if k.demangled is None and k.name.startswith("_Z")])
    rows = []
    for i, k in enumerate(kernels, 1):
        op = _main_op(k)
        dtype = op.dtype if op else None
        peak = _peak_for(profile, k, peaks)
        demangled = k.demangled or (dem.get(k.name) if dem.get(k.name) != k.name else None)
        rows.append({
            "rank": i, "name": k.name, "demangled": demangled, "short_name": k.short_name, "category": k.category,
            "pct_gpu": round(k.pct_gpu, 3), "total_ms": round(k.total_us / 1e3, 4), "calls": k.calls,
            "mean_us": round(k.avg_us, 3), "min_us": k.min_us, "max_us": k.max_us,
            "op": op.op if op else None, "shape": op.shape if op else None, "dtype": dtype,
            "input_dims": op.input_dims if op and not op.shape else None,
            "shape_provenance": k.shape_provenance, "device": k.device,
            "device_pct": {str(d): p for d, p in k.device_pct.items()},
            "achieved": _achieved(k, peak, dtype),
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
    return {"kernels": rows, "categories": cats, "devices": devices,
            "listed_devices": len(profile.devices), "total_kernel_ms": round(total / 1e3, 4)}


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


def _fmt_achieved(a: dict[str, Any]) -> str:
    if not a:
        return ""
    if "tflops" in a:
        s = f"{a['tflops']:.0f} TF/s" if a["tflops"] >= 10 else f"{a['tflops']:.2f} TF/s"
    else:
        s = f"≥{a['tbps']:.2f} TB/s"
    if a.get("pct_peak") is not None:
        s += f" {a['pct_peak']:.0f}%"
    return s


def _detail(r: dict[str, Any], with_minmax: bool, with_achieved: bool, with_cat: bool) -> list[str]:
    parts = []
    if with_cat:
        parts.append(r["category"] + ("" if r["offered_to_cards"] else " (no card)"))
    if r["op"]:
        dims = _fmt_shape(r["shape"]) if r["shape"] else _dims_text(r.get("input_dims"))
        op = r["op"] + (" " + dims if dims else "") + (" " + r["dtype"] if r["dtype"] else "")
        parts.append(op)
    if with_minmax and r["min_us"] is not None:
        parts.append(f"min {_fmt_dur(r['min_us'])} max {_fmt_dur(r['max_us'])}")
    if with_achieved and r["achieved"]:
        parts.append(_fmt_achieved(r["achieved"]) + (" of peak" if r["achieved"].get("pct_peak") is not None else ""))
    return parts


def _pack(parts: list[str], width: int) -> list[str]:
    """Detail parts joined with ' · ' into lines of at most ``width`` (a part too long is cut)."""
    lines: list[str] = []
    cur = ""
    for p in parts:
        p = p if len(p) <= width else p[: max(1, width - 1)] + "…"
        if cur and len(cur) + 3 + len(p) > width:
            lines.append(cur)
            cur = p
        else:
            cur = f"{cur} · {p}" if cur else p
    if cur:
        lines.append(cur)
    return lines


def breakdown_lines(data: dict[str, Any]) -> list[str]:
    """One line of GPU time by category; one of idle time (per device when there are several)."""
    lines = []
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


def render(data: dict[str, Any], width: int, wide: bool = False, title: Optional[str] = None):
    """A rich Table that fits ``width`` columns (``wide``: names whole, the table as wide as it needs)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from skillrun.termtext import plain

    rows = data["kernels"]
    big = width >= 120
    cols = [("#", 3), ("% GPU", 6), ("total ms", 9), ("calls", 6), ("mean µs", 7)]
    if big:
        cols += [("min µs", 7), ("max µs", 7), ("achieved", 16)]
    fixed = sum(w for _, w in cols) + 2 * (len(cols) + 1)
    name_w = max(24, width - fixed - 1)
    labels = [_label(r) for r in rows]
    shown = labels if wide else display_names(labels, name_w)
    t = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), expand=False, title_justify="left",
              show_edge=False, pad_edge=False)
    for c, w in cols:
        t.add_column(c, justify="right", no_wrap=True, min_width=min(w, len(c)))
    t.add_column("kernel" + ("" if wide else " (--wide: whole names)"), justify="left",
                 no_wrap=True, overflow="ignore" if wide else "ellipsis", max_width=None if wide else name_w)
    for r, name in zip(rows, shown):
        cells = [str(r["rank"]), f"{r['pct_gpu']:.2f}", f"{r['total_ms']:.3f}", str(r["calls"]), _fmt_us(r["mean_us"])]
        if big:
            cells += [_fmt_us(r["min_us"]), _fmt_us(r["max_us"]), _fmt_achieved(r["achieved"]) or "—"]
        cell = Text(plain(name))
        if r["short_name"] and r["short_name"] not in name and (wide or len(name) + len(r["short_name"]) + 4 <= name_w):
            cell.append(f"  [{plain(r['short_name'])}]", style="cyan")
        parts = [plain(p) for p in _detail(r, with_minmax=not big, with_achieved=not big, with_cat=True)]
        for line in (_pack(parts, name_w - 2) if not wide else [" · ".join(parts)] if parts else []):
            cell.append("\n  " + line, style="dim")
        t.add_row(*cells, cell)
    return t
