"""`skill-run lint`: passes on a sound KB and names file, field and reason for each kind of defect."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from kbfixture import CARD, REPO, make_kb, write_card
from skillrun.kb.index import SkillIndex
from skillrun.lint import check_regex, lint


def _lint(root: Path):
    return lint(SkillIndex.load(root))


def _only(rep, field_prefix: str):
    hits = [e for e in rep.errors if (e.field or "").startswith(field_prefix)]
    assert hits, f"expected an error on {field_prefix}, got {[str(e) for e in rep.errors]}"
    return hits[0]


def test_toy_kb_is_clean(tmp_path):
    rep = _lint(make_kb(tmp_path))
    assert rep.ok, [str(e) for e in rep.errors]
    assert rep.checked["skills"] == 1


def test_bad_yaml_names_file_and_line(tmp_path):
    root = make_kb(tmp_path)
    p = root / "skills" / "toy_blockscale" / "SKILL.md"
    p.write_text("---\nid: toy_blockscale\ntitle: [unclosed\n---\nbody\n")
    rep = _lint(root)
    e = rep.errors[0]
    assert e.path == str(p) and "bad YAML" in e.reason and "line" in e.reason


def test_missing_required_field(tmp_path):
    card = copy.deepcopy(CARD)
    del card["tolerance"]
    rep = _lint(make_kb(tmp_path, card))
    assert any("missing required field" in e.reason and "tolerance" in e.reason for e in rep.errors), [str(e) for e in rep.errors]


def test_unknown_gen(tmp_path):
    card = copy.deepcopy(CARD)
    card["match"]["gens"] = ["gfx999"]
    rep = _lint(make_kb(tmp_path, card))
    e = _only(rep, "match.gens.0")
    assert "gfx999" in e.reason


def test_invalid_regex(tmp_path):
    card = copy.deepcopy(CARD)
    card["match"]["profile_signature"]["op_name_regex"] = "kernel_gemm(["
    rep = _lint(make_kb(tmp_path, card))
    e = _only(rep, "match.profile_signature.op_name_regex")
    assert "invalid regex" in e.reason


def test_regex_needing_backtracking_is_rejected():
    # Back-references and look-around have no linear-time algorithm: RE2 refuses them.
    assert "RE2" in check_regex(r"(gemm)_\1")
    assert check_regex(r"(?<=void )gemm") is not None
    assert check_regex(r"(?i)kernel_gemm_xdl.*blockscale") is None


def test_test_case_that_no_longer_matches(tmp_path):
    card = copy.deepcopy(CARD)
    card["match"]["profile_signature"]["op_name_regex"] = "gemm_a8w8_blockscale"  # narrowed: CK name no longer matches
    rep = _lint(make_kb(tmp_path, card))
    e = _only(rep, "tests.must_match.0")
    assert "no longer matches" in e.reason


def test_must_not_match_violation(tmp_path):
    card = copy.deepcopy(CARD)
    card["tests"]["must_not_match"].append("void ck::kernel_gemm_xdl_cshuffle_v3<GridwiseGemmMultiD_ABScale>")
    rep = _lint(make_kb(tmp_path, card))
    assert "must not" in _only(rep, "tests.must_not_match.1").reason


def test_selects_case_that_picks_another_recipe(tmp_path):
    card = copy.deepcopy(CARD)
    card["tests"]["selects"][1]["recipe"] = "narrow_n"
    rep = _lint(make_kb(tmp_path, card))
    e = _only(rep, "tests.selects.1")
    assert "selects 'k_light'" in e.reason


def test_dangling_fact_citation(tmp_path):
    card = copy.deepcopy(CARD)
    card["facts"] = ["toy_hw", "no_such_fact"]
    rep = _lint(make_kb(tmp_path, card))
    e = _only(rep, "facts.1")
    assert "no_such_fact" in e.reason


def test_unresolvable_kernel_reference(tmp_path):
    card = copy.deepcopy(CARD)
    card["recipes"][0]["kernel"] = "skillrun_kernels.protocol:no_such_builder"
    rep = _lint(make_kb(tmp_path, card))
    assert "no_such_builder" in _only(rep, "recipes.0.kernel").reason


def test_predicate_with_unknown_name(tmp_path):
    card = copy.deepcopy(CARD)
    card["recipes"][1]["when"] = "layer_name == 1"
    rep = _lint(make_kb(tmp_path, card))
    assert "layer_name" in _only(rep, "recipes.1.when").reason


def test_unsafe_predicate_rejected(tmp_path):
    card = copy.deepcopy(CARD)
    card["recipes"][1]["when"] = "__import__('os').system('true')"
    rep = _lint(make_kb(tmp_path, card))
    assert "not allowed" in _only(rep, "recipes.1.when").reason or "only" in _only(rep, "recipes.1.when").reason


def test_cli_lint_exit_codes(tmp_path):
    root = make_kb(tmp_path)
    ok = subprocess.run([sys.executable, "-m", "skillrun", "--kb", str(root), "lint"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    card = copy.deepcopy(CARD)
    card["facts"] = ["missing_fact"]
    write_card(root, card)
    bad = subprocess.run([sys.executable, "-m", "skillrun", "--kb", str(root), "lint"], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "SKILL.md: facts.0: cites fact 'missing_fact'" in bad.stderr.replace("\n", "")


def test_repository_kb_lints_clean():
    """The shipped knowledge base itself must pass lint (cards, facts, committed validation YAML)."""
    res = subprocess.run([sys.executable, "-m", "skillrun", "--kb", str(REPO), "lint"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_reference_names_and_production_marks_are_checked(tmp_path):
    """Artifacts key references by name (issue 11): production names must exist, names be unique."""
    ok = copy.deepcopy(CARD)
    k = "skillrun_kernels.protocol:KernelLaunch"
    ok["references"].update(baseline_names={"rocm": "ck_gemm"}, production=["ck_gemm", "aiter_gemm"],
                            alternatives=[{"name": "aiter_gemm", "kernel": k, "device": "rocm"}])
    assert _lint(make_kb(tmp_path / "ok", ok)).ok
    bad = copy.deepcopy(ok)
    bad["references"]["production"] = ["mslk_gemm"]
    assert "'mslk_gemm' is not a reference" in _only(_lint(make_kb(tmp_path / "p", bad)), "references.production.0").reason
    bad = copy.deepcopy(ok)
    bad["references"]["baseline_names"]["cuda"] = "cublas"
    assert "no cuda entry" in _only(_lint(make_kb(tmp_path / "n", bad)), "references.baseline_names.cuda").reason
    bad = copy.deepcopy(ok)
    bad["references"]["alternatives"].append({"name": "ck_gemm", "kernel": k})
    assert "used twice on rocm" in _only(_lint(make_kb(tmp_path / "d", bad)), "references").reason
