"""Which chat model drives `skill-run agent`: resolved from --model and the environment.

    --model openai:gpt-4o        langchain-openai, OPENAI_API_KEY (SKILLRUN_AGENT_BASE_URL overrides the endpoint)
    --model ollama:llama3        langchain-ollama, a local Ollama server (OLLAMA_HOST, default localhost)
    --model NAME                 any OpenAI-compatible endpoint: SKILLRUN_AGENT_BASE_URL (+ OPENAI_API_KEY if it needs one)
    (no --model)                 SKILLRUN_AGENT_MODEL, read the same way

Integration packages are optional: when one is missing the error says what to install.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Mapping

from skillrun.errors import UnavailableError

PROVIDERS = ("openai", "ollama")

HOW_TO_CONFIGURE = (
    "no chat model is configured for the agent. Pass --model, e.g. `--model openai:gpt-4o` "
    "(pip install langchain-openai; set OPENAI_API_KEY) or `--model ollama:llama3` (pip install langchain-ollama; "
    "a running Ollama server), or point at any OpenAI-compatible server with SKILLRUN_AGENT_BASE_URL and "
    "SKILLRUN_AGENT_MODEL (pip install langchain-openai). Without a model, the same tools are available to "
    "other agents through `skill-run mcp`."
)


def _need(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UnavailableError(f"the agent's model integration {package!r} is not installed",
                               hint=f"pip install {package}") from None


def parse_model_spec(spec: str) -> tuple[str, str]:
    """('openai'|'ollama'|'openai-compatible', model name). Model names may contain ':' (llama3:8b)."""
    spec = spec.strip()
    head, sep, rest = spec.partition(":")
    if sep and head.lower() in PROVIDERS and rest:
        return head.lower(), rest
    return "openai-compatible", spec


def make_chat_model(spec: str | None = None, env: Mapping[str, str] | None = None, temperature: float = 0.0) -> Any:
    """A LangChain chat model for `spec`, or an UnavailableError saying exactly what to install/set."""
    env = os.environ if env is None else env
    spec = spec or env.get("SKILLRUN_AGENT_MODEL")
    if not spec:
        raise UnavailableError(HOW_TO_CONFIGURE)
    provider, name = parse_model_spec(spec)
    base_url = env.get("SKILLRUN_AGENT_BASE_URL") or None
    if provider == "ollama":
        mod = _need("langchain_ollama", "langchain-ollama")
        kw = {"base_url": env["OLLAMA_HOST"]} if env.get("OLLAMA_HOST") else {}
        return mod.ChatOllama(model=name, temperature=temperature, **kw)
    mod = _need("langchain_openai", "langchain-openai")
    key = env.get("OPENAI_API_KEY")
    if provider == "openai-compatible" and not base_url:
        raise UnavailableError(f"model {spec!r} has no provider prefix and SKILLRUN_AGENT_BASE_URL is not set",
                               hint="use --model openai:NAME or ollama:NAME, or set SKILLRUN_AGENT_BASE_URL to an OpenAI-compatible server")
    if not key and not base_url:
        raise UnavailableError("OPENAI_API_KEY is not set", hint="export OPENAI_API_KEY=… or use SKILLRUN_AGENT_BASE_URL for a local server")
    # Local OpenAI-compatible servers often need no key, but the client insists on one.
    return mod.ChatOpenAI(model=name, temperature=temperature, base_url=base_url, api_key=key or "not-needed")
