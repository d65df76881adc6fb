"""The agent tools over the Model Context Protocol (stdio), with the official `mcp` SDK.

`skill-run mcp --allow TRACE` starts it; an MCP client (Claude Desktop, an IDE, another agent)
then sees the same seven tools, argument schemas and JSON results as the LangChain agent. A result
with ``"ok": false`` is also flagged ``isError`` so that clients show it as a failed call.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Optional

from pydantic import Field

from skillrun.agent.loop import SYSTEM_PROMPT
from skillrun.agent.results import dumps
from skillrun.agent.tools import AgentTools, ToolSpec, tool_specs
from skillrun.errors import UnavailableError
from skillrun.kb.index import SkillIndex

SERVER_NAME = "skillrun"


def _server_class() -> tuple[Any, bool]:
    """(server class, is_v2). mcp 2.x renamed FastMCP to MCPServer; both are supported."""
    try:
        from mcp.server.mcpserver import MCPServer

        return MCPServer, True
    except ImportError:
        pass
    try:
        from mcp.server.fastmcp import FastMCP

        return FastMCP, False
    except ImportError:
        raise UnavailableError("the MCP server needs the `mcp` package", hint="pip install 'skillrun[agent]' (or pip install mcp)") from None


def _signature(schema: type) -> inspect.Signature:
    """A keyword-only signature mirroring the pydantic argument model, so the SDK publishes the same JSON Schema."""
    params = []
    for name, f in schema.model_fields.items():
        # Description and bounds (ge/le/min_length live in f.metadata); the default goes on the parameter.
        ann = Annotated[(f.annotation, Field(description=f.description), *f.metadata)]
        default = inspect.Parameter.empty if f.is_required() else f.get_default(call_default_factory=True)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann))
    return inspect.Signature(params)


def _mcp_function(spec: ToolSpec, as_result: bool) -> Callable[..., Any]:
    if as_result:
        from mcp.types import CallToolResult, TextContent

        def fn(**kwargs: Any) -> Any:
            res = spec.run(**kwargs)
            return CallToolResult(content=[TextContent(type="text", text=dumps(res))], isError=not res.get("ok", False))
    else:
        def fn(**kwargs: Any) -> Any:
            return dumps(spec.run(**kwargs))

    fn.__name__ = spec.name
    fn.__doc__ = spec.description
    fn.__signature__ = _signature(spec.args_schema)  # type: ignore[attr-defined]
    return fn


def build_server(index: SkillIndex | None = None, allowed_paths: Iterable[str | Path] = (),
                 gpu_probe: Optional[Callable[[], Optional[str]]] = None) -> Any:
    from skillrun import __version__

    cls, v2 = _server_class()
    try:  # clients show serverInfo.version; mcp 2.x takes it here
        server = cls(SERVER_NAME, instructions=SYSTEM_PROMPT, log_level="WARNING", version=__version__)
    except TypeError:  # mcp 1.x FastMCP has no such argument: set it on its low-level server
        server = cls(SERVER_NAME, instructions=SYSTEM_PROMPT, log_level="WARNING")
        low = getattr(server, "_mcp_server", None)
        if low is not None:
            low.version = __version__
    for spec in tool_specs(AgentTools(index, allowed_paths, gpu_probe=gpu_probe)):
        fn = _mcp_function(spec, as_result=v2)
        try:
            server.add_tool(fn, name=spec.name, description=spec.description, structured_output=False)
        except TypeError:  # older SDKs without structured_output
            server.add_tool(fn, name=spec.name, description=spec.description)
    return server


def serve_stdio(index: SkillIndex | None = None, allowed_paths: Iterable[str | Path] = ()) -> None:
    """Serve until the client closes stdin. Nothing else may write to stdout: it carries the protocol."""
    build_server(index, allowed_paths).run("stdio")


def main(argv: list[str] | None = None) -> int:
    """`python -m skillrun.agent.mcp_server [--kb KB] [--allow PATH ...]` (what `skill-run mcp` runs)."""
    import argparse
    import sys

    from skillrun import api
    from skillrun.errors import SkillRunError

    ap = argparse.ArgumentParser(prog="skillrun-mcp", description=__doc__.splitlines()[0])
    ap.add_argument("--kb", help="knowledge base folder")
    ap.add_argument("--allow", action="append", default=[], help="file or folder the tools may read (repeatable)")
    ns = ap.parse_args(argv)
    try:
        serve_stdio(api.load_index(ns.kb), ns.allow)
    except SkillRunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
