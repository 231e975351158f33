"""``GET /v1/conversations`` and ``/v1/conversations/{key}`` on the gateway in this process
(TestClient) over a private Redis: messages accepted through ``POST /v1/agent`` (no worker
runs, so they queue) list every conversation with its state, search and filter, and the
sentence that says why one waits, from the queue's real state."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.settings import Settings
from fermix_shared.usage import budgets
from fermix_shared.usage.budgets import Budget

TOKEN = "conv-t0k"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def db(scratch_redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    url = scratch_redis_url.rsplit("/", 1)[0] + "/8"
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    yield url, r
    r.close()


@pytest.fixture
def client(db: tuple[str, redis.Redis]) -> Iterator[TestClient]:
    settings = Settings(redis_url=db[0], api_token=TOKEN,
                        agents=[{"name": "ops"}])  # type: ignore[list-item]
    with TestClient(create_app(settings)) as c:
        yield c


def say(client: TestClient, chat: str, text: str, **extra: str) -> None:
    resp = client.post("/v1/agent", json={"message": text, "chatId": chat, **extra}, headers=AUTH)
    assert resp.status_code == 202, resp.text


def listed(client: TestClient, **params: object) -> dict[str, object]:
    resp = client.get("/v1/conversations", params=params, headers=AUTH)
    assert resp.status_code == 200, resp.text
    body: dict[str, object] = resp.json()
    return body


def test_every_accepted_conversation_is_listed_newest_first_with_its_state(
    client: TestClient, db: tuple[str, redis.Redis]
) -> None:
    began = time.time()
    for i in range(5):
        say(client, f"chat-{i}", "hello")
    say(client, "chat-1", "again", agent="ops")
    body = listed(client)
    assert body["total"] == 5
    rows = body["conversations"]
    assert isinstance(rows, list)
    assert [c["conversation"] for c in rows][:2] == ["http|chat-1|root", "http|chat-4|root"]
    first = rows[0]
    assert (first["channel"], first["agent"], first["state"], first["queued"]) == (
        "http", "ops", "queued", 2)
    # A page, a search (key or agent) and a state filter.
    page = listed(client, limit=2, offset=2)
    assert [c["conversation"] for c in page["conversations"]] == [  # type: ignore[union-attr]
        "http|chat-3|root", "http|chat-2|root"]
    assert [c["conversation"] for c in listed(client, q="OPS")["conversations"]] == [  # type: ignore[union-attr]
        "http|chat-1|root"]
    # One conversation running on a worker whose heartbeat is 3 s old: the others stay queued.
    r, now = db[1], time.time()
    r.hset(keys.active("http|chat-2|root"), mapping={"turn_id": "run_x", "worker": "w1@host"})
    r.zadd(keys.active_index(), {"http|chat-2|root": int(now * 1000) + 30_000})
    r.hset(keys.worker_beats(), "w1@host", int(now * 1000) - 3_000)
    running = listed(client, state="running")
    assert [c["conversation"] for c in running["conversations"]] == [  # type: ignore[union-attr]
        "http|chat-2|root"]
    assert listed(client, state="queued")["total"] == 4
    assert client.get("/v1/conversations", params={"state": "asleep"},
                      headers=AUTH).status_code == 422

    detail = client.get(f"/v1/conversations/{quote('http|chat-2|root')}", headers=AUTH).json()
    assert detail["runId"] == "run_x"
    # The ages are read at the request: 3 s and more, by as much as the test took since.
    old = int(re.search(r"heartbeat (\d+) s old", detail["why"]).group(1))  # type: ignore[union-attr]
    assert 3 <= old <= 3 + time.time() - now + 1
    assert detail["why"] == (f"Running: held by worker w1@host, its heartbeat {old} s old; 1 "
                             "more queued behind it.")
    # Its provider refused it and the router waits to retry: the sentence says so.
    r.xadd(keys.run_events("run_x"), {"stream": "diagnostic", "data": json.dumps(
        {"kind": "retry", "route": "openai/m", "attempt": 2, "delay": 30,
         "reason": "rate limited (429)", "initial": True})})
    detail = client.get(f"/v1/conversations/{quote('http|chat-2|root')}", headers=AUTH).json()
    old = int(re.search(r"heartbeat (\d+) s old", detail["why"]).group(1))  # type: ignore[union-attr]
    left = int(re.search(r"waiting (\d+) s to retry", detail["why"]).group(1))  # type: ignore[union-attr]
    assert 30 - (time.time() - now) - 1 <= left <= 30
    assert detail["why"] == (
        f"Running: held by worker w1@host, its heartbeat {old} s old; waiting {left} s to retry the "
        "provider (rate limited (429), attempt 2); 1 more queued behind it.")
    queued = client.get(f"/v1/conversations/{quote('http|chat-1|root')}", headers=AUTH).json()
    waited = int(re.search(r"since (\d+) s ago", queued["why"]).group(1))  # type: ignore[union-attr]
    assert waited <= time.time() - began + 1
    assert queued["why"] == f"Queued: 2 messages waiting for a worker since {waited} s ago."
    assert queued["messages"] == [] and queued["runId"] is None


def test_why_names_a_reached_budget_and_an_unknown_conversation_is_a_404(
    client: TestClient, db: tuple[str, redis.Redis]
) -> None:
    say(client, "b", "hi", agent="ops")
    budgets.put(db[1], Budget(scope="agent:ops", period="day", usd_micros=1))
    db[1].hset(keys.usage("day", time.strftime("%Y-%m-%d", time.gmtime())),
               "usd:agent:ops", 5)
    why = client.get(f"/v1/conversations/{quote('http|b|root')}", headers=AUTH).json()["why"]
    assert why.endswith(" The daily budget of agent:ops is reached: new messages are refused "
                        "until it resets at 00:00 UTC.")
    # Its queued message will be refused: the list says over budget, and filters by it.
    (row,) = listed(client)["conversations"]  # type: ignore[misc]
    assert row["state"] == "over_budget"
    assert listed(client, state="over_budget")["total"] == 1
    assert listed(client, state="queued")["total"] == 0
    assert client.get(f"/v1/conversations/{quote('http|nope|root')}",
                      headers=AUTH).status_code == 404
    assert client.get("/v1/conversations/nokey", headers=AUTH).status_code == 422
