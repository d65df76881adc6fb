"""What the agent tools may read, and what they must never repeat.

Tools read only inside the knowledge base and the paths the user handed over when the tools were
built; everything else is refused with a readable error. Symlinks and ``..`` are resolved before
the check, so a link inside an allowed folder cannot lead outside it.

Real profiler traces carry environment variables and tokens. The Profile model keeps none of
that, but tool outputs are still scrubbed defensively: a model must never see a secret, because
it may repeat it.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

from skillrun.errors import UsageError

REDACTED = "<redacted>"

# Secret-looking key names. TOKEN must stand alone between separators so that shape keys such as
# `tokens` or `max_tokens` are left alone while HF_TOKEN, access_token and TOKEN_ID are caught.
_KEY = (r"[A-Za-z0-9_]*(?:SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL"
        r"|(?<![A-Za-z])TOKEN(?![A-Za-z]))[A-Za-z0-9_]*")
_KEY_RE = re.compile(rf"^{_KEY}$", re.I)
_ASSIGN_RE = re.compile(rf"(?<![A-Za-z0-9_])({_KEY})(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&\"']+)", re.I)
# Token formats that are secret whatever name they sit under.
_VALUE_RES = [
    re.compile(r"\bhf_[A-Za-z0-9]{8,}"),  # Hugging Face
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"),  # OpenAI / Anthropic style
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{16,}=*"),
]


def scrub_text(text: str) -> str:
    """Replace anything that looks like a secret in free text."""
    text = _ASSIGN_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    for rx in _VALUE_RES:
        text = rx.sub(REDACTED, text)
    return text


def is_secret_key(key: str) -> bool:
    return bool(_KEY_RE.match(key))


def scrub(data: Any) -> Any:
    """Scrub a JSON-like structure: string values are cleaned, values under secret-named keys dropped."""
    if isinstance(data, str):
        return scrub_text(data)
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            key = scrub_text(k) if isinstance(k, str) else k
            if isinstance(k, str) and is_secret_key(k) and isinstance(v, (str, bytes)):
                out[key] = REDACTED
            else:
                out[key] = scrub(v)
        return out
    if isinstance(data, (list, tuple)):
        return [scrub(v) for v in data]
    return data


class PathGuard:
    """Read access limited to the knowledge base and the user's own files/folders."""

    def __init__(self, kb_root: Path, allowed: Iterable[str | Path] = ()):
        self.kb_root = Path(kb_root).resolve()
        self.allowed: list[Path] = [Path(p).expanduser().resolve() for p in allowed]

    @property
    def roots(self) -> list[Path]:
        return [self.kb_root, *self.allowed]

    def permits(self, path: Path) -> bool:
        for root in self.roots:
            if path == root or path.is_relative_to(root):
                return True
        return False

    def resolve(self, raw: str | Path, what: str = "path") -> Path:
        """The real path of `raw` if the tools may read it; a UsageError naming the rule otherwise."""
        text = str(raw).strip()
        if not text:
            raise UsageError(f"empty {what}", field=what)
        try:
            path = Path(text).expanduser().resolve()
        except (OSError, RuntimeError) as exc:  # symlink loops, unreadable parents
            raise UsageError(f"cannot resolve {what} {text!r}: {exc}", field=what) from None
        if not self.permits(path):
            shown = ", ".join(str(r) for r in self.roots)
            raise UsageError(
                f"{what} {text!r} (resolves to {path}) is outside the paths these tools may read",
                field=what,
                hint=f"allowed: {shown}; ask the user to pass the file when starting the agent (--allow PATH)",
            )
        if not path.exists():
            raise UsageError(f"no such file: {path}", field=what, hint="check the path the user gave")
        return path
