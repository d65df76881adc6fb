"""The reviewer's view of validation artifacts: a terminal summary and a self-contained HTML page.

    from skillrun.evidence.index import build_index
    ev = build_index(skill_index)                       # current / superseded / stale
    rich.print(terminal_report(ev))
    write_html(ev, Path("report.html"))

Both open with the same summary: one row per current artifact of each (card, recipe = shape class,
shape, device class, mode), measured GPU evidence first, then compile-only and CPU evidence; the
row says the verdict, the speedup against the production reference with the A/A noise the verdict
used, parity of the port and of every reference (failing references highlighted), the device,
commit, date, timing mode and whether the evidence is stale. Superseded and stale records sit
collapsed under their current one. The rows come from :func:`summary_rows`, which reads
:func:`skillrun.evidence.index.summarize`, so the terminal, the page and the agent quote the same numbers.

The page needs no network: CSS is inline and the charts are inline SVG written here (horizontal
bars, one label per row, so labels cannot collide). Every string from an artifact is escaped.
``report_table`` is the per-record table shown right after a run (before any index exists).
"""
from __future__ import annotations

import html
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from skillrun.errors import InputError, SkillRunError
from skillrun.evidence.index import Entry, EvidenceIndex, Summary, build_index, summarize

from skillrun.evidence.verdict import REF_PARITY_WORDS, SPEED_TONE, SPEED_WORDS, TONE_COLOR, VERDICTS, speed_style, verdict_style

# Colours come from the tone of each word in skillrun.evidence.verdict, the one vocabulary.
VERDICT_STYLE = {v: verdict_style(v) for v in VERDICTS}
VERDICT_COLOR = {v: TONE_COLOR[tone] for v, (tone, _) in VERDICTS.items()}
SPEED_COLOR = {k: TONE_COLOR[t] for k, t in SPEED_TONE.items()}
SPEED_WORD = SPEED_WORDS


# ---------------------------------------------------------------------------------------- loading
def load_artifacts(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Artifacts from files and folders (recursively, ``*.yaml``), oldest name first.

    A file that is not a valid artifact becomes a row with verdict ``invalid`` and the reason, so
    one broken file never hides the others; a path that does not exist is an :class:`InputError`.
    """
    from skillrun.evidence.validation import load_artifact

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


def noise_text(s: Summary, band: bool = False) -> str:
    """The A/A noise the verdict used (one figure everywhere), with the p10-p90 of the A/A ratio if asked."""
    if s.noise_pct is None:
        return "—"
    if band and s.aa_ratio_p10 is not None and s.aa_ratio_p90 is not None:
        return f"{s.noise_pct:.2f}% (A/A ratio p10–p90 {s.aa_ratio_p10:.3f}–{s.aa_ratio_p90:.3f})"
    return f"{s.noise_pct:.2f}%"


def clocks_text(s: Summary) -> str:
    """Both clocks of the headline where they disagree ('' where they agree or one is missing)."""
    if not s.clock_note or s.speedup_events is None or s.speedup_kernel is None:
        return ""
    return f"events {s.speedup_events:.3g}×, kernel durations {s.speedup_kernel:.3g}×: the smaller counts"


def _row(rec: dict[str, Any]) -> list[str]:
    t = rec.get("timing") or {}
    parity = rec.get("parity") or {}
    s = summarize(rec)
    head = next((r for r in s.refs if r.name == s.versus), None)
    # the headline as today's rule reads it (the same as `report`), never the file's own older one
    ref_ms = head.median_ms if head is not None and head.median_ms is not None else reference_ms(rec)[0]
    speed = f"{s.speedup:.3f}x vs {s.versus}" if s.speedup is not None and s.versus else speedup_text(rec)
    return [
        (rec.get("card") or {}).get("id", "—"),
        (rec.get("recipe") or {}).get("name", "—") + (" (untuned)" if (rec.get("recipe") or {}).get("untuned") else ""),
        shape_text(rec),
        device_text(rec),
        parity_text(parity.get("port")) + " / " + parity_text(parity.get("baseline")),
        _num((t.get("port_ms") or {}).get("median")),
        _num(ref_ms),
        speed,
        _vs_production(s),
        noise_text(s),
        (_num(_roofline_share(rec), 3) + "%") if _roofline_share(rec) is not None else "—",
        s.verdict,  # the vocabulary's word (summarize), the same as `report`
    ]


def _roofline_share(rec: dict[str, Any]) -> float | None:
    """The port's rate as a share of the roofline at its intensity (not of the compute peak: a
    memory-bound shape would read a few percent while drawing most of the bandwidth)."""
    from skillrun.analysis.peaks import roofline_pct

    pl = rec.get("physical_limit") or {}
    share = roofline_pct(rec.get("tflops"), rec.get("gbps"), pl.get("peak_tflops"), pl.get("peak_gbps"))
    return share if share is not None else rec.get("pct_of_peak")


def _vs_production(s: Summary) -> str:
    """Is the speedup against the production kernel? One cell of the per-run table."""
    if s.speedup is None:
        return "—"
    if s.versus_production:
        return "yes"
    prod = s.production_ref
    return f"no ({prod.name} {REF_PARITY_WORDS[prod.parity_kind][0]})" if prod else "no production kernel measured"


COLUMNS = ["card", "recipe", "shape", "device", "parity port / baseline (rel_fro)", "port ms", "ref ms",
           "speedup vs", "vs production", "A/A noise", "% roofline", "verdict"]  # _row gives one value per column


def results_answer(records: list[dict[str, Any]]) -> str:
    """The one line that answers `run` / `--run` (rich markup), before the table: how many ran, each
    verdict counted and coloured by its tone, the best and worst timed ratio."""
    from collections import Counter

    from skillrun.io.termtext import safe as x
    from skillrun.evidence.verdict import verdict_style

    if not records:
        return "[bold]Answer:[/] nothing ran (the plan has no runnable item)"
    # Each record as the one headline rule reads it (both clocks included), as `report` will.
    judged = [(summarize(r), r) if isinstance(r.get("recipe"), dict) else (None, r) for r in records]
    counts = Counter(str((s.verdict if s is not None else r.get("verdict")) or "—") for s, r in judged)
    words = []
    for v, n in counts.most_common():
        style = verdict_style(v)
        words.append(f"[{style}]{n} {x(v)}[/]" if style else f"{n} {x(v)}")
    timed = [((s.speedup if s is not None else r.get("speedup")), (r.get("card") or {}).get("id")) for s, r in judged
             if isinstance(s.speedup if s is not None else r.get("speedup"), (int, float)) and r.get("mode") == "gpu_measured"]
    extra = ""
    if timed:
        lo, hi = min(timed, key=lambda t: t[0]), max(timed, key=lambda t: t[0])
        extra = f"; speedups {lo[0]:.3f}× to {hi[0]:.3f}× against the reference each row names"
    written = sum(1 for r in records if r.get("artifact"))
    return (f"[bold]Answer:[/] {len(records)} run(s): " + ", ".join(words) + extra
            + (f"; {written} artifact(s) written" if written else ""))


def evidence_answer(ev: EvidenceIndex) -> str:
    """The one line that answers `skill-run report` (rich markup): the current GPU verdicts counted
    and coloured by tone, how many are stale, and how much is compile-only or CPU."""
    from collections import Counter

    from skillrun.evidence.verdict import verdict_style

    cur = ev.current_entries()
    gpu = [e for e in cur if e.key[4] == "gpu_measured"]
    counts = Counter(e.summary.verdict for e in gpu if not e.stale)
    words = []
    for v, n in counts.most_common():
        style = verdict_style(v)
        words.append(f"[{style}]{n} {html.escape(v)}[/]" if style else f"{n} {v}")
    stale = sum(e.stale for e in gpu)
    head = (f"{len(gpu)} current GPU measurement(s): " + (", ".join(words) or "none fresh")
            + (f"; {stale} stale (kernel or recipe changed since: re-run them)" if stale else ""))
    return f"[bold]Answer:[/] {head}; {len(cur) - len(gpu)} compile-only or CPU row(s)"


def report_table(records: list[dict[str, Any]]):
    """A rich Table, one row per record, the verdict text under each verdict (shown right after a run)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{len(records)} validation record(s)", show_lines=True, expand=False)
    for c in COLUMNS:
        table.add_column(c, overflow="fold", justify="right" if c in ("port ms", "ref ms", "A/A noise", "% roofline") else "left")
    from skillrun.io.termtext import plain

    for rec in records:
        # Artifact text is data (card ids, paths, kernel names): Text cells are never parsed as markup.
        cells = [Text(plain(c)) if isinstance(c, str) else c for c in _row(rec)]
        verdict = str(cells[-1])
        reason = plain(summarize(rec).verdict_text.strip())
        cells[-1] = Text(verdict, style=VERDICT_STYLE.get(verdict, ""))
        if reason:
            cells[-1].append("\n" + (reason[:160] + ("…" if len(reason) > 160 else "")), style="dim")
        table.add_row(*cells)
    return table


