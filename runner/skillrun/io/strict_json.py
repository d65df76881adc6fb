"""JSON that every parser accepts: what ``--json`` prints and what tools return.

Python's ``json.dumps`` writes ``NaN`` and ``Infinity`` for non-finite floats, which is not JSON
(RFC 8259) and breaks ``jq``, JavaScript and most other readers. A non-finite number here can
only mean "no meaningful value", so it becomes ``null``; objects JSON has no type for (paths,
dates) become their string form, as before.
"""
from __future__ import annotations

import json
import math
from typing import Any


def clean(data: Any) -> Any:
    """A copy of ``data`` with every non-finite float replaced by None (iterative: any depth)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if not isinstance(data, (dict, list, tuple)):
        return data
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(data, root, 0)]
    while stack:
        src, parent, key = stack.pop()
        if isinstance(src, dict):
            dst: Any = dict.fromkeys(src)  # keys in their order; values filled below
            parent[key] = dst
            for k, v in src.items():
                stack.append((v, dst, k))
        elif isinstance(src, (list, tuple)):
            dst = [None] * len(src)
            parent[key] = dst
            for i, v in enumerate(src):
                stack.append((v, dst, i))
        elif isinstance(src, float) and not math.isfinite(src):
            parent[key] = None
        else:
            parent[key] = src
    return root[0]


def dumps(data: Any, **kw: Any) -> str:
    """Strict JSON text of ``data`` (``allow_nan=False`` after cleaning, so it can never emit NaN)."""
    return json.dumps(clean(data), allow_nan=False, default=str, **kw)
