"""``react`` and ``send_message``: replies by other means than the final text.

Turns run through TurnRunner in this process on a real (private) Redis, with a scripted
in-process model; the tools send through the real Telegram and Slack channels to the fake Bot
API and the fake Slack Web API on 127.0.0.1 (tests/fakes/), which keep each chat as people see it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from fermix_shared.channels.base import OutboundChannel
from fermix_shared.channels.slack import SlackChannel
from fermix_shared.channels.telegram import TelegramChannel
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import Channel, ConversationKey, InboundMessage, RunStatus
from fermix_shared.settings import Settings
from fermix_shared.stores import history, queue, runs
from fermix_worker.providers.base import ModelRequest, ModelTurn
from fermix_worker.subagents.registry import subagent_may_use
from fermix_worker.tools import ToolRegistry
from fermix_worker.tools.context import RunContext
from fermix_worker.tools.messaging import messaging_tools
from fermix_worker.turn import Delivered, TurnRunner
from fermix_worker.turn.reply import EMPTY_COMPLETION
from tests.fakes.slack_api import FakeSlack
from tests.fakes.telegram_api import FakeTelegram
from tests.fleet import uniq
from tests.seed_text import quoted
from tests.worker.turn.test_runner import Model

TOKEN = "123456:TEST-token"
USER_MESSAGE = "4242"  # the Telegram message_id of the user's message
SLACK_TS = "1712345678.000300"  # the Slack ts of the user's message
THREAD = "1712345678.000200"
_chats = itertools.count(700_001)

Step = Callable[[ModelRequest], ModelTurn]


def call(name: str, **arguments: Any) -> Step:
    return lambda request: ModelTurn("", [ToolCall(id=uniq("c"), name=name, arguments=arguments)])


def say(text: str) -> Step:
    return lambda request: ModelTurn(content=text, tool_calls=[])


@pytest.fixture(scope="module")
def tg() -> Iterator[FakeTelegram]:
    with FakeTelegram(TOKEN) as fake:
        yield fake


@pytest.fixture(scope="module")
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


@pytest.fixture
def settings(tg: FakeTelegram, slack: FakeSlack, tmp_path: Path) -> Settings:
    (tmp_path / "ws").mkdir()
    return Settings(redis_url="redis://unused", provider="openai", model="m",
                    telegram_bot_token=TOKEN, telegram_api_base=tg.url,
                    slack_bot_token="xoxb-test", slack_api_base=slack.url,
                    workspace=tmp_path / "ws")


@pytest.fixture
def channels(r: redis.Redis, settings: Settings) -> Callable[[Channel], OutboundChannel | None]:
    built: dict[str, OutboundChannel] = {
        "telegram": TelegramChannel(settings, r, chat_interval=0.0, group_interval=0.0),
        "slack": SlackChannel(settings, r, channel_interval=0.0),
    }
    return lambda name: built.get(name)


def turn(r: redis.Redis, settings: Settings, channels: Callable[[Channel], OutboundChannel | None],
         model: Model, key: ConversationKey, reply_to: str | None, text: str = "hello"
         ) -> InboundMessage:
    runner = TurnRunner(r, settings, ToolRegistry(messaging_tools(channels, settings)),
                        router=lambda: model, channels=channels)  # type: ignore[arg-type, return-value]
    msg = InboundMessage(key=key, text=text, reply_to=reply_to, sender_id="111")
    queue.accept(r, msg)
    claimed, lease = queue.claim(r, key.as_str(), "w:1", 30)
    assert lease is not None
    assert runner.run(claimed.messages, lease) == Delivered(waiting=0)
    return msg


def said(r: redis.Redis, msg: InboundMessage) -> list[str]:
    return [m.content for m in history.load(r, msg.key.as_str(), 100)]


def tg_chat(tg: FakeTelegram) -> tuple[ConversationKey, str]:
    """A private chat of its own (the fake keeps every chat for the module)."""
    chat = str(next(_chats))
    return ConversationKey(channel="telegram", chat_id=chat), chat


# --- react ----------------------------------------------------------------------------------


def test_a_reaction_is_the_reply_and_the_turn_closes_silently_with_a_marker(
    r: redis.Redis, settings: Settings, channels: Any, tg: FakeTelegram,
) -> None:
    """Seed F: "A turn that already delivered a non-text side-effect (an emoji-reaction
    acknowledgement or an attachment) treats that as the reply and closes silently with a
    compact history marker"."""
    quoted("F", "treats that as the reply and closes silently with a compact history marker")
    key, chat = tg_chat(tg)
    msg = turn(r, settings, channels, Model(call("react", emoji="👍"), say("")), key,
               USER_MESSAGE, "thanks, that worked!")
    assert tg.reactions[(chat, int(USER_MESSAGE))] == ["👍"]
    assert tg.chat(chat) == [], "no text: not even the empty-completion message"
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.ok and rec.reply is None
    assert said(r, msg)[0] == "thanks, that worked!"
    assert said(r, msg)[-1] == "[replied with reaction]"
    assert EMPTY_COMPLETION not in said(r, msg)


