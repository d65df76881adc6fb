"""The reviewer's view of validation artifacts: a terminal table and a self-contained HTML page.

    from skillrun.report import load_artifacts, report_table, write_html
    records = load_artifacts([Path("validation")])
    rich.print(report_table(records))
    write_html(records, Path("report.html"))

The same functions take the records ``skillrun.execute`` returns, so a run can be shown before
(or without) writing artifacts. The HTML page needs no network: CSS is inline and the charts are
inline PNGs (matplotlib, Agg backend). Every string from an artifact is escaped.
"""
from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from skillrun.errors import InputError, SkillRunError

VERDICT_STYLE = {
    "validated": "bold green", "slower": "yellow", "parity_failed": "bold red", "error": "bold red",
    "compile_failed": "red", "compile_verified": "cyan", "cpu_numerics_passed": "cyan", "skipped": "dim",
    "invalid": "bold magenta",
}
VERDICT_COLOR = {
    "validated": "#1a7f37", "slower": "#b08800", "parity_failed": "#cf222e", "error": "#cf222e",
    "compile_failed": "#cf222e", "compile_verified": "#0969da", "cpu_numerics_passed": "#0969da", "skipped": "#6e7781",
    "invalid": "#8250df",
}


# ---------------------------------------------------------------------------------------- loading

def load_artifacts(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Artifacts from files and folders (recursively, ``*.yaml``), oldest name first.

    A file that is not a valid artifact becomes a row with verdict ``invalid`` and the reason, so
    one broken file never hides the others; a path that does not exist is an :class:`InputError`.
    """
    from skillrun.validation import load_artifact

    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            # validation/_tuning/ holds tuning artifacts (their own schema), not validation records.
            files += sorted(f for f in p.rglob("*.yaml") if not f.name.startswith(".tmp-") and "_tuning" not in f.relative_to(p).parts)
        elif p.is_file():
            files.append(p)
        else:
            raise InputError("no such artifact file or folder", path=str(p))
    records = []
    for f in files:
        try:
            rec = load_artifact(f)
        except SkillRunError as exc:
            rec = {"verdict": "invalid", "reason": exc.reason + (f" (field {exc.field})" if exc.field else ""),
                   "card": {"id": f.parent.name}}
        rec["artifact"] = str(f)
        records.append(rec)
    return records


# ---------------------------------------------------------------------------------------- cells

def _num(x: Any, digits: int = 4) -> str:
    if x is None:
        return "—"
    try:
        return f"{float(x):.{digits}g}"
    except (TypeError, ValueError):
        return str(x)


def shape_text(rec: dict[str, Any]) -> str:
    shape = rec.get("shape") or {}
    text = " ".join(f"{k}={v}" for k, v in shape.items()) or "—"
    proxy = rec.get("proxy_shape")
    if proxy and proxy != shape:
        text += " (ran " + " ".join(f"{k}={v}" for k, v in proxy.items()) + ")"
    return text


def device_text(rec: dict[str, Any]) -> str:
    d = rec.get("device") or {}
    name = d.get("name") or "—"
    arch = d.get("arch")
    return f"{name} [{arch}]" if arch and arch not in name else name


def parity_text(p: dict[str, Any] | None) -> str:
    if not p:
        return "n/a"
    if p.get("supported") is False:
        return "unsupported"
    mark = "ok" if p.get("passed") else "FAIL"
    if p.get("rel_fro") is not None:
        return f"{mark} {_num(p['rel_fro'], 2)}"
    return mark


def reference_ms(rec: dict[str, Any]) -> tuple[float | None, str]:
    """The time of the reference the speedup is against, and its short label."""
    t = rec.get("timing") or {}
    versus = t.get("versus") or ""
    if versus.startswith("alternative "):
        name = versus.split(" ")[1]
        st = (t.get("alternatives_ms") or {}).get(name)
        return (st or {}).get("median"), f"alt {name}"
    if versus.startswith("baseline"):
        return (t.get("baseline_ms") or {}).get("median"), "baseline"
    return (t.get("baseline_ms") or {}).get("median"), ("none" if versus.startswith("none") else "baseline")


def speedup_text(rec: dict[str, Any]) -> str:
    s = rec.get("speedup")
    _, label = reference_ms(rec)
    if s is None:
        return "—" if not rec.get("timing") else f"— ({label})"
    return f"{s:.3f}x vs {label}"


def _row(rec: dict[str, Any]) -> list[str]:
    t = rec.get("timing") or {}
    parity = rec.get("parity") or {}
    ref_ms, _ = reference_ms(rec)
    return [
        (rec.get("card") or {}).get("id", "—"),
        (rec.get("recipe") or {}).get("name", "—") + (" (untuned)" if (rec.get("recipe") or {}).get("untuned") else ""),
        shape_text(rec),
        device_text(rec),
        parity_text(parity.get("port")) + " / " + parity_text(parity.get("baseline")),
        _num((t.get("port_ms") or {}).get("median")),
        _num(ref_ms),
        speedup_text(rec),
        (_num(t.get("aa_noise_pct"), 2) + "%") if t.get("aa_noise_pct") is not None else "—",
        (_num(rec.get("pct_of_peak"), 3) + "%") if rec.get("pct_of_peak") is not None else "—",
        rec.get("verdict", "—"),
    ]


COLUMNS = ["card", "recipe", "shape", "device", "parity port / baseline (rel_fro)", "port ms", "ref ms",
           "speedup vs", "A/A noise", "% peak", "verdict"]


def report_table(records: list[dict[str, Any]]):
    """A rich Table, one row per record, the reason under each verdict."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{len(records)} validation record(s)", show_lines=True, expand=False)
    for c in COLUMNS:
        table.add_column(c, overflow="fold", justify="right" if c in ("port ms", "ref ms", "A/A noise", "% peak") else "left")
    for rec in records:
        cells = _row(rec)
        verdict = cells[-1]
        reason = (rec.get("reason") or "").strip()
        cells[-1] = Text(verdict, style=VERDICT_STYLE.get(verdict, ""))
        if reason:
            cells[-1].append("\n" + (reason[:160] + ("…" if len(reason) > 160 else "")), style="dim")
        table.add_row(*cells)
    return table


