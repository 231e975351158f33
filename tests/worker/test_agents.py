"""A turn runs as its agent: the agent's system prompt, provider and model, temperature, tool
list, policy classes, trust and iteration bound reach the model call, and the agent is part of
the turn's checkpoint.

TurnRunner runs in this process on a real Redis, over the real SDK adapters talking to the
scripted LLM server; its request log shows what each call carried."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared.memory import MemoryStore
from fermix_shared.models import ConversationKey, InboundMessage, RunRecord, Trust
from fermix_shared.settings import Settings
from fermix_shared.stores import queue, runs
from fermix_worker.loop import ITERATION_CAP_MESSAGE
from fermix_worker.providers import build_router
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry
from fermix_worker.tools.memory import memory_tools
from fermix_worker.turn import TurnRunner
from fermix_worker.turn.checkpoints import Checkpoints
from tests.conftest import provider_env
from tests.fleet import uniq


@pytest.fixture(autouse=True)
def sdk_env(llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in provider_env(llm, "openai").items():
        if not name.startswith("FERMIX_"):
            monkeypatch.setenv(name, value)


def agents_settings(*agents: dict[str, Any]) -> Settings:
    return Settings(redis_url="redis://unused", provider="openai", model="scripted-openai",
                    system_prompt="You are the default agent.", agents=list(agents))


def run_as(r: redis.Redis, settings: Settings, agent: str, text: str,
           trust: Trust = "operator") -> RunRecord:
    tools = ToolRegistry([*BUILTIN_TOOLS, *memory_tools(lambda: MemoryStore(r))])
    runner = TurnRunner(r, settings, tools, router=lambda: build_router(settings))
    msg = InboundMessage(key=ConversationKey(channel="http", chat_id=uniq("chat")), text=text,
                         trust=trust, agent=agent)
    queue.accept(r, msg)
    claim, lease = queue.claim(r, msg.key.as_str(), "w:1", 30)
    assert lease is not None
    runner.run(claim.messages, lease)
    rec = runs.get(r, msg.run_id)
    assert rec is not None
    return rec


def sent(llm: ScriptedLLMServer, text: str) -> list[dict[str, Any]]:
    return [q for q in llm.script.requests if text in str(q["body"]["messages"])]


def tool_names(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request["body"].get("tools", [])}


def system_text(request: dict[str, Any]) -> str:
    return str(request["body"]["messages"][0]["content"])


def test_the_agent_s_prompt_model_and_temperature_reach_the_model(
    r: redis.Redis, llm: ScriptedLLMServer
) -> None:
    settings = agents_settings({"name": "coder", "system_prompt": "You write Python.",
                                "model": "coder-model", "temperature": 0.2})
    text = uniq("code")
    llm.script.push(Reply(text="def f(): ...", match=text))
    rec = run_as(r, settings, "coder", text)
    assert rec.reply == "def f(): ..."
    (call,) = sent(llm, text)
    assert call["body"]["model"] == "coder-model"
    assert call["body"]["temperature"] == 0.2
    assert system_text(call).startswith("You write Python.")
    assert "default agent" not in system_text(call)
    state = Checkpoints(r).load(rec.run_id)
    assert state is not None and (state.agent, state.temperature) == ("coder", 0.2)

    other = uniq("plain")
    llm.script.push(Reply(text="hi", match=other))
    run_as(r, settings, "default", other)
    (plain,) = sent(llm, other)
    assert plain["body"]["model"] == "scripted-openai"
    assert "temperature" not in plain["body"]
    assert system_text(plain).startswith("You are the default agent.")


def test_an_agent_on_another_provider_talks_to_that_provider(
    r: redis.Redis, llm: ScriptedLLMServer
) -> None:
    settings = agents_settings({"name": "writer", "provider": "anthropic",
                                "model": "claude-writer", "temperature": 1.5})
    text = uniq("write")
    llm.script.push(Reply(text="prose", match=text))
    assert run_as(r, settings, "writer", text).reply == "prose"
    (call,) = sent(llm, text)
    assert (call["provider"], call["body"]["model"]) == ("anthropic", "claude-writer")
    # The Messages API (anthropic SDK 2.x) takes no temperature; the call must not fail on it.
    assert "temperature" not in call["body"]


def test_allowed_tools_none_empty_and_a_list(r: redis.Redis, llm: ScriptedLLMServer) -> None:
    settings = agents_settings({"name": "bare", "allowed_tools": []},
                               {"name": "clock", "allowed_tools": ["current_time"]})
    seen = {}
    for agent in ("default", "bare", "clock"):
        text = uniq(agent)
        llm.script.push(Reply(text="ok", match=text))
        run_as(r, settings, agent, text)
        (call,) = sent(llm, text)
        seen[agent] = tool_names(call)
    assert {"current_time", "calculator", "memory_store"} <= seen["default"]
    assert seen["bare"] == set()
    assert seen["clock"] == {"current_time"}


def test_a_guest_agent_runs_an_operator_s_message_as_a_guest(
    r: redis.Redis, llm: ScriptedLLMServer
) -> None:
    MemoryStore(r).add("The launch code is 0000.", source="test")
    settings = agents_settings({"name": "frontdesk", "trust": "guest"})
    text = uniq("guest")
    llm.script.push(Reply(tool_calls=[ToolCallSpec("memory_store", {"text": "x"})], match=text),
                    Reply(text="done", match=text))
    rec = run_as(r, settings, "frontdesk", text, trust="operator")
    first, second = sent(llm, text)
    assert "launch code" not in system_text(first)  # the operator's memory stays out
    assert "memory_store" not in tool_names(first)  # read_write is beyond a guest
    tool_result = second["body"]["messages"][-1]["content"]
    assert "not available here" in tool_result
    assert rec.reply == "done"


def test_policy_classes_narrow_what_an_operator_agent_may_use(
    r: redis.Redis, llm: ScriptedLLMServer
) -> None:
    settings = agents_settings({"name": "reader", "policy": ["read_only"]})
    text = uniq("reader")
    llm.script.push(Reply(text="ok", match=text))
    run_as(r, settings, "reader", text)
    (call,) = sent(llm, text)
    names = tool_names(call)
    assert "current_time" in names and "memory_recall" in names
    assert "memory_store" not in names and "http_fetch" not in names


def test_an_agent_s_max_iterations_bounds_its_turn(r: redis.Redis, llm: ScriptedLLMServer) -> None:
    settings = agents_settings({"name": "brief", "max_iterations": 2})
    text = uniq("loop")
    llm.script.push(*(Reply(tool_calls=[ToolCallSpec("current_time", {})], match=text)
                      for _ in range(2)))
    rec = run_as(r, settings, "brief", text)
    assert rec.status.value == "error" and rec.error == ITERATION_CAP_MESSAGE
    assert len(sent(llm, text)) == 2
