"""The layout says what the code is: every package sits in a folder of its import name, the engine's
root is a few modules beside its wings, and the move to this layout cost no artifact its evidence."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from skillrun.api import evidence, load_index

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "runner" / "skillrun"
ROOTS = {"skillrun": ROOT / "runner", "skillrun_kernels": ROOT / "kernels"}


def _exists(module: str) -> bool:
    parts = module.split(".")
    base = ROOTS[parts[0]].joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.lineno, node.module


def test_every_import_of_ours_resolves_to_a_folder_of_the_same_name():
    """`skillrun.evidence.index` is runner/skillrun/evidence/index.py: no install mapping needed to find it."""
    files = [p for d in ("runner", "kernels", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    seen, missing = 0, []
    for f in files:
        for line, mod in _imports(f):
            if mod.split(".")[0] in ROOTS:
                seen += 1
                if not _exists(mod):
                    missing.append(f"{f.relative_to(ROOT)}:{line}: {mod}")
    assert seen > 500 and not missing, missing


def test_the_top_folders_hold_only_their_package_and_the_engine_root_is_wings():
    assert sorted(p.name for p in (ROOT / "runner").iterdir() if p.name != "__pycache__") == ["skillrun"]
    assert sorted(p.name for p in (ROOT / "kernels").iterdir() if p.name != "__pycache__") == ["skillrun_kernels"]
    modules = sorted(p.stem for p in ENGINE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(modules) <= 10, modules
    wings = {p.name for p in ENGINE.iterdir() if (p / "__init__.py").is_file()}
    assert {"ingest", "analysis", "kb", "plan", "execute", "evidence", "output", "io", "cli", "agent"} <= wings


def test_every_committed_artifact_still_finds_the_kernel_sources_it_recorded():
    """Kernel source identity is by module name; a module that moved out from under its name would turn
    every artifact that recorded it stale ("cannot be found"), which the layout move must not do."""
    ev = evidence(load_index())
    lost = [(e.path, r) for e in ev.entries for r in e.stale_reasons if "cannot be found" in r]
    assert len(ev.entries) > 50 and not lost, lost


def test_the_readme_wing_table_names_exactly_what_the_engine_holds():
    lines = (ROOT / "README.md").read_text().split("\n")
    start = lines.index("| wing | what |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1])

    named = {n.rstrip("/") for row in rows for n in re.findall(r"`([^`]+)`", row)}
    tree = {p.name for p in ENGINE.iterdir() if (p / "__init__.py").is_file()}
    tree |= {p.name for p in ENGINE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    tree -= {"examples"}
    assert named == tree, (sorted(named - tree), sorted(tree - named))
