"""Text from traces, cards and paths made safe for a terminal.

Kernel names, op names and file names are data an attacker can choose. Printed as they are they
could carry rich markup (``[link=…]``, ``[/x]`` that crashes the markup parser) or raw escape
sequences (``ESC ]8;;url`` hyperlinks, cursor moves, a title change). :func:`safe` makes them
inert: control characters become visible ``\\xNN`` escapes and markup is escaped, so a
legitimate ``[abi:cxx11]`` tag still reads as written.
"""
from __future__ import annotations

import re

from rich.markup import escape as _escape_markup

# C0 controls (but tab), DEL, C1 controls, and the Unicode bidi overrides that can reorder what a
# reader sees (CVE-2021-42574 style).
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def plain(text: object) -> str:
    """``text`` with every control character shown as an escape (no markup handling)."""
    s = text if isinstance(text, str) else str(text)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}" if ord(m.group(0)) < 0x100 else f"\\u{ord(m.group(0)):04x}", s)


def safe(text: object) -> str:
    """``text`` ready to embed in a rich markup string: controls escaped, markup escaped."""
    return _escape_markup(plain(text))


def plain_block(text: object) -> str:
    """Like :func:`plain` for multi-line text (a card body): line breaks kept, every other
    control character escaped, so markdown still renders but an ESC/OSC-8/bidi sequence cannot."""
    s = text if isinstance(text, str) else str(text)
    return "\n".join(plain(line) for line in s.split("\n"))
