"""Two traces side by side: per (kernel, launching op, shape, dtype) the time, calls, time per call
and rate in each, their deltas, and what appeared or disappeared (after a port, a library upgrade,
a config change), the way HTA's TraceDiff compares runs.

Rows are keyed by the kernel's raw name and the shape row of the hot-kernel table
(:func:`skillrun.analysis.hot_table.hot_kernels`); a kernel with no recovered shape is one row.
``by="op"`` keys rows by (launching op, shape, dtype) alone, summing the kernels each op launched:
the same model on two vendors (cuBLAS ``nvjet_…`` against hipBLASLt ``Cijk_…``) pairs row for row,
which a diff by kernel name never can. Calls with no launching op are summed per category.

Times are each trace's own totals (not normalised per step): compare traces of the same workload and
steps. Where the call counts differ, the per-call change says whether a kernel got slower or ran more.
"""
from __future__ import annotations

import textwrap
from typing import Any, Optional

from skillrun.models import Profile

BY = ("kernel", "op")


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


def _parts(r: dict[str, Any]) -> list[dict[str, Any]]:
    return r.get("shapes") or [{"op": r["op"], "shape": r["shape"], "dtype": r["dtype"], "input_dims": r.get("input_dims"),
                                "calls": r["calls"], "total_ms": r["total_ms"], "mean_us": r["mean_us"],
                                "achieved": r["achieved"]}]


def _rows(data: dict[str, Any], by: str = "kernel") -> dict[tuple, dict[str, Any]]:
    """key → time, calls, mean, rate. ``by="kernel"``: (kernel, op, shape, dtype), the shape rows of
    each kernel, or the kernel itself when no shape was recovered. ``by="op"``: (op, shape, dtype) with
    the kernels it launched summed; calls are the op's (the most calls of any one of its kernels)."""
    out: dict[tuple, dict[str, Any]] = {}
    for r in data["kernels"]:
        for s in _parts(r):
            rate, unit = _rate(s.get("achieved") or {})
            if by == "op":
                key = (s.get("op") or "", _shape_key(s), s.get("dtype") or "") if s.get("op") else \
                    ("", f"no launching op ({r['category']})", "")
            else:
                key = (r["name"], s.get("op") or "", _shape_key(s), s.get("dtype") or "")
            cur = out.get(key)
            if cur is None:
                out[key] = {"category": r["category"], "demangled": r.get("demangled"), "calls": s["calls"],
                            "total_ms": s["total_ms"], "mean_us": s["mean_us"], "rate": rate, "rate_unit": unit,
                            "kernels": {r["name"]: s["calls"]}}
                continue
            # The same key again: another device (by kernel), or another kernel of the same op (by op).
            cur["total_ms"] = round(cur["total_ms"] + s["total_ms"], 4)
            ks = cur["kernels"]
            ks[r["name"]] = ks.get(r["name"], 0) + s["calls"]
            # an op's calls: the most of any one kernel it launched (each call launches each once); kernels
            # with no launching op are separate calls
            cur["calls"] = max(ks.values()) if by == "op" and key[0] else cur["calls"] + s["calls"]
            cur["mean_us"] = round(cur["total_ms"] * 1e3 / cur["calls"], 3) if cur["calls"] else None
            if by == "op":
                cur["rate"] = cur["rate_unit"] = None  # a sum of kernels has no single rate
    return out


