"""`skill-run agent` / `skill-run mcp` commands and chat-model resolution."""
from __future__ import annotations

import importlib.util
import json

import pytest
import typer
from typer.testing import CliRunner

pytest.importorskip("langchain_core")

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel  # noqa: E402
from langchain_core.messages import AIMessage  # noqa: E402

from kbfixture import make_kb  # noqa: E402
from skillrun.agent import llm as llm_mod  # noqa: E402
from skillrun.cli import agent as agent_cli  # noqa: E402
from skillrun.cli.common import attach  # noqa: E402
from skillrun.errors import EXIT_UNAVAILABLE, UnavailableError  # noqa: E402


@pytest.fixture
def app(tmp_path, monkeypatch):
    monkeypatch.setenv("SKILLRUN_KB", str(make_kb(tmp_path / "kb")))
    for var in ("SKILLRUN_AGENT_MODEL", "SKILLRUN_AGENT_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    a = typer.Typer()

    @a.callback()
    def _root():  # a group, as in skill-run, so that `agent` is a sub-command
        pass

    attach(a, agent_cli.COMMANDS)
    return a


def test_agent_without_a_model_says_what_to_set_and_exits_5(app):
    r = CliRunner().invoke(app, ["agent", "which kernels?"])
    assert r.exit_code == EXIT_UNAVAILABLE
    text = " ".join(r.output.split())
    assert "no chat model is configured" in text and "--model" in text and "SKILLRUN_AGENT_BASE_URL" in text


@pytest.mark.skipif(importlib.util.find_spec("langchain_ollama") is not None, reason="langchain-ollama is installed here")
def test_agent_with_a_missing_integration_says_what_to_install(app):
    r = CliRunner().invoke(app, ["agent", "q", "--model", "ollama:llama3"])
    assert r.exit_code == EXIT_UNAVAILABLE and "pip install langchain-ollama" in " ".join(r.output.split())


def test_model_specs():
    assert llm_mod.parse_model_spec("openai:gpt-4o") == ("openai", "gpt-4o")
    assert llm_mod.parse_model_spec("ollama:llama3:8b") == ("ollama", "llama3:8b")
    assert llm_mod.parse_model_spec("qwen2.5:7b") == ("openai-compatible", "qwen2.5:7b")
    with pytest.raises(UnavailableError, match="no chat model is configured"):
        llm_mod.make_chat_model(None, env={})
    if importlib.util.find_spec("langchain_openai") is None:
        with pytest.raises(UnavailableError, match="langchain-openai"):
            llm_mod.make_chat_model(None, env={"SKILLRUN_AGENT_MODEL": "m", "SKILLRUN_AGENT_BASE_URL": "http://localhost:8000/v1"})
    else:
        with pytest.raises(UnavailableError, match="SKILLRUN_AGENT_BASE_URL"):
            llm_mod.make_chat_model("bare-model", env={})
        with pytest.raises(UnavailableError, match="OPENAI_API_KEY"):
            llm_mod.make_chat_model("openai:gpt-4o", env={})


class _Fake(FakeMessagesListChatModel):
    def bind_tools(self, tools, **kw):
        return self


def test_agent_command_runs_the_loop_with_the_configured_model(app, tmp_path, monkeypatch):
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    script = [AIMessage(content="", tool_calls=[{"name": "show_skill", "args": {"skill_id": "toy_blockscale"}, "id": "c1", "type": "tool_call"},
                                                {"name": "read_validation", "args": {"path": str(trace)}, "id": "c2", "type": "tool_call"}]),
              AIMessage(content="toy_blockscale: no validation artifact yet, so no measured speedup.")]
    asked = {}
    monkeypatch.setattr(llm_mod, "make_chat_model", lambda spec: asked.setdefault("spec", spec) and _Fake(responses=script))
    r = CliRunner().invoke(app, ["agent", "status of toy_blockscale?", "--model", "ollama:x", "--profile", str(trace), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert asked["spec"] == "ollama:x"
    assert out["answer"].startswith("toy_blockscale: no validation artifact yet")
    assert [c["name"] for c in out["tool_calls"]] == ["show_skill", "read_validation"]
    assert out["tool_calls"][0]["result"]["id"] == "toy_blockscale"
    # --profile put the trace on the allow-list: reading it is permitted (it is not an artifact, which the tool says).
    assert "not a validation artifact" in out["tool_calls"][1]["result"]["error"]
