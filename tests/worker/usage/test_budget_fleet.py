"""Budgets and usage across real processes (gateway and worker, the scripted LLM's reported
tokens, a price override so every cost is exact): a daily USD limit lets turns through, warns
once at 80 %, then refuses the next turn with the seed-style reply, the message kept; and a
fan-out's subagent calls are charged to the parent's conversation, agent and user."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec, Usage
from fermix_shared.stores import history
from fermix_worker.turn.close import FAILED_MARKER
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import events, post, uniq, wait

# 1 input token = $0.001, 1 output token = $0.002.
PRICES = {"scripted-openai": {"input": 1000, "output": 2000}}
NO_FACTS = '{"add": [], "replace": [], "archive": []}'


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_PRICES": json.dumps(PRICES),
           # The memory review runs as soon as the conversation is quiet (one reaper scan).
           "FERMIX_MEMORY_REVIEW_QUIET_SECONDS": "0",
           "FERMIX_AGENTS": json.dumps([{"name": "ops"}])}
    s = start_stack("budget", redis_url, 8, env, logs_dir, workers=1)
    yield s
    s.stop()


def answer(llm: ScriptedLLMServer, text: str, reply: str, usage: Usage) -> None:
    """The turn for ``text`` answers ``reply`` with ``usage``; its memory review (a background
    call after an operator's turn, which quotes the exchange) costs nothing, so totals are
    exact whenever it runs."""
    llm.script.push(Reply(reply, match=text, usage=usage),
                    Reply(NO_FACTS, match=f"user: {text}", usage=Usage(0, 0)))


def run(http: httpx.Client, text: str, chat: str, **extra: Any) -> dict[str, Any]:
    resp = post(http, text, chat, **extra)
    assert resp.status_code == 202, resp.text
    return wait(http, resp.json()["runId"])


def budget_events(http: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    return [d for e, d in events(http, run_id) if e == "diagnostic" and d.get("kind") == "budget"]


def usage(http: httpx.Client, scope: str) -> dict[str, Any]:
    day: dict[str, Any] = http.get("/v1/usage", params={"scope": scope, "period": "day"}
                                   ).json()["periods"]["day"]
    return day


def test_a_daily_budget_warns_at_80_percent_then_refuses_the_next_turn(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    chat = uniq("budget")
    one, two, three = uniq("one"), uniq("two"), uniq("three")
    answer(llm, one, "first answer", Usage(1000, 500))  # $2.00
    answer(llm, two, "second answer", Usage(1000, 500))
    with stack.http() as http:
        set_ = http.put("/v1/budgets", json={"scope": "agent:ops", "period": "day", "usd": 2.4})
        assert set_.status_code == 200, set_.text

        first = run(http, one, chat, agent="ops")
        assert (first["status"], first["reply"]) == ("ok", "first answer")
        assert budget_events(http, first["runId"]) == [{
            "kind": "budget", "phase": "warning", "scope": "agent:ops", "period": "day",
            "percent": 83.3,
            "text": "Heads up: this agent has used 83% of its daily budget ($2.00 of $2.40). "
                    "Once it is reached, new requests are refused until it resets at 00:00 UTC.",
        }]
        # Under the limit when it starts, the second turn runs (and is not cut off): warned once.
        second = run(http, two, chat, agent="ops")
        assert (second["status"], second["reply"]) == ("ok", "second answer")
        assert budget_events(http, second["runId"]) == []

        third = run(http, three, chat, agent="ops")
        refusal = ("This agent has reached its daily budget ($4.00 of $2.40 spent); "
                   "it resets at 00:00 UTC.")
        assert (third["status"], third["error"]) == ("error", refusal)
        assert [e["phase"] for e in budget_events(http, third["runId"])] == ["refused"]
        assert [m.content for m in history.load(stack.redis(), f"http|{chat}|root", 100)] == [
            one, "first answer", two, "second answer", three, FAILED_MARKER]
        assert not [r for r in llm.script.requests if three in json.dumps(r["body"])]

        spent = usage(http, "agent:ops")
        assert (spent["inputTokens"], spent["outputTokens"], spent["usdMicros"]) == (
            2000, 1000, 4_000_000)
        (status,) = [b for b in http.get("/v1/status").json()["budgets"]
                     if b["scope"] == "agent:ops"]
        assert (status["percent"], status["reached"], status["spent"]["usd"]) == (
            166.7, True, 4.0)
        # Another agent is not held back by this one's budget.
        other = uniq("other")
        answer(llm, other, "still here", Usage(10, 10))
        assert run(http, other, uniq("budget"))["reply"] == "still here"


def test_a_fanouts_subagent_calls_are_charged_to_the_parent(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    chat, user = uniq("fan"), uniq("fanout")
    task_a, task_b = uniq("sliceA"), uniq("sliceB")
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("subagents", {"tasks": [task_a, task_b]})], match=user,
              usage=Usage(100, 10)),
        Reply("found a", match=task_a, usage=Usage(200, 20)),
        Reply("found b", match=task_b, usage=Usage(300, 30)),
        Reply("synthesized", match=user, usage=Usage(400, 40)),
        Reply(NO_FACTS, match=f"user: {user}", usage=Usage(0, 0)),
    )
    with stack.http() as http:
        before = usage(http, "agent:default")
        done = run(http, user, chat)
        assert (done["status"], done["reply"]) == ("ok", "synthesized")
        # 100+200+300+400 in, 10+20+30+40 out: the parent's two calls and both subagents'.
        expected = {"inputTokens": 1000, "outputTokens": 100, "usdMicros": 1_200_000}
        for scope in (f"conversation:http|{chat}|root", f"user:http:{chat}"):
            spent = usage(http, scope)
            assert {k: spent[k] for k in expected} == expected, scope
        after = usage(http, "agent:default")
        assert {k: after[k] - before[k] for k in expected} == expected
        # Four calls of the turn, then its memory review (charged the same way, at $0 here).
        wait_until(lambda: usage(http, f"conversation:http|{chat}|root")["calls"] == 5, 30,
                   "the memory review's call")
