"""Replies written live into Telegram and Slack: the real channels over real HTTP (the fake Bot
API and Web API on 127.0.0.1, which keep each message as the chat shows it, with every edit
and its time), a real Redis, the real EventSink feeding the live reply. Paces are cut to
0.1 s here (1 s in production) so each test takes a fraction of a second."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fermix_dev.procs import wait_until
from fermix_shared import keys
from fermix_shared.channels.base import OutboundChannel
from fermix_shared.channels.slack import SlackChannel
from fermix_shared.channels.slack_format import fallback_text, markdown_pieces
from fermix_shared.channels.telegram import TelegramChannel
from fermix_shared.channels.telegram_format import chunk_markdown, to_telegram_html
from fermix_shared.messages import ToolCall
from fermix_shared.models import Channel, ConversationKey, InboundMessage
from fermix_shared.settings import Settings
from fermix_worker.turn.events import EventSink
from fermix_worker.turn.live_preview import LiveReply
from fermix_worker.turn.live_reply import STOPPED_NOTE, LiveReplies
from tests.fakes.slack_api import FakeSlack
from tests.fakes.telegram_api import FakeTelegram, visible_text
from tests.fleet import uniq

TOKEN = "123456:TEST-live_token"
PACE = 0.1  # the chat's pace between two changes (Telegram and Slack: 1 s)
STEP = 0.06  # the scripted model writes a piece every 60 ms


class Events:
    def emit(self, stream: str, **data: Any) -> None:
        pass


@pytest.fixture(scope="module")
def tg() -> Iterator[FakeTelegram]:
    with FakeTelegram(TOKEN) as fake:
        yield fake


@pytest.fixture(scope="module")
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


@pytest.fixture
def settings(tg: FakeTelegram, slack: FakeSlack) -> Settings:
    tg.reset()
    slack.reset()
    return Settings(telegram_bot_token=TOKEN, telegram_api_base=tg.url,
                    slack_bot_token="xoxb-live", slack_api_base=slack.url)


def channels(r: redis.Redis, settings: Settings) -> dict[str, Any]:
    return {
        "telegram": TelegramChannel(settings, r, chat_interval=PACE, group_interval=PACE),
        "slack": SlackChannel(settings, r, channel_interval=PACE),
    }


class Turn:
    """One turn's streaming side, as the runner wires it: EventSink -> LiveReply; the final
    delivery through LiveReplies (what the Deliverer calls)."""

    def __init__(self, r: redis.Redis, settings: Settings, key: ConversationKey,
                 run_id: str | None = None, first_after: float = PACE):
        self.chans = channels(r, settings)
        self.replies = LiveReplies(r, settings, self.lookup, first_after=first_after)
        self.msg = InboundMessage(key=key, text="hi", run_id=run_id or uniq("run"))
        live = self.replies.start(self.msg)
        assert isinstance(live, LiveReply)
        self.live = live
        self.sink = EventSink(Events(), listener=live)  # type: ignore[arg-type]

    def lookup(self, name: Channel) -> OutboundChannel | None:
        channel: OutboundChannel | None = self.chans.get(name)
        return channel

    def write(self, text: str, pieces: int, step: float = STEP) -> None:
        size = -(-len(text) // pieces)
        for i in range(0, len(text), size):
            self.sink.assistant_delta(text[i:i + size])
            time.sleep(step)

    def end(self, reply: str) -> bool:
        """The loop is done: flush, close, deliver ``reply`` (False: send it as usual)."""
        self.sink.flush()
        self.live.close()
        return self.replies.deliver(self.msg, reply)


def gaps(versions: list[tuple[float, str]]) -> list[float]:
    """Seconds between a message's edits as the platform received them (the first send is
    left out: a fresh connection's setup delays its arrival, not its start)."""
    times = [at for at, _ in versions[1:]]
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def keeps_pace(versions: list[tuple[float, str]]) -> bool:
    """The edits reached the platform at the chat's pace: on average at least :data:`PACE`
    apart (10% slack), and none closer than half of it (one request arriving late, as under
    load, brings the next one closer; an unpaced stream would edit every :data:`STEP`)."""
    between = gaps(versions)
    return sum(between) / len(between) >= PACE * 0.9 and min(between) >= PACE / 2


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def test_telegram_partial_one_message_edited_at_the_pace_then_formatted_exactly(
    r: redis.Redis, settings: Settings, tg: FakeTelegram
) -> None:
    key = ConversationKey(channel="telegram", chat_id="4201")
    reply = "**Streaming** works, `code` too: " + words(80)
    turn = Turn(r, settings, key)
    turn.write(reply, 10)
    assert turn.end(reply) is True
    (message,) = tg.chat(4201)  # one message: no second bubble for the final reply
    assert message.edits >= 3, "the text grew in place"
    assert keeps_pace(message.versions), "edits keep the chat's pace"
    assert message.text == visible_text(to_telegram_html(reply), "HTML")
    edits = [c.body for c in tg.calls("editMessageText") if c.status == 200]
    assert all("parse_mode" not in b for b in edits[:-1]), "half-written text goes plain"
    assert edits[-1]["parse_mode"] == "HTML"
    shown = [text for _, text in message.versions]
    assert all(reply.replace("*", "").replace("`", "").startswith(t) for t in shown[:-1])


