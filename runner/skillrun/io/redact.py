"""Recognising and removing secrets in text that came from outside (traces, cards, tool output).

Real profiler traces carry environment variables, command lines and, in ``Concrete Inputs`` or
``Input type``, whatever string a program passed to an op, tokens included. Two rules apply:
a value assigned to a secret-looking name (``HF_TOKEN=…``, ``password: …``) is replaced, and a
token recognised by its issuer's prefix (``hf_``, ``ghp_``, ``github_pat_``, ``sk-``, ``xoxb-``,
``AKIA``, ``glpat-``, ``nvapi-``, …) is replaced *whatever its length*: a short or truncated token
is still a credential, or part of one.

Glued to an identifier (``MY_ghp_…``, ``key_AKIA…``) a prefix alone is too weak a sign (``_hf_``
occurs in ordinary names), so there a token is recognised at its issuer's full length. On top of
our rules come the regexes of the maintained detector set of ``detect-secrets`` (AWS, Azure
storage keys, GitHub, GitLab, Slack incl. webhooks, SendGrid, Stripe, Twilio, npm, PyPI, JWT, …),
those that recognise a credential by its form; its entropy and keyword heuristics are left out
(they would redact hashes and kernel names). Private-key blocks are removed whole, body included.
"""
from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"

# Secret-looking key names. TOKEN must stand alone between separators so that shape keys such as
# `tokens` or `max_tokens` are left alone while HF_TOKEN, access_token and TOKEN_ID are caught.
_KEY = (r"[A-Za-z0-9_]*(?:SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|ACCOUNT_?KEY|PRIVATE_?KEY|CREDENTIAL"
        r"|(?<![A-Za-z])TOKEN(?![A-Za-z]))[A-Za-z0-9_]*")
_KEY_RE = re.compile(rf"^{_KEY}$", re.I)
_ASSIGN_RE = re.compile(rf"(?<![A-Za-z0-9_])({_KEY})(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&\"']+)", re.I)

# Issuer prefixes: the token is the prefix plus every token character after it (any length >= 1).
# The look-behind keeps prefixes inside identifiers (`mask-`, `_hf_`, `task-`) from matching.
_B = r"(?<![A-Za-z0-9_.-])"
_PREFIXED = [
    r"hf_[A-Za-z0-9]+",  # Hugging Face
    r"api_org_[A-Za-z0-9]+",  # Hugging Face org
    r"sk-[A-Za-z0-9_-]+",  # OpenAI (sk-proj-, sk-svcacct-), Anthropic (sk-ant-), DeepSeek …
    r"gh[pousr]_[A-Za-z0-9]+",  # GitHub
    r"github_pat_[A-Za-z0-9_]+",
    r"xox[abposre]-[A-Za-z0-9-]+",  # Slack
    r"xapp-[A-Za-z0-9-]+",
    r"(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]+",  # AWS access key ids
    r"gl(?:pat|ptt|dt|rt|soat|cbt|imt|agent|oas)-[A-Za-z0-9_-]+",  # GitLab
    r"nvapi-[A-Za-z0-9_-]+",  # NVIDIA NGC / build.nvidia.com
    r"npm_[A-Za-z0-9]+",
    r"pypi-[A-Za-z0-9_-]+",
    r"AIza[0-9A-Za-z_-]+",  # Google API key
    r"ya29\.[0-9A-Za-z_-]+",  # Google OAuth access token
    r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]+",  # Stripe secret / restricted keys
    r"r8_[A-Za-z0-9]+",  # Replicate
    r"dop_v1_[a-f0-9]+",  # DigitalOcean
    r"eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*",  # JWT
]
# After an underscore (glued to an identifier): only at the issuer's full token length.
_GLUED = [
    r"hf_[A-Za-z0-9]{30,}",
    r"gh[pousr]_[A-Za-z0-9]{30,}",
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}",
    r"sk-[A-Za-z0-9_-]{20,}",
    r"xox[abposre]-[A-Za-z0-9-]{10,}",
    r"gl(?:pat|ptt|dt|rt|soat|cbt)-[A-Za-z0-9_-]{20,}",
    r"nvapi-[A-Za-z0-9_-]{30,}",
    r"AIza[0-9A-Za-z_-]{35}",
    r"dapi[a-f0-9]{32}",
]
# Credentials with a fixed form that no rule above (nor detect-secrets) covers.
_FORMS = [
    r"(?<![A-Za-z0-9])dapi[a-f0-9]{32}(?:-\d+)?",  # Databricks personal access token
    r"AGE-SECRET-KEY-1[0-9A-Z]{20,}",  # age secret key
    r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]+",  # Slack webhooks
    # A private key block, its body included (an unterminated one up to the end of the text).
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[A-Za-z0-9+/=\s:,.-]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}",  # SendGrid
]
_VALUE_RES = [
    re.compile(_B + "(?:" + "|".join(_PREFIXED) + ")"),
    re.compile("(?<=_)(?:" + "|".join(_GLUED) + ")"),
    *(re.compile(f) for f in _FORMS),
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/-]+=*"),
    re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"),  # user:password@ in a URL
]

# detect-secrets plugins whose regexes recognise a credential by its form. Left out: entropy and
# keyword heuristics, public IPs, and Artifactory's (it matches ordinary words after a space).
_DETECTORS = ("AWSKeyDetector", "AzureStorageKeyDetector", "BasicAuthDetector", "CloudantDetector",
              "DiscordBotTokenDetector", "GitHubTokenDetector", "GitLabTokenDetector", "IbmCloudIamDetector",
              "IbmCosHmacDetector", "JwtTokenDetector", "MailchimpDetector", "NpmDetector", "OpenAIDetector",
              "PypiTokenDetector", "SendGridDetector", "SlackDetector", "SoftlayerDetector", "SquareOAuthDetector",
              "StripeDetector", "TelegramBotTokenDetector", "TwilioKeyDetector")


def _detector_patterns() -> list[re.Pattern]:
    try:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    except ImportError:  # not installed: our own rules still apply
        return []
    out = []
    for cls in get_mapping_from_secret_type_to_class().values():
        if cls.__name__ not in _DETECTORS:
            continue
        try:
            out += [p for p in cls().denylist if isinstance(p, re.Pattern)]
        except Exception:  # noqa: BLE001 - a plugin that changed shape must not break scrubbing
            continue
    return out


_DETECTED: list[re.Pattern] | None = None


def _detected() -> list[re.Pattern]:
    global _DETECTED
    if _DETECTED is None:
        _DETECTED = _detector_patterns()
    return _DETECTED


def _cut(m: re.Match) -> str:
    """The match with its secret replaced: the first group when the pattern marks one, else all."""
    if m.re.groups and m.group(1) is not None:
        s, e = m.span(1)
        return m.group(0)[: s - m.start()] + REDACTED + m.group(0)[e - m.start():]
    return REDACTED


def scrub_text(text: str) -> str:
    """Replace anything that looks like a secret in free text."""
    text = _ASSIGN_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    for rx in _VALUE_RES:
        text = rx.sub(REDACTED, text)
    for rx in _detected():
        text = rx.sub(_cut, text)
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
