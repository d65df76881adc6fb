"""Cards are data, not trusted code: hostile predicates, regexes, YAML and module references are
refused in bounded time by lint and by matching alike, and a refused card is reported, never dropped."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kbfixture import CARD, make_kb, write_card
from skillrun.errors import SkillRunError
from skillrun.kb import bounded_yaml, expr
from skillrun.kb.index import SkillIndex
from skillrun.lint import check_cards, lint
from skillrun.kb.regex import check_regex, compile_card_regex
from skillrun.plan.match import match_kernel, match_profile
from skillrun.models import KernelStat, Profile
from skillrun.plan.select import select_recipe

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[1]
CK_TRACE = REPO / "tests" / "fixtures" / "kineto_gfx950_ck_blockscale.synthetic.json"


def _card(**recipe0):
    card = copy.deepcopy(CARD)
    card["recipes"][0].update(recipe0)
    return card


def _errors(root: Path, prefix: str) -> list[SkillRunError]:
    rep = lint(SkillIndex.load(root))
    return [e for e in rep.errors if (e.field or "").startswith(prefix)]


def skill_run(*args: str, kb: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "skillrun", "--kb", str(kb), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


# ----------------------------------------------------------------------------- 5. predicates
@pytest.mark.parametrize("when", [
    "((9**64)**64)**64 > 0",  # each exponent a literal <= 64: passed the old parse-time check
    "(M**64)**64 > 0",
])
def test_power_chains_are_refused_before_they_are_computed(when):
    with pytest.raises(expr.BoundExceeded):
        expr.evaluate(when, {"M": 8192})


@pytest.mark.parametrize("when", ['"x" * 1000000000 == "x"', "(1, 2) * 1000000000 == (1,)", '"ab" + "cd" == "abcd"'])
def test_sequence_repetition_and_concatenation_are_refused(when):
    with pytest.raises(expr.BoundExceeded):
        expr.evaluate(when, {})


def test_every_evaluation_failure_is_an_expr_error_and_ordinary_predicates_still_work():
    with pytest.raises(expr.ExprError):
        expr.evaluate("log2(M - M) > 1", {"M": 4})  # math domain error
    with pytest.raises(expr.ExprError):
        expr.evaluate("M < 'a'", {"M": 4})  # TypeError
    with pytest.raises(expr.BoundExceeded):
        expr.evaluate("M * 2 > 0", {"M": 2**200})  # an absurd value from a trace
    assert expr.evaluate("K <= 1024 and ceil_div(M, 64) * ceil_div(N, 256) >= 4 * cu_count",
                         {"M": 16384, "N": 7168, "K": 768, "cu_count": 256}) is True
    assert expr.evaluate("2**64 > N", {"N": 1}) is True


def test_step_budget_bounds_evaluation(monkeypatch):
    monkeypatch.setattr(expr, "MAX_STEPS", 5)
    with pytest.raises(expr.BoundExceeded, match="steps"):
        expr.evaluate("M + M + M + M + M + M > 0", {"M": 1})


def test_lint_refuses_a_bomb_predicate_and_matching_survives_it(tmp_path):
    root = make_kb(tmp_path, _card(when="((9**64)**64)**64 > N"))
    errs = _errors(root, "recipes.0.when")
    assert errs and "safety bound" in errs[0].reason
    # Matching/selection on the same card: the recipe is skipped with a reason, nothing hangs.
    card = SkillIndex.load(root).skills["toy_blockscale"]
    sel = select_recipe(card, {"M": 4096, "N": 65536, "K": 1536}, {"cu_count": 256}, "gfx950")
    assert sel.recipe.name != "wide_n" or sel.untuned
    assert any("exceeds" in r for r in sel.reasons)


def test_lint_refuses_string_repetition_in_a_predicate(tmp_path):
    root = make_kb(tmp_path, _card(when='"a" * 999999999 == "a"'))
    errs = _errors(root, "recipes.0.when")
    assert errs and "repetition" in errs[0].reason


# ----------------------------------------------------------------------------- 6. regexes
def test_a_backtracking_pattern_runs_in_linear_time_on_a_hostile_name():
    rx = compile_card_regex("(a+)+$b|(x+x+)+y")
    assert check_regex("(a+)+$b|(x+x+)+y") is None
    # With Python's re either alternative would take astronomically long on these names.
    assert rx.search("a" * 4096 + "!") is None
    assert rx.search("x" * 4096) is None


def test_lint_and_matching_agree_on_a_pattern_re2_refuses(tmp_path):
    card = copy.deepcopy(CARD)
    card["match"]["profile_signature"]["op_name_regex"] = r"(kernel_gemm)\1|(?<=ck::)kernel_gemm"
    root = make_kb(tmp_path, card)
    errs = _errors(root, "match.profile_signature.op_name_regex")
    assert errs and "RE2" in errs[0].reason
    index = check_cards(SkillIndex.load(root))
    assert "toy_blockscale" not in index.skills  # refused by lint => never used for matching
    # And match_kernel itself never falls back to a backtracking engine for it.
    raw = SkillIndex.load(root).skills["toy_blockscale"]
    k = KernelStat(name="kernel_gemmkernel_gemm", total_us=1.0, calls=1, pct_gpu=100.0)
    assert not match_kernel(raw, k, "gfx950").matched


# ----------------------------------------------------------------------------- 7. YAML
_BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
"""


