"""Numbers that cannot go stale (issue 34): the README's results tables and every card's evidence table
are generated from the committed artifacts, the committed text is what the evidence generates, and
`list`, `report` and the README say the same status for every card."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from skillrun import api
from skillrun.evidence.index import build_index
from skillrun.kb.index import SkillIndex
from skillrun.output import markdown as md

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ev():
    return build_index(SkillIndex.load(REPO))


def test_every_generated_block_is_what_the_committed_evidence_generates(ev):
    docs = md.documents(REPO, ev)
    readme = REPO / "README.md"
    assert set(md.block_names(docs[readme][0])) == {"cards", "results"}
    cards = sorted(p.parent.name for p in docs if p != readme)
    assert cards == sorted(SkillIndex.load(REPO).skills)  # every card carries its evidence table
    stale = [str(p.relative_to(REPO)) for p, (old, new) in docs.items() if old != new]
    assert not stale, f"regenerate with `skill-run report --markdown --write`: {stale}"


def test_a_changed_verdict_changes_the_generated_text(ev, monkeypatch):
    """The comparison can fail: the same blocks from evidence that reads differently are different."""
    (entry,) = [e for e in ev.current_entries() if e.path.endswith(".yaml") and "20261202T035955Z" in e.path]
    before = md.results_block(ev)
    monkeypatch.setattr(entry.summary, "verdict", "validated")
    assert md.results_block(ev) != before
    text = (REPO / "README.md").read_text()
    assert md.fill(text, {"results": md.results_block(ev)}) != text


def test_fill_replaces_only_the_inside_of_a_named_block():
    text = "a\n" + md.BEGIN.format(name="x") + "\nold\n" + md.END.format(name="x") + "\nb\n"
    assert md.fill(text, {"x": "new"}) == "a\n" + md.BEGIN.format(name="x") + "\nnew\n" + md.END.format(name="x") + "\nb\n"
    assert md.fill(text, {"y": "new"}) == text


def _readme_statuses() -> dict[str, str]:
    text = (REPO / "README.md").read_text()
    block = text[text.index(md.BEGIN.format(name="cards")):text.index(md.END.format(name="cards"))]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z0-9_]+)` \| `([a-z_]+)` \|", block, re.M)}


def test_list_report_and_readme_agree_on_every_cards_status(ev):
    index = SkillIndex.load(REPO)
    listed = {r["id"]: r["validation"] for r in api.list_cards(index)}
    readme = _readme_statuses()
    reported = {cid: ev.card_status(cid)[0] for cid in index.skills}
    assert listed == readme == reported and len(listed) == len(index.skills)
    # the fp8 MoE card: measured on the H200 but against no production kernel, said the same everywhere
    assert listed["triton_moe_fp8_blockscale_sm90"] == "measured"
    res = subprocess.run([sys.executable, "-m", "skillrun", "list", "--json"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert {r["id"]: r["validation"] for r in json.loads(res.stdout)["cards"]} == readme


def test_the_readme_quotes_no_contradicted_or_unsourced_figure():
    text = (REPO / "README.md").read_text()
    for gone in ("50–60 µs", "25–45 %", "13–49 %", "No H200 e2e\nrecord exists yet", "not yet run on a GPU)",
                 "nothing is measured against it yet"):
        assert gone not in text, gone
    for card in (REPO / "skills").glob("*/SKILL.md"):
        body = card.read_text()
        assert "nothing is measured against it yet" not in body and "Nothing about its speed" not in body, card
