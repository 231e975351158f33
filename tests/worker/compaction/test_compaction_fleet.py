"""Compaction end to end: provider-reported prompt sizes trigger it, a model call summarizes,
notices reach the chat in the right order (Telegram fake), /compact reports, overflow recovers.

The model's window is 20,000 tokens here (FERMIX_CONTEXT_WINDOW, a model the catalog does not
know) so the seed's 0.85 threshold is 17,000 reported prompt tokens (the scripted model counts
the whole prompt as the APIs do, the workers' ~2,200 tokens of tool definitions included).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Fail, Reply, Usage
from fermix_shared import keys
from fermix_shared.memory import MemoryStore
from fermix_shared.messages import ChatMessage
from fermix_shared.stores import history
from fermix_worker.compaction import (
    CHECKPOINT_PREFIX,
    OVERFLOW_MESSAGE,
    POST_TURN_NOTICE,
    PREFLIGHT_NOTICE,
    SUMMARY_INSTRUCTION,
)
from tests.channels.test_channels_e2e import OWNER, TG_SECRET, post_tg, tg_update
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.telegram_api import FakeTelegram
from tests.fleet import events, start, turn_calls, uniq, wait
from tests.seed_text import quoted

BIG = Usage(input_tokens=18_000, output_tokens=10)


@pytest.fixture(scope="module")
def tg() -> Iterator[FakeTelegram]:
    with FakeTelegram() as fake:
        yield fake


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path, tg: FakeTelegram) -> Iterator[Stack]:
    env = {
        **provider_env(llm, "openai"),
        "FERMIX_CONTEXT_WINDOW": "20000",
        "FERMIX_COMPACTION__KEEP_TURNS": "2",
        "FERMIX_TELEGRAM_BOT_TOKEN": tg.token,
        "FERMIX_TELEGRAM_WEBHOOK_SECRET": TG_SECRET,
        "FERMIX_TELEGRAM_API_BASE": tg.url,
        "FERMIX_TELEGRAM_BOT_USERNAME": tg.bot_username,
        "FERMIX_OWNER_IDS": f"telegram:{OWNER}",
    }
    s = start_stack("compaction", redis_url, 0, env, logs_dir, workers=2)
    yield s
    s.stop()


def texts(tg: FakeTelegram, chat: int) -> list[str]:
    return [m["text"] for m in tg.sent() if m["chat_id"] == chat]


def idle(stack: Stack, conv: str) -> bool:
    r = stack.redis()
    return not r.exists(keys.active(conv)) and not r.llen(keys.inbox(conv))


def say(stack: Stack, tg: FakeTelegram, chat: int, text: str, expect: int) -> list[str]:
    """Send ``text`` to the bot and wait until ``expect`` messages reached the chat and the
    conversation is idle (readiness probes)."""
    assert post_tg(stack, tg_update(chat, OWNER, text)).status_code == 200
    wait_until(lambda: len(texts(tg, chat)) >= expect, 30, f"{expect} messages in {chat}")
    wait_until(lambda: idle(stack, f"telegram|{chat}|root"), 30, "idle")
    return texts(tg, chat)


def summaries(llm: ScriptedLLMServer) -> list[dict]:
    return [q for q in llm.script.requests if SUMMARY_INSTRUCTION in json.dumps(q["body"])]


def stored(stack: Stack, conv: str) -> list[ChatMessage]:
    return history.load_all(stack.redis(), conv)[1]


def test_a_turn_over_the_threshold_is_compacted_after_its_reply(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    chat, conv = 6001, "telegram|6001|root"
    m1, m2, m3, m4 = (uniq(f"m{i}") for i in range(1, 5))
    summary = uniq("NOTES")
    llm.script.push(Reply(text="third answer", usage=BIG, match=m3),
                    Reply(text=summary, match=SUMMARY_INSTRUCTION))
    say(stack, tg, chat, m1, 1)
    say(stack, tg, chat, m2, 2)
    shown = say(stack, tg, chat, m3, 4)
    assert shown[2:] == ["third answer", POST_TURN_NOTICE], "the notice comes after the reply"
    hist = stored(stack, conv)
    assert hist[0].content == CHECKPOINT_PREFIX + summary
    assert m1 not in json.dumps([m.model_dump() for m in hist])
    say(stack, tg, chat, m4, 5)
    (req,) = [q for q in turn_calls(llm.script.requests)
              if q["body"]["messages"][-1]["content"] == m4]
    body = json.dumps(req["body"])
    assert summary in body and m1 not in body and m2 in body
    assert len(req["body"]["messages"]) < 2 + 2 * 4  # system + checkpoint + recent, not all


def test_the_post_turn_compaction_streams_on_the_turns_own_run_after_its_end(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    # Fased: "Auto-compaction emits `compaction` stream events"; here on the stream of the
    # turn that crossed the threshold, announced before its lifecycle end, run after it.
    assert quoted("S", "Auto-compaction emits `compaction` stream events")
    chat, texts_ = uniq("chat"), [uniq(f"h{i}") for i in range(3)]
    summary = uniq("RUNSUM")
    llm.script.push(Reply(text="third answer", usage=BIG, match=texts_[2]),
                    Reply(text=summary, match=SUMMARY_INSTRUCTION))
    with stack.http() as http:
        for text in texts_:
            run_id = start(http, text, chat)
            assert wait(http, run_id)["status"] == "ok"
        streamed = events(http, run_id)  # the stream closes by itself after the compaction
    assert [(e, d.get("phase")) for e, d in streamed if e in ("lifecycle", "compaction")] == [
        ("lifecycle", "start"), ("compaction", "scheduled"), ("lifecycle", "end"),
        ("compaction", "start"), ("compaction", "end")]
    end = streamed[-1][1]
    assert end["reason"] == "auto" and end["compacted"] is True
    assert end["beforeTokens"] == BIG.input_tokens and end["afterTokens"] < end["beforeTokens"]
    assert stored(stack, f"http|{chat}|root")[0].content == CHECKPOINT_PREFIX + summary


def test_the_preflight_pass_compacts_before_the_turn_and_only_with_a_measurement(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    chat, conv = 6002, "telegram|6002|root"
    for i in range(3):
        say(stack, tg, chat, uniq(f"p{i}"), i + 1)
    before = len(summaries(llm))
    say(stack, tg, chat, uniq("no-measurement"), 4)  # small reported sizes: no pass
    assert len(summaries(llm)) == before
    # The last turn measured over the line, and its post-turn pass never ran (e.g. its worker
    # died after replying): the next turn's preflight compacts first.
    history.save_measurement(stack.redis(), conv, 19_000, "scripted-openai")
    summary, nxt = uniq("PRE"), uniq("next")
    llm.script.push(Reply(text=summary, match=SUMMARY_INSTRUCTION), Reply(text="after preflight", match=nxt))
    shown = say(stack, tg, chat, nxt, 6)
    assert shown[4:] == [PREFLIGHT_NOTICE, "after preflight"], "the notice comes before the reply"
    assert stored(stack, conv)[0].content == CHECKPOINT_PREFIX + summary


def test_a_failed_summary_leaves_history_intact_and_backs_off_60_s(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    chat, conv = 6003, "telegram|6003|root"
    for i in range(3):
        say(stack, tg, chat, uniq(f"f{i}"), i + 1)
    kept = stored(stack, conv)
    trigger = uniq("trigger")
    llm.script.push(Reply(text="answer", usage=BIG, match=trigger),
                    Fail(400, "summary refused", match=SUMMARY_INSTRUCTION))
    say(stack, tg, chat, trigger, 4)
    wait_until(lambda: stack.redis().exists(keys.compact_backoff(conv)), 10, "backoff set")
    assert stored(stack, conv)[: len(kept)] == kept
    assert 55 <= stack.redis().ttl(keys.compact_backoff(conv)) <= 60
    before = len(summaries(llm))
    again = uniq("again")
    llm.script.push(Reply(text="again", usage=BIG, match=again))
    say(stack, tg, chat, again, 5)
    assert len(summaries(llm)) == before, "no new attempt while backing off"


def test_compact_reports_tokens_and_new_keeps_long_term_memory(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    chat = uniq("http")
    with stack.http() as http:
        for i in range(3):
            assert wait(http, start(http, uniq(f"c{i}"), chat))["status"] == "ok"
        last = uniq("c3")  # the provider reports this turn's prompt size: 321 tokens
        llm.script.push(Reply(text="ok", usage=Usage(input_tokens=321, output_tokens=5),
                              match=last))
        assert wait(http, start(http, last, chat))["status"] == "ok"
        llm.script.push(Reply(text=uniq("CMD"), match=SUMMARY_INSTRUCTION))
        report = wait(http, start(http, "/compact", chat))
        assert report["status"] == "ok"
        # The measured count as reported; "~" marks the estimate (the size after).
        assert re.fullmatch(r"Compacted this conversation: 321 → ~\d+ tokens\.",
                            report["reply"]), report["reply"]
        memory = MemoryStore(stack.redis())
        fact = memory.add(f"The user's favourite colour is {uniq('teal')}.", "test")
        assert wait(http, start(http, "/new", chat))["reply"] == (
            "Started a fresh conversation. Long-term memory is kept.")
        assert stored(stack, f"http|{chat}|root") == []
        assert fact.id in [f.id for f in memory.active()]


def test_compact_without_a_measurement_says_its_count_is_an_estimate(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    chat = uniq("http")
    with stack.http() as http:
        for i in range(4):
            assert wait(http, start(http, uniq(f"e{i}"), chat))["status"] == "ok"
        # As after a restart that lost it: no provider-reported size for this conversation.
        history.clear_measurement(stack.redis(), f"http|{chat}|root")
        llm.script.push(Reply(text=uniq("EST"), match=SUMMARY_INSTRUCTION))
        report = wait(http, start(http, "/compact", chat))
    assert re.fullmatch(r"Compacted this conversation: ~\d+ → ~\d+ tokens\.",
                        report["reply"]), report["reply"]


def test_a_turn_that_overflows_recovers_by_compacting_then_retrying(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    chat = uniq("http")
    big = uniq("big")
    with stack.http() as http:
        for i in range(3):
            wait(http, start(http, uniq(f"o{i}"), chat))
        llm.script.push(
            Fail(400, "This model's maximum context length is 1000 tokens.", match=big),
            Reply(text=uniq("S"), match=SUMMARY_INSTRUCTION),
            Reply(text="fits now", match=big),
        )
        run = wait(http, start(http, big, chat))
        assert (run["status"], run["reply"]) == ("ok", "fits now")
        # Still too long after everything: the reply points at /new and /compact.
        huge = uniq("huge")
        llm.script.push(*[Fail(400, "prompt is too long", match=huge)] * 6)
        run = wait(http, start(http, huge, chat))
        assert (run["status"], run["error"]) == ("error", OVERFLOW_MESSAGE)
