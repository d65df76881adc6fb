"""A card cannot loosen the judge: tolerance limits per family, no non-finite numbers, no duplicate
keys, the engine's own schemas (never the --kb copy), `list` reports invalid cards, and card text
cannot reach the terminal as escape sequences."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kbfixture import CARD, make_kb, write_card
from skillrun.errors import SkillRunError
from skillrun.kb import bounded_yaml
from skillrun.kb.index import SkillIndex
from skillrun.lint import check_cards, lint
from skillrun.kb.tolerance import ENGINE_LIMITS, family_limits

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]


def _card(**top):
    card = copy.deepcopy(CARD)
    card.update(top)
    return card


def _errors(root: Path, prefix: str = "") -> list[SkillRunError]:
    return [e for e in lint(SkillIndex.load(root)).errors if (e.field or "").startswith(prefix)]


def skill_run(*args: str, kb: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skillrun", "--kb", str(kb), *args], capture_output=True, text=True, timeout=120)


# ----------------------------------------------------------------------------- tolerance limits
@pytest.mark.parametrize("tol, field", [
    ({"rtol": 1e300, "atol": 0.01, "min_cosine": 0.999}, "tolerance.rtol"),
    ({"rtol": 0.01, "atol": 1e300, "min_cosine": 0.999}, "tolerance.atol"),
    ({"rtol": 0.01, "atol": 0.01, "min_cosine": 0.0}, "tolerance.min_cosine"),
    ({"rtol": 0.01, "atol": 0.01, "min_cosine": 0.999, "max_rel_fro": 5.0}, "tolerance.max_rel_fro"),
])
def test_lint_refuses_a_tolerance_looser_than_the_engine_allows(tmp_path, tol, field):
    root = make_kb(tmp_path, _card(tolerance=tol))
    errs = _errors(root, field)
    assert errs and "looser than this family allows" in errs[0].reason
    idx = check_cards(SkillIndex.load(root))
    assert "toy_blockscale" not in idx.skills  # never matched or run


def test_a_family_tightens_the_engine_limits_and_cannot_loosen_them():
    fam = family_limits("skillrun_kernels.fp8_blockscale_gemm.problem")
    assert fam["rtol"] < ENGINE_LIMITS["rtol"] and fam["min_cosine"] > ENGINE_LIMITS["min_cosine"]
    assert family_limits("skillrun_kernels.protocol") == ENGINE_LIMITS  # declares nothing


def test_a_tolerance_within_the_engine_limit_but_past_its_family_is_refused(tmp_path):
    card = _card(tolerance={"rtol": 0.08, "atol": 0.01, "min_cosine": 0.999})
    card["references"] = dict(card["references"], problem="skillrun_kernels.fp8_blockscale_gemm.problem")
    root = make_kb(tmp_path, card)
    errs = _errors(root, "tolerance.rtol")
    assert errs and "fp8_blockscale_gemm.problem" in errs[0].reason


@pytest.mark.parametrize("problem", ["skillrun_kernels.protocol", "skillrun_kernels.fp8_blockscale_moe.problem",
                                     "skillrun_kernels.fp8_blockscale_gemm.problem"])
def test_a_tolerance_of_1e300_fails_lint_whatever_its_family_and_whatever_reason_it_gives(tmp_path, problem):
    card = _card(tolerance={"rtol": 1e300, "atol": 1e300, "min_cosine": 0.0},
                 tolerance_reason={"why": "trust me", "measured": ["skills/toy_blockscale/SKILL.md"]})
    card["references"] = dict(card["references"], problem=problem)
    root = make_kb(tmp_path, card)
    fields = {e.field for e in _errors(root, "tolerance")}
    assert {"tolerance.rtol", "tolerance.atol", "tolerance.min_cosine"} <= fields
    assert "toy_blockscale" not in check_cards(SkillIndex.load(root)).skills


def test_a_family_that_declares_no_ceiling_has_the_dense_gemms():
    from skillrun.kb.tolerance import DEFAULT_CEILING, family_ceiling

    assert family_ceiling("skillrun_kernels.protocol") == DEFAULT_CEILING
    assert DEFAULT_CEILING["rtol"] == 0.01 and DEFAULT_CEILING["min_cosine"] == 0.999
    for fam in ("fp8_blockscale_gemm", "fp8_rowwise_batched_gemm", "moe_a16wi4", "fp8_blockscale_moe"):
        ceiling = family_ceiling(f"skillrun_kernels.{fam}.problem")
        limits = family_limits(f"skillrun_kernels.{fam}.problem")
        assert all(ceiling[k] <= limits[k] for k in ("rtol", "atol", "max_rel_fro")) and ceiling["min_cosine"] >= limits["min_cosine"]


def test_loosening_above_the_ceiling_needs_its_measured_reason_in_the_card(tmp_path):
    loose = {"rtol": 0.05, "atol": 0.05, "min_cosine": 0.999}  # within the engine's limits, above the dense GEMM's ceiling
    root = make_kb(tmp_path / "a", _card(tolerance=loose))
    errs = _errors(root, "tolerance_reason")
    assert errs and "rtol 0.05 (ceiling 0.01)" in errs[0].reason and "measured reason" in errs[0].reason
    assert "toy_blockscale" not in check_cards(SkillIndex.load(root)).skills  # never matched or run
    # a reason whose evidence is not committed is no reason
    root = make_kb(tmp_path / "b", _card(tolerance=loose, tolerance_reason={"why": "fp8 re-quantization flips codes",
                                                                           "measured": ["validation/nope.yaml"]}))
    assert [e.field for e in _errors(root, "tolerance_reason")] == ["tolerance_reason.measured.0"]
    # the measured reason, citing committed evidence: accepted
    root = make_kb(tmp_path / "c", _card(tolerance=loose, tolerance_reason={"why": "fp8 re-quantization flips codes",
                                                                           "measured": ["skills/toy_blockscale/SKILL.md"]}))
    assert not _errors(root, "tolerance")
    # at or below the ceiling nothing is asked
    root = make_kb(tmp_path / "d", _card(tolerance={"rtol": 0.01, "atol": 0.005, "min_cosine": 0.9995}))
    assert not _errors(root, "tolerance")


def test_every_real_card_is_within_its_family_limits():
    idx = SkillIndex.load(REPO)
    assert idx.skills
    assert not [e for e in lint(idx).errors if (e.field or "").startswith("tolerance")]


def test_seeded_cheat_a_loose_card_cannot_run_its_zero_writing_port(tmp_path):
    """The attack: `tolerance: {rtol: 1e300, atol: 1e300, min_cosine: 0}` makes a wrong port pass parity."""
    from defects.kb import card as defect_card, make_defect_kb
    from skillrun import api

    cheat = defect_card("defect_loose_tolerance", "defects.kernels:build_port_wrong")
    cheat["tolerance"] = {"rtol": 1e300, "atol": 1e300, "min_cosine": 0.0}
    root = make_defect_kb(tmp_path, [cheat])
    idx = api.load_index(root)
    assert "defect_loose_tolerance" not in idx.skills
    with pytest.raises(SkillRunError, match="invalid and not used"):
        api.run_skill(idx, "defect_loose_tolerance", ["64,64,64"], backend="cpu", write=False)


# ----------------------------------------------------------------------------- non-finite numbers
@pytest.mark.parametrize("text, field", [
    ("min_pct_gpu: .nan", "match.profile_signature.min_pct_gpu"),
    ("min_pct_gpu: .inf", "match.profile_signature.min_pct_gpu"),
])
def test_a_non_finite_number_anywhere_in_a_card_is_an_error(tmp_path, text, field):
    root = make_kb(tmp_path)
    p = root / "skills" / "toy_blockscale" / "SKILL.md"
    p.write_text(p.read_text().replace("min_pct_gpu: 1.0", text))
    idx = SkillIndex.load(root)
    assert "toy_blockscale" not in idx.skills
    [err] = idx.errors
    assert err.field == field and "non-finite" in err.reason


def test_a_nan_tolerance_is_an_error(tmp_path):
    root = make_kb(tmp_path)
    p = root / "skills" / "toy_blockscale" / "SKILL.md"
    p.write_text(p.read_text().replace("min_cosine: 0.999", "min_cosine: .nan"))
    assert [e.field for e in SkillIndex.load(root).errors] == ["tolerance.min_cosine"]


# ----------------------------------------------------------------------------- duplicate keys
def test_a_duplicate_key_is_an_error_never_a_silent_override(tmp_path):
    root = make_kb(tmp_path)
    p = root / "skills" / "toy_blockscale" / "SKILL.md"
    text = p.read_text()
    first = "  kernel: skillrun_kernels.protocol:KernelLaunch\n"
    assert first in text
    # A second `kernel:` later in the same recipe, where a reviewer may not look.
    p.write_text(text.replace("  lever: XCD swizzle\n", "  lever: XCD swizzle\n  kernel: subprocess:run\n", 1))
    idx = SkillIndex.load(root)
    assert "toy_blockscale" not in idx.skills
    assert any("duplicate key 'kernel'" in e.reason for e in idx.errors)


def test_merge_keys_may_still_be_overridden():
    data = bounded_yaml.load("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\n")
    assert data["use"] == {"x": 1, "y": 3}
    with pytest.raises(yaml.YAMLError, match="duplicate key"):
        bounded_yaml.load("a: 1\nb: 2\na: 3\n")


# ----------------------------------------------------------------------------- engine schemas
@pytest.mark.parametrize("hostile", ["true", json.dumps({"type": "object", "properties": {"id": {"pattern": "^(a+)+$"}}}),
                                     json.dumps({"$ref": "file:///etc/passwd"})])
def test_the_kb_cannot_replace_the_schemas(tmp_path, hostile):
    bad = _card()
    del bad["title"]
    root = make_kb(tmp_path, bad)
    (root / "schemas" / "skill.schema.json").write_text(hostile)
    idx = SkillIndex.load(root)
    assert "toy_blockscale" not in idx.skills
    assert any("missing required field: 'title'" in e.reason for e in idx.errors)


def test_a_kb_schema_that_is_a_device_is_never_read(tmp_path):
    root = make_kb(tmp_path)
    target = root / "schemas" / "skill.schema.json"
    target.unlink()
    target.symlink_to("/dev/zero")
    assert "toy_blockscale" in SkillIndex.load(root).skills


# ----------------------------------------------------------------------------- list and show
def test_list_reports_an_invalid_card_and_exits_1(tmp_path):
    root = make_kb(tmp_path)
    broken = _card(id="broken_card")
    del broken["recipes"]
    write_card(root, broken)
    for args in (("list",), ("list", "--json")):
        r = skill_run(*args, kb=root)
        assert r.returncode == 1, r.stderr
        assert "broken_card" in r.stderr and "invalid card" in r.stderr
        assert "toy_blockscale" in r.stdout  # the valid card is still listed
    assert [row["id"] for row in json.loads(skill_run("list", "--json", kb=root).stdout)["cards"]] == ["toy_blockscale"]


def test_show_never_prints_raw_escape_sequences_from_a_card(tmp_path):
    body = ("## When to use\nplain \x1b[2J\x1b]8;;https://evil.example\x07click\x1b]8;;\x07 "
            "and \u202egnp.exe\n\n[a link](https://evil.example/x)\n")
    root = make_kb(tmp_path)
    write_card(root, CARD, body=body)
    r = skill_run("show", "toy_blockscale", kb=root)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\u202e" not in r.stdout and "\x07" not in r.stdout
    assert "\\x1b" in r.stdout and "https://evil.example/x" in r.stdout  # visible, not hidden in a hyperlink
