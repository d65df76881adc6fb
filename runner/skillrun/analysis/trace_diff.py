"""Two traces side by side: per (kernel, launching op, shape, dtype) the time, calls and rate in
each, their deltas, and what appeared or disappeared (after a port, a library upgrade, a config
change), the way HTA's TraceDiff compares runs.

Rows are keyed by the kernel's raw name and the shape row of the hot-kernel table
(:func:`skillrun.analysis.hot_table.hot_kernels`); a kernel with no recovered shape is one row. Times are
each trace's own totals (not normalised per step): compare traces of the same workload and steps.
"""
from __future__ import annotations

from typing import Any, Optional

from skillrun.models import Profile


def _shape_key(s: dict[str, Any]) -> str:
    if s.get("shape"):
        return ",".join(f"{k}={v}" for k, v in s["shape"].items())
    dims = [x for x in (s.get("input_dims") or []) if isinstance(x, list) and x]
    if dims:  # the tensor arguments (scalars and None left out), as the table shows them
        return "dims " + "; ".join("x".join(str(d) for d in x) for x in dims[:3])
    return ""


def _rate(a: dict[str, Any]) -> tuple[Optional[float], Optional[str]]:
    if not a or a.get("model_na"):
        return None, None
    if "tflops" in a:
        return a["tflops"], "TFLOP/s"
    if "tbps" in a:
        return a["tbps"], "TB/s"
    return None, None


def _rows(data: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
    """(kernel, op, shape, dtype) → time, calls, mean, rate: the shape rows of each kernel, or the
    kernel itself when no shape was recovered."""
    out: dict[tuple, dict[str, Any]] = {}
    for r in data["kernels"]:
        parts = r.get("shapes") or [{"op": r["op"], "shape": r["shape"], "dtype": r["dtype"], "input_dims": r.get("input_dims"),
                                     "calls": r["calls"], "total_ms": r["total_ms"], "mean_us": r["mean_us"],
                                     "achieved": r["achieved"]}]
        for s in parts:
            key = (r["name"], s.get("op") or "", _shape_key(s), s.get("dtype") or "")
            rate, unit = _rate(s.get("achieved") or {})
            cur = out.get(key)
            if cur is None:
                out[key] = {"category": r["category"], "demangled": r.get("demangled"), "calls": s["calls"],
                            "total_ms": s["total_ms"], "mean_us": s["mean_us"], "rate": rate, "rate_unit": unit}
            else:  # the same key twice (a kernel on several devices): add the time, keep the first rate
                cur["calls"] += s["calls"]
                cur["total_ms"] = round(cur["total_ms"] + s["total_ms"], 4)
                cur["mean_us"] = round(cur["total_ms"] * 1e3 / cur["calls"], 3) if cur["calls"] else None
    return out


def compare(a: Profile, b: Profile) -> dict[str, Any]:
    """The comparison as data: ``rows`` sorted by the size of the time change, and the totals."""
    from skillrun.analysis.hot_table import hot_kernels

    ra, rb = _rows(hot_kernels(a, None)), _rows(hot_kernels(b, None))
    rows = []
    for key in list(ra) + [k for k in rb if k not in ra]:
        x, y = ra.get(key), rb.get(key)
        status = "both" if x and y else ("disappeared" if x else "appeared")
        ta, tb = (x or {}).get("total_ms", 0.0), (y or {}).get("total_ms", 0.0)
        row = {"kernel": key[0], "op": key[1] or None, "shape": key[2] or None, "dtype": key[3] or None,
               "category": (x or y)["category"], "demangled": (x or y).get("demangled"), "status": status,
               "a_ms": ta if x else None, "b_ms": tb if y else None, "delta_ms": round(tb - ta, 4),
               "delta_pct": round(100.0 * (tb - ta) / ta, 2) if x and y and ta > 0 else None,
               "a_calls": (x or {}).get("calls"), "b_calls": (y or {}).get("calls"),
               "a_mean_us": (x or {}).get("mean_us"), "b_mean_us": (y or {}).get("mean_us"),
               "rate_unit": (x or {}).get("rate_unit") or (y or {}).get("rate_unit"),
               "a_rate": (x or {}).get("rate"), "b_rate": (y or {}).get("rate")}
        row["rate_delta_pct"] = (round(100.0 * (row["b_rate"] - row["a_rate"]) / row["a_rate"], 2)
                                 if row["a_rate"] and row["b_rate"] is not None else None)
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r["delta_ms"]), r["kernel"]))
    ta, tb = a.total_kernel_us / 1e3, b.total_kernel_us / 1e3
    return {"a": a.source, "b": b.source, "a_total_ms": round(ta, 4), "b_total_ms": round(tb, 4),
            "delta_ms": round(tb - ta, 4), "delta_pct": round(100.0 * (tb - ta) / ta, 2) if ta > 0 else None,
            "a_arch": a.arch, "b_arch": b.arch,
            "appeared": sum(r["status"] == "appeared" for r in rows),
            "disappeared": sum(r["status"] == "disappeared" for r in rows), "rows": rows}


