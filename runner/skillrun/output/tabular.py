"""Rows for ``--format csv|tsv``: the data behind `kernels`, `match`, `plan`, `list` and `report` as
flat records a spreadsheet, ``csvkit`` or ``awk`` can read, one header line, one value per cell.

Each ``*_rows`` function returns ``(columns, rows)``; :func:`write` prints them. CSV quotes as
RFC 4180 does (a kernel name with commas and quotes reads back whole through any CSV reader); TSV
has no quoting, so tabs and line breaks inside a value become spaces. A text cell that a
spreadsheet would run as a formula (it starts with ``=``, ``+``, ``@`` or a non-numeric ``-``) gets
a leading ``'``: trace strings are untrusted.
"""
from __future__ import annotations

import csv
import re
from typing import Any, Iterable, Optional, TextIO

Rows = tuple[list[str], list[dict[str, Any]]]

_NUMBER = re.compile(r"^-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if v == v else ""
    if isinstance(v, (list, tuple)):
        return "; ".join(_cell(x) for x in v)
    if isinstance(v, dict):
        return "; ".join(f"{k}={_cell(x)}" for k, x in v.items())
    s = str(v)
    if s[:1] in ("=", "+", "@") or (s[:1] == "-" and not _NUMBER.match(s)):
        s = "'" + s
    return s


def write(columns: list[str], rows: Iterable[dict[str, Any]], fmt: str, stream: TextIO) -> None:
    """``rows`` as CSV or TSV on ``stream`` (header first)."""
    if fmt == "csv":
        w = csv.writer(stream, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in columns])
        return
    if fmt != "tsv":
        raise ValueError(f"not a row format: {fmt}")
    clean = re.compile(r"[\t\r\n]+")
    stream.write("\t".join(columns) + "\n")
    for r in rows:
        stream.write("\t".join(clean.sub(" ", _cell(r.get(c))) for c in columns) + "\n")


def _shape_text(shape: Optional[dict]) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items()) if shape else ""


def _rate_cells(a: dict[str, Any]) -> dict[str, Any]:
    """``pct_attainable``: share of the roofline, min(peak, intensity × bandwidth); ``pct_peak``: of the datasheet peak."""
    return {"tflops": a.get("tflops"), "tbps": a.get("tbps"), "flop_per_byte": a.get("flop_per_byte"),
            "attainable_tflops": a.get("attainable_tflops"), "attainable_tbps": a.get("attainable_tbps"),
            "pct_attainable": a.get("pct_attainable"), "pct_peak": a.get("pct_peak"), "bound": a.get("bound"),
            "model_na": bool(a.get("model_na")) if a else None}


KERNEL_COLUMNS = ["rank", "row", "kernel", "demangled", "category", "offered_to_cards", "pct_gpu", "total_ms", "calls",
                  "mean_us", "median_us", "std_us", "min_us", "max_us", "op", "shape", "dtype", "input_dims",
                  "shape_provenance", "tflops", "tbps", "flop_per_byte", "attainable_tflops", "attainable_tbps",
                  "pct_attainable", "pct_peak", "bound", "model_na", "grid", "grid_unit", "block", "launch", "metrics"]


def kernel_rows(data: dict[str, Any]) -> Rows:
    """One ``kernel`` row per hot kernel (its totals) and, under it, one ``shape`` row per launching
    op and shape (its own time and rate): filter on the ``row`` column for either view."""
    out = []
    for r in data["kernels"]:
        base = {"rank": r["rank"], "kernel": r["name"], "demangled": r.get("demangled"), "category": r["category"],
                "offered_to_cards": r["offered_to_cards"]}
        out.append({**base, "row": "kernel", "pct_gpu": r["pct_gpu"], "total_ms": r["total_ms"], "calls": r["calls"],
                    "mean_us": r["mean_us"], "median_us": r.get("median_us"), "std_us": r.get("std_us"),
                    "min_us": r["min_us"], "max_us": r["max_us"], "op": r["op"], "shape": _shape_text(r["shape"]),
                    "dtype": r["dtype"], "input_dims": _dims(r.get("input_dims")),
                    "shape_provenance": r["shape_provenance"], **_rate_cells(r["achieved"]),
                    "grid": _xyz(r.get("grid")), "grid_unit": r.get("grid_unit"), "block": _xyz(r.get("block")), "launch": r.get("launch") or None,
                    "metrics": r.get("metrics") or None})
        for s in r.get("shapes") or []:
            out.append({**base, "row": "shape", "pct_gpu": s["pct_gpu"], "total_ms": s["total_ms"], "calls": s["calls"],
                        "mean_us": s["mean_us"], "op": s["op"], "shape": _shape_text(s["shape"]), "dtype": s["dtype"],
                        "input_dims": _dims(s.get("input_dims")), "shape_provenance": s["shape_provenance"],
                        **_rate_cells(s["achieved"])})
    return KERNEL_COLUMNS, out


