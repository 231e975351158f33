"""A SIGKILLed worker's turns resume on another worker within seconds, at the DEFAULT 30 s lease:
the reaper notices the dead process from its missed heartbeats, not from a lapsed lease, and
runs the recovery in its own process, so it does not queue behind a saturated worker's slots.

Two real ``celery worker`` processes of four slots each; the last test fills every slot with
slow turns before the kill, so it runs last (its slow turns hold the workers until teardown).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fermix_dev.procs import Managed, stop_all, wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared.settings import Settings
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import events, start, terminal_events, turn_calls, uniq, wait

# Issue 13: a dead worker's turns resume within this, under load too.
RESUME_BOUND_S = 10.0
SLOTS = 4


@pytest.fixture(scope="module")
def fleet(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    # No FERMIX_LEASE_SECONDS: the default lease, the one production runs with.
    assert Settings().lease_seconds == 30.0
    env = provider_env(llm, "openai")
    s = start_stack("reaper", redis_url, 9, env, logs_dir, workers=0)
    try:
        yield s
    finally:
        # Its workers are left holding 40 s model calls nobody waits for: a warm shutdown
        # would only run out the stack's 10 s grace before the SIGKILL.
        stop_all(list(reversed(s.procs)), grace=1.0)


@pytest.fixture
def two_workers(fleet: Stack) -> Stack:
    """Both workers up (a test that failed may have left one killed)."""
    names = {w.name for w in fleet.workers}
    for w in [fleet.spawn_worker(n, SLOTS) for n in ("reaper-w1", "reaper-w2") if n not in names]:
        fleet.wait_for_worker(w)
    return fleet


def calls_for(llm: ScriptedLLMServer, text: str) -> int:
    """Model calls whose last user message is ``text``."""
    def last_user(req: dict[str, Any]) -> str:
        users = [m for m in req["body"]["messages"] if m["role"] == "user"]
        return str(users[-1]["content"]) if users else ""

    return sum(1 for r in turn_calls(llm.script.requests) if last_user(r) == text)


def script_interrupted_turn(llm: ScriptedLLMServer, task: str) -> None:
    """A tool call, then a model call the worker dies in, then the resumed answer."""
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})], match=task),
        Reply(text="never delivered", delay=120, match=task),
        Reply(text=f"42, resumed: {task}", match=task),
    )


def assert_resumed_once(http: httpx.Client, fleet: Stack, llm: ScriptedLLMServer,
                        run_id: str, task: str, victim: Managed) -> None:
    done = http.get(f"/v1/runs/{run_id}").json()
    assert done["status"] == "ok" and done["reply"] == f"42, resumed: {task}"
    assert done["worker"].split("@")[0] != victim.name
    assert len(terminal_events(fleet.redis(), run_id)) == 1
    evs = events(http, run_id)
    assert [d["phase"] for e, d in evs if e == "tool" and d["name"] == "calculator"] == [
        "start", "result"]
    assert [d.get("resumed") for e, d in evs if e == "lifecycle" and d["phase"] == "start"] == [
        False, True]
    assert calls_for(llm, task) == 3


def test_a_killed_workers_turn_resumes_within_seconds_at_the_default_lease(
    two_workers: Stack, llm: ScriptedLLMServer
) -> None:
    fleet = two_workers
    task = uniq("task")
    script_interrupted_turn(llm, task)
    with fleet.http() as http:
        run_id = start(http, task, uniq("chat"))
        wait_until(lambda: calls_for(llm, task) >= 2, 30, "the slow model call")
        killed_at = time.monotonic()
        victim = fleet.kill_holder(http, run_id)
        wait(http, run_id, timeout=45)
        took = time.monotonic() - killed_at
        print(f"kill -> answered: {took:.1f} s")
        assert took < RESUME_BOUND_S, f"resumed {took:.1f} s after the kill"
        assert_resumed_once(http, fleet, llm, run_id, task, victim)


def test_a_killed_workers_turn_resumes_within_seconds_while_the_survivor_is_saturated(
    two_workers: Stack, llm: ScriptedLLMServer
) -> None:
    fleet = two_workers
    # Seven slow turns and the victim's turn fill both workers' eight slots; four more slow
    # turns wait in the broker. A recovery that waited for a free slot would wait ~40 s.
    load = [uniq("load") for _ in range(2 * SLOTS - 1 + SLOTS)]
    for text in load:
        llm.script.push(Reply(text="slow", delay=40, match=text))
    task = uniq("task")
    script_interrupted_turn(llm, task)
    with fleet.http() as http:
        for text in load[: 2 * SLOTS - 1]:
            start(http, text, uniq("chat"))
        wait_until(lambda: sum(calls_for(llm, t) for t in load) >= 2 * SLOTS - 1, 30,
                   "seven slow turns in their model calls")
        run_id = start(http, task, uniq("chat"))
        wait_until(lambda: calls_for(llm, task) >= 2, 30, "the victim's slow model call")
        for text in load[2 * SLOTS - 1:]:
            start(http, text, uniq("chat"))
        killed_at = time.monotonic()
        victim = fleet.kill_holder(http, run_id)
        wait(http, run_id, timeout=60)
        took = time.monotonic() - killed_at
        print(f"kill -> answered under load: {took:.1f} s")
        assert took < RESUME_BOUND_S, f"resumed {took:.1f} s after the kill, under load"
        assert_resumed_once(http, fleet, llm, run_id, task, victim)
