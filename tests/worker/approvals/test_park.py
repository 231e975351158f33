"""Approvals in the turn pipeline: a call that needs a person parks the turn (no worker held),
the question goes to the conversation's chat, and the answer (approve, deny, no answer in
time, /stop) resumes it exactly once, on whichever worker takes it.

TurnRunner runs in this process on a real Redis with a model that follows a script; the
channel is a recorder standing in for the platform adapter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.approvals import store as approvals
from fermix_shared.messages import ToolCall
from fermix_shared.models import ConversationKey, InboundMessage, RunStatus
from fermix_shared.settings import Settings
from fermix_shared.stores import queue, runs
from fermix_worker.approvals.policy import ApprovalPolicy, question, settle_approvals
from fermix_worker.loop import denied_message
from fermix_worker.providers.base import ModelTurn
from fermix_worker.tools import RunContext, Tool, ToolRegistry
from fermix_worker.tools.builtin import CALCULATOR
from fermix_worker.turn import Delivered, Fenced, Parked, Stopped, TurnRunner
from tests.fleet import uniq
from tests.worker.turn.test_runner import Model, say


class Chat:
    """The platform side: what was asked and said in the chat."""

    name = "telegram"

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.said: list[str] = []

    def send_text(self, key: ConversationKey, text: str, *, delivery_id: str) -> None:
        self.said.append(text)

    def send_approval(self, key: ConversationKey, approval_id: str, text: str, *,
                      delivery_id: str) -> None:
        self.asked.append((approval_id, text))

    @contextmanager
    def working(self, key: ConversationKey, message_id: str | None = None) -> Iterator[None]:
        yield


class Shell:
    def __init__(self) -> None:
        self.ran: list[str] = []

    def __call__(self, ctx: RunContext, args: dict[str, Any]) -> str:
        self.ran.append(str(args.get("cmd")))
        return "exit 0"


def calls_shell(cmd: str = "rm -rf build") -> Any:
    return lambda request: ModelTurn("", [ToolCall(id="sh1", name="shell", arguments={"cmd": cmd})])


@pytest.fixture
def chat() -> Chat:
    return Chat()


def runner_for(r: redis.Redis, model: Model, chat: Chat, shell: Shell, **settings: Any
               ) -> TurnRunner:
    s = Settings(redis_url="redis://unused", provider="openai", model="m", **settings)
    tool = Tool("shell", "Run a command.", {"type": "object", "properties": {}}, shell,
                policy="exec", idempotent=False)
    return TurnRunner(r, s, ToolRegistry([tool, CALCULATOR]), router=lambda: model,  # type: ignore[arg-type, return-value]
                      channels=lambda name: chat if name == "telegram" else None)  # type: ignore[arg-type, return-value]


def start(r: redis.Redis, runner: TurnRunner, channel: str = "telegram"
          ) -> tuple[InboundMessage, Any]:
    msg = InboundMessage(key=ConversationKey(channel=channel, chat_id=uniq("c")),  # type: ignore[arg-type]
                         text="clean up", trust="operator", sender_id="42")
    queue.accept(r, msg)
    claimed, lease = queue.claim(r, msg.key.as_str(), "w:1", 30)
    assert lease is not None
    return msg, runner.run(claimed.messages, lease)


def pending(r: redis.Redis) -> approvals.Approval:
    ids = r.zrange(keys.approvals_pending(), 0, -1)
    assert len(ids) == 1, ids
    found = approvals.get(r, str(ids[0]))
    assert found is not None
    return found


def test_an_exec_call_parks_the_turn_and_asks_in_the_chat(r: redis.Redis, chat: Chat) -> None:
    r.delete(keys.approvals_pending())
    shell = Shell()
    runner = runner_for(r, Model(calls_shell(), say("Cleaned.")), chat, shell)
    msg, outcome = start(r, runner)
    assert outcome == Parked()
    assert shell.ran == []  # nothing ran before the answer
    ask = pending(r)
    assert (ask.request.run_id, ask.request.tool, ask.request.arguments) == (
        msg.run_id, "shell", {"cmd": "rm -rf build"})
    assert ask.request.expires_at - ask.request.requested_at == pytest.approx(600, abs=1)
    assert chat.asked == [(ask.approval_id, question(ask.request))]
    assert f"/approve {ask.approval_id}" in chat.asked[0][1]
    active = r.hgetall(keys.active(msg.key.as_str()))
    assert active["worker"] == f"parked:{msg.run_id}"  # the worker slot is free

    assert approvals.decide(r, ask.approval_id, "approved", "telegram:42") == "decided"
    assert runner.resume_approval(ask.approval_id, "w:2") == Delivered(waiting=0)
    assert shell.ran == ["rm -rf build"]
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.ok and rec.reply == "Cleaned."
    assert chat.said == ["Cleaned."]
    # Once: the same answer again (a resent task) finds nothing to resume.
    assert runner.resume_approval(ask.approval_id, "w:3") == Fenced()
    assert shell.ran == ["rm -rf build"] and chat.said == ["Cleaned."]
    assert approvals.unresumed(r, 0, time.time() + 1) == []


def test_a_denied_call_does_not_run_and_the_model_is_told_why(r: redis.Redis, chat: Chat) -> None:
    r.delete(keys.approvals_pending())
    shell = Shell()
    model = Model(calls_shell(), say("I did not delete anything."))
    runner = runner_for(r, model, chat, shell)
    msg, _ = start(r, runner)
    ask = pending(r)
    assert approvals.decide(r, ask.approval_id, "denied", "telegram:42", "not today") == "decided"
    assert approvals.decide(r, ask.approval_id, "approved", "telegram:42") == "already"
    assert runner.resume_approval(ask.approval_id, "w:2") == Delivered(waiting=0)
    assert shell.ran == []
    told = model.requests[-1].messages[-1]
    assert told.role == "tool" and told.content == denied_message(
        "denied: denied by telegram:42: not today")
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.reply == "I did not delete anything."


def test_no_answer_in_time_denies_and_resumes(r: redis.Redis, chat: Chat) -> None:
    r.delete(keys.approvals_pending())
    shell = Shell()
    model = Model(calls_shell(), say("Nobody answered, so I left it."))
    runner = runner_for(r, model, chat, shell, approvals={"timeout_seconds": 60})
    msg, _ = start(r, runner)
    ask = pending(r)
    assert settle_approvals(r, lambda approval_id: None, now=time.time() + 59) == []  # not yet
    resumed: list[str] = []
    assert settle_approvals(r, resumed.append, now=time.time() + 61) == [ask.approval_id]
    assert approvals.get(r, ask.approval_id).status == "expired"  # type: ignore[union-attr]
    assert runner.resume_approval(resumed[0], "w:2") == Delivered(waiting=0)
    assert shell.ran == []
    assert "no answer came in time" in model.requests[-1].messages[-1].content
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.reply == "Nobody answered, so I left it."


def test_an_answer_whose_resume_was_lost_is_resumed_by_the_reaper(
    r: redis.Redis, chat: Chat
) -> None:
    r.delete(keys.approvals_pending(), keys.approvals_deciding())
    runner = runner_for(r, Model(calls_shell(), say("done")), chat, Shell())
    start(r, runner)
    ask = pending(r)
    approvals.decide(r, ask.approval_id, "approved", "http:api")  # ...and the task is lost
    assert approvals.unresumed(r, 30, time.time()) == []
    assert approvals.unresumed(r, 30, time.time() + 31) == [ask.approval_id]


def test_stop_cancels_a_parked_turn_at_once(r: redis.Redis, chat: Chat) -> None:
    from fermix_gateway.commands import stop

    r.delete(keys.approvals_pending())
    shell = Shell()
    runner = runner_for(r, Model(calls_shell()), chat, shell)
    msg, _ = start(r, runner)
    ask = pending(r)
    sent: list[tuple[str, list[str]]] = []

    async def send(name: str, args: list[str]) -> None:
        sent.append((name, args))

    async def slash_stop() -> str:
        client = aioredis.Redis(connection_pool=aioredis.ConnectionPool(
            **r.connection_pool.connection_kwargs))
        try:
            return await stop(client, msg.key, send=send, by="telegram:42")
        finally:
            await client.aclose()

    assert asyncio.run(slash_stop()) == "Stopped the current request and cleared 0 queued messages."
    assert sent == [("fermix.approvals.resume", [ask.approval_id])]
    assert approvals.get(r, ask.approval_id).status == "cancelled"  # type: ignore[union-attr]
    assert runner.resume_approval(ask.approval_id, "w:2") == Stopped(waiting=0)
    assert shell.ran == []
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.stopped


def test_an_http_conversation_is_asked_through_the_api_only(r: redis.Redis, chat: Chat) -> None:
    r.delete(keys.approvals_pending())
    runner = runner_for(r, Model(calls_shell()), chat, Shell())
    _, outcome = start(r, runner, channel="http")
    assert outcome == Parked()
    assert pending(r).request.ask_in is None and chat.asked == []


def test_which_calls_need_approval() -> None:
    from fermix_shared.settings import ApprovalsConfig
    from fermix_worker.subagents.tool import SUBAGENTS_TOOL

    shell = Tool("shell", "", {}, lambda ctx, a: "", policy="exec")
    default = ApprovalPolicy(ApprovalsConfig())
    assert default.needs(shell) and not default.needs(CALCULATOR)
    assert not default.needs(SUBAGENTS_TOOL)  # a fan-out never waits (its subagents can't)
    named = ApprovalPolicy(ApprovalsConfig(policies=[], tools=["calculator"]))
    assert named.needs(CALCULATOR) and not named.needs(shell)
