"""A scheduled job's run through TurnRunner, on a real (private) Redis with a scripted
in-process model: its loop context, tool subset, timeout, silence and delivery target, and a
guest's turn calling ``schedule_job``."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest
import redis

from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import ConversationKey, InboundMessage, RunStatus
from fermix_shared.scheduling.firing import run_message
from fermix_shared.scheduling.parse import make_schedule, new_job, parse_delivery
from fermix_shared.scheduling.store import JobStore
from fermix_shared.settings import Settings
from fermix_shared.stores import queue, runs
from fermix_worker.loop import ITERATION_CAPS, LoopState
from fermix_worker.providers.base import ModelRequest, ModelTurn
from fermix_worker.scheduler import RecordJobRun
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry
from fermix_worker.tools.schedule import schedule_tools
from fermix_worker.turn import TurnRunner
from fermix_worker.turn.listeners import TurnListeners
from fermix_worker.turn.reply import is_silent

Step = Callable[[ModelRequest, Callable[[str], None]], ModelTurn]


class ScriptedModel:
    """A router whose every turn answers from ``steps`` and records the requests."""

    def __init__(self, *steps: Step):
        self.steps = list(steps)
        self.requests: list[ModelRequest] = []

    def for_turn(self, **_: Any) -> ScriptedModel:
        return self

    def complete(self, request: ModelRequest, on_delta: Callable[[str], None], *,
                 initial: bool = False) -> ModelTurn:
        self.requests.append(request)
        return self.steps.pop(0)(request, on_delta)


def say(text: str, delay: float = 0.0) -> Step:
    def step(request: ModelRequest, on_delta: Callable[[str], None]) -> ModelTurn:
        time.sleep(delay)
        on_delta(text)
        return ModelTurn(content=text, tool_calls=[], input_tokens=7, output_tokens=3)
    return step


def call(tool: str, arguments: dict[str, Any]) -> Step:
    return lambda request, on_delta: ModelTurn(
        content="", tool_calls=[ToolCall(id="c1", name=tool, arguments=arguments)])


class FakeChannel:
    name = "telegram"

    def __init__(self) -> None:
        self.sent: list[tuple[ConversationKey, str, str]] = []

    def send_text(self, key: ConversationKey, text: str, *, delivery_id: str) -> None:
        self.sent.append((key, text, delivery_id))

    def working(self, key: ConversationKey, message_id: str | None) -> Any:
        return nullcontext()


def run_turn(r: redis.Redis, msg: InboundMessage, model: ScriptedModel,
             channel: FakeChannel | None = None) -> None:
    tools = ToolRegistry([*BUILTIN_TOOLS, *schedule_tools(lambda: r, lambda conv: None, 600)])
    runner = TurnRunner(r, Settings(redis_url="redis://unused"), tools, router=lambda: model,  # type: ignore[arg-type, return-value]
                        channels=lambda name: channel if name == "telegram" else None,  # type: ignore[arg-type, return-value]
                        listeners=TurnListeners([RecordJobRun(r)]))
    queue.accept(r, msg)
    claim, lease = queue.claim(r, msg.key.as_str(), "w:1", 30)
    assert lease is not None
    runner.run(claim.messages, lease)


def scheduled(r: redis.Redis, *, deliver: str | None = None, **kw: Any) -> InboundMessage:
    job = new_job(name="report", message="daily report", schedule=make_schedule(every_s=60),
                  delivery=parse_delivery(deliver, None), trust="operator", created_by="t", **kw)
    JobStore(r).add(job)
    return run_message(job, "run_" + "a" * 32, None)


def test_a_scheduled_run_has_the_scheduled_cap_its_tool_subset_and_its_delivery(r: redis.Redis) -> None:
    msg = scheduled(r, deliver="telegram:5001:9", allowed_tools=["calculator"])
    model, channel = ScriptedModel(say("All green.")), FakeChannel()
    run_turn(r, msg, model, channel)
    assert [t.name for t in model.requests[0].tools] == ["calculator"]
    state = LoopState.model_validate_json(r.get(f"fx:run:{msg.run_id}:state") or "")
    assert state.context == "scheduled" and state.max_iterations == ITERATION_CAPS["scheduled"]
    target = ConversationKey(channel="telegram", chat_id="5001", thread_scope="9")
    assert channel.sent == [(target, "All green.", msg.run_id)]
    (entry,) = JobStore(r).runs("report")
    assert (entry.status, entry.delivery, entry.trigger) == ("ok", "sent", "manual")
    assert (entry.input_tokens, entry.output_tokens) == (7, 3)


@pytest.mark.parametrize("answer", ["NO_REPLY", "[SILENT]", "  no_reply "])
def test_a_silent_answer_is_not_delivered(r: redis.Redis, answer: str) -> None:
    msg = scheduled(r, deliver="telegram:5001")
    channel = FakeChannel()
    run_turn(r, msg, ScriptedModel(say(answer)), channel)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.ok and rec.reply == ""
    assert channel.sent == []
    assert JobStore(r).runs("report")[0].delivery == "silent"


def test_silence_is_only_the_whole_answer() -> None:
    assert is_silent("NO_REPLY") and is_silent("[silent]", scheduled=True)
    assert is_silent("NO_REPLY NO_REPLY")
    assert not is_silent("Disk 91% full. [SILENT] otherwise") and not is_silent("")


def test_a_run_past_its_timeout_ends_in_error(r: redis.Redis) -> None:
    msg = scheduled(r, deliver="telegram:5001", timeout_s=0.2)
    channel = FakeChannel()
    run_turn(r, msg, ScriptedModel(say("too late", delay=0.4)), channel)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.error
    assert rec.error == "The scheduled job timed out after 0.2 s."
    assert [text for _, text, _ in channel.sent] == [rec.error]
    assert JobStore(r).require("report").consecutive_failures == 1


def tool_message(model: ScriptedModel) -> ChatMessage:
    """The tool result the model saw on its second call."""
    return [m for m in model.requests[1].messages if m.role == "tool"][-1]


def chat_turn(trust: str, text: str) -> InboundMessage:
    key = ConversationKey(channel="telegram", chat_id="77")
    return InboundMessage(key=key, text=text, sender_id="77", trust=trust)  # type: ignore[arg-type]


def test_a_guest_cannot_schedule_a_job_and_an_operator_can(r: redis.Redis) -> None:
    args = {"name": "nightly", "message": "summarize", "cron": "0 2 * * *", "tz": "Asia/Tokyo"}
    guest = ScriptedModel(call("schedule_job", args), say("ok"))
    run_turn(r, chat_turn("guest", "schedule it"), guest)
    assert "schedule_job" not in [t.name for t in guest.requests[0].tools]
    tool_result = tool_message(guest)
    assert tool_result.is_error and "needs read_write access; caller is guest" in tool_result.content
    assert JobStore(r).get("nightly") is None

    operator = ScriptedModel(call("schedule_job", args), say("done"))
    run_turn(r, chat_turn("operator", "schedule it"), operator)
    result = tool_message(operator)
    assert not result.is_error and "Scheduled job 'nightly'" in result.content
    job = JobStore(r).require("nightly")
    assert (job.trust, job.created_by, job.delivery.mode) == ("operator", "telegram:77", "origin")
    assert job.delivery.to == ConversationKey(channel="telegram", chat_id="77")
