"""The one artifact store behind validation, tuning and e2e records: never overwrite, bounded
numbering, no symlinked folder, bounded reading, knowledge-base-relative paths."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from skillrun.evidence import store
from skillrun.errors import InputError, SkillRunError


def test_a_taken_name_gets_the_next_number_and_the_first_file_is_untouched(tmp_path):
    first = store.write_new(tmp_path / "card", "run.yaml", {"n": 1})
    second = store.write_new(tmp_path / "card", "run.yaml", {"n": 2})
    assert (first.name, second.name) == ("run.yaml", "run_1.yaml")
    assert store.load_mapping(first, "record") == {"n": 1}
    assert store.load_mapping(second, "record") == {"n": 2}


def test_numbering_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "MAX_SAME_NAME", 2)
    store.write_new(tmp_path, "r.yaml", {})
    store.write_new(tmp_path, "r.yaml", {})
    with pytest.raises(SkillRunError, match="more than 2 records"):
        store.write_new(tmp_path, "r.yaml", {})
    with pytest.raises(SkillRunError, match="more than 2 records"):
        store.reserve(tmp_path, "r.yaml")


def test_a_reserved_name_is_claimed_at_once_and_filled_later(tmp_path):
    path = store.reserve(tmp_path / "t", "x.yaml")
    assert path.exists() and path.stat().st_size == 0
    assert store.reserve(tmp_path / "t", "x.yaml").name == "x_1.yaml"
    assert store.write_new(tmp_path / "t", "x.yaml", {}).name == "x_2.yaml"
    store.fill_reserved(path, {"a": 1})
    assert store.load_mapping(path, "record") == {"a": 1}


def test_no_record_goes_through_a_symlinked_card_folder(tmp_path):
    from skillrun.evidence.tuning_artifact import reserve_path

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "validation" / "_tuning").mkdir(parents=True)
    (tmp_path / "validation" / "_tuning" / "c").symlink_to(elsewhere)
    with pytest.raises(SkillRunError, match="symlink"):
        store.write_new(tmp_path / "validation" / "_tuning" / "c", "r.yaml", {"x": 1})
    # The tuning writer used to create its placeholder through such a link.
    rec = {"card": {"id": "c"}, "created": "2026-01-01T00:00:00+0000", "kind": "tune", "recipe": {"name": "r"}, "shape": {"M": 1}}
    with pytest.raises(SkillRunError, match="symlink"):
        reserve_path(rec, tmp_path / "validation")
    assert list(elsewhere.iterdir()) == []


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def test_reading_is_bounded_for_every_kind(tmp_path):
    from skillrun.evidence.tuning_artifact import load_tuning_artifact
    from skillrun.evidence.validation import load_artifact

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    with pytest.raises(InputError, match="cannot read tuning artifact"):
        load_tuning_artifact(bomb)
    with pytest.raises(SkillRunError, match="cannot read validation artifact"):
        load_artifact(bomb)
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (store.MAX_RECORD_BYTES + 10) + "\n")
    with pytest.raises(InputError, match="cannot read tuning artifact"):
        load_tuning_artifact(big)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="cannot read tuning artifact"):
        load_tuning_artifact(fifo)  # returns at once: never blocks on a pipe
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(InputError, match="tuning artifact is not a mapping"):
        load_tuning_artifact(scalar)


def test_paths_are_written_relative_to_the_knowledge_base(tmp_path, monkeypatch):
    kb = tmp_path / "kb"
    (kb / "skills" / "x").mkdir(parents=True)
    assert store.kb_relative(kb / "skills" / "x" / "SKILL.md", kb) == "skills/x/SKILL.md"
    assert store.kb_relative("/other/checkout/validation/c/a.yaml", kb) == "validation/c/a.yaml"
    monkeypatch.chdir(kb / "skills")
    # A path a record already holds is KB-relative: it stays as written wherever the runner runs.
    assert store.kb_relative("skills/x/SKILL.md", kb) == "skills/x/SKILL.md"
    monkeypatch.chdir(tmp_path)
    # A path on this machine given relative to the working folder (e.g. --kb ./kb) is resolved first.
    assert store.machine_path_in_kb("kb/skills/x/SKILL.md", Path("kb")) == "skills/x/SKILL.md"
    assert store.machine_path_in_kb("kb/skills/x/SKILL.md", kb) == "skills/x/SKILL.md"


def test_slug_and_stamp():
    assert store.slug("a b/c:d", 80) == "a-b-c-d"
    assert len(store.slug("x" * 200, 60)) == 60
    assert store.stamp("2026-11-29T09:24:51+0000") == "20261129T092451Z"


def test_record_paths_are_kb_relative_or_redacted(tmp_path):
    """Issue 34 item 7: a record names no folder of this machine (the e2e record carried its working
    folder and a /tmp plan path)."""
    from skillrun.evidence.store import record_command, record_path
    from skillrun.io.redact import REDACTED

    kb = tmp_path / "kb"
    (kb / "validation").mkdir(parents=True)
    assert record_path(kb / "validation" / "x.yaml", kb) == "validation/x.yaml"
    assert record_path("/tmp/o1/plan_moe.json", kb) == f"{REDACTED}/plan_moe.json"
    assert record_path(str(tmp_path / "elsewhere"), kb) == f"{REDACTED}/elsewhere"
    assert record_path("benchmarks/w.py", kb) == "benchmarks/w.py"  # already relative: as written
    line = record_command("skill-run e2e --plan /tmp/o1/plan.json --out=/home/u/x.yaml -n 2 -- python3 w.py", kb)
    assert line == f"skill-run e2e --plan {REDACTED}/plan.json --out={REDACTED}/x.yaml -n 2 -- python3 w.py"
    assert record_command(["/usr/bin/python3", "w.py"], kb) == [f"{REDACTED}/python3", "w.py"]
