"""The agent loop, driven by LangChain fake chat models that issue real tool calls."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("langchain_core")

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402

from kbfixture import make_kb  # noqa: E402
from skillrun.agent import SYSTEM_PROMPT, build_agent  # noqa: E402
from skillrun.kb.index import SkillIndex  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
H200_TRACE = "pytorch_kineto/nvidia_h200_fp8_scaled_mm_torch2.11.generated.json.gz"


class ToolCallingFake(FakeMessagesListChatModel):
    """The stock fake replays scripted AIMessages; this one also accepts bind_tools and records what it was sent."""

    bound: list = []
    seen: list = []

    def bind_tools(self, tools, **kw):
        self.bound = [t.name for t in tools]
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kw):
        self.seen.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kw)


class PolicyFake(ToolCallingFake):
    """A fake whose next message is computed from the conversation so far (like a model reading tool results)."""

    policy: Callable[[list], AIMessage]
    responses: list = []

    def _generate(self, messages, stop=None, run_manager=None, **kw):
        self.seen.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=self.policy(messages))])


def call(name: str, i: int, **args: Any) -> dict:
    return {"name": name, "args": args, "id": f"call_{i}", "type": "tool_call"}


def tool_results(messages) -> list[dict]:
    return [json.loads(m.content) for m in messages if isinstance(m, ToolMessage)]


# --------------------------------------------------------------------------- toy knowledge base
@pytest.fixture
def toy_index(tmp_path):
    return SkillIndex.load(make_kb(tmp_path / "kb"))


def test_loop_runs_scripted_tool_calls_and_feeds_results_back(toy_index):
    script = [
        AIMessage(content="", tool_calls=[call("list_skills", 1)]),
        AIMessage(content="", tool_calls=[call("show_skill", 2, skill_id="toy_blockscale"), call("read_fact", 3, fact_id="toy_hw")]),
        AIMessage(content="", tool_calls=[call("run_skill", 4, skill_id="toy_blockscale", shapes=["4096,2048,7168"])]),
        AIMessage(content="toy_blockscale picks narrow_n for 4096,2048,7168; nothing was measured here (no GPU)."),
    ]
    llm = ToolCallingFake(responses=script)
    agent = build_agent(llm, index=toy_index, max_iterations=6, gpu_probe=lambda: None)
    res = agent.invoke("What does toy_blockscale do for 4096,2048,7168?")

    assert llm.bound == ["list_skills", "show_skill", "read_fact", "analyze_profile", "run_skill", "check_skill", "read_validation",
                         "tune_skill", "ablate_skill"]
    assert res.stopped is False and res.iterations == 4
    assert res.answer.startswith("toy_blockscale picks narrow_n")
    assert [c["name"] for c in res.tool_calls] == ["list_skills", "show_skill", "read_fact", "run_skill"]
    listed, shown, fact, run = (c["result"] for c in res.tool_calls)
    assert listed["skills"][0]["id"] == "toy_blockscale"
    assert shown["front_matter"]["match"]["to_backend"] == "flydsl"
    assert fact["front_matter"]["data"]["cu_count"] == 256
    assert run["ok"] is False and "no GPU" in run["error"]
    # The model saw the system prompt first and every tool result, matched to its call id.
    first = llm.seen[0]
    assert first[0].content == SYSTEM_PROMPT and "Never claim a speedup" in SYSTEM_PROMPT
    last = llm.seen[-1]
    tms = [m for m in last if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in tms] == ["call_1", "call_2", "call_3", "call_4"]
    assert json.loads(tms[1].content)["id"] == "toy_blockscale"


def test_bad_calls_do_not_end_the_loop(toy_index):
    script = [
        AIMessage(content="", tool_calls=[call("rm_rf", 1, path="/")]),
        AIMessage(content="", tool_calls=[call("show_skill", 2, skill_id="typo_card")]),
        AIMessage(content="", tool_calls=[], invalid_tool_calls=[
            {"name": "analyze_profile", "args": "{path: oops", "id": "call_3", "error": "bad JSON", "type": "invalid_tool_call"}]),
        AIMessage(content="", tool_calls=[call("analyze_profile", 4, path="/etc/shadow")]),
        AIMessage(content="Could not analyse: the trace is outside the allowed paths."),
    ]
    agent = build_agent(ToolCallingFake(responses=script), index=toy_index)
    res = agent.invoke("go")
    assert res.stopped is False and res.answer.startswith("Could not analyse")
    errors = [c["result"] for c in res.tool_calls]
    assert all(r["ok"] is False for r in errors)
    assert "no tool named 'rm_rf'" in errors[0]["error"] and "analyze_profile" in errors[0]["hint"]
    assert "typo_card" in errors[1]["error"]
    assert "could not parse the arguments" in errors[2]["error"]
    assert "outside the paths" in errors[3]["error"]


def test_loop_stops_after_max_iterations(toy_index):
    llm = ToolCallingFake(responses=[AIMessage(content="", tool_calls=[call("list_skills", 1)])])
    res = build_agent(llm, index=toy_index, max_iterations=3).invoke("loop forever")
    assert res.stopped is True and res.iterations == 3 and len(res.tool_calls) == 3
    assert "Stopped after 3 model turns" in res.answer


def test_model_without_bind_tools_is_rejected(toy_index):
    with pytest.raises(TypeError, match="bind_tools"):
        build_agent(object(), index=toy_index)


# --------------------------------------------------------------------------- real trace, real knowledge base
def _traces() -> Path | None:
    env = os.environ.get("SKILLRUN_TRACES")
    p = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "traces"
    return p if p.is_dir() else None


@pytest.fixture
def real_kb(tmp_path):
    """A copy of the checkout's knowledge base, so that the agent's writes land in tmp, not in validation/."""
    root = tmp_path / "kb"
    for sub in ("skills", "facts", "schemas"):
        shutil.copytree(REPO / sub, root / sub)
    return SkillIndex.load(root)


def _evidence_policy(trace: Path):
    """Reads each tool result and picks the next call: analyse → show matched skill → FlyDSL check → read validation."""

    def policy(messages) -> AIMessage:
        results = tool_results(messages)
        n = len(results)
        if n == 0:
            return AIMessage(content="", tool_calls=[call("analyze_profile", 1, path=str(trace), top=10)])
        if not results[0].get("ok"):
            return AIMessage(content=f"The analysis failed: {results[0].get('error')}")
        if n == 1:
            matches = results[0].get("matches") or []
            if not matches:
                return AIMessage(content="", tool_calls=[call("list_skills", 2)])
            return AIMessage(content="", tool_calls=[call("show_skill", 2, skill_id=matches[0]["skill_id"])])
        if n == 2:
            return AIMessage(content="", tool_calls=[call("list_skills", 3, to_backend="flydsl")])
        if n == 3:
            flydsl = [s["id"] for s in results[2].get("skills", [])]
            if flydsl:
                return AIMessage(content="", tool_calls=[call("check_skill", 4, skill_id=flydsl[0], write=False)])
            return AIMessage(content="", tool_calls=[call("read_validation", 4)])
        if n == 4 and "check_skill" in {m.name for m in messages if isinstance(m, ToolMessage)}:
            return AIMessage(content="", tool_calls=[call("read_validation", 5)])
        analysis = results[0]
        matched = [m["skill_id"] for m in analysis.get("matches", [])]
        top = analysis["hot_kernels"][0]
        return AIMessage(content=f"Hottest kernel {top['kernel'][:40]} at {top['pct_gpu']}% GPU; matched cards: {matched or 'none'}. "
                                 "No speedup was measured in this session.")

    return policy


def test_full_loop_on_the_h200_trace(real_kb):
    traces = _traces()
    if traces is None or not (traces / H200_TRACE).is_file():
        pytest.skip("../shared/traces (or $SKILLRUN_TRACES) with the H200 trace is not present")
    try:
        from skillrun.ingest import ingest  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"skillrun.ingest is not usable in this checkout yet (written by another helper): {exc}")
    trace = traces / H200_TRACE
    llm = PolicyFake(policy=_evidence_policy(trace))
    agent = build_agent(llm, index=real_kb, allowed_paths=[trace], max_iterations=8, gpu_probe=lambda: None)
    res = agent.invoke("Which hot kernels of this H200 trace can a skill card speed up?")

    assert res.stopped is False
    names = [c["name"] for c in res.tool_calls]
    assert names[0] == "analyze_profile"
    analysis = res.tool_calls[0]["result"]
    assert analysis["ok"] is True, analysis
    assert analysis["profile"]["arch"] == "sm_90"
    # A result cut to fit the model's budget ends its lists with a "… N more items" marker.
    hot = [k for k in analysis["hot_kernels"] if isinstance(k, dict)]
    assert any(k["kernel"].startswith("nvjet_sm90_qqtst") for k in hot)
    shapes = [o["shape"] for k in hot for o in k["ops"] if o["op"] == "aten::_scaled_mm"]
    assert {"M": 2048, "N": 7168, "K": 4096} in [{d: s[d] for d in ("M", "N", "K")} for s in shapes if s]
    assert all(k["pct_gpu"] <= 100 for k in hot) and hot == sorted(hot, key=lambda k: -k["pct_gpu"])
    if analysis.get("full_result"):
        assert (real_kb.root / analysis["full_result"]).is_file()

    if analysis["matches"]:
        shown = res.tool_calls[1]["result"]
        assert shown["ok"] and shown["id"] == analysis["matches"][0]["skill_id"]
        assert "sm_90" in shown["front_matter"]["match"]["gens"]
    if "check_skill" in names:
        check = res.tool_calls[names.index("check_skill")]["result"]
        try:
            from skillrun.check import check_skill  # noqa: F401
        except ImportError:
            # Until the compile-check module lands, the tool answers with a readable error naming it.
            assert check["ok"] is False and "skillrun.check" in check["error"]
        else:
            assert check["ok"] is True and check["kind"].startswith("compile_only") and isinstance(check["passed"], bool)
    assert "read_validation" in names
    assert res.answer.startswith("Hottest kernel nvjet_sm90") or res.answer.startswith(f"Hottest kernel {hot[0]['kernel'][:40]}")
    assert "No speedup was measured" in res.answer