def _pct(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return round(100.0 * (b - a) / a, 2) if a and b is not None else None


def compare(a: Profile, b: Profile, by: str = "kernel") -> dict[str, Any]:
    """The comparison as data: ``rows`` sorted by the size of the time change, and the totals."""
    from skillrun.analysis.hot_table import hot_kernels

    if by not in BY:
        raise ValueError(f"by must be one of {BY}")
    ra, rb = _rows(hot_kernels(a, None), by), _rows(hot_kernels(b, None), by)
    rows = []
    for key in list(ra) + [k for k in rb if k not in ra]:
        x, y = ra.get(key), rb.get(key)
        status = "both" if x and y else ("disappeared" if x else "appeared")
        ta, tb = (x or {}).get("total_ms", 0.0), (y or {}).get("total_ms", 0.0)
        kernel, op, shape, dtype = (key if by == "kernel" else ("", *key))
        row = {"kernel": kernel or None, "op": op or None, "shape": shape or None, "dtype": dtype or None,
               "category": (x or y)["category"], "demangled": (x or y).get("demangled") if by == "kernel" else None,
               "status": status, "a_ms": ta if x else None, "b_ms": tb if y else None, "delta_ms": round(tb - ta, 4),
               "delta_pct": _pct(ta, tb) if x and y else None,
               "a_calls": (x or {}).get("calls"), "b_calls": (y or {}).get("calls"),
               "a_mean_us": (x or {}).get("mean_us"), "b_mean_us": (y or {}).get("mean_us"),
               "rate_unit": (x or {}).get("rate_unit") or (y or {}).get("rate_unit"),
               "a_rate": (x or {}).get("rate"), "b_rate": (y or {}).get("rate")}
        row["calls_delta"] = row["b_calls"] - row["a_calls"] if x and y else None
        row["mean_delta_pct"] = _pct(row["a_mean_us"], row["b_mean_us"]) if x and y else None
        row["rate_delta_pct"] = (round(100.0 * (row["b_rate"] - row["a_rate"]) / row["a_rate"], 2)
                                 if row["a_rate"] and row["b_rate"] is not None else None)
        if by == "op":
            row["a_kernels"] = sorted((x or {}).get("kernels", {}), key=lambda k: -(x or {})["kernels"][k])
            row["b_kernels"] = sorted((y or {}).get("kernels", {}), key=lambda k: -(y or {})["kernels"][k])
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r["delta_ms"]), r["kernel"] or "", r["op"] or "", r["shape"] or ""))
    ta, tb = a.total_kernel_us / 1e3, b.total_kernel_us / 1e3
    paired = [r for r in rows if r["status"] == "both"]
    return {"by": by, "a": a.source, "b": b.source, "a_total_ms": round(ta, 4), "b_total_ms": round(tb, 4),
            "delta_ms": round(tb - ta, 4), "delta_pct": round(100.0 * (tb - ta) / ta, 2) if ta > 0 else None,
            "a_arch": a.arch, "b_arch": b.arch,
            "paired": len(paired), "paired_a_ms": round(sum(r["a_ms"] for r in paired), 4),
            "paired_b_ms": round(sum(r["b_ms"] for r in paired), 4),
            "appeared": sum(r["status"] == "appeared" for r in rows),
            "disappeared": sum(r["status"] == "disappeared" for r in rows), "rows": rows}


DIFF_COLUMNS = ["status", "kernel", "op", "shape", "dtype", "category", "a_ms", "b_ms", "delta_ms", "delta_pct",
                "a_calls", "b_calls", "calls_delta", "a_mean_us", "b_mean_us", "mean_delta_pct", "rate_unit", "a_rate",
                "b_rate", "rate_delta_pct"]
OP_COLUMNS = ["status", "op", "shape", "dtype", "category", "a_ms", "b_ms", "delta_ms", "delta_pct", "a_calls", "b_calls",
              "calls_delta", "a_mean_us", "b_mean_us", "mean_delta_pct", "a_kernels", "b_kernels"]


def diff_rows(d: dict[str, Any], top: Optional[int] = None) -> tuple[list[str], list[dict[str, Any]]]:
    return (OP_COLUMNS if d.get("by") == "op" else DIFF_COLUMNS), d["rows"][:top] if top else d["rows"]


def summary_line(d: dict[str, Any]) -> str:
    pct = f" ({d['delta_pct']:+.1f}%)" if d["delta_pct"] is not None else ""
    what = "(op, shape, dtype)" if d.get("by") == "op" else "(kernel, shape)"
    line = (f"GPU kernel time: A {d['a_total_ms']:.3f} ms → B {d['b_total_ms']:.3f} ms, {d['delta_ms']:+.3f} ms{pct}; "
            f"{d['appeared']} {what} rows appeared in B, {d['disappeared']} disappeared")
    if d.get("by") == "op":
        line += (f"; {d['paired']} paired rows hold A {d['paired_a_ms']:.3f} ms and B {d['paired_b_ms']:.3f} ms")
    return line


# ------------------------------------------------------------------------------------ rendering
STACK_BELOW = 120  # columns: below this each row is stacked (identity on one line, numbers under it)


def _ms(v: Optional[float]) -> str:
    return "—" if v is None else f"{v:.3f}"


def _us(v: Optional[float]) -> str:
    if v is None:
        return "—"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _signed(v: Optional[float], unit: str = "%") -> str:
    return "—" if v is None else f"{v:+.1f}{unit}"


def _identity(r: dict[str, Any], by: str) -> str:
    """What the row is: the kernel (by kernel), or the op and the kernels on each side (by op)."""
    if by == "op":
        def side(ks: list[str]) -> str:
            return (ks[0] + (f" +{len(ks) - 1}" if len(ks) > 1 else "")) if ks else "—"
        return f"A {side(r['a_kernels'])} · B {side(r['b_kernels'])}"
    return r["demangled"] or r["kernel"]


def kernel_stem(name: str) -> str:
    """A kernel's own name without namespaces, template and parameter lists (``void at::native::
    elementwise_kernel<128, 4, …>(…)`` → ``elementwise_kernel``); flat names as they are."""
    s = name[5:] if name.startswith("void ") else name
    if not any(c in s for c in "<(:"):
        return s
    head = s.split("<", 1)[0].split("(", 1)[0]
    return head.rsplit("::", 1)[-1] or s


def _what(r: dict[str, Any]) -> str:
    return " ".join(x for x in (r["op"], r["shape"], r["dtype"]) if x)


