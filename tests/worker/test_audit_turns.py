"""What a turn leaves in the audit trail: its tool calls, refused calls as failed checks (a
guest's above all), memory reads and writes, approvals asked and expired, subagents' calls and
cancellations; and never an argument's value or the message's text.

TurnRunner and SubagentRunner run in this process on the scratch Redis, over the real SDK
adapters talking to the scripted LLM server."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
import redis

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import audit, keys
from fermix_shared.audit import AuditConfig, AuditEntry, AuditLog
from fermix_shared.celery_app import app
from fermix_shared.memory import MemoryStore
from fermix_shared.models import ConversationKey, InboundMessage, RunRecord, Trust
from fermix_shared.settings import Settings
from fermix_shared.stores import queue, runs
from fermix_worker.approvals.policy import settle_approvals
from fermix_worker.fleet.heartbeat import Liveness
from fermix_worker.fleet.reaper import ReaperConfig, reap
from fermix_worker.providers import build_router
from fermix_worker.runtime import Runtime
from fermix_worker.subagents.results import SubagentReport
from fermix_worker.subagents.runner import SubagentJob, SubagentRunner
from fermix_worker.subagents.tool import SUBAGENTS_TOOL
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry
from fermix_worker.tools.memory import memory_tools
from fermix_worker.tools.policy import ALL_POLICIES
from fermix_worker.turn import TurnRunner
from tests.conftest import provider_env
from tests.fleet import uniq
from tests.seed_text import quoted

SECRET = "sk-live-7f3a9c1e5b"


@pytest.fixture(autouse=True)
def sdk_env(llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in provider_env(llm, "openai").items():
        if not name.startswith("FERMIX_"):
            monkeypatch.setenv(name, value)


def settings(**extra: Any) -> Settings:
    return Settings(redis_url="redis://unused", provider="openai", model="scripted-openai",
                    cancel_poll_seconds=0.05, **extra)


def run_turn(r: redis.Redis, s: Settings, text: str, *, trust: Trust = "operator",
             channel: str = "http", sender: str = "api") -> RunRecord:
    tools = ToolRegistry([*BUILTIN_TOOLS, *memory_tools(lambda: MemoryStore(r))])
    runner = TurnRunner(r, s, tools, router=lambda: build_router(s))
    msg = InboundMessage(key=ConversationKey(channel=channel, chat_id=uniq("chat")),  # type: ignore[arg-type]
                         text=text, trust=trust, sender_id=sender)
    queue.accept(r, msg)
    claim, lease = queue.claim(r, msg.key.as_str(), "w:1", 30)
    assert lease is not None
    runner.run(claim.messages, lease)
    rec = runs.get(r, msg.run_id)
    assert rec is not None
    return rec


def entries(r: redis.Redis, run_id: str) -> list[AuditEntry]:
    """The run's entries, oldest first."""
    return list(reversed(AuditLog(r).recent(run=run_id, limit=1000)))


def stored_text(r: redis.Redis) -> str:
    return json.dumps(r.hgetall(keys.audit_entries()))


def test_a_guest_s_refused_tool_call_is_a_failed_check(r: redis.Redis,
                                                        llm: ScriptedLLMServer) -> None:
    text = uniq("guest")
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("memory_store", {"text": f"remember {SECRET}"})],
              match=text),
        Reply(text="I cannot do that.", match=text))
    rec = run_turn(r, settings(), text, trust="guest", channel="telegram", sender="777")
    assert rec.reply == "I cannot do that."
    (check,) = [e for e in entries(r, rec.run_id) if e.kind == "check"]
    assert (check.action, check.outcome, check.actor) == ("memory_store", "fail", "telegram:777")
    assert check.detail["trust"] == "guest"
    assert "needs read_write access; caller is guest" in check.detail["reason"]
    assert check.conv == rec.conversation.as_str() and check.agent == "default"
    # The refused call ran nothing: no tool entry, no memory write.
    assert not [e for e in entries(r, rec.run_id) if e.kind in ("tool", "memory")]
    assert SECRET not in stored_text(r) and text not in stored_text(r)
    assert AuditLog(r).verify().ok


