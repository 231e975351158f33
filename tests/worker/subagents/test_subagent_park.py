"""A subagent's call that needs approval parks the subagent's job, not the parent: real Redis,
the scripted LLM and SubagentRunner in-process, each header-task execution played by one
``run`` with its own claim (the retry presents its park's token, as the task does).

It asks (the request names the subagent), gives its slot back and waits without a worker; a
duplicate execution cannot take it from a live worker; once approved it goes on from where it
parked and the call runs once; a denial, the parent's /stop and the fan-out's deadline each end
the wait with the reason, and nothing is left pending."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
import redis

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.approvals import store as approvals
from fermix_shared.settings import Settings
from fermix_worker.subagents.claim import Busy, RerunMessage, SubagentClaim
from fermix_worker.subagents.park import WAITED_PAST_DEADLINE, Parked
from fermix_worker.subagents.results import SubagentReport
from fermix_worker.subagents.runner import SubagentJob, SubagentRunner
from fermix_worker.subagents.semaphore import FanOutSemaphore
from fermix_worker.tools import BUILTIN_TOOLS, Tool
from fermix_worker.tools.policy import ALL_POLICIES


@pytest.fixture
def ran() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def runner(r: redis.Redis, llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch,
           ran: list[dict[str, Any]]) -> SubagentRunner:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    # The default [approvals]: every exec-class call waits for a person.
    settings = Settings(provider="openai", model="scripted-openai", cancel_poll_seconds=0.05)
    shell = Tool("shell_run", "Run a shell command.", {"type": "object"},
                 lambda ctx, args: ran.append(args) or "ran", policy="exec", idempotent=False)
    return SubagentRunner(r, settings, [*BUILTIN_TOOLS, shell])


def parent(r: redis.Redis) -> str:
    conv = f"http|{uuid.uuid4().hex}|root"
    r.hset(keys.active(conv), mapping={"turn_id": "run_p", "worker": "parked:run_p"})
    r.expire(keys.active(conv), 60)
    return conv


def job(conv: str, task: str, **kw: Any) -> SubagentJob:
    base: dict[str, Any] = dict(
        fanout_id=uuid.uuid4().hex, index=1, task=task, conv=conv, parent_run="run_p",
        trust="operator", profile="default", result_format="concise", parent_model="m",
        parent_tools=None, parent_policies=sorted(ALL_POLICIES), concurrency=1, timeout_s=30,
        deadline_at=time.time() + 120, slots_ttl_s=180, parent_user="http:c")
    return SubagentJob(**{**base, **kw})


def claim(r: redis.Redis, j: SubagentJob, park_token: str | None = None,
          worker: str = "w1@h:1") -> SubagentClaim:
    msg = RerunMessage(task_id=f"t-{j.fanout_id}", job=j.model_dump(mode="json"))
    return SubagentClaim(r, j.fanout_id, j.index, worker, msg, dead_ms=60_000, ttl_s=180,
                         park_token=park_token)


def parked(r: redis.Redis, runner: SubagentRunner, llm: ScriptedLLMServer, after: str
           ) -> tuple[SubagentJob, Parked, approvals.Approval]:
    """A subagent whose model calls shell_run (then answers ``after``), parked for it."""
    task = f"task-{uuid.uuid4().hex[:8]}"
    llm.script.push(Reply(tool_calls=[ToolCallSpec("shell_run", {"cmd": "make"})], match=task),
                    Reply(text=after, match=task))
    j = job(parent(r), task)
    out = runner.run(j, "w1@h:1", claim(r, j))
    assert isinstance(out, Parked), out
    (waiting,) = [a for a in _pending(r) if a.request.call_id.startswith("sub1:")
                  and task in a.request.reason]
    return j, out, waiting


def _pending(r: redis.Redis) -> list[approvals.Approval]:
    ids = r.zrange(keys.approvals_pending(), 0, -1)
    return [a for i in ids if (a := approvals.get(r, str(i))) is not None]


def tool_results(llm: ScriptedLLMServer, task: str) -> list[str]:
    bodies = [q["body"] for q in llm.script.requests if task in json.dumps(q["body"])]
    return [m["content"] for m in bodies[-1]["messages"] if m["role"] == "tool"]


def test_an_approved_call_runs_once_after_the_subagent_parked_without_its_slot(
    r: redis.Redis, llm: ScriptedLLMServer, runner: SubagentRunner, ran: list[dict[str, Any]]
) -> None:
    j, park, waiting = parked(r, runner, llm, "built it")
    req = waiting.request
    assert (req.tool, req.arguments, req.run_id, req.conv) == (
        "shell_run", {"cmd": "make"}, "run_p", j.conv)
    assert req.reason == f"Asked by subagent 2 of this conversation's turn, working on: {j.task}"
    assert req.expires_at <= j.deadline_at - 30  # the fan-out's deadline bounds the wait
    assert ran == []  # nothing ran yet
    assert FanOutSemaphore(r, j.fanout_id, 1, 60).holders() == []  # its slot was given back
    # A duplicate (the broker's redelivery) cannot take it from its live worker.
    assert isinstance(runner.run(j, "w2@h:2", claim(r, j, worker="w2@h:2")), Busy)
    # Its own retry, before the answer: parked again, under a new token.
    again = runner.run(j, "w1@h:1", claim(r, j, park.park_token))
    assert isinstance(again, Parked) and again.park_token != park.park_token
    assert isinstance(runner.run(j, "w1@h:1", claim(r, j, park.park_token)), Busy)  # stale
    assert approvals.decide(r, req.approval_id, "approved", "http:api") == "decided"
    done = runner.run(j, "w1@h:1", claim(r, j, again.park_token))
    assert isinstance(done, SubagentReport), done
    assert (done.status, done.output, done.iterations) == ("completed", "built it", 2)
    assert ran == [{"cmd": "make"}]
    assert tool_results(llm, j.task) == ["ran"]
    # Reported once: a late copy gets the stored report.
    assert runner.run(j, "w1@h:1", claim(r, j)) == done


def test_a_denied_call_is_refused_and_the_subagent_goes_on(
    r: redis.Redis, llm: ScriptedLLMServer, runner: SubagentRunner, ran: list[dict[str, Any]]
) -> None:
    j, park, waiting = parked(r, runner, llm, "could not build")
    approvals.decide(r, waiting.approval_id, "denied", "http:api", "not now")
    done = runner.run(j, "w1@h:1", claim(r, j, park.park_token))
    assert isinstance(done, SubagentReport) and done.status == "completed"
    assert ran == []
    (result,) = tool_results(llm, j.task)
    assert result.startswith("Error: this call was not approved (denied by http:api: not now)")


def test_the_parent_s_stop_and_the_deadline_end_the_wait_and_withdraw_the_approval(
    r: redis.Redis, llm: ScriptedLLMServer, runner: SubagentRunner, ran: list[dict[str, Any]]
) -> None:
    j, park, waiting = parked(r, runner, llm, "never")
    r.hset(keys.active(j.conv), "cancelled", "stop")
    stopped = runner.run(j, "w1@h:1", claim(r, j, park.park_token))
    assert isinstance(stopped, SubagentReport)
    assert (stopped.status, stopped.error) == ("cancelled", "the parent turn was stopped")
    found = approvals.get(r, waiting.approval_id)
    assert found is not None and found.status == "cancelled"

    j, park, waiting = parked(r, runner, llm, "never")
    late = j.model_copy(update={"deadline_at": time.time() - 1})
    timed = runner.run(late, "w1@h:1", claim(r, late, park.park_token))
    assert isinstance(timed, SubagentReport)
    assert (timed.status, timed.error) == ("timed_out", WAITED_PAST_DEADLINE)
    found = approvals.get(r, waiting.approval_id)
    assert found is not None and found.status == "expired"
    assert ran == []


def test_a_parked_subagent_whose_worker_died_is_taken_over_with_its_state(
    r: redis.Redis, llm: ScriptedLLMServer, runner: SubagentRunner, ran: list[dict[str, Any]]
) -> None:
    j, _, waiting = parked(r, runner, llm, "built elsewhere")
    # Its worker stopped beating long ago: the reaper's re-run (no token) takes it over.
    r.hset(keys.worker_beats(), "w1@h:1", 0)
    approvals.decide(r, waiting.approval_id, "approved", "http:api")
    done = runner.run(j, "w2@h:2", claim(r, j, worker="w2@h:2"))
    assert isinstance(done, SubagentReport), done
    assert (done.status, done.output, done.worker) == ("completed", "built elsewhere", "w2@h:2")
    assert ran == [{"cmd": "make"}]
