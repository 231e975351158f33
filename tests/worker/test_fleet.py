"""The conversation queue across a fleet: a gateway and two real `celery worker` processes.

Leases are short here (4 s) so that recovery from a killed worker is quick to observe; the
rules are the same at the default 30 s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from fermix_worker.turn import STOPPED_MARKER
from fermix_worker.turn.reply import EMPTY_COMPLETION
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import (
    events,
    first_event,
    max_overlap,
    post,
    start,
    terminal_events,
    turn_calls,
    uniq,
    wait,
)

LEASE = 4.0


@pytest.fixture(scope="module")
def fleet(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_LEASE_SECONDS": str(LEASE),
           "FERMIX_CANCEL_POLL_SECONDS": "0.2", "FERMIX_BROKER_VISIBILITY_TIMEOUT": "3"}
    s = start_stack("fleet", redis_url, 5, env, logs_dir, workers=2)
    yield s
    s.stop()


def history(stack: Stack, chat: str) -> list[ChatMessage]:
    raw = stack.redis().lrange(keys.history(f"http|{chat}|root"), 0, -1)
    return [ChatMessage.model_validate_json(x) for x in raw]  # type: ignore[union-attr]


def turn_requests(llm: ScriptedLLMServer, text: str) -> list[dict]:
    """The model calls made by the turn whose user message is ``text``."""
    def last_user(req: dict) -> str:
        users = [m for m in req["body"]["messages"] if m["role"] == "user"]
        return str(users[-1]["content"]) if users else ""

    return [r for r in turn_calls(llm.script.requests) if last_user(r) == text]


def requests_for(llm: ScriptedLLMServer, text: str) -> list[dict]:
    return [r for r in turn_calls(llm.script.requests) if text in json.dumps(r["body"])]


def test_five_messages_to_one_chat_run_in_order_without_overlapping(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    chat = uniq("chat")
    texts = [uniq(f"m{i}") for i in range(5)]
    for t in texts:
        llm.script.push(Reply(text=f"answer to {t}", delay=0.3, match=t))
    with fleet.http() as http:
        run_ids = [start(http, t, chat) for t in texts]
        runs = [wait(http, rid) for rid in run_ids]
    assert [r["reply"] for r in runs] == [f"answer to {t}" for t in texts]
    for before, after in zip(runs, runs[1:], strict=False):
        assert after["startedAt"] >= before["endedAt"], "turns of one chat must not overlap"
    users = [m.content for m in history(fleet, chat) if m.role == "user"]
    assert users == texts


def test_eight_chats_run_in_parallel(fleet: Stack, llm: ScriptedLLMServer) -> None:
    texts = [uniq(f"par{i}") for i in range(8)]
    for t in texts:
        llm.script.push(Reply(text="done", delay=1.5, match=t))
    with fleet.http() as http:
        run_ids = [start(http, t, uniq("chat")) for t in texts]
        runs = [wait(http, rid) for rid in run_ids]
    assert all(r["status"] == "ok" for r in runs)
    overlap = max_overlap([(r["startedAt"], r["endedAt"]) for r in runs])
    assert overlap >= 6, f"only {overlap} of 8 chats ran at once"
    assert len({r["conversation"]["chatId"] for r in runs}) == 8


def test_a_long_turn_is_not_run_twice_by_a_broker_redelivery(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    # The broker redelivers unacked tasks after 3 s here; this turn takes 6 s.
    text = uniq("long")
    llm.script.push(Reply(text="slow but once", delay=6, match=text))
    with fleet.http() as http:
        run_id = start(http, text, uniq("chat"))
        run = wait(http, run_id)
    assert run["status"] == "ok" and run["reply"] == "slow but once"
    assert len(requests_for(llm, text)) == 1
    assert len(terminal_events(fleet.redis(), run_id)) == 1


def wait_for_request(llm: ScriptedLLMServer, text: str, count: int, timeout: float = 30) -> None:
    """Until the scripted LLM has received ``count`` calls for ``text`` (a readiness probe)."""
    wait_until(lambda: len(requests_for(llm, text)) >= count, timeout, f"{count} calls for {text}")


def test_a_worker_killed_mid_turn_is_resumed_elsewhere_and_answers_once(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    chat, task, after = uniq("chat"), uniq("task"), uniq("after")
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})], match=task),
        Reply(text="never delivered", delay=60, match=task),  # the worker dies in this call
        Reply(text="6*7 is 42, from the checkpoint", match=task),
        Reply(text="the chat goes on", match=after),
    )
    with fleet.http() as http:
        task_id = start(http, task, chat)
        after_id = start(http, after, chat)
        wait_for_request(llm, task, 2)  # the slow continuation is in flight
        killed_at = time.monotonic()
        victim = fleet.kill_holder(http, task_id)
        done = wait(http, task_id, timeout=45)
        assert time.monotonic() - killed_at < 45
        assert done["status"] == "ok" and done["reply"] == "6*7 is 42, from the checkpoint"
        assert done["worker"].split("@")[0] != victim.name
        assert wait(http, after_id)["reply"] == "the chat goes on"
        evs = events(http, task_id)
    # One outcome; the tool ran once (its result was checkpointed); the resumed call is the
    # third and last the model saw for this turn.
    assert len(terminal_events(fleet.redis(), task_id)) == 1
    assert [d["phase"] for e, d in evs if e == "tool" and d["name"] == "calculator"] == ["start", "result"]
    assert [d.get("resumed") for e, d in evs if e == "lifecycle" and d["phase"] == "start"] == [False, True]
    assert len(turn_requests(llm, task)) == 3
    replies = [m.content for m in history(fleet, chat) if m.role == "assistant" and m.content]
    assert replies.count("6*7 is 42, from the checkpoint") == 1
    fleet.start_worker(victim.name)


def test_stop_mid_stream_delivers_nothing_and_clears_the_queue(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    chat, long, q1, q2, later = (uniq(x) for x in ("chat", "long", "q1", "q2", "later"))
    llm.script.push(Reply(text="word " * 200, chunk_delay=0.05, match=long))
    with fleet.http() as http:
        long_id = start(http, long, chat)
        queued = [start(http, q1, chat), start(http, q2, chat)]
        first_event(http, long_id, "assistant")  # it is streaming now
        stop_id = start(http, "/stop", chat)
        stop = wait(http, stop_id)
        assert stop["status"] == "ok"
        assert stop["reply"] == "Stopped the current request and cleared 2 queued messages."
        stopped = wait(http, long_id, timeout=10)
        assert stopped["status"] == "stopped" and "reply" not in stopped
        for rid in queued:
            assert wait(http, rid)["status"] == "stopped"
        # A message after /stop runs normally, and sees the marker instead of a reply.
        assert wait(http, start(http, later, chat))["status"] == "ok"
    msgs = history(fleet, chat)
    assert [m.content for m in msgs[:2]] == [long, STOPPED_MARKER]
    assert [m.content for m in msgs if m.role == "user"] == [long, later]
    assert len(terminal_events(fleet.redis(), long_id)) == 1


def test_stop_with_nothing_running(fleet: Stack) -> None:
    with fleet.http() as http:
        assert wait(http, start(http, "/stop", uniq("chat")))["reply"] == "Nothing to stop."


def test_an_empty_completion_is_answered_but_never_committed(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    chat, text = uniq("chat"), uniq("empty")
    llm.script.push(Reply(text="", match=text))
    with fleet.http() as http:
        run = wait(http, start(http, text, chat))
    assert run["status"] == "ok" and run["reply"] == EMPTY_COMPLETION
    assert [m.role for m in history(fleet, chat)] == ["user"]


def test_reject_mode_refuses_with_409_while_busy(fleet: Stack, llm: ScriptedLLMServer) -> None:
    chat, slow = uniq("chat"), uniq("slow")
    llm.script.push(Reply(text="ok", delay=1.5, match=slow))
    with fleet.http() as http:
        assert wait(http, start(http, "/queue reject", chat))["reply"] == "Queue mode set to reject."
        run_id = start(http, slow, chat)
        refused = post(http, "another", chat)
        assert refused.status_code == 409 and "reject" in refused.json()["error"]
        assert wait(http, run_id)["status"] == "ok"
        assert wait(http, start(http, uniq("free"), chat))["status"] == "ok"


def test_collect_mode_merges_pending_messages_into_one_turn(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    chat, slow, a, b = uniq("chat"), uniq("slow"), uniq("a"), uniq("b")
    llm.script.push(Reply(text="first", delay=1.5, match=slow))
    with fleet.http() as http:
        start(http, "/queue collect", chat)
        slow_id = start(http, slow, chat)
        first_event(http, slow_id, "lifecycle")
        a_id, b_id = start(http, a, chat), start(http, b, chat)
        ra, rb = wait(http, a_id), wait(http, b_id)
    assert ra["status"] == rb["status"] == "ok" and ra["reply"] == rb["reply"]
    assert rb["mergedInto"] == a_id
    (req,) = requests_for(llm, b)
    assert req["body"]["messages"][-1]["content"] == f"{a}\n\n{b}"


def test_steer_mode_injects_into_the_running_turn(fleet: Stack, llm: ScriptedLLMServer) -> None:
    chat, task, nudge = uniq("chat"), uniq("task"), uniq("nudge")
    llm.script.push(Reply(tool_calls=[ToolCallSpec("calculator", {"expression": "1+1"})],
                          delay=1.5, match=task))
    with fleet.http() as http:
        start(http, "/queue steer", chat)
        task_id = start(http, task, chat)
        first_event(http, task_id, "lifecycle")
        nudge_id = start(http, nudge, chat)
        rt, rn = wait(http, task_id), wait(http, nudge_id)
    assert rt["status"] == "ok" and rn["mergedInto"] == task_id and rn["reply"] == rt["reply"]
    # The model's second call saw the tool result and then the steering message.
    second = requests_for(llm, nudge)[0]["body"]["messages"]
    assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "user"]
    assert second[-1]["content"] == nudge


def test_interrupt_mode_stops_the_active_turn_and_runs_the_newest(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    chat, slow, newest = uniq("chat"), uniq("slow"), uniq("newest")
    llm.script.push(Reply(text="word " * 200, chunk_delay=0.05, match=slow))
    with fleet.http() as http:
        start(http, "/queue interrupt", chat)
        slow_id = start(http, slow, chat)
        first_event(http, slow_id, "assistant")
        new_id = start(http, newest, chat)
        assert wait(http, slow_id)["status"] == "stopped"
        assert wait(http, new_id)["status"] == "ok"


def test_the_same_message_id_runs_one_turn_across_the_fleet(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    chat, text = uniq("chat"), uniq("retry")
    with fleet.http() as http:
        first = post(http, text, chat, messageId="platform-42").json()
        again = [post(http, text, chat, messageId="platform-42").json() for _ in range(3)]
        assert {a["runId"] for a in again} == {first["runId"]}
        assert all(a["duplicate"] for a in again)
        assert wait(http, first["runId"])["status"] == "ok"
    assert len([q for q in llm.script.requests if q["body"]["messages"][-1]["content"] == text]) == 1
    assert [m.content for m in history(fleet, chat) if m.role == "user"] == [text]
