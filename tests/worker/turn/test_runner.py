"""The turn's branches, directly: TurnRunner in this process on a real (private) Redis, with a
scripted in-process model. Each test ends in one of the closed set of turn outcomes."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.errors import ProviderContextOverflow, ProviderUnavailable
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import ConversationKey, InboundMessage, RunProfile, RunStatus
from fermix_shared.settings import Settings
from fermix_shared.skills import SkillRegistry
from fermix_shared.stores import history, queue, runs
from fermix_shared.stores.lease import TurnLease
from fermix_worker.compaction import CHECKPOINT_PREFIX, OVERFLOW_MESSAGE
from fermix_worker.providers.base import ModelRequest, ModelTurn, Resending
from fermix_worker.subagents.contract import FanOutRequest
from fermix_worker.subagents.tool import SUBAGENTS_TOOL
from fermix_worker.tools import ToolRegistry
from fermix_worker.tools.base import ToolResult
from fermix_worker.tools.context import AuditRecorder
from fermix_worker.turn import STOPPED_MARKER, Delivered, Fenced, Parked, Stopped, TurnRunner
from fermix_worker.turn.close import FAILED_MARKER
from fermix_worker.turn.outcome import TurnOutcome
from tests.fleet import uniq
from tests.seed_text import quoted

Step = Callable[[ModelRequest], ModelTurn]


class Model(Resending):
    """A router whose every call answers from ``steps`` (in order)."""

    def __init__(self, *steps: Step):
        self.steps = list(steps)
        self.requests: list[ModelRequest] = []

    def for_turn(self, **_: Any) -> Model:
        return self

    def complete(self, request: ModelRequest, on_delta: Callable[[str], None], *,
                 initial: bool = False) -> ModelTurn:
        self.requests.append(dataclasses.replace(request, messages=list(request.messages)))
        return self.steps.pop(0)(request)


def say(text: str) -> Step:
    return lambda request: ModelTurn(content=text, tool_calls=[], input_tokens=10)


def overflow(request: ModelRequest) -> ModelTurn:
    raise ProviderContextOverflow("prompt is too long", provider="openai", status=400)


class RecordingFanOut:
    def __init__(self) -> None:
        self.launched: list[FanOutRequest] = []

    def deadline(self, call: ToolCall, profile: RunProfile) -> float:
        return 60.0

    def launch(self, request: FanOutRequest, recorder: AuditRecorder) -> None:
        self.launched.append(request)


def setup(r: redis.Redis, model: Model, **settings: Any) -> tuple[TurnRunner, RecordingFanOut]:
    fanout = RecordingFanOut()
    s = Settings(redis_url="redis://unused", provider="openai", model="m", **settings)
    runner = TurnRunner(r, s, ToolRegistry([SUBAGENTS_TOOL]), router=lambda: model,  # type: ignore[arg-type, return-value]
                        fanout=fanout)
    return runner, fanout


def claim(r: redis.Redis, text: str = "hello",
          conv: ConversationKey | None = None) -> tuple[InboundMessage, TurnLease]:
    msg = InboundMessage(key=conv or ConversationKey(channel="http", chat_id=uniq("c")), text=text,
                         trust="operator")
    queue.accept(r, msg)
    claimed, lease = queue.claim(r, msg.key.as_str(), "w:1", 30)
    assert lease is not None
    return claimed.messages[0], lease


def run(r: redis.Redis, runner: TurnRunner, text: str = "hello",
        conv: ConversationKey | None = None) -> tuple[InboundMessage, TurnOutcome]:
    msg, lease = claim(r, text, conv)
    return msg, runner.run([msg], lease)


def stored(r: redis.Redis, msg: InboundMessage) -> list[ChatMessage]:
    return history.load(r, msg.key.as_str(), 100)


def test_a_final_answer_is_delivered_and_committed(r: redis.Redis) -> None:
    runner, _ = setup(r, Model(say("hi there")))
    msg, outcome = run(r, runner)
    assert outcome == Delivered(waiting=0)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and (rec.status, rec.reply) == (RunStatus.ok, "hi there")
    assert [m.content for m in stored(r, msg)] == ["hello", "hi there"]


def test_an_overflow_compacts_the_history_and_retries_the_turn(r: redis.Redis) -> None:
    conv = ConversationKey(channel="http", chat_id=uniq("c"))
    old = [ChatMessage(role=role, content=f"{role} {i}")
           for i in range(6) for role in ("user", "assistant")]
    history.append(r, conv.as_str(), old)
    model = Model(overflow, say("the summary"), say("answered after compaction"))
    runner, _ = setup(r, model)
    msg, outcome = run(r, runner, "one more", conv)
    assert outcome == Delivered(waiting=0)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.reply == "answered after compaction"
    retried = model.requests[-1].messages
    assert retried[0].content.startswith(CHECKPOINT_PREFIX)
    assert retried[-1].content == "one more" and len(retried) < len(old) + 1


def test_an_overflow_that_nothing_can_shrink_ends_with_the_seed_pointer(r: redis.Redis) -> None:
    runner, _ = setup(r, Model(overflow))
    msg, outcome = run(r, runner)
    assert outcome == Delivered(waiting=0)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and (rec.status, rec.error) == (RunStatus.error, OVERFLOW_MESSAGE)
    # The user got the error; the turn never delivered an answer, so history keeps the message
    # under the failed marker, never the error text.
    assert [m.content for m in stored(r, msg)] == ["hello", FAILED_MARKER]


def test_a_failed_turn_is_not_committed_so_the_next_turn_neither_replays_nor_learns_it(
    r: redis.Redis,
) -> None:
    """Seed F: "A turn that never delivered (stopped or crashed) is never committed"."""
    quoted("F", "A turn that never delivered (stopped or crashed) is never committed")
    conv = ConversationKey(channel="http", chat_id=uniq("c"))

    def down(request: ModelRequest) -> ModelTurn:
        raise ProviderUnavailable("could not connect to openai: refused", provider="openai")

    model = Model(down, say("the next answer"))
    runner, _ = setup(r, model)
    failed, outcome = run(r, runner, "summarise the report", conv)
    assert outcome == Delivered(waiting=0)
    rec = runs.get(r, failed.run_id)
    error = ("I couldn't reach the model provider (openai): could not connect to openai: "
             "refused")
    assert rec is not None and (rec.status, rec.error) == (RunStatus.error, error)
    run(r, runner, "what is 2+2?", conv)
    prompt = [(m.role, m.content) for m in model.requests[-1].messages]
    assert prompt[2][0] == "system" and prompt[2][1].startswith("Current date:")  # the turn's note
    assert prompt[:2] + prompt[3:] == [("user", "summarise the report"),
                                       ("assistant", FAILED_MARKER), ("user", "what is 2+2?")]
    assert error not in str(prompt)


def test_stop_winning_the_race_with_delivery_closes_the_turn_stopped(r: redis.Redis) -> None:
    conv = ConversationKey(channel="http", chat_id=uniq("c"))

    def answer_then_stopped(request: ModelRequest) -> ModelTurn:
        # /stop lands after the model answered, before the turn delivers (the lease keeper
        # polls every 30 s here, so only delivery's compare-and-deliver can see it).
        async def stop() -> None:
            client = aioredis.Redis(connection_pool=aioredis.ConnectionPool(
                **r.connection_pool.connection_kwargs))
            await queue.stop_async(client, conv.as_str())
            await client.aclose()
        asyncio.run(stop())
        return ModelTurn(content="too late", tool_calls=[])

    runner, _ = setup(r, Model(answer_then_stopped), cancel_poll_seconds=30)
    msg, outcome = run(r, runner, "hello", conv)
    assert outcome == Stopped(waiting=0)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.stopped and rec.reply is None
    assert [m.content for m in stored(r, msg)] == ["hello", STOPPED_MARKER]


def test_a_fan_out_parks_the_turn_and_its_results_resume_it(r: redis.Redis) -> None:
    call = ToolCall(id="fan1", name="subagents", arguments={"tasks": ["a", "b"]})
    model = Model(lambda request: ModelTurn("", [call]), say("merged answer"))
    runner, fanout = setup(r, model)
    msg, outcome = run(r, runner)
    assert outcome == Parked()
    assert [(f.run_id, f.call.id) for f in fanout.launched] == [(msg.run_id, "fan1")]
    assert r.hget(keys.active(msg.key.as_str()), "turn_id") == msg.run_id, "still taken"
    resumed = runner.resume_fanout(msg.key.as_str(), msg.run_id, "fan1",
                                   ToolResult('{"results": []}'), "w:2")
    assert resumed == Delivered(waiting=0)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.reply == "merged answer"
    # A late second callback finds the turn closed: fenced, nothing written.
    again = runner.resume_fanout(msg.key.as_str(), msg.run_id, "fan1", ToolResult("{}"), "w:3")
    assert again == Fenced()


def test_a_turn_past_its_deadline_ends_error_with_the_timeout_reply(r: redis.Redis) -> None:
    def slow(request: ModelRequest) -> ModelTurn:
        time.sleep(0.6)  # no gevent here: the deadline is seen right after the call
        return ModelTurn(content="late", tool_calls=[])

    runner, _ = setup(r, Model(slow), turn_timeout=0.3)
    msg, outcome = run(r, runner)
    assert outcome == Delivered(waiting=0)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.error
    assert rec.error == ("That took too long: I stopped working on it after 0.3 s. "
                         "Please try again, or break the request into smaller steps.")
    assert [m.content for m in stored(r, msg)] == ["hello", FAILED_MARKER]


def test_a_turn_that_lost_its_lease_is_fenced_and_writes_nothing(r: redis.Redis) -> None:
    conv = ConversationKey(channel="http", chat_id=uniq("c"))

    def taken_over(request: ModelRequest) -> ModelTurn:
        r.hset(keys.active(conv.as_str()), "turn_id", "someone-else")
        return ModelTurn(content="not mine to deliver", tool_calls=[])

    runner, _ = setup(r, Model(taken_over), cancel_poll_seconds=30)
    msg, outcome = run(r, runner, "hello", conv)
    assert outcome == Fenced()
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.running and rec.reply is None
    assert [m.content for m in stored(r, msg)] == ["hello"]


@pytest.mark.parametrize("waiting", [0, 2])
def test_released_outcomes_count_the_messages_waiting(r: redis.Redis, waiting: int) -> None:
    runner, _ = setup(r, Model(say("ok")))
    conv = ConversationKey(channel="http", chat_id=uniq("c"))
    msg, lease = claim(r, "first", conv)
    for i in range(waiting):
        queue.accept(r, InboundMessage(key=conv, text=f"later {i}"))
    assert runner.run([msg], lease) == Delivered(waiting=waiting)


def test_each_turn_lists_the_skills_of_the_registry_version_it_starts_under(
    r: redis.Redis, tmp_path: Path
) -> None:
    model = Model(say("one"), say("two"))
    fanout = RecordingFanOut()
    s = Settings(redis_url="redis://unused", provider="openai", model="m", home=tmp_path)
    runner = TurnRunner(r, s, ToolRegistry([]), router=lambda: model,  # type: ignore[arg-type, return-value]
                        fanout=fanout, skills=SkillRegistry(r, tmp_path))
    run(r, runner)
    assert "- write-a-skill: How to write" in model.requests[0].system
    assert "- triage:" not in model.requests[0].system
    SkillRegistry(r, tmp_path / "another-host").create(
        "---\nname: triage\ndescription: Sort the inbox.\n---\nSort it.\n")
    run(r, runner)
    assert "- triage: Sort the inbox." in model.requests[1].system
