"""TelegramChannel over real HTTP (the fake Bot API on 127.0.0.1) and a real Redis (DB 13).

Waits go through an injected ``sleep`` that records them (and sleeps for real only where a
test measures time), so pacing is asserted exactly without slowing the suite down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import redis

from fermix_dev.procs import wait_until
from fermix_shared import keys
from fermix_shared.approvals import store as approvals
from fermix_shared.approvals.store import ApprovalRequest
from fermix_shared.channels.base import AsksApproval, ChannelError
from fermix_shared.channels.telegram import TelegramChannel
from fermix_shared.channels.telegram_format import chunk_markdown, strip_markdown, to_telegram_html
from fermix_shared.errors import ConfigError
from fermix_shared.models import ConversationKey
from fermix_shared.settings import ApprovalsConfig, Settings
from fermix_worker.approvals.policy import ApprovalAsker, ApprovalPolicy, question
from tests.fakes.telegram_api import FakeTelegram, keyboard_of, visible_text

TOKEN = "123456:TEST-token_abc"
PRIVATE = ConversationKey(channel="telegram", chat_id="777")
TOPIC = ConversationKey(channel="telegram", chat_id="-1001234567890", thread_scope="42")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeTelegram]:
    with FakeTelegram(TOKEN) as server:
        yield server


@pytest.fixture
def r(redis_url: str, fake: FakeTelegram) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/13", decode_responses=True)
    client.flushdb()
    fake.reset()
    yield client
    client.close()


@pytest.fixture
def settings(fake: FakeTelegram) -> Settings:
    return Settings(telegram_bot_token=TOKEN, telegram_api_base=fake.url,
                    telegram_webhook_secret="s3cret-Token_1")


class Waits:
    """Records every wait; sleeps for real only when ``real``."""

    def __init__(self, real: bool = False) -> None:
        self.real = real
        self.seconds: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)
        if self.real:
            time.sleep(seconds)


def paragraphs(n_chars: int, tag: str = "p") -> str:
    out: list[str] = []
    i = 0
    while sum(len(p) + 2 for p in out) < n_chars:
        out.append(f"**{tag}{i}** " + " ".join(f"word{i}-{j}" for j in range(40)) + ".")
        i += 1
    return "\n\n".join(out)


def test_a_long_answer_arrives_in_order_in_the_topic_in_chunks_under_4096(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    waits = Waits()
    text = paragraphs(10_000)
    TelegramChannel(settings, r, sleep=waits).send_text(TOPIC, text, delivery_id="d-long")
    sent = fake.sent()
    assert len(sent) >= 3
    for body in sent:
        assert body["chat_id"] == -1001234567890
        assert body["message_thread_id"] == 42
        assert body["parse_mode"] == "HTML"
        assert len(visible_text(body["text"], "HTML")) < 4096
    # Everything arrived, in order, formatted.
    assert "\n\n".join(visible_text(b["text"], "HTML") for b in sent) == strip_markdown(text)
    assert sent[0]["text"].startswith("<b>p0</b> word0-0")
    # A group: one message per 3 s, reserved fleet-wide in Redis. Nothing really sleeps here,
    # so each chunk's slot is 3 s after the previous one's, counted from the first send.
    assert [round(w) for w in waits.seconds] == [3 * (i + 1) for i in range(len(sent) - 1)]


def test_a_429_delays_the_chunk_blocks_the_chat_and_it_arrives_once(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    fake.fail_next("sendMessage", 429, "Too Many Requests: retry after 1", retry_after=1)
    waits = Waits(real=True)
    TelegramChannel(settings, r, sleep=waits).send_text(PRIVATE, "hello *there*",
                                                        delivery_id="d-429")
    calls = fake.calls("sendMessage")
    assert [c.status for c in calls] == [429, 200]
    assert fake.sent()[0]["text"] == "hello <i>there</i>"
    assert calls[1].at - calls[0].at >= 0.95
    assert any(w >= 0.9 for w in waits.seconds)
    # The chat's limit was pushed past the 429's retry_after, for every worker.
    next_free_ms = int(r.get(keys.rate_limit("telegram:chat:777")) or 0)
    assert next_free_ms >= (calls[0].at + 1.0) * 1000


def test_unparsable_html_falls_back_to_plain_text_for_that_chunk_only(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    text = paragraphs(9_000)
    chunks = chunk_markdown(text)
    assert len(chunks) == 3
    fake.fail_next("sendMessage", 400,
                   'Bad Request: can\'t parse entities: Unsupported start tag "x" at byte offset 3',
                   after=1)
    TelegramChannel(settings, r, sleep=Waits()).send_text(PRIVATE, text, delivery_id="d-plain")
    sent = fake.sent()
    assert len(sent) == 3
    assert sent[0] == {"chat_id": 777, "text": to_telegram_html(chunks[0]), "parse_mode": "HTML"}
    assert sent[1] == {"chat_id": 777, "text": strip_markdown(chunks[1])}
    assert "**" not in sent[1]["text"]
    assert sent[2]["parse_mode"] == "HTML"


def test_the_same_delivery_is_never_sent_twice(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    channel = TelegramChannel(settings, r, sleep=Waits())
    channel.send_text(PRIVATE, paragraphs(5_000), delivery_id="d-twice")
    first = len(fake.sent())
    assert first == 2
    channel.send_text(PRIVATE, paragraphs(5_000), delivery_id="d-twice")
    assert len(fake.sent()) == first
    assert 0 < r.ttl(keys.delivered("d-twice")) <= keys.DEDUPE_TTL_SECONDS
    channel.send_text(PRIVATE, "another reply", delivery_id="d-other")
    assert len(fake.sent()) == first + 1


def test_an_interrupted_delivery_resumes_after_the_last_chunk_sent(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    text = paragraphs(13_000)
    chunks = chunk_markdown(text)
    assert len(chunks) == 4
    fake.fail_next("sendMessage", 500, "Internal Server Error", times=5, after=2)
    waits = Waits()
    channel = TelegramChannel(settings, r, sleep=waits)
    with pytest.raises(ChannelError, match="500"):
        channel.send_text(PRIVATE, text, delivery_id="d-resume")
    assert [b["text"] for b in fake.sent()] == [to_telegram_html(c) for c in chunks[:2]]
    assert [c.status for c in fake.calls("sendMessage")][2:] == [500] * 5
    channel.send_text(PRIVATE, text, delivery_id="d-resume")
    assert [b["text"] for b in fake.sent()] == [to_telegram_html(c) for c in chunks]


def test_a_permanent_error_is_not_retried(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    fake.fail_next("sendMessage", 403, "Forbidden: bot was blocked by the user")
    with pytest.raises(ChannelError, match="blocked"):
        TelegramChannel(settings, r, sleep=Waits()).send_text(PRIVATE, "hi", delivery_id="d-403")
    assert len(fake.calls("sendMessage")) == 1
    assert r.hget(keys.delivered("d-403"), "0") is None


def test_working_shows_typing_in_the_topic_at_once_and_stops_on_exit(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    channel = TelegramChannel(settings, r, typing_interval=0.1)
    with channel.working(TOPIC, "55"):
        wait_until(lambda: len(fake.calls("sendChatAction")) >= 1, 2, "first typing")
        first = fake.calls("sendChatAction")[0]
        wait_until(lambda: len(fake.calls("sendChatAction")) >= 2, 2, "typing again")
    after_exit = len(fake.calls("sendChatAction"))
    time.sleep(0.4)
    assert len(fake.calls("sendChatAction")) == after_exit
    assert first.body == {"chat_id": -1001234567890, "message_thread_id": 42, "action": "typing"}


def test_the_default_typing_cadence_sends_once_at_once(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    start = time.monotonic()
    with TelegramChannel(settings, r).working(PRIVATE, None):
        wait_until(lambda: len(fake.calls("sendChatAction")) == 1, 2, "first typing")
    assert time.monotonic() - start < 2
    assert fake.calls("sendChatAction")[0].body == {"chat_id": 777, "action": "typing"}


def test_set_webhook_and_get_me(r: redis.Redis, settings: Settings, fake: FakeTelegram) -> None:
    channel = TelegramChannel(settings, r)
    channel.set_webhook("https://bot.example.com/webhooks/telegram")
    assert fake.webhook == {
        "url": "https://bot.example.com/webhooks/telegram", "secret_token": "s3cret-Token_1",
        "allowed_updates": ["message", "edited_message", "callback_query"],
        "drop_pending_updates": False,
    }
    assert channel.get_me()["username"] == "fermix_test_bot"
    unsigned = TelegramChannel(settings.model_copy(update={"telegram_webhook_secret": None}), r)
    with pytest.raises(ConfigError, match="WEBHOOK_SECRET"):
        unsigned.set_webhook("https://bot.example.com/webhooks/telegram")


def test_no_token_is_a_config_error(r: redis.Redis) -> None:
    with pytest.raises(ConfigError, match="FERMIX_TELEGRAM_BOT_TOKEN"):
        TelegramChannel(Settings(telegram_bot_token=None), r)


def test_the_bot_token_never_reaches_the_logs(
    r: redis.Redis, settings: Settings, fake: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.fail_next("sendMessage", 502, "Bad Gateway")
    channel = TelegramChannel(settings, r, sleep=Waits())
    channel.send_text(PRIVATE, "hi", delivery_id="d-log")
    gone = TelegramChannel(settings.model_copy(update={"telegram_api_base": "http://127.0.0.1:9"}),
                           r, sleep=Waits())
    with pytest.raises(ChannelError) as failed:
        gone.send_text(PRIVATE, "hi", delivery_id="d-log-2")
    assert "/bot<redacted>/sendMessage" in caplog.text  # httpx's request line, redacted
    assert TOKEN not in caplog.text
    assert TOKEN not in str(failed.value)


# --- approval questions with buttons ---------------------------------------------------------

QUESTION = ("Approval needed (ab12cd34): run `shell` with `{\"cmd\": \"rm -rf build\"}`?\n"
            "Answer /approve ab12cd34 or /deny ab12cd34 (no answer in 10 min denies it).")
KEYBOARD = [[{"text": "Approve", "callback_data": "fx:approve:ab12cd34"},
             {"text": "Deny", "callback_data": "fx:deny:ab12cd34"}]]


def test_an_approval_question_has_approve_and_deny_buttons_in_its_topic_once(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    channel = TelegramChannel(settings, r, sleep=Waits())
    assert isinstance(channel, AsksApproval)
    channel.send_approval(TOPIC, "ab12cd34", QUESTION, delivery_id="approval:ab12cd34")
    channel.send_approval(TOPIC, "ab12cd34", QUESTION, delivery_id="approval:ab12cd34")
    [body] = fake.sent()
    assert body == {"chat_id": -1001234567890, "message_thread_id": 42,
                    "text": to_telegram_html(QUESTION), "parse_mode": "HTML",
                    "reply_markup": {"inline_keyboard": KEYBOARD}}
    assert all(len(b["callback_data"].encode()) <= 64 for b in KEYBOARD[0])


def test_the_buttons_stay_when_the_question_falls_back_to_plain_text(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    fake.fail_next("sendMessage", 400, "Bad Request: can't parse entities: Unsupported tag")
    TelegramChannel(settings, r, sleep=Waits()).send_approval(
        PRIVATE, "ab12cd34", QUESTION, delivery_id="approval:plain")
    [body] = fake.sent()
    assert body["text"] == strip_markdown(QUESTION) and "parse_mode" not in body
    assert keyboard_of(body) == KEYBOARD


def test_a_long_question_has_its_buttons_under_the_last_chunk_only(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    text = paragraphs(5_000) + "\n\n" + QUESTION
    TelegramChannel(settings, r, sleep=Waits()).send_approval(
        PRIVATE, "ab12cd34", text, delivery_id="approval:long")
    sent = fake.sent()
    assert len(sent) == len(chunk_markdown(text)) == 2
    assert [keyboard_of(b) for b in sent] == [None, KEYBOARD]


def test_a_malformed_approval_id_sends_nothing(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    with pytest.raises(ValueError, match="approval id"):
        TelegramChannel(settings, r).send_approval(PRIVATE, "x" * 70, QUESTION, delivery_id="d")
    assert fake.calls("sendMessage") == []


def test_the_worker_asks_with_buttons_through_the_real_adapter(
    r: redis.Redis, settings: Settings, fake: FakeTelegram
) -> None:
    channel = TelegramChannel(settings, r, sleep=Waits())
    asker = ApprovalAsker(r, ApprovalPolicy(ApprovalsConfig()), lambda name: channel)
    now = time.time()
    req = ApprovalRequest(approval_id="0badcafe", conv=TOPIC.as_str(), run_id="run_1",
                          call_id="c1", tool="shell", arguments={"cmd": "make"},
                          requester="telegram:111", ask_in=TOPIC, requested_at=now,
                          expires_at=now + 600)
    asker.ask(req)
    [body] = fake.sent()
    assert body["text"] == to_telegram_html(question(req))
    assert keyboard_of(body) == [[{"text": "Approve", "callback_data": "fx:approve:0badcafe"},
                                  {"text": "Deny", "callback_data": "fx:deny:0badcafe"}]]
    found = approvals.get(r, "0badcafe")
    assert found is not None and found.status == "pending"
