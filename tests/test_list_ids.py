"""`skill-run list` never wraps a card id: at any width each id is whole on one line, copyable into `show`."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from skillrun import api


@pytest.mark.parametrize("columns", [80, 100, 160])
def test_card_ids_are_never_wrapped(columns):
    env = dict(os.environ, COLUMNS=str(columns), NO_COLOR="1", TERM="dumb")
    res = subprocess.run([sys.executable, "-m", "skillrun", "list"], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    words = {w for ln in res.stdout.splitlines() for w in ln.split()}
    ids = [c["id"] for c in api.list_cards(api.load_index())]
    assert ids and all(i in words for i in ids), [i for i in ids if i not in words]
    assert max(len(ln) for ln in res.stdout.splitlines()) <= columns
    # and what is printed is what `show` takes
    shown = subprocess.run([sys.executable, "-m", "skillrun", "show", ids[0]], capture_output=True, text=True, timeout=300, env=env)
    assert shown.returncode == 0
