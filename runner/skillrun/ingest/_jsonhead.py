"""Walk the top level of a JSON document without parsing its big value.

A Kineto trace is ``{"k": v, …, "traceEvents": [ …GBs… ], "k2": v2, …}`` and a rocprofv3 trace is
``{"rocprofiler-sdk-tool": [...]}``. To sniff the format, and to read ``deviceProperties`` before
the event array, we parse the small top-level values with the stdlib's C scanner and stop at the
key we are looking for. Bytes are decoded as latin-1 so that string indices equal byte offsets.

Valid JSON must never be refused here: a prefix that ends inside a string (however long) or inside
a number asks for more bytes rather than failing, and a value nested deeper than the C scanner's
recursion limit is skipped with an iterative scanner (such a value is never one we keep).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

_DEC = json.JSONDecoder()
_WS = " \t\r\n"
_STRUCT = re.compile(r'["\[\]{}]')


def _truncated(exc: json.JSONDecodeError, text: str, complete: bool) -> bool:
    """Whether a decode error can be the buffer's end (more bytes may make the value valid)."""
    if complete:
        return False
    # The scanner reports an unterminated string at the string's *start*, however far back.
    return exc.msg.startswith("Unterminated string") or exc.pos >= len(text) - 64


def skip_value(text: str, i: int, complete: bool) -> int:
    """End index of the JSON array/object starting at ``text[i]``, found without recursion.

    Only strings and brackets are checked (what a deep value needs to be delimited); it is used
    for values we do not keep, where the C scanner would hit its recursion limit.
    """
    depth = 0
    n = len(text)
    while True:
        m = _STRUCT.search(text, i)
        if m is None:
            if complete:
                raise BadJSON("unexpected end of JSON inside a nested value", n)
            raise NeedMore()
        j = m.start()
        c = text[j]
        if c == '"':
            try:
                _, i = json.decoder.scanstring(text, j + 1)
            except json.JSONDecodeError as exc:
                if _truncated(exc, text, complete):
                    raise NeedMore() from None
                raise BadJSON(f"bad string in a nested value ({exc.msg})", exc.pos) from None
            if depth == 0:
                return i
            continue
        depth += 1 if c in "[{" else -1
        if depth < 0:
            raise BadJSON("unbalanced bracket", j)
        i = j + 1
        if depth == 0:
            return i


def _decode(text: str, i: int, complete: bool) -> tuple[Any, int, bool]:
    """(value, end, kept): one top-level value; ``kept`` is False for one too deep to decode."""
    try:
        value, end = _DEC.raw_decode(text, i)
        return value, end, True
    except RecursionError:
        if text[i] not in "[{":
            raise BadJSON("invalid JSON value", i) from None
        return None, skip_value(text, i, complete), False


class NeedMore(Exception):
    """The buffer ended inside a value; read more and retry."""


class BadJSON(Exception):
    def __init__(self, msg: str, pos: int):
        super().__init__(msg)
        self.msg = msg
        self.pos = pos


