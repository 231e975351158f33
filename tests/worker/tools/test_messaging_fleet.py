"""``react`` and ``send_message`` on real workers: a Telegram update into a real gateway, the
turn on a celery worker whose runtime offers the tools, the scripted model calling them, and
the fake Bot API on 127.0.0.1 keeping the chat as the user sees it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.telegram_api import FakeTelegram
from tests.fleet import telegram_say, uniq

SECRET = "messaging-webhook-secret"
OWNER = 5150
_ids = itertools.count(70_000, 2)


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path, tg: FakeTelegram
          ) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), **tg.gateway_env(SECRET, OWNER)}
    s = start_stack("messaging", redis_url, 12, env, logs_dir, workers=1)
    yield s
    s.stop()


def test_a_reaction_and_a_sent_message_are_the_reply_and_nothing_repeats(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    chat, text = 91_001, uniq("deploy it")
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("react", {"emoji": "👀"})], match=text),
        Reply(tool_calls=[ToolCallSpec("send_message", {"text": "Deployed to staging."})],
              match=text),
        Reply(text="Deployed to staging.", match=text),  # the confirmation, a duplicate
    )
    update_id = next(_ids)
    telegram_say(stack.url, SECRET, OWNER, chat, text, iter([update_id, update_id + 1]))
    conv = f"telegram|{chat}|root"
    r = stack.redis()

    def said() -> list[ChatMessage]:
        return [ChatMessage.model_validate_json(m) for m in r.lrange(keys.history(conv), 0, -1)]

    wait_until(lambda: not r.exists(keys.active(conv)) and len(said()) > 1, 30,
               "the turn to end")
    assert tg.reactions[(str(chat), update_id + 1)] == ["👀"], "on the user's message"
    assert [m.text for m in tg.chat(chat)] == ["Deployed to staging."], "sent once"
    assert said()[-1].content == "[replied with message, reaction]"
