"""A reply interrupted mid-delivery and retried by a worker that cuts it otherwise (a deploy in
between changed a limit or the splitter) reaches the chat whole and once: the retry sends the
rest of the first attempt's cut (fermix_shared/channels/pieces.py). Slack and Telegram over
their real clients against the fakes, a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from fermix_shared import keys
from fermix_shared.channels import slack as slack_module
from fermix_shared.channels import telegram as telegram_module
from fermix_shared.channels.base import ChannelError
from fermix_shared.channels.slack import SlackChannel
from fermix_shared.channels.slack_format import markdown_pieces
from fermix_shared.channels.telegram import TelegramChannel
from fermix_shared.channels.telegram_format import chunk_markdown, to_telegram_html
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings
from tests.channels.test_slack import THREAD, long_reply, settings_for
from tests.channels.test_telegram import PRIVATE, TOKEN, paragraphs
from tests.fakes.slack_api import FakeSlack
from tests.fakes.telegram_api import FakeTelegram


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


@pytest.fixture
def telegram() -> Iterator[FakeTelegram]:
    with FakeTelegram(TOKEN) as fake:
        yield fake


def _another_version(monkeypatch: pytest.MonkeyPatch, module: object, name: str,
                     cut: object, limit: int) -> None:
    """The retrying worker's splitter: the same function with another limit."""
    monkeypatch.setattr(module, name, lambda md: cut(md, limit=limit))  # type: ignore[operator]


def test_a_slack_reply_retried_under_another_cut_arrives_whole_and_once(
    slack: FakeSlack, r: redis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    channel = SlackChannel(settings_for(slack), r, sleep=lambda s: None)
    text = long_reply()
    first_cut = markdown_pieces(text)
    assert len(first_cut) == 3
    slack.error_next("chat.postMessage", "fatal_error", after=1)  # one out, then refused
    with pytest.raises(ChannelError, match="fatal_error"):
        channel.send_text(THREAD, text, delivery_id="deploy")
    _another_version(monkeypatch, slack_module, "markdown_pieces", markdown_pieces, 5_000)
    assert len(slack_module.markdown_pieces(text)) != 3  # another cut
    channel.send_text(THREAD, text, delivery_id="deploy")  # retried by the new version
    posted = [c.args["blocks"][0]["text"] for c in slack.calls("chat.postMessage", ok=True)]
    assert posted == first_cut
    # Done: the cut is dropped, and a further retry (any cut) sends nothing.
    assert r.exists(keys.delivery_pieces("deploy")) == 0
    _another_version(monkeypatch, slack_module, "markdown_pieces", markdown_pieces, 2_000)
    channel.send_text(THREAD, text, delivery_id="deploy")
    assert len(slack.calls("chat.postMessage", ok=True)) == 3
    assert r.exists(keys.delivery_pieces("deploy")) == 0  # nor stored again


def test_a_telegram_reply_retried_under_another_cut_arrives_whole_and_once(
    telegram: FakeTelegram, r: redis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings(telegram_bot_token=TOKEN, telegram_api_base=telegram.url)
    channel = TelegramChannel(settings, r, sleep=lambda s: None)
    text = paragraphs(13_000)
    first_cut = chunk_markdown(text)
    assert len(first_cut) == 4
    telegram.fail_next("sendMessage", 403, "Forbidden: bot was blocked by the user", after=2)
    with pytest.raises(ChannelError, match="403"):
        channel.send_text(PRIVATE, text, delivery_id="deploy")
    _another_version(monkeypatch, telegram_module, "chunk_markdown", chunk_markdown, 6_000)
    assert len(telegram_module.chunk_markdown(text)) != 4  # another cut
    channel.send_text(PRIVATE, text, delivery_id="deploy")
    assert [b["text"] for b in telegram.sent()] == [to_telegram_html(c) for c in first_cut]
    assert r.exists(keys.delivery_pieces("deploy")) == 0


def test_a_different_text_under_the_same_delivery_is_cut_afresh(
    slack: FakeSlack, r: redis.Redis,
) -> None:
    """A stored cut is only ever of its own text (its digest is kept with it)."""
    channel = SlackChannel(settings_for(slack), r, sleep=lambda s: None)
    slack.error_next("chat.postMessage", "fatal_error")
    with pytest.raises(ChannelError):
        channel.send_text(ConversationKey(channel="slack", chat_id="C1"), "first", delivery_id="x")
    channel.send_text(ConversationKey(channel="slack", chat_id="C1"), "second", delivery_id="x")
    assert [c.args["text"] for c in slack.calls("chat.postMessage", ok=True)] == ["second"]
