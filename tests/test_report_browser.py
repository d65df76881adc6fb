"""The HTML report laid out by a real browser: headless Chromium at 1400 px and 800 px.

A copy of the page gets a small script that, after load, opens every <details>, then writes into
the DOM what it measured: summary rows, cells whose content is wider than the cell, any element
whose text runs out of its box, horizontal page overflow, chart labels that overlap each other or
leave their SVG. ``--dump-dom`` returns the DOM with that result. Nothing is written to the repo
(the page, the profile folder and any screenshot live in pytest's tmp_path).

Needs Debian's ``chromium`` (``apt-get install -y chromium``); skips with that reason otherwise.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from skillrun.evidence.index import build_index
from skillrun.kb.index import SkillIndex
from skillrun.output.report import render_html

REPO = Path(__file__).resolve().parents[1]
BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="headless Chromium not installed (apt-get install -y chromium)")

CHECK = r"""
window.addEventListener('load', () => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const res = {summary_rows: document.querySelectorAll('#summary tbody tr[data-path]').length,
               summary_first: document.querySelector('h2') && document.querySelector('h2').textContent,
               width: window.innerWidth,
               page_overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,
               cells: [], boxes: [], overlap: [], outside: []};
  for (const c of document.querySelectorAll('td, th')) {
    if (c.scrollWidth > c.clientWidth + 1) res.cells.push(c.textContent.slice(0, 80));
  }
  for (const el of document.querySelectorAll('body *')) {
    if (el.closest('svg') || el.id === 'layout-check') continue;
    if (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) res.boxes.push(el.tagName + ': ' + el.textContent.slice(0, 60));
  }
  for (const svg of document.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    const ts = [...svg.querySelectorAll('text')].map(t => [t.textContent, t.getBoundingClientRect()]);
    for (const [s, r] of ts) {
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) res.outside.push(s);
    }
    for (let i = 0; i < ts.length; i++) for (let j = i + 1; j < ts.length; j++) {
      const a = ts[i][1], b = ts[j][1];
      if (a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5)
        res.overlap.push([ts[i][0], ts[j][0]]);
    }
  }
  // A number (or id with digits) laid out on two lines: one token, more than one line box.
  res.split = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement.closest('svg, script, style')) continue;
    const re = /[^\s]*\d[^\s]*/g; let m;
    while ((m = re.exec(n.textContent)) !== null) {
      const r = document.createRange(); r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
      const tops = new Set([...r.getClientRects()].filter(b => b.width > 0).map(b => Math.round(b.top)));
      if (tops.size > 1) res.split.push(m[0].slice(0, 40));
    }
  }
  // Chart text rendered smaller than 9 px on screen (an SVG scaled down to fit the page).
  res.tiny = [];
  for (const t of document.querySelectorAll('svg text')) {
    const h = t.getBoundingClientRect().height;
    if (h > 0 && h < 9) res.tiny.push(t.textContent.slice(0, 40) + ' @' + h.toFixed(1) + 'px');
  }
  res.sortable = document.querySelectorAll('table.sortable').length;
  res.sample_charts = [...document.querySelectorAll('svg[aria-label="raw samples"]')].filter(s => s.getBoundingClientRect().width > 0).length;
  const pre = document.createElement('pre'); pre.id = 'layout-check'; pre.textContent = JSON.stringify(res);
  document.body.appendChild(pre);
});
"""


def layout(page: str, width: int, tmp: Path) -> dict:
    html_path = tmp / f"page_{width}.html"
    html_path.write_text(page.replace("</body>", f"<script>{CHECK}</script></body>"), encoding="utf-8")
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp / 'profile'}", f"--window-size={width},1000", "--virtual-time-budget=5000",
           "--dump-dom", html_path.as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="layout-check">([^<]*)</pre>', out.stdout)
    assert m, f"no layout result from {BROWSER} (rc {out.returncode}): {out.stderr[-500:]}"
    import html

    return json.loads(html.unescape(m.group(1)))


@pytest.fixture(scope="module")
def repo_page() -> str:
    # The repository's own artifacts: long kernel paths, stale rows, failing baselines, several charts.
    return render_html(build_index(SkillIndex.load(REPO)))


@pytest.mark.parametrize("width", [1400, 800])
def test_report_lays_out_without_overflow(repo_page: str, width: int, tmp_path: Path):
    res = layout(repo_page, width, tmp_path)
    assert res["width"] == width
    assert res["summary_first"] == "Summary"
    assert res["summary_rows"] >= 30  # one row per current artifact of the repository
    assert res["cells"] == [], f"text wider than its cell at {width}px: {res['cells'][:5]}"
    assert res["boxes"] == [], f"text running out of its box at {width}px: {res['boxes'][:5]}"
    assert res["page_overflow"] <= 0, f"page scrolls sideways by {res['page_overflow']}px at {width}px"
    assert res["overlap"] == [], f"chart labels overlap at {width}px: {res['overlap'][:5]}"
    assert res["outside"] == [], f"chart labels leave their chart at {width}px: {res['outside'][:5]}"
    assert res["split"] == [], f"numbers or ids broken across lines at {width}px: {res['split'][:8]}"
    assert res["tiny"] == [], f"chart text below 9 px at {width}px: {res['tiny'][:5]}"
    assert res["sortable"] >= 1
    assert res["sample_charts"] >= 5  # the held-engine artifacts' raw samples, laid out and checked like every chart


def test_report_has_roofline_absolute_throughput_and_readable_details(repo_page: str):
    assert "aria-label=\"roofline\"" in repo_page and "TFLOP/s" in repo_page and "TB/s" in repo_page
    assert "overflow-wrap:anywhere" not in repo_page
    # details are values a reader wants: no Python reprs, no absolute path from the machine that ran it
    assert "{'" not in repo_page and "/work/main/" not in repo_page


def test_clicking_a_header_sorts_the_table(repo_page: str, tmp_path: Path):
    click = ("window.addEventListener('load', () => { const t = document.getElementById('measurements');"
             " const th = [...t.querySelectorAll('thead th')].find(h => h.textContent === 'speedup'); th.click();"
             " const v = [...t.tBodies[0].rows].map(r => parseFloat(r.cells[th.cellIndex].getAttribute('data-sort')));"
             " const pre = document.createElement('pre'); pre.id = 'layout-check'; pre.textContent = JSON.stringify(v);"
             " document.body.appendChild(pre); });")
    html_path = tmp_path / "sort.html"
    html_path.write_text(repo_page.replace("</body>", f"<script>{click}</script></body>"), encoding="utf-8")
    out = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p'}",
                          "--virtual-time-budget=5000", "--dump-dom", html_path.as_uri()], capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="layout-check">([^<]*)</pre>', out.stdout)
    assert m, out.stderr[-500:]
    values = json.loads(m.group(1))
    assert len(values) >= 10 and values == sorted(values)


def test_checker_catches_overflow(tmp_path: Path):
    # The check itself must be able to fail: an unbreakable string in a fixed-width cell, two stacked labels.
    bad = ("<!DOCTYPE html><html><body><table id='summary'><tbody><tr data-path='x'><td style='width:40px;max-width:40px;"
           "overflow:hidden'>" + "x" * 200 + "</td></tr></tbody></table><svg width='200' height='40'><text x='10' y='20'>"
           "label one</text><text x='12' y='22'>label two</text></svg></body></html>")
    res = layout(bad, 800, tmp_path)
    assert res["cells"] and res["overlap"]
    # a number in a narrow box that may break anywhere, and an SVG squeezed to a tenth of its size
    bad = ("<!DOCTYPE html><html><body><div style='width:30px;overflow-wrap:anywhere'>model_dim=716812345</div>"
           "<svg viewBox='0 0 2000 100' width='200'><text x='10' y='50' font-size='11'>tiny</text></svg></body></html>")
    res = layout(bad, 800, tmp_path)
    assert res["split"] and res["tiny"]