# ---------------------------------------------------------------------------------------- summary rows
def _ref_parity(r) -> str:
    kind = r.parity_kind
    word = REF_PARITY_WORDS[kind][0]
    shown = kind in ("passes", "fails", "expected_miss") and r.rel_fro is not None
    return f"{r.name} {word}" + (f" {_num(r.rel_fro, 2)}" if shown else "")


def summary_row(e: Entry) -> dict[str, Any]:
    """One summary row as plain data (the terminal and the HTML page both render this)."""
    s = e.summary
    rec = e.record
    recipe = rec.get("recipe") or {}
    prod = s.production_ref
    if s.speedup is not None and s.mode != "gpu_measured":
        speed = f"{s.speedup:.3f}× vs {s.versus} on the CPU"
        speed_sub = "CPU timing: not GPU evidence"
    elif s.speedup is not None:
        speed = f"{s.speedup:.3f}× vs {s.versus}"
        if s.verdict == "no_production_reference":
            speed += " (an alternative: no production kernel was compared)"
        elif not s.versus_production and prod is not None:
            speed += f" (not the production {prod.name})"
        elif not s.versus_production and s.production_names:
            speed += " (not a production kernel)"
        clocks = clocks_text(s)
        speed_sub = (f"{clocks} · " if clocks else "") + f"A/A noise {noise_text(s, band=True)} · {SPEED_WORD[s.speed]}"
    elif s.mode == "gpu_measured":
        speed = "no speedup"
        speed_sub = "no oracle-correct reference timed" if s.verdict == "skipped" else s.verdict
    else:
        speed = "not timed"
        speed_sub = {"compile_only": "compile-only: nothing ran", "cpu_numerics": "CPU numerics only"}.get(s.mode, s.mode)
    port = "—" if s.port_parity is None else (("ok" if s.port_parity else "FAIL") + (f" {_num(s.port_rel_fro, 2)}" if s.port_rel_fro is not None else ""))
    software = rec.get("software") or {}
    soft = " ".join(f"{k} {v}" for k, v in software.items() if v and k in ("torch", "triton", "flydsl"))
    evidence = ["STALE" if e.stale else "current"]
    if e.superseded:
        evidence.append(f"{len(e.superseded)} superseded")
    notes = list(e.stale_reasons) + ([e.tolerance_history] if e.tolerance_history else [])
    # An edit to the card's prose is not news on every row (it is in --json as card_edited).
    return {
        "entry": e,
        "card": e.card,
        "shape_class": e.recipe + (" (untuned)" if recipe.get("untuned") else ""),
        "shape": shape_text(rec),
        "device": s.device_class,
        "verdict": s.verdict,
        "verdict_text": s.verdict_text,
        "speed": speed,
        "speed_sub": speed_sub,
        "speed_axis": s.speed,
        "throughput": throughput_text(rec) if s.mode == "gpu_measured" else "",
        "port_parity": port,
        "port_failed": s.port_parity is False,
        # (text, failed, production): failed only for what a reviewer must look at (a production
        # reference off the oracle, an error), not for an alternative expected to miss the oracle.
        "ref_parity": [(_ref_parity(r), r.fails_unexpectedly, r.production) for r in s.refs],
        "failing_baseline": any(r.role == "baseline" and r.fails_unexpectedly for r in s.refs),
        "timing_mode": s.timing_mode or "—",
        "commit": s.commit + (" (dirty)" if s.dirty else ""),
        "date": s.created[:16].replace("T", " "),
        "software": soft,
        "evidence": evidence,
        "stale_reasons": notes,
        "path": e.path,
    }


def summary_rows(ev: EvidenceIndex) -> list[dict[str, Any]]:
    return [summary_row(e) for e in ev.current_entries()]


def _counts_text(ev: EvidenceIndex) -> str:
    c = ev.counts()
    cur = ev.current_entries()
    gpu = sum(e.key[4] == "gpu_measured" for e in cur)
    parts = [f"{c['current']} current ({gpu} measured on a GPU, {c['current'] - gpu} compile-only or CPU)",
             f"{c['superseded']} superseded", f"{c['stale_current']} of the current are stale"]
    if c["invalid"]:
        parts.append(f"{c['invalid']} invalid file(s)")
    if ev.e2e:  # counted as `lint` and read_validation count them (skillrun.evidence.inventory)
        parts.append(f"and {len(ev.e2e)} e2e record{'' if len(ev.e2e) == 1 else 's'}")
    return f"{c['artifacts']} validation artifact(s): " + ", ".join(parts)


SUMMARY_COLUMNS = ["shape class", "shape", "device", "verdict", "speedup vs production (A/A noise)", "parity port · references",
                   "run", "evidence"]


