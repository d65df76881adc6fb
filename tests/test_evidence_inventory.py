"""`report`, `lint` and the agent's read_validation count the committed validation/ folder the same way."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from skillrun import api
from skillrun.agent import schemas as S
from skillrun.agent.tools import AgentTools

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1", TERM="dumb", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "skillrun", *args], capture_output=True, text=True, timeout=600, env=env)


def test_report_lint_and_read_validation_count_the_same_files():
    folder = REPO / "validation"
    files = [p for p in folder.rglob("*.yaml") if not p.name.startswith(".")]
    tuning = [p for p in files if "_tuning" in p.relative_to(folder).parts]
    listed = AgentTools(api.load_index()).read_validation(S.ReadValidationArgs())
    c = listed["counts"]
    assert listed["total"] == len(files) == c["files"]
    assert c["tuning_artifacts"] == len(tuning) and c["e2e_records"] >= 0
    assert c["validation_artifacts"] + c["e2e_records"] + c["tuning_artifacts"] == len(files)
    lint = json.loads(_cli("lint", "--json").stdout)
    assert lint["checked"]["artifacts"] == c["validation_artifacts"]
    assert lint["checked"]["e2e_records"] == c["e2e_records"] and lint["checked"]["tuning_artifacts"] == c["tuning_artifacts"]
    report = _cli("report").stdout
    m = re.search(r"Summary: (\d+) validation artifact", report)
    assert m and int(m.group(1)) == c["validation_artifacts"]
    text = _cli("lint").stdout + _cli("lint").stderr
    assert f"{c['validation_artifacts']} validation artifact" in text


def test_report_csv_gives_the_speedup_as_a_number():
    import csv
    import io

    from skillrun import api

    rows = list(csv.DictReader(io.StringIO(_cli("report", "--format", "csv").stdout)))
    timed = [r for r in rows if r["speedup"]]
    assert timed
    ev = api.evidence(api.load_index())
    for r in timed:
        # a number: the headline as the evidence index judges the artifact today (the recorded speedup
        # may be against a reference the headline rule no longer picks)
        assert float(r["speedup"]) == ev.find(r["path"]).summary.speedup
        assert r["speed"].startswith(f"{float(r['speedup']):.3f}×")  # the sentence stays beside it
    assert all(r["speedup"] == "" for r in rows if r not in timed)