def test_slack_partial_one_message_updated_then_exact(
    r: redis.Redis, settings: Settings, slack: FakeSlack
) -> None:
    key = ConversationKey(channel="slack", chat_id="C0LIVE", thread_scope="1700000000.000001")
    reply = "Here is **the plan**:\n\n- one\n- two\n\n" + words(60)
    turn = Turn(r, settings, key)
    turn.write(reply, 8)
    assert turn.end(reply) is True
    (message,) = slack.channel("C0LIVE")
    assert message.thread_ts == "1700000000.000001"
    assert message.edits >= 3
    assert keeps_pace(message.versions)
    assert message.markdown == reply and message.text == fallback_text(reply)
    changes = slack.calls("chat.postMessage", ok=True) + slack.calls("chat.update", ok=True)
    assert all(c.args["blocks"][0]["type"] == "markdown" for c in changes), "every version"
    shown = [text for _, text in message.versions]
    assert all(reply.startswith(t) for t in shown), "each version the Markdown written so far"


def test_slack_shows_a_half_written_code_block_closed(
    r: redis.Redis, settings: Settings, slack: FakeSlack
) -> None:
    key = ConversationKey(channel="slack", chat_id="C0FENCE", thread_scope="1700000000.000002")
    code = "\n".join(f"print({i})" for i in range(40))
    reply = f"Run this:\n\n```python\n{code}\n```\n\nThat is **all**."
    turn = Turn(r, settings, key)
    turn.write(reply, 8)
    assert turn.end(reply) is True
    (message,) = slack.channel("C0FENCE")
    assert message.edits >= 3
    shown = [text for _, text in message.versions]
    assert any(t.endswith("\n```") and "That is" not in t for t in shown), "a fence closed early"
    assert all(t.count("```") % 2 == 0 for t in shown), "no version leaves a code block open"
    assert shown[-1] == reply


def test_a_reply_done_before_the_first_preview_is_one_plain_send(
    r: redis.Redis, settings: Settings, tg: FakeTelegram
) -> None:
    key = ConversationKey(channel="telegram", chat_id="4202")
    turn = Turn(r, settings, key, first_after=5.0)
    turn.write("short answer", 2, step=0.01)
    assert turn.end("short answer") is False  # the Deliverer sends it as today
    assert tg.calls() == []
    assert not r.exists(keys.live_reply(turn.msg.run_id))


def test_off_streams_nothing_and_leaves_nothing_in_redis(
    r: redis.Redis, settings: Settings, tg: FakeTelegram
) -> None:
    off = settings.model_copy(update={"telegram_streaming": "off"})
    chans = channels(r, off)
    replies = LiveReplies(r, off, lambda name: chans.get(name))
    msg = InboundMessage(key=ConversationKey(channel="telegram", chat_id="4203"), text="hi")
    assert replies.start(msg) is None
    assert replies.deliver(msg, "the whole reply") is False
    http = msg.model_copy(update={"key": ConversationKey(channel="http", chat_id="x")})
    assert replies.start(http) is None
    assert r.keys("*") == [] and tg.calls() == []