def _calls_text(r: dict[str, Any]) -> str:
    """calls and time per call in A → B (the per-call change is its own column): 25 → 54 calls ·
    89.6 → 92.2 µs/call."""
    if r["status"] == "both":
        calls = f"{r['a_calls']} → {r['b_calls']} calls" if r["a_calls"] != r["b_calls"] else f"{r['a_calls']} calls"
        return f"{calls} · {_us(r['a_mean_us'])} → {_us(r['b_mean_us'])} µs/call"
    side = "A" if r["status"] == "disappeared" else "B"
    c, m = (r["a_calls"], r["a_mean_us"]) if side == "A" else (r["b_calls"], r["b_mean_us"])
    return f"{r['status']}: {c} calls × {_us(m)} µs in {side} only"


def render(d: dict[str, Any], top: Optional[int], width: int, wide: bool):
    """A rich table of the largest changes: a column per number at ``width`` ≥ 120 (or ``wide``),
    else stacked, each row's identity on its own line with its calls, time per call and deltas under it."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from skillrun.ingest.names import display_names
    from skillrun.io.termtext import plain

    by = d.get("by", "kernel")
    rows = d["rows"][:top] if top else d["rows"]
    unit = "(op, shape, dtype)" if by == "op" else "(kernel, shape)"
    t = Table(title=f"Largest changes (top {len(rows)} of {len(d['rows'])} {unit} rows)", box=box.SIMPLE_HEAD,
              title_justify="left", show_edge=False, pad_edge=False)
    stacked = width < STACK_BELOW and not wide
    totals = wide or width >= 160  # room for each side's total as well
    if stacked:
        cols: tuple = (("Δ ms", 8), ("Δ %", 7), ("Δ/call", 7))
    else:
        cols = (("A calls", 7), ("B calls", 7), ("A µs/call", 9), ("B µs/call", 9), ("Δ/call", 7)) \
            + ((("A ms", 8), ("B ms", 8)) if totals else ()) + (("Δ ms", 8), ("Δ %", 7))
    for c, w in cols:
        t.add_column(c, justify="right", no_wrap=True, min_width=w)
    name_w = max(24, width - sum(w for _, w in cols) - 2 * len(cols) - 4)
    head = "what · calls, time per call A → B" if stacked else ("op shape dtype · kernels" if by == "op" else "kernel · op shape dtype")
    t.add_column(head, no_wrap=True, overflow="ignore" if wide else "ellipsis", max_width=None if wide else name_w)
    if by == "op":
        labels = [_what(r) or "—" for r in rows]
        shown = labels if wide else [lbl if len(lbl) <= name_w else lbl[: name_w - 1] + "…" for lbl in labels]
        subs = [_identity(r, by) for r in rows]
        half = max(12, (name_w - 14) // 2)
        a_short = display_names([kernel_stem((r["a_kernels"] or [""])[0]) for r in rows], half)
        b_short = display_names([kernel_stem((r["b_kernels"] or [""])[0]) for r in rows], half)
        if not wide:
            subs = [f"A {a or '—'}{' +' + str(len(r['a_kernels']) - 1) if len(r['a_kernels']) > 1 else ''} · "
                    f"B {b or '—'}{' +' + str(len(r['b_kernels']) - 1) if len(r['b_kernels']) > 1 else ''}"
                    for r, a, b in zip(rows, a_short, b_short)]
    else:
        labels = [_identity(r, by) for r in rows]
        shown = labels if wide else display_names(labels, name_w)
        subs = [_what(r) for r in rows]
    if not stacked:  # the status has no column of its own: it heads the second line
        subs = [(f"{r['status']} in B" + (" · " if sub else "") if r["status"] != "both" else "") + sub
                for r, sub in zip(rows, subs)]
    for r, name, sub in zip(rows, shown, subs):
        cell = Text(plain(name))
        lines = [sub] if sub else []
        if stacked:
            lines.append(_calls_text(r))
        for ln in lines:
            # wrapped at spaces, never cut: the shape and the dtype are what the row is
            for piece in ([plain(ln)] if wide else textwrap.wrap(plain(ln), max(12, name_w - 4), break_on_hyphens=False)):
                cell.append(("\n  " if not wide or stacked else " · ") + piece, style="dim")
        if stacked:
            t.add_row(f"{r['delta_ms']:+.3f}", _signed(r["delta_pct"], ""), _signed(r["mean_delta_pct"], ""), cell)
        else:
            cells = [str(r["a_calls"] or "—"), str(r["b_calls"] or "—"), _us(r["a_mean_us"]), _us(r["b_mean_us"]),
                     _signed(r["mean_delta_pct"], "")]
            cells += [_ms(r["a_ms"]), _ms(r["b_ms"])] if totals else []
            t.add_row(*cells, f"{r['delta_ms']:+.3f}", _signed(r["delta_pct"], ""), cell)
    return t
