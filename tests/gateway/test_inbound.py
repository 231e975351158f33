"""Inbound limits (issue 13: 1,000 messages to one chat and 300 x 95 KB bodies were all
accepted): the text length, the queue cap per conversation and the sender rate, through the
real app on a real Redis, and the accept script's own rules beneath them.

Each limit answers the way its caller can use: the HTTP API refuses with 422/429 and a reason
(``Retry-After`` for the rate); Telegram and Slack get their 200 (so they do not redeliver)
and the message is dropped and logged, except a too-long one, whose sender is told in the
chat; a slash command carries the reason in its ephemeral answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_gateway.inbound import FULL_NOTICE, RATE_NOTICE, TOO_LONG_NOTICE
from fermix_shared import keys
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.stores import queue
from fermix_shared.stores.queue import AcceptCode, AcceptLimits
from tests.gateway.inprocess import (
    DISPATCH_TASK,
    SEND_TASK,
    SLACK_OWNER,
    gateway,
    slack_headers,
    telegram_headers,
    tg_update,
)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The accept script's "now" (ms), moved by the test: a rate refills in minutes."""
    now = [1_800_000_000_000]
    monkeypatch.setattr(queue, "now_ms", lambda: now[0])
    yield now


def agent(client: TestClient, text: str, chat: str = "c1") -> tuple[int, dict, dict]:
    resp = client.post("/v1/agent", json={"message": text, "chatId": chat})
    return resp.status_code, resp.json(), dict(resp.headers)


def inbox(r: redis.Redis, conv: str) -> list[str]:
    return [InboundMessage.model_validate_json(m).text for m in r.lrange(keys.inbox(conv), 0, -1)]


# --- text length -----------------------------------------------------------------------------