def test_text_before_a_tool_call_is_replaced_by_the_next_message(
    r: redis.Redis, settings: Settings, tg: FakeTelegram
) -> None:
    key = ConversationKey(channel="telegram", chat_id="4204")
    turn = Turn(r, settings, key)
    turn.write("Let me look that up for you, one moment please.", 4)
    wait_until(lambda: bool(tg.chat(4204)), 5, "the first preview")
    turn.sink.tool_start(ToolCall(id="c1", name="calculator", arguments={}))
    final = "The answer is 42, " + words(30)
    turn.write(final, 5)
    assert turn.end(final) is True
    (message,) = tg.chat(4204)
    assert message.versions[0][1].startswith("Let me look")
    assert message.text == final


@pytest.mark.parametrize("name", ["telegram", "slack"])
def test_a_long_final_edits_the_first_chunk_and_sends_the_rest_once(
    r: redis.Redis, settings: Settings, tg: FakeTelegram, slack: FakeSlack, name: Channel
) -> None:
    key = ConversationKey(channel=name, chat_id="4205" if name == "telegram" else "C0LONG")
    count = 30 if name == "telegram" else 90  # 4,096 characters a message; 12,000 on Slack
    paragraphs = [f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 12 for i in range(count)]
    reply = "\n\n".join(paragraphs)  # about 10,000 (30,000) characters: three messages

    def chat() -> list[Any]:
        return list(tg.chat(4205) if name == "telegram" else slack.channel("C0LONG"))

    turn = Turn(r, settings, key)
    turn.write(reply[:1000], 3, step=0.03)
    wait_until(lambda: bool(chat()), 5, "the first preview")  # it shows part of a paragraph
    turn.write(reply[1000:], 4, step=0.03)
    assert turn.end(reply) is True
    assert turn.replies.deliver(turn.msg, reply) is True  # a retried delivery repeats nothing
    expected = ([visible_text(to_telegram_html(c), "HTML") for c in chunk_markdown(reply)]
                if name == "telegram" else markdown_pieces(reply))
    messages = chat()
    texts = [m.text if name == "telegram" else m.markdown for m in messages]
    assert len(expected) == 3 and texts == expected
    shown = [p.strip() for t in texts for p in (t or "").split("\n\n")]
    assert shown == [p.strip() for p in paragraphs], "every paragraph once, in order"
    assert messages[0].versions[0][1] != expected[0], "the live message was a preview first"
    assert all(m.edits == 0 for m in messages[1:])


def test_block_mode_sends_finished_paragraphs_and_never_edits(
    r: redis.Redis, settings: Settings, tg: FakeTelegram
) -> None:
    block = settings.model_copy(update={"telegram_streaming": "block"})
    key = ConversationKey(channel="telegram", chat_id="4206")
    paragraphs = [f"Part {i}. " + words(150, f"b{i}-") for i in range(4)]
    reply = "\n\n".join(paragraphs)
    turn = Turn(r, block, key)
    turn.write(reply, 12, step=0.02)
    assert turn.end(reply) is True
    messages = tg.chat(4206)
    assert len(messages) >= 3 and all(m.edits == 0 for m in messages)
    assert tg.calls("editMessageText") == []
    shown = "\n\n".join(m.text for m in messages)
    assert shown == "\n\n".join(paragraphs), "every paragraph once, in order"


def test_a_429_during_edits_is_waited_out_and_the_final_edit_lands(
    r: redis.Redis, settings: Settings, tg: FakeTelegram
) -> None:
    key = ConversationKey(channel="telegram", chat_id="4207")
    tg.fail_next("editMessageText", 429, "Too Many Requests: retry after 0.4", retry_after=0.4,
                 after=1)
    reply = words(120)
    turn = Turn(r, settings, key)
    turn.write(reply, 10)
    assert turn.end(reply) is True
    calls = tg.calls("editMessageText")
    limited = next(i for i, c in enumerate(calls) if c.status == 429)
    assert calls[limited + 1].at - calls[limited].at >= 0.4 * 0.9, "retry_after honoured"
    (message,) = tg.chat(4207)
    assert message.text == reply


