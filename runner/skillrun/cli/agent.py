"""`skill-run agent` and `skill-run mcp`: an LLM agent over the runner's tools, and the same tools
served over the Model Context Protocol."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from skillrun.cli.common import err, guarded, index, out


@guarded
def agent_cmd(
    question: str = typer.Argument(..., help="What to ask, e.g. \"Which hot kernels of trace.json.gz can a skill speed up?\""),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="openai:NAME, ollama:NAME, or NAME on SKILLRUN_AGENT_BASE_URL (default $SKILLRUN_AGENT_MODEL)."),
    profile: Optional[Path] = typer.Option(None, "--profile", "-p", help="Trace to analyse; the tools may read it and the question mentions it."),
    allow: Optional[List[Path]] = typer.Option(None, "--allow", "-a", help="Extra file or folder the tools may read (repeatable)."),
    max_iterations: int = typer.Option(8, "--max-iterations", min=1, max=50, help="Model turns before giving up."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print each tool call and its result status to stderr."),
    as_json: bool = typer.Option(False, "--json", help="Print the answer and the tool calls as JSON."),
):
    """Ask an LLM agent that uses the runner's tools (analyse → show skill → check/run → read validation).

    Example: skill-run agent "Which hot kernels can a skill speed up?" --profile trace.json.gz -m openai:gpt-4o
    """
    from skillrun.agent.llm import make_chat_model
    from skillrun.agent.loop import build_agent

    llm = make_chat_model(model)  # UnavailableError (exit 5) says what to install or set
    allowed = [*(allow or []), *([profile] if profile else [])]
    if profile:
        question = f"{question}\n\nProfile trace: {profile.expanduser().resolve()}"
    agent = build_agent(llm, index=index(), allowed_paths=allowed, max_iterations=max_iterations)
    res = agent.invoke(question)
    if verbose:
        for c in res.tool_calls:
            r = c["result"] if isinstance(c["result"], dict) else {}
            status = "ok" if r.get("ok") else f"error: {r.get('error', '?')}"
            err.print(f"[dim]tool[/] {c['name']}({json.dumps(c['args'])}) → {status}", highlight=False)
    if as_json:
        sys.stdout.write(json.dumps({"answer": res.answer, "stopped": res.stopped, "iterations": res.iterations,
                                     "tool_calls": res.tool_calls}, indent=2, default=str) + "\n")
    else:
        out.print(res.answer, markup=False)
    if res.stopped:
        raise typer.Exit(1)


@guarded
def mcp_cmd(
    allow: Optional[List[Path]] = typer.Option(None, "--allow", "-a", help="File or folder the tools may read (repeatable)."),
):
    """Serve the agent tools over the Model Context Protocol on stdio (for MCP clients).

    Example: skill-run mcp --allow ./traces
    """
    from skillrun.agent.mcp_server import serve_stdio

    serve_stdio(index(), allow or [])


# What this module adds to `skill-run`, in the order `skill-run --help` lists it.
COMMANDS = (
    ("agent", agent_cmd, {}),
    ("mcp", mcp_cmd, {}),
)
