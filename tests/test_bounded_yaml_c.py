"""libyaml under the same bounds: every committed card and artifact reads the same with it as with the
pure-Python loader, alias bombs and duplicate keys are refused by it too, and a document nested too deep
for its C recursion goes to the Python loader (which fails cleanly) instead of crashing the process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from skillrun.kb import bounded_yaml as B
from skillrun.kb.cards import _FRONT

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(B.CBoundedLoader is None, reason="PyYAML here is built without libyaml")


def _docs():
    for p in sorted((REPO / "skills").glob("*/SKILL.md")) + sorted((REPO / "facts").glob("*.md")):
        yield p, _FRONT.match(p.read_text()).group(1)
    for p in sorted((REPO / "validation").rglob("*.yaml"))[:40]:
        yield p, p.read_text()


def test_committed_cards_and_artifacts_read_the_same_with_libyaml():
    n = 0
    for p, text in _docs():
        assert B.nesting_bound(text) <= B.MAX_C_NESTING, p  # they do take the fast path
        assert yaml.load(text, Loader=B.CBoundedLoader) == yaml.load(text, Loader=B.BoundedLoader), p
        n += 1
    assert n > 40


def test_libyaml_path_refuses_alias_bombs_and_duplicate_keys():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefg", "bcdefgh"))
    assert B.nesting_bound(bomb) <= B.MAX_C_NESTING
    with pytest.raises(B.ExpansionError):
        yaml.load(bomb, Loader=B.CBoundedLoader)
    with pytest.raises(B.ExpansionError):
        B.load(bomb)
    with pytest.raises(yaml.YAMLError, match="duplicate key"):
        B.load("kernel: a\nconfig: {}\nkernel: b\n")


@pytest.mark.parametrize("doc", ["[" * 20000 + "]" * 20000, "- " * 20000 + "x\n", "{a: " * 20000 + "1" + "}" * 20000])
def test_deep_nesting_never_reaches_the_c_recursion(doc):
    assert B.nesting_bound(doc) > B.MAX_C_NESTING
    # In a child: a C stack overflow would kill the process, not raise.
    code = ("import sys; from skillrun.kb import bounded_yaml as B\n"
            "try:\n    B.load(sys.stdin.read())\nexcept B.ExpansionError as e:\n    print('refused', e.problem)\n"
            "except Exception as e:\n    print('error', type(e).__name__)\n")
    res = subprocess.run([sys.executable, "-c", code], input=doc, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-400:]
    assert res.stdout.startswith(("refused", "error"))