def summary_table(ev: EvidenceIndex):
    """The reviewer's first screen in the terminal: one row per current artifact, grouped by card."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="Summary: " + _counts_text(ev), show_lines=False, expand=False, title_justify="left")
    for c in SUMMARY_COLUMNS:
        table.add_column(c, overflow="fold")
    card = None
    for row in summary_rows(ev):
        if row["card"] != card:
            if card is not None:
                table.add_section()
            card = row["card"]
            head = Text(card, style="bold")
            if card in ev.cards:  # the card's status, from the same function as `list` and the README
                from skillrun.evidence.verdict import CARD_STATUSES, TONE_STYLE

                status = ev.card_status(card)[0]
                head.append(f"\n{status}", style=TONE_STYLE[CARD_STATUSES.get(status, ('neutral', ''))[0]])
            table.add_row(head, *[""] * (len(SUMMARY_COLUMNS) - 1))
        verdict = Text(row["verdict"], style=VERDICT_STYLE.get(row["verdict"], ""))
        vt = row["verdict_text"].strip()
        # The speedup cell already says faster/slower/within noise; the text matters when nothing was compared.
        if vt and row["verdict"] not in ("validated", "slower", "within_noise", "compile_verified"):
            verdict.append("\n" + vt[:100] + ("…" if len(vt) > 100 else ""), style="dim")
        parity = Text("port " + row["port_parity"], style="bold red" if row["port_failed"] else "")
        for text, failed, prod in row["ref_parity"]:
            parity.append("\n" + text + (" (production)" if prod else ""), style="bold red" if failed else ("" if prod or "expected" not in text else "dim"))
        evidence = Text(" · ".join(row["evidence"]), style="bold red" if row["entry"].stale else "")
        for r in row["stale_reasons"][:1]:
            evidence.append("\n" + r[:70] + ("…" if len(r) > 70 else ""), style="dim")
        speed = Text(row["speed"] + "\n", style=speed_style(row["speed_axis"])) + Text(row["speed_sub"], style="dim")
        table.add_row("  " + row["shape_class"], row["shape"], row["device"], verdict, speed, parity,
                      f"{row['commit']} {row['date']}\n{row['timing_mode']}", evidence)
    return table


def history_table(ev: EvidenceIndex):
    """Superseded records, each under the current one that replaced it (None when there are none)."""
    from rich.table import Table

    rows = [(e, old) for e in ev.current_entries() for old in e.superseded]
    if not rows and not ev.invalid_entries() and not ev.unreliable_entries():
        return None
    table = Table(title="Superseded, unreliable and invalid records (older or untrusted runs of a row above)",
                  show_lines=False, title_justify="left")
    for c in ("current", "older record", "its verdict", "date", "stale"):
        table.add_column(c, overflow="fold")
    for cur, old in rows:
        table.add_row(f"{cur.card} / {cur.recipe} / {shape_text(cur.record)}", old.path, old.summary.verdict,
                      old.summary.created[:16].replace("T", " "), "stale" if old.stale else "")
    for bad in ev.unreliable_entries():  # never current: its timing cannot be trusted
        table.add_row(f"{bad.card} / {bad.recipe} / {shape_text(bad.record)} (not current)", bad.path,
                      f"{bad.summary.verdict}, unreliable", bad.summary.created[:16].replace("T", " "),
                      "; ".join(bad.unreliable_reasons))
    for bad in ev.invalid_entries():
        table.add_row("—", bad.path, "invalid", "", bad.error or "")
    return table


def terminal_report(ev: EvidenceIndex):
    """Summary first, then the superseded/invalid records; a rich renderable."""
    from rich.console import Group

    parts = [summary_table(ev)]
    e2e = e2e_table(ev)
    if e2e is not None:
        parts.append(e2e)
    hist = history_table(ev)
    if hist is not None:
        parts.append(hist)
    return Group(*parts)


def samples_text(path: str, rec: dict[str, Any]):
    """The raw-sample distribution of one artifact for the terminal: a line per slot (kept samples
    of all timed, p10 / median / p90 ms, the median per position in the round, first launched
    first), the hold, and the engine's warnings. None for an artifact without raw samples."""
    from rich.text import Text

    from skillrun.evidence.samples import distributions
    from skillrun.io.termtext import plain

    d = distributions(rec)
    if d is None:
        return None
    width = max(len(plain(s.slot)) for s in d.slots)
    out = Text(f"raw samples: {plain(path)}\n", style="bold")
    if d.hold:
        out.append(f"  {plain(d.hold)}\n", style="dim")
    out.append(f"  {'slot':<{width}}   kept      p10   median      p90 ms   median ms by position (first launched first)\n",
               style="dim")
    for s in d.slots:
        pos = " ".join("—" if v is None else f"{v:.4g}" for v in s.by_position) or "—"
        out.append(f"  {plain(s.slot):<{width}}  {len(s.kept_ms):>3}/{s.total:<3} {s.p10:>8.4g} {s.median:>8.4g} "
                   f"{s.p90:>8.4g}      {pos}\n")
    for w in d.warnings:
        out.append("  warning: ", style="yellow")
        out.append(plain(w) + "\n")
    return out


def samples_report(ev: EvidenceIndex):
    """Raw-sample distributions of every current artifact that has them, with the summary's row
    order (None when none has)."""
    from rich.console import Group

    parts = [t for t in (samples_text(e.path, e.record) for e in ev.current_entries()) if t is not None]
    return Group(*parts) if parts else None


def e2e_rows(ev: EvidenceIndex) -> list[dict[str, str]]:
    """One row per `skill-run e2e` record, newest first: the measured gain beside the projection."""
    def pct(x: Any) -> str:
        return f"{x:+.2f}%" if isinstance(x, (int, float)) else "—"

    rows = []
    for x in sorted(ev.e2e, key=lambda x: str(x.record.get("created")), reverse=True):
        j = x.to_json()
        noise = j["noise_floor_pct"]
        rows.append({"cards": ", ".join(j["card_ids"]) or "—", "verdict": str(j["verdict"] or "—"),
                     "measured": pct(j["measured_gain_pct"]) + (f" (noise {noise:.2f}%)" if isinstance(noise, (int, float)) else ""),
                     "gpu_kernel": pct(j["gpu_kernel_gain_pct"]), "projected": pct(j["projected_gain_pct"]),
                     "outputs": {True: "match", False: "DIFFER"}.get(j["outputs_passed"], "—"),
                     "device": str(j["device"] or "—"), "path": x.path})
    return rows


E2E_COLUMNS = [("cards", "cards"), ("verdict", "verdict"), ("measured", "measured step gain"),
               ("gpu_kernel", "GPU kernel gain"), ("projected", "projected f·(1−1/s)"), ("outputs", "outputs"),
               ("device", "device"), ("path", "record")]


def e2e_table(ev: EvidenceIndex):
    """End-to-end records as a rich table, or None when there are none."""
    rows = e2e_rows(ev)
    if not rows:
        return None
    from rich.table import Table
    from rich.text import Text

    from skillrun.io.termtext import plain

    table = Table(title="End to end (skill-run e2e): the workload with the ports routed in", title_justify="left")
    for _, head in E2E_COLUMNS:
        table.add_column(head, overflow="fold")
    for r in rows:
        table.add_row(*[Text(plain(r[k]), style="red" if k == "outputs" and r[k] == "DIFFER" else "") for k, _ in E2E_COLUMNS])
    return table


# ---------------------------------------------------------------------------------------- SVG charts
_FONT = 11  # px; the SVG text is monospace so a label's width is known without a browser: 0.6 em per char
_CHAR = 0.6 * _FONT


def _nice_step(span: float) -> float:
    for step in (0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10, 20, 25, 50, 100):
        if span / step <= 6:
            return step
    return span / 5


