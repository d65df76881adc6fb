"""A small tool-calling agent over langchain-core messages (no langchain/langgraph dependency).

    question ─▶ model ─▶ AIMessage.tool_calls ─▶ tools ─▶ ToolMessages ─▶ model ─▶ … ─▶ final answer

Any LangChain chat model that implements ``bind_tools`` works. Tool failures, unknown tool names
and malformed tool calls all come back to the model as readable tool results, so one bad call
never ends the run; the loop stops at a final answer or after ``max_iterations`` model turns.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from skillrun.agent.results import dumps
from skillrun.agent.safety import scrub_text
from skillrun.kb.index import SkillIndex

SYSTEM_PROMPT = """\
You are skillrun's kernel-porting assistant. You help an engineer decide which GPU kernels of a \
profiled workload an expert skill card can speed up, and you back every claim with evidence the \
runner produced. Work with the tools, in this order:

1. analyze_profile(path) on the trace the user gave: hot kernels, % of GPU time, shapes, which \
cards match (each criterion with its reason), near misses, and a plan (recipe per shape).
2. show_skill(skill_id) for each matched card: when it pays off, what the recipe changes, what it \
loses. Use read_fact for facts the card cites.
3. Gather evidence: run_skill(skill_id, shapes) on a GPU; without a GPU, check_skill(skill_id) for \
FlyDSL cards (compile-only gates) or run_skill(..., backend='cpu') for CPU numerics (no timing).
4. read_validation() to read the artifacts that step 3 wrote (or that already exist).

Rules:
- Never claim a speedup that is not in a validation artifact or a run_skill result. A card's \
expected speedup is a prior from its authors, not a measurement: call it that.
- Report compile-only results as compile-only ("it compiles and passes static gates"), and CPU \
numerics as numerics only; neither says anything about speed.
- Say which device and mode (gpu_measured, cpu_numerics, compile_only) each piece of evidence comes from.
- If a tool returns ok=false, read its error and hint, then fix the call or take the alternative \
it offers; do not repeat the same failing call.
- If no card matches, say so and explain the near misses; do not invent a port.
- Keep the final answer short: the hot kernels that matter, the card and recipe for each, the \
evidence with its verdict and artifact path, and what remains unverified.
"""


@dataclass
class AgentResult:
    answer: str
    messages: list = field(default_factory=list)  # the full conversation (langchain-core messages)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # [{name, args, result(parsed JSON)}]
    iterations: int = 0
    stopped: bool = False  # True when max_iterations ran out before a final answer


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        parts = [b.get("text", "") if isinstance(b, dict) else str(b) for b in content]
        return "".join(parts)
    return str(content)


class SkillAgent:
    def __init__(self, llm: Any, tools: list, max_iterations: int = 8, system_prompt: str = SYSTEM_PROMPT):
        if max_iterations < 1:
            raise ValueError("max_iterations must be at least 1")
        self.tools = {t.name: t for t in tools}
        self.max_iterations = max_iterations
        self.system_prompt = system_prompt
        if not hasattr(llm, "bind_tools"):
            raise TypeError(f"{type(llm).__name__} is not a LangChain chat model with bind_tools()")
        self.model = llm.bind_tools(tools)

    def _call_tool(self, name: str, args: Any) -> str:
        tool = self.tools.get(name)
        if tool is None:
            return dumps({"ok": False, "error": f"there is no tool named {name!r}",
                          "hint": "available tools: " + ", ".join(sorted(self.tools))})
        if not isinstance(args, dict):
            return dumps({"ok": False, "error": f"arguments for {name} must be a JSON object", "hint": "call it again with named arguments"})
        try:
            out = tool.invoke(args)
        except Exception as exc:  # noqa: BLE001 - tools already catch; this guards a misbehaving custom tool
            out = dumps({"ok": False, "error": f"{name} failed: {type(exc).__name__}: {exc}", "hint": "try a different call"})
        return out if isinstance(out, str) else dumps(out)

    def invoke(self, question: str, history: Optional[list] = None) -> AgentResult:
        from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

        messages: list = [SystemMessage(self.system_prompt), *(history or []), HumanMessage(question)]
        calls: list[dict[str, Any]] = []
        for turn in range(1, self.max_iterations + 1):
            ai = self.model.invoke(messages)
            if not isinstance(ai, AIMessage):
                ai = AIMessage(content=_content_text(getattr(ai, "content", ai)))
            messages.append(ai)
            pending = list(ai.tool_calls or [])
            bad = list(getattr(ai, "invalid_tool_calls", None) or [])
            if not pending and not bad:
                return AgentResult(answer=scrub_text(_content_text(ai.content)), messages=messages, tool_calls=calls, iterations=turn)
            for tc in pending:
                text = self._call_tool(tc["name"], tc.get("args"))
                messages.append(ToolMessage(content=text, tool_call_id=tc.get("id") or f"call_{len(calls)}", name=tc["name"]))
                calls.append({"name": tc["name"], "args": tc.get("args"), "result": _parse(text)})
            for tc in bad:
                # The model produced arguments that are not valid JSON: tell it, so it can retry.
                text = dumps({"ok": False, "error": f"could not parse the arguments of {tc.get('name')!r}: {tc.get('error') or 'invalid JSON'}",
                              "hint": "call the tool again with a valid JSON object of arguments"})
                messages.append(ToolMessage(content=text, tool_call_id=tc.get("id") or f"bad_{len(calls)}", name=tc.get("name") or "unknown"))
                calls.append({"name": tc.get("name"), "args": tc.get("args"), "result": _parse(text)})
        answer = (f"Stopped after {self.max_iterations} model turns without a final answer. "
                  f"Tools called: {', '.join(c['name'] or '?' for c in calls) or 'none'}.")
        return AgentResult(answer=answer, messages=messages, tool_calls=calls, iterations=self.max_iterations, stopped=True)


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def build_agent(llm: Any, *, index: SkillIndex | None = None, allowed_paths: Iterable[str | Path] = (),
                max_iterations: int = 8, tools: list | None = None, **tool_kw: Any) -> SkillAgent:
    """A tool-calling agent over the runner's tools, driven by any LangChain chat model with bind_tools()."""
    from skillrun.agent.tools import build_tools

    if tools is None:
        tools = build_tools(index, allowed_paths, **tool_kw)
    return SkillAgent(llm, tools, max_iterations=max_iterations)