# ---------------------------------------------------------------------------------------- HTML

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _speedup_chart(card_id: str, recs: list[dict[str, Any]]) -> str | None:
    """Speedup per shape for one card (bars coloured by verdict, A/A noise as error bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in recs if r.get("speedup") is not None]
    if not rows:
        return None
    labels = [shape_text(r).split(" (ran")[0] + "\n" + ((r.get("device") or {}).get("arch") or "") for r in rows]
    vals = [float(r["speedup"]) for r in rows]
    errs = [float(r["speedup"]) * float((r.get("timing") or {}).get("aa_noise_pct") or 0.0) / 100.0 for r in rows]
    colors = [VERDICT_COLOR.get(r.get("verdict", ""), "#6e7781") for r in rows]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(rows) + 2), 3.2))
    ax.bar(range(len(rows)), vals, color=colors, yerr=errs, capsize=4)
    ax.axhline(1.0, color="#24292f", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("speedup (reference ms / port ms)")
    ax.set_title(f"{card_id}: speedup per shape", fontsize=9)
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.3f}x", ha="center", va="bottom", fontsize=7)
    data = _png(fig)
    plt.close(fig)
    return data


def _timing_chart(rec: dict[str, Any]) -> str | None:
    """Median time per slot with the p10-p90 range, for one record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = rec.get("timing") or {}
    slots = []
    if t.get("port_ms"):
        slots.append(("port", t["port_ms"]))
    if t.get("baseline_ms"):
        slots.append(("baseline", t["baseline_ms"]))
    for name, st in (t.get("alternatives_ms") or {}).items():
        slots.append((f"alt {name}", st))
    if not slots:
        return None
    fig, ax = plt.subplots(figsize=(5.0, 0.5 * len(slots) + 1.0))
    med = [s["median"] for _, s in slots]
    lo = [s["median"] - s.get("p10", s["median"]) for _, s in slots]
    hi = [s.get("p90", s["median"]) - s["median"] for _, s in slots]
    ax.barh(range(len(slots)), med, xerr=[lo, hi], color=["#0969da"] + ["#8c959f"] * (len(slots) - 1), capsize=3)
    ax.set_yticks(range(len(slots)))
    ax.set_yticklabels([n for n, _ in slots], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms (median, p10–p90)", fontsize=8)
    floor = (rec.get("physical_limit") or {}).get("floor_ms")
    if floor:
        ax.axvline(floor, color="#cf222e", linewidth=1, linestyle=":", label="physical floor")
        ax.legend(fontsize=7)
    data = _png(fig)
    plt.close(fig)
    return data


CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#24292f;max-width:1400px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}h3{font-size:14px}
table{border-collapse:collapse;font-size:12px;width:100%}
th,td{border:1px solid #d0d7de;padding:4px 6px;vertical-align:top;text-align:left}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
.v{font-weight:600;padding:1px 6px;border-radius:10px;color:#fff;white-space:nowrap}
.reason{color:#57606a;font-size:11px}
details{margin:6px 0 14px 0}summary{cursor:pointer;font-size:13px}
pre{background:#f6f8fa;padding:8px;font-size:11px;overflow-x:auto}
.muted{color:#57606a;font-size:12px}img{max-width:100%}
"""


def _badge(verdict: str) -> str:
    return f'<span class="v" style="background:{VERDICT_COLOR.get(verdict, "#6e7781")}">{html.escape(verdict)}</span>'


def _details(rec: dict[str, Any]) -> str:
    e = html.escape
    parts = []
    t = rec.get("timing") or {}
    if t:
        parts.append(f"<p><b>timing</b>: {e(str(t.get('method')))}; rounds {e(str(t.get('rounds')))}, warm-up "
                     f"{e(str(t.get('warmup')))}; cold L2: {e(str(t.get('cold_l2')))}; versus: {e(str(t.get('versus')))}</p>")
    pl = rec.get("physical_limit")
    if pl:
        parts.append(f"<p><b>physical floor</b>: {_num(pl.get('floor_ms'))} ms ({e(str(pl.get('bound')))}-bound; "
                     f"{e(str(pl.get('device_peak')))}: {_num(pl.get('peak_tflops'))} TF, {_num(pl.get('peak_gbps'))} GB/s) "
                     f"— {'passed' if pl.get('passed') else 'FAILED'}</p>")
    gates = rec.get("slot_integrity") or {}
    if gates:
        items = "".join(f"<li>{e(k)}: {'passed' if g.get('passed') else 'FAILED'} — {e(str(g.get('reason', '')))}</li>"
                        for k, g in gates.items())
        parts.append(f"<p><b>slot integrity</b></p><ul>{items}</ul>")
    par = rec.get("parity") or {}
    rows = []
    for name, p in [("port", par.get("port")), ("baseline", par.get("baseline"))] + \
            [(f"alt {k}", v) for k, v in (par.get("alternatives") or {}).items()]:
        if p:
            rows.append("<tr>" + "".join(f"<td>{e(str(x))}</td>" for x in (
                name, p.get("kernel", ""), parity_text(p), _num(p.get("max_abs_err")), _num(p.get("max_rel_err")),
                _num(p.get("rel_fro")), _num(p.get("cosine"), 6), p.get("mismatched", "—"), p.get("nonfinite", "—"),
                (p.get("error") or "")[:300])) + "</tr>")
    if rows:
        parts.append("<table><tr><th>slot</th><th>kernel</th><th>parity</th><th>max abs</th><th>max rel</th><th>rel_fro</th>"
                     "<th>cosine</th><th>mismatched</th><th>nonfinite</th><th>error</th></tr>" + "".join(rows) + "</table>")
    chart = _timing_chart(rec)
    if chart:
        parts.append(f'<img alt="timing" src="data:image/png;base64,{chart}">')
    notes = rec.get("notes") or []
    if notes:
        parts.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    meta = {k: rec.get(k) for k in ("created", "mode", "seeds", "tolerance", "software", "runner", "recipe", "artifact") if rec.get(k) is not None}
    parts.append("<pre>" + e("\n".join(f"{k}: {v}" for k, v in meta.items())) + "</pre>")
    return "".join(parts)


def write_html(records: list[dict[str, Any]], out: Path) -> Path:
    """Write one self-contained page (no external resources) and return its path."""
    e = html.escape
    out = Path(out)
    by_card: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_card[(r.get("card") or {}).get("id", "—")].append(r)
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        counts[r.get("verdict", "—")] += 1
    body = [f"<h1>skillrun validation report</h1><p class='muted'>{len(records)} record(s): "
            + ", ".join(f"{_badge(v)} {n}" for v, n in sorted(counts.items())) + "</p>"]
    body.append("<p class='muted'>Speedup = reference median ms / port median ms from same-session interleaved rounds; "
                "the reference is the card's baseline unless it failed the fp32 oracle or refused the shape "
                "(then an oracle-correct alternative, named in the 'speedup vs' column). Error bars: A/A noise floor. "
                "CPU rows carry numerics only (no GPU timing).</p>")
    head = "".join(f"<th>{e(c)}</th>" for c in COLUMNS)
    for card_id, recs in by_card.items():
        body.append(f"<h2>{e(card_id)}</h2>")
        chart = _speedup_chart(card_id, recs)
        if chart:
            body.append(f'<img alt="speedup per shape" src="data:image/png;base64,{chart}">')
        rows = []
        for r in recs:
            cells = _row(r)
            tds = "".join(f"<td class='num'>{e(c)}</td>" if i in (5, 6, 8, 9) else f"<td>{e(c)}</td>" for i, c in enumerate(cells[:-1]))
            tds += f"<td>{_badge(cells[-1])}<div class='reason'>{e((r.get('reason') or '')[:400])}</div></td>"
            rows.append(f"<tr>{tds}</tr>")
        body.append(f"<table><tr>{head}</tr>{''.join(rows)}</table>")
        for r in recs:
            title = f"{shape_text(r)} — {device_text(r)} — {r.get('verdict', '—')}"
            body.append(f"<details><summary>{e(title)}</summary>{_details(r)}</details>")
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>skillrun validation report</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out
