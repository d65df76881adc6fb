"""The MCP server, started over stdio as a subprocess and driven by the official MCP client."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")
anyio = pytest.importorskip("anyio")

from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

from kbfixture import make_kb  # noqa: E402

H200_TRACE = "pytorch_kineto/nvidia_h200_fp8_scaled_mm_torch2.11.generated.json.gz"


def _traces() -> Path | None:
    env = os.environ.get("SKILLRUN_TRACES")
    p = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "traces"
    return p if p.is_dir() else None


def _text(result) -> dict:
    assert result.content and result.content[0].type == "text"
    return json.loads(result.content[0].text)


def _is_error(result) -> bool:
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", None))


def _run_session(kb: Path, allow: list[Path], calls: list[tuple[str, dict]], cwd: Path) -> tuple[dict, list]:
    """Start `python -m skillrun.agent.mcp_server` over stdio, list its tools, make the calls in order."""
    args = ["-m", "skillrun.agent.mcp_server", "--kb", str(kb)] + [a for p in allow for a in ("--allow", str(p))]
    # The SDK passes the server only a few safe variables; PYTHONPATH too, so the server under test
    # is this checkout's code and not whatever copy the interpreter has installed.
    env = {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "SKILLRUN_TRACES", "PATH", "HOME")}
    params = StdioServerParameters(command=sys.executable, args=args, cwd=str(cwd), env=env)
    out: dict = {"results": []}

    async def session():
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write) as s:
                    out["init"] = await s.initialize()
                    out["tools"] = {t.name: t for t in (await s.list_tools()).tools}
                    for name, arguments in calls:
                        out["results"].append(await s.call_tool(name, arguments))

    anyio.run(session)
    _run_session.last_init = out.get("init")
    return out["tools"], out["results"]


def test_mcp_stdio_lists_tools_and_returns_readable_errors(tmp_path):
    kb = make_kb(tmp_path / "kb")
    outside = tmp_path / "not_allowed.json"
    outside.write_text("{}")
    tools, (listed, refused, bad_shape, unknown) = _run_session(kb, [], [
        ("list_skills", {}),
        ("analyze_profile", {"path": str(outside)}),
        ("analyze_profile", {"path": str(outside), "shapes": ["M by N"]}),
        ("show_skill", {"skill_id": "nope"}),
    ], tmp_path)

    assert set(tools) == {"list_skills", "show_skill", "read_fact", "analyze_profile", "run_skill", "check_skill", "read_validation",
                          "tune_skill", "ablate_skill"}
    from skillrun import __version__

    init = _run_session.last_init
    info = getattr(init, "server_info", None) or init.serverInfo
    assert info.name == "skillrun" and info.version == __version__ != ""
    schema = getattr(tools["analyze_profile"], "input_schema", None) or tools["analyze_profile"].inputSchema
    assert schema["required"] == ["path"] and schema["properties"]["top"]["maximum"] == 50
    assert "compile" in tools["check_skill"].description.lower()

    assert not _is_error(listed) and [s["id"] for s in _text(listed)["skills"]] == ["toy_blockscale"]
    r = _text(refused)
    assert _is_error(refused) and r["ok"] is False and "outside the paths" in r["error"]
    r = _text(bad_shape)
    assert _is_error(bad_shape) and "'M by N'" in r["error"]
    r = _text(unknown)
    assert _is_error(unknown) and "unknown skill 'nope'" in r["error"] and "toy_blockscale" in r["hint"]


def test_mcp_analyze_profile_on_the_h200_trace(tmp_path):
    traces = _traces()
    if traces is None or not (traces / H200_TRACE).is_file():
        pytest.skip("../shared/traces (or $SKILLRUN_TRACES) with the H200 trace is not present")
    trace = traces / H200_TRACE
    kb = make_kb(tmp_path / "kb")
    _, (res,) = _run_session(kb, [trace], [("analyze_profile", {"path": str(trace), "top": 5})], tmp_path)
    data = _text(res)
    try:
        from skillrun.ingest import ingest  # noqa: F401
    except ImportError:
        # Until ingestion lands, the tool must still answer with a readable error, not crash the server.
        assert _is_error(res) and data["ok"] is False and "skillrun.ingest" in data["error"]
        pytest.skip("skillrun.ingest not usable yet (another helper's module): got its readable error instead")
    assert data["ok"] is True and not _is_error(res), data
    assert data["profile"]["arch"] == "sm_90" and 1 <= len(data["hot_kernels"]) <= 5
    assert any("nvjet_sm90" in k["kernel"] for k in data["hot_kernels"])