def _xyz(v: Any) -> str:
    return "x".join(str(x) for x in v) if isinstance(v, list) else ""


def _dims(v: Any) -> str:
    if not isinstance(v, list):
        return ""
    return "; ".join("x".join(str(d) for d in x) if isinstance(x, list) else str(x) for x in v)


MATCH_COLUMNS = ["kind", "card", "kernel", "pct_gpu", "failed", "not_checked", "passed"]


def match_rows(report) -> Rows:
    """One row per match and near miss (criteria by outcome), per unmatched hot kernel (the nearest
    card and what it failed) and per collective."""
    out = []
    for kind, items in (("match", report.matches), ("near_miss", report.near_misses)):
        for m in items:
            out.append({"kind": kind, "card": m.skill_id, "kernel": m.kernel, "pct_gpu": round(m.pct_gpu, 3),
                        "failed": [f"{c.name}: {c.reason}" for c in m.criteria if c.status == "failed"],
                        "not_checked": [c.name for c in m.criteria if c.status == "not_checked"],
                        "passed": [c.name for c in m.criteria if c.status == "passed"]})
    cov = report.coverage
    near = {n.kernel: n for n in (cov.nearest if cov else [])}
    for name in report.unmatched_hot:
        n = near.get(name)
        out.append({"kind": "unmatched", "card": n.card if n else None, "kernel": name,
                    "pct_gpu": n.pct_gpu if n else None, "failed": n.failed if n else None})
    for name in report.communication:
        out.append({"kind": "communication", "kernel": name, "failed": ["collective: never offered to cards"]})
    return MATCH_COLUMNS, out


PLAN_COLUMNS = ["item", "card", "kernel", "pct_gpu", "shape", "shape_provenance", "dtype", "recipe", "status", "untuned",
                "expected_speedup", "expected_source", "projected_e2e_gain_pct", "evidence", "next_command"]


def plan_rows(plan) -> Rows:
    out = []
    for i, it in enumerate(plan.items, 1):
        out.append({"item": i, "card": it.skill_id, "kernel": it.kernel, "pct_gpu": round(it.pct_gpu, 3),
                    "shape": _shape_text(it.shape), "shape_provenance": it.shape_provenance, "dtype": it.dtype,
                    "recipe": it.recipe, "status": it.status, "untuned": it.untuned,
                    "expected_speedup": it.expected_speedup, "expected_source": it.expected_source,
                    "projected_e2e_gain_pct": it.projected_e2e_gain_pct,
                    "evidence": (it.evidence or {}).get("path"), "next_command": it.next_command})
    return PLAN_COLUMNS, out


CARD_COLUMNS = ["id", "title", "gens", "from", "to", "recipes", "validation"]


def card_rows(rows: list[dict[str, Any]]) -> Rows:
    return CARD_COLUMNS, rows


REPORT_COLUMNS = ["card", "shape_class", "shape", "device", "verdict", "speedup", "versus", "noise_pct", "speed_axis",
                  "speed", "speed_note", "port_parity", "references", "timing_mode", "commit", "date", "evidence", "path"]


def report_rows(ev) -> Rows:
    """One row per current validation artifact (the report's summary table). ``speedup`` and
    ``noise_pct`` are numbers a spreadsheet can sort and compute with; ``speed`` is the sentence."""
    from skillrun.output.report import summary_rows

    out = []
    for r in summary_rows(ev):
        s = r["entry"].summary
        out.append({"card": r["card"], "shape_class": r["shape_class"], "shape": r["shape"], "device": r["device"],
                    "verdict": r["verdict"], "speedup": s.speedup, "versus": s.versus, "noise_pct": s.noise_pct,
                    "speed_axis": s.speed, "speed": r["speed"], "speed_note": r["speed_sub"],
                    "port_parity": r["port_parity"], "references": [t for t, _, _ in r["ref_parity"]],
                    "timing_mode": r["timing_mode"], "commit": r["commit"], "date": r["date"],
                    "evidence": r["evidence"], "path": r["path"]})
    return REPORT_COLUMNS, out
