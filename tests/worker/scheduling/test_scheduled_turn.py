"""A scheduled job's run through TurnRunner, on a real (private) Redis with a scripted
in-process model: its loop context, tool subset, timeout, silence and delivery target, a
guest's turn calling ``schedule_job``, and a job running as the agent that made it, inside
that agent's limits (a job stored before jobs had an agent runs as ``default``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest
import redis

from fermix_shared.agents.definitions import AgentDefinition
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import ConversationKey, InboundMessage, RunStatus
from fermix_shared.scheduling.firing import run_message
from fermix_shared.scheduling.parse import make_schedule, new_job, parse_delivery
from fermix_shared.scheduling.store import JobStore
from fermix_shared.settings import Settings
from fermix_shared.stores import queue, runs
from fermix_worker.loop_state import ITERATION_CAPS, LoopState
from fermix_worker.providers.base import ModelRequest, ModelTurn, Resending
from fermix_worker.scheduling.ticker import RecordJobRun
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry
from fermix_worker.tools.schedule import schedule_tools
from fermix_worker.turn import TurnRunner
from fermix_worker.turn.listeners import TurnListeners
from fermix_worker.turn.reply import is_silent

Step = Callable[[ModelRequest, Callable[[str], None]], ModelTurn]


class ScriptedModel(Resending):
    """A router whose every turn answers from ``steps`` and records the requests."""

    def __init__(self, *steps: Step):
        self.steps = list(steps)
        self.requests: list[ModelRequest] = []

    def for_turn(self, **_: Any) -> ScriptedModel:
        return self

    def with_primary(self, _: Any) -> ScriptedModel:  # an agent's own route
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
             channel: FakeChannel | None = None, settings: Settings | None = None) -> None:
    tools = ToolRegistry([*BUILTIN_TOOLS, *schedule_tools(lambda: r, lambda conv: None, 600)])
    settings = settings or Settings(redis_url="redis://unused")
    runner = TurnRunner(r, settings, tools, router=lambda: model,  # type: ignore[arg-type, return-value]
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


def test_a_lower_turn_timeout_set_after_the_job_was_made_caps_its_run(r: redis.Redis) -> None:
    msg = scheduled(r, deliver="telegram:5001", timeout_s=30)  # allowed when it was made
    lowered = Settings(redis_url="redis://unused", turn_timeout=0.2)  # FERMIX_TURN_TIMEOUT now
    channel = FakeChannel()
    run_turn(r, msg, ScriptedModel(say("too late", delay=0.6)), channel, lowered)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.error
    assert rec.error == "The scheduled job timed out after 0.2 s."
    assert [text for _, text, _ in channel.sent] == [rec.error]


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


# --- a job runs as the agent that made it, inside that agent's limits (issue 25) ----------

REPORTER = AgentDefinition(name="reporter", system_prompt="You are Reporter.",
                           model="reporter-model", policy=["read_only"],
                           allowed_tools=["calculator", "current_time", "http_fetch",
                                          "schedule_job", "list_jobs"])
AGENTS = Settings(redis_url="redis://unused", agents=[REPORTER])


def offered(model: ScriptedModel, call: int = 0) -> list[str]:
    return sorted(t.name for t in model.requests[call].tools)


def test_a_run_uses_its_job_s_agent_prompt_route_policy_and_tools(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")  # the agent's route gets a client (unused)
    msg = scheduled(r, agent="reporter")
    assert msg.agent == "reporter"
    model = ScriptedModel(say("Report done."))
    run_turn(r, msg, model, settings=AGENTS)
    (request,) = model.requests
    assert request.system.startswith("You are Reporter.") and request.model == "reporter-model"
    # Its list within its policy: read_only drops http_fetch (network) and schedule_job.
    assert offered(model) == ["calculator", "current_time", "list_jobs"]
    assert runs.get(r, msg.run_id).status is RunStatus.ok  # type: ignore[union-attr]


def test_a_job_stored_before_jobs_had_an_agent_runs_as_default(r: redis.Redis) -> None:
    # Today's record, as the previous release wrote it (schema_version 1, no agent).
    old = {"schema_version": 1, "name": "legacy", "message": "old report",
           "schedule": {"kind": "every", "every_s": 60, "tz": "UTC"},
           "delivery": {"mode": "none"}, "allowed_tools": None, "timeout_s": 300.0,
           "trust": "operator", "created_by": "cli", "created_at": 1_700_000_000_000,
           "enabled": True, "paused": False, "consecutive_failures": 0, "next_run_at": None}
    r.hset("fx:sched:jobs", "legacy", json.dumps(old))
    job = JobStore(r).require("legacy")
    assert (job.agent, job.schema_version) == ("default", 2)
    msg = run_message(job, "run_" + "b" * 32, None)
    model = ScriptedModel(say("Old job answered."))
    run_turn(r, msg, model, settings=AGENTS)
    assert not model.requests[0].system.startswith("You are Reporter.")
    assert "http_fetch" in offered(model) and "schedule_job" in offered(model)
    (entry,) = JobStore(r).runs("legacy")
    assert (entry.status, entry.output) == ("ok", "Old job answered.")


def test_a_job_whose_agent_is_gone_does_not_run_as_default(r: redis.Redis) -> None:
    msg = scheduled(r, agent="reporter")
    model = ScriptedModel()
    run_turn(r, msg, model)  # settings without the reporter agent
    assert model.requests == []
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.error
    assert rec.error == ("The scheduled job 'report' runs as agent 'reporter', which is not "
                         "declared any more; the run did not start.")
    assert JobStore(r).require("report").consecutive_failures == 1


def test_schedule_job_records_the_agent_and_refuses_wider_tools(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")  # the agent's route gets a client (unused)
    chat = InboundMessage(key=ConversationKey(channel="telegram", chat_id="77"), text="plan",
                          sender_id="77", trust="operator", agent="reporter")
    wide = {"name": "wide", "message": "m", "every_seconds": 60,
            "allowed_tools": ["calculator", "http_fetch", "write_file"]}
    model = ScriptedModel(call("schedule_job", wide), say("ok"))
    # schedule_job is read_write: let this reporter use it, with the same tool list.
    agents = Settings(redis_url="redis://unused", agents=[REPORTER.model_copy(
        update={"policy": ["read_only", "read_write"]})])
    run_turn(r, chat, model, settings=agents)
    refused = tool_message(model)
    assert refused.is_error and refused.content == (
        "Error: allowed_tools may name only tools this conversation can use; not available "
        "here: http_fetch, write_file")
    assert JobStore(r).get("wide") is None

    for name, tools in (("narrower", ["calculator"]), ("inherits", None)):
        args: dict[str, Any] = {"name": name, "message": "m", "every_seconds": 60}
        if tools is not None:
            args["allowed_tools"] = tools
        model = ScriptedModel(call("schedule_job", args), say("ok"))
        run_turn(r, chat.model_copy(update={"run_id": "run_" + name.ljust(32, "x")}), model,
                 settings=agents)
        assert not tool_message(model).is_error, tool_message(model).content
        job = JobStore(r).require(name)
        assert (job.agent, job.trust) == ("reporter", "operator")
        # Without a list the job keeps the creating turn's (its agent's, as the run applies).
        assert job.allowed_tools == (tools if tools is not None else REPORTER.allowed_tools)
