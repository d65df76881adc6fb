"""Kernel-name regexes from cards, compiled by one function for lint and matching alike.

A card's ``op_name_regex`` is untrusted data and kernel names come from untrusted traces, so the
patterns run on RE2 (``google-re2``), whose matching time is linear in the name's length whatever
the pattern: ``(a+)+b`` cannot backtrack, because RE2 never does. Constructs RE2 cannot run in
linear time (back-references, look-around, possessive or atomic groups) are refused with the
engine's reason; the same refusal makes ``lint`` fail and keeps the card out of matching, so lint
and matching can never disagree on which patterns are accepted.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2

MAX_PATTERN_LEN = 2000  # characters; real card patterns are under 200
_MAX_MEM = 8 << 20  # RE2's compiled-program budget per pattern (its default); larger ones are refused


class RegexRejected(ValueError):
    """The pattern cannot be used as a card regex; ``str()`` says why in one line."""


def _options() -> Any:
    opts = re2.Options()
    opts.log_errors = False  # RE2 would otherwise print to stderr on every bad pattern
    opts.max_mem = _MAX_MEM
    return opts


@lru_cache(maxsize=256)
def _compile(pattern: str) -> Any:
    if not isinstance(pattern, str):
        raise RegexRejected("regex must be a string")
    if len(pattern) > MAX_PATTERN_LEN:
        raise RegexRejected(f"regex longer than {MAX_PATTERN_LEN} characters")
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise RegexRejected(f"invalid regex for the linear-time engine (RE2): {detail}") from None


def compile_card_regex(pattern: str) -> Any:
    """The compiled pattern (``.search(name)`` is linear-time), or :class:`RegexRejected`."""
    return _compile(pattern)


def check_regex(pattern: str) -> str | None:
    """None if the pattern is accepted; else the reason (what lint prints)."""
    try:
        _compile(pattern)
    except RegexRejected as exc:
        return str(exc)
    return None