def test_a_resumed_turn_keeps_editing_the_same_message(
    r: redis.Redis, settings: Settings, tg: FakeTelegram
) -> None:
    key = ConversationKey(channel="telegram", chat_id="4208")
    run_id = uniq("run")
    reply = "Resumed " + words(90)
    first = Turn(r, settings, key, run_id)
    first.write(reply[:200], 4)
    wait_until(lambda: bool(tg.chat(4208)), 5, "the first preview")
    first.live.close()  # the worker died here: nothing final was delivered
    second = Turn(r, settings, key, run_id)  # another worker resumes the turn
    second.write(reply, 8)
    assert second.end(reply) is True
    (message,) = tg.chat(4208)
    assert len([c for c in tg.calls("sendMessage") if c.status == 200]) == 1
    assert message.text == reply and message.edits >= 2


def test_stop_keeps_the_text_and_says_so_and_silence_deletes_the_message(
    r: redis.Redis, settings: Settings, tg: FakeTelegram
) -> None:
    stopped = Turn(r, settings, ConversationKey(channel="telegram", chat_id="4209"))
    stopped.write("I was halfway through " + words(20), 4)
    wait_until(lambda: bool(tg.chat(4209)), 5, "the first preview")
    stopped.live.close()
    shown = tg.chat(4209)[0].text
    stopped.replies.stopped(stopped.msg)
    assert tg.chat(4209)[0].text == f"{shown}\n\n{STOPPED_NOTE}"

    silent = Turn(r, settings, ConversationKey(channel="telegram", chat_id="4210"))
    silent.write("Thinking about whether to answer " + words(10), 4)
    wait_until(lambda: bool(tg.chat(4210)), 5, "the first preview")
    silent.live.close()
    silent.replies.silent(silent.msg)
    assert tg.chat(4210) == []


def test_two_workers_previewing_one_run_leave_one_message(
    r: redis.Redis, settings: Settings, tg: FakeTelegram
) -> None:
    key = ConversationKey(channel="telegram", chat_id="4211")
    run_id = uniq("run")
    zombie, resumed = Turn(r, settings, key, run_id), Turn(r, settings, key, run_id)
    for turn in (zombie, resumed):  # both start at once: both may post, one message stays
        turn.sink.assistant_delta("Racing to show " + words(10))
    # Both loaded an empty record before either posted: the one that lost deletes its own.
    wait_until(lambda: bool(tg.calls("deleteMessage")), 5, "the loser's message deleted")
    zombie.live.close()
    reply = "Racing to show " + words(40)
    resumed.write(reply, 3)
    assert resumed.end(reply) is True
    (message,) = tg.chat(4211)
    assert message.text == reply


def test_a_parked_turn_leaves_its_message_formatted_and_goes_on_in_a_new_one(
    r: redis.Redis, settings: Settings, tg: FakeTelegram
) -> None:
    key = ConversationKey(channel="telegram", chat_id="4212")
    run_id = uniq("run")
    before = "I will ask **three** helpers, " + words(20)
    parked = Turn(r, settings, key, run_id)
    parked.write(before, 4)
    wait_until(lambda: bool(tg.chat(4212)), 5, "the first preview")
    parked.sink.flush()
    parked.live.close(parked=True)
    resumed = Turn(r, settings, key, run_id)  # the fan-out came back
    after = "They found " + words(30)
    resumed.write(after, 4)
    assert resumed.end(after) is True
    first, second = tg.chat(4212)
    assert first.text == visible_text(to_telegram_html(before), "HTML")
    assert second.text == after


def test_block_mode_sends_text_before_a_tool_call_when_the_call_starts(
    r: redis.Redis, settings: Settings, tg: FakeTelegram
) -> None:
    block = settings.model_copy(update={"telegram_streaming": "block"})
    turn = Turn(r, block, ConversationKey(channel="telegram", chat_id="4213"))
    turn.write("Checking the weather first.", 2, step=0.01)
    turn.sink.tool_start(ToolCall(id="c1", name="http_fetch", arguments={}))
    wait_until(lambda: bool(tg.chat(4213)), 5, "the text before the call")
    final = "It is sunny, " + words(10)
    turn.write(final, 2, step=0.01)
    assert turn.end(final) is False  # nothing of the final was sent: the Deliverer sends it
    assert [m.text for m in tg.chat(4213)] == ["Checking the weather first."]
