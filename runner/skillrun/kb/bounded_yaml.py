"""YAML for cards and artifacts: the safe loader, with a bound on what aliases may expand to.

``yaml.safe_load`` refuses arbitrary objects but not a "billion laughs" document: nine lines of
anchors and aliases (``b: [*a, *a, …]``, ``c: [*b, *b, …]``) load as a small graph that every later
consumer (the schema check, ``json.dumps`` of a recipe ``config``, the report) walks as a tree of
gigabytes. :class:`BoundedLoader` measures the document *as a tree* right after composing it
(before any Python object is built) and refuses it past ``MAX_NODES`` nodes; a recursive alias is
refused outright. Ordinary aliases (``yaml.safe_dump`` writes them for shared sub-objects) still load.

A key written twice in one mapping is an error too: PyYAML would keep the last one silently, so a
second ``kernel:`` further down a recipe could replace the one a reviewer read. (Keys brought in by
a ``<<`` merge may still be overridden, as YAML defines.)
"""
from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_NODES = 100_000  # a real card has a few hundred nodes, an artifact a few thousand


class ExpansionError(yaml.YAMLError):
    """The document would expand past the node budget, or an alias refers to itself."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = None


def tree_size(root: Node, limit: int = MAX_NODES) -> int:
    """Nodes in the fully expanded tree of ``root`` (aliases counted as copies); raises past ``limit``.

    Iterative, memoised per node: linear in the number of distinct nodes, however deep or
    however many times they are shared.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(c)] for c in _children(node))
            if total > limit:
                raise ExpansionError(f"aliases expand the document past {limit} nodes (an alias/anchor bomb?)")
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise ExpansionError("an alias refers to a node that contains it (recursive YAML)")
        on_path.add(key)
        stack.append((node, True))
        for c in _children(node):
            if id(c) in on_path:
                raise ExpansionError("an alias refers to a node that contains it (recursive YAML)")
            if id(c) not in sizes:
                stack.append((c, False))
    return sizes[id(root)]


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [x for pair in node.value for x in pair]
    return []


_MERGE_TAG = "tag:yaml.org,2002:merge"


class _NoDuplicateKeys:
    """The duplicate-key check, shared by the pure-Python and the libyaml loader."""

    def construct_mapping(self, node: Node, deep: bool = False):  # type: ignore[override]
        # Checked on the keys as written, before flatten_mapping folds `<<` merges in (a merged
        # key that the mapping then overrides is YAML's intent, not a duplicate).
        if isinstance(node, MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: the base constructor reports it
                if first is not key_node:
                    line = first.start_mark.line + 1 if first.start_mark else "?"
                    raise ConstructorError(None, None, f"duplicate key {key!r} (first written at line {line}; "
                                           "YAML would silently keep only the last)", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


class BoundedLoader(_NoDuplicateKeys, yaml.SafeLoader):
    """SafeLoader that checks the composed document's expanded size before constructing it,
    and refuses a mapping that writes the same key twice."""

    def compose_document(self) -> Node:  # type: ignore[override]
        node = super().compose_document()
        if node is not None:
            tree_size(node)
        return node


_CSafe = getattr(yaml, "CSafeLoader", None) if getattr(yaml, "__with_libyaml__", False) else None

if _CSafe is not None:
    class CBoundedLoader(_NoDuplicateKeys, _CSafe):  # type: ignore[valid-type, misc]
        """The same checks on libyaml's parser (about 8x faster: cards and artifacts are parsed on every
        run). libyaml composes the node graph; its size is measured before any object is built."""

        def get_single_node(self) -> Node:  # type: ignore[override]
            node = super().get_single_node()
            if node is not None:
                tree_size(node)
            return node
else:  # pragma: no cover - PyYAML built without libyaml
    CBoundedLoader = None  # type: ignore[assignment,misc]

# libyaml's composer recurses in C, where a document nested thousands deep would overflow the stack
# instead of raising: such a document goes to the pure-Python loader, which fails cleanly.
MAX_C_NESTING = 200
_FLOW = re.compile(r"[\[\]{}]")
_INDICATORS = re.compile(r"(?:^|\s)[-?:](?=\s|$)")


def nesting_bound(text: str) -> int:
    """An upper bound on how deep ``text`` can nest: the deepest flow brackets (quotes ignored, so it
    can only over-count) plus, over its lines, the widest indentation plus block indicators on one line."""
    depth = flow = 0
    for m in _FLOW.finditer(text):
        if m.group() in "[{":
            depth += 1
            flow = max(flow, depth)
        else:
            depth = max(0, depth - 1)
    block = 0
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        if stripped:
            block = max(block, len(line) - len(stripped) + len(_INDICATORS.findall(stripped)))
    return flow + block


def load(text: str) -> Any:
    """Like ``yaml.safe_load``; raises :class:`yaml.YAMLError` (incl. ExpansionError) on bad input."""
    loader = CBoundedLoader if CBoundedLoader is not None and nesting_bound(text) <= MAX_C_NESTING else BoundedLoader
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - both loaders are SafeLoaders
    except RecursionError:
        # PyYAML composes and constructs recursively: `[[[[…` thousands deep would escape as a crash.
        raise ExpansionError("YAML nested too deeply") from None