def hbar_svg(title: str, rows: list[dict[str, Any]], unit: str, ref_line: float | None = None,
             ref_label: str | None = None) -> str:
    """Horizontal bars, one per row: {label, value, lo, hi, color, text}. Returns an <svg> element.

    One label per row at the left and the value text at the bar's right end: nothing can overlap,
    and the label column is as wide as the longest label (monospace, so its width is exact).
    """
    e = html.escape
    row_h, top, bottom = 24, 46, 46  # title row, then a row for the reference line's label
    label_w = int(max([len(r["label"]) for r in rows] + [8]) * _CHAR) + 14
    text_w = int(max([len(r["text"]) for r in rows] + [6]) * _CHAR) + 12
    plot_w = 420
    width = label_w + plot_w + text_w + 10
    height = top + row_h * len(rows) + bottom
    vmax = max([r.get("hi") or r["value"] for r in rows] + [ref_line or 0.0]) * 1.08 or 1.0
    x = lambda v: label_w + plot_w * max(0.0, v) / vmax  # noqa: E731
    xr = x(ref_line) if ref_line is not None else None
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img" aria-label="{e(title)}" font-family="ui-monospace,Menlo,Consolas,monospace" '
           f'font-size="{_FONT}">',
           f'<text x="4" y="15" font-size="{_FONT + 1}" font-weight="600">{e(title)}</text>']
    step = _nice_step(vmax)
    t = 0.0
    axis_y = top + row_h * len(rows) + 4
    while t <= vmax + 1e-9:
        xt = x(t)
        out.append(f'<line x1="{xt:.1f}" y1="{top - 4}" x2="{xt:.1f}" y2="{axis_y}" stroke="#eaeef2"/>')
        out.append(f'<text x="{xt:.1f}" y="{axis_y + 14}" text-anchor="middle" fill="#57606a">{t:g}</text>')
        t = round(t + step, 6)
    out.append(f'<text x="{label_w + plot_w:.1f}" y="{axis_y + 28}" text-anchor="end" fill="#57606a">{e(unit)}</text>')
    for i, r in enumerate(rows):
        y = top + i * row_h
        out.append(f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end">{e(r["label"])}</text>')
        out.append(f'<rect x="{label_w}" y="{y + 4}" width="{max(1.0, x(r["value"]) - label_w):.1f}" height="{row_h - 8}" '
                   f'fill="{r.get("color", "#0969da")}" fill-opacity="{r.get("opacity", 1.0)}">'
                   f'<title>{e(r.get("tip", r["text"]))}</title></rect>')
        end = x(r["value"])
        if r.get("lo") is not None and r.get("hi") is not None:
            lo, hi = x(r["lo"]), x(r["hi"])
            ym = y + row_h / 2
            out.append(f'<path d="M{lo:.1f},{ym:.1f}H{hi:.1f}M{lo:.1f},{ym - 5:.1f}V{ym + 5:.1f}M{hi:.1f},{ym - 5:.1f}V{ym + 5:.1f}" '
                       f'stroke="#24292f" stroke-width="1" fill="none"/>')
            end = max(end, hi)
        # The value text starts right of the bar and of the reference line, so the line never crosses it.
        if xr is not None and end < xr:
            end = xr
        out.append(f'<text x="{end + 6:.1f}" y="{y + 15}">{e(r["text"])}</text>')
    if xr is not None:
        out.append(f'<line x1="{xr:.1f}" y1="{top - 6}" x2="{xr:.1f}" y2="{axis_y}" stroke="#24292f" stroke-dasharray="4 3"/>')
        if ref_label:
            anchor = "end" if xr > label_w + plot_w / 2 else "start"
            out.append(f'<text x="{xr + (-4 if anchor == "end" else 4):.1f}" y="{top - 10}" text-anchor="{anchor}" '
                       f'fill="#24292f">{e(ref_label)}</text>')
    out.append("</svg>")
    return "".join(out)


def _common_shape(entries: list[Entry]) -> dict[str, Any]:
    """The shape keys with the same value in every entry (said once, in a chart's title)."""
    if not entries:
        return {}
    first = entries[0].shape
    return {k: v for k, v in first.items() if all(e.shape.get(k) == v for e in entries[1:])} if len(entries) > 1 else {}


def speedup_svg(card_id: str, entries: list[Entry]) -> str | None:
    """Current GPU speedups of one card, one bar per shape; whiskers: ± the A/A noise the verdict used."""
    rows = []
    timed = [e for e in entries if e.summary.speedup is not None]
    # Labels carry only the dimensions that differ, so a long MoE shape does not shrink the chart
    # (and its text) to an unreadable size on a narrow screen; the rest is said once in the title.
    common = _common_shape(timed)
    for e in timed:
        s = e.summary
        n = (s.noise_pct or 0.0) / 100.0
        # Recipe and shape: two shape classes can share a shape (an untuned run and a tuned one).
        label = e.recipe + ": " + (" ".join(f"{k}={v}" for k, v in e.shape.items() if k not in common) or "same shape")
        rows.append({"label": label, "value": s.speedup, "lo": s.speedup * (1 - n), "hi": s.speedup * (1 + n),
                     "color": SPEED_COLOR[s.speed], "opacity": 0.35 if e.stale else 1.0,
                     "text": f"{s.speedup:.3f}× {SPEED_WORD[s.speed]}" + (" (stale)" if e.stale else ""),
                     "tip": f"{e.recipe}: {s.speedup:.3f}× vs {s.versus}, A/A noise {noise_text(s)}"})
    if not rows:
        return None
    chart = hbar_svg("speedup per shape (reference ms / port ms)", rows, "speedup ×", 1.0, "1× = reference")
    if not common:
        return chart
    # Said as HTML beside the chart (it wraps on a narrow screen; text inside an SVG cannot).
    return (f"<p class='muted'>{html.escape(card_id)}: every shape below has "
            + html.escape(" ".join(f"{k}={v}" for k, v in common.items())) + "</p>" + chart)


def timing_svg(rec: dict[str, Any]) -> str | None:
    """Median per slot with the p10–p90 range, and the physical floor when known."""
    t = rec.get("timing") or {}
    slots = []
    if t.get("port_ms"):
        slots.append(("port", t["port_ms"], "#0969da"))
    if t.get("baseline_ms"):
        slots.append(("baseline", t["baseline_ms"], "#8c959f"))
    for name, st in (t.get("alternatives_ms") or {}).items():
        slots.append((f"alt {name}", st, "#afb8c1"))
    slots = [(n, st, c) for n, st, c in slots if isinstance(st, dict) and st.get("median") is not None]
    if not slots:
        return None
    rows = [{"label": n, "value": float(st["median"]), "lo": st.get("p10"), "hi": st.get("p90"), "color": c,
             "text": f"{float(st['median']):.4g} ms"} for n, st, c in slots]
    floor = (rec.get("physical_limit") or {}).get("floor_ms")
    return hbar_svg("median time per slot (whiskers p10–p90)", rows, "ms", floor, "physical floor" if floor else None)


def samples_svg(rec: dict[str, Any]) -> str | None:
    """Each slot's kept samples as a strip (one dot per sample, spread up and down by round so
    repeats stay visible) over its p10–p90 box with the median marked. At most 720 px wide, so an
    800 px page shows its 11 px text at full size. None for an artifact without raw samples."""
    from skillrun.evidence.samples import distributions

    d = distributions(rec)
    if d is None:
        return None
    e = html.escape
    row_h, top, bottom = 30, 26, 40
    texts = [f"{s.median:.4g} ms · {len(s.kept_ms)}/{s.total} kept" for s in d.slots]
    labels = [s.slot if len(s.slot) <= 30 else s.slot[:29] + "…" for s in d.slots]
    label_w = int(max(len(x) for x in labels) * _CHAR) + 14
    text_w = int(max(len(x) for x in texts) * _CHAR) + 12
    plot_w = max(200, 720 - label_w - text_w)
    width, height = label_w + plot_w + text_w, top + row_h * len(d.slots) + bottom
    lo = min(min(s.kept_ms) for s in d.slots)
    hi = max(max(s.kept_ms) for s in d.slots)
    pad = (hi - lo) * 0.05 or hi * 0.05 or 1.0
    lo, hi = max(0.0, lo - pad), hi + pad
    x = lambda v: label_w + plot_w * (v - lo) / (hi - lo)  # noqa: E731
    title = "kept samples per slot, ms (box: p10–p90, bar: median)"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img" aria-label="raw samples" font-family="ui-monospace,Menlo,Consolas,monospace" '
           f'font-size="{_FONT}">', f'<text x="4" y="15" font-size="{_FONT + 1}" font-weight="600">{e(title)}</text>']
    axis_y = top + row_h * len(d.slots) + 4
    # Axis ticks at 1, 2 or 5 times a power of ten, at most five, so their labels never touch.
    mag = 10 ** math.floor(math.log10((hi - lo) / 5))
    step = next(m * mag for m in (1, 2, 5, 10) if (hi - lo) / (m * mag) <= 5)
    k = math.ceil(lo / step)
    while k * step <= hi:
        xt = x(k * step)
        out.append(f'<line x1="{xt:.1f}" y1="{top - 4}" x2="{xt:.1f}" y2="{axis_y}" stroke="#eaeef2"/>')
        out.append(f'<text x="{xt:.1f}" y="{axis_y + 14}" text-anchor="middle" fill="#57606a">{k * step:.6g}</text>')
        k += 1
    # Dots: a deterministic sample of at most 300 per slot, so a huge artifact cannot make a huge page.
    for i, (s, label, text) in enumerate(zip(d.slots, labels, texts)):
        y = top + i * row_h
        ym = y + row_h / 2
        color = "#0969da" if s.slot == "port" else "#6e7781"
        out.append(f'<text x="{label_w - 8}" y="{ym + 4:.1f}" text-anchor="end">{e(label)}<title>{e(s.slot)}</title></text>')
        out.append(f'<rect x="{x(s.p10):.1f}" y="{y + 5}" width="{max(1.0, x(s.p90) - x(s.p10)):.1f}" height="{row_h - 10}" '
                   f'fill="{color}" fill-opacity="0.12" stroke="{color}" stroke-opacity="0.5"/>')
        pts = s.kept_ms[:: max(1, math.ceil(len(s.kept_ms) / 300))]
        for j, v in enumerate(pts):
            out.append(f'<circle cx="{x(v):.1f}" cy="{ym + ((j * 7) % 13 - 6) * 0.8:.1f}" r="2" fill="{color}" fill-opacity="0.6"/>')
        out.append(f'<path d="M{x(s.median):.1f},{y + 3}V{y + row_h - 3}" stroke="#24292f" stroke-width="2"/>')
        out.append(f'<text x="{label_w + plot_w + 6}" y="{ym + 4:.1f}">{e(text)}</text>')
    out.append(f'<text x="{label_w + plot_w:.1f}" y="{axis_y + 30}" text-anchor="end" fill="#57606a">ms</text>')
    out.append("</svg>")
    return "".join(out)


