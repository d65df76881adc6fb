"""Kernel references (``module:function``) from cards: checked without importing, resolved lazily.

Lint must not import torch/triton/flydsl just to check that a card points at something real, so
static checks read the module's source with :mod:`ast`.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from skillrun.errors import SkillRunError


def split_ref(ref: str) -> tuple[str, str]:
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise SkillRunError(f"kernel reference {ref!r} is not of the form module:function")
    return module, attr


def module_file(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


@lru_cache(maxsize=128)
def _top_level_names(path: Path) -> dict[str, ast.AST]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
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
    node = _top_level_names(path).get(name)
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