def test_an_operator_turn_s_calls_and_memory_are_audited_without_their_values(
        r: redis.Redis, llm: ScriptedLLMServer) -> None:
    MemoryStore(r).add("The office is in Lyon.", source="test")
    text = uniq("op") + f" my token is {SECRET}"
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})], match=text),
        Reply(tool_calls=[ToolCallSpec("memory_store", {"text": f"API key {SECRET}"})],
              match=text),
        Reply(tool_calls=[ToolCallSpec("memory_recall", {"query": SECRET})], match=text),
        Reply(text="42, and noted.", match=text))
    rec = run_turn(r, settings(), text)
    assert rec.reply == "42, and noted."
    got = [(e.kind, e.action, e.outcome) for e in entries(r, rec.run_id)]
    # OpenFang: "Every capability check (pass/fail)": a permitted call's entry carries its
    # passed check (check=pass); a refused one is a failed check entry of its own.
    assert quoted("O", "Every capability check (pass/fail)")
    assert got == [
        ("memory", "prompt_read", "ok"),
        ("tool", "calculator", "ok"),
        ("memory", "store", "ok"), ("tool", "memory_store", "ok"),
        ("memory", "recall", "ok"), ("tool", "memory_recall", "ok"),
    ]
    calc = entries(r, rec.run_id)[1]
    assert calc.actor == "http:api" and calc.detail["check"] == "pass"
    assert calc.detail["args_sha256"] and calc.detail["args_len"] == len('{"expression":"6*7"}')
    assert isinstance(calc.detail["ms"], float) and calc.detail["trust"] == "operator"
    assert entries(r, rec.run_id)[0].detail["facts"] == 1
    raw = stored_text(r)
    assert SECRET not in raw and "6*7" not in raw and "Lyon" not in raw and text not in raw


def test_an_approval_asked_then_expired(r: redis.Redis, llm: ScriptedLLMServer) -> None:
    text = uniq("approve")
    llm.script.push(Reply(tool_calls=[ToolCallSpec("calculator", {"expression": "1+1"})],
                          match=text))
    s = settings(approvals={"tools": ["calculator"], "timeout_seconds": 1})
    rec = run_turn(r, s, text)
    (asked,) = [e for e in entries(r, rec.run_id) if e.kind == "approval"]
    assert (asked.action, asked.detail["tool"]) == ("asked", "calculator")
    resumed: list[str] = []
    settle_approvals(r, resumed.append, now=time.time() + 10)
    assert resumed == [asked.detail["approval_id"]]
    expired = [e for e in entries(r, rec.run_id) if e.action == "expired"]
    assert [(e.kind, e.actor, e.detail["approval_id"]) for e in expired] == [
        ("approval", "timeout", asked.detail["approval_id"])]


# --- subagents ---------------------------------------------------------------------------------

def _parent(r: redis.Redis, run_id: str, **fields: str) -> str:
    conv = f"http|{uuid.uuid4().hex}|root"
    r.hset(keys.active(conv), mapping={"turn_id": run_id, "worker": f"parked:{run_id}", **fields})
    r.expire(keys.active(conv), 60)
    return conv


def _job(conv: str, task: str, parent_run: str) -> SubagentJob:
    return SubagentJob(fanout_id=uuid.uuid4().hex, index=2, task=task, conv=conv,
                       parent_run=parent_run, trust="operator", profile="default",
                       result_format="concise", parent_model="m", parent_tools=None,
                       parent_policies=sorted(ALL_POLICIES), concurrency=1, timeout_s=30,
                       deadline_at=time.time() + 30, slots_ttl_s=60, parent_agent="default")


def test_a_subagent_s_calls_refusals_and_cancellation(r: redis.Redis,
                                                       llm: ScriptedLLMServer) -> None:
    runner = SubagentRunner(r, settings(), [*BUILTIN_TOOLS, SUBAGENTS_TOOL], slot_wait_s=0.2)
    task, parent = uniq("task"), uniq("run")
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("calculator", {"expression": "2+2"}),
                          ToolCallSpec("subagents", {"tasks": ["deeper"]})], match=task),
        Reply(text="4", match=task))
    out = runner.run(_job(_parent(r, parent), task, parent), "w1")
    assert isinstance(out, SubagentReport) and out.status == "completed"
    got = [(e.kind, e.action, e.outcome, e.actor, e.detail["subagent"])
           for e in entries(r, parent)]
    assert got == [("tool", "calculator", "ok", "subagent", 2),
                   ("check", "subagents", "fail", "subagent", 2)]

    stopped = uniq("run")
    out = runner.run(_job(_parent(r, stopped, cancelled="stop"), uniq("task"), stopped), "w1")
    assert isinstance(out, SubagentReport) and out.status == "cancelled"
    (cancel,) = entries(r, stopped)
    assert (cancel.kind, cancel.action, cancel.detail["reason"]) == (
        "agent", "subagent.cancel", "the parent turn was stopped")


def test_the_reaper_applies_retention(r: redis.Redis) -> None:
    for _ in range(12):
        audit.record(r, "tool", "calculator", "ok", actor="worker")
    config = ReaperConfig(Liveness(heartbeat_s=0.05, dead_s=5.0), stale_s=30, stale_every_s=10)
    # The sweeps a worker registers, with this retention.
    settings = Settings(audit=AuditConfig(max_entries=5, max_age_days=0))
    out = reap(r, config, recover=lambda conv: None, kick=lambda conv: None,
               republish=lambda message: None, sweeps=Runtime(settings, r, app).sweeps())
    assert out.swept["audit"] == 7
    result = AuditLog(r).verify()
    assert result.ok and (result.first, result.last) == (8, 12)
