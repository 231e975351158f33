"""One subagent on a real Redis: the fan-out's semaphore, the watch that stops a subagent
(/stop, its deadline), and SubagentRunner in-process against the scripted LLM."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.errors import TurnCancelled
from fermix_shared.settings import Settings
from fermix_worker.subagents.prompts import NESTED_CALL_ERROR, SUBAGENT_SYSTEM_PROMPT
from fermix_worker.subagents.results import SubagentReport
from fermix_worker.subagents.runner import NoSlot, SubagentJob, SubagentRunner
from fermix_worker.subagents.semaphore import FanOutSemaphore
from fermix_worker.subagents.tool import SUBAGENTS_TOOL
from fermix_worker.subagents.watch import SubagentTimedOut, SubagentWatch
from fermix_worker.tools import BUILTIN_TOOLS
from fermix_worker.tools.policy import ALL_POLICIES

# --- Redis: the semaphore and the watch -------------------------------------------------


def test_the_semaphore_caps_holders_and_frees_lapsed_slots(r: redis.Redis) -> None:
    sem = FanOutSemaphore(r, uuid.uuid4().hex, limit=2, ttl_s=60, lease_s=0.3)
    assert sem.acquire("0") and sem.acquire("1")
    assert not sem.acquire("2")
    assert sem.acquire("1")  # a holder asking again (a redelivered task) keeps its slot
    sem.release("0")
    assert sem.acquire("2") and not sem.acquire("3")
    assert sorted(sem.holders()) == ["1", "2"]
    time.sleep(0.4)  # nobody renewed: both holders died
    assert not sem.renew("1")
    assert sem.acquire("3") and sem.acquire("4")
    assert sem.renew("3")
    assert 0 < r.pttl(keys.fanout_slots(sem._key.split(":")[2])) <= 60_000


def _parent(r: redis.Redis, run_id: str, **fields: str) -> str:
    conv = f"http|{uuid.uuid4().hex}|root"
    r.hset(keys.active(conv), mapping={"turn_id": run_id, "worker": f"parked:{run_id}", **fields})
    r.expire(keys.active(conv), 60)
    return conv


def test_the_watch_cancels_on_stop_and_times_out(r: redis.Redis) -> None:
    conv = _parent(r, "run_p")
    sem = FanOutSemaphore(r, uuid.uuid4().hex, limit=1, ttl_s=60)
    sem.acquire("0")
    with SubagentWatch(r, conv, "run_p", time.monotonic() + 30, slots=sem, holder="0",
                       poll_s=0.05) as watch:
        watch.check()
        r.hset(keys.active(conv), "cancelled", "stop")
        time.sleep(0.3)
        with pytest.raises(TurnCancelled):
            watch.check()
    with SubagentWatch(r, _parent(r, "run_q"), "run_q", time.monotonic() + 0.1, slots=sem,
                       holder="0", poll_s=0.05) as watch:
        time.sleep(0.2)
        with pytest.raises(SubagentTimedOut):
            watch.check()


# --- one subagent, in-process, against the scripted LLM ---------------------------------


@pytest.fixture
def runner(r: redis.Redis, llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch) -> SubagentRunner:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    settings = Settings(provider="openai", model="scripted-openai", cancel_poll_seconds=0.05)
    return SubagentRunner(r, settings, [*BUILTIN_TOOLS, SUBAGENTS_TOOL], slot_wait_s=0.2)


def job(conv: str, task: str, **kw: Any) -> SubagentJob:
    base: dict[str, Any] = dict(
        fanout_id=uuid.uuid4().hex, index=0, task=task, conv=conv, parent_run="run_p",
        trust="operator", profile="default", result_format="concise", parent_model="m",
        parent_tools=None, parent_policies=sorted(ALL_POLICIES),
        concurrency=1, timeout_s=30, deadline_at=time.time() + 30, slots_ttl_s=60)
    return SubagentJob(**{**base, **kw})


def test_a_subagent_runs_its_loop_and_cannot_fan_out(
    r: redis.Redis, llm: ScriptedLLMServer, runner: SubagentRunner
) -> None:
    task = f"task-{uuid.uuid4().hex[:8]}"
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("subagents", {"tasks": ["deeper"]})], match=task),
        Reply(text="the answer", match=task),
    )
    out = runner.run(job(_parent(r, "run_p"), task), "w1")
    assert isinstance(out, SubagentReport)
    assert (out.status, out.output, out.iterations) == ("completed", "the answer", 2)
    first, second = [q["body"] for q in llm.script.requests if task in json.dumps(q["body"])]
    assert first["messages"][0]["content"].startswith(SUBAGENT_SYSTEM_PROMPT)
    assert "subagents" not in [t["function"]["name"] for t in first.get("tools", [])]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": second["messages"][-2][
        "tool_calls"][0]["id"], "content": NESTED_CALL_ERROR}


def test_a_waiting_subagent_takes_a_released_slot_at_once(
    r: redis.Redis, llm: ScriptedLLMServer, runner: SubagentRunner
) -> None:
    task = f"task-{uuid.uuid4().hex[:8]}"
    llm.script.push(Reply(text="done", match=task))
    j = job(_parent(r, "run_p"), task)
    slots = FanOutSemaphore(r, j.fanout_id, 1, 60)
    assert slots.acquire("other")
    released: list[float] = []

    def release_later() -> None:
        time.sleep(0.3)  # the other subagent's work, as the waiter sees it
        released.append(time.time())
        slots.release("other")

    threading.Thread(target=release_later).start()
    patient = SubagentRunner(r, Settings(provider="openai", model="scripted-openai",
                                         cancel_poll_seconds=0.05), BUILTIN_TOOLS, slot_wait_s=5)
    out = patient.run(j, "w1")
    assert isinstance(out, SubagentReport) and out.status == "completed"
    assert out.started_at is not None
    # Taken on the release's wake-up, not on a retry through the broker (0.4-0.6 s later).
    assert 0 <= out.started_at - released[0] < 0.1, out.started_at - released[0]


def test_a_subagent_without_a_slot_waits_and_a_stopped_parent_cancels_it(
    r: redis.Redis, runner: SubagentRunner
) -> None:
    conv = _parent(r, "run_p")
    j = job(conv, "anything")
    FanOutSemaphore(r, j.fanout_id, 1, 60).acquire("other")
    began = time.monotonic()
    assert isinstance(runner.run(j, "w1"), NoSlot)  # after its bounded wait (0.2 s here)
    assert 0.2 <= time.monotonic() - began < 1.5
    r.hset(keys.active(conv), "cancelled", "stop")
    out = runner.run(j, "w1")
    assert isinstance(out, SubagentReport) and out.status == "cancelled"
    late = runner.run(job(_parent(r, "run_p"), "x", deadline_at=time.time() - 1), "w1")
    assert isinstance(late, SubagentReport) and late.status == "timed_out"
