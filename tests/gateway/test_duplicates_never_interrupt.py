"""A duplicate never stops, clears or steers anything (issue 25, item 3).

In ``interrupt`` mode the gateway used to stop the running turn before it knew whether the
message was a duplicate: a platform's redelivery, or an HTTP retry with the same ``messageId``
(which docs/operations/redis-sentinel.md invites after a 503), stopped the very turn its first copy had started, and
nothing answered. The accept script now checks the de-dup mark first and does the interrupt's
stop itself, only for a message it queues.

In-process (the real app and accept script on a real Redis, a turn held as a worker holds it):
every queue mode. Then through a real stack (uvicorn, a celery worker, a slow scripted model,
the fake Bot API): the first turn still answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_shared import keys
from fermix_shared.models import InboundMessage
from fermix_shared.stores import queue
from fermix_shared.stores.queue import QUEUE_MODES
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.telegram_api import FakeTelegram
from tests.fleet import uniq
from tests.gateway.inprocess import gateway, telegram_headers, tg_update

TG_CONV = "telegram|111|root"
HTTP_CONV = "http|c-dup|root"


def texts(r: redis.Redis, key: str) -> list[str]:
    return [InboundMessage.model_validate_json(m).text for m in r.lrange(key, 0, -1)]


def state(r: redis.Redis, conv: str) -> dict[str, Any]:
    """What a duplicate must leave alone: the active turn (and whether it is cancelled), the
    inbox, the steer list."""
    active = r.hgetall(keys.active(conv))
    return {"turn": active.get("turn_id"), "cancelled": active.get("cancelled"),
            "inbox": texts(r, keys.inbox(conv)), "steer": texts(r, keys.steer(conv))}


def deliver_telegram(client: TestClient, n: int, text: str) -> None:
    resp = client.post("/webhooks/telegram", headers=telegram_headers(),
                       json=tg_update(4200 + n, text))
    assert resp.status_code == 200


def deliver_http(client: TestClient, n: int, text: str) -> None:
    resp = client.post("/v1/agent", json={"message": text, "chatId": "c-dup",
                                          "messageId": f"m-{n}"})
    assert resp.status_code in (202, 409), resp.text


def first_then_redelivered(url: str, r: redis.Redis, conv: str, mode: str,
                           deliver: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """In queue mode ``mode``, message 1 arrives and becomes the running turn; message 2
    arrives during it; then both are delivered again. The state after the first deliveries,
    and after the second."""
    r.set(keys.queue_mode(conv), mode)
    with gateway(url) as (client, _):
        deliver(client, 1, "first")
        claim, lease = queue.claim(r, conv, "w1", 30)
        assert claim.kind == "claimed" and lease is not None
        deliver(client, 2, "second")
        before = state(r, conv)
        deliver(client, 1, "first")
        deliver(client, 2, "second")
        return before, state(r, conv)


@pytest.mark.parametrize("mode", QUEUE_MODES)
def test_a_telegram_redelivery_changes_nothing_in_any_queue_mode(
    r: redis.Redis, scratch_redis_url: str, mode: str
) -> None:
    before, after = first_then_redelivered(scratch_redis_url, r, TG_CONV, mode,
                                           deliver_telegram)
    assert before["turn"] is not None
    assert after == before
    assert after["cancelled"] == ("interrupt" if mode == "interrupt" else None)


@pytest.mark.parametrize("mode", QUEUE_MODES)
def test_an_http_retry_with_the_same_message_id_changes_nothing_in_any_queue_mode(
    r: redis.Redis, scratch_redis_url: str, mode: str
) -> None:
    before, after = first_then_redelivered(scratch_redis_url, r, HTTP_CONV, mode, deliver_http)
    assert after == before


def test_an_interrupting_message_over_the_rate_stops_nothing(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    r.set(keys.queue_mode(TG_CONV), "interrupt")
    with gateway(scratch_redis_url, sender_messages_per_minute=1) as (client, _):
        client.post("/webhooks/telegram", headers=telegram_headers(), json=tg_update(4301, "a"))
        claim, _ = queue.claim(r, TG_CONV, "w1", 30)
        assert claim.kind == "claimed"
        client.post("/webhooks/telegram", headers=telegram_headers(), json=tg_update(4302, "b"))
    assert state(r, TG_CONV)["cancelled"] is None


# --- through a real stack -----------------------------------------------------------------

OWNER = 111


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path, tg: FakeTelegram
          ) -> Iterator[Stack]:
    env = {
        **provider_env(llm, "openai"),
        "FERMIX_QUEUE_MODE": "interrupt",
        **tg.gateway_env("tg-secret", OWNER),
    }
    s = start_stack("dup-interrupt", redis_url, 11, env, logs_dir)
    yield s
    s.stop()


def test_retries_of_a_running_message_leave_its_turn_to_answer(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    """Interrupt mode, a model that takes 3 s: the HTTP client retries its message with the
    same messageId, Telegram redelivers its update, both while their turn runs. Each first turn
    answers; nothing was stopped."""
    http_text, tg_text, chat = uniq("http-retry"), uniq("tg-redelivery"), 5101
    llm.script.push(Reply(text="the HTTP answer", delay=3, match=http_text),
                    Reply(text="the Telegram answer", delay=3, match=tg_text))
    body = {"message": http_text, "chatId": "retrying", "messageId": "client-1"}
    update = tg_update(9101, tg_text, chat=chat, user=OWNER)
    headers = {"X-Telegram-Bot-Api-Secret-Token": "tg-secret"}
    with stack.http() as http:
        first = http.post("/v1/agent", json=body)
        assert first.status_code == 202, first.text
        assert httpx.post(f"{stack.url}/webhooks/telegram", json=update, headers=headers,
                          timeout=10).status_code == 200
        for text in (http_text, tg_text):
            assert llm.script.wait_request(lambda q, t=text: t in str(q["body"]), 30), text
        again = http.post("/v1/agent", json=body)
        assert (again.status_code, again.json()["runId"], again.json()["duplicate"]) == \
            (202, first.json()["runId"], True)
        assert httpx.post(f"{stack.url}/webhooks/telegram", json=update, headers=headers,
                          timeout=10).status_code == 200
        run_id = first.json()["runId"]
        waited = http.get(f"/v1/runs/{run_id}/wait", params={"timeout": 30}, timeout=40).json()
        assert waited["status"] == "ok", waited
        assert waited["reply"] == "the HTTP answer"
    wait_until(lambda: any(m["chat_id"] == chat for m in tg.sent()), 30, "the Telegram reply")
    conv = f"telegram|{chat}|root"
    r = stack.redis()
    wait_until(lambda: not r.exists(keys.active(conv)), 30, "the Telegram turn ended")
    assert [m["text"] for m in tg.sent() if m["chat_id"] == chat] == ["the Telegram answer"]
