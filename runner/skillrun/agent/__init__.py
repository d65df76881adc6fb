"""The agent interface: LangChain tools, a small tool-calling loop, and an MCP server over them.

    from skillrun.agent import build_tools, build_agent
    tools = build_tools(allowed_paths=["trace.json.gz"])
    agent = build_agent(my_chat_model, allowed_paths=["trace.json.gz"])
    print(agent.invoke("Which kernels of trace.json.gz can a skill speed up?").answer)

langchain-core is needed for the LangChain side, ``mcp`` for the server; both are imported lazily so
that ``import skillrun.agent`` works without them.
"""
from __future__ import annotations

from typing import Any

__all__ = ["build_tools", "build_agent", "AgentResult", "SkillAgent", "SYSTEM_PROMPT", "tool_specs", "AgentTools"]


def __getattr__(name: str) -> Any:
    if name in ("build_tools", "tool_specs", "AgentTools"):
        from skillrun.agent import tools

        return getattr(tools, name)
    if name in ("build_agent", "AgentResult", "SkillAgent", "SYSTEM_PROMPT"):
        from skillrun.agent import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'skillrun.agent' has no attribute {name!r}")
