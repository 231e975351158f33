"""A killed agent's messages through TurnRunner: each is refused with a clear reply, sent once
into its chat, never answered by a model and never taken into history, audited as a failed
check; a turn the kill caught as it started is stopped and its chat told; another agent in the
same conversation runs on (and begins the conversation's session, which the refused messages
did not), and so does the agent once its definition is re-created.

TurnRunner runs in this process on the scratch Redis over the real SDK adapter talking to the
scripted LLM server; the chat is a recording channel (tests/worker/test_kill_fleet.py stops
turns on real workers)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_shared import keys
from fermix_shared.agents import lifecycle
from fermix_shared.agents.definitions import AgentDefinition
from fermix_shared.audit import AuditLog
from fermix_shared.models import ConversationKey, InboundMessage, RunStatus
from fermix_shared.settings import Settings
from fermix_shared.stores import history, queue, runs
from fermix_worker.providers import build_router
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry
from fermix_worker.turn import TurnRunner
from fermix_worker.turn.outcome import Delivered, Stopped
from tests.conftest import provider_env
from tests.fleet import turn_calls, uniq
from tests.seed_text import quoted
from tests.worker.usage.test_budget import Chat

OPS = AgentDefinition(name="ops", system_prompt="You are Ops.")


@pytest.fixture(autouse=True)
def sdk_env(llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in provider_env(llm, "openai").items():
        if not name.startswith("FERMIX_"):
            monkeypatch.setenv(name, value)


def runner(r: redis.Redis, chat: Chat, agents: list[AgentDefinition]) -> TurnRunner:
    s = Settings(redis_url="redis://unused", provider="openai", model="scripted-openai",
                 agents=agents, cancel_poll_seconds=0.05)
    return TurnRunner(r, s, ToolRegistry(BUILTIN_TOOLS), router=lambda: build_router(s),
                      channels=lambda name: chat if name == "telegram" else None)  # type: ignore[arg-type, return-value]


def kill(url: str, definition: AgentDefinition) -> lifecycle.Killed:
    async def go() -> lifecycle.Killed:
        client = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            return await lifecycle.kill_async(client, definition, 1_700_000_000_000)
        finally:
            await client.aclose()
    return asyncio.run(go())


def send(r: redis.Redis, key: ConversationKey, text: str, agent: str) -> InboundMessage:
    msg = InboundMessage(key=key, text=text, agent=agent, sender_id="42", trust="operator")
    assert queue.accept(r, msg).new
    return msg


def run_next(r: redis.Redis, turns: TurnRunner, key: ConversationKey) -> Any:
    claim, lease = queue.claim(r, key.as_str(), "w:1", 30)
    assert lease is not None
    return turns.run(claim.messages, lease)


def model_calls(llm: ScriptedLLMServer, text: str) -> list[dict[str, Any]]:
    return [q for q in turn_calls(llm.script.requests) if text in json.dumps(q["body"])]


def test_a_killed_agents_messages_are_refused_once_and_another_agent_runs_on(
    r: redis.Redis, scratch_redis_url: str, llm: ScriptedLLMServer
) -> None:
    chat, key = Chat(), ConversationKey(channel="telegram", chat_id=uniq("c"))
    first, second = uniq("to ops"), uniq("to ops again")
    other = uniq("to default")
    llm.script.push(Reply(text="ops would answer", match=first),
                    Reply(text="default answers", match=other))
    turns = runner(r, chat, [OPS])
    refused = [send(r, key, first, "ops"), send(r, key, second, "ops")]
    kept = send(r, key, other, "default")
    kill(scratch_redis_url, OPS)

    assert run_next(r, turns, key) == Delivered(waiting=2)
    assert run_next(r, turns, key) == Delivered(waiting=1)
    reply = lifecycle.KILLED_REPLY.format(agent="ops")
    assert quoted("O", "Permanently stopped").lower() in reply.lower()
    for msg in refused:
        rec = runs.get(r, msg.run_id)
        assert rec is not None and (rec.status, rec.error) == (RunStatus.error, reply)
    # Said once per message, in its chat; no model was asked; nothing entered history.
    assert [text for _, text in chat.sent] == [reply, reply]
    assert len({delivery for delivery, _ in chat.sent}) == 2
    assert model_calls(llm, first) == [] and model_calls(llm, second) == []
    assert history.load(r, key.as_str(), 100) == []
    # Refused before they started: no session was begun (the next message that runs begins it,
    # and its session_start hook fires then).
    assert not r.exists(keys.session(key.as_str()))
    checks = [e for e in AuditLog(r).recent(limit=50) if e.action == "agent.killed"]
    assert sorted(e.run for e in checks) == sorted(m.run_id for m in refused)
    assert {(e.kind, e.outcome, e.agent, e.actor) for e in checks} == {
        ("check", "fail", "ops", "telegram:42")}

    # The conversation's next message is another agent's: it runs as usual.
    assert run_next(r, turns, key) == Delivered(waiting=0)
    rec = runs.get(r, kept.run_id)
    assert rec is not None and (rec.status, rec.reply) == (RunStatus.ok, "default answers")
    assert chat.sent[-1][1] == "default answers"
    assert r.get(keys.session(key.as_str())).startswith("ses_")


def test_a_turn_the_kill_caught_as_it_started_is_stopped_and_its_chat_told(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    chat, key = Chat(), ConversationKey(channel="telegram", chat_id=uniq("c"))
    msg = send(r, key, uniq("caught"), "ops")
    claim, lease = queue.claim(r, key.as_str(), "w:1", 30)
    assert lease is not None
    assert kill(scratch_redis_url, OPS).stopped == [key.as_str()]
    assert runner(r, chat, [OPS]).run(claim.messages, lease) == Stopped(waiting=0)
    notice = lifecycle.KILLED_NOTICE.format(agent="ops")
    rec = runs.get(r, msg.run_id)
    assert rec is not None and (rec.status, rec.error) == (RunStatus.stopped, notice)
    assert [text for _, text in chat.sent] == [notice]
    assert not r.exists(keys.active(key.as_str()))


def test_a_re_created_agent_answers_again(r: redis.Redis, scratch_redis_url: str,
                                          llm: ScriptedLLMServer) -> None:
    kill(scratch_redis_url, OPS)
    chat, key = Chat(), ConversationKey(channel="telegram", chat_id=uniq("c"))
    text = uniq("after re-creation")
    llm.script.push(Reply(text="the new ops answers", match=text))
    reborn = OPS.model_copy(update={"system_prompt": "You are Ops, again."})
    msg = send(r, key, text, "ops")
    assert run_next(r, runner(r, chat, [reborn]), key) == Delivered(waiting=0)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and (rec.status, rec.reply) == (RunStatus.ok, "the new ops answers")
    (call,) = model_calls(llm, text)
    assert call["body"]["messages"][0]["content"].startswith("You are Ops, again.")