def test_the_http_api_refuses_a_message_over_the_text_limit(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    with gateway(scratch_redis_url) as (client, _):
        status, body, _ = agent(client, "x" * 32_001)
        assert (status, body) == (422, {"error": "message: at most 32000 characters, got 32001 "
                                                 "(FERMIX_LIMITS__MAX_TEXT_CHARS)"})
        assert agent(client, "x" * 32_000)[0] == 202
    assert [len(t) for t in inbox(r, "http|c1|root")] == [32_000]


def test_a_chat_message_over_the_text_limit_is_answered_in_the_chat_not_queued(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    with gateway(scratch_redis_url, max_text_chars=50) as (client, celery):
        resp = client.post("/webhooks/telegram", headers=telegram_headers(),
                           json=tg_update(7, "y" * 51))
        assert (resp.status_code, resp.json()) == (200, {"ok": True})
    assert inbox(r, "telegram|111|root") == []
    notice = TOO_LONG_NOTICE.format(length=51, limit=50)
    assert celery.named(SEND_TASK) == [["telegram|111|root", notice, "toolong:telegram:7"]]
    assert notice.startswith("That message is too long for me: 51 characters")


# --- the queue cap ---------------------------------------------------------------------------

def test_the_http_api_refuses_the_101st_waiting_message_with_429(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    with gateway(scratch_redis_url, sender_messages_per_minute=0) as (client, _):
        codes = [agent(client, f"m{i}")[0] for i in range(120)]
        status, body, _ = agent(client, "one more")
        other = agent(client, "elsewhere", chat="c2")[0]
    assert codes == [202] * 100 + [429] * 20
    assert (status, body) == (429, {"error": FULL_NOTICE.format(limit=100)})
    assert body["error"] == ("100 messages are already waiting in this conversation; send this "
                             "again once I've caught up.")
    assert inbox(r, "http|c1|root") == [f"m{i}" for i in range(100)]
    assert other == 202


def test_a_full_conversation_acknowledges_the_webhook_and_drops_the_message(
    r: redis.Redis, scratch_redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "fermix_gateway.inbound")
    with gateway(scratch_redis_url, max_queued_per_conversation=3,
                 sender_messages_per_minute=0) as (client, celery):
        for i in range(5):
            resp = client.post("/webhooks/telegram", headers=telegram_headers(),
                               json=tg_update(100 + i, f"t{i}"))
            assert (resp.status_code, resp.json()) == (200, {"ok": True})
    assert inbox(r, "telegram|111|root") == ["t0", "t1", "t2"]
    assert celery.named(SEND_TASK) == []  # no notice: a flood must not become our flood
    assert len(celery.named(DISPATCH_TASK)) == 3
    dropped = [m for m in caplog.messages if m.startswith("dropped a message from telegram:111")]
    assert dropped == ["dropped a message from telegram:111: telegram|111|root has 3 messages "
                       "waiting"] * 2


# --- the sender rate -------------------------------------------------------------------------

def test_the_http_api_rate_limits_a_chat_with_retry_after(
    r: redis.Redis, scratch_redis_url: str, clock: list[int]
) -> None:
    with gateway(scratch_redis_url) as (client, _):
        burst = [agent(client, f"b{i}")[0] for i in range(30)]
        status, body, headers = agent(client, "one too many")
        assert burst == [202] * 30
        assert status == 429 and headers["retry-after"] == "2"
        assert body == {"error": "You're sending messages faster than I take them (at most 30 a "
                                 "minute); try again in 2 s."}
        assert agent(client, "another chat", chat="c2")[0] == 202  # per chat, not global
        clock[0] += 2_000  # 30 a minute: one more every 2 s
        assert agent(client, "after the wait")[0] == 202
        assert agent(client, "too soon")[0] == 429
        clock[0] += 60_000
        assert [agent(client, f"later{i}")[0] for i in range(31)] == [202] * 30 + [429]
    assert len(inbox(r, "http|c1|root")) == 61


def test_commands_and_duplicates_cost_no_rate(
    r: redis.Redis, scratch_redis_url: str, clock: list[int]
) -> None:
    with gateway(scratch_redis_url, sender_messages_per_minute=2) as (client, celery):
        def tg(update_id: int, text: str) -> int:
            return client.post("/webhooks/telegram", headers=telegram_headers(),
                               json=tg_update(update_id, text)).status_code

        assert [tg(1, "first"), tg(1, "first"), tg(1, "first")] == [200] * 3  # a redelivery
        assert [tg(2, "/status"), tg(3, "/whoami"), tg(4, "/stop")] == [200] * 3
        assert [tg(5, "second"), tg(6, "third")] == [200, 200]
    assert inbox(r, "telegram|111|root") == ["second"]  # /stop cleared "first"
    assert [args[1] for args in celery.named(SEND_TASK)][:2] == [
        "Here nothing is running; 1 message queued; queue mode followup.",
        "You are telegram:111 (operator)."]


def test_a_rate_limited_slash_command_says_why_in_its_answer(
    r: redis.Redis, scratch_redis_url: str, clock: list[int]
) -> None:
    with gateway(scratch_redis_url, sender_messages_per_minute=1) as (client, _):
        def slash(trigger: str, text: str) -> dict:
            body = urlencode({"command": "/fermix", "text": text, "channel_id": "C1",
                              "user_id": SLACK_OWNER, "trigger_id": trigger}).encode()
            resp = client.post("/webhooks/slack/commands", content=body,
                               headers=slack_headers(body, "application/x-www-form-urlencoded"))
            assert resp.status_code == 200
            return dict(resp.json())

        assert slash("1.1", "what is 6*7")["text"] == "On it."
        assert slash("1.2", "and 7*8")["text"] == RATE_NOTICE.format(limit=1, seconds=60)
    assert inbox(r, "slack|C1|root") == ["what is 6*7"]


def test_slack_events_over_the_rate_are_acknowledged_and_dropped(
    r: redis.Redis, scratch_redis_url: str, clock: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "fermix_gateway.inbound")
    with gateway(scratch_redis_url, sender_messages_per_minute=2) as (client, _):
        for i in range(4):
            body = json.dumps({
                "type": "event_callback", "event_id": f"Ev{i}", "event": {
                    "type": "message", "channel_type": "im", "channel": "D1",
                    "user": SLACK_OWNER, "text": f"s{i}", "ts": f"1.{i}"}}).encode()
            resp = client.post("/webhooks/slack/events", content=body, headers=slack_headers(body))
            assert (resp.status_code, resp.json()) == (200, {"ok": True})
    assert inbox(r, "slack|D1|root") == ["s0", "s1"]
    assert sum("over 2 messages a minute" in m for m in caplog.messages) == 2


# --- the accept script -----------------------------------------------------------------------

def msg(text: str, conv: str = "c") -> InboundMessage:
    return InboundMessage(key=ConversationKey(channel="http", chat_id=conv), text=text)


def test_accept_counts_the_steer_list_and_writes_nothing_when_it_refuses(r: redis.Redis) -> None:
    limits = AcceptLimits(sender="http:c", max_queued=2, per_minute=0)
    conv = "http|c|root"
    r.hset(keys.active(conv), mapping={"turn_id": "t", "worker": "w"})
    assert queue.accept(r, msg("a"), mode="steer", limits=limits).code is AcceptCode.steered
    assert queue.accept(r, msg("b"), limits=limits).code is AcceptCode.queued
    refused = msg("c")
    result = queue.accept(r, refused, message_id="m-c", limits=limits)
    assert (result.code, result.run_id) == (AcceptCode.full, "")
    assert not r.exists(keys.run(refused.run_id), keys.dedupe(conv, "m-c"))
    # The same delivery, once there is room, is accepted (the refusal left no dedupe mark).
    r.delete(keys.steer(conv))
    assert queue.accept(r, refused, message_id="m-c", limits=limits).code is AcceptCode.queued


def test_accept_without_limits_is_unbounded(r: redis.Redis) -> None:
    """Jobs of our own (scheduled runs, compactions) are never refused."""
    for i in range(150):
        assert queue.accept(r, msg(f"m{i}")).code is AcceptCode.queued
    assert r.llen(keys.inbox("http|c|root")) == 150


def test_the_rate_is_per_sender_and_refills_at_its_pace(r: redis.Redis) -> None:
    a = AcceptLimits(sender="telegram:1", per_minute=3)
    b = AcceptLimits(sender="telegram:2", per_minute=3)
    codes = [queue.accept(r, msg(f"a{i}"), limits=a).code for i in range(4)]
    assert codes == [AcceptCode.queued] * 3 + [AcceptCode.rate_limited]
    refused = queue.accept(r, msg("a5"), limits=a)
    assert 19_000 < refused.retry_after_ms <= 20_000  # 3 a minute: one every 20 s
    assert queue.accept(r, msg("b0", conv="d"), limits=b).code is AcceptCode.queued
    assert 0 < r.pttl(keys.rate_limit("inbound:telegram:1")) <= 61_000
