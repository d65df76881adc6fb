"""The engine's layering is a test: the import-linter contracts in pyproject.toml (layers from the CLI
down to errors, every wing and root module placed, no import cycles between siblings) hold for
runner/skillrun/."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports(package_parent: Path, cwd: Path) -> subprocess.CompletedProcess:
    # A fresh interpreter whose only `skillrun` is the one under package_parent (grimp finds the
    # package by import, so this process's own skillrun must not answer for it).
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(package_parent), "PYTHONNOUSERSITE": "1"})


def _tree(tmp_path: Path) -> Path:
    """A copy of runner/skillrun in a folder of its own, with this checkout's contracts."""
    shutil.copytree(ROOT / "runner" / "skillrun", tmp_path / "pkg" / "skillrun", ignore=shutil.ignore_patterns("__pycache__", "examples"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_runner_keeps_its_layers_and_has_no_import_cycles(tmp_path):
    pytest.importorskip("importlinter")  # in the `test` extra; `make setup` installs it
    tree = _tree(tmp_path)
    res = _lint_imports(tree / "pkg", tree)
    assert res.returncode == 0 and "2 kept, 0 broken" in res.stdout, res.stdout + res.stderr


def test_an_import_that_runs_back_up_or_a_cycle_breaks_the_contracts(tmp_path):
    pytest.importorskip("importlinter")
    tree = _tree(tmp_path)
    kb_index = tree / "pkg" / "skillrun" / "kb" / "index.py"
    # The knowledge base reaching up into the pipeline (what kb/lint.py once did) ...
    kb_index.write_text(kb_index.read_text() + "\n\ndef _up():\n    from skillrun.plan.planner import make_plan  # noqa: F401\n")
    # ... and a loop between two sibling modules.
    atomic = tree / "pkg" / "skillrun" / "io" / "atomic.py"
    atomic.write_text(atomic.read_text() + "\n\ndef _loop():\n    from skillrun.io import redact  # noqa: F401\n")
    redact = tree / "pkg" / "skillrun" / "io" / "redact.py"
    redact.write_text(redact.read_text() + "\n\ndef _back():\n    from skillrun.io import atomic  # noqa: F401\n")
    res = _lint_imports(tree / "pkg", tree)
    assert res.returncode != 0, res.stdout
    assert "skillrun.kb is not allowed to import skillrun.plan" in res.stdout
    assert "0 kept, 2 broken" in res.stdout