def test_an_empty_completion_without_a_side_effect_gets_the_seed_message(
    r: redis.Redis, settings: Settings, channels: Any, tg: FakeTelegram,
) -> None:
    key, chat = tg_chat(tg)
    msg = turn(r, settings, channels, Model(say("")), key, USER_MESSAGE)
    [shown] = tg.chat(chat)
    assert shown.text == quoted("F", "I didn’t get a response — please try again.")
    assert said(r, msg) == ["hello"], "the empty completion is never committed"


def test_a_slack_reaction_goes_on_the_users_message_by_its_slack_name(
    r: redis.Redis, settings: Settings, channels: Any, slack: FakeSlack,
) -> None:
    key = ConversationKey(channel="slack", chat_id=uniq("C").upper(), thread_scope=THREAD)
    msg = turn(r, settings, channels, Model(call("react", emoji="🎉"), say("")), key, SLACK_TS)
    assert slack.reactions(key.chat_id, SLACK_TS) == {"tada"}
    assert slack.channel(key.chat_id) == []
    assert said(r, msg)[-1] == "[replied with reaction]"


def test_a_refused_emoji_is_an_error_the_model_reads_and_then_answers_in_words(
    r: redis.Redis, settings: Settings, channels: Any, tg: FakeTelegram,
) -> None:
    key, chat = tg_chat(tg)
    model = Model(call("react", emoji="🦖"), say("Done!"))
    turn(r, settings, channels, model, key, USER_MESSAGE)
    result = model.requests[-1].messages[-1]
    assert result.is_error and "REACTION_INVALID" in result.content
    assert [m.text for m in tg.chat(chat)] == ["Done!"]


# --- send_message ---------------------------------------------------------------------------


def test_a_final_text_that_repeats_a_sent_message_is_not_sent_again(
    r: redis.Redis, settings: Settings, channels: Any, tg: FakeTelegram,
) -> None:
    """Fased: "Messaging tool sends are tracked to suppress duplicate assistant
    confirmations"."""
    quoted("S", "Messaging tool sends are tracked to suppress duplicate assistant confirmations.")
    key, chat = tg_chat(tg)
    model = Model(call("send_message", text="The build is **green**."),
                  say("the build is  **green**"))
    msg = turn(r, settings, channels, model, key, USER_MESSAGE)
    assert [m.text for m in tg.chat(chat)] == ["The build is green."], "sent once"
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.ok and rec.reply is None
    assert said(r, msg)[-1] == "[replied with message]"


def test_a_different_final_text_still_goes_out_after_the_sent_message(
    r: redis.Redis, settings: Settings, channels: Any, tg: FakeTelegram,
) -> None:
    key, chat = tg_chat(tg)
    model = Model(call("send_message", text="Working on it, this takes a minute."),
                  say("All done: 3 files changed."))
    msg = turn(r, settings, channels, model, key, USER_MESSAGE)
    assert [m.text for m in tg.chat(chat)] == ["Working on it, this takes a minute.",
                                               "All done: 3 files changed."]
    assert said(r, msg)[-1] == "All done: 3 files changed."


def test_a_workspace_file_goes_to_telegram_as_a_document_with_its_caption(
    r: redis.Redis, settings: Settings, channels: Any, tg: FakeTelegram,
) -> None:
    assert settings.workspace is not None
    (settings.workspace / "report.csv").write_bytes(b"a,b\n1,2\n")
    key, chat = tg_chat(tg)
    model = Model(call("send_message", path="report.csv", text="Here is **the report**."),
                  say(""))
    msg = turn(r, settings, channels, model, key, USER_MESSAGE)
    [doc] = tg.chat(chat)
    assert doc.document == ("report.csv", b"a,b\n1,2\n")
    assert doc.text == "Here is the report." and doc.tags == ["<b>", "</b>"]
    assert said(r, msg)[-1] == "[replied with message]"