@dataclass
class TopLevel:
    kind: str  # "object" | "array"
    keys: list[str] = field(default_factory=list)  # top-level keys seen, in order
    values: dict[str, Any] = field(default_factory=dict)  # values of the keys we asked to keep
    stop_key: Optional[str] = None  # the key we stopped at
    stop_value_pos: int = -1  # byte offset of that key's value (first non-blank char)


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def walk(text: str, stop_keys: set[str], keep: Optional[set[str]], complete: bool) -> TopLevel:
    """Walk ``text`` (a document prefix) up to the first key in ``stop_keys``.

    ``complete`` says whether ``text`` is the whole document (then running out is an error,
    otherwise :class:`NeedMore`). ``keep=None`` keeps every value (except ones too deep to decode).
    """
    i = _skip_ws(text, 0)
    if text.startswith("\ufeff", i) or text.startswith("\xef\xbb\xbf", i):
        i = _skip_ws(text, i + (1 if text[i] == "\ufeff" else 3))
    if i >= len(text):
        if complete:
            raise BadJSON("no JSON value (file is blank)", i)
        raise NeedMore()
    if text[i] == "[":
        return TopLevel(kind="array", stop_value_pos=i)
    if text[i] != "{":
        raise BadJSON("not JSON (expected '{' or '[')", i)
    out = TopLevel(kind="object")
    i = _skip_ws(text, i + 1)
    first = True
    while True:
        if i >= len(text):
            if complete:
                raise BadJSON("unexpected end of JSON in the top-level object", i)
            raise NeedMore()
        c = text[i]
        if c == "}":
            return out
        if not first:
            if c != ",":
                raise BadJSON("expected ',' between top-level keys", i)
            i = _skip_ws(text, i + 1)
            if i >= len(text):
                if complete:
                    raise BadJSON("unexpected end of JSON", i)
                raise NeedMore()
        if text[i] != '"':
            raise BadJSON("expected a quoted key", i)
        try:
            key, i = json.decoder.scanstring(text, i + 1)
        except json.JSONDecodeError as exc:
            if _truncated(exc, text, complete):
                raise NeedMore() from None
            raise BadJSON("bad key string", i) from None
        i = _skip_ws(text, i)
        if i >= len(text):
            if complete:
                raise BadJSON("unexpected end of JSON", i)
            raise NeedMore()
        if text[i] != ":":
            raise BadJSON("expected ':' after a key", i)
        i = _skip_ws(text, i + 1)
        out.keys.append(key)
        if key in stop_keys:
            if i >= len(text):
                if complete:
                    raise BadJSON("unexpected end of JSON", i)
                raise NeedMore()
            out.stop_key = key
            out.stop_value_pos = i
            return out
        try:
            value, i, kept = _decode(text, i, complete)
        except json.JSONDecodeError as exc:
            if _truncated(exc, text, complete):
                raise NeedMore() from None
            raise BadJSON(f"invalid JSON value for top-level key ({exc.msg})", exc.pos) from None
        if kept and (keep is None or key in keep):
            out.values[key] = value
        i = _skip_ws(text, i)
        first = False


def walk_stream(read: Callable[[int], bytes], stop_keys: set[str], keep: set[str],
                first: int = 1 << 16, limit: int = 512 << 20) -> tuple[TopLevel, bytes]:
    """Read with ``read(n)`` until the walk can decide; returns the result and the bytes read."""
    buf = bytearray()
    want = first
    eof = False
    while True:
        while len(buf) < want and not eof:
            b = read(want - len(buf))
            if not b:
                eof = True
                break
            buf += b
        text = bytes(buf).decode("latin-1")
        try:
            return walk(text, stop_keys, keep, complete=eof), bytes(buf)
        except NeedMore:
            if eof:
                raise BadJSON("unexpected end of file", len(buf)) from None
            if want >= limit:
                raise BadJSON(f"top-level values before the event list exceed {limit >> 20} MiB", len(buf)) from None
            want *= 4


def parse_tail(text: str) -> dict[str, Any]:
    """Parse what follows the closing ``]`` of the event array: ``, "k": v … }`` or ``}``."""
    t = text.lstrip(_WS)
    if not t:
        raise BadJSON("the top-level object is not closed (file truncated?)", len(text))
    if t[0] == "}":
        if t[1:].strip(_WS):
            raise BadJSON("unexpected data after the end of the JSON document", len(text) - len(t) + 1)
        return {}
    if t[0] != ",":
        raise BadJSON("unexpected data after the event list", len(text) - len(t))
    doc = "{" + t[1:]
    try:
        obj, end = _DEC.raw_decode(doc, 0)
    except json.JSONDecodeError as exc:
        raise BadJSON(f"invalid JSON after the event list ({exc.msg})", exc.pos) from None
    except RecursionError:
        # A deep value after the events: walk the keys, keeping every value that decodes.
        top = walk(doc, set(), None, complete=True)
        return top.values
    if doc[end:].strip(_WS):
        raise BadJSON("unexpected data after the end of the JSON document", end)
    return obj if isinstance(obj, dict) else {}
