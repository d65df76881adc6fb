"""Kernel references (``module:function``) from cards: checked without importing, resolved lazily.

Lint must not import torch/triton/flydsl just to check that a card points at something real, so
static checks read the module's source with :mod:`ast`; locating it imports nothing either (not
even the parent packages), so no code a card names runs before ``resolve``.
"""
from __future__ import annotations

import ast
import importlib
import importlib.machinery
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from skillrun.errors import SkillRunError


def split_ref(ref: str) -> tuple[str, str]:
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise SkillRunError(f"kernel reference {ref!r} is not of the form module:function")
    return module, attr


def find_spec_static(module: str) -> importlib.machinery.ModuleSpec | None:
    """The spec of ``module`` found without executing any module code.

    ``importlib.util.find_spec("a.b")`` imports ``a`` to learn its ``__path__``, so a card naming
    ``evil.x:f`` would run ``evil/__init__.py`` during lint. Here each level is located with the
    import system's finders (path entries, editable-install finders) and the next level is
    searched in the parent's ``submodule_search_locations``; nothing is imported.
    """
    if not module or any(not part.isidentifier() for part in module.split(".")):
        return None
    spec = None
    search: list[str] | None = None
    parts = module.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        loaded = sys.modules.get(name)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else None
        if spec is None:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                try:
                    spec = find(name, search)
                except (ImportError, ValueError, TypeError, OSError):
                    spec = None
                if spec is not None:
                    break
        if spec is None:
            return None
        if i < len(parts) - 1:
            search = list(spec.submodule_search_locations or [])
            if not search:
                return None  # a plain module has no submodules
    return spec


def module_file(module: str) -> Path | None:
    spec = find_spec_static(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


@lru_cache(maxsize=128)
def _top_level_names(path: Path) -> dict[str, ast.AST]:
    from skillrun.io.regular_files import read_regular

    tree = ast.parse(read_regular(path, 16 << 20, "module source"), filename=str(path))
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names[t.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node.value
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names[(a.asname or a.name).split(".")[0]] = node
    return names


def check_ref(ref: str) -> str | None:
    """None if ``module:attr`` exists (statically); otherwise the reason it does not."""
    try:
        module, attr = split_ref(ref)
    except SkillRunError as exc:
        return exc.reason
    path = module_file(module)
    if path is None:
        return f"module {module!r} not found"
    try:
        names = _top_level_names(path)
    except SyntaxError as exc:
        return f"{path}: syntax error at line {exc.lineno}"
    except (SkillRunError, ValueError, RecursionError, MemoryError) as exc:
        return f"{path}: cannot read the module statically ({exc})"
    if attr not in names:
        return f"{module!r} defines no {attr!r}"
    return None


def check_module(module: str) -> str | None:
    return None if module_file(module) is not None else f"module {module!r} not found"


def module_constant(module: str, name: str) -> Any:
    """A literal top-level constant of a module (e.g. a problem's SHAPE_KEYS), read without import."""
    path = module_file(module)
    if path is None:
        return None
    try:
        node = _top_level_names(path).get(name)
    except (SyntaxError, SkillRunError, ValueError, RecursionError, MemoryError):
        return None
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        return None


def resolve(ref: str) -> Callable[..., Any]:
    module, attr = split_ref(ref)
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise SkillRunError(f"cannot import {module!r} for {ref!r}: {exc}") from None
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise SkillRunError(f"{module!r} has no {attr!r}") from None