DIFF_COLUMNS = ["status", "kernel", "op", "shape", "dtype", "category", "a_ms", "b_ms", "delta_ms", "delta_pct",
                "a_calls", "b_calls", "a_mean_us", "b_mean_us", "rate_unit", "a_rate", "b_rate", "rate_delta_pct"]


def diff_rows(d: dict[str, Any], top: Optional[int] = None) -> tuple[list[str], list[dict[str, Any]]]:
    return DIFF_COLUMNS, d["rows"][:top] if top else d["rows"]


def summary_line(d: dict[str, Any]) -> str:
    pct = f" ({d['delta_pct']:+.1f}%)" if d["delta_pct"] is not None else ""
    return (f"GPU kernel time: A {d['a_total_ms']:.3f} ms → B {d['b_total_ms']:.3f} ms, {d['delta_ms']:+.3f} ms{pct}; "
            f"{d['appeared']} (kernel, shape) rows appeared in B, {d['disappeared']} disappeared")


def render(d: dict[str, Any], top: Optional[int], width: int, wide: bool):
    """A rich table of the largest changes."""
    from rich import box
    from rich.table import Table

    from skillrun.ingest.names import display_names
    from skillrun.io.termtext import plain

    rows = d["rows"][:top] if top else d["rows"]
    t = Table(title=f"Largest changes (top {len(rows)} of {len(d['rows'])} (kernel, shape) rows)", box=box.SIMPLE_HEAD,
              title_justify="left", show_edge=False, pad_edge=False)
    cols = (("status", 11), ("A ms", 8), ("B ms", 8), ("Δ ms", 8), ("Δ %", 7), ("A rate", 12), ("B rate", 12))
    for c, w in cols:
        t.add_column(c, justify="right", no_wrap=True, min_width=w)
    name_w = max(24, width - sum(w for _, w in cols) - 2 * len(cols) - 1)
    t.add_column("kernel · op shape dtype", no_wrap=True, overflow="ignore" if wide else "ellipsis",
                 max_width=None if wide else name_w)
    labels = [(r["demangled"] or r["kernel"]) for r in rows]
    shown = labels if wide else display_names(labels, name_w)

    def ms(v):
        return "—" if v is None else f"{v:.3f}"

    def rate(v, unit):
        return "—" if v is None else f"{v:.2f} {'TF/s' if unit == 'TFLOP/s' else 'TB/s'}"

    for r, name in zip(rows, shown):
        what = " ".join(x for x in (r["op"], r["shape"], r["dtype"]) if x)
        t.add_row(r["status"], ms(r["a_ms"]), ms(r["b_ms"]), f"{r['delta_ms']:+.3f}",
                  "—" if r["delta_pct"] is None else f"{r['delta_pct']:+.1f}", rate(r["a_rate"], r["rate_unit"]),
                  rate(r["b_rate"], r["rate_unit"]),
                  plain(name) + (f" · {plain(what)}" if wide else f"\n  {plain(what)}") if what else plain(name))
    return t
