"""Errors the runner reports to people and agents.

Every user-facing failure is a :class:`SkillRunError` carrying the file it concerns, the field
(where there is one) and a reason, so the CLI can print one clear line and exit with a
documented code, and agent tools can return it as a readable result instead of raising.
"""
from __future__ import annotations

from dataclasses import dataclass

# Exit codes (documented in README and `skill-run --help`).
EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and found a problem (lint errors, a failed gate, parity failure)
EXIT_USAGE = 2  # bad arguments (typer's own usage errors also exit 2)
EXIT_INPUT = 3  # unreadable / corrupt / unsupported input file
EXIT_NO_MATCH = 4  # the profile was read but no skill card matched a hot kernel
EXIT_UNAVAILABLE = 5  # the requested backend/device/tool is not available here


@dataclass
class SkillRunError(Exception):
    reason: str
    path: str | None = None
    field: str | None = None
    exit_code: int = EXIT_FAILURE
    hint: str | None = None

    def __str__(self) -> str:
        where = ""
        if self.path:
            where = f"{self.path}: "
        if self.field:
            where += f"{self.field}: "
        text = f"{where}{self.reason}"
        if self.hint:
            text += f" ({self.hint})"
        return text


class InputError(SkillRunError):
    """A file we were asked to read is missing, corrupt, truncated or of an unknown format."""

    def __init__(self, reason: str, path: str | None = None, field: str | None = None, hint: str | None = None):
        super().__init__(reason=reason, path=path, field=field, exit_code=EXIT_INPUT, hint=hint)


class UsageError(SkillRunError):
    def __init__(self, reason: str, field: str | None = None, hint: str | None = None):
        super().__init__(reason=reason, field=field, exit_code=EXIT_USAGE, hint=hint)


class UnavailableError(SkillRunError):
    def __init__(self, reason: str, hint: str | None = None):
        super().__init__(reason=reason, exit_code=EXIT_UNAVAILABLE, hint=hint)
