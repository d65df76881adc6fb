"""The source identity of a kernel: its module and every ``skillrun_kernels`` module it imports.

    fields, problem = source_identity("skillrun_kernels.fp8_blockscale_moe.triton_sm90:build")
    # fields == {"kernel_source_sha256": "…", "kernel_sources": {"skillrun_kernels._moe.routing": "…", …}}

A validation artifact records what it ran, so the evidence index can tell when today's code is not
what was measured. Ports import shared helpers (``_moe``, ``_flydsl``, ``_triton``, a family's
``problem`` and ``layout``), and an edit to one of those changes what the port runs as surely as an
edit to the port's own file; so the identity is the sha256 of every ``skillrun_kernels`` module the
kernel module reaches through its imports, transitively, the packages above each one included (their
``__init__`` runs on import too).

The closure is found statically with :mod:`ast` (a port is untrusted: nothing is imported to learn
what it imports) and bounded: at most :data:`MAX_MODULES` modules, :data:`MAX_FILE_BYTES` per file and
:data:`MAX_TOTAL_BYTES` in all; past a bound, or on a file that does not parse, :class:`InputError`
names the file. Every import statement counts, those inside functions and ``try`` blocks included,
so the identity may cover a module a given run did not execute (a stale flag too many, never one too
few). Imports by a computed name (``importlib.import_module(x)``) cannot be seen and are not covered.

``kernel_source_sha256`` (the kernel module alone) is still written beside ``kernel_sources``:
artifacts from before ``kernel_sources`` carry only it and are judged by it alone.
"""
from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any, Iterator, Optional

from skillrun.errors import InputError, SkillRunError
from skillrun.kb.refs import module_file, split_ref
from skillrun.io.regular_files import read_regular

PACKAGE = "skillrun_kernels"
# A family reaches ~10-25 modules today; the caps only stop a hostile or runaway tree.
MAX_MODULES = 200
MAX_FILE_BYTES = 4 << 20
MAX_TOTAL_BYTES = 32 << 20


def _valid_name(module: Any) -> bool:
    return isinstance(module, str) and bool(module) and all(p.isidentifier() for p in module.split("."))


def locate(module: str, root: Optional[Path] = None) -> Optional[Path]:
    """The source file of ``module``, found without importing it.

    With ``root`` (a knowledge-base root), ``skillrun_kernels`` modules are looked for under
    ``root/kernels/skillrun_kernels`` first, so an index of one KB judges against that KB's kernels.
    """
    if not _valid_name(module):
        return None
    parts = module.split(".")
    if root is not None and parts[0] == PACKAGE:
        base = Path(root).joinpath("kernels", PACKAGE, *parts[1:])
        for cand in (base.with_suffix(".py") if len(parts) > 1 else None, base / "__init__.py"):
            if cand is not None and cand.is_file():
                return cand
    return module_file(module)


def source_sha256(path: Path) -> str:
    """The sha256 of one source file (read as a regular file, capped); InputError names the file."""
    return hashlib.sha256(read_regular(path, MAX_FILE_BYTES, "kernel source")).hexdigest()


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every absolute module name an import statement of ``module`` may load (candidates: a
    ``from pkg import name`` yields ``pkg.name`` too, kept only when such a module exists)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _parents(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                if node.level - 1 > len(base) - 1:
                    continue  # beyond the top-level package: fails at import, loads nothing of ours
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target:
                continue
            yield from _parents(target)
            for alias in node.names:
                if alias.name != "*":
                    yield f"{target}.{alias.name}"


def kernel_sources(module: str, root: Optional[Path] = None) -> dict[str, str]:
    """{module: sha256} for ``module`` and every ``skillrun_kernels`` module it imports, transitively.

    The packages above each module are included where they have an ``__init__.py``. A name that
    resolves to no file (an attribute imported from a package, a missing module) is skipped: it adds
    no source of its own. Raises InputError naming the file on a parse failure or past a bound.
    """
    first = locate(module, root)
    if first is None:
        raise InputError(f"module {module!r} not found", field="kernel")
    todo = [(module, first)]
    for parent in _parents(module)[:-1]:  # the packages above it run their __init__ first
        parent_path = locate(parent, root) if parent.split(".")[0] == PACKAGE else None
        if parent_path is not None:
            todo.append((parent, parent_path))
    seen = {name for name, _ in todo}
    out: dict[str, str] = {}
    total = 0
    while todo:
        name, path = todo.pop()
        data = read_regular(path, MAX_FILE_BYTES, "kernel source")
        total += len(data)
        if total > MAX_TOTAL_BYTES:
            raise InputError(f"the kernel {module} imports more than {MAX_TOTAL_BYTES >> 20} MiB of source "
                             "(the cap on what its identity hashes)", path=str(path))
        out[name] = hashlib.sha256(data).hexdigest()
        try:
            tree = ast.parse(data, filename=str(path))
        except SyntaxError as exc:
            raise InputError(f"kernel source does not parse (syntax error at line {exc.lineno})", path=str(path)) from None
        except (ValueError, RecursionError, MemoryError) as exc:
            raise InputError(f"kernel source cannot be read statically ({type(exc).__name__})", path=str(path)) from None
        for dep in _imported(tree, name, path.name == "__init__.py"):
            if dep in seen or dep.split(".")[0] != PACKAGE:
                continue
            seen.add(dep)
            dep_path = locate(dep, root)
            if dep_path is None:
                continue
            if len(out) + len(todo) + 1 > MAX_MODULES:
                raise InputError(f"the kernel {module} imports more than {MAX_MODULES} {PACKAGE} modules "
                                 "(the cap on what its identity hashes)", path=str(dep_path))
            todo.append((dep, dep_path))
    return dict(sorted(out.items()))


def source_identity(ref: str) -> tuple[dict[str, Any], Optional[str]]:
    """The ``recipe`` fields that identify what ``ref`` (``module:function``) runs, and a note when
    only part of it could be recorded.

    ``kernel_source_sha256`` is written whenever the module's file is found (as before
    ``kernel_sources`` existed); ``kernel_sources`` when its import closure could be read. A
    closure that cannot be read (a helper that does not parse, a bound passed) is a note, not an
    error: the run itself reports a broken port, and its artifact is still written.
    """
    try:
        module = split_ref(ref)[0]
    except SkillRunError:
        return {}, None
    path = locate(module)
    if path is None:
        return {}, None
    fields: dict[str, Any] = {}
    try:
        fields["kernel_source_sha256"] = source_sha256(path)
        fields["kernel_sources"] = kernel_sources(module)
    except SkillRunError as exc:
        where = f"{exc.path}: " if exc.path else ""
        return fields, f"kernel_sources not recorded ({where}{exc.reason}); the artifact's identity is the kernel module alone"
    return fields, None
