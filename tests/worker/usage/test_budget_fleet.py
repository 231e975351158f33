"""Budgets and usage across real processes (gateway and two workers, the scripted LLM's
reported tokens, a price override so every cost is exact): a daily USD limit lets turns
through, warns once at 80 %, stops a turn whose next call does not fit, refuses new turns once
reached, the message kept; twenty turns racing over both workers for a budget that fits five
calls make five; a fan-out's subagent calls are charged to the parent's conversation,
agent and user; a catalogue model's cached input is billed at its cached rate; a compaction's
and a memory review's calls are charged to their conversation and agent and tallied apart by
kind; and an agent's token-rate breaker stops a tool loop mid-turn."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec, Usage
from fermix_shared.stores import history
from fermix_worker.compaction.summary import SUMMARY_INSTRUCTION
from fermix_worker.turn.close import FAILED_MARKER
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import events, post, uniq, wait

# 1 input token = $0.001, 1 output token = $0.002.
PRICES = {"scripted-openai": {"input": 1000, "output": 2000},
          # The racers' model: input free, so a call's worst case is max_tokens' price alone.
          "race-model": {"input": 0, "output": 2000}}
MAX_TOKENS = 100
RATE = 9_000  # the burst agent's tokens a minute
NO_FACTS = '{"add": [], "replace": [], "archive": []}'


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_PRICES": json.dumps(PRICES),
           # The memory review runs as soon as the conversation is quiet (one reaper scan).
           "FERMIX_MEMORY_REVIEW_QUIET_SECONDS": "0",
           "FERMIX_MAX_TOKENS": str(MAX_TOKENS),
           # /compact has a turn to fold in a two-turn conversation.
           "FERMIX_COMPACTION__KEEP_TURNS": "1",
           "FERMIX_AGENTS": json.dumps([
               {"name": "ops"}, {"name": "racer", "model": "race-model"},
               # No override: priced from the catalogue (genai-prices).
               {"name": "tally", "model": "gpt-4.1-mini"},
               {"name": "burst", "tokens_per_minute": RATE},
               {"name": "fanner", "model": "race-model"}])}
    s = start_stack("budget", redis_url, 8, env, logs_dir, workers=2)
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


def test_a_daily_budget_warns_past_80_percent_stops_what_does_not_fit_then_refuses(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    chat = uniq("budget")
    one, two, three = uniq("one"), uniq("two"), uniq("three")
    answer(llm, one, "first answer", Usage(10_000, 5_000))  # $20.00
    answer(llm, two, "second answer", Usage(10_000, 5_000))
    with stack.http() as http:
        set_ = http.put("/v1/budgets", json={"scope": "agent:ops", "period": "day", "usd": 22})
        assert set_.status_code == 200, set_.text

        first = run(http, one, chat, agent="ops")
        assert (first["status"], first.get("reply")) == ("ok", "first answer")
        assert budget_events(http, first["runId"]) == [{
            "kind": "budget", "phase": "warning", "scope": "agent:ops", "period": "day",
            "percent": 90.9,
            "text": "Heads up: this agent has used 90% of its daily budget ($20.00 of $22.00). "
                    "Once it is reached, new requests are refused until it resets at 00:00 UTC.",
        }]
        # Under the limit, but its call's worst case (the prompt, ~2,300 tokens at $0.001, plus
        # 100 output tokens at $0.002) does not fit the $2.00 left: not made, the turn stopped.
        second = run(http, two, chat, agent="ops")
        assert second["status"] == "error"
        assert second["error"].startswith("I stopped here: the next step could take up to $")
        assert second["error"].endswith(
            ", more than is left of this agent's daily budget ($20.00 of $22.00 spent); it "
            "resets at 00:00 UTC.")
        assert not [r for r in llm.script.requests
                    if two in json.dumps(r["body"]) and "messages" in r["body"]
                    and "user: " not in json.dumps(r["body"])]

        # Reached (the limit lowered to what was spent): new turns are refused at the door.
        assert http.put("/v1/budgets", json={"scope": "agent:ops", "period": "day",
                                             "usd": 20}).status_code == 200
        third = run(http, three, chat, agent="ops")
        refusal = ("This agent has reached its daily budget ($20.00 of $20.00 spent); "
                   "it resets at 00:00 UTC.")
        assert (third["status"], third["error"]) == ("error", refusal)
        assert [e["phase"] for e in budget_events(http, third["runId"])] == ["refused"]
        assert [m.content for m in history.load(stack.redis(), f"http|{chat}|root", 100)] == [
            one, "first answer", two, FAILED_MARKER, three, FAILED_MARKER]
        assert not [r for r in llm.script.requests if three in json.dumps(r["body"])]

        spent = usage(http, "agent:ops")
        assert (spent["inputTokens"], spent["outputTokens"], spent["usdMicros"]) == (
            10_000, 5_000, 20_000_000)
        (status,) = [b for b in http.get("/v1/status").json()["budgets"]
                     if b["scope"] == "agent:ops"]
        assert (status["percent"], status["reached"], status["spent"]["usd"]) == (
            100.0, True, 20.0)
        # Another agent is not held back by this one's budget.
        other = uniq("other")
        answer(llm, other, "still here", Usage(10, 10))
        assert run(http, other, uniq("budget"))["reply"] == "still here"


def test_twenty_turns_racing_over_two_workers_for_a_budget_that_fits_five_calls_make_five(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    # Each call's worst case is its 100 output tokens at $0.002 ($0.20), and each costs that:
    # $1.00 fits five calls, whichever worker makes them and in whatever order.
    texts = [uniq("race") for _ in range(20)]
    for text in texts:
        llm.script.push(Reply("won", match=text, delay=0.3, usage=Usage(50, MAX_TOKENS)),
                        Reply(NO_FACTS, match=f"user: {text}", usage=Usage(0, 0)))
    with stack.http() as http:
        assert http.put("/v1/budgets", json={"scope": "agent:racer", "period": "day",
                                             "usd": 1.0}).status_code == 200
        started = [post(http, text, uniq("racer"), agent="racer") for text in texts]
        assert all(s.status_code == 202 for s in started)
        done = [wait(http, s.json()["runId"]) for s in started]
        calls = [r for r in llm.script.requests if r["body"].get("model") == "race-model"
                 and any(t in json.dumps(r["body"]) for t in texts)
                 and "user: " not in json.dumps(r["body"])]
        assert len(calls) == 5
        assert sorted(d["status"] for d in done) == ["error"] * 15 + ["ok"] * 5
        spent = usage(http, "agent:racer")
        assert (spent["calls"], spent["usdMicros"]) == (5, 1_000_000)
        assert stack.redis().hlen("fx:usage:reservations") == 0  # nothing left reserved


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


def test_a_fanout_stops_at_its_conversations_cap_with_its_subagents_and_nothing_held(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    # Every call costs its worst case, $0.20 (100 output tokens of race-model); the
    # conversation's $0.80 fits four: the parent's fan-out call and three subagent steps, of
    # the sixteen the four subagents' tool loops would make. Then the subagents' calls are
    # refused, and so is the parent's synthesis: the turn ends at the cap.
    chat, user = uniq("capfan"), uniq("capfan")
    tasks = [uniq(f"slice{i}") for i in range(4)]
    step = Usage(50, MAX_TOKENS)
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("subagents", {"tasks": tasks, "model": "race-model"})],
              match=user, usage=step),
        *[Reply(tool_calls=[ToolCallSpec("calculator", {"expression": f"{i}*3"})], match=task,
                usage=step) for task in tasks for i in range(3)],
        *[Reply("found", match=task, usage=step) for task in tasks],
        Reply("synthesized", match=user, usage=step))
    with stack.http() as http:
        conv = f"conversation:http|{chat}|root"
        assert http.put("/v1/budgets", json={"scope": conv, "period": "day",
                                             "usd": 0.8}).status_code == 200
        done = run(http, user, chat, agent="fanner")
        made = [q for q in llm.script.requests if any(
            t in json.dumps(q["body"]) for t in (user, *tasks))]
        assert len(made) == 4
        assert done["status"] == "error"
        assert done["error"].startswith("I stopped here: the next step could take up to $0.20, "
                                        "more than is left of this conversation's daily budget")
        spent = usage(http, conv)
        assert (spent["calls"], spent["usdMicros"]) == (4, 800_000)
        assert stack.redis().hlen("fx:usage:reservations") == 0


def kinds(http: httpx.Client) -> dict[str, dict[str, Any]]:
    body = http.get("/v1/usage", params={"by": "kind", "period": "day"}).json()
    return {k["kind"]: k for k in body["periods"]["day"]["kinds"]}


def calls_of(http: httpx.Client, chat: str, n: int) -> None:
    wait_until(lambda: usage(http, f"conversation:http|{chat}|root")["calls"] == n, 30,
               f"{n} calls charged to {chat}")


def test_cached_input_is_billed_at_the_catalogues_rate_and_unseen_work_is_charged_by_kind(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    with stack.http() as http:
        before = kinds(http)
        # gpt-4.1-mini, from the catalogue: $0.40 a million input tokens, $0.10 cached,
        # $1.60 output. 400 uncached + 600 cached + 100 out = $0.00038 (not $0.00056).
        chat, text = uniq("tally"), uniq("priced")
        llm.script.push(Reply("priced", match=text, usage=Usage(1000, 100, cache_read=600)),
                        Reply(NO_FACTS, match=f"user: {text}", usage=Usage(0, 0)))
        assert run(http, text, chat, agent="tally")["reply"] == "priced"
        calls_of(http, chat, 2)
        spent = usage(http, "agent:tally")
        assert (spent["usdMicros"], spent["inputTokens"], spent["cacheReadTokens"],
                spent["unpricedCalls"]) == (380, 1000, 600, 0)

        # Two turns, each with its memory review, then /compact: every call is charged to the
        # conversation and counted under what made it.
        chat = uniq("unseen")
        for i in (1, 2):
            text = uniq(f"unseen{i}")
            llm.script.push(Reply(f"answer {i}", match=text, usage=Usage(1000, 100)),  # $1.20
                            Reply(NO_FACTS, match=f"user: {text}", usage=Usage(300, 30)))
            assert run(http, text, chat)["reply"] == f"answer {i}"
            calls_of(http, chat, 2 * i)
        llm.script.push(Reply(uniq("SUMMARY"), match=SUMMARY_INSTRUCTION,
                              usage=Usage(2000, 200)))  # $2.40
        report = run(http, "/compact", chat)
        assert report["status"] == "ok", report
        calls_of(http, chat, 5)
        spent = usage(http, f"conversation:http|{chat}|root")
        assert (spent["inputTokens"], spent["outputTokens"], spent["usdMicros"]) == (
            4600, 460, 5_520_000)
        after = kinds(http)
        grew = {k: (after[k]["inputTokens"] - before[k]["inputTokens"],
                    after[k]["outputTokens"] - before[k]["outputTokens"])
                for k in ("turn", "memory_review", "compaction")}
        assert grew == {"turn": (3000, 300), "memory_review": (600, 60),
                        "compaction": (2000, 200)}


def test_a_tool_loop_past_its_agents_tokens_per_minute_is_stopped_mid_turn(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    # The minute is the breaker's window: start with room left in it for the whole turn.
    if time.time() % 60 > 45:
        time.sleep(60 - time.time() % 60)
    chat, text = uniq("burst"), uniq("loop")
    # Each step reports 4,000 prompt tokens. The first call takes an empty minute; the second's
    # worst case (~2,500 tokens estimated) fits 9,000 - 4,010; the third's does not.
    llm.script.push(Reply(NO_FACTS, match=f"user: {text}", usage=Usage(0, 0)),
                    *[Reply(tool_calls=[ToolCallSpec("calculator", {"expression": f"{i}*7"})],
                            match=text, usage=Usage(4000, 10)) for i in range(3)],
                    Reply("done", match=text, usage=Usage(4000, 10)))
    with stack.http() as http:
        done = run(http, text, chat, agent="burst")
        calls = [q for q in llm.script.requests if text in json.dumps(q["body"])
                 and "user: " not in json.dumps(q["body"])]
        assert len(calls) == 2
        assert done["status"] == "error"
        assert re.fullmatch(
            r"I stopped here: this agent is limited to 9,000 tokens a minute, 8,020 are taken "
            r"this minute and the next step could take up to [\d,]+ more; it frees up at "
            r"\d\d:\d\d:00 UTC \(in \d+ seconds?\)\.", done["error"]), done["error"]
        assert usage(http, "agent:burst")["tokens"] == 8_020
        assert stack.redis().hlen("fx:usage:reservations") == 0
