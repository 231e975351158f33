"""The scheduling tools as the model calls them, with a turn's context, on a private Redis."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from fermix_shared.messages import ToolCall
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.scheduling.store import JobStore
from fermix_worker.tools import GUEST, OPERATOR, ToolRegistry, ToolResult
from fermix_worker.tools.context import RunContext
from fermix_worker.tools.schedule import schedule_tools

CHAT = ConversationKey(channel="slack", chat_id="C042", thread_scope="1700000000.000100")


def tool(r: redis.Redis, kicked: list[str], name: str, args: dict[str, Any], *,
         trust: str = "operator", key: ConversationKey = CHAT,
         deliver_to: ConversationKey | None = None) -> ToolResult:
    registry = ToolRegistry(schedule_tools(lambda: r, kicked.append, 600))
    msg = InboundMessage(key=key, text="-", sender_id="U1", trust=trust,  # type: ignore[arg-type]
                         deliver_to=deliver_to)
    scoped = registry.scoped(OPERATOR if trust == "operator" else GUEST)
    return scoped.execute(ToolCall(id="c", name=name, arguments=args), RunContext.for_turn(msg))


def test_guests_see_only_list_jobs() -> None:
    registry = ToolRegistry(schedule_tools(lambda: None, print, 600))  # type: ignore[arg-type, return-value]
    assert [s.name for s in registry.scoped(GUEST).specs()] == ["list_jobs"]
    assert len(registry.scoped(OPERATOR).specs()) == 6


def test_schedule_job_delivers_to_the_thread_it_was_asked_in(r: redis.Redis) -> None:
    out = tool(r, [], "schedule_job", {"name": "standup", "message": "remind the team",
                                       "cron": "0 9 * * mon-fri", "tz": "Europe/Paris"})
    assert not out.is_error and "delivers to slack:C042:1700000000.000100" in out.content
    job = JobStore(r).require("standup")
    assert job.delivery.to == CHAT and job.created_by == "slack:U1"
    dup = tool(r, [], "schedule_job", {"name": "standup", "message": "x", "every_seconds": 60})
    assert dup.is_error and "already exists" in dup.content
    again = tool(r, [], "schedule_job", {"name": "standup", "message": "x", "every_seconds": 60,
                                         "deliver": "none", "replace": True})
    assert not again.is_error and JobStore(r).require("standup").delivery.to is None


def test_a_job_made_by_a_scheduled_run_delivers_where_that_run_does(r: redis.Redis) -> None:
    run_key = ConversationKey(channel="schedule", chat_id="parent", thread_scope="run_x")
    target = ConversationKey(channel="telegram", chat_id="5")
    tool(r, [], "schedule_job", {"name": "child", "message": "m", "every_seconds": 5},
         key=run_key, deliver_to=target)
    assert JobStore(r).require("child").delivery.to == target


@pytest.mark.parametrize(("args", "error"), [
    ({"name": "a b", "message": "m", "every_seconds": 5}, "1-64 characters"),
    ({"name": "x", "message": "m"}, "exactly one schedule"),
    ({"name": "x", "message": "m", "cron": "every day"}, "5 fields"),
    ({"name": "x", "message": "m", "every_seconds": "often"}, "every_seconds must be a number"),
    ({"name": "x", "message": "m", "every_seconds": 5, "timeout_seconds": 9000}, "at most 600"),
    ({"name": "x", "message": "m", "every_seconds": 5, "deliver": "sms:1"}, "delivery target"),
    # Stored as "no list" (every tool) before issue 25.
    ({"name": "x", "message": "m", "every_seconds": 5, "allowed_tools": "calculator"},
     "allowed_tools must be a list of tool names"),
    # Outside a turn nobody knows the caller's tools: a list cannot be checked, so refused.
    ({"name": "x", "message": "m", "every_seconds": 5, "allowed_tools": ["calculator"]},
     "allowed_tools cannot be checked against this conversation's tools"),
])
def test_bad_arguments_come_back_as_one_sentence(r: redis.Redis, args: dict[str, Any], error: str) -> None:
    out = tool(r, [], "schedule_job", args)
    assert out.is_error and error in out.content


def test_pause_resume_run_now_remove_and_list(r: redis.Redis) -> None:
    kicked: list[str] = []
    tool(r, kicked, "schedule_job", {"name": "beat", "message": "secret plan", "every_seconds": 30})
    assert "paused" in tool(r, kicked, "pause_job", {"name": "beat"}).content
    assert JobStore(r).require("beat").next_run_at is None
    assert "active" in tool(r, kicked, "resume_job", {"name": "beat"}).content
    started = tool(r, kicked, "run_job_now", {"name": "beat"})
    assert not started.is_error and len(kicked) == 1 and kicked[0].startswith("schedule|beat|run_")
    assert "secret plan" in tool(r, kicked, "list_jobs", {}).content
    assert "secret plan" not in tool(r, kicked, "list_jobs", {}, trust="guest").content
    assert tool(r, kicked, "remove_job", {"name": "beat"}).content == "Removed job 'beat'."
    assert tool(r, kicked, "list_jobs", {}).content == "No scheduled jobs."
    missing = tool(r, kicked, "pause_job", {"name": "beat"})
    assert missing.is_error and "no scheduled job named 'beat'" in missing.content