def test_a_workspace_file_goes_into_the_slack_thread(
    r: redis.Redis, settings: Settings, channels: Any, slack: FakeSlack,
) -> None:
    assert settings.workspace is not None
    (settings.workspace / "notes.txt").write_text("line one\n")
    key = ConversationKey(channel="slack", chat_id=uniq("C").upper(), thread_scope=THREAD)
    model = Model(call("send_message", path="notes.txt", text="The notes."), say("The notes"))
    turn(r, settings, channels, model, key, SLACK_TS)
    [shared] = slack.channel(key.chat_id)
    assert (shared.thread_ts, shared.text) == (THREAD, "The notes.")
    assert shared.files == [("notes.txt", b"line one\n")]


def test_a_file_outside_the_workspace_is_refused(
    r: redis.Redis, settings: Settings, channels: Any, tg: FakeTelegram,
) -> None:
    key, chat = tg_chat(tg)
    model = Model(call("send_message", path="/etc/passwd"), say("I can't send that."))
    turn(r, settings, channels, model, key, USER_MESSAGE)
    result = model.requests[-1].messages[-1]
    assert result.is_error and "outside the workspace" in result.content
    assert [m.document for m in tg.chat(chat)] == [None]


def test_a_send_run_again_after_a_crash_sends_nothing_twice(
    r: redis.Redis, settings: Settings, channels: Any, tg: FakeTelegram,
) -> None:
    """A tool call that started on a worker that died is run again (the tools are idempotent):
    the marks of what went out skip it."""
    assert settings.workspace is not None
    (settings.workspace / "a.txt").write_text("A")
    key, chat = tg_chat(tg)
    msg = InboundMessage(key=key, text="hello", reply_to=USER_MESSAGE)
    registry = ToolRegistry(messaging_tools(channels, settings))
    ctx = RunContext.for_turn(msg)
    for args in ({"text": "Step one done."}, {"path": "a.txt", "text": "the file"}):
        for _ in range(2):  # the first run, then the re-run of the resumed turn
            result = registry.execute(ToolCall(id="c1", name="send_message", arguments=args), ctx)
            assert not result.is_error
    assert [(m.text, m.document) for m in tg.chat(chat)] == [
        ("Step one done.", None), ("the file", ("a.txt", b"A"))]


def test_an_http_turn_has_no_chat_to_send_into(
    r: redis.Redis, settings: Settings, channels: Any,
) -> None:
    key = ConversationKey(channel="http", chat_id=uniq("c"))
    model = Model(call("send_message", text="hi"), say("hi"))
    msg = turn(r, settings, channels, model, key, None)
    # Not offered there, and a call made anyway is refused with the reason.
    offered = {t.name for t in model.requests[0].tools}
    assert not offered & {"send_message", "react"}
    result = model.requests[-1].messages[-1]
    assert result.is_error and "no chat to send into" in result.content
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.reply == "hi"


def test_a_sent_reply_keeps_a_failed_tool_from_adding_its_fallback_reply(
    r: redis.Redis, settings: Settings, channels: Any, tg: FakeTelegram,
) -> None:
    """Fased: the fallback tool error reply is emitted "unless a messaging tool already sent a
    user-visible reply"."""
    quoted("S", "unless a messaging tool already sent a user-visible reply")
    key, chat = tg_chat(tg)
    model = Model(call("react", emoji="🦖"), call("send_message", text="On it!"), say(""))
    turn(r, settings, channels, model, key, USER_MESSAGE)
    assert [m.text for m in tg.chat(chat)] == ["On it!"]


def test_subagents_never_get_the_messaging_tools(settings: Settings, channels: Any) -> None:
    tools = messaging_tools(channels, settings)
    assert [t.name for t in tools] == ["react", "send_message"]
    assert not any(subagent_may_use(t) for t in tools)


def test_history_keeps_what_was_sent_for_the_next_turn(
    r: redis.Redis, settings: Settings, channels: Any, tg: FakeTelegram,
) -> None:
    key, _ = tg_chat(tg)
    model = Model(call("send_message", text="Your code is 7311."), say(""), say("It was 7311."))
    turn(r, settings, channels, model, key, USER_MESSAGE)
    turn(r, settings, channels, model, key, "4243", "what was the code?")
    prompt: list[ChatMessage] = model.requests[-1].messages
    assert any(c.arguments == {"text": "Your code is 7311."}
               for m in prompt for c in m.tool_calls), "the next turn sees what was sent"
