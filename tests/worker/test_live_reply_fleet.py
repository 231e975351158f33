"""Replies written live into Telegram across a fleet: webhooks into a real gateway, turns on two
real workers, the fake Bot API on 127.0.0.1 keeping each message as the chat shows it (every
edit, with its time). Production paces (1 s a private chat) and the default mode, ``partial``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_shared import keys
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.telegram_api import FakeTelegram
from tests.fleet import telegram_say, uniq

SECRET = "live-webhook-secret"
OWNER = 4711
_ids = itertools.count(50_000)


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path, tg: FakeTelegram
          ) -> Iterator[Stack]:
    env = {
        **provider_env(llm, "openai"),
        **tg.gateway_env(SECRET, OWNER),
        "FERMIX_LEASE_SECONDS": "4",
        "FERMIX_CANCEL_POLL_SECONDS": "0.2",
    }
    s = start_stack("live", redis_url, 15, env, logs_dir, workers=2)
    yield s
    s.stop()


def say(stack: Stack, chat: int, text: str) -> None:
    telegram_say(stack.url, SECRET, OWNER, chat, text, _ids)


def idle(stack: Stack, chat: int) -> bool:
    conv = f"telegram|{chat}|root"
    r = stack.redis()
    return not r.exists(keys.active(conv)) and not r.llen(keys.inbox(conv))


def test_a_long_reply_grows_in_one_message_at_one_edit_a_second(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    chat, text = 81_001, uniq("essay")
    answer = "Here goes: " + " ".join(f"word{i}" for i in range(120))
    llm.script.push(Reply(text=answer, chunk_delay=0.04, match=text))  # ~5 s of writing
    say(stack, chat, text)
    wait_until(lambda: idle(stack, chat) and bool(tg.chat(chat)), 60, "the reply")
    (message,) = tg.chat(chat)
    assert message.text == answer
    assert message.edits >= 3, "edited as it grew"
    times = [at for at, _ in message.versions[1:]]
    assert min(b - a for a, b in zip(times, times[1:], strict=False)) >= 0.9, "1 edit a second"
    assert len([c for c in tg.calls("sendMessage") if c.body["chat_id"] == chat]) == 1


def test_a_worker_killed_mid_stream_leaves_one_message_with_the_exact_reply(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    chat, text = 81_002, uniq("crash")
    answer = "Resumed answer: " + " ".join(f"item{i}" for i in range(150))
    llm.script.push(
        Reply(text=answer, chunk_delay=0.08, match=text),  # the holder dies while writing this
        Reply(text=answer, chunk_delay=0.01, match=text),  # the model call, re-issued elsewhere
    )
    say(stack, chat, text)
    wait_until(lambda: bool(tg.chat(chat)) and tg.chat(chat)[0].edits >= 1, 30,
               "a live message that has grown")
    run_id = stack.redis().hget(keys.active(f"telegram|{chat}|root"), "turn_id")
    assert isinstance(run_id, str)
    with stack.http() as http:
        victim = stack.kill_holder(http, run_id)
        killed_at = time.time()
        wait_until(lambda: idle(stack, chat), 60, "the resumed turn to end")
        run = http.get(f"/v1/runs/{run_id}").json()
    assert run["status"] == "ok" and run["worker"].split("@")[0] != victim.name
    (message,) = tg.chat(chat)  # never two growing messages
    assert message.text == answer
    assert any(at > killed_at for at, _ in message.versions), "the resumed turn edited it"
    assert len([c for c in tg.calls("sendMessage")
                if c.body["chat_id"] == chat and c.status == 200]) == 1
    stack.start_worker(victim.name)