def samples_html(rec: dict[str, Any]) -> str | None:
    """The strip chart with the per-position medians, the hold and the engine's warnings under it."""
    from skillrun.evidence.samples import distributions

    d = distributions(rec)
    if d is None:
        return None
    e = html.escape
    rows = "".join("<tr><td>" + _brk(s.slot) + "</td>" + "".join(
        f"<td class='num'>{'—' if v is None else f'{v:.4g}'}</td>" for v in s.by_position) + "</tr>" for s in d.slots)
    n = max(len(s.by_position) for s in d.slots)
    parts = [samples_svg(rec)]
    if n:
        parts.append("<table class='positions'><thead><tr><th>median ms by position (0 = launched first)</th>"
                     + "".join(f"<th>{i}</th>" for i in range(n)) + f"</tr></thead><tbody>{rows}</tbody></table>")
    if d.hold:
        parts.append(f"<p class='muted'>{e(d.hold)}</p>")
    if d.warnings:
        parts.append("<ul>" + "".join(f"<li class='warn'>{e(w)}</li>" for w in d.warnings) + "</ul>")
    return "<div class='samples'><p><b>raw samples</b></p>" + "".join(parts) + "</div>"


# ---------------------------------------------------------------------------------------- HTML
CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:16px;color:#24292f;max-width:1400px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #d0d7de}h3{font-size:14px;margin:18px 0 6px}
table{border-collapse:collapse;font-size:12px;width:100%;table-layout:auto}
th,td{border:1px solid #d0d7de;padding:4px 6px;vertical-align:top;text-align:left}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.card th{background:#eef2f6;font-size:13px}tr.tier th{background:#ddf4ff;font-size:12px}
tr.stale td{background:#fff8c5}td.fail,div.fail{color:#cf222e;font-weight:600}tr.failref td.parity{background:#ffebe9}
.v{font-weight:600;padding:1px 6px;border-radius:10px;color:#fff;display:inline-block}
.sub,.reason{color:#57606a;font-size:11px}.n{white-space:nowrap}
details{margin:4px 0 10px 0}summary{cursor:pointer;font-size:13px}details details{margin-left:18px}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 10px;font-size:12px;margin:6px 0}
dl.meta dt{color:#57606a}dl.meta dd{margin:0}
.muted{color:#57606a;font-size:12px}svg.chart{max-width:100%;height:auto;display:block;margin:6px 0}
.tag{font-size:11px;border:1px solid #d0d7de;border-radius:8px;padding:0 5px;margin-right:3px;display:inline-block}
.tag.stale{background:#fff8c5;border-color:#d4a72c}.tag.cur{background:#dafbe1;border-color:#4ac26b}
table.sortable th{cursor:pointer}table.sortable th:after{content:" \\2195";color:#8c959f}
ol.legend{font-size:12px;margin:4px 0 10px 0;padding-left:26px}
table.positions{width:auto}li.warn{color:#9a6700;font-size:12px}
"""

# Sorting without a library or the network: a click on a header sorts its table's body by that
# column (data-sort holds the number for numeric cells; text otherwise); a second click reverses.
SORT_JS = """
document.querySelectorAll('table.sortable').forEach(function (t) {
  t.querySelectorAll('thead th').forEach(function (th, i) {
    th.addEventListener('click', function () {
      var body = t.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var dir = th.getAttribute('data-dir') === 'asc' ? -1 : 1;
      t.querySelectorAll('thead th').forEach(function (h) { h.removeAttribute('data-dir'); });
      th.setAttribute('data-dir', dir === 1 ? 'asc' : 'desc');
      function key(r) { var c = r.cells[i]; var v = c.getAttribute('data-sort'); return v === null ? c.textContent : parseFloat(v); }
      rows.sort(function (a, b) { var x = key(a), y = key(b);
        if (typeof x === 'number' && typeof y === 'number') return dir * (x - y);
        return dir * String(x).localeCompare(String(y)); });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""


def _brk(text: Any) -> str:
    """Escaped text that may wrap only after ``_ / , :`` (or a dot before a letter) inside long ids and paths, never inside a
    number or a word (the page never uses overflow-wrap:anywhere, which split ``7168`` into ``7|168``). A C++ name
    fragment with digits longer than a narrow cell (a demangled template in an integrity reason) is shown with its
    middle elided, whole in its tooltip: it cannot wrap without splitting an id, and no reader needs all of it inline."""
    out = []
    for part in re.split(r"(\s+)", str(text)):
        if len(part) > _LONG_CXX and ("::" in part or "<" in part) and re.search(r"\d", part):
            keep = (_LONG_CXX - 1) // 2
            out.append(f'<span class="n" title="{html.escape(part, quote=True)}">{html.escape(part[:keep] + "…" + part[-keep:])}</span>')
        elif _RANGE.match(part):  # a range of numbers (0.981–1.014, p10-p90): a browser may break at its dash
            out.append(f'<span class="n">{html.escape(part)}</span>')
        else:
            out.append(_BREAK_AFTER.sub(r"\g<0><wbr>", html.escape(part)))
    return "".join(out)


_LONG_CXX = 41
_RANGE = re.compile(r"^[(\[]?[a-z]?[\d.]+[×x%]?[-–][a-z]?[\d.]+[×x%]?[)\]]?[,;:.]?$")


# After _ / , : anywhere, after a dot only before a letter (a module path, never a decimal point).
_BREAK_AFTER = re.compile(r"[_/,:]|\.(?=[A-Za-z])")


def _readable(key: str, value: Any) -> str:
    """One artifact field as a reader wants it: no Python reprs, paths relative to the knowledge base."""
    from skillrun.evidence.index import kb_relative

    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_readable(k, v)}" for k, v in value.items() if v is not None) or "—"
    if isinstance(value, (list, tuple)):
        return ", ".join(_readable(key, v) for v in value) or "—"
    if isinstance(value, float):
        return _num(value)
    text = str(value)
    if key in ("path", "source", "artifact") and ("/" in text or "\\" in text):
        return kb_relative(text)
    return text


def throughput_text(rec: dict[str, Any], speedup: float | None = None) -> str:
    """Absolute numbers beside a ratio: the port's TFLOP/s and TB/s, or a reference's (the same work
    in ``speedup`` times the port's time). Empty when the artifact has none."""
    tf, gb = rec.get("tflops"), rec.get("gbps")
    if not isinstance(tf, (int, float)) or not isinstance(gb, (int, float)):
        return ""
    f = 1.0 / speedup if speedup else 1.0
    bound = (rec.get("physical_limit") or {}).get("bound")
    parts = [f"{tf * f:.4g} TFLOP/s", f"{gb * f / 1000:.3g} TB/s"]
    return " · ".join(reversed(parts) if bound == "memory" else parts)


def _badge(verdict: str) -> str:
    # a long verdict (no_production_reference) may wrap after its underscores in a narrow cell
    return f'<span class="v" style="background:{VERDICT_COLOR.get(verdict, "#6e7781")}">{_brk(verdict)}</span>'


def _details_body(rec: dict[str, Any]) -> str:
    e = html.escape
    parts = []
    s = summarize(rec)
    if s.verdict_text:
        parts.append(f"<p><b>verdict</b>: {_badge(s.verdict)} {_brk(s.verdict_text)}</p>")
    written = rec.get("verdict_text") or rec.get("reason")
    if s.recorded_verdict and written:  # re-judged: what the file itself says stays readable
        parts.append(f"<p class='muted'><b>as recorded</b>: {_badge(s.recorded_verdict)} {_brk(str(written))}</p>")
    t = rec.get("timing") or {}
    if t:
        parts.append(f"<p><b>timing</b>: {e(_readable('method', t.get('method')))}; rounds {e(_readable('rounds', t.get('rounds')))}, "
                     f"warm-up {e(_readable('warmup', t.get('warmup')))}; cold L2: {e(_readable('cold_l2', t.get('cold_l2')))}; "
                     f"versus: {_brk(_readable('versus', t.get('versus')))}; A/A noise used by the verdict {e(noise_text(s))}</p>")
        tp = throughput_text(rec)
        if tp:
            refs = "; ".join(f"{r.name} {throughput_text(rec, r.speedup)}" for r in s.refs if r.speedup)
            parts.append(f"<p><b>throughput</b>: port {e(tp)}" + (f"; {e(refs)}" if refs else "") + "</p>")
    pl = rec.get("physical_limit")
    if pl:
        parts.append(f"<p><b>physical floor</b>: {_num(pl.get('floor_ms'))} ms ({e(str(pl.get('bound')))}-bound; "
                     f"{e(str(pl.get('device_peak')))}: {_num(pl.get('peak_tflops'))} TF, {_num(pl.get('peak_gbps'))} GB/s) "
                     f"— {'passed' if pl.get('passed') else 'FAILED'}</p>")
    gates = rec.get("slot_integrity") or {}
    if gates:
        items = "".join(f"<li>{e(str(k))}: {'passed' if (g or {}).get('passed') else 'FAILED'} — {_brk(str((g or {}).get('reason', '')))}</li>"
                        for k, g in gates.items())
        parts.append(f"<p><b>slot integrity</b></p><ul>{items}</ul>")
    par = rec.get("parity") or {}
    rows = []
    for name, p in [("port", par.get("port")), ("baseline", par.get("baseline"))] + \
            [(f"alt {k}", v) for k, v in (par.get("alternatives") or {}).items()]:
        if p:
            cls = " class='fail'" if p.get("passed") is False else ""
            rows.append(f"<tr{cls}>" + "".join(f"<td>{_brk(x)}</td>" for x in (
                name, p.get("kernel", ""), parity_text(p))) + "".join(f"<td class='num'>{e(str(x))}</td>" for x in (
                _num(p.get("max_abs_err")), _num(p.get("rel_fro")), _num(p.get("cosine"), 6), p.get("mismatched", "—")))
                + f"<td>{_brk((p.get('error') or '')[:300])}</td></tr>")
    if rows:
        parts.append("<table><tr><th>slot</th><th>kernel</th><th>parity</th><th>max abs</th><th>rel_fro</th>"
                     "<th>cosine</th><th>mismatched</th><th>error</th></tr>" + "".join(rows) + "</table>")
    gates_c = (rec.get("compile") or {}).get("gates") or []
    if gates_c:
        items = "".join(f"<li>{e(str(g.get('name')))}: {'passed' if g.get('passed') else 'FAILED'} — {e(str(g.get('reason', '')))}</li>"
                        for g in gates_c if isinstance(g, dict))
        parts.append(f"<p><b>compile gates</b> (static facts of the compiled code; nothing ran)</p><ul>{items}</ul>")
    chart = timing_svg(rec)
    if chart:
        parts.append(chart)
    dist = samples_html(rec)
    if dist:
        parts.append(dist)
    notes = rec.get("notes") or []
    if notes:
        parts.append("<ul>" + "".join(f"<li>{e(str(n))}</li>" for n in notes) + "</ul>")
    meta = {k: rec.get(k) for k in ("created", "command", "mode", "seeds", "tolerance", "software", "runner", "card", "recipe")
            if rec.get(k) is not None}
    if isinstance(meta.get("card"), dict):  # the card's sha256 is for staleness, not for a reader
        meta["card"] = {k: v for k, v in meta["card"].items() if k != "sha256"}
    if isinstance(meta.get("recipe"), dict):
        meta["recipe"] = {k: v for k, v in meta["recipe"].items() if k not in ("kernel_source_sha256", "kernel_sources")}
    parts.append("<dl class='meta'>" + "".join(f"<dt>{e(k)}</dt><dd>{_brk(_readable(k, v))}</dd>" for k, v in meta.items())
                 + "</dl>")
    return "".join(parts)


def _entry_details(e: Entry) -> str:
    esc = html.escape
    tags = f"<span class='tag {'stale' if e.stale else 'cur'}'>{esc(e.label)}</span>"
    title = f"{e.recipe} — {shape_text(e.record)} — {e.summary.device_class} — {e.summary.verdict}"
    body = [f"<p class='muted'>{_brk(e.path)}</p>"]
    if e.stale:
        body.append("<p class='fail'>stale: " + esc("; ".join(e.stale_reasons)) + "</p>")
    elif e.card_edited:
        body.append("<p class='muted'>the card file changed since this run; the recipe's kernel, config and tolerance did not</p>")
    body.append(_details_body(e.record))
    for old in e.superseded:
        otag = f"<span class='tag'>{esc(old.label)}</span>"
        body.append(f"<details><summary>{otag}{esc(old.summary.created[:16].replace('T', ' '))} — {esc(old.summary.verdict)} "
                    f"— {_brk(old.path)}</summary><p class='muted'>superseded by {_brk(old.superseded_by)}</p>"
                    f"{_details_body(old.record)}</details>")
    return f"<details><summary>{tags}{_brk(title)}</summary>{''.join(body)}</details>"


def summary_html(ev: EvidenceIndex) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in SUMMARY_COLUMNS)
    out = [f"<table id='summary' class='summary'><thead><tr>{head}</tr></thead><tbody>"]
    tier_of = {"gpu_measured": "Measured on a GPU", "cpu_numerics": "CPU numerics (no GPU timing)",
               "compile_only": "Compile-only checks on a CPU (nothing ran; no timing, no numerics)"}
    tier = card = None
    for row in summary_rows(ev):
        ent: Entry = row["entry"]
        t = tier_of.get(ent.key[4], ent.key[4])
        if t != tier:
            tier, card = t, None
            out.append(f"<tr class='tier'><th colspan='{len(SUMMARY_COLUMNS)}'>{e(t)}</th></tr>")
        if row["card"] != card:
            card = row["card"]
            out.append(f"<tr class='card'><th colspan='{len(SUMMARY_COLUMNS)}'>{_brk(card)}</th></tr>")
        cls = " ".join(c for c in ("stale" if ent.stale else "", "failref" if row["failing_baseline"] else "") if c)
        refs = "".join(f"<div class='{'fail' if failed else ''}'>{_brk(text)}{' (production)' if prod else ''}</div>"
                       for text, failed, prod in row["ref_parity"])
        vt = row["verdict_text"]
        evid = " ".join(f"<span class='tag {'stale' if w == 'STALE' else ('cur' if w == 'current' else '')}'>{e(w)}</span>"
                        for w in row["evidence"])
        if row["stale_reasons"]:
            evid += "<div class='sub'>" + _brk("; ".join(row["stale_reasons"])) + "</div>"
        out.append(
            f"<tr class='{cls}' data-path='{e(row['path'])}'>"
            f"<td>{_brk(row['shape_class'])}</td><td>{_brk(row['shape'])}</td><td>{e(row['device'])}</td>"
            f"<td>{_badge(row['verdict'])}<div class='reason'>{_brk(vt[:220])}{'…' if len(vt) > 220 else ''}</div></td>"
            f"<td><div style='color:{SPEED_COLOR[row['speed_axis']]};font-weight:600'>{_brk(row['speed'])}</div>"
            f"<div class='sub'>{_brk(row['speed_sub'])}</div>"
            + (f"<div class='sub'>{e(row['throughput'])}</div>" if row['throughput'] else "") + "</td>"
            f"<td class='parity'><div class='{'fail' if row['port_failed'] else ''}'>port {_brk(row['port_parity'])}</div>{refs}</td>"
            f"<td>{e(row['commit'])}<div class='sub'>{e(row['date'])} · {e(row['timing_mode'])}</div>"
            f"<div class='sub'>{e(row['software'])}</div></td>"
            f"<td>{evid}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def measurements_html(ev: EvidenceIndex) -> str | None:
    """Every current GPU measurement in one flat, sortable table (numbers carry data-sort)."""
    ents = [x for x in ev.current_entries() if x.key[4] == "gpu_measured"]
    if not ents:
        return None
    e = html.escape
    heads = ["card", "shape class", "shape", "verdict", "speedup", "A/A noise %", "port TFLOP/s", "port TB/s",
             "reference TFLOP/s", "% of roofline"]

    def num(x: Any, digits: int = 4) -> str:
        if not isinstance(x, (int, float)):
            return "<td class='num' data-sort='-1'>—</td>"
        return f"<td class='num' data-sort='{float(x)!r}'>{_num(x, digits)}</td>"

    rows = []
    for x in ents:
        s, rec = x.summary, x.record
        tf, gb = rec.get("tflops"), rec.get("gbps")
        ref_tf = tf / s.speedup if isinstance(tf, (int, float)) and s.speedup else None
        rows.append("<tr>" + f"<td>{_brk(x.card)}</td><td>{_brk(x.recipe)}</td><td>{_brk(shape_text(rec))}</td>"
                    f"<td>{_badge(s.verdict)}{'<div class=sub>stale</div>' if x.stale else ''}</td>" + num(s.speedup)
                    + num(s.noise_pct, 3) + num(tf) + num(gb / 1000 if isinstance(gb, (int, float)) else None, 3)
                    + num(ref_tf) + num(_roofline_share(rec), 3) + "</tr>")
    head = "".join(f"<th>{e(h)}</th>" for h in heads)
    return f"<table id='measurements' class='sortable'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def roofline_svg(entries: list[Entry]) -> str | None:
    """Port and headline reference of each shape on the device's compute and bandwidth ceilings.

    Log-log: x = arithmetic intensity (FLOP per byte moved, from the artifact's TFLOP/s and GB/s),
    y = TFLOP/s. Points are numbered; the numbers are explained in a list under the chart (HTML,
    so long shapes wrap instead of shrinking the chart).
    """
    import math

    pts = []
    peak_tf = peak_gb = None
    for x in entries:
        rec, s = x.record, x.summary
        tf, gb = rec.get("tflops"), rec.get("gbps")
        pl = rec.get("physical_limit") or {}
        if not isinstance(tf, (int, float)) or not isinstance(gb, (int, float)) or tf <= 0 or gb <= 0:
            continue
        peak_tf = peak_tf or pl.get("peak_tflops")
        peak_gb = peak_gb or pl.get("peak_gbps")
        ai = tf * 1000.0 / gb  # (TFLOP/s) / (GB/s) * 1000 = FLOP per byte
        ref = tf / s.speedup if s.speedup else None
        pts.append((ai, tf, ref, x))
    if not pts or not peak_tf or not peak_gb:
        return None
    e = html.escape
    W, H, L, R, T, B = 560, 320, 56, 30, 30, 44
    ridge = peak_tf * 1000.0 / peak_gb
    xs = [p[0] for p in pts] + [ridge]
    ys = [p[1] for p in pts] + [p[2] for p in pts if p[2]] + [peak_tf]
    x0, x1 = 10 ** math.floor(math.log10(min(xs) / 2)), 10 ** math.ceil(math.log10(max(xs) * 2))
    y0, y1 = 10 ** math.floor(math.log10(min(ys) / 2)), 10 ** math.ceil(math.log10(max(ys) * 1.5))
    fx = lambda v: L + (W - L - R) * (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))  # noqa: E731
    fy = lambda v: H - B - (H - T - B) * (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0))  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
           f'aria-label="roofline" font-family="ui-monospace,Menlo,Consolas,monospace" font-size="{_FONT}">',
           f'<text x="4" y="15" font-size="{_FONT + 1}" font-weight="600">roofline: TFLOP/s vs FLOP per byte (log-log)</text>']
    d = 0
    while x0 * 10 ** d <= x1 * 1.0001:
        v = x0 * 10 ** d
        out.append(f'<line x1="{fx(v):.1f}" y1="{T}" x2="{fx(v):.1f}" y2="{H - B}" stroke="#eaeef2"/>'
                   f'<text x="{fx(v):.1f}" y="{H - B + 18}" text-anchor="middle" fill="#57606a">{v:g}</text>')
        d += 1
    d = 0
    while y0 * 10 ** d <= y1 * 1.0001:
        v = y0 * 10 ** d
        out.append(f'<line x1="{L}" y1="{fy(v):.1f}" x2="{W - R}" y2="{fy(v):.1f}" stroke="#eaeef2"/>'
                   f'<text x="{L - 4}" y="{fy(v) + 4:.1f}" text-anchor="end" fill="#57606a">{v:g}</text>')
        d += 1
    out.append(f'<text x="{W - R}" y="{H - 8}" text-anchor="end" fill="#57606a">FLOP/byte</text>')
    # The ceilings: bandwidth slope up to the ridge point, then the compute roof.
    xa = x0
    ya = xa * peak_gb / 1000.0
    if ya < y0:
        xa, ya = y0 * 1000.0 / peak_gb, y0
    out.append(f'<path d="M{fx(xa):.1f},{fy(ya):.1f}L{fx(ridge):.1f},{fy(peak_tf):.1f}L{fx(x1):.1f},{fy(peak_tf):.1f}" '
               f'stroke="#24292f" stroke-width="1.5" fill="none"/>')
    out.append(f'<text x="{fx(x1) - 4:.1f}" y="{fy(peak_tf) - 6:.1f}" text-anchor="end">{peak_tf:g} TFLOP/s</text>')
    out.append(f'<text x="{L + 4}" y="{T + 12}" fill="#57606a">slope: {peak_gb / 1000:g} TB/s</text>')
    legend = []
    for i, (ai, tf, ref, x) in enumerate(pts, 1):
        s = x.summary
        cx, cy = fx(ai), fy(tf)
        if ref:
            ry = fy(ref)
            out.append(f'<line x1="{cx:.1f}" y1="{cy:.1f}" x2="{cx:.1f}" y2="{ry:.1f}" stroke="#8c959f" stroke-dasharray="2 2"/>'
                       f'<rect x="{cx - 4:.1f}" y="{ry - 4:.1f}" width="8" height="8" fill="#fff" stroke="#57606a">'
                       f'<title>{e(f"{i}: {s.versus} {ref:.4g} TFLOP/s")}</title></rect>')
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{SPEED_COLOR[s.speed]}" fill-opacity="{0.35 if x.stale else 1}">'
                   f'<title>{e(f"{i}: port {tf:.4g} TFLOP/s")}</title></circle>')
        legend.append(f"<li>{_brk(x.recipe)} {_brk(shape_text(x.record))}: port <span class='n'>{tf:.4g} TFLOP/s</span>"
                      + (f", {_brk(s.versus)} <span class='n'>{ref:.4g} TFLOP/s</span>" if ref else "")
                      + f" <span class='n'>({ai:.3g} FLOP/byte)</span>" + (" (stale)" if x.stale else "") + "</li>")
    # Point numbers sit in a column right of the plot, at their point's height, pushed apart so
    # they never overlap (the list under the chart says what each number is), with a leader line.
    placed: list[float] = []
    for i, (ai, tf, _, _) in sorted(enumerate(pts, 1), key=lambda t: fy(t[1][1])):
        y = max(fy(tf) + 4, (placed[-1] + 14) if placed else T + 10)
        placed.append(y)
        out.append(f'<line x1="{fx(ai) + 5:.1f}" y1="{fy(tf):.1f}" x2="{W - R + 2}" y2="{y - 4:.1f}" stroke="#d0d7de"/>'
                   f'<text x="{W - R + 4}" y="{y:.1f}">{i}</text>')
    out.append("</svg>")
    return ("<div class='roofline'>" + "".join(out) + "<p class='muted'>circles: the port (colour: faster, within noise, "
            "slower than the headline reference); squares: that reference, the same work in its measured time; "
            "numbers at the right:</p><ol class='legend'>" + "".join(legend) + "</ol></div>")


def render_html(ev: EvidenceIndex, title: str = "skillrun validation report") -> str:
    e = html.escape
    body = [f"<h1>{e(title)}</h1><p class='muted'>{e(_counts_text(ev))}</p>",
            "<p class='muted'>One row per current artifact of each card, shape class (recipe), shape, device class and mode; "
            "older runs of the same row are superseded and sit collapsed under it below. Speedup = reference median ms / port "
            "median ms from same-session interleaved rounds, against the card's production baseline unless it failed the fp32 "
            "oracle or refused the shape (then the row names the reference used). A speedup inside the A/A noise is "
            "'within noise'. Stale: the kernel source or the recipe changed since the run. Compile-only rows are static facts "
            "of compiled code: nothing ran.</p>",
            "<h2>Summary</h2>", summary_html(ev)]
    table = measurements_html(ev)
    if table:
        body += ["<h2>GPU measurements (sortable)</h2><p class='muted'>Click a column to sort. Absolute throughput "
                 "is the port's; the reference's (the one the speedup is against) is the same work in its measured time.</p>", table]
    by_tier: dict[str, dict[str, list[Entry]]] = defaultdict(lambda: defaultdict(list))
    for ent in ev.current_entries():
        by_tier["gpu" if ent.key[4] == "gpu_measured" else "other"][ent.card].append(ent)
    if by_tier.get("gpu"):
        body.append("<h2>Measured on a GPU</h2>")
        for card, ents in by_tier["gpu"].items():
            body.append(f"<h3>{_brk(card)}</h3>")
            for chart in (speedup_svg(card, ents), roofline_svg(ents)):
                if chart:
                    body.append(chart)
            body += [_entry_details(x) for x in ents]
    if by_tier.get("other"):
        body.append("<h2>Compile-only and CPU evidence</h2>")
        for card, ents in by_tier["other"].items():
            body.append(f"<h3>{_brk(card)}</h3>")
            body += [_entry_details(x) for x in ents]
    rows = e2e_rows(ev)
    if rows:
        body.append("<h2>End to end (skill-run e2e)</h2><p class='muted'>The user's workload run as-is and with the ports "
                    "routed in, interleaved, with an A/A noise floor; the measured gain beside the plan's projection.</p>")
        head = "".join(f"<th>{e(h)}</th>" for _, h in E2E_COLUMNS)
        trs = "".join("<tr>" + "".join(f"<td>{_brk(r[k])}</td>" for k, _ in E2E_COLUMNS) + "</tr>" for r in rows)
        body.append(f"<table class='sortable'><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
    bad = ev.invalid_entries()
    if bad:
        body.append("<h2>Invalid files</h2><ul>" + "".join(f"<li>{_brk(b.path)}: {_brk(b.error or '')}</li>" for b in bad) + "</ul>")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{e(title)}</title><style>{CSS}</style></head><body>{''.join(body)}<script>{SORT_JS}</script></body></html>")


def write_html(evidence: EvidenceIndex | list[dict[str, Any]], out: Path) -> Path:
    """Write one self-contained page (no external resources) and return its path.

    Takes an evidence index, or plain records (a run's results), which are indexed without a
    knowledge base (so nothing is marked stale).
    """
    ev = evidence if isinstance(evidence, EvidenceIndex) else build_index(None, records=evidence, root=Path.cwd())
    out = Path(out)
    if not out.parent.is_dir():  # a typo in the folder must not create a tree somewhere unexpected
        raise InputError("the folder for the HTML report does not exist (create it first)", path=str(out.parent))
    page = render_html(ev)
    from skillrun.io.atomic import write_atomic

    return write_atomic(out, page)  # fresh temporary name + rename: a planted OUT.tmp link redirects nothing
