"""Evidence only the runner writes (issue 36): the ledger, the index's untrusted and lost entries,
and the schema rules a forged record meets first (no 'validated' on a CPU record, no future date).

The end-to-end half (a port that tries to write the knowledge base from inside its sandbox) is in
tests/test_execute_sandbox.py; here the files are planted directly, as a port without a sandbox (or
anything else) could plant them, and the index must not take them for evidence.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from skillrun.errors import SkillRunError
from skillrun.evidence import ledger
from skillrun.evidence.index import build_index
from skillrun.evidence.validation import load_artifact, write_artifact
from skillrun.kb.index import SkillIndex
from test_evidence import NARROW, WIDE, kb, record  # noqa: F401  (kb: the fixture)


def _cpu(rec: dict) -> dict:
    rec = copy.deepcopy(rec)
    rec.update(mode="cpu_numerics", device={"kind": "cpu", "name": "Intel Xeon", "arch": None})
    return rec


def test_a_forged_artifact_a_rewritten_one_and_a_deleted_one_are_not_evidence(kb):
    v = kb / "validation"
    honest = write_artifact(record(kb, "2026-11-29T10:00:00+00:00", NARROW, speedup=0.9, verdict="slower"), v)
    other = write_artifact(record(kb, "2026-11-29T10:05:00+00:00", WIDE, recipe="wide_n",
                                  config={"tile_m": 64, "tile_n": 256}, speedup=0.95, verdict="slower"), v)
    gone = write_artifact(record(kb, "2026-11-29T10:10:00+00:00", {"M": 64, "N": 4096, "K": 4096}, recipe="k_light",
                                 config={"tile_m": 64}, speedup=0.97, verdict="slower"), v)
    # what a port could do to the folder: a newer, schema-valid 'validated 1.93x' beside the honest run ...
    forged = honest.parent / "20261130T000000Z_narrow_n_M4096xN2048xK7168_gpu_measured.yaml"
    forged.write_text(yaml.safe_dump(record(kb, "2026-11-30T00:00:00+00:00", NARROW, speedup=1.93)))
    assert load_artifact(forged)["verdict"] == "validated"  # it passes the schema: only the ledger tells
    # ... another run's record rewritten in place, a third deleted
    text = yaml.safe_load(other.read_text())
    text.update(speedup=9.7, verdict="validated")
    other.write_text(yaml.safe_dump(text))
    gone.unlink()

    ev = build_index(SkillIndex.load(kb))
    cur = {e.path: e for e in ev.current_entries()}
    assert [e.summary.verdict for e in cur.values()] == ["slower"], cur  # the honest run alone is evidence
    bad = {Path(e.path).name: e for e in ev.untrusted_entries()}
    assert "not written by the runner" in bad[forged.name].error
    assert "changed since the runner wrote it" in bad[other.name].error
    assert ev.counts()["untrusted"] == 2 and ev.counts()["lost"] == 1
    assert ev.lost[0]["path"].endswith(gone.name)
    assert {e["path"] for e in ev.to_json()["invalid"]} >= {bad[forged.name].path, bad[other.name].path}


def test_the_runner_records_each_artifact_it_writes(kb):
    path = write_artifact(record(kb, "2026-11-29T10:00:00+00:00", NARROW), kb / "validation")
    lines = [json.loads(x) for x in (path.parent / ledger.LEDGER_NAME).read_text().splitlines()]
    assert lines[-1]["file"] == path.name and lines[-1]["sha256"] == ledger.digest(path.read_bytes())
    assert ledger.load(kb).check(path) is None


def test_a_torn_or_foreign_ledger_line_grants_nothing(kb):
    path = write_artifact(record(kb, "2026-11-29T10:00:00+00:00", NARROW), kb / "validation")
    planted = path.parent / "planted.yaml"
    planted.write_text(path.read_text())
    with open(path.parent / ledger.LEDGER_NAME, "a") as fh:
        fh.write('{"file": "planted.yaml", "sha2')  # torn
    assert "not written by the runner" in ledger.load(kb).check(planted)


def test_validated_on_a_cpu_record_is_refused_on_write_and_on_read(kb, tmp_path):
    rec = _cpu(record(kb, "2026-11-29T10:00:00+00:00", NARROW, speedup=9.7))
    with pytest.raises(SkillRunError, match="validated' on a CPU record"):
        write_artifact(rec, kb / "validation")
    p = tmp_path / "x.yaml"
    p.write_text(yaml.safe_dump(rec))
    with pytest.raises(SkillRunError, match="CPU record"):
        load_artifact(p)
    ok = _cpu(record(kb, "2026-11-29T10:00:00+00:00", NARROW, verdict="cpu_numerics_passed"))
    assert write_artifact(ok, kb / "validation").exists()


def test_an_artifact_dated_in_the_future_is_refused(kb, tmp_path):
    rec = record(kb, "2031-01-01T00:00:00+00:00", NARROW, speedup=1.93)
    with pytest.raises(SkillRunError, match="in the future"):
        write_artifact(rec, kb / "validation")
    p = tmp_path / "x.yaml"
    p.write_text(yaml.safe_dump(rec))
    with pytest.raises(SkillRunError, match="in the future"):
        load_artifact(p)
    for bad in ("yesterday", "2026-13-45"):
        with pytest.raises(SkillRunError, match="created"):
            write_artifact(record(kb, bad, NARROW), kb / "validation")


def test_every_committed_artifact_is_in_a_ledger():
    from skillrun.kb.paths import kb_root

    ev = build_index(SkillIndex.load(kb_root()))
    assert not ev.untrusted_entries(), [(e.path, e.error) for e in ev.untrusted_entries()][:3]
    assert not ev.lost, ev.lost[:3]
