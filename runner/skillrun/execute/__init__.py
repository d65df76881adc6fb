"""Execution harness: a plan item becomes trustworthy evidence (a validation artifact).

Public API (imported lazily so that ``skillrun.execute.worker`` children stay light)::

    from skillrun.execute import execute_item, execute_plan, run_skill, ExecOptions

See :mod:`skillrun.execute.harness` for the phases, :mod:`.backends` for what runs where.
"""
from __future__ import annotations

from typing import Any

__all__ = ["execute_item", "execute_plan", "run_skill", "plan_item_for", "ExecOptions"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from skillrun.execute import harness

        return getattr(harness, name)
    raise AttributeError(f"module 'skillrun.execute' has no attribute {name!r}")