def test_alias_bomb_is_refused_and_shared_aliases_still_load():
    with pytest.raises(bounded_yaml.ExpansionError, match="alias"):
        bounded_yaml.load(_BOMB)
    with pytest.raises(bounded_yaml.ExpansionError, match="recursive"):
        bounded_yaml.load("a: &a [1, *a]")
    assert bounded_yaml.load("x: &x {tile: 64}\ny: *x\n") == {"x": {"tile": 64}, "y": {"tile": 64}}
    with pytest.raises(bounded_yaml.ExpansionError, match="deeply"):
        bounded_yaml.load("x: " + "[" * 50000 + "]" * 50000)  # a recursion crash before


def test_card_whose_recipe_config_is_an_alias_bomb_fails_lint(tmp_path):
    root = make_kb(tmp_path)
    p = root / "skills" / "toy_blockscale" / "SKILL.md"
    text = p.read_text()
    bomb = "".join(f"  {k}: &{k} [{', '.join(['*' + prev] * 9 if prev else ['1'] * 9)}]\n"
                   for prev, k in zip([None, "a", "b", "c", "d", "e", "f"], "abcdefg"))
    p.write_text(text.replace("---\nid:", "---\nx_bomb_anchors:\n" + bomb + "id:", 1).replace(
        "config:\n    tile_m: 64\n    tile_n: 256", "config: *g", 1))
    assert "config: *g" in p.read_text()
    rep = lint(SkillIndex.load(root))
    assert not rep.ok
    assert any("alias" in e.reason and e.path == str(p) for e in rep.errors), [str(e) for e in rep.errors]


def test_oversized_card_is_refused(tmp_path):
    root = make_kb(tmp_path)
    write_card(root, CARD, body="x" * (600 << 10))
    rep = lint(SkillIndex.load(root))
    assert any("larger than" in e.reason for e in rep.errors), [str(e) for e in rep.errors]


def test_alias_bomb_artifact_fails_lint(tmp_path):
    root = make_kb(tmp_path)
    (root / "validation" / "toy_blockscale").mkdir(parents=True)
    art = root / "validation" / "toy_blockscale" / "bomb.yaml"
    art.write_text(_BOMB)
    rep = lint(SkillIndex.load(root))
    assert any(e.path == str(art) and "alias" in e.reason for e in rep.errors), [str(e) for e in rep.errors]


# ----------------------------------------------------------------------------- 8. invalid cards are reported
def _second_card(root: Path, **changes) -> Path:
    card = copy.deepcopy(CARD)
    card.update(changes)
    return write_card(root, card)


def test_a_card_failing_lint_is_left_out_of_matching_and_reported(tmp_path):
    root = make_kb(tmp_path)
    bad = copy.deepcopy(CARD)
    bad["id"] = "broken_card"
    bad["recipes"][0]["kernel"] = "skillrun_kernels.protocol:NoSuchThing"
    write_card(root, bad)
    index = check_cards(SkillIndex.load(root))
    assert set(index.skills) == {"toy_blockscale"}
    assert any(e.path.endswith("broken_card/SKILL.md") and "NoSuchThing" in e.reason for e in index.problems)
    prof = Profile(source="t.json", format="kineto_json", arch="gfx950",
                   kernels=[KernelStat(name="gemm_a8w8_blockscale", total_us=1.0, calls=1, pct_gpu=100.0)])
    rep = match_profile(prof, index)
    assert any("NoSuchThing" in p.reason for p in rep.card_problems)
    with pytest.raises(SkillRunError, match="invalid and not used"):
        index.skill("broken_card")


def test_duplicate_id_is_an_error_never_an_override(tmp_path):
    root = make_kb(tmp_path)
    dup = copy.deepcopy(CARD)
    dup["title"] = "An impostor with the same id"
    d = root / "skills" / "zz_impostor"
    d.mkdir()
    # Same id as the real card: the folder rule is one error; the id clash is another.
    (d / "SKILL.md").write_text((root / "skills" / "toy_blockscale" / "SKILL.md").read_text().replace(
        "Toy block-scale GEMM card for tests", "An impostor with the same id"))
    index = SkillIndex.load(root)
    assert index.skills["toy_blockscale"].path.parent.name == "toy_blockscale"
    assert str(d / "SKILL.md") in index.rejected


def test_cli_profile_match_and_plan_exit_1_and_name_the_invalid_card(tmp_path):
    root = make_kb(tmp_path)
    bad = copy.deepcopy(CARD)
    bad["id"] = "broken_card"
    bad["match"]["profile_signature"]["op_name_regex"] = r"(x)\1"
    write_card(root, bad)
    (root / "skills" / "unreadable").mkdir()
    (root / "skills" / "unreadable" / "SKILL.md").write_text("no front matter\n")
    for args in (["--profile", str(CK_TRACE)], ["match", str(CK_TRACE)], ["plan", str(CK_TRACE)],
                 ["--profile", str(CK_TRACE), "--json"]):
        res = skill_run(*args, kb=root)
        assert res.returncode == 1, (args, res.returncode, res.stderr)
        assert "broken_card/SKILL.md" in res.stderr and "RE2" in res.stderr, res.stderr
        assert "unreadable/SKILL.md" in res.stderr and "front matter" in res.stderr
        if "--json" in args:
            probs = json.loads(res.stdout)["matches"]["card_problems"]
            assert {Path(p["path"]).parent.name for p in probs} == {"broken_card", "unreadable"}


# ----------------------------------------------------------------------------- 9. no imports in lint
def test_lint_never_imports_a_module_a_card_names(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "evilpkg"
    (pkg / "sub").mkdir(parents=True)
    marker = tmp_path / "imported.txt"
    for init in (pkg / "__init__.py", pkg / "sub" / "__init__.py"):
        init.write_text(f"open({str(marker)!r}, 'a').write({str(init)!r} + '\\n')\n")
    (pkg / "sub" / "kern.py").write_text(f"open({str(marker)!r}, 'a').write('kern')\ndef launch():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    card = copy.deepcopy(CARD)
    card["references"]["problem"] = "evilpkg.sub.kern"
    card["references"]["oracle"] = "evilpkg.sub.kern:launch"
    card["recipes"][0]["kernel"] = "evilpkg.sub.kern:launch"
    card["recipes"][1]["kernel"] = "evilpkg.sub.kern:missing"
    root = make_kb(tmp_path / "kb", card)
    rep = lint(SkillIndex.load(root))
    assert not marker.exists(), marker.read_text()
    assert "evilpkg" not in sys.modules
    msgs = [str(e) for e in rep.errors]
    assert any("recipes.1.kernel" in m and "'missing'" in m for m in msgs), msgs
    assert not any("recipes.0.kernel" in m for m in msgs), msgs
